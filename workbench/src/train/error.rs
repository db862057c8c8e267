//! What can end a training run: a ring or transport failure, drifting replicas, an empty batch, a
//! non-finite loss or gradient.

use crate::error::{RingError, TransportError};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum TrainError {
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(
        "step {step}: parameter replicas differ between ranks (checksum mismatch on rank {rank})"
    )]
    ReplicaMismatch { step: usize, rank: usize },
    #[error("step {step}: the batch is empty")]
    EmptyBatch { step: usize },
    #[error(
        "step {step}: the {what} of rank {rank} is not finite (NaN or infinite); training stopped before applying it"
    )]
    NonFinite {
        step: usize,
        rank: usize,
        what: &'static str,
    },
    #[error("training ended without rank 0's model")]
    NoModel,
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
