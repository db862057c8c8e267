//! `ringbench hf`: Hugging Face LLaMA-family models through the ring: logits of token ids, greedy
//! generation with the sharded KV cache, the tokenizer's ids, and any checkpoint exported as a
//! directory transformers loads.

use crate::backend::{BackendName, OnBackend, on_backend};
use crate::line_retrieval::load_checkpoint;
use crate::npy;
use crate::perplexity::{self, Scoring, Setting, ring_key, scaling_label, score_windows};
use crate::pretrained::{
    chat_template, load_pretrained, pretrained_config, pretrained_tokenizer, rope_override,
};
use anyhow::{Context, Result, bail};
use datasets::{ChatMessage, HfTokenizer};
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::time::Duration;
use workbench::LayerBackend;
use workbench::hf::{Architecture, HfConfig, export_model, load_model};
use workbench::model::{Llama, RopeScaling};
use workbench::ring::decode::DecodeMerge;
use workbench::ring::jobs::HostTensor;
use workbench::train::{Decoding, Prompt, Sampling, decode, full_logits};

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
    /// Token ids: int32 or int64 [batch, seq].
    #[arg(long)]
    pub tokens: PathBuf,
    /// Where the ring runs.
    #[command(flatten)]
    pub ring: RingArgs,
    /// The logits, float32 [batch, seq, vocab].
    #[arg(long)]
    pub out: PathBuf,
}

/// `ringbench hf generate`'s arguments.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory, or a LLaMA-family GGUF file (its tokenizer rebuilt from
    /// its tokenizer.ggml.* metadata).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt token ids: int32 or int64 [batch, seq].
    #[arg(long, conflicts_with_all = ["prompt", "prompts", "chat"])]
    pub tokens: Option<PathBuf>,
    /// A prompt text, tokenized by the model's tokenizer with its special tokens (as
    /// transformers' `tokenizer(text)`), or with --chat the user's message.
    #[arg(long, conflicts_with = "prompts")]
    pub prompt: Option<String>,
    /// Prompts decoded as one batch: a JSONL file, each line {"prompt": TEXT} or {"messages":
    /// [{"role": ..., "content": ...}, ...]} (a conversation, rendered by the chat template).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Apply the model's chat template (tokenizer.chat_template in a GGUF file,
    /// chat_template.jinja or tokenizer_config.json's in a directory): each prompt becomes a user
    /// message, and the text ends where the assistant's reply begins.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: a system message put first.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// New tokens at most.
    #[arg(long)]
    pub max_new: usize,
    /// Sample instead of greedy decoding: logits divided by this (> 0). Greedy when absent.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// With --temperature: only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0, requires = "temperature")]
    pub top_k: usize,
    /// With --temperature: only the fewest most likely tokens whose probability reaches P.
    #[arg(long, default_value_t = 1.0, requires = "temperature")]
    pub top_p: f64,
    /// With --temperature: the seed every draw is keyed by (with the prompt's index and the
    /// step: the same tokens on any rank count).
    #[arg(long, default_value_t = 0, requires = "temperature")]
    pub seed: u64,
    /// A reply ends once its text contains this (repeatable; the tokens up to the one that
    /// completes it are kept, as transformers' stop_strings does).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Where the ring runs.
    #[command(flatten)]
    pub ring: RingArgs,
    /// Recompute the whole sequence for every new token instead of the KV cache (the check).
    #[arg(long)]
    pub no_cache: bool,
    /// The new tokens, int64 [batch, new]: the eos token that ended a row included, as
    /// transformers' generate returns them; a shorter row padded with that eos.
    #[arg(long)]
    pub out: PathBuf,
}

/// `ringbench hf ppl`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PplArgs {
    /// A Hugging Face model directory or a LLaMA-family GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// Text files, each a document, tokenized by the model's tokenizer.
    #[arg(long, num_args = 1.., conflicts_with = "tokens", required_unless_present = "tokens")]
    pub text: Vec<PathBuf>,
    /// Token ids instead of text: int32 or int64 [documents, tokens].
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Tokens a window holds (the tokenizer's BOS first, if it adds one).
    #[arg(long)]
    pub context: usize,
    /// Windows scored at most, in document order (all when absent).
    #[arg(long)]
    pub max_windows: Option<usize>,
    /// RoPE scalings to evaluate, comma-separated: none (the model's own), linear, dynamic,
    /// yarn, llama3 (each at --factor, over the model's context length).
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub rope_scaling: Vec<String>,
    /// The scaling factor.
    #[arg(long, default_value_t = 4.0)]
    pub factor: f64,
    /// Buckets of position in the tables and figure.
    #[arg(long, default_value_t = 16)]
    pub buckets: usize,
    /// Where the ring runs.
    #[command(flatten)]
    pub ring: RingArgs,
    /// A directory for ppl.csv, ppl_summary.csv, their Markdown, ppl.svg and parts/ (each
    /// window's sums: a rerun resumes from them).
    #[arg(long)]
    pub out: Option<PathBuf>,
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
}

/// Runs `ringbench hf …`.
pub fn run(command: &HfCommand) -> Result<()> {
    match command {
        HfCommand::Logits(args) => on_backend(args.ring.backend, &[], LogitsOn(args)),
        HfCommand::Generate(args) => on_backend(args.ring.backend, &[], GenerateOn(args)),
        HfCommand::Tokenize(args) => tokenize(args),
        HfCommand::Ppl(args) => on_backend(args.ring.backend, &[], PplOn(args)),
        HfCommand::Export(args) => export(args),
    }
}

/// How the model runs over the ranks: `max_new` tokens at most, stopping at `stop`.
fn decoding<'a>(ring: &RingArgs, stop: &'a [u32], max_new: usize) -> Result<Decoding<'a>> {
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
fn check_ids(rows: &[Vec<u32>], vocab: usize, path: &Path) -> Result<()> {
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
        let (model, config) = load_pretrained::<I>(&args.model, &devices[0])?;
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

struct GenerateOn<'a>(&'a GenerateArgs);

impl OnBackend for GenerateOn<'_> {
    type Output = ();
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<()> {
        let args = self.0;
        let config = pretrained_config(&args.model)?;
        let tokenizer = pretrained_tokenizer(&args.model)?;
        let (prompts, source) = match &args.tokens {
            Some(path) => (npy::read_ids(path)?, path.clone()),
            None => {
                let Some(tokenizer) = &tokenizer else {
                    bail!(
                        "{}: a text prompt needs the model's tokenizer.json",
                        args.model.display()
                    );
                };
                (
                    prompt_ids(args, tokenizer, &config)?,
                    args.prompts
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("--prompt")),
                )
            }
        };
        check_ids(&prompts, config.model.vocab, &source)?;
        if !args.stop.is_empty() && tokenizer.is_none() {
            bail!("--stop needs the model's tokenizer to read replies as text");
        }
        let stop_text = |_: usize, reply: &[u32]| {
            let text = tokenizer
                .as_ref()
                .and_then(|t| t.decode(reply).ok())
                .unwrap_or_default();
            args.stop.iter().any(|s| text.contains(s.as_str()))
        };
        let (model, _) = load_pretrained::<I>(&args.model, &devices[0])?;
        let mut decoding = decoding(&args.ring, &config.eos, args.max_new)?;
        if args.no_cache {
            decoding.cache = None;
        }
        if let Some(temperature) = args.temperature {
            decoding.sampling = Sampling::random(temperature, args.top_k, args.top_p, args.seed)?;
        }
        if !args.stop.is_empty() {
            decoding.stop_reply = Some(&stop_text);
        }
        let (rows, pad) = continuations(&model, &prompts, &decoding)?;
        for (i, row) in rows.iter().enumerate() {
            match &tokenizer {
                Some(t) => println!("{i}: {:?}", t.decode(row)?),
                None => println!("{i}: {row:?}"),
            }
        }
        let rows = padded(rows, pad);
        npy::write_ids(&args.out, &rows)?;
        println!(
            "wrote {} rows of new tokens to {}",
            rows.len(),
            args.out.display()
        );
        Ok(())
    }
}

/// One line of a --prompts file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
}

/// A text prompt before tokenizing: raw text, or a conversation for the chat template.
enum TextPrompt {
    Raw(String),
    Conversation(Vec<ChatMessage>),
}

/// The token ids of the text prompts (--prompt, or each line of --prompts), through the chat
/// template where asked (--chat, or a line's messages).
fn prompt_ids(
    args: &GenerateArgs,
    tokenizer: &HfTokenizer,
    config: &HfConfig,
) -> Result<Vec<Vec<u32>>> {
    let user = |text: &str| TextPrompt::Conversation(vec![ChatMessage::user(text)]);
    let mut prompts: Vec<TextPrompt> = Vec::new();
    match (&args.prompt, &args.prompts) {
        (Some(text), _) => prompts.push(user(text)),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            for (n, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let at = || format!("{} line {}", path.display(), n + 1);
                let line: PromptLine = serde_json::from_str(line).with_context(at)?;
                match (line.prompt, line.messages) {
                    (Some(text), None) => prompts.push(user(&text)),
                    (None, Some(messages)) if !messages.is_empty() => {
                        prompts.push(TextPrompt::Conversation(messages))
                    }
                    _ => bail!(
                        "{}: give \"prompt\" or a non-empty \"messages\", not both",
                        at()
                    ),
                }
            }
            if prompts.is_empty() {
                bail!("{}: no prompts", path.display());
            }
        }
        (None, None) => bail!("give --tokens, --prompt or --prompts"),
    }
    // Without --chat, a lone user message is the raw text; a conversation needs the template.
    if !args.chat {
        for prompt in &mut prompts {
            if let TextPrompt::Conversation(messages) = prompt
                && let [only] = messages.as_slice()
                && only.role == "user"
            {
                *prompt = TextPrompt::Raw(only.content.clone());
            }
        }
    }
    let template = prompts
        .iter()
        .any(|p| matches!(p, TextPrompt::Conversation(_)))
        .then(|| chat_template(&args.model, tokenizer, config))
        .transpose()?;
    prompts
        .into_iter()
        .map(|prompt| match prompt {
            TextPrompt::Raw(text) => Ok(tokenizer.encode(&text, true)?),
            TextPrompt::Conversation(mut messages) => {
                if let Some(system) = &args.system {
                    messages.insert(
                        0,
                        ChatMessage {
                            role: "system".into(),
                            content: system.clone(),
                        },
                    );
                }
                let template = template
                    .as_ref()
                    .expect("made when a conversation is present");
                // As transformers' apply_chat_template: the template writes any special tokens.
                Ok(tokenizer.encode(&template.render(&messages, true)?, false)?)
            }
        })
        .collect()
}

/// The continuations of `prompts` as transformers' generate returns its new tokens: the eos that
/// ended a row included, shorter rows padded with that eos (the first eos when no row ended).
pub fn generate<B: LayerBackend>(
    model: &Llama<B>,
    prompts: &[Vec<u32>],
    decoding: &Decoding,
) -> Result<Vec<Vec<u32>>> {
    let (rows, pad) = continuations(model, prompts, decoding)?;
    Ok(padded(rows, pad))
}

/// Rows padded with `pad` to the longest.
fn padded(mut rows: Vec<Vec<u32>>, pad: u32) -> Vec<Vec<u32>> {
    let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
    for row in &mut rows {
        row.resize(longest, pad);
    }
    rows
}

/// Each prompt's new tokens (the eos that ended it included), unpadded, and the token
/// [`generate`] pads them with.
fn continuations<B: LayerBackend>(
    model: &Llama<B>,
    prompts: &[Vec<u32>],
    decoding: &Decoding,
) -> Result<(Vec<Vec<u32>>, u32)> {
    let prompts: Vec<Prompt> = prompts.iter().cloned().map(Prompt::from).collect();
    let decoded = decode(model, &prompts, decoding)?;
    let rows = decoded
        .replies
        .iter()
        .zip(&decoded.ended_by)
        .map(|(reply, ended)| reply.iter().copied().chain(*ended).collect())
        .collect();
    let pad = decoded
        .ended_by
        .iter()
        .flatten()
        .next()
        .or(decoding.stop.first())
        .copied()
        .unwrap_or(0);
    Ok((rows, pad))
}

struct PplOn<'a>(&'a PplArgs);

impl OnBackend for PplOn<'_> {
    type Output = ();
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<()> {
        let args = self.0;
        let config = pretrained_config(&args.model)?;
        let scalings: Vec<(String, Option<RopeScaling>)> = args
            .rope_scaling
            .iter()
            .map(|kind| Ok((kind.clone(), rope_override(kind, args.factor, &config)?)))
            .collect::<Result<_>>()?;
        let (documents, prefix) = match &args.tokens {
            Some(path) => (npy::read_ids(path)?, Vec::new()),
            None => {
                let Some(tokenizer) = pretrained_tokenizer(&args.model)? else {
                    bail!(
                        "{}: --text needs the model's tokenizer",
                        args.model.display()
                    );
                };
                let documents = args
                    .text
                    .iter()
                    .map(|path| {
                        let text = std::fs::read_to_string(path)
                            .with_context(|| format!("reading {}", path.display()))?;
                        Ok(tokenizer.encode(&text, false)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                (documents, tokenizer.prefix()?)
            }
        };
        let source = args.tokens.clone().unwrap_or_else(|| args.text[0].clone());
        let windows = perplexity::windows(&documents, args.context, &prefix, args.max_windows)?;
        check_ids(&windows, config.model.vocab, &source)?;
        let (model, _) = load_pretrained::<I>(&args.model, &devices[0])?;
        let model_name = args.model.file_name().map_or_else(
            || args.model.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let scoring = Scoring {
            context: args.context,
            buckets: args.buckets,
            decoding: decoding(&args.ring, &[], 0)?,
            parts: args.out.as_ref().map(|d| d.join("parts")),
            key: ring_key(
                &model_name,
                args.ring.ranks,
                &args.ring.strategy,
                &format!("{:?}", args.ring.backend),
            ),
        };
        let bar = ProgressBar::new((windows.len() * scalings.len()) as u64);
        let mut runs = Vec::new();
        for (kind, scaling) in &scalings {
            let mut model_config = config.model.clone();
            if let Some(scaling) = scaling {
                model_config.rope_scaling = *scaling;
            }
            let model = model.clone().with_trunk_of(&model_config);
            let label = scaling_label(kind, args.factor);
            let run = score_windows(&model, &label, &windows, &scoring, &|| bar.inc(1))?;
            bar.suspend(|| {
                println!(
                    "{label}: mean_nll {:.6} perplexity {:.4} over {} tokens in {} windows of {} \
                     ({} resumed; {:.1} s; attention engine peak {:.1} MiB a rank on {} ranks)",
                    run.mean_nll(),
                    run.mean_nll().exp(),
                    run.tokens(),
                    run.windows,
                    args.context,
                    run.resumed,
                    run.seconds,
                    run.engine_peak_bytes as f64 / (1u64 << 20) as f64,
                    args.ring.ranks
                )
            });
            runs.push(run);
        }
        bar.finish_and_clear();
        if let Some(dir) = &args.out {
            let setting = Setting {
                model: &model_name,
                factor: args.factor,
                context: args.context,
                ranks: args.ring.ranks,
                strategy: &args.ring.strategy,
            };
            perplexity::write_tables(dir, &setting, &runs)?;
            println!(
                "wrote ppl.csv, ppl_summary.csv, their Markdown and ppl.svg to {}",
                dir.display()
            );
        }
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
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
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
