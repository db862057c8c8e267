//! PEFT's LoRA adapter directory, written and read: `adapter_config.json` (PEFT's `LoraConfig`)
//! and `adapter_model.safetensors`, whose keys are the base model's module names under
//! `base_model.model.`: `…self_attn.q_proj.lora_A.weight` `[r, in]` and `lora_B.weight` `[out, r]`
//! (the transposes of the model's `A: [in, r]`, `B: [r, out]`), and the tensors of
//! `modules_to_save` (trained norms, a trained embedding) under their own names. What
//! `peft.PeftModel.from_pretrained(base, dir)` loads, and what it writes, read back onto any
//! LLaMA-family base (a Hugging Face directory or a GGUF file). A setting that changes what the
//! adapter computes and is not computed here (DoRA, a bias, per-module ranks) is refused by name.

use crate::hf::config::{rope_json, rope_scaling_of};
use crate::hf::error::HfError;
use crate::hf::load::{to_f32, transpose};
use crate::hf::names::{LayerNames, TensorRole};
use crate::host::HostRead;
use crate::model::Llama;
use crate::model::llama::LlamaConfig;
use crate::model::lora::{LayerLora, LoraConfig, LoraInit, LoraPair, LoraTarget};
use crate::model::rope_scaling::RopeScaling;
use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::SafeTensors;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// The adapter's settings.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's tensors.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The RoPE the adapter was trained with, where it is not its base's (a raised base, a context
/// extension): `{"rope_theta", "rope_scaling"}` as config.json holds them. PEFT's format has no
/// place for it (a peft user sets them on the base's config); `--adapter` applies it.
pub const ADAPTER_ROPE: &str = "adapter_rope.json";
/// What PEFT puts before a base model's module names.
const PREFIX: &str = "base_model.model.";

/// `modules_to_save` names: the final norm, each layer's two norms, the token embedding.
const NORMS: [&str; 3] = ["norm", "input_layernorm", "post_attention_layernorm"];
const EMBED: &str = "embed_tokens";

/// The Hugging Face tensor role of a target.
fn role(target: LoraTarget) -> TensorRole {
    match target {
        LoraTarget::Q => TensorRole::Q,
        LoraTarget::K => TensorRole::K,
        LoraTarget::V => TensorRole::V,
        LoraTarget::O => TensorRole::O,
        LoraTarget::Gate => TensorRole::Gate,
        LoraTarget::Up => TensorRole::Up,
        LoraTarget::Down => TensorRole::Down,
    }
}

/// The adapter tensors' keys of `target` in `layer`: `lora_A` and `lora_B`.
fn pair_keys(layer: usize, target: LoraTarget) -> [String; 2] {
    let module = LayerNames(layer).of(role(target));
    let module = module.strip_suffix(".weight").unwrap_or(&module);
    ["lora_A", "lora_B"].map(|m| format!("{PREFIX}{module}.{m}.weight"))
}

/// The key of a saved module's tensor (a norm's weight, the embedding).
fn saved_key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// Writes the adapters of `model` (with the settings of `config`) as a PEFT adapter directory
/// `dir`: its trained norms and embedding as `modules_to_save`. `base` is what
/// `base_model_name_or_path` records.
pub fn write_adapter<B: HostRead>(
    model: &Llama<B>,
    config: &LoraConfig,
    base: &str,
    dir: &Path,
) -> Result<(), HfError> {
    let bad = |what: String| HfError::Config {
        path: dir.join(ADAPTER_CONFIG),
        what,
    };
    let Some(layers) = model.lora_layers() else {
        return Err(bad("the model has no LoRA adapters to write".into()));
    };
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for (i, lora) in layers.iter().enumerate() {
        for target in LoraTarget::ALL {
            let Some(pair) = lora.pair(target) else {
                continue;
            };
            let [a, b] = pair.values();
            let ([inputs, rank], [_, outputs]) = (a.dims(), b.dims());
            let [key_a, key_b] = pair_keys(i, target);
            // PEFT's lora_A is [r, in] and lora_B [out, r]: the transposes of ours.
            tensors.insert(
                key_a,
                (vec![rank, inputs], transpose(&B::to_host(a), inputs, rank)),
            );
            tensors.insert(
                key_b,
                (
                    vec![outputs, rank],
                    transpose(&B::to_host(b), rank, outputs),
                ),
            );
        }
    }
    let mut modules_to_save = Vec::new();
    if config.train_norms {
        modules_to_save.extend(NORMS);
        for (i, block) in model.blocks.iter().enumerate() {
            for (role, norm) in [
                (TensorRole::AttnNorm, &block.attn_norm),
                (TensorRole::FfnNorm, &block.ffn_norm),
            ] {
                let values = B::to_host(norm.gamma.val());
                tensors.insert(
                    saved_key(&LayerNames(i).of(role)),
                    (vec![values.len()], values),
                );
            }
        }
        let values = B::to_host(model.norm.gamma.val());
        tensors.insert(saved_key(LayerNames::NORM), (vec![values.len()], values));
    }
    if config.train_embeddings {
        modules_to_save.push(EMBED);
        let weight = model.embed.weight.val();
        let shape = weight.dims().to_vec();
        tensors.insert(saved_key(LayerNames::EMBED), (shape, B::to_host(weight)));
    }
    std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(k, (shape, values))| {
            let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (k, shape, data)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(k, shape, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                .map(|v| (k.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("an adapter tensor: {e}")))?;
    let file = dir.join(ADAPTER_WEIGHTS);
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), &file).map_err(|e| HfError::Weights {
        path: file.clone(),
        what: format!("writing: {e}"),
    })?;
    let settings = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "auto_mapping": null,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "use_rslora": config.rslora,
        "target_modules": config.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "modules_to_save": if modules_to_save.is_empty() { Value::Null } else { json!(modules_to_save) },
        "bias": "none",
        "fan_in_fan_out": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    let path = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&settings).expect("JSON of an adapter config");
    std::fs::write(&path, text + "\n").map_err(|e| HfError::io(&path, e))
}

/// Writes [`ADAPTER_ROPE`] into `dir`: the RoPE base and scaling the adapter was trained with.
pub fn write_adapter_rope(dir: &Path, theta: f64, scaling: RopeScaling) -> Result<(), HfError> {
    let path = dir.join(ADAPTER_ROPE);
    let scaling = rope_json(scaling).ok_or_else(|| HfError::Config {
        path: path.clone(),
        what: format!(
            "RoPE scaling {} (a GGUF file's rope_freqs.weight) has no config.json form",
            scaling.name()
        ),
    })?;
    let text = serde_json::to_string_pretty(&json!({"rope_theta": theta, "rope_scaling": scaling}))
        .expect("JSON of a RoPE");
    std::fs::write(&path, text + "\n").map_err(|e| HfError::io(&path, e))
}

/// The RoPE base and scaling [`ADAPTER_ROPE`] in `dir` gives, if the adapter has one (a scaling's
/// omitted keys get transformers' defaults, `max_positions` being the base's length).
pub fn read_adapter_rope(
    dir: &Path,
    max_positions: Option<usize>,
) -> Result<Option<(f64, RopeScaling)>, HfError> {
    let path = dir.join(ADAPTER_ROPE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| HfError::io(&path, e))?;
    let bad = |what: String| HfError::Config {
        path: path.clone(),
        what,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let theta = value
        .get("rope_theta")
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && *t > 1.0)
        .ok_or_else(|| bad("rope_theta: missing, or not a number above 1".into()))?;
    let scaling = match value.get("rope_scaling") {
        None | Some(Value::Null) => RopeScaling::Default,
        Some(Value::Object(object)) => rope_scaling_of(&path, object, max_positions)?,
        Some(other) => return Err(bad(format!("rope_scaling = {other}: an object or null"))),
    };
    Ok(Some((theta, scaling)))
}

/// A PEFT adapter read for a base model: its settings and each layer's adapters, and the saved
/// modules' values (norms, embedding) by their Hugging Face names.
pub struct Adapter<B: Backend> {
    /// The settings (`train_norms`, `train_embeddings`: what `modules_to_save` holds).
    pub config: LoraConfig,
    /// Each layer's adapters.
    pub layers: Vec<LayerLora<B>>,
    /// The saved modules' tensors (their values replace the base's), by Hugging Face name.
    pub saved: BTreeMap<String, Tensor<B, 1>>,
}

/// The settings that change what an adapter computes and are not computed here, with the value
/// each must have (absent, null, false, empty).
const REFUSED: [&str; 12] = [
    "use_dora",
    "lora_bias",
    "fan_in_fan_out",
    "layers_to_transform",
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "alora_invocation_tokens",
    "use_qalora",
    "use_bdlora",
    "rank_pattern",
    "alpha_pattern",
];

/// Reads the PEFT adapter in `dir` for a base model of `model` sizes onto `device`: its settings
/// checked, every tensor named, shaped and finite, and every tensor in the file used.
pub fn read_adapter<B: Backend>(
    dir: &Path,
    model: &LlamaConfig,
    device: &B::Device,
) -> Result<Adapter<B>, HfError> {
    let config_path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&config_path).map_err(|e| HfError::io(&config_path, e))?;
    let bad = |key: &str, what: String| HfError::Config {
        path: config_path.clone(),
        what: format!("{key}: {what}"),
    };
    let settings: serde_json::Map<String, Value> = match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(bad("(the file)", "not a JSON object".into())),
        Err(e) => return Err(bad("(the file)", format!("not JSON: {e}"))),
    };
    let get = |key: &str| settings.get(key).filter(|v| !v.is_null());
    match get("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        _ => {
            let found = get("peft_type").map_or("absent".into(), Value::to_string);
            return Err(bad(
                "peft_type",
                format!("{found}: ringbench reads LoRA adapters (\"LORA\")"),
            ));
        }
    }
    for key in REFUSED {
        let set = match get(key) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Object(m)) => !m.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(bad(
                key,
                format!("{}: not computed here", get(key).expect("set")),
            ));
        }
    }
    if let Some(bias) = get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(bad("bias", format!("{bias:?}: only \"none\" is computed")));
    }
    let rank = get("r")
        .and_then(Value::as_u64)
        .filter(|&r| r > 0)
        .ok_or_else(|| bad("r", "missing or not a positive integer".into()))?
        as usize;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("lora_alpha", "missing or not a number".into()))?;
    let rslora = get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
    let targets = match get("target_modules") {
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| {
                n.as_str()
                    .ok_or_else(|| bad("target_modules", format!("{n} is not a name")))
                    .and_then(|n| {
                        LoraTarget::from_name(n).map_err(|_| {
                            bad(
                                "target_modules",
                                format!("{n:?} is not a linear map of a LLaMA-family layer"),
                            )
                        })
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(bad(
                "target_modules",
                format!("{other:?}: a list of module names is read (not a pattern)"),
            ));
        }
    };
    let (mut train_norms, mut train_embeddings) = (false, false);
    if let Some(Value::Array(saved)) = get("modules_to_save") {
        for name in saved {
            match name.as_str() {
                Some(n) if NORMS.contains(&n) => train_norms = true,
                Some(EMBED) => train_embeddings = true,
                _ => {
                    return Err(bad(
                        "modules_to_save",
                        format!("{name}: ringbench restores norms and embed_tokens"),
                    ));
                }
            }
        }
    }
    let config = LoraConfig {
        rank,
        alpha,
        // Inference runs without dropout; a run that continues training sets its own.
        dropout: 0.0,
        targets,
        rslora,
        train_embeddings,
        train_norms,
        init: LoraInit::Peft,
    };
    config
        .validate()
        .map_err(|e| bad("(the settings)", e.to_string()))?;
    let file = dir.join(ADAPTER_WEIGHTS);
    let handle = std::fs::File::open(&file).map_err(|e| HfError::io(&file, e))?;
    // SAFETY: as in `load.rs`: only read, only while this function runs.
    let mapped = unsafe { memmap2::Mmap::map(&handle) }.map_err(|e| HfError::io(&file, e))?;
    let tensors = SafeTensors::deserialize(&mapped).map_err(|e| HfError::Weights {
        path: file.clone(),
        what: format!("not a whole safetensors file ({e})"),
    })?;
    let mut unread: std::collections::BTreeSet<String> =
        tensors.names().into_iter().map(str::to_owned).collect();
    let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f32>, HfError> {
        let view = tensors.tensor(name).map_err(|_| HfError::MissingTensor {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
        })?;
        if view.shape() != shape {
            return Err(HfError::Weights {
                path: file.clone(),
                what: format!(
                    "tensor {name} has shape {:?}; r = {rank} and the base model give {shape:?}",
                    view.shape()
                ),
            });
        }
        let values = to_f32(view.dtype(), view.data()).ok_or_else(|| HfError::Dtype {
            path: file.clone(),
            name: name.to_owned(),
            dtype: format!("{:?}", view.dtype()),
        })?;
        if let Some(index) = values.iter().position(|x| !x.is_finite()) {
            return Err(HfError::NonFinite {
                path: file.clone(),
                name: name.to_owned(),
                index,
                value: values[index],
            });
        }
        unread.remove(name);
        Ok(values)
    };
    let (d, hd, f) = (model.d_model, model.head_dim(), model.ffn_hidden());
    let (q, kv) = (model.heads * hd, model.kv_heads * hd);
    let dims = |target: LoraTarget| match target {
        LoraTarget::Q => (d, q),
        LoraTarget::K | LoraTarget::V => (d, kv),
        LoraTarget::O => (q, d),
        LoraTarget::Gate | LoraTarget::Up => (d, f),
        LoraTarget::Down => (f, d),
    };
    let mut layers = Vec::with_capacity(model.layers);
    for layer in 0..model.layers {
        let mut pairs: Vec<Option<LoraPair<B>>> =
            (0..LoraTarget::ALL.len()).map(|_| None).collect();
        for &target in &config.targets {
            let (inputs, outputs) = dims(target);
            let [key_a, key_b] = pair_keys(layer, target);
            let a = transpose(&take(&key_a, &[rank, inputs])?, rank, inputs);
            let b = transpose(&take(&key_b, &[outputs, rank])?, outputs, rank);
            pairs[target.index()] =
                Some(LoraPair::from_values(a, b, [inputs, rank, outputs], device));
        }
        layers.push(LayerLora::from_pairs(pairs, config.scale()));
    }
    let mut saved = BTreeMap::new();
    let mut restore = |name: &str, shape: &[usize]| -> Result<(), HfError> {
        let values = take(&saved_key(name), shape)?;
        let len = values.len();
        saved.insert(
            name.to_owned(),
            Tensor::from_data(TensorData::new(values, [len]), device),
        );
        Ok(())
    };
    if train_norms {
        for layer in 0..model.layers {
            for role in [TensorRole::AttnNorm, TensorRole::FfnNorm] {
                restore(&LayerNames(layer).of(role), &[d])?;
            }
        }
        restore(LayerNames::NORM, &[d])?;
    }
    if train_embeddings {
        restore(LayerNames::EMBED, &[model.vocab, d])?;
    }
    if let Some(extra) = unread.into_iter().next() {
        return Err(HfError::Weights {
            path: file,
            what: format!(
                "tensor {extra} is not an adapter of {} ({} layers): refused rather than left unread",
                config
                    .targets
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                model.layers
            ),
        });
    }
    Ok(Adapter {
        config,
        layers,
        saved,
    })
}

impl<B: Backend> Llama<B> {
    /// The model with a PEFT adapter on it: its adapters on the layers, its saved norms and
    /// embedding in place of the base's (trainable, as the adapter says), the rest frozen.
    pub fn with_peft(self, adapter: Adapter<B>) -> Result<Self, HfError> {
        let Adapter {
            config,
            layers,
            mut saved,
        } = adapter;
        let mut model = self;
        let mut replace = |name: &str, param: &mut Param<Tensor<B, 1>>| {
            if let Some(values) = saved.remove(name) {
                *param = Param::from_tensor(values);
            }
        };
        for (i, block) in model.blocks.iter_mut().enumerate() {
            replace(
                &LayerNames(i).of(TensorRole::AttnNorm),
                &mut block.attn_norm.gamma,
            );
            replace(
                &LayerNames(i).of(TensorRole::FfnNorm),
                &mut block.ffn_norm.gamma,
            );
        }
        replace(LayerNames::NORM, &mut model.norm.gamma);
        if let Some(embed) = saved.remove(LayerNames::EMBED) {
            let [vocab, d] = model.embed.weight.dims();
            model.embed.weight = Param::from_tensor(embed.reshape([vocab, d]));
        }
        Ok(model.with_adapters(layers, &config)?)
    }
}
