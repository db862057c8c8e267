//! A piece tokenizer with byte fallback: frequent strings are single tokens, everything else is bytes,
//! so any text (line names never seen in training included) encodes without an unknown token.
//!
//! The pieces are the line-retrieval template's fixed strings, the merges a byte-pair encoder trained
//! on this corpus would end with. Saved as JSON next to a checkpoint.

use crate::line_retrieval::{HEADER, QUESTION_END, QUESTION_START};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Why a tokenizer could not be saved, loaded or used.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// The tokenizer's file could not be written or read as a tokenizer.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// An id past the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
}

/// What a task needs of a tokenizer: a text's ids (no special tokens), ids' text, the vocabulary, and
/// the tokens that begin and end a sequence. The project's piece tokenizer ([`Tokenizer`]) and a
/// Hugging Face one ([`crate::hf_tokenizer::HfText`]) are the two.
pub trait TextTokenizer: Sync {
    /// The ids of `text`, no special tokens added.
    fn text_ids(&self, text: &str) -> Result<Vec<u32>, TokenizerError>;
    /// The text of `ids`.
    fn ids_text(&self, ids: &[u32]) -> Result<String, TokenizerError>;
    /// Tokens in the vocabulary.
    fn vocab_len(&self) -> usize;
    /// The token a sequence begins with, if the model has one.
    fn bos(&self) -> Option<u32>;
    /// The token that ends a reply.
    fn eos(&self) -> u32;
}

impl TextTokenizer for Tokenizer {
    fn text_ids(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        Ok(self.encode(text))
    }

    fn ids_text(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode(ids)
    }

    fn vocab_len(&self) -> usize {
        self.vocab_size()
    }

    fn bos(&self) -> Option<u32> {
        Some(BOS)
    }

    fn eos(&self) -> u32 {
        EOS
    }
}

/// Bytes, two specials and the pieces, in that order of ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokenizer {
    pieces: Vec<String>,
}

/// Ids 0..256 are bytes; then the specials; then the pieces.
const BYTES: u32 = 256;
/// Beginning of sequence.
pub const BOS: u32 = BYTES;
/// End of sequence (the end of a reply).
pub const EOS: u32 = BYTES + 1;
const FIRST_PIECE: u32 = BYTES + 2;

impl Tokenizer {
    /// The tokenizer of the line-retrieval task.
    pub fn line_retrieval() -> Self {
        let pieces = [
            HEADER,
            QUESTION_START,
            QUESTION_END,
            "line ",
            ": REGISTER_CONTENT is <",
            ">\n",
        ];
        Self {
            pieces: pieces.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Ids in use: bytes, specials, pieces.
    pub fn vocab_size(&self) -> usize {
        FIRST_PIECE as usize + self.pieces.len()
    }

    /// Greedy longest-match encoding.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let bytes = text.as_bytes();
        let mut ids = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let best = self
                .pieces
                .iter()
                .enumerate()
                .filter(|(_, p)| bytes[i..].starts_with(p.as_bytes()))
                .max_by_key(|(_, p)| p.len());
            match best {
                Some((k, p)) => {
                    ids.push(FIRST_PIECE + k as u32);
                    i += p.len();
                }
                None => {
                    ids.push(u32::from(bytes[i]));
                    i += 1;
                }
            }
        }
        ids
    }

    /// Decodes ids back to text; special tokens decode to nothing.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            match id {
                b if b < BYTES => bytes.push(b as u8),
                BOS | EOS => {}
                p => {
                    let piece = self.pieces.get((p - FIRST_PIECE) as usize).ok_or(
                        TokenizerError::UnknownId {
                            id,
                            vocab: self.vocab_size(),
                        },
                    )?;
                    bytes.extend_from_slice(piece.as_bytes());
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Writes the tokenizer as JSON.
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        let file_error = |message: String| TokenizerError::File {
            path: path.to_owned(),
            message,
        };
        let json = serde_json::to_string_pretty(self).map_err(|e| file_error(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| file_error(e.to_string()))
    }

    /// Reads a tokenizer written by [`Tokenizer::save`].
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let file_error = |message: String| TokenizerError::File {
            path: path.to_owned(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| file_error(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SplitMix64, WordSplit, generate};

    #[test]
    fn round_trips_any_text_and_compresses_the_template() {
        let tok = Tokenizer::line_retrieval();
        let case = generate(&mut SplitMix64::new(1), 4, WordSplit::Eval).unwrap();
        let ids = tok.encode(&case.prompt);
        assert_eq!(tok.decode(&ids).unwrap(), case.prompt);
        assert!(
            ids.len() * 3 < case.prompt.len(),
            "{} ids for {} bytes",
            ids.len(),
            case.prompt.len()
        );
        let unseen = "line zebra-quokka: ünïcode ✓";
        assert_eq!(tok.decode(&tok.encode(unseen)).unwrap(), unseen);
        assert!(tok.decode(&[10_000]).is_err());
    }
}
