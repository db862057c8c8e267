//! Kind `memory`: per-rank peak memory of a training step of a small LLaMA by method (vanilla,
//! memory-efficient, blockwise attention + FFN, ring) and what the blockwise layers rematerialize,
//! one layer's bytes beside the paper's Table 1, and the longest context under a budget (the paper's
//! Table 3, measured on this machine).

mod point;

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::measure::layer::layer_forward;
use crate::measure::training::{
    Method, SmallModel, Variant, layer_params, max_context, peak_per_rank,
};
use crate::memory_model::table1_layer_bytes;
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use crate::units::MIB;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use workbench::model::Checkpoint;

/// The kind.
pub struct Memory;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    model: SmallModel,
    measure: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    ranks: Option<Vec<usize>>,
    /// Tokens per rank; the first also caps every method's feed-forward chunks in the context
    /// search.
    block_sizes: Option<Vec<usize>>,
    /// What the blockwise methods' layers keep: `ffn` (the feed-forward's hidden activations are
    /// recomputed) and/or `block` (only each layer's input); default `["ffn"]`.
    checkpoints: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Measure {
    /// Per-rank budget for the maximum-context search.
    budget_mib: f64,
    /// The doubling search stops here.
    max_seq: usize,
    /// Methods to measure (default: all four).
    methods: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Task {
    Peak {
        variant: Variant,
        ranks: usize,
        seq: usize,
        block: usize,
    },
    MaxContext {
        variant: Variant,
        ranks: usize,
    },
}

struct MemoryPlan {
    tasks: Vec<Task>,
    small: SmallModel,
    budget: f64,
    max_seq: usize,
    block_cap: usize,
    /// The first checkpoint of the sweep: the single-rank blockwise baseline of vanilla and
    /// memory-efficient maximum contexts.
    baseline_remat: Checkpoint,
    warmed_up: bool,
}

const SEARCH_START: usize = 256;

const CARD: Card = Card {
    name: "memory",
    about: "measured: per-rank peak memory of a training step by method, and maximum context under a budget",
    sweep_keys: &["ranks", "block_sizes", "checkpoints"],
    key_columns: &["row_type", "method", "checkpoint", "ranks", "seq_len"],
    // The engine's ledger counts shapes (the same on every CPU); the allocator's figures depend on
    // the CPU's kernels and the scheduler.
    columns: &[
        Column::exact("engine_peak_bytes_per_rank"),
        Column::exact("table1_mib"),
        Column::exact("layer_params_mib"),
        Column::exact("budget_mib"),
        Column::measured("peak_mib_per_rank"),
        Column::measured("layer_kept_mib"),
        Column::measured("layer_forward_mib"),
        Column::measured("layer_largest_mib"),
        Column::measured("layer_largest_over_table1"),
        Column::measured("layer_kept_over_table1"),
        Column::measured("max_context_tokens"),
        Column::measured("max_context_over_one_rank_blockwise"),
    ],
};

impl Experiment for Memory {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let ranks = spec.ranks("sweep", &parsed.sweep.ranks)?;
        let blocks = spec.list("sweep", "block_sizes", &parsed.sweep.block_sizes)?;
        if parsed.model.layers == 0 {
            // One layer's bytes are the peak with the model's layers minus the peak with one fewer.
            return Err(spec.error("model", "layers", "must be at least 1"));
        }
        let remats: Vec<Checkpoint> = match &parsed.sweep.checkpoints {
            Some(names) => spec.parsed(
                "sweep",
                "checkpoints",
                spec.list("sweep", "checkpoints", &Some(names.clone()))?,
            )?,
            None => vec![Checkpoint::Ffn],
        };
        if remats.contains(&Checkpoint::None) {
            return Err(spec.error(
                "sweep",
                "checkpoints",
                "the blockwise methods rematerialize: ffn or block, not none (vanilla and \
                 memory-efficient keep every activation)",
            ));
        }
        // Vanilla and memory-efficient keep every activation: one variant each.
        let variants = |method: Method| -> Vec<Variant> {
            match method {
                Method::Vanilla | Method::MemoryEfficient => vec![Variant {
                    method,
                    remat: Checkpoint::None,
                }],
                Method::Blockwise | Method::Ring => remats
                    .iter()
                    .map(|&remat| Variant { method, remat })
                    .collect(),
            }
        };
        let m = &parsed.measure;
        let methods: Vec<Method> = match &m.methods {
            Some(names) => spec.parsed(
                "measure",
                "methods",
                spec.list("measure", "methods", &Some(names.clone()))?,
            )?,
            None => Method::ALL.to_vec(),
        };
        let mut tasks = Vec::new();
        for &c in blocks {
            for variant in methods.iter().flat_map(|&m| variants(m)) {
                for &n in ranks {
                    let ranks_used = if variant.method == Method::Ring { n } else { 1 };
                    let task = Task::Peak {
                        variant,
                        ranks: ranks_used,
                        seq: n * c,
                        block: c,
                    };
                    // Single-rank methods would repeat their (N = 1) points once per rank count.
                    if !tasks.contains(&task) {
                        tasks.push(task);
                    }
                }
            }
        }
        // One-rank blockwise first: every maximum context is compared with it.
        let mut order = methods.clone();
        order.sort_by_key(|m| *m != Method::Blockwise);
        for variant in order.into_iter().flat_map(variants) {
            let counts: Vec<usize> = if variant.method == Method::Ring {
                ranks.to_vec()
            } else {
                vec![1]
            };
            for n in counts {
                tasks.push(Task::MaxContext { variant, ranks: n });
            }
        }
        Ok(Box::new(MemoryPlan {
            tasks,
            small: parsed.model,
            budget: m.budget_mib * MIB,
            max_seq: m.max_seq,
            block_cap: blocks[0],
            baseline_remat: remats[0],
            warmed_up: false,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in table
            .rows
            .iter()
            .filter(|r| r.get("row_type") == Some("peak"))
        {
            let method = row.get("method").unwrap_or("");
            let ranks = if method == "ring" { "S/c" } else { "1" };
            let kept = match row.get("checkpoint") {
                Some(c) if c != "none" => format!(", checkpoint {c}"),
                _ => String::new(),
            };
            series
                .entry(format!("{method} (N = {ranks}{kept})"))
                .or_default()
                .push((row.num("seq_len"), row.num("peak_mib_per_rank")));
        }
        let chart = Chart {
            title: "Per-rank peak memory of a training step",
            x: Axis::new("sequence length S", Scale::Discrete),
            y: Axis::new("MiB per rank", Scale::Auto),
        };
        line_chart(&dir.join("memory.svg"), &chart, Series::sorted(series))
    }
}
