//! Kind `model`: the whole model's prefill, decoding and training tokens/s over a sweep of work ×
//! length × ranks × strategy × weights, each point one `bench model` row (`bench::model::measure`),
//! the CPU named in every row.

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::bench::model::{BenchModelArgs, WeightType, measure};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The kind.
pub struct ModelKind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    model: ModelSpec,
    #[serde(default)]
    measure: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    /// `prefill`, `decode`, `train`.
    works: Option<Vec<String>>,
    /// Prompt (prefill, decode) or sequence (train) lengths.
    seq_lens: Option<Vec<usize>>,
    ranks: Option<Vec<usize>>,
    strategies: Option<Vec<String>>,
    /// `f32`, `bf16` (prefill and decode; training always runs in f32).
    weights: Option<Vec<String>>,
}

/// The model: a Hugging Face directory or GGUF file, or the project's own model of these sizes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ModelSpec {
    hf: Option<PathBuf>,
    d_model: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    vocab: Option<usize>,
}

impl Default for ModelSpec {
    fn default() -> Self {
        // `bench model`'s defaults: the line-retrieval model's sizes.
        ModelSpec {
            hf: None,
            d_model: 128,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            vocab: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Measure {
    /// Timed repetitions after one warm-up; the fastest is kept.
    repeats: usize,
    /// Tokens a decode point generates after its prompt.
    decode_tokens: usize,
    /// Sequences a training step.
    train_batch: usize,
}

impl Default for Measure {
    fn default() -> Self {
        Measure {
            repeats: 2,
            decode_tokens: 32,
            train_batch: 1,
        }
    }
}

#[derive(Debug, Serialize)]
struct Row {
    work: String,
    seq_len: usize,
    ranks: usize,
    strategy: String,
    weights: String,
    model: String,
    params: usize,
    batch: usize,
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    cores_busy: f64,
    threads: usize,
    cpu: String,
    cpu_features: String,
}

/// One point: (work, seq_len, ranks, strategy, weights).
type Key = (String, usize, usize, String, WeightType);

struct ModelPlan {
    points: Vec<Key>,
    model: ModelSpec,
    measure: Measure,
}

const CARD: Card = Card {
    name: "model",
    about: "measured: the whole model's prefill, decoding and training tokens/s, the CPU named",
    sweep_keys: &["works", "seq_lens", "ranks", "strategies", "weights"],
    key_columns: &["work", "seq_len", "ranks", "strategy", "weights"],
    columns: &[
        Column::exact("model"),
        Column::exact("params"),
        Column::exact("batch"),
        Column::exact("tokens"),
        Column::measured("seconds"),
        Column::measured("tokens_per_s"),
        Column::measured("cores_busy"),
        Column::shown("threads"),
        Column::shown("cpu"),
        Column::shown("cpu_features"),
        Column::shown("simd"),
        Column::measured("load_seconds"),
    ],
};

/// The name a weight type has in a spec and a row.
fn weights_name(w: WeightType) -> &'static str {
    match w {
        WeightType::F32 => "f32",
        WeightType::Bf16 => "bf16",
    }
}

impl Experiment for ModelKind {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        let works = spec.list("sweep", "works", &s.works)?;
        for w in works {
            if !["prefill", "decode", "train"].contains(&w.as_str()) {
                return Err(spec.error(
                    "sweep",
                    "works",
                    &format!("unknown work {w:?}; known: prefill, decode, train"),
                ));
            }
        }
        let seqs = spec.list("sweep", "seq_lens", &s.seq_lens)?;
        let ranks = spec.ranks("sweep", &s.ranks)?;
        let strategies =
            spec.list_or("sweep", "strategies", &s.strategies, vec!["zigzag".into()])?;
        spec.strategies("sweep", "strategies", &strategies)?;
        let weights = spec.list_or("sweep", "weights", &s.weights, vec!["f32".into()])?;
        let weights = weights
            .iter()
            .map(|w| match w.as_str() {
                "f32" => Ok(WeightType::F32),
                "bf16" => Ok(WeightType::Bf16),
                other => Err(spec.error(
                    "sweep",
                    "weights",
                    &format!("unknown weights {other:?}; known: f32, bf16"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut points = Vec::new();
        for work in works {
            for &seq in seqs {
                for &n in ranks {
                    for strategy in &strategies {
                        for &w in &weights {
                            // Training always runs in f32: one point, not one per weight type.
                            if work == "train" && w != weights[0] {
                                continue;
                            }
                            let w = if work == "train" { WeightType::F32 } else { w };
                            points.push((work.clone(), seq, n, strategy.clone(), w));
                        }
                    }
                }
            }
        }
        Ok(Box::new(ModelPlan {
            points,
            model: parsed.model,
            measure: parsed.measure,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            let name = |k| row.get(k).unwrap_or("");
            series
                .entry(format!(
                    "{}, N = {}, {}, {}",
                    name("work"),
                    name("ranks"),
                    name("strategy"),
                    name("weights")
                ))
                .or_default()
                .push((row.num("seq_len"), row.num("tokens_per_s")));
        }
        let chart = Chart {
            title: "The whole model's throughput",
            x: Axis::new("tokens of a prompt or sequence", Scale::Discrete),
            y: Axis::new("tokens/s", Scale::Log),
        };
        line_chart(&dir.join("model.svg"), &chart, Series::sorted(series))
    }
}

impl Plan for ModelPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|(work, seq, n, strategy, w)| {
                Point::single(Record::new([
                    ("work", work.clone()),
                    ("seq_len", seq.to_string()),
                    ("ranks", n.to_string()),
                    ("strategy", strategy.clone()),
                    ("weights", weights_name(*w).to_owned()),
                ]))
            })
            .collect()
    }

    fn compute(&mut self, index: usize, _: &PointContext) -> Result<Vec<Record>> {
        let (work, seq, ranks, strategy, weights) = self.points[index].clone();
        let m = &self.model;
        let args = BenchModelArgs {
            model: m.hf.clone(),
            d_model: m.d_model,
            layers: m.layers,
            heads: m.heads,
            kv_heads: m.kv_heads,
            ffn_multiple_of: 32,
            vocab: m.vocab,
            prefill: if work == "prefill" { vec![seq] } else { vec![] },
            decode: if work == "decode" {
                self.measure.decode_tokens.max(1)
            } else {
                0
            },
            decode_prompt: seq,
            train_seq: if work == "train" { seq } else { 0 },
            train_batch: self.measure.train_batch.max(1),
            train_lora: 0,
            ranks: vec![ranks],
            strategy: strategy.clone(),
            repeats: self.measure.repeats.max(1),
            weights,
            out: None,
        };
        let (rows, _) = measure(&args)?;
        let r = rows
            .into_iter()
            .next()
            .context("bench model measured no row")?;
        Ok(vec![Record::of(&Row {
            work,
            seq_len: seq,
            ranks,
            strategy,
            weights: weights_name(weights).to_owned(),
            model: r.model,
            params: r.params,
            batch: r.batch,
            tokens: r.tokens,
            seconds: r.seconds,
            tokens_per_s: r.tokens_per_s,
            cores_busy: r.cores_busy,
            threads: r.threads,
            cpu: r.cpu,
            cpu_features: r.cpu_features,
        })?])
    }
}
