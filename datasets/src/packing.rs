//! Document lengths for packed sequences, filling a sequence exactly: a long-tailed draw (many short
//! documents, a few long ones, as real pre-training batches look) or a draw around a mean.

use crate::SplitMix64;

/// Document lengths from 1 to `max` summing to exactly `total`, drawn with `seed`: a Pareto tail
/// (P(L > x) ≈ 1/x), cut at `max`; the last document is shortened to fit.
pub fn long_tailed_lengths(total: usize, max: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let (mut lengths, mut sum) = (Vec::new(), 0);
    while sum < total {
        // 1 / u for u uniform in (0, 1]: P(L > x) = 1 / x.
        let u = 1.0 - rng.uniform();
        let len = ((1.0 / u) as usize).clamp(1, max.max(1)).min(total - sum);
        lengths.push(len);
        sum += len;
    }
    lengths
}

/// Document lengths of mean about `mean` (geometric: many near the mean's scale, few far above it)
/// summing to exactly `total`, drawn with `seed`; the last document is shortened to fit.
pub fn random_lengths(total: usize, mean: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let (mut lengths, mut sum) = (Vec::new(), 0);
    while sum < total {
        // 1 + an exponential draw of mean `mean − 1`, rounded down.
        let u = 1.0 - rng.uniform();
        let len = (1 + (-u.ln() * (mean.max(1) - 1) as f64) as usize).min(total - sum);
        lengths.push(len);
        sum += len;
    }
    lengths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_fill_the_total_with_a_long_tail() {
        let l = long_tailed_lengths(32768, 4096, 7);
        assert_eq!(l.iter().sum::<usize>(), 32768);
        assert!(l.iter().all(|&n| (1..=4096).contains(&n)));
        let short = l.iter().filter(|&&n| n <= 4).count();
        assert!(
            short * 2 > l.len(),
            "mostly short documents: {short} of {}",
            l.len()
        );
        assert!(l.iter().any(|&n| n >= 1024), "and some long ones");
        assert_eq!(l, long_tailed_lengths(32768, 4096, 7));
    }

    #[test]
    fn random_lengths_have_about_the_asked_mean() {
        let l = random_lengths(100_000, 50, 3);
        assert_eq!(l.iter().sum::<usize>(), 100_000);
        let mean = 100_000.0 / l.len() as f64;
        assert!((mean - 50.0).abs() < 5.0, "mean {mean}");
    }
}
