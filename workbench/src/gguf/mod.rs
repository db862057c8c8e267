//! GGUF files (llama.cpp's and ollama's format): the header, the metadata and the tensors
//! ([`GgufFile`], `file.rs`), each tensor dequantized to f32 from the ggml types published models use
//! (`quants.rs`: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K). The block layouts and
//! formulas are llama.cpp's (`ggml-quants.c`), written here from its description. A LLaMA-family
//! file becomes a [`crate::model::Llama`] (`model.rs`, [`load_gguf_model`]). A file that is not
//! one, or that this reader cannot read, is a [`GgufError`] naming the key or tensor.

mod error;
mod file;
mod model;
mod quants;

pub use error::GgufError;
pub use file::{GgufFile, GgufTensor, GgufValue};
pub use model::{GgufModel, load_gguf_model, read_gguf_model};
pub use quants::GgmlType;
