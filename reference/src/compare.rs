//! The workspace's one numeric comparison: how far computed values lie from expected ones, where a
//! NaN or an infinity anywhere is an infinite error that names its index.
//!
//! `f64::max` returns its other argument when one is NaN, so a fold of errors with it reads an
//! output that is NaN everywhere as error 0. Every comparison in the tests, the `attn` kind's
//! `max_rel_error` column and the exactness measurement goes through here instead.

use std::fmt;

/// The largest deviation of computed values from expected ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deviation {
    /// max |got − want| over max |want|: the error relative to the expected tensor's scale;
    /// infinite when something is wrong (below).
    pub rel: f64,
    /// max |got − want|; infinite when something is wrong.
    pub abs: f64,
    /// Where the largest difference is, or the first thing wrong.
    pub at: usize,
    /// What is wrong, if anything: a value that is not finite, or lengths that differ.
    pub wrong: Option<Wrong>,
}

/// Why a comparison is an infinite error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wrong {
    /// `got[at]` is NaN or infinite.
    GotNotFinite(f64),
    /// `want[at]` is NaN or infinite.
    WantNotFinite(f64),
    /// The two have different lengths.
    Lengths { got: usize, want: usize },
}

impl Deviation {
    /// Whether the relative error is at most `tolerance` (never, when something is wrong).
    pub fn within(&self, tolerance: f64) -> bool {
        self.wrong.is_none() && self.rel <= tolerance
    }

    fn wrong(at: usize, wrong: Wrong) -> Self {
        Deviation {
            rel: f64::INFINITY,
            abs: f64::INFINITY,
            at,
            wrong: Some(wrong),
        }
    }
}

impl fmt::Display for Deviation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.wrong {
            None => write!(
                f,
                "rel err {:.3e} (abs {:.3e} at index {})",
                self.rel, self.abs, self.at
            ),
            Some(Wrong::GotNotFinite(x)) => write!(f, "got {x} at index {}", self.at),
            Some(Wrong::WantNotFinite(x)) => {
                write!(f, "the expected value is {x} at index {}", self.at)
            }
            Some(Wrong::Lengths { got, want }) => {
                write!(f, "got {got} values where {want} were expected")
            }
        }
    }
}

/// How far `got` lies from `want`: max |got − want| / max |want|, NaN-aware.
pub fn deviation<G, W>(got: &[G], want: &[W]) -> Deviation
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    if got.len() != want.len() {
        return Deviation::wrong(
            0,
            Wrong::Lengths {
                got: got.len(),
                want: want.len(),
            },
        );
    }
    let (mut scale, mut abs, mut at) = (0.0f64, 0.0f64, 0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        if !g.is_finite() {
            return Deviation::wrong(i, Wrong::GotNotFinite(g));
        }
        if !w.is_finite() {
            return Deviation::wrong(i, Wrong::WantNotFinite(w));
        }
        scale = scale.max(w.abs());
        let d = (g - w).abs();
        if d > abs {
            (abs, at) = (d, i);
        }
    }
    Deviation {
        rel: abs / scale.max(f64::MIN_POSITIVE),
        abs,
        at,
        wrong: None,
    }
}

/// Like [`deviation`], except that an expected tensor that is zero everywhere (a gradient that
/// cancels exactly) is measured against `zero_scale`, the magnitude of the terms that cancelled,
/// instead of against nothing (which would make any rounding an error of 1e300).
pub fn deviation_at_scale<G, W>(got: &[G], want: &[W], zero_scale: f64) -> Deviation
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    let found = deviation(got, want);
    let all_zero = want.iter().all(|&w| w.into() == 0.0);
    match found.wrong {
        None if all_zero && zero_scale > 0.0 => Deviation {
            rel: found.abs / zero_scale,
            ..found
        },
        _ => found,
    }
}

/// ‖got − want‖₂ / ‖want‖₂: the error of the tensor as a whole (a growth a few elements' maximum
/// hides shows here); infinite when a value is NaN or infinite or the lengths differ.
pub fn rms_rel_err<G, W>(got: &[G], want: &[W]) -> f64
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w): (f64, f64) = (g.into(), w.into());
        if !g.is_finite() || !w.is_finite() {
            return f64::INFINITY;
        }
        diff += (g - w) * (g - w);
        norm += w * w;
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// max |got − want| / max |want|; infinite when a value is NaN or infinite or the lengths differ.
pub fn rel_err<G, W>(got: &[G], want: &[W]) -> f64
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    deviation(got, want).rel
}

/// The largest of `errors`, where a NaN counts as an infinite error (not as nothing, which is what
/// folding with `f64::max` makes of it); 0 for none.
pub fn worst(errors: impl IntoIterator<Item = f64>) -> f64 {
    errors.into_iter().fold(0.0, |m, e| {
        if e.is_nan() || m.is_nan() {
            f64::INFINITY
        } else {
            m.max(e)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_have_no_error_and_a_difference_is_relative_to_the_scale() {
        let want = [1.0f64, -4.0, 2.0];
        assert_eq!(deviation(&[1.0f32, -4.0, 2.0], &want).rel, 0.0);
        let d = deviation(&[1.0f32, -4.0, 2.5], &want);
        assert_eq!((d.rel, d.abs, d.at), (0.125, 0.5, 2));
        assert!(d.within(0.125) && !d.within(0.1));
    }

    #[test]
    fn an_all_nan_output_fails() {
        let d = deviation(&[f32::NAN; 4], &[0.5f64; 4]);
        assert_eq!(d.rel, f64::INFINITY);
        assert!(!d.within(1e9));
        assert_eq!(d.at, 0);
        assert!(d.to_string().contains("NaN at index 0"), "{d}");
    }

    #[test]
    fn one_nan_or_infinity_fails_and_names_its_index() {
        let want = [0.5f64; 6];
        let mut got = [0.5f32; 6];
        got[4] = f32::NAN;
        let d = deviation(&got, &want);
        assert!(!d.within(1.0));
        assert_eq!((d.at, d.to_string()), (4, "got NaN at index 4".to_owned()));
        got[4] = 0.5;
        got[2] = f32::NEG_INFINITY;
        assert_eq!(deviation(&got, &want).at, 2);
        assert_eq!(rel_err(&got, &want), f64::INFINITY);
        // A NaN in the expected values is no less wrong.
        let d = deviation(&[0.5f32; 6], &[0.5, f64::NAN, 0.5, 0.5, 0.5, 0.5]);
        assert_eq!((d.at, d.rel), (1, f64::INFINITY));
    }

    #[test]
    fn lengths_that_differ_fail() {
        let d = deviation(&[1.0f32; 3], &[1.0f64; 4]);
        assert!(!d.within(1.0));
        assert_eq!(d.to_string(), "got 3 values where 4 were expected");
    }

    #[test]
    fn a_reference_that_is_zero_everywhere_is_measured_against_its_terms() {
        let d = deviation_at_scale(&[1e-8f32, -2e-8], &[0.0f64, 0.0], 4.0);
        assert!((d.rel - 2e-8f32 as f64 / 4.0).abs() < 1e-15, "{d}");
        // A reference with a scale of its own keeps it; a NaN still fails.
        let d = deviation_at_scale(&[1.5f32, 0.0], &[1.0f64, 0.0], 1e6);
        assert_eq!(d.rel, 0.5);
        assert!(!deviation_at_scale(&[f32::NAN], &[0.0f64], 4.0).within(1.0));
    }

    #[test]
    fn the_rms_error_is_relative_to_the_norm_and_fails_on_nan() {
        assert!(
            (rms_rel_err(&[1.0f32, 1.0], &[1.0f64, 2.0]) - (1.0f64 / 5.0).sqrt()).abs() < 1e-12
        );
        assert_eq!(rms_rel_err(&[f32::NAN], &[1.0f64]), f64::INFINITY);
        assert_eq!(rms_rel_err(&[1.0f32], &[1.0f64, 2.0]), f64::INFINITY);
    }

    #[test]
    fn the_worst_error_counts_nan_as_infinite() {
        assert_eq!(worst([1e-7, 3e-6, 2e-7]), 3e-6);
        assert_eq!(worst([1e-7, f64::NAN, 2e-7]), f64::INFINITY);
        assert_eq!(worst([f64::NAN]), f64::INFINITY);
        assert_eq!(worst([]), 0.0);
        // What the fold this replaces made of the same errors.
        assert_eq!([1e-7, f64::NAN].into_iter().fold(0.0, f64::max), 1e-7);
    }
}
