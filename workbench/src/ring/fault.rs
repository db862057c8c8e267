//! Faults injected into a rank of a job, for tests (and `ringbench attn --fail-rank`): a rank that
//! fails or dies at one of its exchanges, or a forward tile that reads NaN, which every check must
//! catch.

use crate::transport::{Phase, Strike};

/// A fault injected into one rank of a job (tests, and `ringbench attn --fail-rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The rank it strikes.
    pub rank: usize,
    /// The phase whose exchanges [`Fault::step`] counts ([`FaultKind::Fail`], [`FaultKind::Kill`]);
    /// the forward for [`FaultKind::PoisonTile`].
    pub phase: Phase,
    /// Counted from 0 within the phase: the rank's exchange ([`FaultKind::Fail`],
    /// [`FaultKind::Kill`]) or forward ring step ([`FaultKind::PoisonTile`]).
    pub step: usize,
    /// What goes wrong.
    pub kind: FaultKind,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The rank fails at that exchange with a typed error, as a transport failure would.
    Fail,
    /// The rank's process dies at that exchange (SIGKILL): a crashed MPI rank. In-process ranks
    /// would take the whole process with them.
    Kill,
    /// The forward tile of that ring step reads values that are all NaN: a wrong kernel, which
    /// every exactness check must catch.
    PoisonTile,
}

impl Fault {
    /// Rank `rank` fails at its `step`-th exchange of `phase`.
    pub fn fail(rank: usize, phase: Phase, step: usize) -> Self {
        Fault {
            rank,
            phase,
            step,
            kind: FaultKind::Fail,
        }
    }

    /// What the rank's communicator does at the exchange, for the kinds that strike there.
    pub(crate) fn strike(&self) -> Option<Strike> {
        match self.kind {
            FaultKind::Fail => Some(Strike::Error),
            FaultKind::Kill => Some(Strike::Kill),
            FaultKind::PoisonTile => None,
        }
    }
}
