//! `ringbench eval-lines` and `ringbench gen-lines`: exact-match accuracy per number of lines, and
//! fresh cases in LongChat's JSONL format.

use super::start::load_trained;
use crate::backend::{BackendName, OnBackend, on_backend};
use crate::pretrained::{
    chat_template, is_gguf, pretrained_config, pretrained_tokenizer, rope_override,
};
use crate::results::{Record, Table};
use anyhow::{Context, Result, bail};
use datasets::tokenizer::EOS;
use datasets::{
    Case, ChatMessage, ChatTemplate, SplitMix64, TextTokenizer, WordSplit, generate, read_jsonl,
    score_reply,
};
use indicatif::ProgressBar;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use workbench::LayerBackend;
use workbench::model::{Llama, LlamaConfig};
use workbench::ring::decode::DecodeMerge;
use workbench::train::{Decoded, Decoding, Prompt, decode, decode_on};

/// `ringbench eval-lines`'s arguments.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Checkpoint directory written by `ringbench train`, a Hugging Face model directory, or a
    /// LLaMA-family GGUF file.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A PEFT LoRA adapter directory (trained by ringbench or by peft) folded into the
    /// checkpoint's weights (a Hugging Face or GGUF base).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Prompt through the model's chat template (a user message; the reply begins the
    /// assistant's turn), as LongChat prompts an instruct model.
    #[arg(long)]
    pub chat: bool,
    /// Tokens a reply has at most (8 fits the project's models: a number and EOS; a chat model's
    /// sentence needs more).
    #[arg(long, default_value_t = 8)]
    pub max_new: usize,
    /// Override the model's RoPE scaling: none (keep it), linear, dynamic, yarn or llama3, at
    /// --factor over the model's context length (Hugging Face and GGUF models).
    #[arg(long, default_value = "none")]
    pub rope_scaling: String,
    /// The scaling factor.
    #[arg(long, default_value_t = 4.0)]
    pub factor: f64,
    /// LongChat test cases (JSONL with prompt, expected_number, num_lines).
    #[arg(long)]
    pub cases: PathBuf,
    /// Ranks decoding with ring attention.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Partition strategy by name.
    #[arg(long, default_value = "zigzag")]
    pub strategy: String,
    /// Prompts decoded together.
    #[arg(long, default_value_t = 25)]
    pub batch: usize,
    /// Also write the table as CSV here (it is printed either way).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also plot accuracy against the prompt's length in tokens here (Figure 3's axes), with the
    /// checkpoint's longest training prompt marked when its train.toml says.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Backend: flex (CPU), wgpu or cuda.
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
    /// Decode without the KV cache: every new token recomputes the whole sequence through the
    /// ring (the check of the cache; in-process ranks only).
    #[arg(long)]
    pub no_cache: bool,
    /// How the ranks' partial attention of a decoded token is merged: allgather (one collective)
    /// or ring (a ring all-reduce of the merge).
    #[arg(long, default_value = "allgather")]
    pub merge: DecodeMerge,
    /// Also write every case's reply here, one JSON line a case: num_lines, expected, reply,
    /// correct.
    #[arg(long)]
    pub replies: Option<PathBuf>,
    /// Record every rank's timeline (tiles, ring traffic, the model's layers) into this Chrome
    /// trace-event JSON file (Perfetto, chrome://tracing).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// Accuracy at one number of lines.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyRow {
    /// Lines in the prompt.
    pub num_lines: usize,
    /// Cases evaluated.
    pub cases: usize,
    /// Exact matches.
    pub correct: usize,
    /// correct / cases.
    pub accuracy: f64,
    /// Mean prompt length in tokens (BOS included).
    pub prompt_tokens: f64,
    /// Seconds of these cases' prefills (0 without the cache).
    pub prefill_seconds: f64,
    /// Seconds of these cases' token steps after the prefill (without the cache: their recomputes).
    pub decode_seconds: f64,
    /// Bytes a rank sent per decoded token, over the whole run (it does not depend on the prompt's
    /// length; 0 without the cache).
    pub decode_bytes_per_token_per_rank: f64,
}

/// One case's reply, as `--replies` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct Reply {
    /// Lines in the prompt.
    pub num_lines: usize,
    /// The number asked for.
    pub expected: u64,
    /// What the model replied.
    pub reply: String,
    /// Whether the reply scores as the expected number.
    pub correct: bool,
}

/// An evaluation: accuracy per number of lines, and every case's reply.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Per number of lines.
    pub rows: Vec<AccuracyRow>,
    /// Per case, in the cases' order.
    pub replies: Vec<Reply>,
}

/// `ringbench eval-lines`: accuracy per number of lines, written as CSV.
pub fn run_eval(args: &EvalArgs) -> Result<Vec<AccuracyRow>> {
    let Some(evaluation) = on_backend(args.backend, &[], EvalOn(args))? else {
        return Ok(Vec::new()); // an MPI rank other than 0: rank 0 writes the results
    };
    let rows = evaluation.rows;
    if let Some(out) = &args.out {
        let table = Table::of(rows.iter().map(Record::of).collect::<Result<_>>()?);
        table.write_csv(out)?;
    }
    if let Some(path) = &args.replies {
        let mut text = String::new();
        for reply in &evaluation.replies {
            text += &serde_json::to_string(reply)?;
            text.push('\n');
        }
        crate::results::write_whole(path, text.as_bytes())?;
    }
    println!(
        "num_lines,cases,correct,accuracy,prompt_tokens,prefill_seconds,decode_seconds,decode_bytes_per_token_per_rank"
    );
    for r in &rows {
        println!(
            "{},{},{},{:.4},{:.1},{:.3},{:.3},{:.0}",
            r.num_lines,
            r.cases,
            r.correct,
            r.accuracy,
            r.prompt_tokens,
            r.prefill_seconds,
            r.decode_seconds,
            r.decode_bytes_per_token_per_rank
        );
    }
    if let Some(plot) = &args.plot {
        let mut series = vec![crate::plot::Series {
            name: format!("checkpoint {}", args.checkpoint.display()),
            points: rows.iter().map(|r| (r.prompt_tokens, r.accuracy)).collect(),
        }];
        if let Some((lines, tokens)) = trained_length(args, &rows) {
            series.push(crate::plot::Series {
                name: format!("longest training prompt: {lines} lines, ~{tokens:.0} tokens"),
                points: vec![(tokens, 0.0), (tokens, 1.0)],
            });
        }
        use crate::plot::{Axis, Chart, Scale};
        let chart = Chart {
            title: "Line retrieval: exact match vs context length",
            x: Axis::new("prompt length (tokens)", Scale::Linear),
            y: Axis::new("accuracy", Scale::Linear),
        };
        crate::plot::line_chart(plot, &chart, series)?;
    }
    Ok(rows)
}

/// The checkpoint's most training lines (from its train.toml) and their mean prompt tokens, when
/// that line count was evaluated.
fn trained_length(args: &EvalArgs, rows: &[AccuracyRow]) -> Option<(usize, f64)> {
    // A LoRA run's train.toml lies beside its adapter.
    let lines = super::trained_lines(args.adapter.as_ref().unwrap_or(&args.checkpoint))?;
    let row = rows.iter().find(|r| r.num_lines == lines)?;
    Some((lines, row.prompt_tokens))
}

struct EvalOn<'a>(&'a EvalArgs);

impl OnBackend for EvalOn<'_> {
    /// The evaluation, on the process that writes it (rank 0 under mpirun).
    type Output = Option<Evaluation>;
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<Option<Evaluation>> {
        let args = self.0;
        let (chat, scaling) = pretrained_options(
            &args.checkpoint,
            args.adapter.as_deref(),
            args.chat,
            (&args.rope_scaling, args.factor),
        )?;
        let (mut model, tokenizer) =
            load_trained::<I>(&args.checkpoint, args.adapter.as_deref(), &devices[0])?;
        let tokenizer = &*tokenizer;
        if let Some(config) = scaling {
            model = model.with_trunk_of(&config);
        }
        let cases = read_jsonl(&args.cases)?;
        let bar = ProgressBar::new(cases.len() as u64);
        let advance = |n: usize| bar.inc(n as u64);
        let stop = [tokenizer.eos()];
        let decoding = Decoding {
            cache: (!args.no_cache).then_some(args.merge),
            on_batch: Some(&advance),
            stop: &stop,
            pad: tokenizer.eos(),
            max_new: args.max_new,
            ..decoding(strategies::by_name(&args.strategy)?, args.ranks, args.batch)
        };
        if args.no_cache && workbench::transport::launched_by_mpirun() {
            bail!("--no-cache recomputes on in-process ranks: run it without mpirun");
        }
        let ranked = crate::mpi_rank::as_mpi_rank(decoding.timeout, |comm| {
            evaluate(tokenizer, chat.as_ref(), &cases, |prompts| {
                Ok(decode_on(comm, &model, prompts, &decoding)?)
            })
        })?;
        if let Some((rank, evaluation)) = ranked {
            return Ok((rank == 0).then_some(evaluation));
        }
        let evaluation = evaluate(tokenizer, chat.as_ref(), &cases, |prompts| {
            Ok(decode(&model, prompts, &decoding)?)
        })?;
        bar.finish_and_clear();
        Ok(Some(evaluation))
    }
}

/// The chat template (`chat`) and the model config with the RoPE scaling overridden
/// (`rope_scaling` at `factor`; `none` keeps it), for a Hugging Face or GGUF model at `path` (with
/// `adapter`'s RoPE where the adapter was trained with its own); the project's checkpoints have
/// neither.
pub fn pretrained_options(
    path: &Path,
    adapter: Option<&Path>,
    chat: bool,
    (rope_scaling, factor): (&str, f64),
) -> Result<(Option<ChatTemplate>, Option<LlamaConfig>)> {
    if !chat && rope_scaling == "none" {
        return Ok((None, None));
    }
    if !is_gguf(path) && (path.join("model.mpk").exists() || !path.join("config.json").exists()) {
        bail!(
            "{}: --chat and --rope-scaling need a Hugging Face or GGUF model, not a ringbench checkpoint",
            path.display()
        );
    }
    let mut config = pretrained_config(path)?;
    if let Some((theta, scaling)) = adapter
        .map(|dir| workbench::hf::read_adapter_rope(dir, config.max_positions))
        .transpose()?
        .flatten()
    {
        config.model = config
            .model
            .with_rope_theta(theta)
            .with_rope_scaling(scaling);
    }
    let chat = if chat {
        let Some(tokenizer) = pretrained_tokenizer(path)? else {
            bail!("{}: --chat needs the model's tokenizer", path.display());
        };
        Some(chat_template(path, &tokenizer, &config)?)
    } else {
        None
    };
    let scaled = rope_override(rope_scaling, factor, &config)?.map(|scaling| {
        let mut model = config.model.clone();
        model.rope_scaling = scaling;
        model
    });
    Ok((chat, scaled))
}

/// How evaluation decodes: up to 8 tokens a reply (a number and EOS), `batch` prompts together on
/// `ranks` ranks of `partition`, with the KV cache merged by all-gather (the piece tokenizer's EOS
/// ends a reply and pads; a model with another tokenizer sets its own).
pub fn decoding(partition: &dyn strategies::Partition, ranks: usize, batch: usize) -> Decoding<'_> {
    Decoding {
        max_new: 8,
        stop: &[EOS],
        pad: EOS,
        partition,
        ranks,
        timeout: Duration::from_secs(600),
        cache: Some(DecodeMerge::AllGather),
        batch,
        on_batch: None,
        keep_logits: false,
        sampling: Default::default(),
        stop_reply: None,
    }
}

/// Exact-match accuracy per number of lines of greedy replies to `cases`, as `decoding` decodes.
pub fn accuracy<B: LayerBackend>(
    model: &Llama<B>,
    tokenizer: &dyn TextTokenizer,
    cases: &[Case],
    decoding: &Decoding,
) -> Result<Vec<AccuracyRow>> {
    Ok(evaluate(tokenizer, None, cases, |prompts| {
        Ok(decode(model, prompts, decoding)?)
    })?
    .rows)
}

/// The replies `run` decodes for `cases`' prompts (BOS, when the tokenizer has one, and the
/// prompt's tokens; with `chat`, the template's text of the prompt as a user message), scored:
/// accuracy, prompt length and decoding's figures per number of lines, and every case's reply.
pub fn evaluate(
    tokenizer: &dyn TextTokenizer,
    chat: Option<&ChatTemplate>,
    cases: &[Case],
    run: impl FnOnce(&[Prompt]) -> Result<Decoded>,
) -> Result<Evaluation> {
    let prompts: Vec<Prompt> = cases
        .iter()
        .map(|c| -> Result<Prompt> {
            if let Some(chat) = chat {
                let text = chat.render(&[ChatMessage::user(&c.prompt)], true)?;
                return Ok(Prompt::from(tokenizer.text_ids(&text)?));
            }
            let mut tokens: Vec<u32> = tokenizer.bos().into_iter().collect();
            tokens.extend(tokenizer.text_ids(&c.prompt)?);
            Ok(Prompt::from(tokens))
        })
        .collect::<Result<_>>()?;
    let decoded = run(&prompts)?;
    let per_token = decoded.bytes_per_token_per_rank();
    // Per line count: cases, correct, prompt tokens, prefill and decode seconds.
    let mut tally: BTreeMap<usize, (usize, usize, usize, f64, f64)> = BTreeMap::new();
    let mut replies = Vec::with_capacity(cases.len());
    for (i, (case, prompt)) in cases.iter().zip(&prompts).enumerate() {
        let text = tokenizer.ids_text(&decoded.replies[i])?;
        let correct = score_reply(&text) == Some(case.expected_number);
        let entry = tally.entry(case.num_lines).or_default();
        entry.0 += 1;
        entry.1 += usize::from(correct);
        entry.2 += prompt.tokens.len();
        entry.3 += decoded.prefill_seconds[i];
        entry.4 += decoded.decode_seconds[i];
        replies.push(Reply {
            num_lines: case.num_lines,
            expected: case.expected_number,
            reply: text,
            correct,
        });
    }
    let rows = tally
        .into_iter()
        .map(
            |(num_lines, (cases, correct, tokens, prefill, decode))| AccuracyRow {
                num_lines,
                cases,
                correct,
                accuracy: correct as f64 / cases as f64,
                prompt_tokens: tokens as f64 / cases as f64,
                prefill_seconds: prefill,
                decode_seconds: decode,
                decode_bytes_per_token_per_rank: per_token,
            },
        )
        .collect();
    Ok(Evaluation { rows, replies })
}

/// `ringbench gen-lines`'s arguments.
#[derive(Debug, clap::Args)]
pub struct GenArgs {
    /// Line counts to generate, e.g. 4,8,12.
    #[arg(long, value_delimiter = ',')]
    pub num_lines: Vec<usize>,
    /// Cases per line count.
    #[arg(long, default_value_t = 200)]
    pub cases: usize,
    /// Word lists: eval (the held-out fifth: never seen in training, 441 names), fresh (lists of
    /// their own, never seen in training: 1,600 names, for longer records), train or all.
    #[arg(long, default_value = "eval")]
    pub split: String,
    /// Seeds the generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// JSONL file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// `ringbench gen-lines`.
pub fn run_gen(args: &GenArgs) -> Result<()> {
    let Some(split) = WordSplit::by_name(&args.split) else {
        bail!(
            "unknown --split '{}'; expected one of {}",
            args.split,
            WordSplit::names()
        );
    };
    let mut rng = SplitMix64::new(args.seed);
    let mut out = String::new();
    for &n in &args.num_lines {
        for _ in 0..args.cases {
            let case = generate(&mut rng, n, split)?;
            out += &serde_json::to_string(&serde_json::json!({
                "prompt": case.prompt,
                "expected_number": case.expected_number,
                "num_lines": case.num_lines,
            }))?;
            out.push('\n');
        }
    }
    std::fs::write(&args.out, out).with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "wrote {} cases to {}",
        args.num_lines.len() * args.cases,
        args.out.display()
    );
    Ok(())
}
