//! Pretrained models wherever ringbench reads one: a Hugging Face directory or a GGUF file, its
//! config (or the GGUF metadata as the same) and its weights in f32.

use anyhow::Result;
use std::path::Path;
use workbench::gguf::{load_gguf_model, read_gguf_model};
use workbench::hf::{Architecture, HfConfig, load_model};
use workbench::model::Llama;

/// Whether `path` names a GGUF file (by its extension) rather than a model directory.
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// What a pretrained model says of itself: a Hugging Face directory's config, or a GGUF file's
/// metadata as the same (a LLaMA model; its end-of-sequence and beginning tokens).
pub fn pretrained_config(path: &Path) -> Result<HfConfig> {
    if !is_gguf(path) {
        return Ok(HfConfig::read(&path.join("config.json"))?);
    }
    let info = read_gguf_model(path)?;
    Ok(HfConfig {
        architecture: Architecture::Llama,
        model: info.config,
        eos: info.eos.into_iter().collect(),
        bos: info.bos,
        max_positions: info.context_length,
    })
}

/// A pretrained model onto `device`, in f32: a Hugging Face directory, or a GGUF file (its
/// tensors dequantized).
pub fn load_pretrained<B: workbench::LayerBackend>(
    path: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, HfConfig)> {
    if !is_gguf(path) {
        return Ok(load_model::<B>(path, device)?);
    }
    let config = pretrained_config(path)?;
    let (model, _) = load_gguf_model::<B>(path, device)?;
    Ok((model, config))
}
