//! Models whose attention is ring attention: the [`attention`] layer a model author plugs in (a Burn
//! module, like `MultiHeadAttention`), the LLaMA-style decoder ([`llama`]) and the Agentic
//! Transformer built on its decoder layers ([`agentic`]).

pub mod agentic;
pub mod attention;
pub mod bf16;
mod checkpoint;
pub mod elementwise;
pub mod ffn;
pub mod layer;
pub mod lazy;
pub mod llama;
pub mod lora;
pub mod loss;
mod project;
mod rope;
pub mod rope_scaling;
pub mod weights;

pub use attention::{RingAttention, RingAttentionConfig};
pub use layer::{Checkpoint, LayerBackend};
pub use llama::{Llama, LlamaConfig};
pub use lora::{LoraConfig, LoraInit, LoraTarget};
pub use rope_scaling::{RopeFrequencies, RopeScaling};
