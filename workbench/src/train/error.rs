//! What can end a training run: a ring or transport failure, drifting replicas, an empty batch, a
//! non-finite loss or gradient, a run that cannot be saved.

use crate::error::{RingError, TransportError};
use thiserror::Error;

/// Why training stopped early.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TrainError {
    /// The ring or a transport failed, or the batch does not fit the partition.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The periodic checksum found parameter replicas that differ.
    #[error(
        "step {step}: parameter replicas differ between ranks (checksum mismatch on rank {rank})"
    )]
    ReplicaMismatch {
        /// The step checked.
        step: usize,
        /// The rank whose replica differs.
        rank: usize,
    },
    /// A batch with no tokens.
    #[error("step {step}: the batch is empty")]
    EmptyBatch {
        /// The step.
        step: usize,
    },
    /// A loss or gradient went NaN or infinite; nothing of that step was applied.
    #[error(
        "step {step}: the {what} of rank {rank} is not finite (NaN or infinite); training stopped before applying it"
    )]
    NonFinite {
        /// The step.
        step: usize,
        /// The first rank whose loss (or, if every loss is finite, gradient) is not finite.
        rank: usize,
        /// `loss` or `gradient`.
        what: &'static str,
    },
    /// No rank returned the model (no rank ran).
    #[error("training ended without rank 0's model")]
    NoModel,
    /// A run asked to start past its last step.
    #[error("a run of {steps} steps cannot start at step {start}")]
    StartPastEnd {
        /// The step it was to start at.
        start: usize,
        /// Its steps.
        steps: usize,
    },
    /// Rank 0 could not save the run after a step (a full disk, a directory that went away).
    #[error("saving the run after step {steps_done}: {message}")]
    Save {
        /// Steps done when saving failed.
        steps_done: usize,
        /// What went wrong.
        message: String,
    },
}

impl TrainError {
    /// [`RingError::echo_level`] of a ring error; other training errors are a rank's own (0).
    pub(crate) fn echo_level(&self) -> u8 {
        match self {
            TrainError::Ring(e) => e.echo_level(),
            _ => 0,
        }
    }
}

impl From<strategies::PartitionError> for TrainError {
    fn from(e: strategies::PartitionError) -> Self {
        TrainError::Ring(e.into())
    }
}

impl From<TransportError> for TrainError {
    fn from(e: TransportError) -> Self {
        TrainError::Ring(e.into())
    }
}
