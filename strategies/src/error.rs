//! Typed errors for partition validation and lookup.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartitionError {
    #[error("ranks must be at least 1, got {ranks}")]
    NoRanks { ranks: usize },
    #[error(
        "sequence length {seq_len} is not divisible by {divisor} ({rule}) required by {strategy}"
    )]
    NotDivisible {
        strategy: &'static str,
        seq_len: usize,
        divisor: usize,
        rule: &'static str,
    },
    #[error(
        "{strategy} accepts no sequence length from {from} to {to} on {ranks} ranks (nothing to pad to)"
    )]
    NoLengthAccepted {
        strategy: &'static str,
        from: usize,
        to: usize,
        ranks: usize,
    },
    #[error("rank {rank} is out of range for {ranks} ranks")]
    RankOutOfRange { rank: usize, ranks: usize },
    #[error("unknown strategy '{name}'; known strategies: {known}")]
    UnknownStrategy { name: String, known: String },
}
