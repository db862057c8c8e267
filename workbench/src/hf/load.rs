//! A Hugging Face model directory read into a [`Llama`]: `config.json`, then the weights of
//! `model.safetensors` or of the shards a `model.safetensors.index.json` names, each file
//! memory-mapped and each tensor checked (shape, element type, finite values) and converted to f32
//! one at a time, so that only the model's own copy of the weights is ever held.

use crate::hf::config::HfConfig;
use crate::hf::error::HfError;
use crate::hf::names::{LayerNames, TensorRole};
use crate::model::Llama;
use crate::model::llama::LlamaConfig;
use crate::model::weights::DecoderLayer;
use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The single-file weights.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The sharded weights' index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Reads the Hugging Face model in `dir` onto `device`: its config and its weights, in f32.
pub fn load_model<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, HfConfig), HfError> {
    if !dir.is_dir() {
        return Err(HfError::Weights {
            path: dir.to_path_buf(),
            what: "no such model directory".into(),
        });
    }
    let config = HfConfig::read(&dir.join("config.json"))?;
    let wanted = wanted_tensors(&config.model);
    let mut loaded: HashMap<String, Tensor<B, 1>> = HashMap::with_capacity(wanted.len());
    for (file, names) in files_of(dir, &wanted)? {
        read_file(&file, &names, &wanted, device, &mut loaded)?;
    }
    let model = assemble(&config.model, &mut loaded, device);
    Ok((model, config))
}

/// Every tensor the model needs: its name and the shape Hugging Face stores it in.
fn wanted_tensors(m: &LlamaConfig) -> BTreeMap<String, Vec<usize>> {
    let (d, hd, f) = (m.d_model, m.head_dim(), m.ffn_hidden());
    let (q, kv) = (m.heads * hd, m.kv_heads * hd);
    let mut wanted = BTreeMap::new();
    wanted.insert(LayerNames::EMBED.to_string(), vec![m.vocab, d]);
    wanted.insert(LayerNames::NORM.to_string(), vec![d]);
    if !m.tie_embeddings {
        wanted.insert(LayerNames::HEAD.to_string(), vec![m.vocab, d]);
    }
    for layer in 0..m.layers {
        let names = LayerNames(layer);
        for role in TensorRole::ALL {
            let shape = match role {
                TensorRole::AttnNorm | TensorRole::FfnNorm => vec![d],
                TensorRole::Q => vec![q, d],
                TensorRole::K | TensorRole::V => vec![kv, d],
                TensorRole::O => vec![d, q],
                TensorRole::Gate | TensorRole::Up => vec![f, d],
                TensorRole::Down => vec![d, f],
                TensorRole::QBias if m.qkv_bias => vec![q],
                TensorRole::KBias | TensorRole::VBias if m.qkv_bias => vec![kv],
                TensorRole::QBias | TensorRole::KBias | TensorRole::VBias => continue,
            };
            wanted.insert(names.of(role), shape);
        }
    }
    wanted
}

/// Which file holds each wanted tensor: `model.safetensors`, or the shards the index maps them to
/// (every shard checked to exist before any is read).
fn files_of(
    dir: &Path,
    wanted: &BTreeMap<String, Vec<usize>>,
) -> Result<BTreeMap<PathBuf, Vec<String>>, HfError> {
    let index = dir.join(INDEX_FILE);
    let single = dir.join(WEIGHTS_FILE);
    let mut files: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    if !index.exists() {
        if !single.exists() {
            return Err(HfError::Weights {
                path: dir.to_path_buf(),
                what: format!("neither {WEIGHTS_FILE} nor {INDEX_FILE} is there"),
            });
        }
        files.insert(single, wanted.keys().cloned().collect());
        return Ok(files);
    }
    let text = std::fs::read_to_string(&index).map_err(|e| HfError::io(&index, e))?;
    let bad = |what: String| HfError::Weights {
        path: index.clone(),
        what,
    };
    let parsed: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Some(map) = parsed.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(bad("no weight_map object".into()));
    };
    for name in wanted.keys() {
        let Some(file) = map.get(name).and_then(|f| f.as_str()) else {
            return Err(HfError::MissingTensor {
                dir: dir.to_path_buf(),
                name: name.clone(),
            });
        };
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            return Err(bad(format!("{name} maps to {file}, outside the directory")));
        }
        files.entry(dir.join(file)).or_default().push(name.clone());
    }
    if let Some(missing) = files.keys().find(|f| !f.exists()) {
        return Err(bad(format!(
            "names shard {}, which is not there",
            missing.file_name().unwrap_or_default().to_string_lossy()
        )));
    }
    Ok(files)
}

/// Reads `names` from one safetensors `file` (memory-mapped) into `loaded`, each checked against
/// its wanted shape and converted to f32 in our layout (a projection transposed to `[in, out]`).
fn read_file<B: Backend>(
    file: &Path,
    names: &[String],
    wanted: &BTreeMap<String, Vec<usize>>,
    device: &B::Device,
    loaded: &mut HashMap<String, Tensor<B, 1>>,
) -> Result<(), HfError> {
    let handle = std::fs::File::open(file).map_err(|e| HfError::io(file, e))?;
    // SAFETY: the map is only read, and only while this function runs; a file changed under it
    // by another process gives wrong values, not unsoundness the checks below could not see.
    let mapped = unsafe { memmap2::Mmap::map(&handle) }.map_err(|e| HfError::io(file, e))?;
    let tensors = SafeTensors::deserialize(&mapped).map_err(|e| HfError::Weights {
        path: file.to_path_buf(),
        what: format!("not a whole safetensors file ({e})"),
    })?;
    for name in names {
        let view = tensors.tensor(name).map_err(|_| HfError::MissingTensor {
            dir: file.parent().unwrap_or(file).to_path_buf(),
            name: name.clone(),
        })?;
        let expected = &wanted[name];
        if view.shape() != expected.as_slice() {
            return Err(HfError::Shape {
                path: file.to_path_buf(),
                name: name.clone(),
                expected: expected.clone(),
                got: view.shape().to_vec(),
            });
        }
        let values = to_f32(view.dtype(), view.data()).ok_or_else(|| HfError::Dtype {
            path: file.to_path_buf(),
            name: name.clone(),
            dtype: format!("{:?}", view.dtype()),
        })?;
        if let Some(index) = values.iter().position(|x| !x.is_finite()) {
            return Err(HfError::NonFinite {
                path: file.to_path_buf(),
                name: name.clone(),
                index,
                value: values[index],
            });
        }
        // Hugging Face's projections are [out, in]; Burn's Linear holds [in, out].
        let values = match expected.as_slice() {
            [rows, cols] if LayerNames::is_projection(name) => transpose(&values, *rows, *cols),
            _ => values,
        };
        let len = values.len();
        let tensor = Tensor::from_data(TensorData::new(values, [len]), device);
        loaded.insert(name.clone(), tensor);
    }
    Ok(())
}

/// Little-endian elements of `dtype` as f32 (F64 rounded); `None` for a type that is not a float.
pub(crate) fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        _ => return None,
    })
}

/// `[rows, cols]` row-major as `[cols, rows]` row-major.
pub(crate) fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// The model from its loaded tensors, by their Hugging Face names, projections already `[in, out]`
/// (each taken out of `loaded`; a GGUF file's tensors are assembled here too).
pub(crate) fn assemble<B: Backend>(
    m: &LlamaConfig,
    loaded: &mut HashMap<String, Tensor<B, 1>>,
    device: &B::Device,
) -> Llama<B> {
    let mut take = |name: &str| loaded.remove(name).expect("every wanted tensor was loaded");
    let (d, hd, f) = (m.d_model, m.head_dim(), m.ffn_hidden());
    let (q, kv) = (m.heads * hd, m.kv_heads * hd);
    let matrix =
        |t: Tensor<B, 1>, rows: usize, cols: usize| Param::from_tensor(t.reshape([rows, cols]));
    let norm = |gamma: Tensor<B, 1>| RmsNorm {
        gamma: Param::from_tensor(gamma),
        epsilon: m.norm_eps,
    };
    let embed = Embedding {
        weight: matrix(take(LayerNames::EMBED), m.vocab, d),
    };
    let blocks = (0..m.layers)
        .map(|layer| {
            let names = LayerNames(layer);
            let mut role = |r| take(&names.of(r));
            let mut linear = |w: TensorRole, bias: Option<TensorRole>, i, o| Linear {
                weight: matrix(role(w), i, o),
                bias: bias
                    .filter(|_| m.qkv_bias)
                    .map(|b| Param::from_tensor(role(b))),
            };
            DecoderLayer {
                wq: linear(TensorRole::Q, Some(TensorRole::QBias), d, q),
                wk: linear(TensorRole::K, Some(TensorRole::KBias), d, kv),
                wv: linear(TensorRole::V, Some(TensorRole::VBias), d, kv),
                wo: linear(TensorRole::O, None, q, d),
                w1: linear(TensorRole::Gate, None, d, f),
                w3: linear(TensorRole::Up, None, d, f),
                w2: linear(TensorRole::Down, None, f, d),
                attn_norm: norm(role(TensorRole::AttnNorm)),
                ffn_norm: norm(role(TensorRole::FfnNorm)),
                sinks: m
                    .sinks
                    .then(|| Param::from_tensor(Tensor::zeros([m.heads], device))),
                lora: None,
                bf16: None,
            }
        })
        .collect();
    let final_norm = norm(take(LayerNames::NORM));
    let head = (!m.tie_embeddings).then(|| Linear {
        weight: matrix(take(LayerNames::HEAD), d, m.vocab),
        bias: None,
    });
    Llama::from_parts(embed, blocks, final_norm, head, m.trunk())
}
