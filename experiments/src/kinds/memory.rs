//! Kind `memory`: per-rank peak memory of a training step of a small LLaMA by method (vanilla,
//! memory-efficient, blockwise attention + FFN, ring), and the longest context under a budget (the
//! paper's Table 3, measured on this machine).

use super::experiment::{Card, Experiment, Plan, Point, PointContext};
use crate::measure::training::{Method, SmallModel, max_context, peak_per_rank};
use crate::memory_model::table1_layer_bytes;
use crate::plot::{Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use crate::units::MIB;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

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
    /// Tokens per rank; the first also caps the single-rank methods' blocks in the context search.
    block_sizes: Option<Vec<usize>>,
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

#[derive(Debug, Serialize)]
struct Row {
    row_type: &'static str,
    method: &'static str,
    ranks: usize,
    /// Empty on max_context rows.
    seq_len: Option<usize>,
    peak_mib_per_rank: Option<f64>,
    engine_peak_bytes_per_rank: Option<u64>,
    /// What one more layer adds to the per-rank peak: the peak with the model's layers minus the
    /// peak with one layer fewer (the allocator's).
    layer_mib_measured: Option<f64>,
    /// The paper's Table 1 for this method and shape, doubled for f32.
    layer_mib_table1: Option<f64>,
    layer_measured_over_table1: Option<f64>,
    budget_mib: f64,
    /// Empty: not even the shortest length searched (256) fits.
    max_context_tokens: Option<usize>,
    max_context_over_one_rank_blockwise: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Task {
    Peak {
        method: Method,
        ranks: usize,
        seq: usize,
        block: usize,
    },
    MaxContext {
        method: Method,
        ranks: usize,
    },
}

struct MemoryPlan {
    tasks: Vec<Task>,
    small: SmallModel,
    budget: f64,
    max_seq: usize,
    block_cap: usize,
    warmed_up: bool,
}

const SEARCH_START: usize = 256;

const CARD: Card = Card {
    name: "memory",
    about: "measured: per-rank peak memory of a training step by method, and maximum context under a budget",
    sweep_keys: &["ranks", "block_sizes"],
    key_columns: &["row_type", "method", "ranks", "seq_len"],
    headline_columns: &[
        "engine_peak_bytes_per_rank",
        "layer_measured_over_table1",
        "max_context_over_one_rank_blockwise",
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
            for &method in &methods {
                for &n in ranks {
                    let ranks_used = if method == Method::Ring { n } else { 1 };
                    let task = Task::Peak {
                        method,
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
        for method in order {
            let counts: Vec<usize> = if method == Method::Ring {
                ranks.to_vec()
            } else {
                vec![1]
            };
            for n in counts {
                tasks.push(Task::MaxContext { method, ranks: n });
            }
        }
        Ok(Box::new(MemoryPlan {
            tasks,
            small: parsed.model,
            budget: m.budget_mib * MIB,
            max_seq: m.max_seq,
            block_cap: blocks[0],
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
            series
                .entry(format!("{method} (N = {ranks})"))
                .or_default()
                .push((row.num("seq_len"), row.num("peak_mib_per_rank")));
        }
        line_chart(
            &dir.join("memory.svg"),
            "Per-rank peak memory of a training step",
            "sequence length S",
            "MiB per rank",
            &Series::sorted(series),
        )
    }
}

/// The method's name in the paper's Table 1 ([`table1_layer_bytes`]).
fn table1_method(method: Method) -> &'static str {
    match method {
        Method::Vanilla => "vanilla",
        Method::MemoryEfficient => "memory-efficient",
        Method::Blockwise => "memory-efficient+ffn",
        Method::Ring => "ring",
    }
}

fn max_context_key(method: Method, ranks: usize) -> Record {
    Record::new([
        ("row_type", "max_context".to_string()),
        ("method", method.name().to_string()),
        ("ranks", ranks.to_string()),
    ])
}

impl Plan for MemoryPlan {
    fn points(&self) -> Vec<Point> {
        self.tasks
            .iter()
            .map(|t| match *t {
                Task::Peak {
                    method, ranks, seq, ..
                } => Point::single(Record::new([
                    ("row_type", "peak".to_string()),
                    ("method", method.name().to_string()),
                    ("ranks", ranks.to_string()),
                    ("seq_len", seq.to_string()),
                ])),
                Task::MaxContext { method, ranks } => Point::single(max_context_key(method, ranks)),
            })
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        if !self.warmed_up {
            // The first step of a process allocates once-only state (thread pools, caches).
            peak_per_rank(
                &self.small,
                Method::Blockwise,
                1,
                self.block_cap,
                self.block_cap,
            )?;
            self.warmed_up = true;
        }
        let budget_mib = self.budget / MIB;
        let row = match self.tasks[index] {
            Task::Peak {
                method,
                ranks,
                seq,
                block,
            } => {
                let peak = peak_per_rank(&self.small, method, ranks, seq, block)?;
                let fewer = SmallModel {
                    layers: self.small.layers - 1,
                    ..self.small
                };
                let layer =
                    peak.allocator - peak_per_rank(&fewer, method, ranks, seq, block)?.allocator;
                let m = &self.small;
                // Table 1's block is a ring rank's share, or a single rank's attention block.
                let table1 = 2.0
                    * table1_layer_bytes(
                        table1_method(method),
                        seq as f64,
                        (seq / ranks).min(block) as f64,
                        m.d_model as f64,
                        m.heads as f64,
                    );
                Row {
                    row_type: "peak",
                    method: method.name(),
                    ranks,
                    seq_len: Some(seq),
                    peak_mib_per_rank: Some(peak.allocator / MIB),
                    engine_peak_bytes_per_rank: Some(peak.engine),
                    layer_mib_measured: Some(layer / MIB),
                    layer_mib_table1: Some(table1 / MIB),
                    layer_measured_over_table1: Some(layer / table1),
                    budget_mib,
                    max_context_tokens: None,
                    max_context_over_one_rank_blockwise: None,
                }
            }
            Task::MaxContext { method, ranks } => {
                let search = |method: Method, ranks: usize, cap: usize| {
                    max_context(
                        &self.small,
                        method,
                        ranks,
                        cap,
                        self.budget,
                        SEARCH_START,
                        self.max_seq,
                    )
                };
                let cap = if method == Method::Ring {
                    usize::MAX
                } else {
                    self.block_cap
                };
                context
                    .bar
                    .set_message(format!("max context {} N={ranks}", method.name()));
                let best = search(method, ranks, cap)?;
                let baseline = if method == Method::Blockwise {
                    best
                } else {
                    match context.table.find(&max_context_key(Method::Blockwise, 1)) {
                        Some(row) => row.get("max_context_tokens").and_then(|v| v.parse().ok()),
                        None => search(Method::Blockwise, 1, self.block_cap)?,
                    }
                };
                Row {
                    row_type: "max_context",
                    method: method.name(),
                    ranks,
                    seq_len: None,
                    peak_mib_per_rank: None,
                    engine_peak_bytes_per_rank: None,
                    layer_mib_measured: None,
                    layer_mib_table1: None,
                    layer_measured_over_table1: None,
                    budget_mib,
                    max_context_tokens: best,
                    max_context_over_one_rank_blockwise: best
                        .zip(baseline)
                        .map(|(b, base)| b as f64 / base as f64),
                }
            }
        };
        Ok(vec![Record::of(&row)?])
    }
}
