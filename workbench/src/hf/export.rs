//! A [`Llama`] written as a Hugging Face model directory that transformers'
//! `AutoModelForCausalLM` loads: `config.json` and `model.safetensors` (f32, projections `[out, in]`),
//! each tensor read from the device only when the file writer reaches it.

use crate::hf::config::HfConfig;
use crate::hf::error::HfError;
use crate::hf::load::{WEIGHTS_FILE, transpose};
use crate::hf::names::{LayerNames, TensorRole};
use crate::host::HostRead;
use crate::model::Llama;
use burn::tensor::Tensor;
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::path::Path;

/// One tensor to write: its Hugging Face shape, and the model's tensor (flat), transposed from
/// `[in, out]` when it is a projection.
struct Pending<B: HostRead> {
    shape: Vec<usize>,
    tensor: Tensor<B, 1>,
    transposed: bool,
}

impl<B: HostRead> View for Pending<B> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let values = B::to_host(self.tensor.clone());
        let values = match (self.transposed, self.shape.as_slice()) {
            // Ours is [in, out] = [cols, rows] of the [rows, cols] written.
            (true, [rows, cols]) => transpose(&values, *cols, *rows),
            _ => values,
        };
        Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn data_len(&self) -> usize {
        4 * self.shape.iter().product::<usize>()
    }
}

/// Writes `model` with `config` into `dir` (created): `config.json` and `model.safetensors`.
pub fn export_model<B: HostRead>(
    model: &Llama<B>,
    config: &HfConfig,
    dir: &Path,
) -> Result<(), HfError> {
    let config_path = dir.join("config.json");
    let json = config.to_json(&config_path)?;
    std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;
    let mut tensors: Vec<(String, Pending<B>)> = Vec::new();
    // A projection is held [in, out] and written [out, in]; anything else as it is.
    let mut matrix = |name: String, tensor: Tensor<B, 2>, transposed: bool| {
        let [a, b] = tensor.dims();
        let shape = if transposed { vec![b, a] } else { vec![a, b] };
        let tensor = tensor.reshape([a * b]);
        let pending = Pending {
            shape,
            tensor,
            transposed,
        };
        tensors.push((name, pending));
    };
    matrix(LayerNames::EMBED.into(), model.embed.weight.val(), false);
    if let Some(head) = &model.head {
        matrix(LayerNames::HEAD.into(), head.weight.val(), true);
    }
    let mut vectors: Vec<(String, Tensor<B, 1>)> =
        vec![(LayerNames::NORM.into(), model.norm.gamma.val())];
    for (i, block) in model.blocks.iter().enumerate() {
        let names = LayerNames(i);
        let linears = [
            (TensorRole::Q, Some(TensorRole::QBias), &block.wq),
            (TensorRole::K, Some(TensorRole::KBias), &block.wk),
            (TensorRole::V, Some(TensorRole::VBias), &block.wv),
            (TensorRole::O, None, &block.wo),
            (TensorRole::Gate, None, &block.w1),
            (TensorRole::Up, None, &block.w3),
            (TensorRole::Down, None, &block.w2),
        ];
        for (role, bias_role, linear) in linears {
            matrix(names.of(role), linear.weight.val(), true);
            if let (Some(bias_role), Some(bias)) = (bias_role, &linear.bias) {
                vectors.push((names.of(bias_role), bias.val()));
            }
        }
        vectors.push((names.of(TensorRole::AttnNorm), block.attn_norm.gamma.val()));
        vectors.push((names.of(TensorRole::FfnNorm), block.ffn_norm.gamma.val()));
    }
    for (name, tensor) in vectors {
        let shape = tensor.dims().to_vec();
        let pending = Pending {
            shape,
            tensor,
            transposed: false,
        };
        tensors.push((name, pending));
    }
    let file = dir.join(WEIGHTS_FILE);
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors, Some(metadata), &file).map_err(|e| {
        HfError::Weights {
            path: file.clone(),
            what: format!("writing: {e}"),
        }
    })?;
    let text = serde_json::to_string_pretty(&json).expect("JSON of a config");
    std::fs::write(&config_path, text + "\n").map_err(|e| HfError::io(&config_path, e))?;
    Ok(())
}
