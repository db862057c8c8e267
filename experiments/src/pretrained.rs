//! Pretrained models wherever ringbench reads one: a Hugging Face directory or a GGUF file, its
//! config (or the GGUF metadata as the same), its weights in f32, its tokenizer and chat template.

use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use datasets::{ChatTemplate, GgufVocabulary, HfTokenizer};
use std::path::Path;
use workbench::gguf::{GgufFile, GgufValue, load_gguf_model, read_gguf_model};
use workbench::hf::{HfConfig, load_model, read_adapter, read_adapter_rope, rope_scaling_of};
use workbench::model::Llama;
use workbench::model::RopeScaling;

/// The files the tokenizer of a Hugging Face directory is made of, copied beside a model written
/// from it.
pub const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Whether `path` names a GGUF file (by its extension) rather than a model directory.
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// What a pretrained model says of itself: a Hugging Face directory's config, or a GGUF file's
/// metadata as the same (its architecture, end-of-sequence and beginning tokens).
pub fn pretrained_config(path: &Path) -> Result<HfConfig> {
    if !is_gguf(path) {
        return Ok(HfConfig::read(&path.join("config.json"))?);
    }
    let info = read_gguf_model(path)?;
    Ok(HfConfig {
        architecture: info.architecture,
        model: info.config,
        eos: info.eos.into_iter().collect(),
        bos: info.bos,
        max_positions: info.context_length,
    })
}

/// A pretrained model onto `device`, in f32: a Hugging Face directory, or a GGUF file (its
/// tensors dequantized), with the PEFT adapter in `adapter` folded into its weights where one is
/// given ([`with_adapter`]; the config then holds the RoPE the adapter was trained with).
pub fn load_pretrained<B: workbench::LayerBackend>(
    path: &Path,
    adapter: Option<&Path>,
    device: &B::Device,
) -> Result<(Llama<B>, HfConfig)> {
    let (model, mut config) = if is_gguf(path) {
        let config = pretrained_config(path)?;
        (load_gguf_model::<B>(path, device)?.0, config)
    } else {
        load_model::<B>(path, device)?
    };
    let model = with_adapter(model, &mut config, adapter, device)?;
    Ok((model, config))
}

/// `model` with the PEFT LoRA adapter in `adapter` (trained by ringbench or anywhere) read onto it
/// and folded into its weights (`W + s·A·B`, its saved norms and embedding in place), rotating as
/// the adapter was trained where it says (`adapter_rope.json`: `config` is changed to match): the
/// model the adapter computes, for inference. `None`: the model as it is.
pub fn with_adapter<B: Backend>(
    model: Llama<B>,
    config: &mut HfConfig,
    adapter: Option<&Path>,
    device: &B::Device,
) -> Result<Llama<B>> {
    let Some(dir) = adapter else {
        return Ok(model);
    };
    let context = || format!("--adapter {}", dir.display());
    let read = read_adapter::<B>(dir, &config.model, device).with_context(context)?;
    let mut model = model.with_peft(read)?.merge_lora();
    if let Some((theta, scaling)) =
        read_adapter_rope(dir, config.max_positions).with_context(context)?
    {
        config.model = config
            .model
            .clone()
            .with_rope_theta(theta)
            .with_rope_scaling(scaling);
        config.model.validate()?;
        model = model.with_trunk_of(&config.model);
    }
    Ok(model)
}

/// A pretrained model's tokenizer: a directory's `tokenizer.json`, or the one a GGUF file's
/// `tokenizer.ggml.*` metadata describes; `None` when the directory has no tokenizer.json.
pub fn pretrained_tokenizer(path: &Path) -> Result<Option<HfTokenizer>> {
    if !is_gguf(path) {
        let json = path.join("tokenizer.json");
        return Ok(json
            .exists()
            .then(|| HfTokenizer::load(&json))
            .transpose()?);
    }
    let file = GgufFile::open(path)?;
    Ok(Some(HfTokenizer::from_gguf(
        &gguf_vocabulary(&file)?,
        path,
    )?))
}

/// The `tokenizer.ggml.*` metadata of a GGUF file as plain values; a key of the wrong type is an
/// error naming it.
pub fn gguf_vocabulary(file: &GgufFile) -> Result<GgufVocabulary> {
    let origin = file.path().display();
    let text = |key: &str| -> Result<Option<String>> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .with_context(|| format!("{origin}: {key} is not text")),
        }
    };
    let array = |key: &str| -> Result<Option<&[GgufValue]>> {
        match file.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(values)) => Ok(Some(values)),
            Some(_) => bail!("{origin}: {key} is not an array"),
        }
    };
    let texts = |key: &str| -> Result<Option<Vec<String>>> {
        array(key)?
            .map(|values| {
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_str()
                            .map(str::to_string)
                            .with_context(|| format!("{origin}: {key}[{i}] is not text"))
                    })
                    .collect()
            })
            .transpose()
    };
    let id = |key: &str| -> Result<Option<u32>> {
        file.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .with_context(|| format!("{origin}: {key} = {v:?} is not a token id"))
            })
            .transpose()
    };
    let Some(model) = text("tokenizer.ggml.model")? else {
        bail!("{origin}: no tokenizer.ggml.model: the file carries no tokenizer");
    };
    let Some(tokens) = texts("tokenizer.ggml.tokens")? else {
        bail!("{origin}: no tokenizer.ggml.tokens");
    };
    let scores = array("tokenizer.ggml.scores")?
        .map(|values| {
            values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_f64().map(|s| s as f32).with_context(|| {
                        format!("{origin}: tokenizer.ggml.scores[{i}] is not a number")
                    })
                })
                .collect::<Result<Vec<f32>>>()
        })
        .transpose()?;
    let token_types = array("tokenizer.ggml.token_type")?
        .map(|values| {
            values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    match v {
                        GgufValue::Int(t) => i32::try_from(*t).ok(),
                        GgufValue::Uint(t) => i32::try_from(*t).ok(),
                        _ => None,
                    }
                    .with_context(|| {
                        format!("{origin}: tokenizer.ggml.token_type[{i}] is not a type")
                    })
                })
                .collect::<Result<Vec<i32>>>()
        })
        .transpose()?;
    let add_bos = match file.get("tokenizer.ggml.add_bos_token") {
        None => None,
        Some(GgufValue::Bool(b)) => Some(*b),
        Some(v) => bail!("{origin}: tokenizer.ggml.add_bos_token = {v:?} is not a bool"),
    };
    Ok(GgufVocabulary {
        model,
        pre: text("tokenizer.ggml.pre")?,
        tokens,
        scores,
        token_types,
        merges: texts("tokenizer.ggml.merges")?,
        add_bos,
        bos: id("tokenizer.ggml.bos_token_id")?,
        unk: id("tokenizer.ggml.unknown_token_id")?,
    })
}

/// A pretrained model's chat template: a GGUF file's `tokenizer.chat_template`, or a directory's
/// `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`; `None` when it has none.
pub fn pretrained_chat_template(path: &Path) -> Result<Option<String>> {
    if is_gguf(path) {
        return Ok(read_gguf_model(path)?.chat_template);
    }
    let jinja = path.join("chat_template.jinja");
    if jinja.exists() {
        return Ok(Some(
            std::fs::read_to_string(&jinja)
                .with_context(|| format!("reading {}", jinja.display()))?,
        ));
    }
    let config = path.join("tokenizer_config.json");
    let Ok(text) = std::fs::read_to_string(&config) else {
        return Ok(None);
    };
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    match json.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(t)) => Ok(Some(t.clone())),
        Some(other) => bail!(
            "{}: chat_template is {} (only a single template string is read)",
            config.display(),
            if other.is_array() {
                "a list of named templates"
            } else {
                "not text"
            }
        ),
    }
}

/// The model's chat template with its BOS and EOS tokens' texts.
pub fn chat_template(
    model: &Path,
    tokenizer: &HfTokenizer,
    config: &HfConfig,
) -> Result<ChatTemplate> {
    let Some(source) = pretrained_chat_template(model)? else {
        bail!(
            "{}: the model has no chat template (tokenizer.chat_template, chat_template.jinja or \
             tokenizer_config.json's chat_template)",
            model.display()
        );
    };
    let text = |id: Option<u32>| {
        id.and_then(|id| tokenizer.token_text(id))
            .unwrap_or_default()
    };
    Ok(ChatTemplate::new(
        source,
        text(config.bos),
        text(config.eos.first().copied()),
    ))
}

/// The RoPE scalings `--rope-scaling` names (`none`: the model's own).
pub const SCALINGS: [&str; 5] = ["none", "linear", "dynamic", "yarn", "llama3"];

/// The model's RoPE scaling replaced by `kind` at `factor` (`none`: kept as the model has it),
/// with the defaults transformers gives the keys it omits, the model's context length as the
/// original one (LLaMA 3.1's band edges, 1 and 4, for `llama3`).
pub fn rope_override(kind: &str, factor: f64, config: &HfConfig) -> Result<Option<RopeScaling>> {
    let object = match kind {
        "none" => return Ok(None),
        "linear" | "dynamic" | "yarn" => serde_json::json!({"rope_type": kind, "factor": factor}),
        "llama3" => serde_json::json!({"rope_type": "llama3", "factor": factor,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
        other => bail!(
            "--rope-scaling {other:?} is not one of {}",
            SCALINGS.join(", ")
        ),
    };
    let serde_json::Value::Object(object) = object else {
        unreachable!("a JSON object literal")
    };
    let Some(max) = config.max_positions else {
        bail!("--rope-scaling {kind} needs the model's context length (max_position_embeddings)");
    };
    Ok(Some(rope_scaling_of(
        Path::new("--rope-scaling"),
        &object,
        Some(max),
    )?))
}
