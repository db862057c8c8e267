//! How far f32 (and bf16) arithmetic may lie from exact: bounds derived from the unit roundoff and
//! the longest chain of roundings one value meets (Higham's γₙ), used by the product's checks (the
//! tables' error columns, retrieval's near ties) and by the tests alike.

/// float32's unit roundoff, 2⁻²⁴.
pub const F32_UNIT_ROUNDOFF: f64 = 5.960_464_477_539_063e-8;

/// How far f32 ring attention (out, lse, dq, dk, dv) may lie from the float64 reference, relative to
/// each tensor's largest magnitude: 1e-5.
///
/// A sum of n float32 terms is off by at most n·u of the sum of their magnitudes (u =
/// [`F32_UNIT_ROUNDOFF`]; Higham's γₙ). The longest chains of one value here: a score sums
/// head_dim = 16 products; the softmax's row sums, p·V, and dK/dV's sums over queries run over at most
/// 128 keys or queries in one chain (the fused kernel's sub-tile; the generic kernel's tiles hold at
/// most 96 here), then merge one partial per sub-tile and ring step (at most 8 + 8); dQ repeats the
/// score's 16 and the keys' 128. exp and log add a few u each. So ≈ (16 + 128 + 16 + 8)·u ≈ 1.0e-5 of
/// the terms' magnitudes, which for these inputs (uniform in [−2, 2]; p ≥ 0 summing to 1) is the
/// order of each tensor's largest value; the gradients' terms ds = p·(dp − δ) partly cancel, which
/// uniform inputs keep mild. Measured errors are ~20× below it. The derivation covers tiles of at
/// most 128 keys and 8 ring steps; a run with longer tiles is held to [`f32_attention_bound_at`].
pub const F32_ATTENTION: f64 = 1e-5;

/// The narrowest sub-tile of keys any kernel merges as one partial (the fused device kernel's 32).
const NARROWEST_SUB_TILE: usize = 32;

/// [`F32_ATTENTION`]'s derivation for a run of `head_dim`-wide heads whose tiles hold up to
/// `tile_len` keys (or queries: a shard's length) over `ring_steps` steps: a score's `head_dim`
/// products, a chain of `tile_len` terms (softmax sums, p·V, dK/dV), dP's `head_dim`, and one merged
/// partial per sub-tile and per ring step, each term rounded by at most u ([`F32_UNIT_ROUNDOFF`]);
/// never below the project's standard 1e-5, which is what it gives for 16-wide heads and tiles of
/// 128.
pub fn f32_attention_bound_at(head_dim: usize, tile_len: usize, ring_steps: usize) -> f64 {
    let merges = tile_len.div_ceil(NARROWEST_SUB_TILE) + ring_steps;
    let chain = 2 * head_dim + tile_len + merges;
    (chain as f64 * F32_UNIT_ROUNDOFF).max(F32_ATTENTION)
}
