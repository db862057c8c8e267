//! Typed errors of the engine and its transports.

use strategies::PartitionError;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum TransportError {
    #[error("rank {rank}: peer rank {peer} has gone away")]
    PeerGone { rank: usize, peer: usize },
    #[error("rank {rank}: no message from rank {peer} within {seconds:.1} s")]
    Timeout {
        rank: usize,
        peer: usize,
        seconds: f64,
    },
    #[error("rank {rank}: message from rank {peer} has tag {got}, expected {expected}")]
    Protocol {
        rank: usize,
        peer: usize,
        expected: u64,
        got: u64,
    },
    #[error("rank {rank}: all_reduce length {got} from rank {peer}, expected {expected}")]
    LengthMismatch {
        rank: usize,
        peer: usize,
        expected: usize,
        got: usize,
    },
    #[error("rank {rank}: {what} is not available: {why}")]
    Unavailable {
        rank: usize,
        what: &'static str,
        why: String,
    },
    #[error("rank {rank} failed: injected fault at its ring exchange {step}")]
    Injected { rank: usize, step: usize },
    #[error("rank {rank} failed: {message}")]
    RankFailed { rank: usize, message: String },
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum RingError {
    #[error(transparent)]
    Partition(#[from] PartitionError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Shape {
        what: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("{what}: expected 4 dimensions, got shape {got:?}")]
    Rank { what: &'static str, got: Vec<usize> },
    #[error("d_model {d_model} does not split into {heads} heads of an even head_dim")]
    ModelWidth { d_model: usize, heads: usize },
    #[error("query heads {heads} are not a multiple of key/value heads {kv_heads}")]
    Heads { heads: usize, kv_heads: usize },
    #[error("transport has {world} ranks but the layout has {layout}")]
    WorldMismatch { world: usize, layout: usize },
    #[error("{what}{index:?} is {value}: inputs must be finite")]
    NonFinite {
        what: &'static str,
        index: Vec<usize>,
        value: f32,
    },
    #[error("unknown {what} '{got}'; expected one of: {expected}")]
    UnknownOption {
        what: &'static str,
        got: String,
        expected: &'static str,
    },
}

impl RingError {
    /// How directly this error reports a failure: 0 for a rank's own failure, 1 for a timeout and 2 for
    /// "peer gone", which are what one rank's failure causes in the others.
    pub fn echo_level(&self) -> u8 {
        match self {
            RingError::Transport(TransportError::PeerGone { .. }) => 2,
            RingError::Transport(TransportError::Timeout { .. }) => 1,
            _ => 0,
        }
    }
}

/// Every rank's output in rank order, or, if any rank failed, the error that caused the others: the
/// first with the lowest `echo_level`.
pub fn all_or_root_cause<T, E>(
    results: Vec<Result<T, E>>,
    echo_level: impl Fn(&E) -> u8,
) -> Result<Vec<T>, E> {
    let mut outputs = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    for result in results {
        match result {
            Ok(output) => outputs.push(output),
            Err(e) => errors.push(e),
        }
    }
    // `min_by_key` keeps the first of equal keys: the lowest rank among equally direct errors.
    match (0..errors.len()).min_by_key(|&i| echo_level(&errors[i])) {
        Some(first) => Err(errors.swap_remove(first)),
        None => Ok(outputs),
    }
}
