//! What can go wrong reading or writing a Hugging Face model directory, each case naming the file
//! and the key or tensor.

use crate::error::RingError;
use std::path::{Path, PathBuf};

/// An error reading or writing a Hugging Face directory.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// A file that could not be read or written.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said (its text is in this error's message, not a second link of the
        /// chain).
        cause: std::io::Error,
    },
    /// A config value this model cannot honour, or a config that is not one.
    #[error("{}: {what}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// The key, its value and why.
        what: String,
    },
    /// A weights file that is not a whole safetensors file (truncated, a bad header), or an index
    /// that names files that are not there.
    #[error("{}: {what}", path.display())]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A tensor the model needs that no weights file holds.
    #[error("{}: no tensor {name} (the model needs it)", dir.display())]
    MissingTensor {
        /// The model directory.
        dir: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor of another shape than the config gives.
    #[error("{}: tensor {name} has shape {got:?}; config.json gives {expected:?}", path.display())]
    Shape {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The shape the config gives.
        expected: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
    },
    /// A tensor whose element type is not a float this loads (F32, F16, BF16, F64).
    #[error("{}: tensor {name} is {dtype}; F32, F16, BF16 or F64 load", path.display())]
    Dtype {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// Its element type.
        dtype: String,
    },
    /// A weight that is NaN or infinite.
    #[error("{}: tensor {name} holds {value} at flat index {index}", path.display())]
    NonFinite {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// Where, in the flat tensor.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A tokenizer file the tokenizers library refuses.
    #[error("{}: {what}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What the library said.
        what: String,
    },
    /// The model refused the sizes (a ring error).
    #[error(transparent)]
    Model(#[from] RingError),
}

impl HfError {
    pub(crate) fn io(path: &Path, cause: std::io::Error) -> Self {
        HfError::Io {
            path: path.to_path_buf(),
            cause,
        }
    }
}
