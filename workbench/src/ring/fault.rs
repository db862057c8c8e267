//! Faults injected into a rank of a job, for tests (and `ringbench attn --fail-rank`): a rank that
//! fails at a ring exchange, or a forward tile that reads NaN, which every check must catch.

/// A fault injected into one rank of a job (tests, and `ringbench attn --fail-rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The rank it strikes.
    pub rank: usize,
    /// Counted from 0: its ring exchange ([`FaultKind::Fail`]) or forward ring step
    /// ([`FaultKind::PoisonTile`]).
    pub step: usize,
    /// What goes wrong.
    pub kind: FaultKind,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The rank fails at that ring exchange, as a crashed rank would.
    Fail,
    /// The forward tile of that ring step reads values that are all NaN: a wrong kernel, which
    /// every exactness check must catch.
    PoisonTile,
}

impl Fault {
    /// Rank `rank` fails at its `step`-th ring exchange.
    pub fn fail(rank: usize, step: usize) -> Self {
        Fault {
            rank,
            step,
            kind: FaultKind::Fail,
        }
    }
}
