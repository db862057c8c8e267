//! The bf16 bound: how far a run with bf16 operands and an f32 merge may lie from the float64
//! reference of its rounded inputs, each tensor at the scale its bound is stated at.
//!
//! With q, k, v, dO rounded to bf16 (u = 2⁻⁸), the reference of those rounded inputs leaves the
//! algorithm's own error: scores are exact products summed in f32; P is rounded to bf16 before p·V
//! (each term moves by at most u of itself) and the output once more when returned (u of itself), so
//! out is within 2u of Σ p·|v|, its terms' magnitudes ([`Reference::out_terms`]); dV likewise (P before
//! Pᵀ·dO, the result once): 2u of Σ p·|dO|. dS is rounded before dS·K and dSᵀ·Q (u), δ reads the
//! rounded output (2u of the magnitudes δ is summed from, which the terms of dq and dk include) and
//! the result is rounded (u): 4u. lse never meets a bf16 rounding beyond the inputs': f32's bound.
//! Each adds f32's own arithmetic ([`F32_ATTENTION`], relative to the same scale).

use crate::attention::Reference;
use crate::bounds::F32_ATTENTION;
use crate::compare::{deviation, deviation_at_scale};
use workbench::dtype::Dtype;
use workbench::ring::jobs::AttentionResult;

/// Each tensor's error relative to the scale its bound is stated at: out, dq, dk, dv relative to
/// their terms' magnitudes, lse to its largest value. NaN-aware (an infinite error).
pub fn errors(result: &AttentionResult, want: &Reference) -> [(&'static str, f64); 5] {
    let grads = result.grads.as_ref().expect("gradients");
    let at = |got: &[f32], want: &[f64], terms: f64| {
        let d = deviation(got, want);
        if d.wrong.is_some() {
            f64::INFINITY
        } else {
            d.abs / terms
        }
    };
    [
        ("out", at(&result.out.data, &want.out, want.out_terms)),
        (
            "lse",
            deviation_at_scale(&result.lse.data, &want.lse, 1.0).rel,
        ),
        ("dq", at(&grads.dq.data, &want.dq, want.dq_terms)),
        ("dk", at(&grads.dk.data, &want.dk, want.dk_terms)),
        ("dv", at(&grads.dv.data, &want.dv, want.dv_terms)),
    ]
}

/// The bound of each tensor's error (the module's derivation), in the order of [`errors`].
pub fn bounds() -> [f64; 5] {
    let u = Dtype::Bf16.unit_roundoff();
    [
        2.0 * u + F32_ATTENTION,
        F32_ATTENTION,
        4.0 * u + F32_ATTENTION,
        4.0 * u + F32_ATTENTION,
        2.0 * u + F32_ATTENTION,
    ]
}
