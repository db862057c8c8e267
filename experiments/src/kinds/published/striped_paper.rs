//! The Striped Attention paper's headline speedups (Brandon et al. 2023, arXiv:2311.09431, Tables 3
//! and 4): striped over the original ring for a 3B model's training step, predicted from whole
//! tiles of its blockwise JAX attention (a tile runs when any of its pairs is visible, so a
//! striped block's diagonal tiles cost full ones) plus the model's other matmuls.

use crate::hardware::JaxTiles;
use crate::simulator::simulate;
use crate::tile_model::causal_tiles;
use strategies::ring_time::cw_owner;
use strategies::{Contiguous, Partition, Striped};
use workbench::kernels::flops::{BACKWARD_PER_PAIR_DIM, FORWARD_PER_PAIR_DIM};

/// One published speedup and its setup.
#[derive(Debug, Clone, Copy)]
pub struct Speedup {
    /// A [`JaxTiles`] name.
    pub testbed: &'static str,
    /// Tokens in the sequence.
    pub seq_len: usize,
    /// Sequence-parallel ranks (the ring).
    pub ring: usize,
    /// Tensor-parallel ranks: each ring rank's heads and weights are split over them.
    pub tensor: usize,
    /// The published speedup of striped over ring.
    pub published: f64,
    /// Where.
    pub source: &'static str,
}

/// The 3B model (Table 1): d_model 3200, 26 layers, 32 heads.
const D_MODEL: usize = 3200;
const LAYERS: usize = 26;
const HEADS: usize = 32;

/// The two headline figures.
pub const SPEEDUPS: &[Speedup] = &[
    Speedup {
        testbed: "8xA100",
        seq_len: 262_144,
        ring: 4,
        tensor: 2,
        published: 1.45,
        source: "Striped Attention, Table 3: 3B, mesh (2, 4) on 8 A100 80GB, 256K tokens",
    },
    Speedup {
        testbed: "16xTPUv4",
        seq_len: 786_432,
        ring: 8,
        tensor: 2,
        published: 1.65,
        source: "Striped Attention, Table 4: 3B, mesh (2, 8) on 16 TPUv4, 786K tokens",
    },
];

/// The setup in words.
pub fn setup(s: &Speedup) -> String {
    format!(
        "Striped Attention 3B training step, {}: {} tokens, ring of {} × tensor {}, JAX tiles",
        s.testbed, s.seq_len, s.ring, s.tensor
    )
}

/// Seconds of one training step on a ring rank under `layout`'s partition: every layer's ring pass
/// (whole tiles, forward and backward, pipelined with the link) plus the rest of the model's
/// matmuls (6 FLOPs a parameter a token, N = 12·d²·L: Kaplan et al. 2020), both at peak rates.
fn step_seconds(s: &Speedup, tiles: &JaxTiles, partition: &dyn Partition) -> f64 {
    let layout = partition
        .layout(s.seq_len, s.ring)
        .expect("the papers' lengths split evenly");
    let head_dim = D_MODEL / HEADS;
    let heads = HEADS / s.tensor;
    let per_tile = (tiles.tile.rows * tiles.tile.cols) as f64
        * (FORWARD_PER_PAIR_DIM + BACKWARD_PER_PAIR_DIM) as f64
        * (head_dim * heads) as f64;
    let compute: Vec<Vec<f64>> = (0..s.ring)
        .map(|r| {
            (0..s.ring)
                .map(|step| {
                    let keys = &layout.positions[cw_owner(r, step, s.ring)];
                    causal_tiles(&layout.positions[r], keys, tiles.tile) as f64 * per_tile
                        / tiles.flops.value
                })
                .collect()
        })
        .collect();
    // K and V in bf16 forward; K, V and dK, dV (fp32) backward.
    let block = (s.seq_len / s.ring * head_dim * heads) as f64;
    let link = block * (2.0 * 2.0 + 2.0 * 2.0 + 2.0 * 4.0) / tiles.link_bytes_per_s.value;
    let attention = LAYERS as f64 * simulate(&compute, link).makespan;
    let params = (12 * D_MODEL * D_MODEL * LAYERS) as f64;
    let rest =
        6.0 * params * (s.seq_len / s.ring) as f64 / s.tensor as f64 / tiles.matmul_flops.value;
    attention + rest
}

/// The predicted speedup of striped over ring.
pub fn predict(s: &Speedup, tiles: &JaxTiles) -> f64 {
    step_seconds(s, tiles, &Contiguous) / step_seconds(s, tiles, &Striped)
}
