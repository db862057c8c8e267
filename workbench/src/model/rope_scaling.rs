//! RoPE's frequencies: the base `θ` and a context-extension scaling (position interpolation, dynamic
//! NTK, LLaMA 3's band-wise scaling, YaRN), each as Hugging Face transformers computes its inverse
//! frequencies and attention factor, so that a checkpoint trained with one rotates the same here.
//!
//! With `d` the rotated width and `i < d / 2`, the unscaled inverse frequencies are
//! `ω_i = θ^(−2i/d)`; token `p` rotates pair `i` by `p · ω_i`. The scalings change `ω` (and YaRN
//! multiplies cos and sin by an attention factor, which scales every score by its square).
//! A GGUF file written by llama.cpp's converter carries LLaMA 3's scaling as its table of
//! per-frequency divisors (`rope_freqs.weight`): [`RopeScaling::FrequencyFactors`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::f64::consts::PI;
use std::sync::Mutex;

/// A RoPE scaling (`rope_scaling` / `rope_parameters` in a Hugging Face config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// None: `ω_i = θ^(−2i/d)`.
    #[default]
    Default,
    /// Position interpolation: every `ω_i` divided by `factor`.
    Linear {
        /// The interpolation factor.
        factor: f64,
    },
    /// Dynamic NTK: once a forward's sequence (its largest position + 1) `s` exceeds
    /// `max_position_embeddings` `L`, the base becomes `θ · (factor · s / L − (factor − 1))^(d/(d−2))`.
    Dynamic {
        /// The scaling factor.
        factor: f64,
        /// The length the model was trained at.
        max_position_embeddings: usize,
    },
    /// LLaMA 3.1: wavelengths `2π/ω` longer than `L / low_freq_factor` are divided by `factor`,
    /// shorter than `L / high_freq_factor` kept, and those between interpolated smoothly.
    Llama3 {
        /// The scaling factor.
        factor: f64,
        /// Low-frequency band edge.
        low_freq_factor: f64,
        /// High-frequency band edge.
        high_freq_factor: f64,
        /// `L`: the pretrained context length.
        original_max_position_embeddings: usize,
    },
    /// YaRN: per dimension, a ramp between extrapolated (`ω_i`) and interpolated (`ω_i / factor`)
    /// frequencies whose ends are the dimensions that turn `beta_fast` and `beta_slow` times over the
    /// original context; cos and sin are multiplied by `attention_factor`.
    Yarn {
        /// The interpolation factor.
        factor: f64,
        /// The pretrained context length.
        original_max_position_embeddings: usize,
        /// Rotations at the ramp's extrapolated end (32 by default).
        beta_fast: f64,
        /// Rotations at the ramp's interpolated end (1 by default).
        beta_slow: f64,
        /// The factor on cos and sin (`0.1 · ln(factor) + 1` by default).
        attention_factor: f64,
        /// Whether the ramp's ends are rounded to whole dimensions (true by default).
        truncate: bool,
    },
    /// A divisor per frequency: `ω_i / factors[i]` (llama.cpp's `rope_freqs.weight`, which its
    /// converter computes from a LLaMA 3 scaling).
    #[serde(rename = "frequency_factors")]
    FrequencyFactors {
        /// One divisor for each of the head's `d / 2` frequencies.
        factors: FrequencyFactors,
    },
}

/// A table of per-frequency divisors, held once per distinct table for the life of the process
/// (a model's config is copied into every layer and every rank; the table is a few hundred bytes,
/// and a process loads a handful of models), so that the scaling stays a plain `Copy` value.
#[derive(Clone, Copy)]
pub struct FrequencyFactors(&'static [f64]);

/// Every distinct table made so far.
static TABLES: Mutex<Vec<&'static [f64]>> = Mutex::new(Vec::new());

impl FrequencyFactors {
    /// The table of `factors`: the one made before when equal, else a new one.
    pub fn new(factors: &[f64]) -> Self {
        let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = tables.iter().find(|t| {
            t.len() == factors.len()
                && t.iter()
                    .zip(factors)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
        }) {
            return FrequencyFactors(known);
        }
        let table: &'static [f64] = Box::leak(factors.to_vec().into_boxed_slice());
        tables.push(table);
        FrequencyFactors(table)
    }

    /// The divisors, lowest frequency index first.
    pub fn values(&self) -> &'static [f64] {
        self.0
    }
}

impl std::fmt::Debug for FrequencyFactors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for FrequencyFactors {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Serialize for FrequencyFactors {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for FrequencyFactors {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(FrequencyFactors::new(&Vec::<f64>::deserialize(
            deserializer,
        )?))
    }
}

/// RoPE's base and scaling: what rotates a token at a global position.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeFrequencies {
    /// The base `θ`.
    pub theta: f64,
    /// The context-extension scaling.
    pub scaling: RopeScaling,
}

impl RopeScaling {
    /// Its name in configs: `default`, `linear`, `dynamic`, `llama3`, `yarn` or
    /// `frequency_factors`.
    pub fn name(&self) -> &'static str {
        match self {
            RopeScaling::Default => "default",
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Dynamic { .. } => "dynamic",
            RopeScaling::Llama3 { .. } => "llama3",
            RopeScaling::Yarn { .. } => "yarn",
            RopeScaling::FrequencyFactors { .. } => "frequency_factors",
        }
    }

    /// YaRN's default attention factor for `factor`: `0.1 · ln(factor) + 1` (1 for no scaling).
    pub fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * factor.ln() + 1.0
        }
    }

    /// A value that cannot scale anything (a factor that is not a finite number above 0, an empty
    /// context length, band edges out of order), named; `None` when it is sound.
    pub fn fault(&self) -> Option<String> {
        let factor_fault = |name: &str, f: f64| {
            (!(f.is_finite() && f > 0.0)).then(|| format!("{name} = {f} must be a number above 0"))
        };
        match *self {
            RopeScaling::Default => None,
            RopeScaling::Linear { factor } => factor_fault("factor", factor),
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } => factor_fault("factor", factor).or_else(|| {
                (max_position_embeddings == 0)
                    .then(|| "max_position_embeddings must be above 0".to_string())
            }),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => factor_fault("factor", factor)
                .or_else(|| factor_fault("low_freq_factor", low_freq_factor))
                .or_else(|| factor_fault("high_freq_factor", high_freq_factor))
                .or_else(|| {
                    (high_freq_factor <= low_freq_factor).then(|| {
                        format!(
                            "high_freq_factor = {high_freq_factor} must exceed low_freq_factor = {low_freq_factor}"
                        )
                    })
                })
                .or_else(|| {
                    (original_max_position_embeddings == 0)
                        .then(|| "original_max_position_embeddings must be above 0".to_string())
                }),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                ..
            } => factor_fault("factor", factor)
                .or_else(|| factor_fault("beta_fast", beta_fast))
                .or_else(|| factor_fault("beta_slow", beta_slow))
                .or_else(|| factor_fault("attention_factor", attention_factor))
                .or_else(|| {
                    (original_max_position_embeddings == 0)
                        .then(|| "original_max_position_embeddings must be above 0".to_string())
                }),
            RopeScaling::FrequencyFactors { factors } => factors
                .values()
                .iter()
                .enumerate()
                .find_map(|(i, &f)| factor_fault(&format!("factors[{i}]"), f)),
        }
    }

    /// A scaling that cannot rotate a head of `head_dim` (a table of frequency factors of another
    /// length), named; `None` when it fits.
    pub fn head_fault(&self, head_dim: usize) -> Option<String> {
        match self {
            RopeScaling::FrequencyFactors { factors } if factors.values().len() != head_dim / 2 => {
                Some(format!(
                    "{} frequency factors for heads of {head_dim} ({} frequencies)",
                    factors.values().len(),
                    head_dim / 2
                ))
            }
            _ => None,
        }
    }
}

impl RopeFrequencies {
    /// Unscaled RoPE with base `theta`.
    pub fn plain(theta: f64) -> Self {
        RopeFrequencies {
            theta,
            scaling: RopeScaling::Default,
        }
    }

    /// The inverse frequencies `ω_i` (`d / 2` of them) of a `d`-wide head and the factor on cos and
    /// sin, for a forward whose largest position is `seq_len − 1` (only dynamic NTK reads it).
    pub fn inverse_frequencies(&self, d: usize, seq_len: usize) -> (Vec<f64>, f64) {
        let with_base = |base: f64| -> Vec<f64> {
            (0..d / 2)
                .map(|i| base.powf(-((2 * i) as f64) / d as f64))
                .collect()
        };
        let plain = with_base(self.theta);
        match self.scaling {
            RopeScaling::Default => (plain, 1.0),
            RopeScaling::Linear { factor } => (plain.iter().map(|w| w / factor).collect(), 1.0),
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings: max,
            } => {
                if seq_len <= max {
                    return (plain, 1.0);
                }
                let stretch = factor * seq_len as f64 / max as f64 - (factor - 1.0);
                let base = self.theta * stretch.powf(d as f64 / (d as f64 - 2.0));
                (with_base(base), 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: old,
            } => {
                let old = old as f64;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                let scaled = plain
                    .iter()
                    .map(|&w| {
                        let wavelen = 2.0 * PI / w;
                        if wavelen < high_wavelen {
                            w
                        } else if wavelen > low_wavelen {
                            w / factor
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * w / factor + smooth * w
                        }
                    })
                    .collect();
                (scaled, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // The dimension that turns `rotations` times over the original context.
                let dim_of = |rotations: f64| {
                    d as f64 * (old as f64 / (rotations * 2.0 * PI)).ln() / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d as f64 - 1.0));
                if low == high {
                    high += 0.001;
                }
                let scaled = plain
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolate = 1.0 - ramp;
                        w / factor * (1.0 - extrapolate) + w * extrapolate
                    })
                    .collect();
                (scaled, attention_factor)
            }
            RopeScaling::FrequencyFactors { factors } => {
                assert_eq!(
                    factors.values().len(),
                    plain.len(),
                    "frequency factors for heads of {d} (LlamaConfig::validate checks this)"
                );
                let scaled = plain.iter().zip(factors.values()).map(|(w, f)| w / f);
                (scaled.collect(), 1.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{RopeFrequencies, RopeScaling};

    fn frequencies(scaling: RopeScaling) -> RopeFrequencies {
        RopeFrequencies {
            theta: 10000.0,
            scaling,
        }
    }

    #[test]
    fn linear_divides_and_dynamic_waits_for_the_trained_length() {
        let (plain, _) = RopeFrequencies::plain(10000.0).inverse_frequencies(16, 1);
        assert_eq!(plain.len(), 8);
        assert_eq!(plain[0], 1.0);
        assert!((plain[1] - 10000f64.powf(-2.0 / 16.0)).abs() < 1e-15);
        let (linear, s) =
            frequencies(RopeScaling::Linear { factor: 4.0 }).inverse_frequencies(16, 1);
        assert_eq!((linear[3] * 4.0, s), (plain[3], 1.0));
        let dynamic = frequencies(RopeScaling::Dynamic {
            factor: 2.0,
            max_position_embeddings: 16,
        });
        assert_eq!(dynamic.inverse_frequencies(16, 16).0, plain);
        // s = 24, L = 16, factor 2: base θ · (3 − 1)^(16/14).
        let base: f64 = 10000.0 * 2f64.powf(16.0 / 14.0);
        let (grown, _) = dynamic.inverse_frequencies(16, 24);
        assert!((grown[2] - base.powf(-4.0 / 16.0)).abs() < 1e-15);
    }

    #[test]
    fn llama3_keeps_high_frequencies_and_divides_low_ones() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let (plain, _) = RopeFrequencies::plain(10000.0).inverse_frequencies(16, 1);
        let (scaled, _) = frequencies(scaling).inverse_frequencies(16, 1);
        // Wavelengths 2π·θ^(2i/16): 6.3 (< 16: kept), 19.9 and 62.8 (between: smoothed), ≥ 199 (÷ 8).
        assert_eq!(scaled[0], plain[0]);
        for i in 3..8 {
            assert!((scaled[i] - plain[i] / 8.0).abs() < 1e-18);
        }
        for i in 1..3 {
            assert!(scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0);
        }
    }

    #[test]
    fn yarn_ramps_from_extrapolated_to_interpolated() {
        let scaling = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 16,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: RopeScaling::yarn_mscale(4.0, 1.0),
            truncate: true,
        };
        let (plain, _) = RopeFrequencies::plain(10000.0).inverse_frequencies(16, 1);
        let (scaled, s) = frequencies(scaling).inverse_frequencies(16, 1);
        assert!((s - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        // low = max(floor(16·ln(16/(64π))/(2 ln θ)), 0) = 0, high = ceil(16·ln(16/2π)/(2 ln θ)) = 1:
        // dimension 0 extrapolated, 1 and above interpolated.
        assert_eq!(scaled[0], plain[0]);
        for i in 1..8 {
            assert!((scaled[i] - plain[i] / 4.0).abs() < 1e-18);
        }
    }

    #[test]
    fn a_factor_that_scales_nothing_is_named() {
        assert_eq!(
            RopeScaling::Linear { factor: 0.0 }.fault().unwrap(),
            "factor = 0 must be a number above 0"
        );
        assert!(RopeScaling::Linear { factor: f64::NAN }.fault().is_some());
        assert_eq!(RopeScaling::Default.fault(), None);
    }
}
