//! Hugging Face checkpoints in and out: a LLaMA-family model directory (`config.json`, safetensors
//! weights, one file or sharded) read into a [`crate::model::Llama`], and any `Llama` written back
//! as a directory transformers loads. The model never knows where its weights came from.
//!
//! | file | what it does |
//! |---|---|
//! | `config.rs` | `config.json` ↔ [`crate::model::LlamaConfig`]: architectures, sizes, RoPE scaling |
//! | `names.rs` | the tensor names |
//! | `load.rs` | the weights, memory-mapped and converted one tensor at a time |
//! | `export.rs` | `model.safetensors` and `config.json` written |

mod config;
mod error;
mod export;
mod load;
mod names;

pub use config::{Architecture, HfConfig, rope_scaling_of};
pub use error::HfError;
pub use export::export_model;
pub use load::{INDEX_FILE, WEIGHTS_FILE, load_model};
pub(crate) use load::{assemble, transpose};
pub use names::{LayerNames, TensorRole};
