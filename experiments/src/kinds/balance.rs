//! Kind `balance`: the causal load balance of the partition strategies, one forward ring pass
//! simulated on a hardware profile, with tile costs from exact FLOP counts or timed on this machine.

use super::documents::Documents;
use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use super::shape::{ModelShape, TileCosts};
use crate::hardware::{Profile, profile, profile_names};
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::results::{Record, Table};
use crate::simulator::simulate;
use crate::spec::SpecText;
use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use strategies::{Mask, Partition, Window, visible_pairs, windows, work_per_rank};
use workbench::Direction;
use workbench::kernels::flops::FORWARD_PER_PAIR_DIM;

/// The kind.
pub struct Balance;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    model: ModelShape,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    strategies: Option<Vec<String>>,
    ranks: Option<Vec<usize>>,
    /// Tokens per rank (the ring's block size c).
    block_sizes: Option<Vec<usize>>,
    profiles: Option<Vec<String>>,
    /// Packed documents: `"none"` (one sequence), `"longtail:MAX"` (lengths from 1 to MAX with a
    /// long tail) or `"random:MEAN"` (lengths around MEAN), filling the sequence ([`Documents`]).
    documents: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct Row {
    strategy: &'static str,
    ranks: usize,
    block_size: usize,
    profile: &'static str,
    /// Empty unless the sweep packs documents.
    documents: Option<String>,
    /// Documents in the sequence (1: not packed).
    document_count: usize,
    tile_costs: &'static str,
    work_max_over_mean: f64,
    makespan_ms: f64,
    speedup_over_contiguous: f64,
    theoretical_speedup: f64,
    contiguous_imbalance_2n_minus_1_over_n: f64,
    overlap_efficiency: f64,
}

/// Profiles by name; an unknown one names the key and line.
pub fn profiles(spec: &SpecText, names: &[String]) -> Result<Vec<&'static Profile>> {
    names
        .iter()
        .map(|n| {
            profile(n).ok_or_else(|| {
                spec.error(
                    "sweep",
                    "profiles",
                    &format!("unknown profile '{n}'; known: {}", profile_names()),
                )
            })
        })
        .collect()
}

/// One sweep point: strategy, ranks, block size, profile, documents (by the sweep's name for them).
type BalancePoint = (
    &'static dyn Partition,
    usize,
    usize,
    &'static Profile,
    Option<Documents>,
);

struct BalancePlan {
    points: Vec<BalancePoint>,
    model: ModelShape,
    /// This machine's matmul rate, measured once per run (measured tile costs only).
    matmul_flops: Option<f64>,
}

const CARD: Card = Card {
    name: "balance",
    about: "causal load balance of each strategy: a simulated forward ring pass on a hardware profile",
    sweep_keys: &[
        "strategies",
        "ranks",
        "block_sizes",
        "profiles",
        "documents",
    ],
    key_columns: &["strategy", "ranks", "block_size", "profile", "documents"],
    columns: &[
        Column::exact("document_count"),
        Column::exact("tile_costs"),
        Column::exact("work_max_over_mean"),
        Column::exact("makespan_ms"),
        Column::exact("speedup_over_contiguous"),
        Column::exact("theoretical_speedup"),
        Column::exact("contiguous_imbalance_2n_minus_1_over_n"),
        Column::exact("overlap_efficiency"),
    ],
};

/// The columns a simulation computes from its tile costs: measurements when the costs were timed.
const FROM_TILE_COSTS: &[&str] = &[
    "makespan_ms",
    "speedup_over_contiguous",
    "overlap_efficiency",
];

impl Experiment for Balance {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn check(&self, row: &Record, column: &Column) -> Check {
        if row.get("tile_costs") == Some("measured") && FROM_TILE_COSTS.contains(&column.name) {
            Check::Measured
        } else {
            column.check
        }
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        let strategies = spec.strategies(
            "sweep",
            "strategies",
            spec.list("sweep", "strategies", &s.strategies)?,
        )?;
        let ranks = spec.ranks("sweep", &s.ranks)?;
        let blocks = spec.list("sweep", "block_sizes", &s.block_sizes)?;
        let profiles = profiles(spec, spec.list("sweep", "profiles", &s.profiles)?)?;
        let documents = Documents::axis(spec, &s.documents)?;
        if parsed.model.tile_costs == TileCosts::Measured
            && documents
                .iter()
                .any(|d| matches!(d, Some(Documents::LongTail(_) | Documents::Random(_))))
        {
            return Err(spec.error(
                "sweep",
                "documents",
                "packed documents need tile_costs = \"flops\" (tiles are timed without documents)",
            ));
        }
        let mut points = Vec::new();
        for &docs in &documents {
            for &p in &profiles {
                for &block in blocks {
                    for &n in ranks {
                        // Contiguous first: it is every other strategy's baseline.
                        let mut order = strategies.clone();
                        order.sort_by_key(|s| s.name() != strategies::Contiguous.name());
                        for strategy in order {
                            points.push((strategy, n, block, p, docs));
                        }
                    }
                }
            }
        }
        Ok(Box::new(BalancePlan {
            points,
            model: parsed.model,
            matmul_flops: None,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // A panel per block size, profile and documents; a line per strategy.
        let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            let panel = format!(
                "c = {}, {}{}",
                row.get("block_size").unwrap_or(""),
                row.get("profile").unwrap_or(""),
                row.get("documents")
                    .filter(|d| !d.is_empty())
                    .map_or(String::new(), |d| format!(", {d}"))
            );
            lines
                .entry((panel, row.get("strategy").unwrap_or("").to_owned()))
                .or_default()
                .push((row.num("ranks"), row.num("speedup_over_contiguous")));
        }
        let chart = Chart {
            title: "Causal ring pass: simulated speedup over contiguous",
            x: Axis::new("ranks N", Scale::Discrete),
            y: Axis::new("speedup", Scale::Linear),
        };
        panels(&dir.join("speedup.svg"), &chart, &Panel::grouped(lines))
    }
}

fn key(strategy: &str, ranks: usize, block: usize, p: &Profile, docs: Option<Documents>) -> Record {
    let mut key = Record::new([
        ("strategy", strategy.to_string()),
        ("ranks", ranks.to_string()),
        ("block_size", block.to_string()),
        ("profile", p.name.to_string()),
    ]);
    // A sweep without documents keys its rows as it always did.
    if let Some(docs) = docs {
        key.0.push(("documents".into(), docs.name()));
    }
    key
}

impl Plan for BalancePlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|&(s, n, c, p, docs)| Point::single(key(s.name(), n, c, p, docs)))
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let (strategy, ranks, block, p, docs) = self.points[index];
        let doc_lens = docs.map_or(Vec::new(), |d| d.lengths(ranks * block));
        let contiguous = &strategies::Contiguous;
        // Contiguous is its own baseline; any other strategy reads contiguous's makespan from the
        // table when it is there (measured tiles are noisy: one baseline per point), else
        // simulates it.
        let baseline = if strategy.name() == contiguous.name() {
            None
        } else {
            match context
                .table
                .find(&key(contiguous.name(), ranks, block, p, docs))
            {
                Some(row) => Some(row.num("makespan_ms") / 1e3),
                None => Some(
                    self.simulate_pass(contiguous, ranks, block, p, &doc_lens)?
                        .1,
                ),
            }
        };
        let (work, makespan, overlap_efficiency) =
            self.simulate_pass(strategy, ranks, block, p, &doc_lens)?;
        let mean = work.iter().sum::<u64>() as f64 / ranks as f64;
        let max = *work.iter().max().unwrap_or(&0) as f64;
        // Contiguous's busiest rank: (2N − 1)/N of the mean for one sequence; counted when packed.
        let contiguous_max = if doc_lens.is_empty() {
            (2 * ranks - 1) as f64 / ranks as f64 * mean
        } else {
            let layout = contiguous.layout(ranks * block, ranks)?;
            *work_per_rank(&layout, &doc_lens, Mask::causal(true))
                .iter()
                .max()
                .unwrap_or(&0) as f64
        };
        Ok(vec![Record::of(&Row {
            strategy: strategy.name(),
            ranks,
            block_size: block,
            profile: p.name,
            documents: docs.map(Documents::name),
            document_count: doc_lens.len().max(1),
            tile_costs: match self.model.tile_costs {
                TileCosts::Flops => "flops",
                TileCosts::Measured => "measured",
            },
            work_max_over_mean: max / mean,
            makespan_ms: makespan * 1e3,
            speedup_over_contiguous: baseline.unwrap_or(makespan) / makespan,
            theoretical_speedup: contiguous_max / max,
            contiguous_imbalance_2n_minus_1_over_n: (2 * ranks - 1) as f64 / ranks as f64,
            overlap_efficiency,
        })?])
    }
}

impl BalancePlan {
    /// (causal work per rank, makespan seconds, overlap efficiency) of one simulated pass.
    fn simulate_pass(
        &mut self,
        partition: &dyn Partition,
        ranks: usize,
        block: usize,
        p: &Profile,
        doc_lens: &[usize],
    ) -> Result<(Vec<u64>, f64, f64)> {
        let m = &self.model;
        let layout = partition.layout_packed(ranks * block, doc_lens, ranks)?;
        let win: Vec<Vec<Window>> = layout
            .positions
            .iter()
            .map(|mine| windows(mine, layout.seq_len, doc_lens, Mask::causal(true)))
            .collect();
        let measured = match m.tile_costs {
            TileCosts::Flops => None,
            TileCosts::Measured => {
                let matmul = *self
                    .matmul_flops
                    .get_or_insert_with(|| crate::measure::baseline::matmul_gflops(1024) * 1e9);
                let seconds = crate::measure::ring::lockstep_tile_seconds(
                    partition,
                    ranks,
                    block,
                    m.measured_heads,
                    m.measured_head_dim,
                )?;
                Some((seconds, matmul))
            }
        };
        let flops_per_pair = (FORWARD_PER_PAIR_DIM * (m.head_dim * m.heads) as u64) as f64;
        let shape_ratio =
            (m.heads * m.head_dim) as f64 / (m.measured_heads * m.measured_head_dim) as f64;
        let compute: Vec<Vec<f64>> = (0..ranks)
            .map(|r| {
                (0..ranks)
                    .map(|s| match &measured {
                        // Time on this machine → FLOPs at the model's shape → time on the profile.
                        Some((t, matmul)) => t[r][s] * matmul * shape_ratio / p.flops,
                        None => {
                            let owner = Direction::Cw.owner(r, s, ranks);
                            visible_pairs(&win[r], &layout.positions[owner]) as f64 * flops_per_pair
                                / p.flops
                        }
                    })
                    .collect()
            })
            .collect();
        let sim = simulate(&compute, m.link_seconds(block, p));
        if !sim.makespan.is_finite() {
            return Err(anyhow!("simulated makespan is not finite"));
        }
        Ok((
            work_per_rank(&layout, doc_lens, Mask::causal(true)),
            sim.makespan,
            sim.overlap_efficiency,
        ))
    }
}
