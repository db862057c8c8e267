//! A trained line-retrieval model on disk: `model.mpk`, `config.json`, `tokenizer.json`, checked
//! against each other when loaded.

use anyhow::{Context, Result, bail};
use burn::config::Config;
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::Backend;
use datasets::Tokenizer;
use std::path::Path;
use workbench::model::{Llama, LlamaConfig, LoraConfig};

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// Writes `model.mpk`, `config.json` and `tokenizer.json` into `dir`.
pub fn save_checkpoint<B: Backend>(
    dir: &Path,
    model: &Llama<B>,
    config: &LlamaConfig,
    tokenizer: &Tokenizer,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    model
        .clone()
        .save_file(dir.join("model"), &recorder())
        .context("saving model")?;
    config
        .save(dir.join("config.json"))
        .context("saving config")?;
    tokenizer.save(&dir.join("tokenizer.json"))?;
    Ok(())
}

/// Loads a checkpoint written by `ringbench train` onto backend `B`, checking it against its config.
pub fn load_checkpoint<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, LlamaConfig, Tokenizer)> {
    if !dir.is_dir() {
        bail!(
            "{}: no such checkpoint directory (ringbench train writes one)",
            dir.display()
        );
    }
    let config = read_config(&dir.join("config.json"))?;
    config.validate()?;
    let tokenizer = Tokenizer::load(&dir.join("tokenizer.json"))?;
    if tokenizer.vocab_size() != config.vocab {
        bail!(
            "{}: tokenizer has {} tokens but config.json says vocab = {}",
            dir.display(),
            tokenizer.vocab_size(),
            config.vocab
        );
    }
    let model = load_model_file::<B>(&dir.join("model.mpk"), &config, None, device)?;
    Ok((model, config, tokenizer))
}

/// The weights in `file` (Burn's named MessagePack) as a model of `config` on `device`; an error
/// naming the file when they do not fit it (another architecture, a parameter of another shape).
pub fn load_model_file<B: Backend>(
    file: &Path,
    config: &LlamaConfig,
    lora: Option<&LoraConfig>,
    device: &B::Device,
) -> Result<Llama<B>> {
    // A LoRA run's model holds its adapters (and the base frozen) before the record fills them.
    let fresh = match lora {
        Some(lora) => config.init::<B>(device).with_lora(lora, 0)?,
        None => config.init::<B>(device),
    };
    let expected = param_shapes(&fresh);
    let model = fresh
        .load_file(file.with_extension(""), &recorder(), device)
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: checkpoint does not match config.json: {e}",
                file.display()
            )
        })?;
    // Loading replaces parameters whatever their shapes: compare them with what the config builds.
    let found = param_shapes(&model);
    if let Some((want, got)) = expected.iter().zip(&found).find(|(a, b)| a != b) {
        bail!(
            "{}: checkpoint does not match config.json: a parameter has shape {got:?} where the config gives {want:?}",
            file.display()
        );
    }
    if expected.len() != found.len() {
        bail!(
            "{}: checkpoint does not match config.json: {} parameters, config gives {}",
            file.display(),
            found.len(),
            expected.len()
        );
    }
    Ok(model)
}

/// `config.json`; a field added to [`LlamaConfig`] after the checkpoint was written takes its
/// default (every such field is an option that does not change the weights).
fn read_config(path: &Path) -> Result<LlamaConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut found: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let Some(fields) = found.as_object_mut() else {
        bail!("{}: not a JSON object", path.display());
    };
    let defaults = serde_json::to_value(LlamaConfig::new(0))?;
    for (key, value) in defaults.as_object().into_iter().flatten() {
        if key != "vocab" {
            fields.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    serde_json::from_value(found).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Shapes of every float parameter, in module order.
fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes(Vec::new());
    module.visit(&mut shapes);
    shapes.0
}
