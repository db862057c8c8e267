//! exp(x) in f32 without a call into libm, branch-free so that loops over it vectorize: the one exp
//! of the fused attention tiles and of the model's SwiGLU on the CPU.

/// exp(x) to about 2 ulp, branch-free so that it vectorizes; exp(−∞) = 0 exactly.
///
/// The integer part of x·log₂e is rounded by adding 1.5·2²³, which leaves it in the low mantissa
/// bits: no float-to-int conversion (Rust's saturating `as` does not vectorize).
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.7);
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // Remez-style polynomial for e^r on |r| ≤ ln2/2 (Cephes expf coefficients).
    let p = 1.987_569_1e-4f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let e = (p * r * r + r) + 1.0;
    // The low bits of t hold n + 2²² (two's complement for negative n); 2ⁿ = (n + 127) << 23.
    let bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    let scaled = e * f32::from_bits(bits);
    if x == f32::NEG_INFINITY { 0.0 } else { scaled }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let worst = ringbench_tests::worst((-8000..=800).map(|i| {
            let x = i as f32 * 0.0109;
            f64::from(((fast_exp(x) - x.exp()) / x.exp()).abs())
        }));
        assert!(worst < 4e-7, "worst relative error {worst:e}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }
}
