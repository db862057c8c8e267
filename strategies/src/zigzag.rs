//! Zig-zag split: 2N equal chunks, rank p owns chunks p and 2N−1−p, so causal work is equal.

use crate::partition::require_divisible;
use crate::{Partition, PartitionError};

/// 2N chunks; rank p owns chunks p and 2N − 1 − p.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZigZag;

impl Partition for ZigZag {
    fn name(&self) -> &'static str {
        "zigzag"
    }

    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError> {
        require_divisible(self.name(), seq_len, 2 * ranks, "2 * ranks")
    }

    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        let chunk = seq_len / (2 * ranks);
        let mirror = 2 * ranks - 1 - rank;
        (rank * chunk..(rank + 1) * chunk)
            .chain(mirror * chunk..(mirror + 1) * chunk)
            .collect()
    }
}
