//! Kind `exorl`: the Table 5 analog as a runner spec (the file `ringbench exorl table` reads, with
//! `kind = "exorl"`): one point per (task, configuration), trained with ring attention over every
//! seed and rolled out; the collected data's statistics go to `data.csv` beside the table.

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::exorl::ExorlSpec;
use crate::exorl::table::{PreparedTask, config_row, prepare_task};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// The kind.
pub struct Exorl;

struct ExorlPlan {
    spec: ExorlSpec,
    /// (task, configuration) indices.
    points: Vec<(usize, usize)>,
    prepared: BTreeMap<usize, PreparedTask>,
}

const DATA: &str = "data.csv";

const CARD: Card = Card {
    name: "exorl",
    about: "offline RL: behaviour cloning vs Agentic Transformers trained with ring attention (Table 5 analog)",
    sweep_keys: &["[[task]]", "[[config]]", "seeds"],
    key_columns: &["task", "config"],
    // The configuration's facts are exact. Returns of policies trained and rolled out on this
    // CPU, the collected data's returns (simulated in f32 kernels) and allocator peaks are
    // measurements: its rounding and kernels move them.
    columns: &[
        Column::exact("k"),
        Column::exact("return_conditioned"),
        Column::exact("chain_tokens"),
        Column::exact("seeds"),
        Column::exact("ring_ranks"),
        Column::exact("budget_mib"),
        Column::measured("mean_return"),
        Column::measured("std_return"),
        Column::shown("seed_returns"),
        Column::measured("data_mean_return"),
        Column::measured("data_best_return"),
        Column::measured("chain_peak_mib_1_rank"),
        Column::measured("chain_peak_mib_per_rank_ring"),
        Column::shown("fits_1_rank"),
        Column::shown("fits_ring"),
        Column::measured("train_s_per_run"),
    ],
};

impl Experiment for Exorl {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn side_files(&self) -> &'static [&'static str] {
        &[DATA]
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: ExorlSpec = spec.parse()?;
        if let Some((key, problem)) = parsed.problem() {
            return Err(spec.error("", key, &problem));
        }
        let points = (0..parsed.tasks.len())
            .flat_map(|t| (0..parsed.configs.len()).map(move |c| (t, c)))
            .collect();
        Ok(Box::new(ExorlPlan {
            spec: parsed,
            points,
            prepared: BTreeMap::new(),
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        let mut configs: Vec<String> = Vec::new();
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            let config = row.get("config").unwrap_or("").to_owned();
            if !configs.contains(&config) {
                configs.push(config.clone());
            }
            let x = configs.iter().position(|c| *c == config).unwrap_or(0) as f64;
            series
                .entry(row.get("task").unwrap_or("").to_owned())
                .or_default()
                .push((x, row.num("mean_return")));
        }
        let chart = Chart {
            title: "Mean return by configuration",
            x: Axis::new("configuration", Scale::Named(configs)),
            y: Axis::new("mean return", Scale::Linear),
        };
        line_chart(&dir.join("returns.svg"), &chart, Series::sorted(series))
    }
}

impl Plan for ExorlPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|&(t, c)| {
                Point::single(Record::new([
                    ("task", &self.spec.tasks[t].name),
                    ("config", &self.spec.configs[c].name),
                ]))
            })
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let (t, c) = self.points[index];
        if !self.prepared.contains_key(&t) {
            let prepared = prepare_task(&self.spec, &self.spec.tasks[t])?;
            let path = context.dir.join(DATA);
            let mut data = Table::read(&path)?;
            data.replace(
                &Record::new([("task", &prepared.name)]),
                prepared.data_rows.clone(),
            );
            data.write_csv(&path)?;
            self.prepared.insert(t, prepared);
        }
        let task = &self.prepared[&t];
        Ok(vec![config_row(
            &self.spec,
            task,
            &self.spec.configs[c],
            context.bar,
        )?])
    }
}
