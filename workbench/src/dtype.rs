//! Element types of the values that travel and are multiplied: f32, and bfloat16 (8 exponent bits,
//! 8 significant bits), with rounding to them. Below blocks, kernels and transports, which share it.
//!
//! A bf16 tensor-core product is the exact product of bf16 values accumulated in f32; the CPU
//! computes the same from f32 values that are bf16 numbers, so rounding an f32 to the nearest bf16
//! (ties to even, `half`'s conversion) is all the arithmetic a bf16 run needs.

use half::bf16;
use std::fmt;
use std::str::FromStr;

/// An element type of blocks and tile operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Dtype {
    /// IEEE single precision.
    #[default]
    F32,
    /// bfloat16: f32's exponent range with 8 significant bits (7 stored; unit roundoff 2⁻⁸).
    Bf16,
}

impl Dtype {
    /// Every element type, in the order sweeps list them.
    pub const ALL: [Dtype; 2] = [Dtype::F32, Dtype::Bf16];

    /// Bytes of one value.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }

    /// Unit roundoff: the largest relative error of rounding a value to this type (2⁻²⁴, 2⁻⁸).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Dtype::F32 => f64::from(f32::EPSILON) / 2.0,
            Dtype::Bf16 => 2f64.powi(-8),
        }
    }

    /// Rounds every value to the nearest value of this type, in place (f32: unchanged). NaN and
    /// infinities stay what they are.
    pub fn round(self, values: &mut [f32]) {
        if self == Dtype::Bf16 {
            for x in values {
                *x = round_bf16(*x);
            }
        }
    }

    /// Its name in specs, flags and tables.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// The element types of a ring pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Precision {
    /// What q, k, v and dO are rounded to on entry, what every operand block travels in, what P and
    /// dS are rounded to before they enter a matmul (products are taken exactly and summed in f32,
    /// as bf16 tensor cores do), and what the outputs and gradients are returned in. The per-row
    /// statistics (lse, δ) stay f32, as flash attention kernels keep them.
    pub dtype: Dtype,
    /// What each rank keeps its running output and gradient accumulators in between ring steps, and
    /// what a travelling gradient accumulator is sent in: bf16 is what a ring of per-block bf16
    /// kernels does, f32 the remedy.
    pub merge: Dtype,
}

impl Precision {
    /// Everything in f32.
    pub const F32: Precision = Precision {
        dtype: Dtype::F32,
        merge: Dtype::F32,
    };

    /// Whether any part is bf16.
    pub fn uses_bf16(self) -> bool {
        self.dtype == Dtype::Bf16 || self.merge == Dtype::Bf16
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as an f32.
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// `values` as bf16 (rounded to nearest, ties to even).
pub fn to_bf16(values: &[f32]) -> Vec<bf16> {
    values.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// bf16 `values` as f32 (exact).
pub fn from_bf16(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|x| x.to_f32()).collect()
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type name that is not one of [`Dtype::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown element type '{0}': expected f32 or bf16")]
pub struct UnknownDtype(pub String);

impl FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| UnknownDtype(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_what_is_not_finite() {
        // bf16's values next to 1 are 2⁻⁷ apart: nearer one wins, a tie goes to the even one.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-9)), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-9)), 1.0 + 2f32.powi(-7));
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        // Every rounding lies within the unit roundoff.
        let u = Dtype::Bf16.unit_roundoff();
        for i in 1..1000 {
            let x = i as f32 * 0.01234567;
            let r = round_bf16(x);
            assert!(f64::from((r - x).abs()) <= u * f64::from(x), "{x} -> {r}");
        }
        assert_eq!(from_bf16(&to_bf16(&[0.5, -3.0])), [0.5, -3.0]);
    }

    #[test]
    fn names_parse_back_and_unknown_ones_are_named() {
        for d in Dtype::ALL {
            assert_eq!(d.name().parse::<Dtype>(), Ok(d));
        }
        assert_eq!(
            "fp8".parse::<Dtype>().unwrap_err().to_string(),
            "unknown element type 'fp8': expected f32 or bf16"
        );
    }
}
