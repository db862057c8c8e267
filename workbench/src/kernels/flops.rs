//! The FLOP model, one home: attention FLOPs per visible (query, key) pair and head dimension, and the
//! training FLOPs of a dense model, as every table and event counts them.

/// Forward: QKᵀ and PV, one multiply-add (2 FLOPs) each per pair and head dimension.
pub const FORWARD_PER_PAIR_DIM: u64 = 4;
/// Backward with the probabilities recomputed from the saved log-sum-exp: QKᵀ again, then dV, dP, dQ
/// and dK, 2 FLOPs each.
pub const BACKWARD_PER_PAIR_DIM: u64 = 10;
/// What the model needs, the convention of MFU (no recomputation): the forward's 4 and a backward of
/// twice the forward.
pub const MODEL_PER_PAIR_DIM: u64 = 12;
/// A dense layer's training FLOPs per parameter and token: 2 forward, 4 backward.
pub const DENSE_PER_PARAM_TOKEN: u64 = 6;

/// Visible (query, key) pairs of one head over a whole sequence of `seq` tokens.
pub fn sequence_pairs(seq: usize, causal: bool) -> u64 {
    let s = seq as u64;
    if causal { s * (s + 1) / 2 } else { s * s }
}
