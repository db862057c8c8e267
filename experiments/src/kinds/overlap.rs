//! Kind `overlap`: the minimal block size for overlap (c_min = F/B, the paper's Table 2) per hardware
//! profile, and the exposed communication of a simulated balanced ring pass against block size.
//! `timeline.svg` draws the simulated pass of the sweep's first profile at a block size below c_min
//! and one above it (their bars in `timeline.csv`).

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use super::shape::ModelShape;
use crate::hardware::Profile;
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::simulator::simulate;
use crate::spec::SpecText;
use crate::timeline_chart::{self, Lanes};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use strategies::ring_time::step_starts;
use workbench::kernels::flops::FORWARD_PER_PAIR_DIM;

/// The kind.
pub struct Overlap;

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
    block_sizes: Option<Vec<usize>>,
    profiles: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct Row {
    profile: &'static str,
    block_size: usize,
    tflops: f64,
    link_gb_per_s: f64,
    c_min_tokens: f64,
    s_min_tokens: f64,
    paper_c_min_tokens: Option<f64>,
    c_min_over_paper: Option<f64>,
    exposed_comm_fraction: f64,
}

struct OverlapPlan {
    points: Vec<(&'static Profile, usize)>,
    model: ModelShape,
}

const CARD: Card = Card {
    name: "overlap",
    about: "c_min = F/B per hardware profile and simulated exposed communication against block size",
    sweep_keys: &["block_sizes", "profiles"],
    key_columns: &["profile", "block_size"],
    columns: &[
        Column::exact("tflops"),
        Column::exact("link_gb_per_s"),
        Column::exact("c_min_tokens"),
        Column::exact("s_min_tokens"),
        Column::exact("paper_c_min_tokens"),
        Column::exact("c_min_over_paper"),
        Column::exact("exposed_comm_fraction"),
    ],
};

impl Experiment for Overlap {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let blocks = spec.list("sweep", "block_sizes", &parsed.sweep.block_sizes)?;
        let profiles = super::balance::profiles(
            spec,
            spec.list("sweep", "profiles", &parsed.sweep.profiles)?,
        )?;
        let points = profiles
            .iter()
            .flat_map(|&p| blocks.iter().map(move |&c| (p, c)))
            .collect();
        Ok(Box::new(OverlapPlan {
            points,
            model: parsed.model,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            series
                .entry(row.get("profile").unwrap_or("").to_owned())
                .or_default()
                .push((row.num("block_size"), row.num("exposed_comm_fraction")));
        }
        let chart = Chart {
            title: "Exposed communication vs block size (simulated)",
            x: Axis::new("block size c (tokens)", Scale::Log),
            y: Axis::new("exposed / makespan", Scale::Linear),
        };
        line_chart(
            &dir.join("exposed_comm.svg"),
            &chart,
            Series::sorted(series),
        )?;
        timeline_chart::draw_side_table(
            dir,
            TIMELINE,
            "timeline.svg",
            "Simulated 8-rank pass: a block size below c_min and one above it",
        )
    }

    fn side_files(&self) -> &'static [&'static str] {
        &[TIMELINE, "timeline.svg"]
    }
}

/// The drawn passes' bars, keyed by profile and block size.
const TIMELINE: &str = "timeline.csv";

/// The block sizes drawn for `profile` among `blocks`: the largest at most half its c_min (else the
/// smallest) and the smallest at least twice it (else the largest).
fn drawn_blocks(profile: &Profile, blocks: &[usize]) -> [Option<usize>; 2] {
    let c_min = profile.c_min();
    let below = (blocks.iter().copied())
        .filter(|&c| (c as f64) <= c_min / 2.0)
        .max()
        .or_else(|| blocks.iter().copied().min());
    let above = (blocks.iter().copied())
        .filter(|&c| (c as f64) >= 2.0 * c_min)
        .min()
        .or_else(|| blocks.iter().copied().max());
    [below, above]
}

impl Plan for OverlapPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|(p, c)| {
                Point::single(Record::new([
                    ("profile", p.name.to_string()),
                    ("block_size", c.to_string()),
                ]))
            })
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let (p, block) = self.points[index];
        let m = &self.model;
        // Balanced full tiles (non-causal) on 8 ranks isolate the overlap question.
        let ranks = 8;
        let tile =
            (FORWARD_PER_PAIR_DIM * (block * block * m.head_dim * m.heads) as u64) as f64 / p.flops;
        let work = vec![vec![tile; ranks]; ranks];
        let link = m.link_seconds(block, p);
        let sim = simulate(&work, link);
        let first = self.points[0].0;
        let blocks: Vec<usize> = (self.points.iter())
            .filter(|(q, _)| std::ptr::eq(*q, first))
            .map(|(_, c)| *c)
            .collect();
        if std::ptr::eq(p, first) && drawn_blocks(p, &blocks).contains(&Some(block)) {
            let side = if (block as f64) < p.c_min() {
                "below"
            } else {
                "above"
            };
            let mut lanes =
                Lanes::of_schedule(String::new(), &work, &step_starts(&work, link), link);
            lanes.name = format!(
                "{}, c = {block}: {side} c_min = {:.0}; {:.0}% of compute + wait is waiting",
                p.name,
                p.c_min(),
                100.0 * lanes.wait_share()
            );
            let key = Record::new([
                ("profile", p.name.to_string()),
                ("block_size", block.to_string()),
            ]);
            let path = context.dir.join(TIMELINE);
            let mut table = Table::read(&path)?;
            table.replace(&key, lanes.records(&key));
            table.write_csv(&path)?;
        }
        Ok(vec![Record::of(&Row {
            profile: p.name,
            block_size: block,
            tflops: p.flops / 1e12,
            link_gb_per_s: p.link_bytes_per_s / 1e9,
            c_min_tokens: p.c_min(),
            s_min_tokens: 6.0 * p.c_min(),
            paper_c_min_tokens: p.paper_c_min,
            c_min_over_paper: p.paper_c_min.map(|c| p.c_min() / c),
            exposed_comm_fraction: sim.exposed_comm / sim.makespan,
        })?])
    }
}
