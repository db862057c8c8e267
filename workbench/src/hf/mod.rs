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
//! | `peft.rs` | PEFT's LoRA adapter directory, written and read onto a base model |

mod config;
mod error;
mod export;
mod load;
mod names;
mod peft;

pub use config::{Architecture, HfConfig, rope_scaling_of};
pub use error::HfError;
pub use export::export_model;
pub use load::{INDEX_FILE, WEIGHTS_FILE, load_model};
pub(crate) use load::{assemble, transpose};
pub use names::{LayerNames, TensorRole};
pub use peft::{
    ADAPTER_CONFIG, ADAPTER_ROPE, ADAPTER_WEIGHTS, Adapter, read_adapter, read_adapter_rope,
    write_adapter, write_adapter_rope,
};
