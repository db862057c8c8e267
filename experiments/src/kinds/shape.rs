//! The `[model]` section of the simulated and timed ring kinds: the attention shape whose blocks
//! travel, and where balance tile costs come from.

use serde::Deserialize;

/// Attention shape (the paper's defaults: LLaMA-7B's 32 heads of 128, bf16).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelShape {
    /// Dimension of a head.
    pub head_dim: usize,
    /// Heads: per-step compute large enough that link latency is negligible, as in the paper's
    /// c_min argument.
    pub heads: usize,
    /// Bytes per value on the link.
    pub bytes_per_value: usize,
    /// Balance: where tile costs come from.
    pub tile_costs: TileCosts,
    /// Balance with measured tile costs: the (smaller) attention shape timed on this machine; times
    /// are scaled by the FLOP ratio of the two shapes and by this machine's matmul rate over the
    /// profile's peak.
    pub measured_heads: usize,
    /// Head dimension of the timed shape.
    pub measured_head_dim: usize,
}

/// Where the balance kind's tile costs come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TileCosts {
    /// Visible pairs × FLOPs per pair ÷ the profile's peak FLOP/s.
    #[default]
    Flops,
    /// Each tile timed on this machine in lockstep, scaled to the profile.
    Measured,
}

impl Default for ModelShape {
    fn default() -> Self {
        Self {
            head_dim: 128,
            heads: 32,
            bytes_per_value: 2,
            tile_costs: TileCosts::default(),
            measured_heads: 4,
            measured_head_dim: 64,
        }
    }
}

impl ModelShape {
    /// Seconds to send one K and V block of `block` tokens over a link.
    pub fn link_seconds(&self, block: usize, p: &crate::hardware::Profile) -> f64 {
        p.latency_s
            + (2 * block * self.head_dim * self.heads * self.bytes_per_value) as f64
                / p.link_bytes_per_s
    }
}
