//! What a line-retrieval model starts from and is saved as: the project's own model (a seeded init,
//! its piece tokenizer, `model.mpk`) or a Hugging Face directory (its weights, config and
//! tokenizer.json, saved back as a Hugging Face directory that transformers loads).

use super::checkpoint::{load_checkpoint, save_checkpoint};
use super::spec::ModelSpec;
use crate::pretrained::{
    TOKENIZER_FILES, is_gguf, load_pretrained, pretrained_config, pretrained_tokenizer,
    with_adapter,
};
use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use datasets::{HfText, TextTokenizer, Tokenizer};
use std::path::{Path, PathBuf};
use workbench::gguf::load_gguf_model;
use workbench::hf::{
    HfConfig, export_model, load_model, read_adapter, write_adapter, write_adapter_rope,
};
use workbench::model::lazy::seeded;
use workbench::model::{Llama, LlamaConfig, LoraConfig};
use workbench::train::{flat_params, with_flat_params};
use workbench::{HostRead, LayerBackend};

/// A training run's model source, its config and its tokenizer.
#[derive(Debug)]
pub enum Start {
    /// The project's own model, drawn from a seed.
    Own {
        /// Its config (the spec's sizes, the piece tokenizer's vocabulary).
        config: LlamaConfig,
        /// The piece tokenizer.
        tokenizer: Tokenizer,
    },
    /// A Hugging Face model's weights.
    Hf {
        /// Its directory.
        dir: PathBuf,
        /// Its config, with the spec's chunking and checkpointing.
        config: HfConfig,
        /// Its tokenizer with its BOS and EOS (boxed: HF's tokenizer is large).
        tokenizer: Box<HfText>,
    },
}

/// The Hugging Face tokenizer of `dir` (a directory's tokenizer.json, or a GGUF file's vocabulary)
/// with its BOS and EOS, as a transformers user gets them:
/// the BOS its post-processor adds (none when it adds none, whatever config.json's `bos_token_id`
/// says), and config.json's first `eos_token_id`, else the tokenizer's `eos_token` (a reply ends
/// with it).
pub fn hf_text(dir: &Path, config: &HfConfig) -> Result<HfText> {
    let Some(tokenizer) = pretrained_tokenizer(dir)? else {
        bail!("{}: no tokenizer.json", dir.display());
    };
    let eos = match config.eos.first() {
        Some(&eos) => eos,
        None => tokenizer.named_token("eos_token")?.ok_or_else(|| {
            anyhow::anyhow!(
                "{}: neither config.json's eos_token_id nor the tokenizer's eos_token names an end \
                 token: a line-retrieval reply ends with it",
                dir.display()
            )
        })?,
    };
    let bos = match tokenizer.prefix()?.as_slice() {
        [] => None,
        [bos] => Some(*bos),
        more => bail!(
            "{}: the tokenizer puts {} tokens ({more:?}) before a text; one BOS at most is supported",
            dir.display(),
            more.len()
        ),
    };
    if tokenizer.vocab_size() > config.model.vocab {
        bail!(
            "{}: tokenizer.json has {} tokens but config.json's vocab_size is {}",
            dir.display(),
            tokenizer.vocab_size(),
            config.model.vocab
        );
    }
    Ok(HfText {
        tokenizer,
        bos,
        eos,
    })
}

impl Start {
    /// The source `[model]` names.
    pub fn of(spec: &ModelSpec) -> Result<Self> {
        match &spec.hf {
            None => {
                let tokenizer = Tokenizer::line_retrieval();
                let config = spec.config(tokenizer.vocab_size())?;
                config.validate()?;
                Ok(Start::Own { config, tokenizer })
            }
            Some(dir) => {
                let config = spec.hf_config(dir)?;
                let tokenizer = Box::new(hf_text(dir, &config)?);
                Ok(Start::Hf {
                    dir: dir.clone(),
                    config,
                    tokenizer,
                })
            }
        }
    }

    /// The model's config as it trains.
    pub fn config(&self) -> &LlamaConfig {
        match self {
            Start::Own { config, .. } => config,
            Start::Hf { config, .. } => &config.model,
        }
    }

    /// The tokenizer prompts are written with.
    pub fn tokenizer(&self) -> &dyn TextTokenizer {
        match self {
            Start::Own { tokenizer, .. } => tokenizer,
            Start::Hf { tokenizer, .. } => &**tokenizer,
        }
    }

    /// The starting weights: drawn from `seed`, or read from the Hugging Face directory or GGUF
    /// file.
    pub fn weights<B: LayerBackend>(&self, seed: u64, device: &B::Device) -> Result<Llama<B>> {
        match self {
            Start::Own { config, .. } => Ok(drawn_on_host::<B>(config, seed, device)),
            Start::Hf { dir, config, .. } => {
                let (model, _) = load_pretrained::<B>(dir, None, device)?;
                Ok(model.with_trunk_of(&config.model))
            }
        }
    }

    /// The starting weights with a LoRA run's adapters: new ones drawn from `seed`, or, from
    /// `init` (a PEFT adapter directory: an earlier stage's, or peft's), that adapter, its settings
    /// the spec's own.
    pub fn adapted<B: LayerBackend>(
        &self,
        lora: &LoraConfig,
        init: Option<&Path>,
        seed: u64,
        device: &B::Device,
    ) -> Result<Llama<B>> {
        let model = self.weights::<B>(seed, device)?;
        let Some(dir) = init else {
            return Ok(model.with_lora(lora, seed)?);
        };
        let adapter = read_adapter::<B>(dir, self.config(), device)
            .with_context(|| format!("train.init = {}", dir.display()))?;
        let theirs = &adapter.config;
        // Everything but dropout and init (which only a new adapter reads) must agree.
        let settings = |a: &LoraConfig| {
            let mut targets = a.targets.clone();
            targets.sort();
            let flags = (a.rslora, a.train_norms, a.train_embeddings);
            (a.rank, a.alpha, targets, flags)
        };
        if settings(theirs) != settings(lora) {
            bail!(
                "train.init = {}: its adapter (r = {}, alpha = {}, targets {:?}, rslora {}, \
                 norms {}, embeddings {}) is not the spec's [lora] (r = {}, alpha = {}, \
                 targets {:?}, rslora {}, norms {}, embeddings {})",
                dir.display(),
                theirs.rank,
                theirs.alpha,
                theirs.targets,
                theirs.rslora,
                theirs.train_norms,
                theirs.train_embeddings,
                lora.rank,
                lora.alpha,
                lora.targets,
                lora.rslora,
                lora.train_norms,
                lora.train_embeddings
            );
        }
        Ok(model.with_peft(adapter)?)
    }

    /// Writes the trained `model` into `dir`: `model.mpk`, `config.json` and the piece tokenizer,
    /// or a Hugging Face directory (config.json, model.safetensors, the tokenizer's files); a LoRA
    /// run's adapters as a PEFT adapter directory, with `adapter_rope.json` when it trained with
    /// another RoPE than its base's.
    pub fn save<B: HostRead>(
        &self,
        dir: &Path,
        model: &Llama<B>,
        lora: Option<&LoraConfig>,
    ) -> Result<()> {
        if let Some(lora) = lora {
            let Start::Hf {
                dir: base, config, ..
            } = self
            else {
                bail!("[lora] adapts a Hugging Face or GGUF model (model.hf)");
            };
            write_adapter(model, lora, &base.display().to_string(), dir)?;
            let own = pretrained_config(base)?.model;
            let m = &config.model;
            if (m.rope_theta, m.rope_scaling) != (own.rope_theta, own.rope_scaling) {
                write_adapter_rope(dir, m.rope_theta, m.rope_scaling)?;
            }
            return Ok(());
        }
        match self {
            Start::Own { config, tokenizer } => save_checkpoint(dir, model, config, tokenizer),
            Start::Hf {
                dir: from, config, ..
            } => {
                export_model(model, config, dir)?;
                for name in TOKENIZER_FILES {
                    if from.join(name).exists() {
                        std::fs::copy(from.join(name), dir.join(name))
                            .with_context(|| format!("copying {name} into {}", dir.display()))?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// `config`'s model with its weights drawn from `seed` by the CPU backend's generator and moved to
/// `device`: one seed gives every backend the same weights (each backend's own generator draws
/// differently: host and device), so that a run on a GPU and one on the CPU can be compared.
pub fn drawn_on_host<B: Backend>(config: &LlamaConfig, seed: u64, device: &B::Device) -> Llama<B> {
    let host = Default::default();
    let on_host = seeded::<Flex, _>(seed, &host, || config.init::<Flex>(&host));
    // The target's own draw is only a shape to fill: every value is replaced.
    with_flat_params(
        seeded::<B, _>(seed, device, || config.init::<B>(device)),
        &flat_params(&on_host),
    )
}

/// A trained model and its tokenizer: a `ringbench train` checkpoint (`model.mpk`), a Hugging
/// Face directory (one that `train` wrote from `model.hf`, or any other), or a GGUF file, with the
/// PEFT adapter in `adapter` folded into it where one is given (a Hugging Face or GGUF base).
pub fn load_trained<B: Backend>(
    dir: &Path,
    adapter: Option<&Path>,
    device: &B::Device,
) -> Result<(Llama<B>, Box<dyn TextTokenizer>)> {
    if is_gguf(dir) && dir.is_file() {
        let mut config = pretrained_config(dir)?;
        let (model, _) = load_gguf_model::<B>(dir, device)?;
        let model = with_adapter(model, &mut config, adapter, device)?;
        return Ok((model, Box::new(hf_text(dir, &config)?)));
    }
    if !dir.is_dir() {
        bail!(
            "{}: no such checkpoint directory (ringbench train writes one) or GGUF file",
            dir.display()
        );
    }
    if dir.join("model.mpk").exists() || !dir.join("config.json").exists() {
        if let Some(adapter) = adapter {
            bail!(
                "--adapter {}: a PEFT adapter goes on a Hugging Face or GGUF base, not on the \
                 ringbench checkpoint {}",
                adapter.display(),
                dir.display()
            );
        }
        let (model, _, tokenizer) = load_checkpoint::<B>(dir, device)?;
        return Ok((model, Box::new(tokenizer)));
    }
    let (model, mut config) = load_model::<B>(dir, device)?;
    let model = with_adapter(model, &mut config, adapter, device)?;
    let tokenizer = hf_text(dir, &config)?;
    Ok((model, Box::new(tokenizer)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LlamaConfig {
        LlamaConfig::new(40)
            .with_d_model(16)
            .with_layers(1)
            .with_heads(2)
            .with_kv_heads(1)
    }

    /// On the CPU the host draw is the backend's own: the weights a seed gave before are kept.
    #[test]
    fn on_the_cpu_the_host_draw_is_the_seeded_init() {
        let device = Default::default();
        let own = seeded::<Flex, _>(5, &device, || config().init::<Flex>(&device));
        let drawn = drawn_on_host::<Flex>(&config(), 5, &device);
        assert_eq!(flat_params(&drawn), flat_params(&own));
        assert_ne!(
            flat_params(&drawn_on_host::<Flex>(&config(), 6, &device)),
            flat_params(&own)
        );
    }

    /// On wgpu (whose generator draws on the device, differently) a seed gives the CPU's weights,
    /// bit for bit.
    #[cfg(feature = "wgpu")]
    #[test]
    fn one_seed_gives_every_backend_the_same_weights() {
        use workbench::backends::Wgpu;
        let device = burn::backend::wgpu::WgpuDevice::DefaultDevice;
        let cpu = drawn_on_host::<Flex>(&config(), 9, &Default::default());
        let gpu = drawn_on_host::<Wgpu>(&config(), 9, &device);
        let own = seeded::<Wgpu, _>(9, &device, || config().init::<Wgpu>(&device));
        let expected = flat_params(&cpu);
        assert_eq!(flat_params(&gpu), expected);
        // Without the host draw they differ: the test can tell.
        assert_ne!(flat_params(&own), expected);
    }
}
