//! A ring's options: the direction blocks travel, what travels in the backward, the kernel (all of
//! [`RingConfig`]), and what one call masks and scales by ([`Attend`]).

use crate::dtype::Precision;
use crate::error::RingError;
use crate::kernels::Kernel;
use std::fmt;
use std::str::FromStr;
use strategies::Mask;

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
    /// A sliding window: a query sees only keys less than `W` positions away; `None`: no window.
    pub window: Option<usize>,
    /// Logit soft-capping: scores become `C · tanh(s / C)` before masking; `None`: none.
    pub softcap: Option<f32>,
    /// Which implementation computes the tiles.
    pub kernel: Kernel,
    /// The element types of operands, travelling blocks and accumulators (default: all f32).
    pub precision: Precision,
    /// Measurement mode: ranks compute their tiles one at a time (a process-wide lock), so that N
    /// thread ranks sharing a few cores do not slow each other's tile timings. Communication is not
    /// serialized.
    pub lockstep: bool,
}

impl RingConfig {
    /// What a call of ring attention that does not say otherwise masks and scales by.
    pub fn attend(&self) -> Attend {
        Attend {
            causal: self.causal,
            scale: self.scale,
            window: self.window,
            softcap: self.softcap,
        }
    }
}

/// How one call of ring attention masks and scores. Per call, so that a model may mix its layers
/// (windowed and full, say); the ring's own options (directions, scheme, kernel) stay the context's.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Attend {
    /// Whether a query sees only keys at or before its position.
    pub causal: bool,
    /// Softmax scale; `None` means 1/sqrt(head_dim).
    pub scale: Option<f32>,
    /// A sliding window: a query sees only keys less than `W` positions away; `None`: no window.
    pub window: Option<usize>,
    /// Logit soft-capping: scores become `C · tanh(s / C)` before masking; `None`: none.
    pub softcap: Option<f32>,
}

impl Attend {
    /// The visibility rule these options make (causality and window; documents and padding are the
    /// context's).
    pub fn mask(&self) -> Mask {
        Mask {
            causal: self.causal,
            window: self.window,
        }
    }

    /// An error unless the window is at least 1 and the cap positive and finite.
    pub fn check(&self) -> Result<(), RingError> {
        if self.window == Some(0) {
            return Err(RingError::Variant {
                what: "window",
                value: "0".into(),
                expected: "at least 1 key",
            });
        }
        if let Some(cap) = self.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(RingError::Variant {
                what: "softcap",
                value: cap.to_string(),
                expected: "a finite number above 0",
            });
        }
        if let Some(scale) = self.scale.filter(|s| !s.is_finite()) {
            return Err(RingError::Variant {
                what: "scale",
                value: scale.to_string(),
                expected: "a finite number",
            });
        }
        Ok(())
    }
}
