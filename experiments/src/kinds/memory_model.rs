//! Kind `memory-model`: per-device memory and maximum context at the paper's scale (analytic,
//! [`crate::memory_model`]) beside the paper's Table 3.

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::memory_model::{METHODS, PAPER_TABLE_3, SIZES, max_context_k};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The kind.
pub struct MemoryModel;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    /// The paper's table is fixed: nothing to sweep.
    #[serde(default, rename = "sweep")]
    _sweep: Empty,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

#[derive(Debug, Serialize)]
struct Row {
    hardware: &'static str,
    model: &'static str,
    method: &'static str,
    devices: usize,
    memory_gb_per_device: f64,
    /// Empty: not even 1K tokens fit.
    model_max_context_k: Option<f64>,
    paper_max_context_k: f64,
    model_over_paper: Option<f64>,
}

struct MemoryModelPlan;

const CARD: Card = Card {
    name: "memory-model",
    about: "analytic: per-device memory and maximum context at the paper's scale beside its Table 3",
    sweep_keys: &[],
    key_columns: &["hardware", "model", "method"],
    columns: &[
        Column::exact("devices"),
        Column::exact("memory_gb_per_device"),
        Column::exact("model_max_context_k"),
        Column::exact("paper_max_context_k"),
        Column::exact("model_over_paper"),
    ],
};

impl Experiment for MemoryModel {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let _: Spec = spec.parse()?;
        Ok(Box::new(MemoryModelPlan))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        const MODELS: [&str; 4] = ["3B", "7B", "13B", "30B"];
        let index = |name: &str| {
            MODELS
                .iter()
                .position(|m| *m == name)
                .map_or(f64::NAN, |i| i as f64)
        };
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in table
            .rows
            .iter()
            .filter(|r| r.get("hardware") == Some("8x A100 NVLink"))
        {
            for (who, column) in [
                ("model", "model_max_context_k"),
                ("paper", "paper_max_context_k"),
            ] {
                series
                    .entry(format!("{} {who}", row.get("method").unwrap_or("")))
                    .or_default()
                    .push((index(row.get("model").unwrap_or("")), row.num(column)));
            }
        }
        let chart = Chart {
            title: "8x A100: maximum context, analytic model vs paper",
            x: Axis::new("model", Scale::Named(MODELS.map(String::from).to_vec())),
            y: Axis::new("max context (K tokens)", Scale::Log),
        };
        line_chart(
            &dir.join("memory_model.svg"),
            &chart,
            Series::sorted(series),
        )
    }
}

/// Every (paper row, method) pair, in the paper's order.
fn cells() -> impl Iterator<Item = (usize, usize)> {
    (0..PAPER_TABLE_3.len()).flat_map(|r| (0..METHODS.len()).map(move |m| (r, m)))
}

impl Plan for MemoryModelPlan {
    fn points(&self) -> Vec<Point> {
        cells()
            .map(|(r, m)| {
                let (pool, model, _) = &PAPER_TABLE_3[r];
                Point::single(Record::new([
                    ("hardware", pool.name),
                    ("model", model),
                    ("method", METHODS[m]),
                ]))
            })
            .collect()
    }

    fn compute(&mut self, index: usize, _: &PointContext) -> Result<Vec<Record>> {
        let (r, m) = cells().nth(index).expect("a point of this plan");
        let (pool, model, paper) = &PAPER_TABLE_3[r];
        let size = SIZES
            .iter()
            .find(|s| s.name == *model)
            .expect("every paper row names a known size");
        let ours = max_context_k(size, pool, METHODS[m]);
        Ok(vec![Record::of(&Row {
            hardware: pool.name,
            model,
            method: METHODS[m],
            devices: pool.devices,
            memory_gb_per_device: pool.memory_gb,
            model_max_context_k: ours,
            paper_max_context_k: paper[m],
            model_over_paper: ours.map(|k| k / paper[m]),
        })?])
    }
}
