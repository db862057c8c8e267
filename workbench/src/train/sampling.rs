//! How a decoded token is picked from its logits: greedy (the largest logit, the default), or drawn
//! after a temperature, top-k and top-p (nucleus) cut, as transformers' `generate(do_sample=True)`
//! orders them. Each draw is keyed by (seed, prompt, step) rather than taken from a stream, so the
//! same seed gives the same tokens whatever the rank count, batch size or cache.

use crate::error::RingError;

/// How a token is picked.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Sampling {
    /// The largest logit; the first on a tie.
    #[default]
    Greedy,
    /// A draw from the softmax of logits ÷ `temperature`, cut to the `top_k` largest (0: all) and
    /// then to the fewest whose probabilities sum to at least `top_p`.
    Random {
        /// Divides the logits (> 0).
        temperature: f64,
        /// Candidates kept by logit (0: all).
        top_k: usize,
        /// The probability mass kept, in (0, 1].
        top_p: f64,
        /// The seed every draw is keyed by.
        seed: u64,
    },
}

impl Sampling {
    /// Random sampling, its parameters checked (a bad one is named with its value).
    pub fn random(
        temperature: f64,
        top_k: usize,
        top_p: f64,
        seed: u64,
    ) -> Result<Self, RingError> {
        let bad = |what: String| Err(RingError::Sampling { what });
        if !(temperature.is_finite() && temperature > 0.0) {
            return bad(format!(
                "temperature {temperature} is not a positive number"
            ));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return bad(format!("top-p {top_p} is not in (0, 1]"));
        }
        Ok(Sampling::Random {
            temperature,
            top_k,
            top_p,
            seed,
        })
    }

    /// The token picked from `logits` for the `prompt`-th prompt's `step`-th new token. A NaN
    /// logit is an error naming its index (a comparison would skip it silently).
    pub fn pick(&self, logits: &[f32], prompt: usize, step: usize) -> Result<u32, RingError> {
        if let Some(i) = logits.iter().position(|x| x.is_nan()) {
            return Err(RingError::NonFinite {
                what: "decoded logits",
                index: vec![i],
                value: logits[i],
            });
        }
        let Sampling::Random {
            temperature,
            top_k,
            top_p,
            seed,
        } = *self
        else {
            return Ok(argmax(logits));
        };
        // Candidates by logit, largest first (the lower index first on a tie).
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        if top_k > 0 {
            order.truncate(top_k);
        }
        let top = f64::from(logits[order[0] as usize]);
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(logits[i as usize]) - top) / temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // The fewest candidates whose probabilities reach top_p (at least one).
        let mut kept = 0;
        let mut mass = 0.0;
        while kept < weights.len() && (kept == 0 || mass < top_p * total) {
            mass += weights[kept];
            kept += 1;
        }
        let target = draw(seed, prompt, step) * mass;
        let mut running = 0.0;
        for (k, &w) in weights[..kept].iter().enumerate() {
            running += w;
            if target < running {
                return Ok(order[k]);
            }
        }
        Ok(order[kept - 1])
    }
}

/// The index of the largest logit, the first on a tie (no NaN: checked by the caller).
fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 { (i, x) } else { best }
        })
        .0 as u32
}

/// A uniform draw in [0, 1) keyed by (seed, prompt, step): SplitMix64's finaliser over the three.
fn draw(seed: u64, prompt: usize, step: usize) -> f64 {
    let mut z = seed
        ^ (prompt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (step as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    for _ in 0..2 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::{Sampling, draw};

    #[test]
    fn greedy_takes_the_first_of_equal_logits_and_refuses_nan() {
        let g = Sampling::Greedy;
        assert_eq!(g.pick(&[0.5, 2.0, 2.0, -1.0], 0, 0).unwrap(), 1);
        assert_eq!(g.pick(&[f32::NEG_INFINITY, -3.0], 0, 0).unwrap(), 1);
        let e = g.pick(&[0.5, f32::NAN, 2.0], 0, 0).unwrap_err().to_string();
        assert!(e.contains("[1]"), "{e}");
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.1f32, 3.0, 2.9, -4.0];
        for seed in 0..50 {
            let k1 = Sampling::random(1.0, 1, 1.0, seed).unwrap();
            let p = Sampling::random(1.0, 0, 1e-9, seed).unwrap();
            assert_eq!(k1.pick(&logits, 3, seed as usize).unwrap(), 1);
            assert_eq!(p.pick(&logits, 3, seed as usize).unwrap(), 1);
        }
    }

    /// Frequencies over 20,000 keyed draws match the softmax of logits ÷ T cut to the top 3:
    /// each within 5 standard deviations of a binomial count; the cut token never drawn.
    #[test]
    fn draws_follow_the_cut_softmax() {
        let logits = [1.0f32, 0.0, 2.0, -1.0];
        let t = 2.0;
        let s = Sampling::random(t, 3, 1.0, 7).unwrap();
        let n = 20_000;
        let mut counts = [0usize; 4];
        for step in 0..n {
            counts[s.pick(&logits, 0, step).unwrap() as usize] += 1;
        }
        assert_eq!(counts[3], 0, "the token outside the top 3 was drawn");
        let w: Vec<f64> = logits[..3]
            .iter()
            .map(|&l| (f64::from(l) / t).exp())
            .collect();
        let total: f64 = w.iter().sum();
        for i in 0..3 {
            let p = w[i] / total;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let dev = (counts[i] as f64 - n as f64 * p).abs();
            assert!(
                dev <= 5.0 * sd,
                "token {i}: {} draws, expected {:.0} ± {sd:.0}",
                counts[i],
                n as f64 * p
            );
        }
    }

    #[test]
    fn draws_are_keyed_not_streamed_and_parameters_are_checked() {
        assert_eq!(draw(3, 1, 2).to_bits(), draw(3, 1, 2).to_bits());
        assert_ne!(draw(3, 1, 2).to_bits(), draw(3, 2, 1).to_bits());
        assert!((0..1000).all(|i| (0.0..1.0).contains(&draw(9, i, i * 7))));
        for (t, p, want) in [
            (0.0, 1.0, "temperature 0"),
            (f64::NAN, 1.0, "temperature NaN"),
            (1.0, 0.0, "top-p 0"),
            (1.0, 1.5, "top-p 1.5"),
        ] {
            let e = Sampling::random(t, 0, p, 0).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
