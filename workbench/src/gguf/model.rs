//! A LLaMA-family GGUF file read into a [`Llama`]: its `llama.*` metadata mapped onto the model's
//! config, its tensors dequantized one at a time, renamed to Hugging Face's names, the query and
//! key rows put back in Hugging Face's order (llama.cpp's converter interleaves each head's two
//! rotary halves), and assembled as a Hugging Face checkpoint is (`hf::assemble`).

use super::error::GgufError;
use super::file::{GgufFile, GgufValue};
use crate::hf::{LayerNames, TensorRole, assemble, transpose};
use crate::model::Llama;
use crate::model::llama::LlamaConfig;
use crate::model::rope_scaling::RopeScaling;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use std::collections::HashMap;
use std::path::Path;

/// What a GGUF file says besides the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufModel {
    /// Sizes and options of the model.
    pub config: LlamaConfig,
    /// `tokenizer.ggml.bos_token_id`, when given.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`, when given.
    pub eos: Option<u32>,
    /// `llama.context_length`, when given.
    pub context_length: Option<usize>,
    /// `tokenizer.chat_template`, when given.
    pub chat_template: Option<String>,
}

/// The architectures read (`general.architecture`).
const ARCHITECTURES: [&str; 1] = ["llama"];

/// What the GGUF file at `path` says of its model (its header and metadata only; no tensor is read).
pub fn read_gguf_model(path: &Path) -> Result<GgufModel, GgufError> {
    model_of(&GgufFile::open(path)?)
}

/// Reads the GGUF model at `path` onto `device`, in f32.
pub fn load_gguf_model<B: Backend>(
    path: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, GgufModel), GgufError> {
    let file = GgufFile::open(path)?;
    let info = model_of(&file)?;
    let m = &info.config;
    let hd = m.head_dim();
    let mut loaded: HashMap<String, Tensor<B, 1>> = HashMap::new();
    let mut load = |gguf: &str, hf: &str, shape: &[usize], unpermute: Option<usize>| {
        let values = tensor_values(&file, gguf, shape)?;
        let values = match unpermute {
            Some(heads) => rotary_rows_back(&values, heads, hd, shape[1]),
            None => values,
        };
        // Stored [out, in] as Hugging Face's; Burn's Linear holds [in, out].
        let values = match shape {
            [rows, cols] if LayerNames::is_projection(hf) => transpose(&values, *rows, *cols),
            _ => values,
        };
        let len = values.len();
        loaded.insert(
            hf.to_owned(),
            Tensor::from_data(TensorData::new(values, [len]), device),
        );
        Ok::<(), GgufError>(())
    };
    let (d, f) = (m.d_model, m.ffn_hidden());
    let (q, kv) = (m.heads * hd, m.kv_heads * hd);
    load("token_embd.weight", LayerNames::EMBED, &[m.vocab, d], None)?;
    load("output_norm.weight", LayerNames::NORM, &[d], None)?;
    if !m.tie_embeddings {
        load("output.weight", LayerNames::HEAD, &[m.vocab, d], None)?;
    }
    for layer in 0..m.layers {
        let names = LayerNames(layer);
        let blk = |suffix: &str| format!("blk.{layer}.{suffix}.weight");
        let tensors: [(&str, TensorRole, Vec<usize>, Option<usize>); 9] = [
            ("attn_norm", TensorRole::AttnNorm, vec![d], None),
            ("attn_q", TensorRole::Q, vec![q, d], Some(m.heads)),
            ("attn_k", TensorRole::K, vec![kv, d], Some(m.kv_heads)),
            ("attn_v", TensorRole::V, vec![kv, d], None),
            ("attn_output", TensorRole::O, vec![d, q], None),
            ("ffn_norm", TensorRole::FfnNorm, vec![d], None),
            ("ffn_gate", TensorRole::Gate, vec![f, d], None),
            ("ffn_up", TensorRole::Up, vec![f, d], None),
            ("ffn_down", TensorRole::Down, vec![d, f], None),
        ];
        for (suffix, role, shape, unpermute) in tensors {
            load(&blk(suffix), &names.of(role), &shape, unpermute)?;
        }
    }
    let model = assemble(m, &mut loaded, device);
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

/// The model's config and tokens from the file's metadata.
fn model_of(file: &GgufFile) -> Result<GgufModel, GgufError> {
    let path = file.path().to_path_buf();
    let bad = |key: &str, what: String| GgufError::BadValue {
        path: path.clone(),
        key: key.to_owned(),
        what,
    };
    let architecture = file
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| bad("general.architecture", "missing".into()))?;
    if !ARCHITECTURES.contains(&architecture) {
        return Err(bad(
            "general.architecture",
            format!("{architecture:?}; ringbench reads {ARCHITECTURES:?}"),
        ));
    }
    let key = |name: &str| format!("{architecture}.{name}");
    let count = |name: &str| -> Result<Option<usize>, GgufError> {
        match file.get(&key(name)) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| bad(&key(name), format!("{v:?}, not a positive integer"))),
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
                .ok_or_else(|| bad(&key(name), format!("{v:?}, not a positive number"))),
        }
    };
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
    let context_length = count("context_length")?;
    config.rope_scaling = match file
        .get(&key("rope.scaling.type"))
        .and_then(GgufValue::as_str)
    {
        None | Some("none") => RopeScaling::Default,
        Some("linear") => RopeScaling::Linear {
            factor: number("rope.scaling.factor")?
                .ok_or_else(|| bad(&key("rope.scaling.factor"), "missing".into()))?,
        },
        Some(other) => {
            return Err(bad(
                &key("rope.scaling.type"),
                format!("{other:?}; ringbench reads none and linear from GGUF"),
            ));
        }
    };
    config
        .validate()
        .map_err(|e| bad(&key("attention.head_count"), e.to_string()))?;
    let token = |name: &str| {
        file.get(name)
            .and_then(GgufValue::as_u64)
            .and_then(|t| u32::try_from(t).ok())
    };
    Ok(GgufModel {
        config,
        bos: token("tokenizer.ggml.bos_token_id"),
        eos: token("tokenizer.ggml.eos_token_id"),
        context_length,
        chat_template: file
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(str::to_owned),
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
