//! Kind `retrieval`: the Figure 3 analog as a runner spec: committed line-retrieval checkpoints
//! evaluated on fresh held-out LongChat cases (line names no training prompt used), decoded over a KV
//! cache sharded on N ranks; exact-match accuracy against the prompt's length, each model's trained
//! length marked.

use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use crate::line_retrieval::{
    Evaluation, decoding, evaluate, pretrained_options, start::load_trained, trained_lines,
};
use crate::mpi_rank::decode_here;
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::pretrained::is_gguf;
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::{Context, Result};
use burn::backend::Flex;
use datasets::ChatTemplate;
use datasets::{Case, SplitMix64, TextTokenizer, WordSplit, generate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use strategies::Partition;
use workbench::model::Llama;
use workbench::train::{Decoded, Decoding};

/// The kind.
pub struct Retrieval;

/// How far two CPUs' logits of the same checkpoint may lie apart, relative to their row's scale:
/// each lies within the decode exactness suite's bound of the exact logits (`tests/tests/decode.rs`
/// asserts the cached decoding against the recompute within it), so twice that. A reply step whose
/// best two logits are closer than this may pick the other token on another CPU.
const NEAR_TIE: f64 = 2.0 * reference::bounds::F32_ATTENTION;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    cases: Cases,
    #[serde(default)]
    decode: DecodeSpec,
    /// The checkpoints, in the order they are evaluated and drawn.
    model: Vec<ModelEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    /// Lines per prompt.
    num_lines: Option<Vec<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    /// Cases per number of lines.
    per_count: usize,
    /// Seeds the generator (one stream over the line counts in the sweep's order).
    seed: u64,
    /// The word lists the records' names come from: `eval` (the held-out fifth of the training
    /// lists, 441 names), `fresh` (lists of their own, 1,600 names, for longer records), `train`
    /// or `all`.
    #[serde(default = "eval_split")]
    split: String,
}

fn eval_split() -> String {
    "eval".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DecodeSpec {
    ranks: usize,
    strategy: String,
    /// Prompts decoded together.
    batch: usize,
}

impl Default for DecodeSpec {
    fn default() -> Self {
        DecodeSpec {
            ranks: 2,
            strategy: "zigzag".into(),
            batch: 25,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    /// The row's label.
    name: String,
    /// A checkpoint directory (`ringbench train`'s, or a Hugging Face one), or a GGUF file.
    checkpoint: PathBuf,
    /// A PEFT LoRA adapter directory folded into the checkpoint's weights.
    #[serde(default)]
    adapter: Option<PathBuf>,
    /// The figure's panel (default: one panel).
    #[serde(default)]
    panel: String,
    /// Prompt through the model's chat template (a Hugging Face or GGUF instruct model).
    #[serde(default)]
    chat: bool,
    /// Tokens a reply has at most (8 by default: a number and EOS).
    max_new: Option<usize>,
    /// The model's RoPE scaling overridden at evaluation: linear, dynamic, yarn or llama3.
    rope_scaling: Option<String>,
    /// Its factor (4 by default).
    factor: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Row {
    model: String,
    num_lines: usize,
    panel: String,
    /// The most lines of the checkpoint's training prompts (its train.toml; empty when it has none).
    trained_lines: Option<usize>,
    cases: usize,
    correct: usize,
    accuracy: f64,
    /// Cases with a reply step whose best two logits lie within [`NEAR_TIE`] of each other.
    near_ties: usize,
    prompt_tokens: f64,
    prefill_seconds: f64,
    decode_seconds: f64,
}

const CARD: Card = Card {
    name: "retrieval",
    about: "measured: held-out line-retrieval accuracy of trained checkpoints against prompt length, \
            decoded over a KV cache sharded on N ranks (Figure 3 analog)",
    sweep_keys: &["num_lines", "[[model]]", "[cases]", "[decode]"],
    key_columns: &["model", "num_lines"],
    columns: &[
        Column::shown("panel"),
        Column::exact("trained_lines"),
        Column::exact("cases"),
        // Exact unless a case's reply has a near tie (see `check`).
        Column::exact("correct"),
        Column::exact("accuracy"),
        Column::shown("near_ties"),
        Column::exact("prompt_tokens"),
        Column::measured("prefill_seconds"),
        Column::measured("decode_seconds"),
    ],
};

struct RetrievalPlan {
    models: Vec<ModelEntry>,
    /// (model index, line count index).
    points: Vec<(usize, usize)>,
    num_lines: Vec<usize>,
    /// Per line count, its cases.
    cases: Vec<Vec<Case>>,
    decode: DecodeSpec,
    partition: &'static dyn Partition,
    /// The model loaded last: (index, model, tokenizer, trained lines).
    loaded: Option<Loaded>,
}

struct Loaded {
    index: usize,
    model: Llama<Flex>,
    tokenizer: Box<dyn TextTokenizer>,
    chat: Option<ChatTemplate>,
    trained_lines: Option<usize>,
}

impl Experiment for Retrieval {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let num_lines = spec
            .list("sweep", "num_lines", &parsed.sweep.num_lines)?
            .to_vec();
        if num_lines.contains(&0) {
            return Err(spec.error("sweep", "num_lines", "a prompt needs at least 1 line"));
        }
        if parsed.cases.per_count == 0 {
            return Err(spec.error("cases", "per_count", "evaluate at least 1 case"));
        }
        if parsed.decode.ranks == 0 {
            return Err(spec.error("decode", "ranks", "decode on at least 1 rank"));
        }
        if parsed.decode.batch == 0 {
            return Err(spec.error("decode", "batch", "decode at least 1 prompt at a time"));
        }
        if parsed.model.is_empty() {
            return Err(spec.error("", "model", "name at least one [[model]] checkpoint"));
        }
        for (i, m) in parsed.model.iter().enumerate() {
            if parsed.model[..i].iter().any(|o| o.name == m.name) {
                return Err(spec.error(
                    "",
                    "model",
                    &format!("two [[model]] entries are named '{}'", m.name),
                ));
            }
            let gguf_file = is_gguf(&m.checkpoint) && m.checkpoint.is_file();
            if !(m.checkpoint.is_dir() || gguf_file) {
                return Err(spec.error(
                    "",
                    "model",
                    &format!(
                        "[[model]] '{}': checkpoint {} is not a directory or GGUF file",
                        m.name,
                        m.checkpoint.display()
                    ),
                ));
            }
        }
        let partition = spec.strategies(
            "decode",
            "strategy",
            std::slice::from_ref(&parsed.decode.strategy),
        )?[0];
        let split = WordSplit::by_name(&parsed.cases.split).ok_or_else(|| {
            spec.error(
                "cases",
                "split",
                &format!(
                    "unknown split '{}': {}",
                    parsed.cases.split,
                    WordSplit::names()
                ),
            )
        })?;
        let mut rng = SplitMix64::new(parsed.cases.seed);
        let cases = num_lines
            .iter()
            .map(|&n| {
                (0..parsed.cases.per_count)
                    .map(|_| generate(&mut rng, n, split))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| spec.error("sweep", "num_lines", &e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let points = (0..parsed.model.len())
            .flat_map(|m| (0..num_lines.len()).map(move |l| (m, l)))
            .collect();
        Ok(Box::new(RetrievalPlan {
            models: parsed.model,
            points,
            num_lines,
            cases,
            decode: parsed.decode,
            partition,
            loaded: None,
        }))
    }

    /// `correct` and `accuracy` are exact, but each case the reference row records as a near tie
    /// may go the other way on another CPU: `correct` may move by at most the reference's near ties
    /// (a count), `accuracy` by that count over the reference's cases. The allowance is the
    /// reference's, never this run's own: a model whose logits are flat ties everywhere.
    fn check(&self, reference: &Record, column: &Column) -> Check {
        let ties = reference.num("near_ties");
        match column.name {
            "correct" | "accuracy" if ties.is_nan() => Check::Exact,
            "correct" | "accuracy" if ties > 0.0 => Check::Absolute(if column.name == "correct" {
                ties
            } else {
                ties / reference.num("cases")
            }),
            _ => column.check,
        }
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // Per panel: accuracy against prompt tokens per model, and each trained length the panel's
        // models have, drawn at its evaluated prompt length.
        let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        let mut tokens_at: BTreeMap<(String, u64), f64> = BTreeMap::new();
        let mut trained: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for row in &table.rows {
            let panel = row.get("panel").unwrap_or("").to_owned();
            let model = row.get("model").unwrap_or("").to_owned();
            let tokens = row.num("prompt_tokens");
            let trained_lines = row.get("trained_lines").and_then(|t| t.parse::<u64>().ok());
            let name = match trained_lines {
                Some(t) => format!("{model} (trained ≤ {t} lines)"),
                None => model,
            };
            lines
                .entry((panel.clone(), name))
                .or_default()
                .push((tokens, row.num("accuracy")));
            tokens_at.insert((panel.clone(), row.num("num_lines") as u64), tokens);
            if let Some(t) = trained_lines {
                trained.entry(panel).or_default().push(t);
            }
        }
        for (panel, mut lengths) in trained {
            lengths.sort_unstable();
            lengths.dedup();
            for t in lengths {
                if let Some(&tokens) = tokens_at.get(&(panel.clone(), t)) {
                    lines.insert(
                        (
                            panel.clone(),
                            format!("trained length {t} lines (~{tokens:.0} tokens)"),
                        ),
                        vec![(tokens, 0.0), (tokens, 1.0)],
                    );
                }
            }
        }
        panels(
            &dir.join("accuracy.svg"),
            &Chart {
                title: "Line retrieval: held-out exact match against prompt length",
                x: Axis::new("prompt length (tokens)", Scale::Linear),
                y: Axis::new("exact-match accuracy", Scale::Linear),
            },
            &Panel::grouped(lines),
        )
    }
}

impl RetrievalPlan {
    /// The model of entry `index`, loaded once while its points run.
    fn load(&mut self, index: usize) -> Result<&Loaded> {
        if self.loaded.as_ref().is_none_or(|l| l.index != index) {
            let entry = &self.models[index];
            let (mut model, tokenizer) = load_trained::<Flex>(
                &entry.checkpoint,
                entry.adapter.as_deref(),
                &Default::default(),
            )
            .with_context(|| format!("[[model]] '{}'", entry.name))?;
            let (chat, scaled) = pretrained_options(
                &entry.checkpoint,
                entry.adapter.as_deref(),
                entry.chat,
                (
                    entry.rope_scaling.as_deref().unwrap_or("none"),
                    entry.factor.unwrap_or(4.0),
                ),
            )
            .with_context(|| format!("[[model]] '{}'", entry.name))?;
            if let Some(config) = scaled {
                model = model.with_trunk_of(&config);
            }
            // A LoRA run's train.toml lies beside its adapter.
            let trained_lines = trained_lines(entry.adapter.as_ref().unwrap_or(&entry.checkpoint));
            self.loaded = Some(Loaded {
                index,
                model,
                tokenizer,
                chat,
                trained_lines,
            });
        }
        Ok(self.loaded.as_ref().expect("loaded above"))
    }
}

impl Plan for RetrievalPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|&(m, l)| {
                Point::single(Record::new([
                    ("model", self.models[m].name.clone()),
                    ("num_lines", self.num_lines[l].to_string()),
                ]))
            })
            .collect()
    }

    fn processes(&self, _index: usize) -> Option<usize> {
        Some(self.decode.ranks)
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let (m, l) = self.points[index];
        let (ranks, batch, partition) = (self.decode.ranks, self.decode.batch, self.partition);
        let cases = self.cases[l].clone();
        let (name, panel) = (self.models[m].name.clone(), self.models[m].panel.clone());
        let max_new = self.models[m].max_new;
        let loaded = self.load(m)?;
        let stop = [loaded.tokenizer.eos()];
        context.bar.set_message(format!("{} cases", cases.len()));
        let decoding = Decoding {
            stop: &stop,
            pad: loaded.tokenizer.eos(),
            keep_logits: true,
            sampling: Default::default(),
            stop_reply: None,
            max_new: max_new.unwrap_or(8),
            ..decoding(partition, ranks, batch)
        };
        let mut near_ties = 0;
        let evaluation: Evaluation = evaluate(
            &*loaded.tokenizer,
            loaded.chat.as_ref(),
            &cases,
            |prompts| {
                let decoded = decode_here(&loaded.model, prompts, &decoding)?;
                for i in 0..prompts.len() {
                    near_ties += usize::from(has_near_tie(&decoded, i)?);
                }
                Ok(decoded)
            },
        )?;
        let row = &evaluation.rows[0];
        let out = Row {
            model: name,
            num_lines: row.num_lines,
            panel,
            trained_lines: loaded.trained_lines,
            cases: row.cases,
            correct: row.correct,
            accuracy: row.accuracy,
            near_ties,
            prompt_tokens: row.prompt_tokens,
            prefill_seconds: row.prefill_seconds,
            decode_seconds: row.decode_seconds,
        };
        Ok(vec![Record::of(&out)?])
    }
}

/// Whether a step of prompt `i`'s reply picked its token by a margin under [`NEAR_TIE`] of the
/// step's largest logit (a NaN logit counts: its pick is not reproducible either).
fn has_near_tie(decoded: &Decoded, i: usize) -> Result<bool> {
    let steps = decoded.replies[i].len() + usize::from(decoded.ended_by[i].is_some());
    near_tie(&decoded.logits[i], steps).with_context(|| format!("prompt {i}"))
}

/// Whether any of the `steps` rows of `logits` (`[steps, vocab]` flat) has its best two values
/// within [`NEAR_TIE`] of the row's largest magnitude, or a NaN.
fn near_tie(logits: &[f32], steps: usize) -> Result<bool> {
    if steps == 0 || logits.is_empty() || !logits.len().is_multiple_of(steps) {
        anyhow::bail!(
            "{} kept logits do not split into {steps} reply steps",
            logits.len()
        );
    }
    Ok(logits.chunks(logits.len() / steps).any(|row| {
        let (mut best, mut second, mut scale) = (f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0f64);
        for &x in row {
            let x = f64::from(x);
            if x.is_nan() {
                return true;
            }
            scale = scale.max(x.abs());
            if x > best {
                second = best;
                best = x;
            } else if x > second {
                second = x;
            }
        }
        best - second <= NEAR_TIE * scale
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_whose_best_two_logits_are_within_rounding_is_a_near_tie() {
        // Row scale 10: the margin must exceed 2e-5 * 10 = 2e-4.
        assert!(!near_tie(&[10.0, 9.0, -3.0], 1).unwrap());
        assert!(near_tie(&[10.0, 10.0 - 1e-4, -3.0], 1).unwrap());
        assert!(!near_tie(&[10.0, 10.0 - 1e-3, -3.0], 1).unwrap());
        // Any step of the reply: the second row ties.
        assert!(near_tie(&[1.0, 0.0, 5.0, 5.0], 2).unwrap());
        // A NaN logit makes the pick irreproducible.
        assert!(near_tie(&[1.0, f32::NAN, 0.0], 1).unwrap());
        // Logits that do not split into the reply's steps are refused, not guessed.
        let err = near_tie(&[1.0, 2.0, 3.0], 2).unwrap_err().to_string();
        assert!(
            err.contains("3 kept logits") && err.contains("2 reply steps"),
            "{err}"
        );
        assert!(near_tie(&[], 0).is_err());
    }

    #[test]
    fn correct_moves_by_at_most_the_references_near_ties() {
        let column = Column::exact("correct");
        let row = |ties: &str| {
            Record::new([
                ("correct", "40"),
                ("near_ties", ties),
                ("accuracy", "0.4"),
                ("cases", "100"),
            ])
        };
        assert_eq!(Retrieval.check(&row("0"), &column), Check::Exact);
        assert_eq!(Retrieval.check(&row("2"), &column), Check::Absolute(2.0));
        assert_eq!(
            Retrieval.check(&row("2"), &Column::exact("accuracy")),
            Check::Absolute(0.02)
        );
        assert_eq!(
            Retrieval.check(&row("2"), &Column::exact("prompt_tokens")),
            Check::Exact
        );
    }

    #[test]
    fn a_spec_with_a_missing_or_twice_named_checkpoint_is_refused_by_name() {
        let plan = |models: &str| {
            let text = format!(
                "kind = \"retrieval\"\n[sweep]\nnum_lines = [2]\n[cases]\nper_count = 1\nseed = 0\n{models}"
            );
            let spec = SpecText::from_text(Path::new("r.toml"), text).unwrap();
            Retrieval.plan(&spec).err().map(|e| format!("{e:#}"))
        };
        let missing =
            plan("[[model]]\nname = \"a\"\ncheckpoint = \"/nonexistent/ckpt\"\n").unwrap();
        assert!(
            missing.contains("/nonexistent/ckpt") && missing.contains("'a'"),
            "{missing}"
        );
        let dir = std::env::temp_dir();
        let twice = plan(&format!(
            "[[model]]\nname = \"a\"\ncheckpoint = \"{0}\"\n[[model]]\nname = \"a\"\ncheckpoint = \"{0}\"\n",
            dir.display()
        ))
        .unwrap();
        assert!(
            twice.contains("two [[model]] entries are named 'a'"),
            "{twice}"
        );
        let none = plan("").unwrap();
        assert!(none.contains("model"), "{none}");
        let one = format!(
            "[[model]]\nname = \"a\"\ncheckpoint = \"{}\"\n",
            dir.display()
        );
        let split = plan(&format!("split = \"heldout\"\n{one}")).unwrap();
        assert!(
            split.contains("unknown split 'heldout'") && split.contains("fresh"),
            "{split}"
        );
        assert_eq!(plan(&format!("split = \"fresh\"\n{one}")), None);
    }
}
