//! Kind `ppl`: perplexity by position of a pretrained model (a Hugging Face directory or GGUF file)
//! over a sweep of context × RoPE scaling × factor × ranks × strategy, each point the windows of the
//! spec's texts scored as `ringbench hf ppl` scores them (`perplexity::score_windows`).

use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use crate::perplexity::{Scoring, ring_key, scaling_label, score_windows, windows};
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::pretrained::{
    SCALINGS, load_pretrained, pretrained_config, pretrained_tokenizer, rope_override,
};
use crate::results::{Record, Table, significant};
use crate::spec::SpecText;
use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use workbench::hf::HfConfig;
use workbench::model::Llama;

/// The kind.
pub struct PplKind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    model: ModelSpec,
    data: Data,
    #[serde(default)]
    measure: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    contexts: Option<Vec<usize>>,
    /// `none`, `linear`, `dynamic`, `yarn`, `llama3`.
    scalings: Option<Vec<String>>,
    factors: Option<Vec<f64>>,
    ranks: Option<Vec<usize>>,
    strategies: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSpec {
    /// A Hugging Face directory or a GGUF file.
    hf: PathBuf,
    /// A PEFT LoRA adapter directory folded into its weights.
    #[serde(default)]
    adapter: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Data {
    /// Text files, each a document.
    text: Option<Vec<PathBuf>>,
    /// Or token ids, int32/int64 `[documents, tokens]`.
    tokens: Option<PathBuf>,
    /// Windows scored at most per point.
    max_windows: Option<NonZeroUsize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Measure {
    buckets: usize,
    /// Keep each window's sums under `parts/` beside the table, so a long point that stops
    /// resumes window by window (parts are matched by model name, ring and tokens, not weights).
    keep_parts: bool,
}

impl Default for Measure {
    fn default() -> Self {
        Measure {
            buckets: 8,
            keep_parts: false,
        }
    }
}

#[derive(Debug, Serialize)]
struct Row {
    context: usize,
    scaling: String,
    factor: f64,
    ranks: usize,
    strategy: String,
    model: String,
    windows: usize,
    tokens: usize,
    mean_nll: f64,
    perplexity: f64,
    /// Each bucket's mean NLL, space-separated, first position first.
    bucket_nll: String,
    seconds: f64,
    engine_peak_bytes: u64,
}

/// A point's key columns, as its rows hold them.
#[derive(Serialize)]
struct PointKey<'a> {
    context: usize,
    scaling: &'a str,
    factor: f64,
    ranks: usize,
    strategy: &'a str,
}

/// One point: (context, scaling, factor, ranks, strategy).
type Key = (usize, String, f64, usize, String);

struct PplPlan {
    points: Vec<Key>,
    path: PathBuf,
    adapter: Option<PathBuf>,
    documents: Vec<Vec<u32>>,
    prefix: Vec<u32>,
    max_windows: Option<NonZeroUsize>,
    buckets: usize,
    keep_parts: bool,
    config: HfConfig,
    model: Option<Llama<Flex>>,
}

/// NLL agrees to float32 rounding whose order differs between CPUs' kernels (the fixture bound).
const NLL: Check = Check::Within(1e-4);

const CARD: Card = Card {
    name: "ppl",
    about: "computed: a pretrained model's perplexity by position per context, RoPE scaling and ring",
    sweep_keys: &["contexts", "scalings", "factors", "ranks", "strategies"],
    key_columns: &["context", "scaling", "factor", "ranks", "strategy"],
    columns: &[
        Column::exact("model"),
        Column::exact("windows"),
        Column::exact("tokens"),
        Column {
            name: "mean_nll",
            check: NLL,
        },
        Column {
            name: "perplexity",
            check: NLL,
        },
        Column::shown("bucket_nll"),
        Column::measured("seconds"),
        Column::exact("engine_peak_bytes"),
    ],
};

impl Experiment for PplKind {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        let contexts = spec.list("sweep", "contexts", &s.contexts)?;
        let scalings = spec.list_or("sweep", "scalings", &s.scalings, vec!["none".into()])?;
        if let Some(bad) = scalings.iter().find(|k| !SCALINGS.contains(&k.as_str())) {
            return Err(spec.error(
                "sweep",
                "scalings",
                &format!("unknown scaling {bad:?}; known: {}", SCALINGS.join(", ")),
            ));
        }
        let factors = spec.list_or("sweep", "factors", &s.factors, vec![4.0])?;
        let ranks = spec.ranks("sweep", &s.ranks)?;
        let strategies =
            spec.list_or("sweep", "strategies", &s.strategies, vec!["zigzag".into()])?;
        spec.strategies("sweep", "strategies", &strategies)?;
        let path = parsed.model.hf.clone();
        let config = pretrained_config(&path)?;
        for kind in &scalings {
            for &factor in &factors {
                rope_override(kind, factor, &config)
                    .map_err(|e| spec.error("sweep", "scalings", &e.to_string()))?;
            }
        }
        let (documents, prefix) = match (&parsed.data.text, &parsed.data.tokens) {
            (Some(files), None) => {
                let Some(tokenizer) = pretrained_tokenizer(&path)? else {
                    bail!("{}: data.text needs the model's tokenizer", path.display());
                };
                let documents = files
                    .iter()
                    .map(|f| {
                        let text = std::fs::read_to_string(f)
                            .with_context(|| format!("reading {}", f.display()))?;
                        Ok(tokenizer.encode(&text, false)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                (documents, tokenizer.prefix()?)
            }
            (None, Some(ids)) => (crate::npy::read_ids(ids)?, Vec::new()),
            _ => return Err(spec.error("data", "text", "give text files or tokens, one of them")),
        };
        let mut points = Vec::new();
        for &context in contexts {
            // Each context must cut at least one window (checked now, not mid-sweep).
            windows(&documents, context, &prefix, parsed.data.max_windows)
                .map_err(|e| spec.error("sweep", "contexts", &e.to_string()))?;
            for kind in &scalings {
                // `none` has no factor: one point.
                let kind_factors: &[f64] = if kind == "none" { &[0.0] } else { &factors };
                for &factor in kind_factors {
                    for &n in ranks {
                        for strategy in &strategies {
                            points.push((context, kind.clone(), factor, n, strategy.clone()));
                        }
                    }
                }
            }
        }
        Ok(Box::new(PplPlan {
            points,
            path,
            adapter: parsed.model.adapter.clone(),
            documents,
            prefix,
            max_windows: parsed.data.max_windows,
            buckets: parsed.measure.buckets,
            keep_parts: parsed.measure.keep_parts,
            config,
            model: None,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // One panel per context; one line per (scaling, factor, ranks, strategy).
        let mut map: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            let get = |k| row.get(k).unwrap_or("");
            let context: f64 = row.num("context");
            let nll: Vec<f64> = get("bucket_nll")
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            let name = match get("scaling") {
                "none" => "RoPE unchanged".to_string(),
                s => format!("{s} ×{}", get("factor")),
            };
            let series = format!("{name}, N = {} {}", get("ranks"), get("strategy"));
            let points = map
                .entry((format!("{:06} tokens", context as usize), series))
                .or_default();
            let b = nll.len().max(1) as f64;
            for (i, v) in nll.iter().enumerate() {
                points.push(((i as f64 + 0.5) * (context - 1.0) / b + 1.0, v.exp()));
            }
        }
        panels(
            &dir.join("ppl.svg"),
            &Chart {
                title: "Perplexity by position",
                x: Axis::new("position in the window (bucket centre)", Scale::Linear),
                y: Axis::new("perplexity", Scale::Auto),
            },
            &Panel::grouped(map),
        )
    }
}

impl Plan for PplPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|(context, kind, factor, n, strategy)| {
                // Written by the serializer that writes the rows, so that a kept row matches its
                // point (a factor of 2 is "2.0" in both, not "2").
                let key = PointKey {
                    context: *context,
                    scaling: kind,
                    factor: *factor,
                    ranks: *n,
                    strategy,
                };
                Point::single(Record::of(&key).expect("a key of plain fields"))
            })
            .collect()
    }

    /// A point's ranks: under `--launcher`, a job of that many processes scores its windows.
    fn processes(&self, index: usize) -> Option<usize> {
        Some(self.points[index].3)
    }

    fn compute(&mut self, index: usize, ctx: &PointContext) -> Result<Vec<Record>> {
        let (context, kind, factor, ranks, strategy) = self.points[index].clone();
        if self.model.is_none() {
            let adapter = self.adapter.as_deref();
            self.model = Some(load_pretrained::<Flex>(&self.path, adapter, &Default::default())?.0);
        }
        let mut config = self.config.model.clone();
        if let Some(scaling) = rope_override(&kind, factor, &self.config)? {
            config.rope_scaling = scaling;
        }
        let model = self
            .model
            .clone()
            .expect("loaded above")
            .with_trunk_of(&config);
        let windows = windows(&self.documents, context, &self.prefix, self.max_windows)?;
        let partition = strategies::by_name(&strategy)?;
        let file_name = |p: &Path| {
            p.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        };
        // The model's name, and its adapter's where it has one: parts kept under another name are
        // never mixed in.
        let name = match &self.adapter {
            Some(adapter) => format!("{}+{}", file_name(&self.path), file_name(adapter)),
            None => file_name(&self.path),
        };
        // With keep_parts, each window's sums are kept beside the table: a point stopped mid-way
        // resumes from them.
        let scoring = Scoring {
            context,
            buckets: self.buckets,
            decoding: crate::line_retrieval::decoding(partition, ranks, 1),
            parts: self.keep_parts.then(|| ctx.dir.join("parts")),
            key: ring_key(&name, ranks, &strategy, "Flex"),
        };
        let label = scaling_label(&kind, factor);
        let run = score_windows(&model, &label, &windows, &scoring, &|| {})?;
        let bucket_nll = run
            .buckets
            .iter()
            .map(|b| significant(b.3 / b.2.max(1) as f64, 6))
            .collect::<Vec<_>>()
            .join(" ");
        Ok(vec![Record::of(&Row {
            context,
            scaling: kind,
            factor,
            ranks,
            strategy,
            model: name,
            windows: run.windows,
            tokens: run.tokens(),
            mean_nll: run.mean_nll(),
            perplexity: run.mean_nll().exp(),
            bucket_nll,
            seconds: run.seconds,
            engine_peak_bytes: run.engine_peak_bytes,
        })?])
    }
}
