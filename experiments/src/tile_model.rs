//! The tile-granular GPU cost layer, beside the exact pair counts of `strategies::ring_time`: what
//! one FlashAttention call costs on a GPU whose kernel throughput was published
//! ([`crate::hardware::FlashGpu`]), what blockwise attention that skips only whole tiles computes
//! ([`crate::hardware::JaxTiles`]), and the launches and elementwise passes around them. A GPU
//! computes whole tiles: an unmasked call is paid in whole tiles at the kernel's published
//! unmasked rate, a causal call at its published causal rate (which already pays for its partly
//! visible diagonal tiles), every kernel pays a launch, and bytes move at measured rates.

use crate::hardware::{FlashGpu, RateCurve, Tile};
use workbench::kernels::flops::{BACKWARD_PER_PAIR_DIM, FORWARD_PER_PAIR_DIM};

/// Which passes a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passes {
    /// The forward.
    Forward,
    /// The forward, then the backward.
    ForwardBackward,
}

impl Passes {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Passes::Forward => "fwd",
            Passes::ForwardBackward => "fwd+bwd",
        }
    }

    /// Kernels one call launches: FlashAttention-2's forward is one kernel, its backward three
    /// (dot(dO, O), the main kernel, dQ's conversion: flash_bwd_launch_template.h).
    fn kernels(self) -> f64 {
        match self {
            Passes::Forward => 1.0,
            Passes::ForwardBackward => 4.0,
        }
    }
}

/// Attention heads and their width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub q: usize,
    /// Key/value heads.
    pub kv: usize,
    /// Head dim.
    pub dim: usize,
}

/// One document's (or one block's) part of a kernel call: `q` query rows against `k` keys,
/// causal (aligned at the bottom right, as FlashAttention-2 aligns: query row i sees keys up to
/// `k − q + i`) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Query rows.
    pub q: usize,
    /// Keys.
    pub k: usize,
    /// Causal.
    pub causal: bool,
}

impl Piece {
    /// The pairs the kernel pays for: a causal piece's visible pairs (its published causal rate
    /// already pays for partly visible tiles), an unmasked one's whole tiles of `tile`.
    fn paid_pairs(&self, tile: Tile) -> f64 {
        let (q, k) = (self.q as u64, self.k as u64);
        if self.causal {
            // Row i sees min(k, max(0, k − q + i + 1)) keys.
            (0..q)
                .map(|i| (k + i + 1).saturating_sub(q).min(k))
                .sum::<u64>() as f64
        } else {
            (q.div_ceil(tile.rows as u64)
                * tile.rows as u64
                * k.div_ceil(tile.cols as u64)
                * tile.cols as u64) as f64
        }
    }

    /// The published length whose rate this piece runs at: that of a square call of as many
    /// pairs, sqrt(q·k).
    fn length(&self) -> usize {
        ((self.q as f64) * (self.k as f64)).sqrt() as usize
    }
}

/// The curve a piece runs at.
fn curve(gpu: &FlashGpu, passes: Passes, causal: bool) -> RateCurve {
    match (passes, causal) {
        (Passes::Forward, true) => gpu.fwd_causal,
        (Passes::Forward, false) => gpu.fwd_full,
        (Passes::ForwardBackward, true) => gpu.fwd_bwd_causal,
        (Passes::ForwardBackward, false) => gpu.fwd_bwd_full,
    }
}

/// Seconds of one FlashAttention-2 call over `pieces` (a varlen call's documents share its
/// launches): each piece's FLOPs at its curve's rate, plus the call's kernel launches.
pub fn call_seconds(gpu: &FlashGpu, passes: Passes, heads: Heads, pieces: &[Piece]) -> f64 {
    let per_pair_dim = |tile: Tile, per: u64, p: &Piece| p.paid_pairs(tile) * per as f64;
    let compute: f64 = pieces
        .iter()
        .filter(|p| p.q > 0 && p.k > 0)
        .map(|p| {
            // Forward FLOPs in the forward kernel's tiles, backward FLOPs in the backward's.
            let flops_per_dim = match passes {
                Passes::Forward => per_pair_dim(gpu.fwd_tile, FORWARD_PER_PAIR_DIM, p),
                Passes::ForwardBackward => {
                    per_pair_dim(gpu.fwd_tile, FORWARD_PER_PAIR_DIM, p)
                        + per_pair_dim(gpu.bwd_tile, BACKWARD_PER_PAIR_DIM, p)
                }
            };
            let flops = flops_per_dim * (heads.dim * heads.q) as f64;
            flops / curve(gpu, passes, p.causal).flops_at(p.length())
        })
        .sum();
    passes.kernels() * gpu.launch_s.value + compute
}

/// Seconds of one elementwise kernel moving `bytes` through memory.
pub fn memory_seconds(gpu: &FlashGpu, bytes: f64) -> f64 {
    gpu.launch_s.value + bytes / gpu.hbm_bytes_per_s.value
}

/// Tiles of `tile` that a blockwise kernel computing whole tiles runs for queries at positions
/// `queries` against keys at `keys` (both in local order, ascending), causal by position: a tile
/// runs when any of its pairs is visible (its earliest key is not after its latest query).
pub fn causal_tiles(queries: &[usize], keys: &[usize], tile: Tile) -> u64 {
    let latest: Vec<usize> = queries
        .chunks(tile.rows)
        .map(|rows| rows.iter().copied().max().unwrap_or(0))
        .collect();
    let earliest: Vec<usize> = keys
        .chunks(tile.cols)
        .map(|cols| cols.iter().copied().min().unwrap_or(usize::MAX))
        .collect();
    latest
        .iter()
        .map(|&q| earliest.iter().filter(|&&k| k <= q).count() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::FLASH_GPUS;

    #[test]
    fn causal_pieces_count_visible_pairs_and_unmasked_ones_whole_tiles() {
        let tile = FLASH_GPUS[0].fwd_tile;
        let square = Piece {
            q: 4,
            k: 4,
            causal: true,
        };
        assert_eq!(square.paid_pairs(tile), 10.0);
        // Bottom-right aligned: 2 queries against 5 keys see 4 and 5.
        let wide = Piece {
            q: 2,
            k: 5,
            causal: true,
        };
        assert_eq!(wide.paid_pairs(tile), 9.0);
        // More queries than keys: the first rows see nothing.
        let tall = Piece {
            q: 5,
            k: 2,
            causal: true,
        };
        assert_eq!(tall.paid_pairs(tile), 3.0);
        // 160 × 160 unmasked in 128 × 64 tiles: 2 × 3 tiles.
        let small = Piece {
            q: 160,
            k: 160,
            causal: false,
        };
        assert_eq!(small.paid_pairs(tile), (256 * 192) as f64);
    }

    #[test]
    fn a_call_is_its_flops_at_the_published_rate_plus_its_launches() {
        let gpu = &FLASH_GPUS[1];
        let heads = Heads {
            q: 32,
            kv: 8,
            dim: 128,
        };
        let full = Piece {
            q: 8192,
            k: 8192,
            causal: false,
        };
        let seconds = call_seconds(gpu, Passes::Forward, heads, &[full]);
        let flops = 4.0 * 8192.0 * 8192.0 * 128.0 * 32.0;
        let expected = gpu.launch_s.value + flops / (gpu.fwd_full.flops_at(8192));
        assert!(
            (seconds - expected).abs() <= 1e-12 * expected,
            "{seconds} {expected}"
        );
    }

    #[test]
    fn whole_tiles_of_a_causal_block_and_of_a_striped_one() {
        let tile = Tile {
            rows: 2,
            cols: 4,
            source: "test",
        };
        // Contiguous 8 × 8 on the diagonal: query tiles end at 1, 3, 5, 7; key tiles start at 0, 4.
        let block: Vec<usize> = (0..8).collect();
        assert_eq!(causal_tiles(&block, &block, tile), 1 + 1 + 2 + 2);
        // A later block's keys are never seen, an earlier one's always.
        let later: Vec<usize> = (8..16).collect();
        assert_eq!(causal_tiles(&block, &later, tile), 0);
        assert_eq!(causal_tiles(&later, &block, tile), 8);
    }
}
