//! Striped split (Brandon et al. 2023): token t lives on rank t mod N.

use crate::partition::require_divisible;
use crate::{Partition, PartitionError};

/// Token t on rank t mod N.
#[derive(Debug, Clone, Copy, Default)]
pub struct Striped;

impl Partition for Striped {
    fn name(&self) -> &'static str {
        "striped"
    }

    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError> {
        require_divisible(self.name(), seq_len, ranks, "ranks")
    }

    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        (rank..seq_len).step_by(ranks).collect()
    }
}
