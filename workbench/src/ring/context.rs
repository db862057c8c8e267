//! Ring options: directions, backward schemes, and the per-rank context shared by forward and backward.

use crate::error::RingError;
use crate::kernels::mask::{Window, windows};
use crate::ring::ledger::Ledger;
use crate::transport::{Comm, Traffic};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use strategies::Layout;

/// Which neighbour receives a rank's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Direction {
    /// Send to rank + 1.
    #[default]
    Cw,
    /// Send to rank − 1.
    Ccw,
}

impl Direction {
    /// The accepted names, for error messages.
    pub const NAMES: &'static str = "cw, ccw";
    /// Every direction.
    pub const ALL: [Direction; 2] = [Direction::Cw, Direction::Ccw];

    /// The other direction.
    pub fn reversed(self) -> Self {
        match self {
            Direction::Cw => Direction::Ccw,
            Direction::Ccw => Direction::Cw,
        }
    }

    /// The rank this rank sends to.
    pub fn next(self, rank: usize, world: usize) -> usize {
        match self {
            Direction::Cw => (rank + 1) % world,
            Direction::Ccw => (rank + world - 1) % world,
        }
    }

    /// The rank this rank receives from.
    pub fn prev(self, rank: usize, world: usize) -> usize {
        self.reversed().next(rank, world)
    }

    /// Whose block this rank holds after `step` hops.
    pub fn owner(self, rank: usize, step: usize, world: usize) -> usize {
        let step = step % world;
        match self {
            Direction::Cw => (rank + world - step) % world,
            Direction::Ccw => (rank + step) % world,
        }
    }
}

/// What travels round the ring in the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackwardScheme {
    /// K, V, dK, dV travel in the forward direction; dK/dV arrive home after N hops.
    #[default]
    Kv,
    /// The same, in the opposite direction.
    KvReverse,
    /// Q, dO, lse, delta and the dQ accumulator travel; K and V stay.
    Q,
}

impl BackwardScheme {
    /// The accepted names, for error messages.
    pub const NAMES: &'static str = "kv, kv-reverse, q";
    /// Every scheme.
    pub const ALL: [BackwardScheme; 3] = [
        BackwardScheme::Kv,
        BackwardScheme::KvReverse,
        BackwardScheme::Q,
    ];
}

/// Which implementation computes the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kernel {
    /// Fused CPU kernel on host buffers (`fused.rs`).
    #[default]
    Fused,
    /// Burn tensor ops on the configured backend (`kernels.rs`): the reference twin.
    Generic,
}

impl Kernel {
    /// The accepted names, for error messages.
    pub const NAMES: &'static str = "fused, generic";
    /// Every kernel.
    pub const ALL: [Kernel; 2] = [Kernel::Fused, Kernel::Generic];
}

macro_rules! named_enum {
    ($ty:ty, $what:literal, $($variant:path => $name:literal),+) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $($variant => $name),+ })
            }
        }
        impl FromStr for $ty {
            type Err = RingError;
            fn from_str(s: &str) -> Result<Self, RingError> {
                match s {
                    $($name => Ok($variant),)+
                    _ => Err(RingError::UnknownOption { what: $what, got: s.into(), expected: <$ty>::NAMES }),
                }
            }
        }
    };
}
named_enum!(Direction, "direction", Direction::Cw => "cw", Direction::Ccw => "ccw");
named_enum!(Kernel, "kernel", Kernel::Fused => "fused", Kernel::Generic => "generic");
named_enum!(BackwardScheme, "backward scheme", BackwardScheme::Kv => "kv",
    BackwardScheme::KvReverse => "kv-reverse", BackwardScheme::Q => "q");

/// Options of one ring attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RingConfig {
    /// Whether a query sees only keys at or before its position.
    pub causal: bool,
    /// Where K/V travel in the forward.
    pub forward: Direction,
    /// What travels in the backward.
    pub backward: BackwardScheme,
    /// Softmax scale; `None` means 1/sqrt(head_dim).
    pub scale: Option<f32>,
    /// Which implementation computes the tiles.
    pub kernel: Kernel,
    /// Measurement mode: ranks compute their tiles one at a time (a process-wide lock), so that N
    /// thread ranks sharing a few cores do not slow each other's tile timings. Communication is not
    /// serialized.
    pub lockstep: bool,
}

/// Work done by one rank in one ring step, for measurement and simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEvent {
    /// Forward or backward.
    pub phase: crate::transport::Phase,
    /// The ring step (0 is the rank's own block).
    pub step: usize,
    /// Rank whose block was combined with this rank's at this step.
    pub peer_block: usize,
    /// Visible (q, k) pairs summed over batch and heads.
    pub pairs: u64,
    /// FLOPs of the tile ([`crate::kernels::flops`]).
    pub flops: u64,
    /// Seconds the tile took.
    pub compute_seconds: f64,
}

/// One rank's view of a ring: its communicator, the layout, the options, and what it measured.
///
/// Shared (behind `Arc`) by the forward call and its autodiff backward, which may run later.
#[derive(Debug)]
pub struct RingContext {
    /// The ring's options.
    pub config: RingConfig,
    /// Which global positions each rank owns.
    pub layout: Arc<Layout>,
    /// What the positions hold: real tokens in documents, then padding.
    sequence: Arc<Sequence>,
    /// The key window of every rank's every query ([`crate::kernels::mask::windows`]).
    windows: Arc<Vec<Vec<Window>>>,
    rank: usize,
    comm: Arc<Mutex<Comm>>,
    events: Mutex<Vec<StepEvent>>,
    backward_error: Mutex<Option<RingError>>,
    ledger: Arc<Ledger>,
    /// Test hook: the forward step whose tile reads all-NaN values.
    poisoned_step: Option<usize>,
}

impl RingContext {
    /// This rank's context over `comm`; the transport's and the layout's rank counts must agree.
    pub fn new(comm: Comm, layout: Arc<Layout>, config: RingConfig) -> Result<Self, RingError> {
        if comm.world() != layout.ranks() {
            return Err(RingError::WorldMismatch {
                world: comm.world(),
                layout: layout.ranks(),
            });
        }
        let sequence = Arc::new(Sequence::unpadded(layout.seq_len));
        Ok(Self {
            config,
            windows: Arc::new(all_windows(&layout, &sequence, config.causal)),
            sequence,
            layout,
            rank: comm.rank(),
            comm: Arc::new(Mutex::new(comm)),
            events: Mutex::new(Vec::new()),
            backward_error: Mutex::new(None),
            ledger: Arc::default(),
            poisoned_step: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The bytes this rank's engine holds: live, and the peak since the last reset.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// A context over another layout sharing this one's communicator (its tags and traffic) and
    /// ledger; its positions hold one unpadded document ([`RingContext::with_sequence`] says
    /// otherwise).
    pub fn with_layout(&self, layout: Arc<Layout>) -> Result<Self, RingError> {
        if self.world() != layout.ranks() {
            return Err(RingError::WorldMismatch {
                world: self.world(),
                layout: layout.ranks(),
            });
        }
        // A new layout holds a new sequence: one document, no padding, until `with_sequence`.
        let sequence = Arc::new(Sequence::unpadded(layout.seq_len));
        Ok(Self {
            config: self.config,
            windows: Arc::new(all_windows(&layout, &sequence, self.config.causal)),
            sequence,
            layout,
            rank: self.rank,
            comm: self.comm.clone(),
            events: Mutex::new(Vec::new()),
            backward_error: Mutex::new(None),
            ledger: self.ledger.clone(),
            poisoned_step: None,
        })
    }

    /// This context over a layout whose positions hold `sequence`: its documents mask attention
    /// between them, and positions at or past its length are padding that no real query sees.
    pub fn with_sequence(mut self, sequence: Sequence) -> Result<Self, RingError> {
        sequence.check(self.layout.seq_len)?;
        self.windows = Arc::new(all_windows(&self.layout, &sequence, self.config.causal));
        self.sequence = Arc::new(sequence);
        Ok(self)
    }

    /// Test hook ([`FaultKind::PoisonTile`](crate::ring::jobs::FaultKind::PoisonTile)): the forward
    /// tile of ring step `step` reads values that are all NaN.
    pub fn with_poisoned_tile(mut self, step: usize) -> Self {
        self.poisoned_step = Some(step);
        self
    }

    /// Whether the forward tile of ring step `step` is poisoned (a test hook).
    pub(crate) fn poisons(&self, step: usize) -> bool {
        self.poisoned_step == Some(step)
    }

    /// What the positions hold.
    pub fn sequence(&self) -> &Sequence {
        &self.sequence
    }

    /// The key windows of `rank`'s queries, in local order.
    pub fn windows(&self, rank: usize) -> &[Window] {
        &self.windows[rank]
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.layout.ranks()
    }

    /// The global positions `rank` owns, in local order.
    pub fn positions(&self, rank: usize) -> &[usize] {
        &self.layout.positions[rank]
    }

    pub(crate) fn comm(&self) -> MutexGuard<'_, Comm> {
        lock(&self.comm)
    }

    /// What this rank has sent so far.
    pub fn traffic(&self) -> Traffic {
        self.comm().traffic().clone()
    }

    /// What this rank has sent, handing it over and starting afresh.
    pub fn take_traffic(&self) -> Traffic {
        self.comm().take_traffic()
    }

    pub(crate) fn record(&self, event: StepEvent) {
        lock(&self.events).push(event);
    }

    /// This rank's step events, handing them over.
    pub fn take_events(&self) -> Vec<StepEvent> {
        std::mem::take(&mut *lock(&self.events))
    }

    /// An autodiff backward cannot return an error; it parks it here for the caller of `backward()`.
    pub(crate) fn set_backward_error(&self, error: RingError) {
        lock(&self.backward_error).get_or_insert(error);
    }

    /// The error of the last backward pass, if it failed (its gradients are then zeros).
    pub fn take_backward_error(&self) -> Option<RingError> {
        lock(&self.backward_error).take()
    }

    /// Runs a collective on this rank's communicator (gradient all-reduce, barrier).
    pub fn with_comm<T>(&self, f: impl FnOnce(&mut Comm) -> T) -> T {
        f(&mut self.comm())
    }
}

/// What a layout's positions hold: `len` real tokens, packed as documents of `doc_lens` laid end to
/// end (empty: one document), then padding up to the layout's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// Real tokens; positions from here on are padding.
    pub len: usize,
    /// Document lengths, summing to `len`; empty for one document.
    pub doc_lens: Vec<usize>,
}

impl Sequence {
    /// `len` real tokens in one document, no padding in a layout of `len`.
    pub fn unpadded(len: usize) -> Self {
        Sequence {
            len,
            doc_lens: Vec::new(),
        }
    }

    /// An error unless the documents are non-empty and sum to `len`, and `len` fits `layout_len`.
    pub fn check(&self, layout_len: usize) -> Result<(), RingError> {
        let sum: usize = self.doc_lens.iter().sum();
        if self.doc_lens.contains(&0) || (!self.doc_lens.is_empty() && sum != self.len) {
            return Err(RingError::Documents {
                doc_lens: self.doc_lens.clone(),
                len: self.len,
            });
        }
        if self.len > layout_len {
            return Err(RingError::SequenceTooLong {
                len: self.len,
                layout: layout_len,
            });
        }
        Ok(())
    }
}

fn all_windows(layout: &Layout, sequence: &Sequence, causal: bool) -> Vec<Vec<Window>> {
    layout
        .positions
        .iter()
        .map(|p| windows(p, sequence.len, &sequence.doc_lens, causal))
        .collect()
}

/// A poisoned lock only means another holder panicked; the data (counters, logs) stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
