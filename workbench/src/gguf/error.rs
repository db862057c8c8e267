//! What can go wrong reading a GGUF file, each case naming the file and the key or tensor.

use std::path::PathBuf;

/// An error reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        cause: std::io::Error,
    },
    /// Not a GGUF file, or one of a version this reader does not know.
    #[error("{}: {what}", path.display())]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What its first bytes say.
        what: String,
    },
    /// The file ends inside the header, a metadata value or a tensor's data.
    #[error("{}: truncated: {what} needs bytes up to {needed}, the file has {len}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The key or tensor being read.
        what: String,
        /// The offset it needs.
        needed: u64,
        /// The file's length.
        len: u64,
    },
    /// A metadata value of a type id the format does not define, or text that is not UTF-8.
    #[error("{}: metadata {key}: {what}", path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        what: String,
    },
    /// A tensor of a ggml type this reader does not dequantize (or no type at all).
    #[error("{}: tensor {tensor} has ggml type {type_name} (id {id}); ringbench reads {known}", path.display())]
    UnknownType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The type's id.
        id: u32,
        /// Its name, where the format defines one.
        type_name: String,
        /// The types that are read.
        known: String,
    },
    /// A tensor whose element count does not fill its type's blocks, or no tensor of that name.
    #[error("{}: tensor {tensor}: {what}", path.display())]
    BadTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        what: String,
    },
}
