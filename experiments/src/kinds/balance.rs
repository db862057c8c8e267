//! Kind `balance`: the causal load balance of the partition strategies, one forward ring pass
//! simulated on a hardware profile, with tile costs from exact FLOP counts or timed on this machine;
//! for a model whose layers mask differently (the `models` axis), the pass of every layer.

use super::axes::grid;
use super::documents::Documents;
use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use super::layer_mix::LayerMix;
use super::shape::{ModelShape, TileCosts};
use super::window::WindowSpec;
use crate::hardware::{Profile, profile, profile_names};
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::results::{Record, Table};
use crate::simulator::simulate;
use crate::spec::SpecText;
use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use strategies::{Mask, MaskedLayers, Partition, RingCosts, Workload, ring_time, work_per_rank};
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
    /// Sliding windows: `"none"`, a number of tokens, or `"S/n"` ([`WindowSpec`]).
    windows: Option<Vec<String>>,
    /// Which layers the window applies to: `"full"` (none), `"window"` (all) or `"K:1"` (K
    /// windowed layers to one full one) ([`LayerMix`]); without it every layer is windowed.
    models: Option<Vec<String>>,
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
    /// Empty unless the sweep has windows.
    window: Option<String>,
    /// The window in tokens (empty: none).
    window_tokens: Option<usize>,
    /// Empty unless the sweep has models: which layers are windowed.
    model: Option<String>,
    /// The steps the causal forward pass needs: N, or fewer when no rank can see further (the
    /// longest of the model's layers' passes).
    ring_steps: usize,
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

/// One sweep point.
#[derive(Clone, Copy)]
struct BalancePoint {
    strategy: &'static dyn Partition,
    ranks: usize,
    block: usize,
    profile: &'static Profile,
    /// `None` when the sweep has no documents axis.
    documents: Option<Documents>,
    /// `None` when the sweep has no windows axis.
    window: Option<WindowSpec>,
    /// `None` when the sweep has no models axis (every layer windowed).
    model: Option<LayerMix>,
}

impl BalancePoint {
    /// The same point with another strategy (the contiguous baseline).
    fn with(self, strategy: &'static dyn Partition) -> Self {
        BalancePoint { strategy, ..self }
    }

    fn len(&self) -> usize {
        self.ranks * self.block
    }

    /// The causal mask, windowed when the point has a window.
    fn mask(&self) -> Mask {
        Mask {
            causal: true,
            window: self.window.and_then(|w| w.tokens(self.len())),
        }
    }

    /// The masks of the model's layers (one period of them), with how many layers use each.
    fn masks(&self) -> Vec<MaskedLayers> {
        self.model.unwrap_or(LayerMix::Window).masks(self.mask())
    }

    fn doc_lens(&self) -> Vec<usize> {
        self.documents.map_or(Vec::new(), |d| d.lengths(self.len()))
    }
}

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
        "windows",
        "models",
    ],
    key_columns: &[
        "strategy",
        "ranks",
        "block_size",
        "profile",
        "documents",
        "window",
        "model",
    ],
    columns: &[
        Column::exact("document_count"),
        Column::exact("window_tokens"),
        Column::exact("ring_steps"),
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

    fn check(&self, reference: &Record, column: &Column) -> Check {
        if reference.get("tile_costs") == Some("measured") && FROM_TILE_COSTS.contains(&column.name)
        {
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
        let windows = WindowSpec::axis(spec, &s.windows)?;
        let models = LayerMix::axis(spec, &s.models)?;
        let measured = parsed.model.tile_costs == TileCosts::Measured;
        if measured
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
        if measured && windows.iter().flatten().any(|w| *w != WindowSpec::None) {
            return Err(spec.error(
                "sweep",
                "windows",
                "sliding windows need tile_costs = \"flops\" (tiles are timed without them)",
            ));
        }
        if measured && s.models.is_some() {
            return Err(spec.error(
                "sweep",
                "models",
                "models of several masks need tile_costs = \"flops\" (tiles are timed with one)",
            ));
        }
        // Contiguous first: it is every other strategy's baseline.
        let mut order = strategies.clone();
        order.sort_by_key(|s| s.name() != strategies::Contiguous.name());
        let lens = [
            models.len(),
            documents.len(),
            windows.len(),
            profiles.len(),
            blocks.len(),
            ranks.len(),
            order.len(),
        ];
        let points = grid(&lens)
            .into_iter()
            .map(|i| BalancePoint {
                model: models[i[0]],
                documents: documents[i[1]],
                window: windows[i[2]],
                profile: profiles[i[3]],
                block: blocks[i[4]],
                ranks: ranks[i[5]],
                strategy: order[i[6]],
            })
            .collect();
        Ok(Box::new(BalancePlan {
            points,
            model: parsed.model,
            matmul_flops: None,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // A panel per block size, profile, documents and window; a line per strategy.
        let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            let mut panel = format!(
                "c = {}, {}",
                row.get("block_size").unwrap_or(""),
                row.get("profile").unwrap_or(""),
            );
            if let Some(d) = row.get("documents").filter(|d| !d.is_empty()) {
                panel += &format!(", {d}");
            }
            if let Some(w) = row.get("window").filter(|w| !w.is_empty()) {
                panel += &format!(", window {w}");
            }
            if let Some(m) = row.get("model").filter(|m| !m.is_empty()) {
                panel += &format!(", layers {m}");
            }
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

fn key(point: &BalancePoint) -> Record {
    let mut key = Record::new([
        ("strategy", point.strategy.name().to_string()),
        ("ranks", point.ranks.to_string()),
        ("block_size", point.block.to_string()),
        ("profile", point.profile.name.to_string()),
    ]);
    // A sweep without documents or windows keys its rows as it always did.
    if let Some(docs) = point.documents {
        key.0.push(("documents".into(), docs.name()));
    }
    if let Some(window) = point.window {
        key.0.push(("window".into(), window.name()));
    }
    if let Some(model) = point.model {
        key.0.push(("model".into(), model.name()));
    }
    key
}

impl Plan for BalancePlan {
    fn points(&self) -> Vec<Point> {
        self.points.iter().map(|p| Point::single(key(p))).collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let point = self.points[index];
        let (strategy, ranks, block, p) = (point.strategy, point.ranks, point.block, point.profile);
        let doc_lens = point.doc_lens();
        let (mask, masks) = (point.mask(), point.masks());
        let contiguous = &strategies::Contiguous;
        // Contiguous is its own baseline; any other strategy reads contiguous's makespan from the
        // table when it is there (measured tiles are noisy: one baseline per point), else
        // simulates it.
        let baseline = if strategy.name() == contiguous.name() {
            None
        } else {
            match context.table.find(&key(&point.with(contiguous))) {
                Some(row) => Some(row.num("makespan_ms") / 1e3),
                None => Some(self.simulate_pass(&point.with(contiguous))?.makespan),
            }
        };
        let Pass {
            work,
            makespan,
            overlap_efficiency,
            steps,
        } = self.simulate_pass(&point)?;
        let mean = work.iter().sum::<u64>() as f64 / ranks as f64;
        let max = *work.iter().max().unwrap_or(&0) as f64;
        // Contiguous's busiest rank: (2N − 1)/N of the mean for one sequence; counted when packed
        // or windowed.
        let plain = masks.iter().all(|m| m.mask.window.is_none());
        let contiguous_max = if doc_lens.is_empty() && plain {
            (2 * ranks - 1) as f64 / ranks as f64 * mean
        } else {
            let layout = contiguous.layout(ranks * block, ranks)?;
            *layer_work(&layout, &doc_lens, &masks)
                .iter()
                .max()
                .unwrap_or(&0) as f64
        };
        Ok(vec![Record::of(&Row {
            strategy: strategy.name(),
            ranks,
            block_size: block,
            profile: p.name,
            documents: point.documents.map(Documents::name),
            document_count: doc_lens.len().max(1),
            window: point.window.map(WindowSpec::name),
            window_tokens: mask.window,
            model: point.model.map(LayerMix::name),
            ring_steps: steps,
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

/// One simulated pass through every layer of a model (one layer when all mask alike).
struct Pass {
    /// Visible (q, k) pairs per rank, summed over the layers.
    work: Vec<u64>,
    /// Seconds of one layer's pass, the mean over the layers.
    makespan: f64,
    /// The busiest rank's compute over the makespan (over all the layers).
    overlap_efficiency: f64,
    /// Ring steps run: one past the last at which some rank sees its block (as the engine stops),
    /// the most of any layer.
    steps: usize,
}

/// Each rank's visible pairs over one pass of every layer: a mask's pairs times its layers.
fn layer_work(layout: &strategies::Layout, doc_lens: &[usize], masks: &[MaskedLayers]) -> Vec<u64> {
    let mut work = vec![0u64; layout.ranks()];
    for m in masks {
        for (total, w) in work.iter_mut().zip(work_per_rank(layout, doc_lens, m.mask)) {
            *total += m.layers as u64 * w;
        }
    }
    work
}

impl BalancePlan {
    /// One simulated causal forward pass of `point` through its model's layers.
    fn simulate_pass(&mut self, point: &BalancePoint) -> Result<Pass> {
        let (partition, ranks, block, p) =
            (point.strategy, point.ranks, point.block, point.profile);
        let doc_lens = point.doc_lens();
        let m = &self.model;
        let flops_per_pair = (FORWARD_PER_PAIR_DIM * (m.head_dim * m.heads) as u64) as f64;
        // The pass's documents, masks and this profile's costs: what `balanced` solves for (a fixed
        // strategy ignores them).
        let workload = Workload {
            doc_lens: &doc_lens,
            masks: point.masks(),
            costs: RingCosts {
                seconds_per_pair: flops_per_pair / p.flops,
                link_seconds: m.link_seconds(block, p),
            },
            backward: None,
        };
        let layout = partition.layout_for(ranks * block, ranks, &workload)?;
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
        let shape_ratio =
            (m.heads * m.head_dim) as f64 / (m.measured_heads * m.measured_head_dim) as f64;
        let (mut time, mut busiest, mut layers, mut steps) = (0.0, 0.0, 0usize, 0);
        for masked in &workload.masks {
            // The engine's rule: a ring pass stops once no rank can see the blocks further along.
            let pass = ring_time::Pass::of(&layout, &doc_lens, masked.mask);
            let compute: Vec<Vec<f64>> = (0..ranks)
                .map(|r| {
                    (0..pass.steps)
                        .map(|s| match &measured {
                            // Time on this machine → FLOPs at the model's shape → time on the
                            // profile (one mask only: the plan refuses measured tiles with more).
                            Some((t, matmul)) => t[r][s] * matmul * shape_ratio / p.flops,
                            None => pass.pairs[r][s] as f64 * workload.costs.seconds_per_pair,
                        })
                        .collect()
                })
                .collect();
            let sim = simulate(&compute, workload.costs.link_seconds);
            let layer_count = masked.layers as f64;
            time += layer_count * sim.makespan;
            busiest += layer_count * sim.makespan * sim.overlap_efficiency;
            layers += masked.layers;
            steps = steps.max(pass.steps);
        }
        let makespan = time / layers.max(1) as f64;
        if !makespan.is_finite() {
            return Err(anyhow!("simulated makespan is not finite"));
        }
        Ok(Pass {
            work: layer_work(&layout, &doc_lens, &workload.masks),
            makespan,
            overlap_efficiency: if time > 0.0 { busiest / time } else { 1.0 },
            steps,
        })
    }
}
