//! Kind `attn`: the ring's ablation, measured. Every point of strategy × forward direction ×
//! backward scheme × ranks × length × causal × key/value heads × kernel runs a forward and a
//! forward + backward pass on in-process thread ranks, with the traffic each rank sent, the measured
//! load balance, and the error against a float64 reference on a small copy of the point.

mod point;

use super::axes::{RingAxes, grid};
use super::documents::Documents;
use super::experiment::{Card, Check, Column, Experiment, Plan};
use super::window::WindowSpec;
use crate::backend::BackendName;
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::Result;
use point::{AttnPlan, AttnPoint};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use workbench::Kernel;
use workbench::dtype::Dtype;

/// The kind.
pub struct Attn;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    attention: Shape,
    #[serde(default)]
    measure: Measure,
}

/// Every list but `ranks` and `seq_lens` has a default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    /// Default: every registered strategy.
    strategies: Option<Vec<String>>,
    /// Default: `["cw"]`.
    forward: Option<Vec<String>>,
    /// Default: `["kv"]`.
    backward: Option<Vec<String>>,
    ranks: Option<Vec<usize>>,
    /// Total tokens.
    seq_lens: Option<Vec<usize>>,
    /// Default: `[true]`.
    causal: Option<Vec<bool>>,
    /// Default: `[heads]` (multi-head attention); fewer is GQA, 1 is MQA.
    kv_heads: Option<Vec<usize>>,
    /// Default: `["fused"]`.
    kernels: Option<Vec<String>>,
    /// Packed documents: `"none"`, `"longtail:MAX"` or `"random:MEAN"` ([`Documents`]); absent: not
    /// a column.
    documents: Option<Vec<String>>,
    /// Backends (`flex`, `wgpu`, `cuda`); absent: flex, and not a column.
    backends: Option<Vec<String>>,
    /// Sliding windows: `"none"`, a number of tokens, or `"S/n"` ([`WindowSpec`]); absent: not a
    /// column.
    windows: Option<Vec<String>>,
    /// Logit caps: `"none"` or a number above 0; absent: not a column.
    softcaps: Option<Vec<String>>,
    /// Attention sinks off or on (seeded logits, one a query head); absent: not a column.
    sinks: Option<Vec<bool>>,
    /// Element types of operands and blocks (`"f32"`, `"bf16"`); absent: f32, not a column.
    dtypes: Option<Vec<String>>,
    /// Element types of the accumulators between ring steps; absent: f32, not a column.
    merges: Option<Vec<String>>,
    /// Head × context parallelism: ranks in a group splitting the heads (Ulysses), the rest ring;
    /// absent: 1 (the ring alone), not a column. A degree that does not divide a point's ranks or
    /// heads makes that row `skipped`.
    ulysses: Option<Vec<usize>>,
}

/// `[sweep] dtypes` or `merges`: `[None]` when absent, else each name parsed.
fn dtypes(spec: &SpecText, key: &str, names: &Option<Vec<String>>) -> Result<Vec<Option<Dtype>>> {
    match names {
        None => Ok(vec![None]),
        Some(_) => Ok(spec
            .parsed::<Dtype>("sweep", key, spec.list("sweep", key, names)?)?
            .into_iter()
            .map(Some)
            .collect()),
    }
}

/// `[sweep] softcaps`: `[None]` when absent, else each `"none"` or cap above 0.
fn softcaps(spec: &SpecText, names: &Option<Vec<String>>) -> Result<Vec<Option<Option<f32>>>> {
    let Some(names) = names else {
        return Ok(vec![None]);
    };
    spec.list("sweep", "softcaps", &Some(names.clone()))?
        .iter()
        .map(|n| match n.as_str() {
            "none" => Ok(Some(None)),
            _ => n
                .parse::<f32>()
                .ok()
                .filter(|c| c.is_finite() && *c > 0.0)
                .map(|c| Some(Some(c)))
                .ok_or_else(|| {
                    spec.error(
                        "sweep",
                        "softcaps",
                        &format!("'{n}' is not \"none\" or a number above 0"),
                    )
                }),
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct Shape {
    heads: usize,
    head_dim: usize,
    batch: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            heads: 4,
            head_dim: 64,
            batch: 1,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct Measure {
    /// Timed passes per point, after one untimed warm-up pass; the fastest counts.
    repeats: usize,
    /// Tokens per rank of the small copy checked against the float64 reference.
    check_tokens_per_rank: usize,
}

impl Default for Measure {
    fn default() -> Self {
        Measure {
            repeats: 3,
            check_tokens_per_rank: 16,
        }
    }
}

/// A row's identity: every sweep axis (documents and backend are empty when the sweep lacks them).
const KEYS: &[&str] = &[
    "strategy",
    "forward",
    "backward",
    "ranks",
    "seq_len",
    "causal",
    "kv_heads",
    "kernel",
    "documents",
    "backend",
    "window",
    "softcap",
    "sinks",
    "dtype",
    "merge",
    "ulysses",
];

const CARD: Card = Card {
    name: "attn",
    about: "measured: ring attention forward and backward over strategy x direction x scheme x ranks x length",
    sweep_keys: &[
        "strategies",
        "forward",
        "backward",
        "ranks",
        "seq_lens",
        "causal",
        "kv_heads",
        "kernels",
        "documents",
        "backends",
        "windows",
        "softcaps",
        "sinks",
        "dtypes",
        "merges",
        "ulysses",
    ],
    key_columns: KEYS,
    columns: &[
        Column::exact("document_count"),
        Column::exact("window_tokens"),
        Column::exact("heads"),
        Column::exact("head_dim"),
        Column::exact("batch"),
        Column::exact("status"),
        Column::exact("padded_len"),
        Column::exact("bytes_per_rank"),
        Column::exact("messages_per_rank"),
        Column::exact("all_to_all_bytes_per_rank"),
        Column::exact("host_device_bytes_per_step"),
        Column::exact("kernel_impl"),
        Column::exact("host_device_bytes_per_call"),
        Column::measured("fwd_seconds"),
        Column::measured("fwd_bwd_seconds"),
        Column::measured("fwd_bwd_gflops"),
        Column::measured("matmul_gflops"),
        Column::measured("fwd_bwd_over_matmul"),
        Column::measured("busy_max_over_mean"),
        Column::measured("ring_over_single"),
        // The exactness table's bound: f32 against float64, relative to each tensor's scale (bf16
        // rows: see `check`).
        Column {
            name: "max_rel_error",
            check: Check::AtMost(1e-5),
        },
        Column::measured("total_rel_error"),
    ],
};

impl Experiment for Attn {
    fn card(&self) -> &'static Card {
        &CARD
    }

    /// A row with bf16 operands or merge has bf16's rounding error, not f32's: its bound is stated
    /// against the terms' magnitudes (`tests/tests/precision.rs`), not this column's scale, so here
    /// it is read as a ratio, like a measurement.
    fn check(&self, reference: &Record, column: &Column) -> Check {
        let bf16 = |c: &str| reference.get(c) == Some("bf16");
        match column.name {
            "max_rel_error" if bf16("dtype") || bf16("merge") => Check::Measured,
            _ => column.check,
        }
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        let shape = parsed.attention;
        if shape.heads == 0 || shape.head_dim == 0 || shape.batch == 0 {
            return Err(spec.error(
                "attention",
                "heads",
                &format!(
                    "heads, head_dim and batch must be at least 1, got {}, {}, {}",
                    shape.heads, shape.head_dim, shape.batch
                ),
            ));
        }
        let RingAxes {
            strategies,
            forward,
            backward,
        } = RingAxes::parse(spec, &s.strategies, &s.forward, &s.backward)?;
        let kernels: Vec<Kernel> = spec.parsed(
            "sweep",
            "kernels",
            &spec.list_or("sweep", "kernels", &s.kernels, vec!["fused".into()])?,
        )?;
        let mut ranks = spec.ranks("sweep", &s.ranks)?.to_vec();
        // One rank first: it is every row's ring_over_single baseline.
        ranks.sort_unstable();
        let seq_lens = spec.list("sweep", "seq_lens", &s.seq_lens)?;
        if let Some(&bad) = seq_lens.iter().find(|&&s| s == 0) {
            return Err(spec.error(
                "sweep",
                "seq_lens",
                &format!("lengths must be at least 1, got {bad}"),
            ));
        }
        let causal = &spec.list_or("sweep", "causal", &s.causal, vec![true])?;
        let kv_heads = &spec.list_or("sweep", "kv_heads", &s.kv_heads, vec![shape.heads])?;
        let documents = Documents::axis(spec, &s.documents)?;
        let backends: Vec<Option<BackendName>> = match &s.backends {
            None => vec![None],
            Some(_) => spec
                .parsed::<BackendName>(
                    "sweep",
                    "backends",
                    spec.list("sweep", "backends", &s.backends)?,
                )?
                .into_iter()
                .map(|b: BackendName| match b.compiled_in() {
                    true => Ok(Some(b)),
                    false => Err(spec.error(
                        "sweep",
                        "backends",
                        &format!(
                            "this ringbench was built without {b} (cargo build --release --features {})",
                            b.feature().unwrap_or_default()
                        ),
                    )),
                })
                .collect::<Result<_>>()?,
        };
        let windows = WindowSpec::axis(spec, &s.windows)?;
        let softcaps = softcaps(spec, &s.softcaps)?;
        let dtypes_axis = dtypes(spec, "dtypes", &s.dtypes)?;
        let merges = dtypes(spec, "merges", &s.merges)?;
        let sinks: Vec<Option<bool>> = match &s.sinks {
            None => vec![None],
            some => spec
                .list("sweep", "sinks", some)?
                .iter()
                .map(|&b| Some(b))
                .collect(),
        };
        let ulysses: Vec<Option<usize>> = match &s.ulysses {
            None => vec![None],
            some => {
                let degrees = spec.list("sweep", "ulysses", some)?;
                if let Some(&bad) = degrees.iter().find(|&&u| u == 0) {
                    return Err(spec.error(
                        "sweep",
                        "ulysses",
                        &format!("a Ulysses degree is at least 1, got {bad}"),
                    ));
                }
                // U = 1 first: its one-rank rows are the others' ring_over_single baselines.
                let mut degrees = degrees.to_vec();
                degrees.sort_unstable();
                degrees.into_iter().map(Some).collect()
            }
        };
        // Rank counts outermost after documents, backends and the variants: one-rank rows come
        // first, the baselines of the others' ring_over_single.
        let lens = [
            documents.len(),
            backends.len(),
            windows.len(),
            softcaps.len(),
            sinks.len(),
            dtypes_axis.len(),
            merges.len(),
            ulysses.len(),
            ranks.len(),
            seq_lens.len(),
            causal.len(),
            kv_heads.len(),
            kernels.len(),
            strategies.len(),
            forward.len(),
            backward.len(),
        ];
        let points = grid(&lens)
            .into_iter()
            .map(|i| AttnPoint {
                documents: documents[i[0]],
                backend: backends[i[1]],
                window: windows[i[2]],
                softcap: softcaps[i[3]],
                sinks: sinks[i[4]],
                dtype: dtypes_axis[i[5]],
                merge: merges[i[6]],
                ulysses: ulysses[i[7]],
                ranks: ranks[i[8]],
                seq_len: seq_lens[i[9]],
                causal: causal[i[10]],
                kv_heads: kv_heads[i[11]],
                kernel: kernels[i[12]],
                strategy: strategies[i[13]],
                forward: forward[i[14]],
                backward: backward[i[15]],
            })
            .collect();
        Ok(Box::new(AttnPlan {
            points,
            shape,
            measure: parsed.measure,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // A panel per (length, causality, heads, kernel, documents, backend); a line per strategy:
        // the fastest direction and scheme at each rank count.
        let mut best: BTreeMap<(String, String, String), f64> = BTreeMap::new();
        for row in table.rows.iter().filter(|r| r.get("status") == Some("ok")) {
            let get = |c: &str| row.get(c).unwrap_or("");
            let mut panel = format!(
                "S = {}{}, kv heads {}, {}",
                get("seq_len"),
                if get("causal") == "true" {
                    ", causal"
                } else {
                    ""
                },
                get("kv_heads"),
                get("kernel")
            );
            for (column, label) in [
                ("documents", ""),
                ("backend", ""),
                ("window", "window "),
                ("softcap", "cap "),
                ("sinks", "sinks "),
                ("dtype", ""),
                ("merge", "merge "),
            ] {
                if let Some(value) = row.get(column).filter(|v| !v.is_empty()) {
                    panel += &format!(", {label}{value}");
                }
            }
            let slot = best
                .entry((panel, get("strategy").to_owned(), get("ranks").to_owned()))
                .or_insert(f64::INFINITY);
            *slot = slot.min(row.num("fwd_bwd_seconds"));
        }
        let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for ((panel, strategy, ranks), t) in best {
            lines
                .entry((panel, strategy))
                .or_default()
                .push((ranks.parse().unwrap_or(f64::NAN), t));
        }
        if lines.is_empty() {
            return Ok(());
        }
        let chart = Chart {
            title: "Ring attention forward + backward (fastest direction and scheme)",
            x: Axis::new("ranks N", Scale::Discrete),
            y: Axis::new("fwd+bwd seconds", Scale::Auto),
        };
        panels(&dir.join("attn.svg"), &chart, &Panel::grouped(lines))
    }
}
