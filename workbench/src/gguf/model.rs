//! A LLaMA-family GGUF file read into a [`Llama`]: its `{arch}.*` metadata mapped onto the model's
//! config, its tensors dequantized one at a time, renamed to Hugging Face's names, the query and
//! key rows of a `llama` file put back in Hugging Face's order (llama.cpp's converter interleaves
//! each head's two rotary halves there; `qwen2` rotates halves as Hugging Face does), and assembled
//! as a Hugging Face checkpoint is (`hf::assemble`). Nothing that changes the computation is left
//! unread: a key under the architecture's prefix or a tensor this reader does not compute is
//! refused by name.

use super::error::GgufError;
use super::file::{GgufFile, GgufValue};
use crate::hf::{Architecture, LayerNames, TensorRole, assemble, transpose};
use crate::model::Llama;
use crate::model::llama::LlamaConfig;
use crate::model::rope_scaling::{FrequencyFactors, RopeScaling};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// What a GGUF file says besides the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufModel {
    /// The Hugging Face class the file's architecture computes as.
    pub architecture: Architecture,
    /// Sizes and options of the model.
    pub config: LlamaConfig,
    /// `tokenizer.ggml.bos_token_id`, when given.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`, when given.
    pub eos: Option<u32>,
    /// `{arch}.context_length`, when given.
    pub context_length: Option<usize>,
    /// `tokenizer.chat_template`, when given.
    pub chat_template: Option<String>,
}

/// The architectures read (`general.architecture`), each with the Hugging Face class whose
/// computation it is: llama.cpp's converter writes Llama 1-3 and Mistral as `llama`.
const ARCHITECTURES: [(&str, Architecture); 2] = [
    ("llama", Architecture::Llama),
    ("qwen2", Architecture::Qwen2),
];

/// The keys under `{arch}.` this reader honours. Any other key there (an attention soft-cap, a
/// partial rotation's sections, LongRoPE's factors, experts, ...) changes the computation in a way
/// not computed here, and is refused by name.
const READ_KEYS: [&str; 22] = [
    "vocab_size",
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.causal",
    "attention.sliding_window",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
];

/// The per-frequency divisors of LLaMA 3's RoPE scaling, as llama.cpp's converter writes them.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// What the GGUF file at `path` says of its model (its header, its metadata and its small
/// `rope_freqs` table; no weight is read).
pub fn read_gguf_model(path: &Path) -> Result<GgufModel, GgufError> {
    model_of(&GgufFile::open(path)?)
}

/// One tensor the model reads: its GGUF name, its Hugging Face name, its `[rows, columns]` (or
/// `[n]`), and the heads whose rotary rows a `llama` file interleaves.
struct Wanted {
    gguf: String,
    hf: String,
    shape: Vec<usize>,
    unpermute: Option<usize>,
}

/// Every tensor a model of `info` reads, in the file's usual order.
fn wanted(info: &GgufModel) -> Vec<Wanted> {
    let m = &info.config;
    let hd = m.head_dim();
    let (d, f) = (m.d_model, m.ffn_hidden());
    let (q, kv) = (m.heads * hd, m.kv_heads * hd);
    // llama.cpp rotates adjacent pairs for `llama` (so its converter permutes the rows) and halves,
    // as Hugging Face does, for `qwen2`.
    let interleaved = info.architecture != Architecture::Qwen2;
    let tensor = |gguf: String, hf: String, shape: Vec<usize>, unpermute: Option<usize>| Wanted {
        gguf,
        hf,
        shape,
        unpermute: unpermute.filter(|_| interleaved),
    };
    let mut out = vec![
        tensor(
            "token_embd.weight".into(),
            LayerNames::EMBED.into(),
            vec![m.vocab, d],
            None,
        ),
        tensor(
            "output_norm.weight".into(),
            LayerNames::NORM.into(),
            vec![d],
            None,
        ),
    ];
    if !m.tie_embeddings {
        out.push(tensor(
            "output.weight".into(),
            LayerNames::HEAD.into(),
            vec![m.vocab, d],
            None,
        ));
    }
    for layer in 0..m.layers {
        let names = LayerNames(layer);
        for role in TensorRole::ALL {
            let (suffix, shape, unpermute) = match role {
                TensorRole::AttnNorm => ("attn_norm.weight", vec![d], None),
                TensorRole::Q => ("attn_q.weight", vec![q, d], Some(m.heads)),
                TensorRole::K => ("attn_k.weight", vec![kv, d], Some(m.kv_heads)),
                TensorRole::V => ("attn_v.weight", vec![kv, d], None),
                TensorRole::O => ("attn_output.weight", vec![d, q], None),
                TensorRole::QBias if m.qkv_bias => ("attn_q.bias", vec![q], None),
                TensorRole::KBias if m.qkv_bias => ("attn_k.bias", vec![kv], None),
                TensorRole::VBias if m.qkv_bias => ("attn_v.bias", vec![kv], None),
                TensorRole::QBias | TensorRole::KBias | TensorRole::VBias => continue,
                TensorRole::FfnNorm => ("ffn_norm.weight", vec![d], None),
                TensorRole::Gate => ("ffn_gate.weight", vec![f, d], None),
                TensorRole::Up => ("ffn_up.weight", vec![f, d], None),
                TensorRole::Down => ("ffn_down.weight", vec![d, f], None),
            };
            out.push(tensor(
                format!("blk.{layer}.{suffix}"),
                names.of(role),
                shape,
                unpermute,
            ));
        }
    }
    out
}

/// Reads the GGUF model at `path` onto `device`, in f32.
pub fn load_gguf_model<B: Backend>(
    path: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, GgufModel), GgufError> {
    let file = GgufFile::open(path)?;
    let info = model_of(&file)?;
    let hd = info.config.head_dim();
    // Each tensor dequantized (and a projection transposed) on rayon's pool, in parallel; each
    // vector becomes the model's tensor without a copy.
    let converted: Vec<(String, Vec<f32>)> = wanted(&info)
        .into_par_iter()
        .map(|w| {
            let values = tensor_values(&file, &w.gguf, &w.shape)?;
            let values = match w.unpermute {
                Some(heads) => rotary_rows_back(&values, heads, hd, w.shape[1]),
                None => values,
            };
            // Stored [out, in] as Hugging Face's; Burn's Linear holds [in, out].
            let values = match w.shape.as_slice() {
                [rows, cols] if LayerNames::is_projection(&w.hf) => {
                    transpose(&values, *rows, *cols)
                }
                _ => values,
            };
            Ok((w.hf, values))
        })
        .collect::<Result<_, GgufError>>()?;
    let mut loaded: HashMap<String, Tensor<B, 1>> = HashMap::with_capacity(converted.len());
    for (name, values) in converted {
        let len = values.len();
        loaded.insert(
            name,
            Tensor::from_data(TensorData::new(values, [len]), device),
        );
    }
    let model = assemble(&info.config, &mut loaded, device);
    Ok((model, info))
}

/// Tensor `name`'s values, checked against the `[rows, columns]` (or `[n]`) the config gives and
/// for finite values.
fn tensor_values(file: &GgufFile, name: &str, shape: &[usize]) -> Result<Vec<f32>, GgufError> {
    let entry = file.tensor(name)?;
    let bad = |what: String| GgufError::BadTensor {
        path: file.path().to_path_buf(),
        tensor: name.to_owned(),
        what,
    };
    // GGUF lists dimensions innermost first.
    let want: Vec<u64> = shape.iter().rev().map(|&n| n as u64).collect();
    if entry.dims != want {
        return Err(bad(format!(
            "dimensions {:?} (innermost first); the metadata gives {want:?}",
            entry.dims
        )));
    }
    let values = file.values(name)?;
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(bad(format!("value {} at index {index}", values[index])));
    }
    Ok(values)
}

/// Query or key rows `[heads · hd, cols]` as Hugging Face orders them. llama.cpp's converter moves
/// row `i·hd/2 + j` of each head (half i of its rotary pairs, j < hd/2) to row `2j + i`, so that
/// its rotation reads adjacent pairs; this puts each row back.
fn rotary_rows_back(values: &[f32], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    let half = hd / 2;
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..half {
                let from = (h * hd + 2 * j + i) * cols;
                let to = (h * hd + i * half + j) * cols;
                out[to..to + cols].copy_from_slice(&values[from..from + cols]);
            }
        }
    }
    out
}

/// The model's config and tokens from the file's metadata, every key under the architecture's
/// prefix and every tensor accounted for.
fn model_of(file: &GgufFile) -> Result<GgufModel, GgufError> {
    let path = file.path().to_path_buf();
    let bad = |key: &str, what: String| GgufError::BadValue {
        path: path.clone(),
        key: key.to_owned(),
        what,
    };
    if let Some(parts) = file.get("split.count").and_then(GgufValue::as_u64)
        && parts > 1
    {
        return Err(bad(
            "split.count",
            format!(
                "{parts}: one part of a split model; join the parts first (llama-gguf-split --merge)"
            ),
        ));
    }
    let named = file
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| bad("general.architecture", "missing".into()))?;
    let Some(&(prefix, architecture)) = ARCHITECTURES.iter().find(|(a, _)| *a == named) else {
        let known: Vec<&str> = ARCHITECTURES.iter().map(|(a, _)| *a).collect();
        return Err(bad(
            "general.architecture",
            format!("{named:?}; ringbench reads {}", known.join(", ")),
        ));
    };
    let key = |name: &str| format!("{prefix}.{name}");
    if let Some((unknown, value)) = file.metadata().iter().find(|(k, _)| {
        k.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| !READ_KEYS.contains(&rest))
    }) {
        return Err(bad(
            unknown,
            format!("= {value}: ringbench does not compute what this key changes"),
        ));
    }
    let count = |name: &str| -> Result<Option<usize>, GgufError> {
        match file.get(&key(name)) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .map(Some)
                .ok_or_else(|| bad(&key(name), format!("{v}, not a positive integer"))),
        }
    };
    let required = |name: &str| count(name)?.ok_or_else(|| bad(&key(name), "missing".into()));
    let number = |name: &str| -> Result<Option<f64>, GgufError> {
        match file.get(&key(name)) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| bad(&key(name), format!("{v}, not a positive number"))),
        }
    };
    if let Some(v) = file.get(&key("attention.causal"))
        && *v != GgufValue::Bool(true)
    {
        return Err(bad(
            &key("attention.causal"),
            format!("{v}: only causal language models are computed"),
        ));
    }
    let embed = file.tensor("token_embd.weight")?;
    let vocab = match count("vocab_size")? {
        Some(n) => n,
        None => embed.dims.get(1).copied().unwrap_or(0) as usize,
    };
    let mut config = LlamaConfig::new(vocab);
    config.d_model = required("embedding_length")?;
    config.layers = required("block_count")?;
    config.heads = required("attention.head_count")?;
    config.kv_heads = count("attention.head_count_kv")?.unwrap_or(config.heads);
    config.ffn_hidden_size = Some(required("feed_forward_length")?);
    config.head_dim = count("attention.key_length")?;
    config.qkv_bias = architecture == Architecture::Qwen2;
    // Values are as wide as keys here.
    if let Some(width) = count("attention.value_length")?
        && width != config.head_dim()
    {
        return Err(bad(
            &key("attention.value_length"),
            format!(
                "{width}, but keys are {} wide: values of another width are not computed",
                config.head_dim()
            ),
        ));
    }
    // RoPE rotates every dimension of a head here (no partial rotary factor).
    if let Some(rotated) = count("rope.dimension_count")?
        && rotated != config.head_dim()
    {
        return Err(bad(
            &key("rope.dimension_count"),
            format!(
                "{rotated}, but heads are {} wide: a partial rotation is not computed",
                config.head_dim()
            ),
        ));
    }
    config.rope_theta = number("rope.freq_base")?.unwrap_or(10_000.0);
    config.norm_eps = number("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
    config.tie_embeddings = file.tensor("output.weight").is_err();
    // A window of 0 is none (llama.cpp's converter writes 0 to switch it off).
    config.window = match file.get(&key("attention.sliding_window")) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(0) => None,
            Some(n) => Some(n as usize),
            None => {
                return Err(bad(
                    &key("attention.sliding_window"),
                    format!("{v}, not a whole number"),
                ));
            }
        },
    };
    let context_length = count("context_length")?;
    config.rope_scaling = rope_scaling(file, &key, &number, &bad, config.head_dim())?;
    config
        .validate()
        .map_err(|e| bad(&key("attention.head_count"), e.to_string()))?;
    let token = |name: &str| {
        file.get(name)
            .and_then(GgufValue::as_u64)
            .and_then(|t| u32::try_from(t).ok())
    };
    let info = GgufModel {
        architecture,
        config,
        bos: token("tokenizer.ggml.bos_token_id"),
        eos: token("tokenizer.ggml.eos_token_id"),
        context_length,
        chat_template: file
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(str::to_owned),
    };
    // Every tensor of the file is one the model reads (or the RoPE table read above).
    let read: HashSet<String> = wanted(&info).into_iter().map(|w| w.gguf).collect();
    if let Some(extra) = file
        .tensors()
        .iter()
        .find(|t| t.name != ROPE_FREQS && !read.contains(&t.name))
    {
        return Err(GgufError::BadTensor {
            path: path.clone(),
            tensor: extra.name.clone(),
            what: format!(
                "not a tensor of a {prefix} model as ringbench computes it ({} layers{}): it \
                 would be left unread",
                info.config.layers,
                if info.config.qkv_bias {
                    ", q/k/v biases"
                } else {
                    ""
                }
            ),
        });
    }
    Ok(info)
}

/// RoPE's scaling as the converter writes it: `rope.scaling.type` none, linear or yarn with their
/// `rope.scaling.*` keys, or LLaMA 3's per-frequency divisors as the tensor `rope_freqs.weight`.
fn rope_scaling(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    number: &dyn Fn(&str) -> Result<Option<f64>, GgufError>,
    bad: &dyn Fn(&str, String) -> GgufError,
    head_dim: usize,
) -> Result<RopeScaling, GgufError> {
    let kind = match file.get(&key("rope.scaling.type")) {
        None => "none",
        Some(v) => v
            .as_str()
            .ok_or_else(|| bad(&key("rope.scaling.type"), format!("{v}, not text")))?,
    };
    let factor = || {
        number("rope.scaling.factor")?
            .ok_or_else(|| bad(&key("rope.scaling.factor"), "missing".into()))
    };
    let scaling = match kind {
        "none" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "yarn" => {
            let factor = factor()?;
            // llama.cpp's extrapolation mix: below 0 it derives 1 for YaRN, which is the ramp
            // transformers computes; any other mix is not.
            let mix_key = key("rope.scaling.yarn_ext_factor");
            if let Some(v) = file.get(&mix_key)
                && !v.as_f64().is_some_and(|mix| mix < 0.0 || mix == 1.0)
            {
                return Err(bad(
                    &mix_key,
                    format!("{v}: only YaRN's own ramp (1, or below 0 for it) is computed"),
                ));
            }
            let original = number("rope.scaling.original_context_length")?.ok_or_else(|| {
                bad(
                    &key("rope.scaling.original_context_length"),
                    "missing".into(),
                )
            })?;
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original as usize,
                beta_fast: number("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: number("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                // The converter writes transformers' `attention_factor` here when the model
                // sets one; otherwise transformers' default.
                attention_factor: number("rope.scaling.yarn_attn_factor")?
                    .unwrap_or_else(|| RopeScaling::yarn_mscale(factor, 1.0)),
                // llama.cpp rounds the ramp's ends to whole dimensions.
                truncate: true,
            }
        }
        other => {
            return Err(bad(
                &key("rope.scaling.type"),
                format!("{other:?}; ringbench reads none, linear and yarn from GGUF"),
            ));
        }
    };
    if file.tensor(ROPE_FREQS).is_err() {
        return Ok(scaling);
    }
    if scaling != RopeScaling::Default {
        return Err(GgufError::BadTensor {
            path: file.path().to_path_buf(),
            tensor: ROPE_FREQS.into(),
            what: format!(
                "per-frequency factors on top of rope.scaling.type {kind:?} are not computed"
            ),
        });
    }
    let factors = tensor_values(file, ROPE_FREQS, &[head_dim / 2])?;
    let factors: Vec<f64> = factors.into_iter().map(f64::from).collect();
    Ok(RopeScaling::FrequencyFactors {
        factors: FrequencyFactors::new(&factors),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter's permutation (each head's rows reshaped `[2, hd/2]`, transposed),
    /// applied and then undone, gives the rows back.
    #[test]
    fn rotary_rows_come_back_in_hugging_faces_order() {
        let (heads, hd, cols) = (3, 8, 2);
        let hf: Vec<f32> = (0..heads * hd * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0.0f32; hf.len()];
        for h in 0..heads {
            for i in 0..2 {
                for j in 0..hd / 2 {
                    let from = (h * hd + i * hd / 2 + j) * cols;
                    let to = (h * hd + 2 * j + i) * cols;
                    gguf[to..to + cols].copy_from_slice(&hf[from..from + cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(rotary_rows_back(&gguf, heads, hd, cols), hf);
    }
}
