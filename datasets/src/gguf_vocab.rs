//! A tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata (tokens, merges or scores,
//! token types, the pre-tokenizer's name), rebuilt as a Hugging Face `tokenizer.json` and loaded by
//! HF's `tokenizers`: byte-level BPE (`gpt2`) and SentencePiece BPE (`llama`).
//!
//! The rebuilt tokenizer is the one the model was trained with: a byte-level vocabulary splits text
//! with the regex llama.cpp names by `tokenizer.ggml.pre` (SmolLM's digits one by one, LLaMA 3's and
//! Qwen2's regexes); a SentencePiece vocabulary is a byte-fallback BPE whose merges come from the
//! token scores (the better the merged token's score, the earlier the merge), with a `▁` prepended to
//! the text, as transformers' `LlamaTokenizer` builds it.

use crate::tokenizer::TokenizerError;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// What a GGUF file says of its tokenizer, as plain values (the file's reader fills it in).
#[derive(Debug, Clone, Default)]
pub struct GgufVocabulary {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name (byte-level vocabularies).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`, by id (SentencePiece).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`, by id.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: "left right" pairs, best first.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
}

/// The split regexes of byte-level pre-tokenizers by llama.cpp's name for them; `None`: GPT-2's own
/// (ByteLevel's built-in regex). SmolLM adds a split before every digit.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The byte-level pre-tokenizers this rebuilds, by `tokenizer.ggml.pre`.
pub const BYTE_LEVEL_PRE: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "smollm",
    "llama3",
    "llama-bpe",
    "llama-v3",
    "qwen2",
];

impl GgufVocabulary {
    /// The tokenizer as a Hugging Face `tokenizer.json` document; `origin` names the file in errors.
    pub fn tokenizer_json(&self, origin: &Path) -> Result<Value, TokenizerError> {
        let bad = |message: String| TokenizerError::File {
            path: origin.to_path_buf(),
            message,
        };
        let n = self.tokens.len();
        if n == 0 {
            return Err(bad("tokenizer.ggml.tokens is empty".into()));
        }
        for (key, len) in [
            ("tokenizer.ggml.scores", self.scores.as_ref().map(Vec::len)),
            (
                "tokenizer.ggml.token_type",
                self.token_types.as_ref().map(Vec::len),
            ),
        ] {
            if let Some(len) = len.filter(|&len| len != n) {
                return Err(bad(format!("{key} has {len} entries for {n} tokens")));
            }
        }
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", self.bos),
            ("tokenizer.ggml.unknown_token_id", self.unk),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(bad(format!("{key} = {id} is past the {n} tokens")));
            }
        }
        let types = self.token_types.clone().unwrap_or_else(|| vec![1; n]);
        let (model, pre_tokenizer, decoder, add_bos_default, byte_level) = match self.model.as_str()
        {
            "gpt2" => {
                let (vocab, merges) = self.byte_level_vocab(&bad)?;
                let model = bpe(vocab, merges, None, false);
                (
                    model,
                    self.byte_level_pre(&bad)?,
                    byte_level_decoder(),
                    false,
                    true,
                )
            }
            "llama" => {
                let model = bpe(
                    self.tokens.iter().cloned().zip(0..).collect(),
                    self.sentencepiece_merges(&bad)?,
                    self.unk.map(|id| self.tokens[id as usize].clone()),
                    true,
                );
                let pre = json!({"type": "Metaspace", "replacement": "▁",
                    "prepend_scheme": "first", "split": false});
                let decoder = json!({"type": "Sequence", "decoders": [
                    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                    {"type": "ByteFallback"},
                    {"type": "Fuse"},
                    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
                (model, pre, decoder, true, false)
            }
            other => {
                return Err(bad(format!(
                    "tokenizer.ggml.model = {other:?}: only \"gpt2\" (byte-level BPE) and \"llama\" \
                     (SentencePiece) tokenizers are rebuilt"
                )));
            }
        };
        let alphabet = byte_alphabet();
        let added: Vec<Value> = (0..n)
            .filter(|&id| {
                let token = &self.tokens[id];
                match types[id] {
                    // A control token spelled outside the byte alphabet of a byte-level vocabulary
                    // is not one (llama.cpp mislabels some); it stays a plain vocabulary entry.
                    CONTROL => !byte_level || token.chars().all(|c| alphabet.contains(&c)),
                    USER_DEFINED => true,
                    _ => false,
                }
            })
            .map(|id| {
                json!({"id": id, "content": self.tokens[id], "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": types[id] == CONTROL})
            })
            .collect();
        let post_processor = match (self.add_bos.unwrap_or(add_bos_default), self.bos) {
            (true, Some(bos)) => {
                let token = &self.tokens[bos as usize];
                json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": token, "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": token, "type_id": 0}},
                             {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {token: {"id": token, "ids": [bos], "tokens": [token]}}})
            }
            _ => Value::Null,
        };
        Ok(json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added, "normalizer": null, "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor, "decoder": decoder, "model": model,
        }))
    }

    /// A byte-level vocabulary with every token in the byte alphabet (a token written in raw UTF-8
    /// is respelled byte by byte, as transformers does) and the file's merges.
    #[allow(clippy::type_complexity)]
    fn byte_level_vocab(
        &self,
        bad: &dyn Fn(String) -> TokenizerError,
    ) -> Result<(Vec<(String, u32)>, Vec<(String, String)>), TokenizerError> {
        let alphabet = byte_alphabet();
        let spelling = byte_spelling();
        let vocab = self
            .tokens
            .iter()
            .zip(0..)
            .map(|(token, id)| {
                let spelled = if token.chars().all(|c| alphabet.contains(&c)) {
                    token.clone()
                } else {
                    token.bytes().map(|b| spelling[b as usize]).collect()
                };
                (spelled, id)
            })
            .collect();
        let Some(merges) = &self.merges else {
            return Err(bad("a gpt2 tokenizer without tokenizer.ggml.merges".into()));
        };
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, merge)| match merge.split_once(' ') {
                Some((l, r)) if !l.is_empty() && !r.is_empty() && !r.contains(' ') => {
                    Ok((l.to_string(), r.to_string()))
                }
                _ => Err(bad(format!(
                    "tokenizer.ggml.merges[{i}] = {merge:?} is not two tokens split by one space"
                ))),
            })
            .collect::<Result<_, _>>()?;
        Ok((vocab, merges))
    }

    /// The byte-level pre-tokenizer `tokenizer.ggml.pre` names.
    fn byte_level_pre(
        &self,
        bad: &dyn Fn(String) -> TokenizerError,
    ) -> Result<Value, TokenizerError> {
        let byte_level = |regex: bool| {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                "use_regex": regex})
        };
        let split = |regex: &str| {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
                 "invert": false},
                byte_level(false)]})
        };
        Ok(match self.pre.as_deref().unwrap_or("default") {
            "default" | "gpt2" | "gpt-2" => byte_level(true),
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            "llama3" | "llama-bpe" | "llama-v3" => split(LLAMA3_SPLIT),
            "qwen2" => split(QWEN2_SPLIT),
            other => {
                return Err(bad(format!(
                    "tokenizer.ggml.pre = {other:?} is not a pre-tokenizer this rebuilds \
                     (known: {})",
                    BYTE_LEVEL_PRE.join(", ")
                )));
            }
        })
    }

    /// SentencePiece merges: every split of a token into two tokens, ordered by the merged token's
    /// score (best first), then by the pieces' lengths, then by their ids (transformers'
    /// `generate_merges`); the file's own merges when it has them.
    fn sentencepiece_merges(
        &self,
        bad: &dyn Fn(String) -> TokenizerError,
    ) -> Result<Vec<(String, String)>, TokenizerError> {
        if let Some(merges) = &self.merges {
            return merges
                .iter()
                .map(|m| {
                    m.split_once(' ')
                        .map(|(l, r)| (l.to_string(), r.to_string()))
                        .ok_or_else(|| {
                            bad(format!("tokenizer.ggml.merges entry {m:?} has no space"))
                        })
                })
                .collect();
        }
        let Some(scores) = &self.scores else {
            return Err(bad(
                "a llama (SentencePiece) tokenizer with neither merges nor scores".into(),
            ));
        };
        if let Some(i) = scores.iter().position(|s| s.is_nan()) {
            return Err(bad(format!("tokenizer.ggml.scores[{i}] is NaN")));
        }
        let ids: HashMap<&str, usize> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.as_str(), id))
            .collect();
        let mut merges: Vec<(f32, usize, usize)> = Vec::new();
        for (token, &score) in self.tokens.iter().zip(scores) {
            let mut local = Vec::new();
            for (cut, _) in token.char_indices().skip(1) {
                let (l, r) = token.split_at(cut);
                if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                    local.push((score, li, ri));
                }
            }
            local.sort_by_key(|&(_, li, ri)| (li, ri));
            merges.extend(local);
        }
        // Stable: ties keep the token order and, within a token, the ids' order.
        merges.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(char_len(&self.tokens[b.1]).cmp(&char_len(&self.tokens[a.1])))
                .then(char_len(&self.tokens[b.2]).cmp(&char_len(&self.tokens[a.2])))
        });
        Ok(merges
            .into_iter()
            .map(|(_, l, r)| (self.tokens[l].clone(), self.tokens[r].clone()))
            .collect())
    }
}

fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// A BPE model's JSON.
fn bpe(
    vocab: Vec<(String, u32)>,
    merges: Vec<(String, String)>,
    unk: Option<String>,
    byte_fallback: bool,
) -> Value {
    let vocab: serde_json::Map<String, Value> = vocab
        .into_iter()
        .map(|(t, id)| (t, Value::from(id)))
        .collect();
    let merges: Vec<Value> = merges.into_iter().map(|(l, r)| json!([l, r])).collect();
    json!({"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
        "ignore_merges": false, "vocab": vocab, "merges": merges})
}

fn byte_level_decoder() -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})
}

/// GPT-2's spelling of each byte as a printable character: the printable Latin-1 bytes stand for
/// themselves, the others map in order onto U+0100 and up.
fn byte_spelling() -> [char; 256] {
    let mut spelling = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        spelling[b as usize] = if printable {
            char::from_u32(b).expect("a Latin-1 code point")
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below U+0200")
        };
    }
    spelling
}

fn byte_alphabet() -> std::collections::HashSet<char> {
    byte_spelling().into_iter().collect()
}
