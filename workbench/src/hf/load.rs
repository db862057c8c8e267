//! A Hugging Face model directory read into a [`Llama`]: `config.json`, then the weights of
//! `model.safetensors` or of the shards a `model.safetensors.index.json` names, each file
//! memory-mapped and each tensor checked (shape, element type, finite values) and converted to f32
//! in our layout in one pass (tensors in parallel), its vector becoming the model's tensor: only
//! the model's own copy of the weights is ever held.

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
use rayon::prelude::*;
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
/// its wanted shape and converted to f32 in our layout (a projection transposed to `[in, out]`) in
/// one pass over the file's bytes; the tensors are converted in parallel on rayon's pool, and each
/// conversion's vector becomes the model's tensor without a copy.
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
    let converted: Vec<(String, Vec<f32>)> = names
        .par_iter()
        .map(|name| {
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
            // Hugging Face's projections are [out, in]; Burn's Linear holds [in, out].
            let transposed = match expected.as_slice() {
                [rows, cols] if LayerNames::is_projection(name) => Some((*rows, *cols)),
                _ => None,
            };
            let dtype_error = || HfError::Dtype {
                path: file.to_path_buf(),
                name: name.clone(),
                dtype: format!("{:?}", view.dtype()),
            };
            let values = convert(view.dtype(), view.data(), transposed).ok_or_else(dtype_error)?;
            if values.iter().any(|x| !x.is_finite()) {
                // Named by its index in the file's order, as the file's reader would count.
                let in_order = to_f32(view.dtype(), view.data()).ok_or_else(dtype_error)?;
                let index = in_order.iter().position(|x| !x.is_finite()).unwrap_or(0);
                return Err(HfError::NonFinite {
                    path: file.to_path_buf(),
                    name: name.clone(),
                    index,
                    value: in_order[index],
                });
            }
            Ok((name.clone(), values))
        })
        .collect::<Result<_, HfError>>()?;
    for (name, values) in converted {
        let len = values.len();
        loaded.insert(
            name,
            Tensor::from_data(TensorData::new(values, [len]), device),
        );
    }
    Ok(())
}

/// Little-endian elements of `dtype` as f32 (F64 rounded), in the file's order; `None` for a type
/// that is not a float.
pub(crate) fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    convert(dtype, bytes, None)
}

/// Little-endian elements of `dtype` as f32 (F64 rounded) in one pass: in the file's order, or, for
/// `Some((rows, cols))`, the `[rows, cols]` matrix they hold transposed to `[cols, rows]`. `None`
/// for a type that is not a float.
fn convert(dtype: Dtype, bytes: &[u8], transposed: Option<(usize, usize)>) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => convert_with(bytes, transposed, f32::from_le_bytes),
        Dtype::F16 => convert_with(bytes, transposed, |b| half::f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => convert_with(bytes, transposed, |b| half::bf16::from_le_bytes(b).to_f32()),
        Dtype::F64 => convert_with(bytes, transposed, |b| f64::from_le_bytes(b) as f32),
        _ => return None,
    })
}

/// [`convert`] for elements of `W` bytes each, read by `decode`.
fn convert_with<const W: usize>(
    bytes: &[u8],
    transposed: Option<(usize, usize)>,
    decode: impl Fn([u8; W]) -> f32,
) -> Vec<f32> {
    let element = |b: &[u8]| decode(b.try_into().expect("a chunk of W bytes"));
    match transposed {
        None => bytes.chunks_exact(W).map(element).collect(),
        Some((rows, cols)) => {
            let mut out = vec![0.0f32; rows * cols];
            for_each_tile(rows, cols, |r, c| {
                let at = (r * cols + c) * W;
                out[c * rows + r] = element(&bytes[at..at + W]);
            });
            out
        }
    }
}

/// Side of the square tiles a transpose walks, so that the rows it reads and the rows it writes
/// both stay in the L1 cache (32 × 32 f32 is 4 KiB each way).
const TRANSPOSE_TILE: usize = 32;

/// Calls `visit(r, c)` for every element of a `[rows, cols]` matrix, tile by tile.
fn for_each_tile(rows: usize, cols: usize, mut visit: impl FnMut(usize, usize)) {
    for r0 in (0..rows).step_by(TRANSPOSE_TILE) {
        for c0 in (0..cols).step_by(TRANSPOSE_TILE) {
            for r in r0..(r0 + TRANSPOSE_TILE).min(rows) {
                for c in c0..(c0 + TRANSPOSE_TILE).min(cols) {
                    visit(r, c);
                }
            }
        }
    }
}

/// `[rows, cols]` row-major as `[cols, rows]` row-major.
pub(crate) fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for_each_tile(rows, cols, |r, c| out[c * rows + r] = values[r * cols + c]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transposing_conversion_puts_every_element_where_the_plain_transpose_does() {
        // Sizes that are no multiple of the tile, in every float type the files hold.
        let (rows, cols) = (37, 70);
        let values: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.25 - 300.0).collect();
        let f32_bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        let f64_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&x| f64::from(x).to_le_bytes())
            .collect();
        let bf16_bytes: Vec<u8> = (values.iter())
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let f16_bytes: Vec<u8> = (values.iter())
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        for (dtype, bytes) in [
            (Dtype::F32, &f32_bytes),
            (Dtype::F64, &f64_bytes),
            (Dtype::BF16, &bf16_bytes),
            (Dtype::F16, &f16_bytes),
        ] {
            let in_order = to_f32(dtype, bytes).unwrap();
            let expected: Vec<f32> = (0..cols * rows)
                .map(|i| in_order[(i % rows) * cols + i / rows])
                .collect();
            assert_eq!(convert(dtype, bytes, Some((rows, cols))).unwrap(), expected);
            assert_eq!(transpose(&in_order, rows, cols), expected);
        }
        assert_eq!(to_f32(Dtype::I32, &f32_bytes), None);
    }
}
