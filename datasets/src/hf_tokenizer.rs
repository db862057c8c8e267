//! A Hugging Face `tokenizer.json` (or one rebuilt from a GGUF file's vocabulary), read and applied
//! by HF's own `tokenizers` library: the ids transformers' fast tokenizer gives, and text back from
//! ids.

use crate::gguf_vocab::GgufVocabulary;
use crate::tokenizer::{TextTokenizer, TokenizerError};
use std::path::{Path, PathBuf};

/// A Hugging Face tokenizer loaded from its `tokenizer.json`.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// Whether `path` is a `tokenizer.json` whose directory may hold `tokenizer_config.json`.
    beside_config: bool,
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
            beside_config: true,
        })
    }

    /// The tokenizer a GGUF file's vocabulary describes (`origin`: that file, named in errors).
    pub fn from_gguf(vocabulary: &GgufVocabulary, origin: &Path) -> Result<Self, TokenizerError> {
        let document = vocabulary.tokenizer_json(origin)?;
        let inner =
            tokenizers::Tokenizer::from_bytes(document.to_string().as_bytes()).map_err(|e| {
                TokenizerError::File {
                    path: origin.to_path_buf(),
                    message: format!("its tokenizer.ggml.* metadata is not a tokenizer: {e}"),
                }
            })?;
        Ok(HfTokenizer {
            inner,
            path: origin.to_path_buf(),
            beside_config: false,
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

    /// The special tokens the tokenizer's post-processor puts before a text (a BOS, or nothing):
    /// what transformers' `tokenizer(text)` adds in front, read off the tokenizer itself rather
    /// than config.json's `bos_token_id` (a Qwen2 config names one its tokenizer never adds).
    pub fn prefix(&self) -> Result<Vec<u32>, TokenizerError> {
        let probe = "a";
        let (plain, with) = (self.encode(probe, false)?, self.encode(probe, true)?);
        (0..=with.len().saturating_sub(plain.len()))
            .find(|&i| with[i..].starts_with(&plain))
            .map(|i| with[..i].to_vec())
            .ok_or_else(|| TokenizerError::File {
                path: self.path.clone(),
                message: format!(
                    "its post-processor turns the ids {plain:?} of {probe:?} into {with:?}: what it \
                     adds cannot be told apart"
                ),
            })
    }

    /// The id of the special token that `tokenizer_config.json` (else `special_tokens_map.json`)
    /// beside `tokenizer.json` names as `key` (`eos_token`, `bos_token`; a string or an object with
    /// its `content`), as transformers' `tokenizer.eos_token_id` reads it; `None` when neither
    /// names one. A named token the vocabulary lacks is an error naming it.
    pub fn named_token(&self, key: &str) -> Result<Option<u32>, TokenizerError> {
        if !self.beside_config {
            return Ok(None);
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        for file in ["tokenizer_config.json", "special_tokens_map.json"] {
            let path = dir.join(file);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| TokenizerError::File {
                    path: path.clone(),
                    message: format!("not JSON: {e}"),
                })?;
            let token = match json.get(key) {
                Some(serde_json::Value::String(t)) => t.as_str(),
                Some(serde_json::Value::Object(o)) => match o.get("content") {
                    Some(serde_json::Value::String(t)) => t.as_str(),
                    _ => continue,
                },
                _ => continue,
            };
            return match self.inner.token_to_id(token) {
                Some(id) => Ok(Some(id)),
                None => Err(TokenizerError::File {
                    path,
                    message: format!(
                        "{key} = {token:?} is not in the vocabulary of tokenizer.json"
                    ),
                }),
            };
        }
        Ok(None)
    }

    /// Text of `ids` (special tokens kept, as transformers' `decode` does by default).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let vocab = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TokenizerError::UnknownId { id, vocab });
        }
        self.inner.decode(ids, false).map_err(|e| self.failed(e))
    }

    /// The text of token `id` as the vocabulary spells it (`<|im_start|>`), if there is one.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
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

/// A Hugging Face tokenizer with the model's beginning and end tokens (the BOS its post-processor
/// adds, the EOS a reply ends with): what a task that writes prompts and reads replies needs.
#[derive(Debug)]
pub struct HfText {
    /// The tokenizer.
    pub tokenizer: HfTokenizer,
    /// The token the tokenizer begins a text with, if it adds one ([`HfTokenizer::prefix`]).
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
