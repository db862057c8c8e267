//! `ringbench hf`: Hugging Face LLaMA-family models (and GGUF files) through the ring: logits of
//! token ids, the tokenizer's ids, and any checkpoint exported as a directory transformers loads;
//! generation (`generate.rs`) and perplexity by position (`ppl.rs`) have files of their own.

mod generate;
mod ppl;

use generate::GenerateOn;
pub use generate::{GenerateArgs, generate};
pub use ppl::PplArgs;
use ppl::PplOn;

use crate::backend::{BackendName, OnBackend, on_backend};
use crate::line_retrieval::load_checkpoint;
use crate::npy;
use crate::pretrained::{TOKENIZER_FILES, load_pretrained, pretrained_tokenizer};
use crate::timeline::traced;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;
use workbench::LayerBackend;
use workbench::hf::{
    ADAPTER_ROPE, Architecture, HfConfig, export_model, load_model, read_adapter, write_adapter,
};
use workbench::ring::decode::DecodeMerge;
use workbench::ring::jobs::HostTensor;
use workbench::train::{Decoding, Prompt, full_logits};

/// `ringbench hf`'s commands.
#[derive(Debug, clap::Subcommand)]
pub enum HfCommand {
    /// Logits of token ids (int32/int64 [batch, seq] .npy) through the ring: float32
    /// [batch, seq, vocab] .npy.
    Logits(LogitsArgs),
    /// Continuation through the ring's KV cache, greedy or sampled, of token ids or text prompts
    /// (through the chat template with --chat; stops at the config's eos_token_id or a --stop
    /// string): int64 [batch, new] .npy, and the text when the model has a tokenizer.
    Generate(GenerateArgs),
    /// The ids of a text by the model's tokenizer.json, as a JSON list (no special tokens added).
    Tokenize(TokenizeArgs),
    /// Perplexity by position: texts (or token ids) cut into windows of --context tokens, every
    /// next token's NLL through the ring, per RoPE scaling (the model's own, or overridden):
    /// prints mean_nll and perplexity; with --out, tables and a figure (resumable).
    Ppl(PplArgs),
    /// Writes a checkpoint (ringbench's own, or a Hugging Face directory) as a directory
    /// transformers' AutoModelForCausalLM loads.
    Export(ExportArgs),
}

/// Where the model runs.
#[derive(Debug, Clone, clap::Args)]
pub struct RingArgs {
    /// Ranks the sequence is split over.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Partition strategy by name.
    #[arg(long, default_value = "zigzag")]
    pub strategy: String,
    /// Backend: flex (CPU), wgpu or cuda.
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
}

/// `ringbench hf logits`'s arguments.
#[derive(Debug, clap::Args)]
pub struct LogitsArgs {
    /// A Hugging Face model directory (config.json, model.safetensors or its index and shards), or
    /// a LLaMA-family GGUF file (its tensors dequantized to f32).
    #[arg(long)]
    pub model: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors; trained by
    /// ringbench or by peft) folded into the model's weights.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Token ids: int32 or int64 [batch, seq].
    #[arg(long)]
    pub tokens: PathBuf,
    /// Where the ring runs.
    #[command(flatten)]
    pub ring: RingArgs,
    /// The logits, float32 [batch, seq, vocab].
    #[arg(long)]
    pub out: PathBuf,
    /// Record every rank's timeline (tiles, ring traffic, the model's layers) into this Chrome
    /// trace-event JSON file (Perfetto, chrome://tracing).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// `ringbench hf tokenize`'s arguments.
#[derive(Debug, clap::Args)]
pub struct TokenizeArgs {
    /// A directory holding tokenizer.json, or a GGUF file (its tokenizer.ggml.* vocabulary).
    #[arg(long)]
    pub model: PathBuf,
    /// The text.
    #[arg(long)]
    pub text: String,
}

/// `ringbench hf export`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// A ringbench checkpoint (model.mpk, config.json, tokenizer.json) or a Hugging Face model
    /// directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The directory to write (config.json, model.safetensors, and tokenizer.json when the
    /// checkpoint has a Hugging Face one).
    #[arg(long)]
    pub out: PathBuf,
    /// A PEFT LoRA adapter on the checkpoint (a Hugging Face directory or GGUF file): written as a
    /// PEFT adapter directory that `peft.PeftModel.from_pretrained(base, OUT)` loads, or with
    /// `--merge` folded into the weights of a whole model directory.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// With --adapter: write the base with the adapter folded into its weights (and the RoPE it
    /// trained with in config.json) instead of the adapter alone.
    #[arg(long, requires = "adapter")]
    pub merge: bool,
}

/// Runs `ringbench hf …`.
pub fn run(command: &HfCommand) -> Result<()> {
    match command {
        HfCommand::Logits(args) => traced(args.trace.as_deref(), || {
            on_backend(args.ring.backend, &[], LogitsOn(args))
        }),
        HfCommand::Generate(args) => traced(args.trace.as_deref(), || {
            on_backend(args.ring.backend, &[], GenerateOn(args))
        }),
        HfCommand::Tokenize(args) => tokenize(args),
        HfCommand::Ppl(args) => traced(args.trace.as_deref(), || {
            on_backend(args.ring.backend, &[], PplOn(args))
        }),
        HfCommand::Export(args) => export(args),
    }
}

/// How the model runs over the ranks: `max_new` tokens at most, stopping at `stop`.
pub(crate) fn decoding<'a>(
    ring: &RingArgs,
    stop: &'a [u32],
    max_new: usize,
) -> Result<Decoding<'a>> {
    strategies::check_ranks(ring.ranks)?;
    Ok(Decoding {
        max_new,
        stop,
        pad: 0,
        partition: strategies::by_name(&ring.strategy)?,
        ranks: ring.ranks,
        timeout: Duration::from_secs(600),
        cache: Some(DecodeMerge::AllGather),
        batch: 0,
        on_batch: None,
        keep_logits: false,
        sampling: Default::default(),
        stop_reply: None,
    })
}

/// Every id of `rows` inside the vocabulary, and no row empty.
pub(crate) fn check_ids(rows: &[Vec<u32>], vocab: usize, path: &Path) -> Result<()> {
    if rows.is_empty() || rows[0].is_empty() {
        bail!(
            "{}: no token ids (a [batch, seq] array with batch and seq above 0)",
            path.display()
        );
    }
    for (b, row) in rows.iter().enumerate() {
        if let Some((t, id)) = row
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab)
        {
            bail!(
                "{}: ids[{b}, {t}] = {id} is outside the model's vocabulary of {vocab}",
                path.display()
            );
        }
    }
    Ok(())
}

struct LogitsOn<'a>(&'a LogitsArgs);

impl OnBackend for LogitsOn<'_> {
    type Output = ();
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<()> {
        let args = self.0;
        let rows = npy::read_ids(&args.tokens)?;
        let (model, config) =
            load_pretrained::<I>(&args.model, args.adapter.as_deref(), &devices[0])?;
        let vocab = config.model.vocab;
        check_ids(&rows, vocab, &args.tokens)?;
        let decoding = decoding(&args.ring, &[], 0)?;
        let mut data = Vec::new();
        for row in &rows {
            let logits = full_logits(&model, &Prompt::from(row.clone()), &decoding)?;
            if data.is_empty() {
                data = logits; // the first row's block is kept, not copied
                data.reserve((rows.len() - 1) * data.len());
            } else {
                data.extend(logits);
            }
        }
        let shape = vec![rows.len(), rows[0].len(), vocab];
        npy::write(&args.out, &HostTensor::new(shape.clone(), data))?;
        println!("wrote logits {shape:?} to {}", args.out.display());
        Ok(())
    }
}

/// `ringbench hf tokenize`: the ids as a JSON list.
fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let Some(tokenizer) = pretrained_tokenizer(&args.model)? else {
        bail!("{}: no tokenizer.json", args.model.display());
    };
    let ids = tokenizer.encode(&args.text, false)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

/// `ringbench hf export`: a ringbench checkpoint (its `model.mpk`) or a Hugging Face directory,
/// written for transformers, with the Hugging Face tokenizer files when the checkpoint has them.
fn export(args: &ExportArgs) -> Result<()> {
    type B = burn::backend::Flex;
    let device = Default::default();
    let from = &args.checkpoint;
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y);
    if same(&args.out, from) {
        bail!(
            "--out {} is the checkpoint itself; give another directory",
            args.out.display()
        );
    }
    if let Some(adapter) = &args.adapter {
        return export_adapter(from, adapter, &args.out, args.merge);
    }
    if from.join("model.mpk").exists() {
        let (model, config, _) = load_checkpoint::<B>(from, &device)?;
        let hf = own_model_config(&config).with_context(|| format!("{}", from.display()))?;
        export_model(&model, &hf, &args.out)?;
        println!(
            "wrote {} ({}) to {}; the project's byte-and-piece tokenizer has no tokenizer.json form: \
             ids are bytes 0-255, BOS 256, EOS 257, then its pieces",
            hf.architecture.class(),
            from.display(),
            args.out.display()
        );
        return Ok(());
    }
    let (model, config) = load_model::<B>(from, &device)?;
    export_model(&model, &config, &args.out)?;
    let mut copied = Vec::new();
    for name in TOKENIZER_FILES {
        if from.join(name).exists() {
            std::fs::copy(from.join(name), args.out.join(name))
                .with_context(|| format!("copying {name}"))?;
            copied.push(name);
        }
    }
    println!(
        "wrote {} to {} (with {})",
        config.architecture.class(),
        args.out.display(),
        if copied.is_empty() {
            "no tokenizer files".to_string()
        } else {
            copied.join(", ")
        }
    );
    Ok(())
}

/// `hf export --adapter`: the adapter on `base` written as a PEFT adapter directory (its
/// `base_model_name_or_path` the base, its RoPE file kept), or with `merge` the merged model as a
/// whole Hugging Face directory.
fn export_adapter(base: &Path, adapter: &Path, out: &Path, merge: bool) -> Result<()> {
    type B = burn::backend::Flex;
    let device = Default::default();
    if merge {
        let (model, config) = load_pretrained::<B>(base, Some(adapter), &device)?;
        export_model(&model, &config, out)?;
        for name in TOKENIZER_FILES {
            if base.join(name).exists() {
                std::fs::copy(base.join(name), out.join(name))
                    .with_context(|| format!("copying {name}"))?;
            }
        }
        println!(
            "wrote {} with {} merged into its weights to {}",
            base.display(),
            adapter.display(),
            out.display()
        );
        return Ok(());
    }
    let (model, config) = load_pretrained::<B>(base, None, &device)?;
    let read = read_adapter::<B>(adapter, &config.model, &device)?;
    let lora = read.config.clone();
    let model = model.with_peft(read)?;
    write_adapter(&model, &lora, &base.display().to_string(), out)?;
    let rope = adapter.join(ADAPTER_ROPE);
    if rope.exists() {
        std::fs::copy(&rope, out.join(ADAPTER_ROPE))
            .with_context(|| format!("copying {}", rope.display()))?;
    }
    println!(
        "wrote the PEFT adapter {} (r = {}, alpha = {}, on {}) to {}",
        adapter.display(),
        lora.rank,
        lora.alpha,
        base.display(),
        out.display()
    );
    Ok(())
}

/// The Hugging Face config of one of the project's own models: LLaMA, or Mistral when every layer
/// has the window; what transformers' classes cannot compute (sinks, a soft cap, windows on some
/// layers only) is refused by name.
pub fn own_model_config(config: &workbench::model::LlamaConfig) -> Result<HfConfig> {
    if config.sinks {
        bail!("sinks = true: LLaMA, Mistral and Qwen2 have no attention sinks");
    }
    if let Some(cap) = config.softcap {
        bail!("softcap = {cap}: LLaMA, Mistral and Qwen2 have no logit soft-capping");
    }
    if config.window.is_some() && config.window_every != 1 {
        bail!(
            "window_every = {}: Mistral windows every layer",
            config.window_every
        );
    }
    Ok(HfConfig {
        architecture: if config.window.is_some() {
            Architecture::Mistral
        } else {
            Architecture::Llama
        },
        model: config.clone(),
        eos: vec![datasets::tokenizer::EOS],
        bos: Some(datasets::tokenizer::BOS),
        max_positions: None,
    })
}
