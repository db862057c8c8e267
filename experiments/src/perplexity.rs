//! Perplexity by position (`ringbench hf ppl`): documents cut into windows of N tokens, every next
//! token's negative log-likelihood through the ring (`workbench::train::score`), summed into buckets
//! of position, once per RoPE scaling (none, or overridden at evaluation: zero-shot context
//! extension is one flag). Each window's sums are kept under `OUT/parts/` as it finishes, so a long
//! run that stops resumes where it was; the tables (`ppl.csv`, `ppl_summary.csv`, Markdown) and the
//! figure (perplexity against position, one line per scaling) are written from them.

use crate::markdown;
use crate::measure::machine::cpu_model;
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{significant, write_whole};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Instant;
use workbench::LayerBackend;
use workbench::model::Llama;
use workbench::train::{Decoding, Prompt};

/// Documents cut into windows of `context` tokens, each `prefix` (the tokenizer's BOS, if it adds
/// one) then `context − prefix` of the document's tokens; a document's remainder shorter than a
/// window is dropped. At most `max_windows` (all when `None`; a count of 0, which would score
/// nothing and print NaN, cannot be given), taken in order.
pub fn windows(
    documents: &[Vec<u32>],
    context: usize,
    prefix: &[u32],
    max_windows: Option<NonZeroUsize>,
) -> Result<Vec<Vec<u32>>> {
    if context < prefix.len() + 2 {
        bail!(
            "--context {context} leaves fewer than 2 tokens to score after the {} prefix token(s)",
            prefix.len()
        );
    }
    let body = context - prefix.len();
    let mut out = Vec::new();
    for doc in documents {
        for piece in doc.chunks_exact(body) {
            out.push(prefix.iter().chain(piece).copied().collect());
        }
    }
    if out.is_empty() {
        let longest = documents.iter().map(Vec::len).max().unwrap_or(0);
        bail!(
            "no window of {context} tokens: the longest document has {longest} tokens \
             (lower --context or give longer text)"
        );
    }
    out.truncate(max_windows.map_or(usize::MAX, NonZeroUsize::get));
    Ok(out)
}

/// One window's sums, per bucket of position: what `OUT/parts/` keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct WindowPart {
    /// What the sums were computed under (model, scaling, window, ring): a part of another run is
    /// recomputed, never mixed in.
    key: String,
    nll_sums: Vec<f64>,
    tokens: Vec<usize>,
    seconds: f64,
    engine_peak_bytes: u64,
}

/// One scaling's perplexity: per bucket and over all.
#[derive(Debug, Clone)]
pub struct PplRun {
    /// `none` or the scaling's name.
    pub scaling: String,
    /// Per bucket: (first position, last position + 1, tokens scored, their NLL summed).
    pub buckets: Vec<(usize, usize, usize, f64)>,
    /// Windows scored.
    pub windows: usize,
    /// Windows read back from kept parts instead of computed.
    pub resumed: usize,
    /// Seconds of scoring (summed over windows, resumed ones included).
    pub seconds: f64,
    /// The attention engine's largest peak bytes on a rank.
    pub engine_peak_bytes: u64,
}

impl PplRun {
    /// Tokens scored.
    pub fn tokens(&self) -> usize {
        self.buckets.iter().map(|b| b.2).sum()
    }

    /// Mean NLL of every scored token (nats).
    pub fn mean_nll(&self) -> f64 {
        self.buckets.iter().map(|b| b.3).sum::<f64>() / self.tokens() as f64
    }
}

/// Bucket `b` of `buckets` over the scored positions 1..context: its first position and one past
/// its last (positions are the predicted token's index in its window).
fn bucket_range(b: usize, buckets: usize, context: usize) -> (usize, usize) {
    let scored = context - 1;
    (1 + b * scored / buckets, 1 + (b + 1) * scored / buckets)
}

/// The name a scaling's parts and table rows carry: `none`, or the scaling and its factor
/// (`yarn-x4`).
pub fn scaling_label(kind: &str, factor: f64) -> String {
    if kind == "none" {
        kind.to_string()
    } else {
        format!("{kind}-x{factor}")
    }
}

/// What identifies a model and its ring in a kept part's key (`hf ppl` and the `ppl` kind share
/// parts when they share a directory).
pub fn ring_key(model: &str, ranks: usize, strategy: &str, backend: &str) -> String {
    format!("model={model} ranks={ranks} strategy={strategy} backend={backend}")
}

/// How a scaling's windows are scored.
pub struct Scoring<'a> {
    /// Tokens a window holds.
    pub context: usize,
    /// Buckets of position.
    pub buckets: usize,
    /// Where the ring runs.
    pub decoding: Decoding<'a>,
    /// Where each window's sums are kept (resumed from when they match); none: not kept.
    pub parts: Option<PathBuf>,
    /// What identifies the model and ring in a part's key ([`ring_key`]).
    pub key: String,
}

/// Scores `windows` with `model` under `scaling` ([`scaling_label`]), summing into buckets; windows already
/// kept under `parts` with this key are read back instead of recomputed. `progress` is told each
/// window done.
pub fn score_windows<B: LayerBackend>(
    model: &Llama<B>,
    scaling: &str,
    windows: &[Vec<u32>],
    scoring: &Scoring,
    progress: &dyn Fn(),
) -> Result<PplRun> {
    let (context, buckets) = (scoring.context, scoring.buckets);
    if buckets == 0 || buckets >= context {
        bail!("--buckets {buckets} must be between 1 and the {context} − 1 scored positions");
    }
    let mut run = PplRun {
        scaling: scaling.to_string(),
        buckets: (0..buckets)
            .map(|b| {
                let (s, e) = bucket_range(b, buckets, context);
                (s, e, 0, 0.0)
            })
            .collect(),
        windows: windows.len(),
        resumed: 0,
        seconds: 0.0,
        engine_peak_bytes: 0,
    };
    if let Some(dir) = &scoring.parts {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (w, window) in windows.iter().enumerate() {
        let key = format!(
            "{} scaling={scaling} context={context} buckets={buckets} window={w} tokens={:016x}",
            scoring.key,
            fingerprint(window)
        );
        let path = scoring
            .parts
            .as_ref()
            .map(|dir| dir.join(format!("{scaling}-{w:05}.json")));
        let kept = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| serde_json::from_str::<WindowPart>(&text).ok())
            .filter(|part| part.key == key && part.tokens.len() == buckets);
        let part = match kept {
            Some(part) => {
                run.resumed += 1;
                part
            }
            None => {
                let started = Instant::now();
                let scored = crate::mpi_rank::score_here(
                    model,
                    &Prompt::from(window.clone()),
                    &scoring.decoding,
                )?;
                let mut part = WindowPart {
                    key,
                    nll_sums: vec![0.0; buckets],
                    tokens: vec![0; buckets],
                    seconds: 0.0,
                    engine_peak_bytes: scored.engine_peak_bytes.iter().copied().max().unwrap_or(0),
                };
                // nll[p] is the NLL of the token at position p + 1.
                for (p, &v) in scored.nll.iter().enumerate() {
                    let b = run.buckets.partition_point(|bucket| bucket.0 <= p + 1) - 1;
                    part.nll_sums[b] += v;
                    part.tokens[b] += 1;
                }
                part.seconds = started.elapsed().as_secs_f64();
                // Under a launcher every process holds the part: rank 0 writes it.
                let writer = crate::mpi_rank::launched_rank().is_none_or(|r| r == 0);
                if let Some(path) = path.as_ref().filter(|_| writer) {
                    write_whole(path, serde_json::to_string(&part)?.as_bytes())?;
                }
                part
            }
        };
        for (b, bucket) in run.buckets.iter_mut().enumerate() {
            bucket.2 += part.tokens[b];
            bucket.3 += part.nll_sums[b];
        }
        run.seconds += part.seconds;
        run.engine_peak_bytes = run.engine_peak_bytes.max(part.engine_peak_bytes);
        progress();
    }
    Ok(run)
}

/// FNV-1a of a window's tokens: a kept part names the tokens it scored.
fn fingerprint(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        t.to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    })
}

/// A table's setting columns: what every row of one `hf ppl` run shares.
pub struct Setting<'a> {
    /// The model's file or directory name.
    pub model: &'a str,
    /// The scaling factor (for the scalings other than `none`).
    pub factor: f64,
    /// Tokens a window holds.
    pub context: usize,
    /// Ranks the ring ran on.
    pub ranks: usize,
    /// Partition strategy.
    pub strategy: &'a str,
}

/// `ppl.csv` (per bucket), `ppl_summary.csv` (per scaling), their Markdown and `ppl.svg` under
/// `dir`.
pub fn write_tables(dir: &Path, setting: &Setting, runs: &[PplRun]) -> Result<()> {
    let cpu = cpu_model();
    let mut buckets = csv::Writer::from_writer(Vec::new());
    buckets.write_record([
        "model",
        "scaling",
        "factor",
        "context",
        "ranks",
        "strategy",
        "position_start",
        "position_end",
        "tokens",
        "mean_nll",
        "perplexity",
    ])?;
    let mut summary = csv::Writer::from_writer(Vec::new());
    summary.write_record([
        "model",
        "scaling",
        "factor",
        "context",
        "ranks",
        "strategy",
        "windows",
        "tokens",
        "mean_nll",
        "perplexity",
        "seconds",
        "engine_peak_mib",
        "cpu",
    ])?;
    let factor = |run: &PplRun| {
        if run.scaling == "none" {
            String::new()
        } else {
            setting.factor.to_string()
        }
    };
    let mut series = Vec::new();
    for run in runs {
        let mut points = Vec::new();
        for &(start, end, tokens, sum) in &run.buckets {
            let mean = sum / tokens.max(1) as f64;
            buckets.write_record([
                setting.model.to_string(),
                run.scaling.clone(),
                factor(run),
                setting.context.to_string(),
                setting.ranks.to_string(),
                setting.strategy.to_string(),
                start.to_string(),
                end.to_string(),
                tokens.to_string(),
                significant(mean, 6),
                significant(mean.exp(), 6),
            ])?;
            points.push(((start + end) as f64 / 2.0, mean.exp()));
        }
        summary.write_record([
            setting.model.to_string(),
            run.scaling.clone(),
            factor(run),
            setting.context.to_string(),
            setting.ranks.to_string(),
            setting.strategy.to_string(),
            run.windows.to_string(),
            run.tokens().to_string(),
            significant(run.mean_nll(), 6),
            significant(run.mean_nll().exp(), 6),
            significant(run.seconds, 4),
            significant(run.engine_peak_bytes as f64 / (1u64 << 20) as f64, 4),
            cpu.clone(),
        ])?;
        let name = match run.scaling.as_str() {
            "none" => "RoPE unchanged".to_string(),
            label => label.to_string(),
        };
        series.push(Series { name, points });
    }
    for (name, writer) in [("ppl", buckets), ("ppl_summary", summary)] {
        let bytes = writer.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
        write_whole(&dir.join(format!("{name}.csv")), &bytes)?;
        let md = markdown::from_csv(std::str::from_utf8(&bytes)?);
        write_whole(&dir.join(format!("{name}.md")), md.as_bytes())?;
    }
    let title = format!(
        "{}: perplexity by position, windows of {} tokens",
        setting.model, setting.context
    );
    line_chart(
        &dir.join("ppl.svg"),
        &Chart {
            title: &title,
            x: Axis::new("position in the window (bucket centre)", Scale::Linear),
            y: Axis::new("perplexity", Scale::Auto),
        },
        series,
    )
}

#[cfg(test)]
mod tests {
    use super::{bucket_range, scaling_label, windows};

    #[test]
    fn windows_are_whole_prefixed_and_capped() {
        let docs = vec![(0..10).collect::<Vec<u32>>(), vec![7, 8, 9]];
        let w = windows(&docs, 4, &[99], None).unwrap();
        // 3 body tokens a window: 10 → 3 windows (one token dropped), 3 → 1 window.
        assert_eq!(
            w,
            vec![
                vec![99, 0, 1, 2],
                vec![99, 3, 4, 5],
                vec![99, 6, 7, 8],
                vec![99, 7, 8, 9]
            ]
        );
        assert_eq!(
            windows(&docs, 4, &[99], std::num::NonZeroUsize::new(2))
                .unwrap()
                .len(),
            2
        );
        let e = windows(&docs, 11, &[], None).unwrap_err().to_string();
        assert!(
            e.contains("no window of 11 tokens: the longest document has 10"),
            "{e}"
        );
        let e = windows(&docs, 2, &[99], None).unwrap_err().to_string();
        assert!(e.contains("--context 2 leaves fewer than 2 tokens"), "{e}");
    }

    #[test]
    fn buckets_cover_every_scored_position_once() {
        for (context, buckets) in [(24, 4), (12, 5), (32768, 32), (3, 2)] {
            let mut next = 1;
            for b in 0..buckets {
                let (s, e) = bucket_range(b, buckets, context);
                assert_eq!(s, next, "context {context}, {buckets} buckets");
                assert!(e > s, "an empty bucket");
                next = e;
            }
            assert_eq!(next, context);
        }
        assert_eq!(scaling_label("none", 4.0), "none");
        assert_eq!(scaling_label("yarn", 4.0), "yarn-x4");
    }
}
