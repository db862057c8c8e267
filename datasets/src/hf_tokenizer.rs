//! A Hugging Face `tokenizer.json`, read and applied by HF's own `tokenizers` library: the ids
//! transformers' fast tokenizer gives, and text back from ids.

use crate::tokenizer::{TextTokenizer, TokenizerError};
use std::path::{Path, PathBuf};

/// A Hugging Face tokenizer loaded from its `tokenizer.json`.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab", &self.vocab_size())
            .finish()
    }
}

impl HfTokenizer {
    /// Reads `tokenizer.json` at `path`.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::File {
            path: path.to_path_buf(),
            message: format!("not a Hugging Face tokenizer.json: {e}"),
        })?;
        Ok(HfTokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Ids of `text`; with `special`, the special tokens the tokenizer's post-processor adds (BOS,
    /// say), as transformers' `tokenizer(text)` does.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| self.failed(e))
    }

    /// Text of `ids` (special tokens kept, as transformers' `decode` does by default).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let vocab = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TokenizerError::UnknownId { id, vocab });
        }
        self.inner.decode(ids, false).map_err(|e| self.failed(e))
    }

    /// Tokens, added ones included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Writes the tokenizer to `path` as `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        self.inner
            .save(path, true)
            .map_err(|e| TokenizerError::File {
                path: path.to_path_buf(),
                message: e.to_string(),
            })
    }

    fn failed(&self, e: tokenizers::Error) -> TokenizerError {
        TokenizerError::File {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }
}

/// A Hugging Face tokenizer with the model's beginning and end tokens (its config's `bos_token_id`
/// and `eos_token_id`): what a task that writes prompts and reads replies needs.
#[derive(Debug)]
pub struct HfText {
    /// The tokenizer.
    pub tokenizer: HfTokenizer,
    /// The token a sequence begins with, if the model has one.
    pub bos: Option<u32>,
    /// The token that ends a reply.
    pub eos: u32,
}

impl TextTokenizer for HfText {
    fn text_ids(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer.encode(text, false)
    }

    fn ids_text(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let vocab = self.tokenizer.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TokenizerError::UnknownId { id, vocab });
        }
        self.tokenizer
            .inner
            .decode(ids, true)
            .map_err(|e| self.tokenizer.failed(e))
    }

    fn vocab_len(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    fn bos(&self) -> Option<u32> {
        self.bos
    }

    fn eos(&self) -> u32 {
        self.eos
    }
}
