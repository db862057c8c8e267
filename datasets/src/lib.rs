//! Data for ringbench: the LongChat line-retrieval task (generator, JSONL reader, tokenizer, scoring)
//! and ExoRL-style offline RL (environments, collection, episodes in ExoRL's npz layout).

#![warn(missing_docs)]

pub mod exorl;
pub mod line_retrieval;
pub mod rng;
pub mod tokenizer;
mod words;

pub use line_retrieval::{Case, DatasetError, WordSplit, generate, read_jsonl, score_reply};
pub use rng::SplitMix64;
pub use tokenizer::{Tokenizer, TokenizerError};
