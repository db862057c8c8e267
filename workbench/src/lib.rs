//! ringbench's engine: exact blockwise attention, the ring schedule, transports and the autodiff op.
//!
//! Follows Liu, Zaharia, Abbeel (2023), "Ring Attention with Blockwise Transformers for Near-Infinite
//! Context". Which tokens a rank owns is decided by a [`strategies::Partition`]; nothing here depends
//! on which one.

pub mod agentic;
pub mod block;
pub mod config;
pub mod engine;
pub mod error;
pub mod fused;
pub mod host;
pub mod kernels;
pub mod launch;
pub mod ledger;
pub mod model;
pub mod ops;
mod tiles;
pub mod train;
pub mod transport;

pub use config::{BackwardScheme, Direction, Kernel, RingConfig, RingContext, StepEvent};
pub use error::{RingError, TransportError};
pub use host::HostRead;
pub use ops::{RingBackend, ring_attention};
