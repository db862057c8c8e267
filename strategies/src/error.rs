//! Typed errors for partition validation and lookup.

use thiserror::Error;

/// Why a layout cannot be made, or a strategy not found.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartitionError {
    /// A workload whose masks cover no layer: nothing for a work-aware strategy to balance.
    #[error("{strategy} was given a workload of 0 layers (every mask has a layer count of 0)")]
    NoLayers {
        /// The strategy's name.
        strategy: &'static str,
    },
    /// Zero ranks: the one rule every layout checks first.
    #[error("ranks must be at least 1, got {ranks}")]
    NoRanks {
        /// The rank count given.
        ranks: usize,
    },
    /// The strategy splits the sequence into pieces the length does not divide into.
    #[error(
        "sequence length {seq_len} is not divisible by {divisor} ({rule}) required by {strategy}"
    )]
    NotDivisible {
        /// The strategy's name.
        strategy: &'static str,
        /// The length given.
        seq_len: usize,
        /// What it must be a multiple of.
        divisor: usize,
        /// The divisor in words, e.g. `2 * ranks`.
        rule: &'static str,
    },
    /// Fewer tokens than the strategy needs to give every rank some.
    #[error("{strategy} needs at least {min} tokens, got {seq_len}")]
    TooShort {
        /// The strategy's name.
        strategy: &'static str,
        /// The length given.
        seq_len: usize,
        /// The fewest it accepts.
        min: usize,
    },
    /// A packed sequence whose documents leave a rank without tokens.
    #[error("{strategy} leaves rank {rank} without tokens for these documents")]
    EmptyShard {
        /// The strategy's name.
        strategy: &'static str,
        /// The rank left empty.
        rank: usize,
    },
    /// No length in the searched range suits the strategy, so there is nothing to pad to.
    #[error(
        "{strategy} accepts no sequence length from {from} to {to} on {ranks} ranks (nothing to pad to)"
    )]
    NoLengthAccepted {
        /// The strategy's name.
        strategy: &'static str,
        /// The first length tried.
        from: usize,
        /// The last length tried.
        to: usize,
        /// The rank count.
        ranks: usize,
    },
    /// A rank index past the layout's ranks.
    #[error("rank {rank} is out of range for {ranks} ranks")]
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// The layout's rank count.
        ranks: usize,
    },
    /// [`crate::register`] was given a second strategy under a name already registered.
    #[error("a strategy named '{name}' is already registered")]
    NameTaken {
        /// The name both strategies give.
        name: String,
    },
    /// A name the registry does not know.
    #[error("unknown strategy '{name}'; known strategies: {known}")]
    UnknownStrategy {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
}
