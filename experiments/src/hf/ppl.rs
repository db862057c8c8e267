//! `ringbench hf ppl`: perplexity by position of texts or token ids, per RoPE scaling, through the
//! ring (`crate::perplexity` does the windows, buckets, kept parts and tables).

use super::{RingArgs, check_ids, decoding};
use crate::backend::OnBackend;
use crate::npy;
use crate::perplexity::{self, Scoring, Setting, ring_key, scaling_label, score_windows};
use crate::pretrained::{load_pretrained, pretrained_config, pretrained_tokenizer, rope_override};
use anyhow::{Context, Result, bail};
use indicatif::ProgressBar;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use workbench::LayerBackend;
use workbench::model::RopeScaling;

/// `ringbench hf ppl`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PplArgs {
    /// A Hugging Face model directory or a LLaMA-family GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors; trained by
    /// ringbench or by peft) folded into the model's weights.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
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
    pub max_windows: Option<NonZeroUsize>,
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
    /// Record every rank's timeline (tiles, ring traffic, the model's layers) into this Chrome
    /// trace-event JSON file (Perfetto, chrome://tracing).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

pub(super) struct PplOn<'a>(pub(super) &'a PplArgs);

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
        let (model, _) = load_pretrained::<I>(&args.model, args.adapter.as_deref(), &devices[0])?;
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
