//! ring-flash-attention's published benchmark (github.com/zhuzilin/ring-flash-attention: README
//! table of 556ddaae, `benchmark/benchmark_kvpacked_func.py` and
//! `benchmark/benchmark_varlen_kvpacked_func.py`): its setup, its published fractions of the ideal,
//! and the prediction of each from the kernels its source calls at every ring step, costed by the
//! tile layer ([`crate::tile_model`]).
//!
//! The setup: 8 GPUs, 8,192 tokens a GPU, Llama-3.1-8B's attention (32 query heads, 8 key/value
//! heads, head dim 128), bf16, causal, batch 1. The ideal ("theoretic") is each GPU's plain
//! FlashAttention-2 call on its own 8,192 tokens, divided by 8 (8 GPUs × 1² of work against the
//! ring's 1 × 8²); a fraction is the ring's rate over that.

use crate::extremes::largest;
use crate::hardware::FlashGpu;
use crate::simulator::simulate;
use crate::tile_model::{Heads, Passes, Piece, call_seconds, memory_seconds};
use std::ops::Add;

/// Where the published cells were read.
pub const REFERENCE: &str = "ring-flash-attention README, benchmark table of 556ddaae (2024-10-30)";

/// GPUs in the ring.
pub const RANKS: usize = 8;
/// Tokens a GPU holds.
pub const TOKENS: usize = 8192;
/// Llama-3.1-8B's attention.
pub const HEADS: Heads = Heads {
    q: 32,
    kv: 8,
    dim: 128,
};
/// bf16.
const BYTES: f64 = 2.0;
/// The merge's running output and the gradient accumulators are fp32.
const F32: f64 = 4.0;

/// How the forward's merge (`update_out_and_lse`, utils.py) runs: the model counts it fused; run
/// op by op it moves almost 4× the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// One read-modify-write kernel: read the fp32 output (4 bytes an element) and the bf16 block
    /// (2), write the output (4).
    Fused,
    /// `_update_out_and_lse` op by op: the block to fp32 (read 2, write 4), `out − block` (read 8,
    /// write 4), times the sigmoid (read 4, write 4), `out − …` (read 8, write 4): 38 bytes an
    /// element in 4 kernels (the log-sum-exp's own ops are per row, not per element).
    Eager,
}

impl Merge {
    /// Bytes moved an output element, and kernels launched.
    fn cost(self) -> (f64, f64) {
        match self {
            Merge::Fused => (F32 + BYTES + F32, 1.0),
            Merge::Eager => (38.0, 4.0),
        }
    }
}

/// The varlen benchmark's four `cu_seqlens` (local document lengths), one per iteration in turn.
pub const VARLEN_DOCUMENTS: [&[usize]; 4] = [
    &[8192],
    &[256, 7392, 544],
    &[4096, 4096],
    &[3104, 3200, 1600, 160, 128],
];

/// The benchmark's ring variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Contiguous shards; steps past a rank's own index are skipped.
    Ring,
    /// Chunks r and 2N − 1 − r of every document.
    ZigZag,
    /// Token t on rank t mod N.
    Stripe,
    /// Not a ring: keys and values all-gathered in head groups (Llama 3's context parallelism).
    Llama3,
}

impl Variant {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Ring => "ring",
            Variant::ZigZag => "zigzag",
            Variant::Stripe => "stripe",
            Variant::Llama3 => "llama3",
        }
    }
}

/// One published cell.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    /// `8xA100` or `8xH800` (a [`FlashGpu`] name).
    pub gpu: &'static str,
    /// `false`: the batch API (one sequence); `true`: varlen (the four document patterns).
    pub varlen: bool,
    /// What the iteration runs.
    pub passes: Passes,
    /// The variant.
    pub variant: Variant,
    /// The published fraction of the ideal.
    pub published: f64,
}

const fn cell(gpu: &'static str, varlen: bool, fb: bool, variant: Variant, pct: f64) -> Cell {
    Cell {
        gpu,
        varlen,
        passes: if fb {
            Passes::ForwardBackward
        } else {
            Passes::Forward
        },
        variant,
        published: pct / 100.0,
    }
}

/// Every cell of the README's tables (commit 556ddaae, 2024-10-30).
pub const CELLS: &[Cell] = &[
    cell("8xH800", false, false, Variant::Ring, 52.1),
    cell("8xH800", false, false, Variant::ZigZag, 85.2),
    cell("8xH800", false, false, Variant::Stripe, 74.4),
    cell("8xH800", false, true, Variant::Ring, 53.9),
    cell("8xH800", false, true, Variant::ZigZag, 90.2),
    cell("8xH800", false, true, Variant::Stripe, 82.9),
    cell("8xA100", false, false, Variant::Ring, 51.4),
    cell("8xA100", false, false, Variant::ZigZag, 81.7),
    cell("8xA100", false, false, Variant::Stripe, 69.6),
    cell("8xA100", false, true, Variant::Ring, 52.5),
    cell("8xA100", false, true, Variant::ZigZag, 89.8),
    cell("8xA100", false, true, Variant::Stripe, 82.6),
    cell("8xH800", true, false, Variant::Ring, 49.1),
    cell("8xH800", true, false, Variant::ZigZag, 70.2),
    cell("8xH800", true, false, Variant::Llama3, 57.0),
    cell("8xH800", true, true, Variant::Ring, 51.1),
    cell("8xH800", true, true, Variant::ZigZag, 75.9),
    cell("8xH800", true, true, Variant::Llama3, 58.1),
    cell("8xA100", true, false, Variant::Ring, 49.8),
    cell("8xA100", true, false, Variant::ZigZag, 72.0),
    cell("8xA100", true, false, Variant::Llama3, 51.6),
    cell("8xA100", true, true, Variant::Ring, 52.1),
    cell("8xA100", true, true, Variant::ZigZag, 80.2),
    cell("8xA100", true, true, Variant::Llama3, 58.0),
];

/// The setup in words, for the table.
pub fn setup(c: &Cell) -> String {
    format!(
        "ring-flash-attention {} {} {}, {}: 8 GPUs × 8K tokens, 32/8 heads × 128, bf16, causal",
        if c.varlen { "varlen" } else { "batch" },
        c.variant.name(),
        c.passes.name(),
        c.gpu
    )
}

/// The kernel rates a cell's prediction runs at: the GPU's published FlashAttention-2 curves of
/// the cell's passes, or, where the GPU has no forward curve, what stands in for it.
pub fn kernel_rates(gpu: &FlashGpu, c: &Cell) -> String {
    match (c.passes, gpu.forward_stand_in) {
        (Passes::Forward, Some(stand_in)) => format!("stand-in: {stand_in}"),
        (Passes::Forward, None) => {
            format!("FlashAttention-2's published {} forward rates", gpu.name)
        }
        (Passes::ForwardBackward, _) => {
            format!("FlashAttention-2's published {} fwd+bwd rates", gpu.name)
        }
    }
}

/// The document patterns a cell's iterations cycle through.
fn patterns(c: &Cell) -> Vec<&'static [usize]> {
    if c.varlen {
        VARLEN_DOCUMENTS.to_vec()
    } else {
        vec![&[TOKENS]]
    }
}

/// The predicted fraction of the ideal: 8 × the local call's seconds over the variant's, summed
/// over the cell's document patterns.
pub fn predict(gpu: &FlashGpu, c: &Cell, merge: Merge) -> f64 {
    let (mut ideal, mut ring) = (0.0, 0.0);
    for docs in patterns(c) {
        let local: Vec<Piece> = docs.iter().map(|&l| piece(l, l, true)).collect();
        ideal += call_seconds(gpu, c.passes, HEADS, &local);
        ring += match c.variant {
            Variant::Llama3 => llama3_seconds(gpu, c.passes, docs),
            _ => ring_seconds(gpu, c, merge, docs),
        };
    }
    RANKS as f64 * ideal / ring
}

fn piece(q: usize, k: usize, causal: bool) -> Piece {
    Piece { q, k, causal }
}

/// Elements of the queries' (or outputs') and the keys' (or values') local tensors, `rows` rows.
fn q_elems(rows: usize) -> f64 {
    (rows * HEADS.q * HEADS.dim) as f64
}
fn kv_elems(rows: usize) -> f64 {
    (rows * HEADS.kv * HEADS.dim) as f64
}

/// The memory passes after a step's call over `rows` query rows: the forward's merge into the
/// fp32 running output (the first step only converts the block), and with the backward its
/// accumulation of dQ (and of dK, dV over `kv_rows` rows) in fp32, one in-place add each (read the
/// accumulator and the bf16 block, write it; `ring_flash_attn.py`, `utils.py`).
fn merge_seconds(
    gpu: &FlashGpu,
    passes: Passes,
    merge: Merge,
    first: bool,
    rows: usize,
    kv_rows: usize,
) -> f64 {
    let (per_elem, kernels) = if first {
        (BYTES + F32, 1.0)
    } else {
        merge.cost()
    };
    let mut seconds =
        memory_seconds(gpu, per_elem * q_elems(rows)) + (kernels - 1.0) * gpu.launch_s.value;
    if passes == Passes::ForwardBackward {
        let add = if first {
            BYTES + F32
        } else {
            F32 + BYTES + F32
        };
        seconds += memory_seconds(gpu, add * q_elems(rows));
        seconds += 2.0 * memory_seconds(gpu, add * kv_elems(kv_rows));
    }
    seconds
}

/// Memory passes a variant's source runs besides its calls, merges and gradient adds, counted in
/// its code at 556ddaa (the file and line beside each): bytes read plus written, and the kernels
/// that move them. The ideal's plain FlashAttention call pays none of them (`flash_attn_kvpacked_func`
/// reads the packed K and V in place and returns bf16).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Copies {
    /// Bytes read and written.
    pub bytes: f64,
    /// Kernels launched.
    pub kernels: f64,
}

impl Copies {
    fn of(kernels: f64, bytes: f64) -> Copies {
        Copies { bytes, kernels }
    }

    fn plus(self, other: Copies) -> Copies {
        Copies::of(self.kernels + other.kernels, self.bytes + other.bytes)
    }

    /// Seconds at the GPU's memory rate, each kernel paying its launch.
    fn seconds(self, gpu: &FlashGpu) -> f64 {
        if self.kernels == 0.0 {
            return 0.0;
        }
        memory_seconds(gpu, self.bytes) + (self.kernels - 1.0) * gpu.launch_s.value
    }
}

/// A copy of `elements` values of `bytes` each: read and written.
fn copied(kernels: f64, elements: f64, bytes: f64) -> Copies {
    Copies::of(kernels, 2.0 * bytes * elements)
}

/// The log-sum-exp (fp32, one a head and row) of `rows` query rows.
fn lse_elems(rows: usize) -> f64 {
    (rows * HEADS.q) as f64
}

/// Whether varlen zig-zag takes its halves with a boolean mask (several documents:
/// `get_half_index` builds a CPU bool tensor, zigzag_ring_flash_attn_varlen.py:31-40; one document
/// gets slices, 25-29). Each mask index is a gather or an index_put, which copies.
fn masked_halves(c: &Cell, docs: &[usize]) -> bool {
    c.varlen && c.variant == Variant::ZigZag && docs.len() > 1
}

/// Once a call, before the first step: the kvpacked API hands the variant `kv[:, :, 0]` and
/// `kv[:, :, 1]`, which it makes contiguous (`k = k.contiguous()`: ring_flash_attn.py:164-165,
/// zigzag 207-208, stripe 219-220, ring varlen 206-207, zigzag varlen 327-328); varlen zig-zag's
/// masked halves also gather `q1 = q[half_index1]` (94), and with the backward `dout1`, `q1`,
/// `out1` (211-213).
fn before_steps(c: &Cell, docs: &[usize]) -> Copies {
    let mut copies = copied(2.0, 2.0 * kv_elems(TOKENS), BYTES);
    if masked_halves(c, docs) {
        copies = copies.plus(copied(1.0, q_elems(TOKENS / 2), BYTES));
        if c.passes == Passes::ForwardBackward {
            copies = copies.plus(copied(3.0, 3.0 * q_elems(TOKENS / 2), BYTES));
        }
    }
    copies
}

/// Once a call, after the last step: the fp32 output to bf16 (`out = out.to(q.dtype)`:
/// ring_flash_attn.py:55, zigzag 76, stripe 76, ring varlen 87, zigzag varlen 176: read 4, write
/// 2); with the backward, dQ, dK, dV to bf16 (ring 141, zigzag 184, stripe 196, ring varlen 181,
/// zigzag varlen 302) and autograd's backward of the two `kv` views (ring 250-251: a zeroed packed
/// gradient per view, the view's gradient copied in, the two added).
fn after_steps(c: &Cell) -> Copies {
    let out = Copies::of(1.0, (F32 + BYTES) * q_elems(TOKENS));
    if c.passes == Passes::Forward {
        return out;
    }
    let to_bf16 = Copies::of(
        3.0,
        (F32 + BYTES) * (q_elems(TOKENS) + 2.0 * kv_elems(TOKENS)),
    );
    let packed = 2.0 * kv_elems(TOKENS);
    let select_backward = Copies::of(2.0, BYTES * 2.0 * packed)
        .plus(copied(2.0, 2.0 * kv_elems(TOKENS), BYTES))
        .plus(Copies::of(1.0, 3.0 * BYTES * packed));
    out.plus(to_bf16).plus(select_backward)
}

/// At `step` of `rank`, besides the call and the merge the model counts:
/// - the sliced merge's write-back (`out[slice_], lse[slice_] = slice_out, slice_lse`, utils.py:58-62)
///   of zig-zag's second half past the rank (zigzag_ring_flash_attn.py:63-69) and of stripe's
///   rows past the first past the rank (stripe_flash_attn.py:67-69): read and write 4 bytes an
///   element, and the log-sum-exp;
/// - varlen zig-zag's masked halves instead gather `out[half_index1]` and `lse` and put them back
///   (zigzag_ring_flash_attn_varlen.py:167-169), and gather `k[half_index0]`, `v[half_index0]` at
///   steps up to the rank (149-150); with the backward, gather K and V's halves again (272-273),
///   and add dK, dV (285-286) and dQ (278) into masked halves by gather, add, index_put.
fn step_copies(c: &Cell, docs: &[usize], rank: usize, step: usize) -> Copies {
    let back = c.passes == Passes::ForwardBackward;
    let half_q = q_elems(TOKENS / 2);
    let half_kv = kv_elems(TOKENS / 2);
    if step == 0 {
        return Copies::default();
    }
    let past = step > rank;
    match c.variant {
        Variant::ZigZag if masked_halves(c, docs) => {
            if past {
                let forward = copied(4.0, 2.0 * (half_q + lse_elems(TOKENS / 2)), F32);
                let backward = copied(2.0, 2.0 * half_q, F32);
                if back {
                    forward.plus(backward)
                } else {
                    forward
                }
            } else {
                let halves = copied(2.0, 2.0 * half_kv, BYTES);
                let backward = halves.plus(copied(4.0, 4.0 * half_kv, F32));
                if back { halves.plus(backward) } else { halves }
            }
        }
        Variant::ZigZag if past => copied(2.0, half_q + lse_elems(TOKENS / 2), F32),
        Variant::Stripe if past => copied(2.0, q_elems(TOKENS - 1) + lse_elems(TOKENS - 1), F32),
        _ => Copies::default(),
    }
}

/// Bytes a ring step sends: K and V in bf16; with the backward also K, V again and dK, dV in fp32.
fn step_bytes(passes: Passes) -> f64 {
    let kv = 2.0 * kv_elems(TOKENS);
    match passes {
        Passes::Forward => kv * BYTES,
        Passes::ForwardBackward => kv * BYTES + kv * (BYTES + F32),
    }
}

/// One iteration of a ring variant over documents `docs` (each document's local piece; every
/// document is split over the ranks as the variant splits the sequence): each rank's calls,
/// merges and copies per step as its source runs them, pipelined by the ring simulator with the
/// link's achieved rate, between the copies every rank makes before its first step and after its
/// last. The forward and backward run as one pass whose steps cost both; the backward sends dK
/// and dV once more after its last step (ring_flash_attn.py:135-137, zigzag 178-180, stripe
/// 190-192, ring varlen 175-177, zigzag varlen 296-298, each waited for before returning), a
/// transfer nothing overlaps.
fn ring_seconds(gpu: &FlashGpu, c: &Cell, merge: Merge, docs: &[usize]) -> f64 {
    let (passes, variant) = (c.passes, c.variant);
    let compute: Vec<Vec<f64>> = (0..RANKS)
        .map(|rank| {
            (0..RANKS)
                .map(|step| {
                    let call = |pieces: Vec<Piece>| call_seconds(gpu, passes, HEADS, &pieces);
                    let merge =
                        |rows, kv_rows| merge_seconds(gpu, passes, merge, step == 0, rows, kv_rows);
                    match variant {
                        // ring_flash_attn.py: causal at step 0, the whole block at steps up to
                        // the rank, nothing after.
                        Variant::Ring if step == 0 => {
                            call(docs.iter().map(|&l| piece(l, l, true)).collect())
                                + merge(TOKENS, TOKENS)
                        }
                        Variant::Ring if step <= rank => {
                            call(docs.iter().map(|&l| piece(l, l, false)).collect())
                                + merge(TOKENS, TOKENS)
                        }
                        Variant::Ring => 0.0,
                        // zigzag_ring_flash_attn.py: causal at step 0; then all queries against
                        // the first half's keys (steps up to the rank), or the second half's
                        // queries against all keys.
                        Variant::ZigZag if step == 0 => {
                            call(docs.iter().map(|&l| piece(l, l, true)).collect())
                                + merge(TOKENS, TOKENS)
                        }
                        Variant::ZigZag if step <= rank => {
                            call(docs.iter().map(|&l| piece(l, l / 2, false)).collect())
                                + merge(TOKENS, TOKENS / 2)
                        }
                        Variant::ZigZag => {
                            call(docs.iter().map(|&l| piece(l / 2, l, false)).collect())
                                + merge(TOKENS / 2, TOKENS)
                        }
                        // stripe_flash_attn.py: causal every step; past the rank, without the
                        // first query and the last key.
                        Variant::Stripe if step <= rank => {
                            call(docs.iter().map(|&l| piece(l, l, true)).collect())
                                + merge(TOKENS, TOKENS)
                        }
                        Variant::Stripe => {
                            call(docs.iter().map(|&l| piece(l - 1, l - 1, true)).collect())
                                + merge(TOKENS, TOKENS)
                        }
                        Variant::Llama3 => unreachable!("llama3 is not a ring"),
                    }
                    .add(step_copies(c, docs, rank, step).seconds(gpu))
                })
                .collect()
        })
        .collect();
    let link = gpu.link_bytes_per_s.value;
    let last_gradients = match passes {
        Passes::Forward => 0.0,
        Passes::ForwardBackward => 2.0 * kv_elems(TOKENS) * F32 / link,
    };
    before_steps(c, docs).seconds(gpu)
        + simulate(&compute, step_bytes(passes) / link).makespan
        + after_steps(c).seconds(gpu)
        + last_gradients
}

/// Llama 3's context parallelism (`llama3_flash_attn_varlen.py`): the global sequence (every
/// document 8× its local length) split contiguously; K and V all-gathered in 2 groups of 4
/// key/value heads, the next group's gather overlapping this group's call; each rank's queries
/// attend causally to their documents' earlier keys. The backward gathers again and
/// reduce-scatters dK, dV (bf16) after each group's call. Collectives wait for the slowest rank.
fn llama3_seconds(gpu: &FlashGpu, passes: Passes, docs: &[usize]) -> f64 {
    const GROUPS: usize = 2;
    let group_heads = Heads {
        q: HEADS.q / GROUPS,
        kv: HEADS.kv / GROUPS,
        dim: HEADS.dim,
    };
    // Each rank's pieces: its rows of each global document, against that document's keys up to
    // them.
    let global: Vec<usize> = docs.iter().map(|&l| l * RANKS).collect();
    let pieces: Vec<Vec<Piece>> = (0..RANKS)
        .map(|rank| {
            let (lo, hi) = (rank * TOKENS, (rank + 1) * TOKENS);
            let mut start = 0;
            let mut mine = Vec::new();
            for &len in &global {
                let (a, b) = (lo.max(start), hi.min(start + len));
                if a < b {
                    mine.push(piece(b - a, b - start, true));
                }
                start += len;
            }
            mine
        })
        .collect();
    // (NaN-aware: a NaN call time makes a NaN prediction.)
    let slowest = |p: Passes| {
        largest(
            pieces
                .iter()
                .map(|mine| call_seconds(gpu, p, group_heads, mine)),
        )
        .unwrap_or(0.0)
    };
    let link = gpu.link_bytes_per_s.value;
    // A group's K and V from the 7 other ranks.
    let gather = (RANKS - 1) as f64 * 2.0 * kv_elems(TOKENS) / GROUPS as f64 * BYTES / link;
    let pass = |call: f64, after: f64| {
        (0..GROUPS)
            .map(|g| {
                let hidden = if g + 1 < GROUPS { gather } else { 0.0 };
                largest([call, hidden]).unwrap_or(call) + after
            })
            .sum::<f64>()
            + gather
    };
    let forward = slowest(Passes::Forward);
    match passes {
        Passes::Forward => pass(forward, 0.0),
        Passes::ForwardBackward => {
            let backward = slowest(Passes::ForwardBackward) - forward;
            pass(forward, 0.0) + pass(backward, gather)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1e6;

    fn cell_of(varlen: bool, fb: bool, variant: Variant) -> Cell {
        cell("8xH800", varlen, fb, variant, 50.0)
    }

    /// The copies are the bytes the source moves, counted by hand from its shapes (Q = 8192 × 32
    /// × 128 elements, K = 8192 × 8 × 128): the per-step write-backs and gathers, and what every
    /// call does once.
    #[test]
    fn the_copies_are_the_sources_bytes() {
        let (q, k) = (8192.0 * 32.0 * 128.0, 8192.0 * 8.0 * 128.0);
        let lse = 8192.0 * 32.0;
        let close = |got: Copies, bytes: f64, kernels: f64| {
            assert!(
                (got.bytes - bytes).abs() < 1.0 && got.kernels == kernels,
                "{got:?}"
            );
        };
        let batch = [TOKENS].as_slice();
        let zigzag = cell_of(false, false, Variant::ZigZag);
        // Step 0 and steps up to the rank write nothing back; past it, half of out and lse.
        close(step_copies(&zigzag, batch, 3, 0), 0.0, 0.0);
        close(step_copies(&zigzag, batch, 3, 3), 0.0, 0.0);
        close(
            step_copies(&zigzag, batch, 3, 4),
            8.0 * (q + lse) / 2.0,
            2.0,
        );
        assert!((step_copies(&zigzag, batch, 3, 4).bytes / MB - 135.3).abs() < 0.1);
        // Stripe writes back all rows but the first.
        let stripe = cell_of(false, false, Variant::Stripe);
        let rows = 8191.0 / 8192.0;
        close(
            step_copies(&stripe, batch, 0, 5),
            8.0 * (q + lse) * rows,
            2.0,
        );
        close(
            step_copies(&cell_of(false, false, Variant::Ring), batch, 0, 5),
            0.0,
            0.0,
        );
        // Varlen zig-zag with several documents: gathers and index_puts.
        let masked = cell_of(true, true, Variant::ZigZag);
        let docs = VARLEN_DOCUMENTS[1];
        close(
            step_copies(&masked, docs, 2, 5),
            16.0 * (q / 2.0 + lse / 2.0) + 16.0 * q / 2.0,
            6.0,
        );
        // Up to the rank: K and V's halves gathered by the forward and again by the backward,
        // then dK and dV each gathered, added and put back.
        close(
            step_copies(&masked, docs, 2, 1),
            2.0 * 8.0 * k / 2.0 + 32.0 * k / 2.0,
            8.0,
        );
        // One document: slices, so only the batch API's write-back.
        close(
            step_copies(&masked, VARLEN_DOCUMENTS[0], 2, 5),
            8.0 * (q + lse) / 2.0,
            2.0,
        );
        // Once a call: K and V made contiguous; out to bf16; with the backward the three casts and
        // autograd's backward of the two views.
        close(before_steps(&zigzag, batch), 8.0 * k, 2.0);
        close(after_steps(&zigzag), 6.0 * q, 1.0);
        let fb = cell_of(false, true, Variant::Ring);
        let select_backward = 8.0 * k + 8.0 * k + 12.0 * k;
        close(
            after_steps(&fb),
            6.0 * q + 6.0 * (q + 2.0 * k) + select_backward,
            9.0,
        );
        assert!((select_backward / MB - 234.9).abs() < 0.1);
    }
}
