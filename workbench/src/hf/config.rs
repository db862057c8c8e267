//! A Hugging Face `config.json` of a LLaMA-family model read into a [`LlamaConfig`] (and written back
//! from one): the architectures and keys this model honours, every other value that changes the
//! computation refused by name.

use crate::hf::error::HfError;
use crate::model::{LlamaConfig, RopeScaling};
use serde_json::{Map, Value, json};
use std::path::Path;

/// The model classes read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `MistralForCausalLM`: its `sliding_window` is every layer's window.
    Mistral,
    /// `Qwen2ForCausalLM`: biases on the query, key and value projections.
    Qwen2,
}

impl Architecture {
    /// Every architecture read.
    pub const ALL: [Architecture; 3] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
    ];

    /// Its class name in `architectures`.
    pub fn class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// Its `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

/// What a Hugging Face config says: the model's sizes and options, its class, and the token that
/// ends a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The model class.
    pub architecture: Architecture,
    /// Sizes and options as this model holds them.
    pub model: LlamaConfig,
    /// The tokens that end a generation (`eos_token_id`: none, one or several).
    pub eos: Vec<u32>,
    /// `bos_token_id`, when given.
    pub bos: Option<u32>,
    /// `max_position_embeddings`, when given.
    pub max_positions: Option<usize>,
}

/// The JSON object of `path`.
fn object(path: &Path) -> Result<Map<String, Value>, HfError> {
    let text = std::fs::read_to_string(path).map_err(|e| HfError::io(path, e))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(HfError::Config {
            path: path.to_path_buf(),
            what: "not a JSON object".into(),
        }),
        Err(e) => Err(HfError::Config {
            path: path.to_path_buf(),
            what: format!("not JSON: {e}"),
        }),
    }
}

/// Reads keys of one JSON object, each error naming the file and the key.
struct Keys<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
    /// The object's name in errors (`config.json`, `rope_scaling`).
    scope: &'a str,
}

impl Keys<'_> {
    fn refuse(&self, key: &str, why: impl std::fmt::Display) -> HfError {
        let value = self.map.get(key).map_or("absent".into(), Value::to_string);
        HfError::Config {
            path: self.path.to_path_buf(),
            what: format!("{}{key} = {value}: {why}", self.prefix()),
        }
    }

    fn prefix(&self) -> String {
        if self.scope.is_empty() {
            String::new()
        } else {
            format!("{}.", self.scope)
        }
    }

    /// The value, unless absent or null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn count(&self, key: &str) -> Result<Option<usize>, HfError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.refuse(key, "must be a whole number"))
            })
            .transpose()
    }

    fn required_count(&self, key: &str) -> Result<usize, HfError> {
        self.count(key)?
            .ok_or_else(|| self.refuse(key, "is required"))
    }

    fn number(&self, key: &str) -> Result<Option<f64>, HfError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| self.refuse(key, "must be a finite number"))
            })
            .transpose()
    }

    fn flag(&self, key: &str) -> Result<Option<bool>, HfError> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.refuse(key, "must be true or false"))
            })
            .transpose()
    }

    /// Token ids: a number, a list of numbers, or null.
    fn tokens(&self, key: &str) -> Result<Vec<u32>, HfError> {
        let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| one(v).ok_or_else(|| self.refuse(key, "must hold token ids")))
                .collect(),
            Some(v) => one(v)
                .map(|t| vec![t])
                .ok_or_else(|| self.refuse(key, "must be a token id or a list of them")),
        }
    }
}

impl HfConfig {
    /// Reads `config.json` at `path`: the class, sizes and options, each value this model cannot
    /// honour refused by name.
    pub fn read(path: &Path) -> Result<Self, HfError> {
        let map = object(path)?;
        let keys = Keys {
            path,
            map: &map,
            scope: "",
        };
        let architecture = architecture(&keys)?;
        let heads = keys.required_count("num_attention_heads")?;
        let hidden = keys.required_count("hidden_size")?;
        let act = keys
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            return Err(keys.refuse("hidden_act", "only silu (SwiGLU) is computed"));
        }
        for key in ["attention_bias", "mlp_bias"] {
            if keys.flag(key)? == Some(true) {
                return Err(keys.refuse(key, "biases exist here only on q/k/v (Qwen2)"));
            }
        }
        if keys.count("pretraining_tp")?.is_some_and(|tp| tp != 1) {
            return Err(keys.refuse("pretraining_tp", "only 1 (unsliced projections)"));
        }
        if let Some(f) = keys.number("partial_rotary_factor")?
            && f != 1.0
        {
            return Err(keys.refuse("partial_rotary_factor", "RoPE rotates whole heads here"));
        }
        let window = match architecture {
            // transformers' `MistralConfig` gives an absent key its default window; an explicit
            // null is full attention.
            Architecture::Mistral if !keys.map.contains_key("sliding_window") => {
                Some(MISTRAL_DEFAULT_WINDOW)
            }
            Architecture::Mistral => keys.count("sliding_window")?,
            Architecture::Qwen2 if keys.flag("use_sliding_window")? == Some(true) => {
                return Err(keys.refuse(
                    "use_sliding_window",
                    "Qwen2's layer-dependent window is not computed here",
                ));
            }
            _ => None,
        };
        // Every layer is of one type here: the window's when there is one, else full attention.
        let layer_type = if window.is_some() {
            "sliding_attention"
        } else {
            "full_attention"
        };
        if let Some(Value::Array(types)) = keys.get("layer_types")
            && let Some(other) = types.iter().find(|t| t.as_str() != Some(layer_type))
        {
            return Err(keys.refuse(
                "layer_types",
                format!("a layer of type {other}: every layer here is {layer_type}"),
            ));
        }
        if window == Some(0) {
            return Err(keys.refuse("sliding_window", "must be above 0"));
        }
        let max_positions = keys.count("max_position_embeddings")?;
        let (rope_theta, rope_scaling) = rope(&keys, max_positions)?;
        let tie_default = false;
        let model = LlamaConfig::new(keys.required_count("vocab_size")?)
            .with_d_model(hidden)
            .with_layers(keys.required_count("num_hidden_layers")?)
            .with_heads(heads)
            .with_kv_heads(keys.count("num_key_value_heads")?.unwrap_or(heads))
            .with_head_dim(Some(
                keys.count("head_dim")?.unwrap_or(hidden / heads.max(1)),
            ))
            .with_ffn_hidden_size(Some(keys.required_count("intermediate_size")?))
            .with_norm_eps(keys.number("rms_norm_eps")?.unwrap_or(1e-6))
            .with_rope_theta(rope_theta)
            .with_rope_scaling(rope_scaling)
            .with_qkv_bias(architecture == Architecture::Qwen2)
            .with_tie_embeddings(keys.flag("tie_word_embeddings")?.unwrap_or(tie_default))
            .with_window(window);
        model.validate().map_err(|e| HfError::Config {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        Ok(HfConfig {
            architecture,
            model,
            eos: keys.tokens("eos_token_id")?,
            bos: keys.tokens("bos_token_id")?.first().copied(),
            max_positions,
        })
    }

    /// The config as `config.json` holds it for transformers (its class, sizes, RoPE, tokens); a
    /// RoPE scaling transformers has no form for (a GGUF file's per-frequency factors) is refused,
    /// naming `path`, the file it was to go to.
    pub fn to_json(&self, path: &Path) -> Result<Value, HfError> {
        let m = &self.model;
        let rope_scaling = rope_json(m.rope_scaling).ok_or_else(|| HfError::Config {
            path: path.to_path_buf(),
            what: format!(
                "RoPE scaling {} (a GGUF file's rope_freqs.weight) has no config.json form",
                m.rope_scaling.name()
            ),
        })?;
        let mut out = json!({
            "architectures": [self.architecture.class()],
            "model_type": self.architecture.model_type(),
            "vocab_size": m.vocab,
            "hidden_size": m.d_model,
            "intermediate_size": m.ffn_hidden(),
            "num_hidden_layers": m.layers,
            "num_attention_heads": m.heads,
            "num_key_value_heads": m.kv_heads,
            "head_dim": m.head_dim(),
            "hidden_act": "silu",
            "rms_norm_eps": m.norm_eps,
            "rope_theta": m.rope_theta,
            "tie_word_embeddings": m.tie_embeddings,
            "attention_bias": false,
            "mlp_bias": false,
            "dtype": "float32",
            "torch_dtype": "float32",
            "max_position_embeddings": max_positions(self.max_positions, m.rope_scaling),
            "eos_token_id": match self.eos.as_slice() {
                [] => Value::Null,
                [one] => json!(one),
                many => json!(many),
            },
            "bos_token_id": self.bos,
        });
        let fields = out.as_object_mut().expect("an object");
        fields.insert("rope_scaling".into(), rope_scaling);
        match self.architecture {
            Architecture::Mistral => {
                fields.insert("sliding_window".into(), json!(m.window));
            }
            Architecture::Qwen2 => {
                fields.remove("attention_bias");
                fields.remove("mlp_bias");
                fields.insert("use_sliding_window".into(), json!(false));
            }
            Architecture::Llama => {}
        }
        Ok(out)
    }
}

/// The class named by `architectures` (or `model_type`).
fn architecture(keys: &Keys) -> Result<Architecture, HfError> {
    let named = match keys.get("architectures") {
        Some(Value::Array(list)) if list.len() == 1 => list[0].as_str().map(str::to_string),
        Some(_) => return Err(keys.refuse("architectures", "must name one model class")),
        None => None,
    };
    if let Some(class) = named {
        return Architecture::ALL
            .into_iter()
            .find(|a| a.class() == class)
            .ok_or_else(|| {
                let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.class()).collect();
                keys.refuse(
                    "architectures",
                    format!("unknown architecture; known: {}", known.join(", ")),
                )
            });
    }
    let model_type = keys.get("model_type").and_then(Value::as_str).unwrap_or("");
    Architecture::ALL
        .into_iter()
        .find(|a| a.model_type() == model_type)
        .ok_or_else(|| keys.refuse("model_type", "no architectures and an unknown model_type"))
}

/// `rope_theta` and the RoPE scaling, from `rope_scaling` or `rope_parameters` (transformers writes
/// either, the latter with `rope_theta` inside it).
fn rope(keys: &Keys, max_positions: Option<usize>) -> Result<(f64, RopeScaling), HfError> {
    let (scope, params) = match (keys.get("rope_parameters"), keys.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => ("rope_parameters", Some(p)),
        (None, Some(Value::Object(p))) => ("rope_scaling", Some(p)),
        (Some(_), _) => return Err(keys.refuse("rope_parameters", "must be an object")),
        (None, Some(_)) => return Err(keys.refuse("rope_scaling", "must be an object or null")),
        (None, None) => ("", None),
    };
    let outer_theta = keys.number("rope_theta")?;
    let Some(params) = params else {
        return Ok((outer_theta.unwrap_or(10000.0), RopeScaling::Default));
    };
    let inner = Keys {
        path: keys.path,
        map: params,
        scope,
    };
    let theta = inner
        .number("rope_theta")?
        .or(outer_theta)
        .unwrap_or(10000.0);
    let kind = inner
        .get("rope_type")
        .or_else(|| inner.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || {
        inner
            .number("factor")?
            .ok_or_else(|| inner.refuse("factor", "is required"))
    };
    let original = || -> Result<usize, HfError> {
        inner
            .count("original_max_position_embeddings")?
            .or(max_positions)
            .ok_or_else(|| inner.refuse("original_max_position_embeddings", "is required"))
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic {
            factor: factor()?,
            max_position_embeddings: max_positions.ok_or_else(|| {
                keys.refuse("max_position_embeddings", "dynamic scaling needs it")
            })?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: inner
                .number("low_freq_factor")?
                .ok_or_else(|| inner.refuse("low_freq_factor", "is required"))?,
            high_freq_factor: inner
                .number("high_freq_factor")?
                .ok_or_else(|| inner.refuse("high_freq_factor", "is required"))?,
            original_max_position_embeddings: original()?,
        },
        "yarn" => {
            let original_max = original()?;
            // As transformers 5 does: the factor given, else the model's length over the original.
            let factor = match (inner.number("factor")?, max_positions) {
                (Some(factor), _) => factor,
                (None, Some(max)) if original_max > 0 => max as f64 / original_max as f64,
                (None, _) => factor()?,
            };
            // transformers reads `beta_fast or 32`: a 0 is the default.
            let beta = |key: &str, default: f64| -> Result<f64, HfError> {
                Ok(inner.number(key)?.filter(|b| *b != 0.0).unwrap_or(default))
            };
            let mscale = inner.number("mscale")?;
            let mscale_all_dim = inner.number("mscale_all_dim")?;
            let attention_factor = match (inner.number("attention_factor")?, mscale, mscale_all_dim)
            {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m > 0.0 && all > 0.0 => {
                    RopeScaling::yarn_mscale(factor, m) / RopeScaling::yarn_mscale(factor, all)
                }
                _ => RopeScaling::yarn_mscale(factor, 1.0),
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original_max,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                attention_factor,
                truncate: inner.flag("truncate")?.unwrap_or(true),
            }
        }
        _ => {
            return Err(inner.refuse(
                "rope_type",
                "unknown RoPE scaling; known: default, linear, dynamic, llama3, yarn",
            ));
        }
    };
    if let Some(fault) = scaling.fault() {
        return Err(inner.refuse("rope_type", fault));
    }
    Ok((theta, scaling))
}

/// The window transformers' `MistralConfig` gives a config.json without a `sliding_window` key
/// (`configuration_mistral.py`: `sliding_window=4096`).
pub const MISTRAL_DEFAULT_WINDOW: usize = 4096;

/// A RoPE scaling written as config.json's `rope_scaling` object (a spec's `[model.rope_scaling]`
/// table, say), read with the same defaults transformers gives the keys it omits (YaRN's
/// `beta_fast`, `beta_slow`, `attention_factor`, `truncate`; an `original_max_position_embeddings`
/// of the model's length). `max_positions` is the model's `max_position_embeddings` where it has
/// one; a `max_position_embeddings` inside the object takes its place (the project's own model has
/// no config.json to name it). Errors name `source` and the key.
pub fn rope_scaling_of(
    source: &Path,
    object: &Map<String, Value>,
    max_positions: Option<usize>,
) -> Result<RopeScaling, HfError> {
    let inner = Keys {
        path: source,
        map: object,
        scope: "rope_scaling",
    };
    let max_positions = inner.count("max_position_embeddings")?.or(max_positions);
    let mut wrapper = Map::new();
    wrapper.insert("rope_scaling".into(), Value::Object(object.clone()));
    let keys = Keys {
        path: source,
        map: &wrapper,
        scope: "",
    };
    Ok(rope(&keys, max_positions)?.1)
}

/// `max_position_embeddings` to write: what the scaling's arithmetic reads (dynamic's trained
/// length; YaRN's factor times its original length, the ratio transformers derives its factor
/// from), else the config's own, else 4096.
fn max_positions(given: Option<usize>, scaling: RopeScaling) -> usize {
    match scaling {
        RopeScaling::Dynamic {
            max_position_embeddings,
            ..
        } => max_position_embeddings,
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            ..
        } => (factor * original_max_position_embeddings as f64).round() as usize,
        _ => given.unwrap_or(4096),
    }
}

/// A RoPE scaling as `rope_scaling` holds it (null for none); `None` for per-frequency factors,
/// which transformers cannot read.
pub(crate) fn rope_json(scaling: RopeScaling) -> Option<Value> {
    Some(match scaling {
        RopeScaling::FrequencyFactors { .. } => return None,
        RopeScaling::Default => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Dynamic { factor, .. } => json!({"rope_type": "dynamic", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } => json!({
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "attention_factor": attention_factor,
            "truncate": truncate,
        }),
    })
}
