//! Data for ringbench: the LongChat line-retrieval task (generator, JSONL reader, tokenizer, scoring)
//! ExoRL-style offline RL (environments, collection, episodes in ExoRL's npz layout), and document
//! lengths for packed sequences.

#![warn(missing_docs)]

pub mod chat;
pub mod exorl;
pub mod gguf_vocab;
pub mod hf_tokenizer;
pub mod line_retrieval;
pub mod packing;
pub mod rng;
pub mod tokenizer;
mod words;

pub use chat::{ChatError, ChatMessage, ChatTemplate};
pub use gguf_vocab::GgufVocabulary;
pub use hf_tokenizer::{HfText, HfTokenizer};
pub use line_retrieval::{
    Case, DatasetError, Quiz, WordSplit, generate, generate_quiz, name_pool, read_jsonl,
    score_reply,
};
pub use rng::SplitMix64;
pub use tokenizer::{TextTokenizer, Tokenizer, TokenizerError};
