//! Kind `mfu`: model FLOPs utilization of training steps of a small LLaMA on this machine, against
//! the matmul rate measured beside every row (the paper's Table 4, measured here).

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::measure::baseline::matmul_gflops;
use crate::measure::training::{Ffn, SmallModel, model_flops, train_steps};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use workbench::Kernel;

/// The kind.
pub struct Mfu;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    model: SmallModel,
    #[serde(default)]
    measure: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    ranks: Option<Vec<usize>>,
    /// Tokens per rank: each row trains on ranks × block tokens.
    block_sizes: Option<Vec<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Measure {
    /// Timed training steps (after one warm-up step).
    steps: usize,
}

impl Default for Measure {
    fn default() -> Self {
        Measure { steps: 2 }
    }
}

#[derive(Debug, Serialize)]
struct Row {
    ranks: usize,
    seq_len: usize,
    tokens_per_rank: usize,
    step_s: f64,
    tokens_per_s: f64,
    model_gflop_per_step: f64,
    achieved_gflops: f64,
    matmul_gflops: f64,
    mfu: f64,
}

struct MfuPlan {
    points: Vec<(usize, usize)>,
    model: SmallModel,
    steps: usize,
}

const CARD: Card = Card {
    name: "mfu",
    about: "measured: model FLOPs utilization of training steps against this machine's matmul rate",
    sweep_keys: &["ranks", "block_sizes"],
    key_columns: &["ranks", "seq_len"],
    columns: &[
        Column::exact("tokens_per_rank"),
        Column::exact("model_gflop_per_step"),
        Column::measured("step_s"),
        Column::measured("tokens_per_s"),
        Column::measured("achieved_gflops"),
        Column::measured("matmul_gflops"),
        Column::measured("mfu"),
    ],
};

impl Experiment for Mfu {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let ranks = spec.ranks("sweep", &parsed.sweep.ranks)?;
        let blocks = spec.list("sweep", "block_sizes", &parsed.sweep.block_sizes)?;
        let points = blocks
            .iter()
            .flat_map(|&c| ranks.iter().map(move |&n| (n, n * c)))
            .collect();
        Ok(Box::new(MfuPlan {
            points,
            model: parsed.model,
            steps: parsed.measure.steps.max(1),
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            series
                .entry(format!("N = {}", row.get("ranks").unwrap_or("")))
                .or_default()
                .push((row.num("seq_len"), row.num("mfu")));
        }
        let chart = Chart {
            title: "Model FLOPs utilization of training steps",
            x: Axis::new("sequence length S", Scale::Discrete),
            y: Axis::new("MFU (vs measured matmul rate)", Scale::Linear),
        };
        line_chart(&dir.join("mfu.svg"), &chart, Series::sorted(series))
    }
}

impl Plan for MfuPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|&(n, s)| Point::single(Record::new([("ranks", n), ("seq_len", s)])))
            .collect()
    }

    fn compute(&mut self, index: usize, _: &PointContext) -> Result<Vec<Record>> {
        let (ranks, seq) = self.points[index];
        let block = seq / ranks;
        let times = train_steps(
            &self.model,
            ranks,
            seq,
            Ffn::kept(block.min(1024)),
            Kernel::Fused,
            self.steps + 1,
        )?
        .times;
        // The baseline is re-measured beside every row: these machines are shared and noisy.
        let matmul = matmul_gflops(1024);
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        let flops = model_flops(&self.model, seq);
        let gflops = flops / mean / 1e9;
        Ok(vec![Record::of(&Row {
            ranks,
            seq_len: seq,
            tokens_per_rank: block,
            step_s: mean,
            tokens_per_s: seq as f64 / mean,
            model_gflop_per_step: flops / 1e9,
            achieved_gflops: gflops,
            matmul_gflops: matmul,
            mfu: gflops / matmul,
        })?])
    }
}
