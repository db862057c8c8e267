//! Contiguous split: rank p owns tokens [p·S/N, (p+1)·S/N). Imbalanced under a causal mask.

use crate::partition::require_divisible;
use crate::{Partition, PartitionError};

/// Rank p owns the p-th of N equal contiguous blocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Contiguous;

impl Partition for Contiguous {
    fn name(&self) -> &'static str {
        "contiguous"
    }

    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError> {
        require_divisible(self.name(), seq_len, ranks, "ranks")
    }

    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        let shard = seq_len / ranks;
        (rank * shard..(rank + 1) * shard).collect()
    }
}
