//! `ringbench eval-lines` and `ringbench gen-lines`: exact-match accuracy per number of lines, and
//! fresh cases in LongChat's JSONL format.

use super::checkpoint::load_checkpoint;
use crate::backend::{BackendName, OnBackend, on_backend};
use crate::results::{Record, Table};
use anyhow::{Context, Result, bail};
use datasets::tokenizer::{BOS, EOS};
use datasets::{Case, SplitMix64, Tokenizer, WordSplit, generate, read_jsonl, score_reply};
use indicatif::ProgressBar;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use workbench::LayerBackend;
use workbench::model::Llama;
use workbench::train::{Decoding, greedy};

/// `ringbench eval-lines`'s arguments.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Checkpoint directory written by `ringbench train`.
    #[arg(long)]
    pub checkpoint: PathBuf,
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
    /// Writes the CSV here; with `--plot`, an SVG of accuracy against the number of lines too.
    #[arg(long)]
    pub out: PathBuf,
    /// Also plot accuracy against the prompt's length in tokens here (Figure 3's axes), with the
    /// checkpoint's longest training prompt marked when its train.toml says.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Backend: flex (CPU), wgpu or cuda.
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
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
}

/// `ringbench eval-lines`: accuracy per number of lines, written as CSV.
pub fn run_eval(args: &EvalArgs) -> Result<Vec<AccuracyRow>> {
    let rows = on_backend(args.backend, &[], EvalOn(args))?;
    let table = Table::of(rows.iter().map(Record::of).collect::<Result<_>>()?);
    table.write_csv(&args.out)?;
    println!("num_lines,cases,correct,accuracy,prompt_tokens");
    for r in &rows {
        println!(
            "{},{},{},{:.4},{:.1}",
            r.num_lines, r.cases, r.correct, r.accuracy, r.prompt_tokens
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
    let spec = super::load_spec(&args.checkpoint.join("train.toml")).ok()?;
    let lines = spec.train.num_lines;
    let row = rows.iter().find(|r| r.num_lines == lines)?;
    Some((lines, row.prompt_tokens))
}

struct EvalOn<'a>(&'a EvalArgs);

impl OnBackend for EvalOn<'_> {
    type Output = Vec<AccuracyRow>;
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<Vec<AccuracyRow>> {
        let args = self.0;
        let (model, _, tokenizer) = load_checkpoint::<I>(&args.checkpoint, &devices[0])?;
        let cases = read_jsonl(&args.cases)?;
        let partition = strategies::by_name(&args.strategy)?;
        accuracy(
            &model, &tokenizer, &cases, partition, args.ranks, args.batch,
        )
    }
}

/// Exact-match accuracy per number of lines of greedy replies to `cases`, decoded `batch` prompts at a
/// time on `ranks` ranks.
pub fn accuracy<B: LayerBackend>(
    model: &Llama<B>,
    tokenizer: &Tokenizer,
    cases: &[Case],
    partition: &dyn strategies::Partition,
    ranks: usize,
    batch: usize,
) -> Result<Vec<AccuracyRow>> {
    let bar = ProgressBar::new(cases.len() as u64);
    // Per line count: cases, correct, prompt tokens.
    let mut tally: BTreeMap<usize, (usize, usize, usize)> = BTreeMap::new();
    for chunk in cases.chunks(batch.max(1)) {
        let prompts: Vec<Vec<u32>> = chunk
            .iter()
            .map(|c| {
                std::iter::once(BOS)
                    .chain(tokenizer.encode(&c.prompt))
                    .collect()
            })
            .collect();
        let decoding = Decoding {
            max_new: 8,
            stop: EOS,
            pad: EOS,
            partition,
            ranks,
            timeout: Duration::from_secs(600),
        };
        let replies = greedy(model, &prompts, &decoding)?;
        for ((case, reply), prompt) in chunk.iter().zip(replies).zip(&prompts) {
            let text = tokenizer.decode(&reply)?;
            let entry = tally.entry(case.num_lines).or_default();
            entry.0 += 1;
            entry.1 += usize::from(score_reply(&text) == Some(case.expected_number));
            entry.2 += prompt.len();
        }
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let rows: Vec<AccuracyRow> = tally
        .into_iter()
        .map(|(num_lines, (cases, correct, tokens))| AccuracyRow {
            num_lines,
            cases,
            correct,
            accuracy: correct as f64 / cases as f64,
            prompt_tokens: tokens as f64 / cases as f64,
        })
        .collect();
    Ok(rows)
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
    /// Word lists: eval (never seen in training), train or all.
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
    let split = match args.split.as_str() {
        "eval" => WordSplit::Eval,
        "train" => WordSplit::Train,
        "all" => WordSplit::All,
        other => bail!("unknown --split '{other}'; expected eval, train or all"),
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
