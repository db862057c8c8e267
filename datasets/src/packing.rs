//! Document lengths for packed sequences: a long-tailed draw (many short documents, a few long ones)
//! that fills a sequence exactly, as real pre-training batches look.

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
}
