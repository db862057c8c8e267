//! `ringbench hf generate`: continuations of token ids or text prompts (raw, or through the
//! model's chat template), greedy or sampled, through the ring's KV cache.

use super::{RingArgs, check_ids, decoding};
use crate::backend::OnBackend;
use crate::npy;
use crate::pretrained::{chat_template, load_pretrained, pretrained_config, pretrained_tokenizer};
use anyhow::{Context, Result, bail};
use datasets::{ChatMessage, HfTokenizer};
use std::path::PathBuf;
use workbench::LayerBackend;
use workbench::hf::HfConfig;
use workbench::model::Llama;
use workbench::train::{Decoding, Prompt, Sampling, decode};

/// `ringbench hf generate`'s arguments.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory, or a LLaMA-family GGUF file (its tokenizer rebuilt from
    /// its tokenizer.ggml.* metadata).
    #[arg(long)]
    pub model: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors; trained by
    /// ringbench or by peft) folded into the model's weights.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
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
    /// Also write the new tokens, int64 [batch, new]: the eos token that ended a row included, as
    /// transformers' generate returns them; a shorter row padded with that eos. The replies are
    /// printed either way.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record every rank's timeline (tiles, ring traffic, the model's layers) into this Chrome
    /// trace-event JSON file (Perfetto, chrome://tracing).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

pub(super) struct GenerateOn<'a>(pub(super) &'a GenerateArgs);

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
        let (model, _) = load_pretrained::<I>(&args.model, args.adapter.as_deref(), &devices[0])?;
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
        if let Some(out) = &args.out {
            let rows = padded(rows, pad);
            npy::write_ids(out, &rows)?;
            println!(
                "wrote {} rows of new tokens to {}",
                rows.len(),
                out.display()
            );
        }
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
