//! Models whose attention is ring attention: the LLaMA-style decoder ([`llama`]) and the Agentic
//! Transformer built on its decoder layers ([`agentic`]).

pub mod agentic;
pub mod ffn;
pub mod layer;
pub mod lazy;
pub mod llama;

pub use layer::{Checkpoint, LayerBackend};
pub use llama::{Llama, LlamaConfig};
