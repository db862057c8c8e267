//! Typed errors of the engine and its transports.

use strategies::PartitionError;
use thiserror::Error;

/// Why moving blocks between ranks failed. `rank` is the rank that reports it.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TransportError {
    /// The peer closed its end: it failed, and this is the echo of its failure.
    #[error("rank {rank}: peer rank {peer} has gone away")]
    PeerGone {
        /// The reporting rank.
        rank: usize,
        /// The rank that went away.
        peer: usize,
    },
    /// The peer said nothing for the whole timeout.
    #[error("rank {rank}: no message from rank {peer} within {seconds:.1} s")]
    Timeout {
        /// The reporting rank.
        rank: usize,
        /// The silent rank.
        peer: usize,
        /// The timeout.
        seconds: f64,
    },
    /// A call that waits on the other ranks (joining a communicator, a collective on the device)
    /// did not finish within the rank's timeout.
    #[error(
        "rank {rank}: {what} did not finish within {seconds:.1} s (a rank never joined or died)"
    )]
    Deadline {
        /// The reporting rank.
        rank: usize,
        /// What it was waiting for.
        what: &'static str,
        /// The timeout.
        seconds: f64,
    },
    /// Messages arrived out of the order every rank follows.
    #[error("rank {rank}: message from rank {peer} has tag {got}, expected {expected}")]
    Protocol {
        /// The reporting rank.
        rank: usize,
        /// The sender.
        peer: usize,
        /// The tag awaited.
        expected: u64,
        /// The tag received.
        got: u64,
    },
    /// Ranks all-reduced vectors of different lengths.
    #[error("rank {rank}: all_reduce length {got} from rank {peer}, expected {expected}")]
    LengthMismatch {
        /// The reporting rank.
        rank: usize,
        /// The sender.
        peer: usize,
        /// This rank's length.
        expected: usize,
        /// The sender's length.
        got: usize,
    },
    /// A library or device the transport needs is missing (CUDA, NCCL).
    #[error("rank {rank}: {what} is not available: {why}")]
    Unavailable {
        /// The reporting rank.
        rank: usize,
        /// What is missing.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// A failure injected for tests (`--fail-rank R --fail-phase P --fail-step K`).
    #[error("rank {rank} failed: injected fault at its {phase} exchange {step}")]
    Injected {
        /// The failing rank.
        rank: usize,
        /// The phase: `forward`, `backward`, `all-to-all` or `decode`.
        phase: &'static str,
        /// Its exchange of that phase, counted from 0.
        step: usize,
    },
    /// A rank failed on its own (it panicked, or its transport reported an error).
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The failing rank.
        rank: usize,
        /// What it said.
        message: String,
    },
}

/// Why ring attention could not run: bad input, a layout that cannot be made, or a transport failure.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RingError {
    /// The partition refused the length or rank count.
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// Moving blocks failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A tensor does not have the shape the others imply.
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Shape {
        /// Which tensor, with its layout.
        what: &'static str,
        /// The shape it must have.
        expected: Vec<usize>,
        /// The shape it has.
        got: Vec<usize>,
    },
    /// An array that must have four axes has another number.
    #[error("{what}: expected 4 dimensions, got shape {got:?}")]
    Rank {
        /// Which array, with its layout.
        what: &'static str,
        /// Its shape.
        got: Vec<usize>,
    },
    /// Document lengths that are not all positive or do not add up to the sequence's length.
    #[error("document lengths {doc_lens:?} must be positive and sum to the sequence length {len}")]
    Documents {
        /// The lengths given.
        doc_lens: Vec<usize>,
        /// The sequence's length.
        len: usize,
    },
    /// A sequence longer than the layout that is to hold it.
    #[error("a sequence of {len} tokens does not fit a layout of {layout} positions")]
    SequenceTooLong {
        /// Real tokens.
        len: usize,
        /// Positions in the layout.
        layout: usize,
    },
    /// The model width does not split into the heads.
    #[error("d_model {d_model} does not split into {heads} heads of an even head_dim")]
    ModelWidth {
        /// The model width.
        d_model: usize,
        /// The query heads.
        heads: usize,
    },
    /// A model config value the model cannot honour (a head width that is odd, a norm's ε that is
    /// not above 0, a RoPE scaling that scales nothing), named.
    #[error("model config: {0}")]
    ModelConfig(String),
    /// Query heads must be a multiple of key/value heads (grouped-query attention).
    #[error("query heads {heads} are not a multiple of key/value heads {kv_heads}")]
    Heads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// The transport sizes a receive by the receiver's own shard (NCCL), but the layout's shards
    /// differ in length.
    #[error(
        "{transport} moves equal shards; {strategy} gives shards of {lens:?} tokens for this sequence"
    )]
    UnequalShards {
        /// The transport.
        transport: &'static str,
        /// The partition strategy.
        strategy: &'static str,
        /// Every rank's shard length.
        lens: Vec<usize>,
    },
    /// The transport's rank count differs from the layout's.
    #[error("transport has {world} ranks but the layout has {layout}")]
    WorldMismatch {
        /// Ranks of the transport.
        world: usize,
        /// Ranks of the layout.
        layout: usize,
    },
    /// A rank's accounts (traffic, tiles) did not read back from the words gathered from it.
    #[error("the accounts gathered from rank {rank} are not a valid list (a corrupted gather)")]
    Accounts {
        /// The rank whose words did not decode.
        rank: usize,
    },
    /// An input holds a NaN or an infinity.
    #[error("{what}{index:?} is {value}: inputs must be finite")]
    NonFinite {
        /// Which array.
        what: &'static str,
        /// The first bad element's index.
        index: Vec<usize>,
        /// Its value.
        value: f32,
    },
    /// A position past what the generic kernel's device masks hold exactly (f32 positions).
    #[error(
        "position {position} is past {limit}, the longest sequence the generic kernel's device masks hold exactly (positions are f32)"
    )]
    TooLongForDeviceMasks {
        /// The position.
        position: usize,
        /// The limit.
        limit: usize,
    },
    /// An attention option out of its range (a window of 0, a cap that is not positive, sinks of the
    /// wrong length or not finite).
    #[error("{what} = {value}: expected {expected}")]
    Variant {
        /// Which option.
        what: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// An element type the backend's device cannot keep blocks in.
    #[error(
        "{dtype} blocks on the device need a backend that stores and computes {dtype}; {backend} on this device does not (use --dtype f32 --merge f32, or the fused kernel on the CPU)"
    )]
    DtypeUnsupported {
        /// The element type.
        dtype: &'static str,
        /// The backend.
        backend: String,
    },
    /// A Ulysses degree the ranks or the heads do not allow (head × context parallelism).
    #[error("ulysses = {ulysses} on {ranks} ranks: {rule}")]
    Ulysses {
        /// The Ulysses degree asked for.
        ulysses: usize,
        /// All ranks.
        ranks: usize,
        /// The rule it breaks, with the numbers.
        rule: String,
    },
    /// A kernel asked for on a backend it does not run on.
    #[error("--kernel {kernel} does not run on {backend}: {why}")]
    KernelUnavailable {
        /// The kernel's name.
        kernel: &'static str,
        /// The backend and device.
        backend: String,
        /// Why, and what to use instead.
        why: &'static str,
    },
    /// An injected fault aimed at a rank the job does not have.
    #[error("fault injected at rank {rank}, but the job has ranks 0 to {last}", last = ranks - 1)]
    FaultRank {
        /// The rank named.
        rank: usize,
        /// The job's rank count.
        ranks: usize,
    },
    /// Decoding from a prompt of no tokens.
    #[error("batch row {row}: an empty prompt has nothing to decode from")]
    EmptyPrompt {
        /// The batch row.
        row: usize,
    },
    /// A sequence that would outgrow the KV cache it decodes in.
    #[error("batch row {row}: {len} tokens do not fit a KV cache sized for {capacity}")]
    CacheFull {
        /// The batch row.
        row: usize,
        /// The tokens it would hold.
        len: usize,
        /// The most the cache holds a row.
        capacity: usize,
    },
    /// An injected fault aimed past the last exchange its phase has in the job.
    #[error(
        "fault injected at {phase} exchange {step} of rank {rank}, but each rank makes {exchanges} \
         {phase} exchange(s) in this job{}",
        if *exchanges == 0 { String::new() } else { format!(" (0 to {})", exchanges - 1) }
    )]
    FaultStep {
        /// The rank named.
        rank: usize,
        /// The phase: `forward`, `backward`, `all-to-all` or `decode`.
        phase: &'static str,
        /// The exchange named.
        step: usize,
        /// The exchanges a rank makes in that phase.
        exchanges: usize,
    },
    /// Sampling parameters out of range.
    #[error("sampling: {what}")]
    Sampling {
        /// The parameter and its value.
        what: String,
    },
    /// A name outside a fixed set (direction, scheme, kernel).
    #[error("unknown {what} '{got}'; expected one of: {expected}")]
    UnknownOption {
        /// What was being named.
        what: &'static str,
        /// The name given.
        got: String,
        /// The names accepted.
        expected: &'static str,
    },
}

impl RingError {
    /// How directly this error reports a failure: 0 for a rank's own failure, 1 for a timeout and 2 for
    /// "peer gone", which are what one rank's failure causes in the others.
    pub fn echo_level(&self) -> u8 {
        match self {
            RingError::Transport(TransportError::PeerGone { .. }) => 2,
            RingError::Transport(
                TransportError::Timeout { .. } | TransportError::Deadline { .. },
            ) => 1,
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
