//! Kind `knee`: the overlap knee measured on this machine. A thread ring's link is rate-limited so
//! that sending one K/V block takes as long as computing one tile at `measure.set_knee_tokens` tokens
//! per rank (F/B set there); exposed communication is measured against block size, and the knee is
//! found from the measurements alone (the paper's Table 2 claim, tested).
//!
//! Beside the table, `timeline.svg` draws one traced pass per rank count at the smallest block size
//! (below the knee: the ranks wait for blocks) and the largest (above it: the waits vanish), from
//! the events in `timeline.csv`.
//!
//! A rank count is one sweep point: its rows share one link rate and one fitted knee, so they are
//! computed (and recomputed, when the block sizes change) together.

use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::measure::ring::{RingTiming, time_ring, trace_ring};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use crate::timeline_chart::{self, Lanes};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use workbench::transport::Link;

/// The kind.
pub struct Knee;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    model: super::shape::ModelShape,
    measure: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    ranks: Option<Vec<usize>>,
    block_sizes: Option<Vec<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Measure {
    /// The block size at which the link is set to take as long as the compute.
    set_knee_tokens: usize,
    /// Timed passes per configuration; the fastest counts.
    #[serde(default = "three")]
    repeats: usize,
}

fn three() -> usize {
    3
}

#[derive(Debug, Serialize)]
struct Row {
    ranks: usize,
    block_size: usize,
    set_knee_tokens: usize,
    link_mb_per_s: f64,
    compute_ms_per_step: f64,
    comm_ms_per_step: f64,
    wait_ms_free_link: f64,
    wait_ms_limited_link: f64,
    exposed_comm_fraction: f64,
    theory_exposed_fraction: f64,
    measured_link_mb_per_s: Option<f64>,
    measured_knee_tokens: Option<f64>,
    measured_over_set: Option<f64>,
}

struct KneePlan {
    ranks: Vec<usize>,
    blocks: Vec<usize>,
    set_tokens: usize,
    heads: usize,
    head_dim: usize,
    repeats: usize,
}

const CARD: Card = Card {
    name: "knee",
    about: "measured: exposed communication of a rate-limited thread ring against block size, and its knee",
    sweep_keys: &["ranks", "block_sizes"],
    key_columns: &["ranks", "block_size"],
    columns: &[
        Column::exact("set_knee_tokens"),
        // The link is set from this machine's measured tile time: a measurement too.
        Column::measured("link_mb_per_s"),
        Column::measured("comm_ms_per_step"),
        Column::measured("compute_ms_per_step"),
        Column::measured("wait_ms_free_link"),
        Column::measured("wait_ms_limited_link"),
        Column::measured("exposed_comm_fraction"),
        Column::measured("theory_exposed_fraction"),
        Column::measured("measured_link_mb_per_s"),
        Column::measured("measured_knee_tokens"),
        Column::measured("measured_over_set"),
    ],
};

impl Experiment for Knee {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let ranks = spec.ranks("sweep", &parsed.sweep.ranks)?.to_vec();
        let blocks = spec
            .list("sweep", "block_sizes", &parsed.sweep.block_sizes)?
            .to_vec();
        Ok(Box::new(KneePlan {
            ranks,
            blocks,
            set_tokens: parsed.measure.set_knee_tokens,
            heads: parsed.model.heads,
            head_dim: parsed.model.head_dim,
            repeats: parsed.measure.repeats,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            for (name, column) in [
                ("measured", "exposed_comm_fraction"),
                ("theory", "theory_exposed_fraction"),
            ] {
                series
                    .entry(format!("{name} N={}", row.get("ranks").unwrap_or("")))
                    .or_default()
                    .push((row.num("block_size"), row.num(column)));
            }
        }
        let chart = Chart {
            title: "Rate-limited thread ring: exposed communication vs block size",
            x: Axis::new("block size c (tokens per rank)", Scale::Discrete),
            y: Axis::new("exposed / ring time", Scale::Linear),
        };
        line_chart(&dir.join("knee.svg"), &chart, Series::sorted(series))?;
        timeline_chart::draw_side_table(
            dir,
            TIMELINE,
            "timeline.svg",
            "Rate-limited thread ring: one pass below the knee and one above it",
        )
    }

    fn side_files(&self) -> &'static [&'static str] {
        &[TIMELINE, "timeline.svg"]
    }
}

/// The traced passes' bars, keyed by rank count.
const TIMELINE: &str = "timeline.csv";

impl Plan for KneePlan {
    fn points(&self) -> Vec<Point> {
        self.ranks
            .iter()
            .map(|&n| Point {
                key: Record::new([("ranks", n)]),
                rows: self
                    .blocks
                    .iter()
                    .map(|c| Record::new([("ranks", n), ("block_size", *c)]))
                    .collect(),
                label: format!("knee N={n}"),
            })
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let ranks = self.ranks[index];
        let bar = context.bar;
        // A burst of other work on the machine can leave no link-bound block size to fit the link
        // on (the link was set while the compute ran slow, say): the point is measured again, up
        // to ATTEMPTS times, rather than written with empty knee cells.
        let mut attempt = 1;
        loop {
            let sweep = self.measure(ranks, bar)?;
            if sweep.knee.is_some() || attempt == ATTEMPTS {
                bar.set_message(format!("knee N={ranks}: tracing a pass below and above"));
                self.save_timelines(ranks, &sweep, context.dir)?;
                return self.rows(ranks, &sweep);
            }
            bar.println(format!(
                "knee N={ranks}: no link-bound block size in attempt {attempt} of {ATTEMPTS} \
                 (the machine's load changed during it?): measuring again"
            ));
            attempt += 1;
        }
    }
}

/// How many times a point is measured before its knee cells are left empty.
const ATTEMPTS: usize = 3;

/// One rank count's measurements: the link rate set, each block size's free and limited passes,
/// and the knee found from them.
struct KneeSweep {
    bytes_per_s: f64,
    points: Vec<KneePoint>,
    free: Vec<RingTiming>,
    limited: Vec<RingTiming>,
    knee: Option<FittedKnee>,
}

impl KneePlan {
    fn block_bytes(&self, c: usize) -> f64 {
        (2 * c * self.heads * self.head_dim * 4) as f64
    }

    /// Times every block size on a free link, sets the link from the compute at the set knee, then
    /// times every block size on the limited link.
    fn measure(&self, ranks: usize, bar: &indicatif::ProgressBar) -> Result<KneeSweep> {
        let (heads, head_dim, repeats) = (self.heads, self.head_dim, self.repeats);
        let mut free: Vec<RingTiming> = Vec::new();
        for &c in &self.blocks {
            bar.set_message(format!("knee N={ranks} c={c}, free link"));
            free.push(time_ring(ranks, c, heads, head_dim, None, repeats)?);
        }
        let at_set = match self.blocks.iter().position(|&c| c == self.set_tokens) {
            Some(i) => free[i],
            None => time_ring(ranks, self.set_tokens, heads, head_dim, None, repeats)?,
        };
        let bytes_per_s = self.block_bytes(self.set_tokens) / at_set.compute_per_step;
        let link = Link {
            bytes_per_s,
            latency: Duration::ZERO,
        };
        let mut points = Vec::new();
        let mut limited = Vec::new();
        for (&c, f) in self.blocks.iter().zip(&free) {
            bar.set_message(format!("knee N={ranks} c={c}, limited link"));
            let l = time_ring(ranks, c, heads, head_dim, Some(link), repeats)?;
            points.push(KneePoint {
                block: c,
                exposed: (l.wait_per_pass - f.wait_per_pass).max(0.0),
                compute: f.compute_per_step,
            });
            limited.push(l);
        }
        let knee = measured_knee(&points, ranks);
        Ok(KneeSweep {
            bytes_per_s,
            points,
            free,
            limited,
            knee,
        })
    }

    /// Traces one limited-link pass at the sweep's smallest block size and one at its largest, and
    /// keeps their bars in the side table under this rank count.
    fn save_timelines(&self, ranks: usize, sweep: &KneeSweep, dir: &Path) -> Result<()> {
        let link = Link {
            bytes_per_s: sweep.bytes_per_s,
            latency: Duration::ZERO,
        };
        let knee = sweep.knee.map(|k| k.tokens);
        let mut ends: Vec<&usize> = self.blocks.first().into_iter().collect();
        ends.extend(
            self.blocks
                .last()
                .filter(|last| Some(*last) != ends.first().copied()),
        );
        let mut panels = Vec::new();
        for block in ends {
            let events = trace_ring(ranks, *block, self.heads, self.head_dim, Some(link))?;
            let side = match knee {
                Some(k) if (*block as f64) < k => format!("below the knee ({k:.0} tokens)"),
                Some(k) => format!("above the knee ({k:.0} tokens)"),
                None => "no knee measured".to_owned(),
            };
            let mut lanes = Lanes::of_trace(String::new(), ranks, &events);
            lanes.name = format!(
                "N = {ranks}, c = {block}: {side}; {:.0}% of compute + wait is waiting",
                100.0 * lanes.wait_share()
            );
            panels.push(lanes);
        }
        timeline_chart::save(
            &dir.join(TIMELINE),
            &Record::new([("ranks", ranks)]),
            &panels,
        )
    }

    /// The rows of one rank count's sweep.
    fn rows(&self, ranks: usize, sweep: &KneeSweep) -> Result<Vec<Record>> {
        let (heads, head_dim, knee) = (self.heads, self.head_dim, sweep.knee);
        let bytes_per_s = sweep.bytes_per_s;
        sweep
            .points
            .iter()
            .zip(sweep.free.iter().zip(&sweep.limited))
            .map(|(p, (f, l))| {
                let t_comm = self.block_bytes(p.block) / bytes_per_s;
                // Theory: each of the N − 1 transfers exposes max(0, T_comm − T_comp).
                let theory = (ranks - 1) as f64 * (t_comm - p.compute).max(0.0);
                let pass = ranks as f64 * p.compute;
                Record::of(&Row {
                    ranks,
                    block_size: p.block,
                    set_knee_tokens: self.set_tokens,
                    link_mb_per_s: bytes_per_s / 1e6,
                    compute_ms_per_step: p.compute * 1e3,
                    comm_ms_per_step: t_comm * 1e3,
                    wait_ms_free_link: f.wait_per_pass * 1e3,
                    wait_ms_limited_link: l.wait_per_pass * 1e3,
                    exposed_comm_fraction: p.exposed / (p.exposed + pass),
                    theory_exposed_fraction: theory / (theory + pass),
                    measured_link_mb_per_s: knee.map(|k| k.link_bytes_per_s(heads, head_dim) / 1e6),
                    measured_knee_tokens: knee.map(|k| k.tokens),
                    measured_over_set: knee.map(|k| k.tokens / self.set_tokens as f64),
                })
            })
            .collect()
    }
}

/// One block size of the knee sweep: exposed seconds per pass (limited minus free wait) and the
/// tile compute seconds per step.
#[derive(Debug, Clone, Copy)]
struct KneePoint {
    block: usize,
    exposed: f64,
    compute: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct FittedKnee {
    tokens: f64,
    /// Seconds per token of a block on the link, as the ranks saw it.
    seconds_per_token: f64,
}

impl FittedKnee {
    fn link_bytes_per_s(&self, heads: usize, head_dim: usize) -> f64 {
        (2 * heads * head_dim * 4) as f64 / self.seconds_per_token
    }
}

/// The knee from the measurements alone. Below it a rank waits `T_comm − T_comp` per transfer, so
/// on the link-bound block sizes (from the smallest up to the first whose exposed share is within
/// noise, ≤ 5%) `exposed / (N − 1) + T_comp` is the link time of a block: fit it as `β·c` (least
/// squares through the origin), then find where the measured compute time per step `T_comp(c)`
/// overtakes `β·c`: between two block sizes by linear interpolation; past either end of the sweep
/// (the machine ran slower or faster than when the link was set) on the compute curve extended as
/// a `c × c` tile grows, `T_comp(c_end) · (c / c_end)²`, which meets `β·c` at
/// `β · c_end² / T_comp(c_end)`. `None` when no block size was link-bound.
fn measured_knee(points: &[KneePoint], ranks: usize) -> Option<FittedKnee> {
    let transfers = ranks.saturating_sub(1).max(1) as f64;
    let bound: Vec<&KneePoint> = points
        .iter()
        .take_while(|p| p.exposed / (p.exposed + ranks as f64 * p.compute) > 0.05)
        .collect();
    if bound.is_empty() {
        return None;
    }
    let (sxy, sxx) = bound.iter().fold((0.0, 0.0), |(xy, xx), p| {
        let c = p.block as f64;
        (xy + c * (p.exposed / transfers + p.compute), xx + c * c)
    });
    let beta = sxy / sxx;
    let gap = |p: &KneePoint| p.compute - beta * p.block as f64;
    let knee = |tokens: f64| FittedKnee {
        tokens,
        seconds_per_token: beta,
    };
    let on_quadratic = |p: &KneePoint| {
        let c = p.block as f64;
        knee(beta * c * c / p.compute)
    };
    let (first, last) = (points.first()?, points.last()?);
    if gap(first) >= 0.0 {
        return Some(on_quadratic(first));
    }
    points
        .windows(2)
        .find_map(|w| {
            let (g0, g1) = (gap(&w[0]), gap(&w[1]));
            (g0 < 0.0 && g1 >= 0.0).then(|| {
                let (c0, c1) = (w[0].block as f64, w[1].block as f64);
                knee(c0 + (c1 - c0) * (-g0) / (g1 - g0))
            })
        })
        .or_else(|| Some(on_quadratic(last)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knee_estimate_recovers_the_crossing_of_the_model() {
        // Two ranks; a block takes βc on the link and γc² to compute: the knee is β/γ = 500.
        let (beta, gamma) = (1e-5, 2e-8);
        let points: Vec<KneePoint> = [100, 200, 300, 400, 450, 550, 600, 800]
            .iter()
            .map(|&c| {
                let c_f = c as f64;
                KneePoint {
                    block: c,
                    exposed: (beta * c_f - gamma * c_f * c_f).max(0.0),
                    compute: gamma * c_f * c_f,
                }
            })
            .collect();
        let knee = measured_knee(&points, 2).unwrap();
        assert!((knee.seconds_per_token - beta).abs() < 1e-12);
        // Linear interpolation of γc² − βc between 450 and 550.
        assert!((knee.tokens - 500.0).abs() < 5.0, "{knee:?}");
        // No block size link-bound: no knee.
        assert_eq!(measured_knee(&points[5..], 2), None);
        // The crossing past the largest block size measured (the link set while the compute ran
        // slow, say): found on the c² extension of the compute curve, exactly here.
        let knee = measured_knee(&points[..4], 2).unwrap();
        assert!((knee.tokens - 500.0).abs() < 1e-6, "{knee:?}");
    }

    /// A compute curve measured under a burst of load (the link set from a slow measurement, so
    /// every block size is link-bound) still gives a knee: the one its own curve crosses.
    #[test]
    fn a_knee_past_the_sweep_is_found_on_the_compute_curve() {
        // The link takes βc; the compute γc²: the knee is β/γ = 2,400, past the sweep's 2,048.
        let (beta, gamma) = (2.4e-5, 1e-8);
        let points: Vec<KneePoint> = [256, 512, 768, 1024, 1536, 2048]
            .iter()
            .map(|&c| {
                let c_f = c as f64;
                KneePoint {
                    block: c,
                    exposed: beta * c_f - gamma * c_f * c_f,
                    compute: gamma * c_f * c_f,
                }
            })
            .collect();
        let knee = measured_knee(&points, 2).unwrap();
        assert!((knee.tokens - 2400.0).abs() < 1e-6, "{knee:?}");
        assert!((knee.seconds_per_token - beta).abs() < 1e-15);
    }
}
