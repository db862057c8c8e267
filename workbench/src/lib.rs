//! ringbench's engine: exact blockwise attention, the ring schedule, transports, and the models and
//! training built on them.
//!
//! Follows Liu, Zaharia, Abbeel (2023), "Ring Attention with Blockwise Transformers for Near-Infinite
//! Context". Which tokens a rank owns is decided by a [`strategies::Partition`]; nothing here depends
//! on which one.
//!
//! | module | what it is |
//! |---|---|
//! | [`ring`] | the algorithm: the ring schedule, what travels, the per-rank context, the autodiff op, one-call jobs |
//! | [`kernels`] | tile math: the fused CPU kernel, the fused device kernel and their generic Burn twin behind one dispatch |
//! | [`cube`] | the fused device kernel's CubeCL source and launches, offered by the CubeCL backends |
//! | [`transport`] | moving blocks between ranks: threads, MPI, NCCL behind one trait |
//! | [`model`] | the LLaMA-style decoder and the Agentic Transformer, attending with the ring |
//! | [`hf`] | Hugging Face checkpoints in and out (config, safetensors weights) |
//! | [`gguf`] | GGUF files in (llama.cpp's format): metadata, dequantized tensors, a LLaMA model |
//! | [`train`] | SPMD training and greedy decoding over in-process or MPI ranks |
//! | [`trace`] | per-rank timelines in Chrome's trace-event format, recorded with the counters |

#![warn(missing_docs)]

pub mod backends;
pub mod block;
pub mod cube;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod host;
pub mod kernels;
pub mod model;
mod primitive;
pub mod ring;
pub mod simd;
pub mod trace;
pub mod train;
pub mod transport;

/// What a model author needs: the ring attention layer and its context, the ring's options, and
/// training on N ranks.
pub mod prelude {
    pub use crate::error::RingError;
    pub use crate::kernels::Kernel;
    pub use crate::model::{RingAttention, RingAttentionConfig};
    pub use crate::ring::context::{Attend, BackwardScheme, Direction, RingConfig, RingContext};
    pub use crate::ring::op::{RingBackend, ring_attention, ring_attention_with};
    pub use crate::train::{Objective, StepLog, TrainOptions, Trained, Training, train_objective};
}

pub use dtype::Dtype;
pub use error::{RingError, TransportError};
pub use host::HostRead;
pub use model::layer::LayerBackend;
pub use ring::context::{BackwardScheme, Direction, Kernel, RingConfig, RingContext, StepEvent};
pub use ring::op::{RingBackend, ring_attention};
