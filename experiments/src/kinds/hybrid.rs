//! Kind `hybrid`: head × context parallelism predicted on a hardware profile ([`crate::grid_model`]):
//! one attention layer's forward and backward on N = U·R ranks against the ring alone (U = 1) and
//! pure Ulysses (U = N), over models, profiles, rank counts, degrees and lengths.

use super::axes::grid;
use super::balance::profiles;
use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::grid_model::{Bytes, GridPoint, MODELS};
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The kind.
pub struct Hybrid;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    bytes: Bytes,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    /// Attention shapes by name ([`MODELS`]).
    models: Vec<String>,
    profiles: Vec<String>,
    ranks: Option<Vec<usize>>,
    /// Ulysses degrees; each runs on the rank counts it divides.
    ulysses: Vec<usize>,
    seq_lens: Vec<usize>,
    /// Default: `[true]`.
    causal: Option<Vec<bool>>,
}

#[derive(Debug, Default, Serialize)]
struct Row {
    model: String,
    profile: String,
    ranks: usize,
    ulysses: usize,
    seq_len: usize,
    causal: bool,
    heads: usize,
    kv_heads: usize,
    ring_ranks: usize,
    /// `ok`, or `skipped: <the engine's error>`.
    status: String,
    all_to_all_bytes_per_rank: Option<u64>,
    ring_bytes_per_rank: Option<u64>,
    all_to_all_ms: Option<f64>,
    ring_ms: Option<f64>,
    compute_ms: Option<f64>,
    total_ms: Option<f64>,
    /// total over the ring alone's (U = 1) at the same point.
    over_ring: Option<f64>,
    /// Whether no other degree at this point is faster.
    fastest: Option<bool>,
}

const KEYS: &[&str] = &["model", "profile", "ranks", "ulysses", "seq_len", "causal"];

const CARD: Card = Card {
    name: "hybrid",
    about: "predicted: head x context parallelism (Ulysses inside, a zig-zag ring outside) against the ring and Ulysses alone",
    sweep_keys: &[
        "models", "profiles", "ranks", "ulysses", "seq_lens", "causal",
    ],
    key_columns: KEYS,
    columns: &[
        Column::exact("heads"),
        Column::exact("kv_heads"),
        Column::exact("ring_ranks"),
        Column::exact("status"),
        Column::exact("all_to_all_bytes_per_rank"),
        Column::exact("ring_bytes_per_rank"),
        Column::exact("all_to_all_ms"),
        Column::exact("ring_ms"),
        Column::exact("compute_ms"),
        Column::exact("total_ms"),
        Column::exact("over_ring"),
        Column::exact("fastest"),
    ],
};

struct HybridPlan {
    points: Vec<GridPoint>,
    bytes: Bytes,
}

fn key(p: &GridPoint) -> Record {
    Record::new([
        ("model", p.model.name.to_string()),
        ("profile", p.profile.name.to_string()),
        ("ranks", p.ranks.to_string()),
        ("ulysses", p.ulysses.to_string()),
        ("seq_len", p.seq_len.to_string()),
        ("causal", p.causal.to_string()),
    ])
}

impl Experiment for Hybrid {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        let models = s
            .models
            .iter()
            .map(|n| {
                MODELS.iter().find(|m| m.name == n).copied().ok_or_else(|| {
                    let known: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
                    spec.error(
                        "sweep",
                        "models",
                        &format!("unknown model '{n}'; known: {}", known.join(", ")),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let profiles = profiles(spec, &s.profiles)?;
        let ranks = spec.ranks("sweep", &s.ranks)?;
        if let Some(&bad) = s.ulysses.iter().find(|&&u| u == 0) {
            return Err(spec.error(
                "sweep",
                "ulysses",
                &format!("a Ulysses degree is at least 1, got {bad}"),
            ));
        }
        let mut ulysses = s.ulysses.clone();
        // U = 1 first: every row's over_ring baseline.
        ulysses.sort_unstable();
        ulysses.dedup();
        if let Some(&bad) = s.seq_lens.iter().find(|&&l| l == 0) {
            return Err(spec.error(
                "sweep",
                "seq_lens",
                &format!("lengths must be at least 1, got {bad}"),
            ));
        }
        let causal = spec.list_or("sweep", "causal", &s.causal, vec![true])?;
        let lens = [
            models.len(),
            profiles.len(),
            s.seq_lens.len(),
            causal.len(),
            ranks.len(),
            ulysses.len(),
        ];
        let points = grid(&lens)
            .into_iter()
            .map(|i| GridPoint {
                model: models[i[0]],
                profile: profiles[i[1]],
                seq_len: s.seq_lens[i[2]],
                causal: causal[i[3]],
                ranks: ranks[i[4]],
                ulysses: ulysses[i[5]],
            })
            // A degree runs on the rank counts it divides.
            .filter(|p| p.ranks.is_multiple_of(p.ulysses))
            .collect();
        Ok(Box::new(HybridPlan {
            points,
            bytes: parsed.bytes,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // A panel per (model, profile, length); a line per rank count: time over U.
        let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for row in table.rows.iter().filter(|r| r.get("status") == Some("ok")) {
            let get = |c: &str| row.get(c).unwrap_or("").to_owned();
            let panel = format!(
                "{}, {}, S = {}{}",
                get("model"),
                get("profile"),
                get("seq_len"),
                if get("causal") == "true" {
                    ", causal"
                } else {
                    ""
                }
            );
            lines
                .entry((panel, format!("N = {}", get("ranks"))))
                .or_default()
                .push((row.num("ulysses"), row.num("over_ring")));
        }
        let chart = Chart {
            title: "One layer's attention fwd+bwd, predicted: time over the ring alone's, by Ulysses degree",
            x: Axis::new("Ulysses degree U (ring of N/U)", Scale::Discrete),
            y: Axis::new("time / ring alone", Scale::Log),
        };
        panels(&dir.join("hybrid.svg"), &chart, &Panel::grouped(lines))
    }
}

impl Plan for HybridPlan {
    fn points(&self) -> Vec<Point> {
        self.points.iter().map(|p| Point::single(key(p))).collect()
    }

    fn compute(&mut self, index: usize, _: &PointContext) -> Result<Vec<Record>> {
        let p = self.points[index];
        let mut row = Row {
            model: p.model.name.into(),
            profile: p.profile.name.into(),
            ranks: p.ranks,
            ulysses: p.ulysses,
            seq_len: p.seq_len,
            causal: p.causal,
            heads: p.model.heads,
            kv_heads: p.model.kv_heads,
            ring_ranks: p.ring_ranks(),
            ..Row::default()
        };
        if let Some(reason) = p.unsupported() {
            row.status = format!("skipped: {reason}");
            return Ok(vec![Record::of(&row)?]);
        }
        let prediction = p.predict(self.bytes);
        let bytes = p.bytes(self.bytes);
        // Every degree of this point that can run, for the baseline and the fastest.
        let same = |q: &GridPoint| {
            q.model == p.model
                && std::ptr::eq(q.profile, p.profile)
                && (q.ranks, q.seq_len, q.causal) == (p.ranks, p.seq_len, p.causal)
                && q.unsupported().is_none()
        };
        let others: Vec<f64> = self
            .points
            .iter()
            .filter(|q| same(q))
            .map(|q| q.predict(self.bytes).total)
            .collect();
        let ring = GridPoint { ulysses: 1, ..p };
        row.status = "ok".into();
        row.all_to_all_bytes_per_rank = Some(bytes.all_to_all.0 + bytes.all_to_all.1);
        row.ring_bytes_per_rank = Some(bytes.ring.0 + bytes.ring.1);
        row.all_to_all_ms = Some(prediction.all_to_all * 1e3);
        row.ring_ms = Some(prediction.ring * 1e3);
        row.compute_ms = Some(prediction.compute * 1e3);
        row.total_ms = Some(prediction.total * 1e3);
        row.over_ring = Some(prediction.total / ring.predict(self.bytes).total);
        row.fastest = Some(others.iter().all(|&t| prediction.total <= t));
        Ok(vec![Record::of(&row)?])
    }
}
