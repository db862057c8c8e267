//! Causal work accounting: how many (query, key) pairs with key ≤ query each rank computes.

use crate::Layout;

/// Number of causal (q, k) pairs between two position sets: |{(q, k) : k ≤ q}|.
pub fn causal_pairs(queries: &[usize], keys: &[usize]) -> u64 {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    queries
        .iter()
        .map(|&q| sorted.partition_point(|&k| k <= q) as u64)
        .sum()
}

/// Per-rank causal work over the whole ring: a rank's queries against every key in the sequence.
pub fn causal_work_per_rank(layout: &Layout) -> Vec<u64> {
    let all: Vec<usize> = (0..layout.seq_len).collect();
    layout
        .positions
        .iter()
        .map(|owned| causal_pairs(owned, &all))
        .collect()
}
