//! Kind `precision`: how far ring attention in bf16 lies from float64 as the ring grows. Every point
//! of strategy × backward scheme × ranks × length × causal × dtype × merge × kernel runs a forward and
//! backward pass on thread ranks at the point's full length and compares out, lse, dq, dk and dv with
//! two float64 references: of the inputs rounded to the point's dtype (the algorithm's own error) and
//! of the original f32 inputs (the total error, the inputs' rounding included).

use super::axes::{RingAxes, grid};
use super::experiment::{Card, Column, Experiment, Plan, Point, PointContext};
use crate::backend::{BackendName, run_attention_on};
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::{Result, anyhow};
use reference::compare::{rms_rel_err, worst};
use reference::{Inputs, Reference, Variant, deviations, reference_variant};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;
use strategies::Partition;
use workbench::dtype::{Dtype, Precision};
use workbench::ring::jobs::{AttentionJob, HostTensor};
use workbench::{BackwardScheme, Direction, Kernel, RingConfig};

/// The kind.
pub struct PrecisionKind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    #[serde(default)]
    attention: Shape,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    /// Default: every registered strategy.
    strategies: Option<Vec<String>>,
    /// Default: `["kv"]`.
    backward: Option<Vec<String>>,
    ranks: Option<Vec<usize>>,
    seq_lens: Option<Vec<usize>>,
    /// Default: `[true]`.
    causal: Option<Vec<bool>>,
    /// Default: `["f32", "bf16"]`.
    dtypes: Option<Vec<String>>,
    /// Default: `["f32", "bf16"]`.
    merges: Option<Vec<String>>,
    /// Default: `["fused"]`.
    kernels: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Shape {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            heads: 4,
            kv_heads: 4,
            head_dim: 64,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct PrecisionPoint {
    strategy: &'static dyn Partition,
    backward: BackwardScheme,
    ranks: usize,
    seq_len: usize,
    causal: bool,
    dtype: Dtype,
    merge: Dtype,
    kernel: Kernel,
}

/// One row; the errors are empty on a skipped row.
#[derive(Debug, Default, Serialize)]
struct Row {
    strategy: String,
    backward: String,
    ranks: usize,
    seq_len: usize,
    causal: bool,
    dtype: String,
    merge: String,
    kernel: String,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// `ok`, or `skipped: <the typed error>`.
    status: String,
    /// Against the reference of the inputs rounded to `dtype`, relative to each tensor's largest
    /// magnitude.
    out_error: Option<f64>,
    lse_error: Option<f64>,
    dq_error: Option<f64>,
    dk_error: Option<f64>,
    dv_error: Option<f64>,
    /// The largest of the five.
    max_error: Option<f64>,
    /// ‖ring − float64‖₂ / ‖float64‖₂ per tensor, against the same reference: the error of the
    /// tensor as a whole, where a growth that the largest elements' error hides shows.
    out_rms_error: Option<f64>,
    lse_rms_error: Option<f64>,
    dq_rms_error: Option<f64>,
    dk_rms_error: Option<f64>,
    dv_rms_error: Option<f64>,
    /// The largest of the five against the reference of the original f32 inputs.
    total_error: Option<f64>,
    /// Bytes one rank sent in the forward and backward (mean over ranks).
    bytes_per_rank: Option<f64>,
}

const KEYS: &[&str] = &[
    "strategy", "backward", "ranks", "seq_len", "causal", "dtype", "merge", "kernel",
];

const CARD: Card = Card {
    name: "precision",
    about: "error of out, lse, dq, dk, dv against float64 with bf16 or f32 operands and merge, as N grows",
    sweep_keys: &[
        "strategies",
        "backward",
        "ranks",
        "seq_lens",
        "causal",
        "dtypes",
        "merges",
        "kernels",
    ],
    key_columns: KEYS,
    columns: &[
        Column::exact("heads"),
        Column::exact("kv_heads"),
        Column::exact("head_dim"),
        Column::exact("status"),
        // Rounding errors: the same arithmetic everywhere but for the order of f32 sums in the
        // matmul kernels, which CPUs differ in (a bf16 rounding can then go the other way), so
        // they are read as ratios, like measurements.
        Column::measured("out_error"),
        Column::measured("lse_error"),
        Column::measured("dq_error"),
        Column::measured("dk_error"),
        Column::measured("dv_error"),
        Column::measured("max_error"),
        Column::measured("out_rms_error"),
        Column::measured("lse_rms_error"),
        Column::measured("dq_rms_error"),
        Column::measured("dk_rms_error"),
        Column::measured("dv_rms_error"),
        Column::measured("total_error"),
        Column::exact("bytes_per_rank"),
    ],
};

/// Errors per tensor, in the order of the row's columns.
const TENSORS: [&str; 5] = ["out", "lse", "dq", "dk", "dv"];

impl Experiment for PrecisionKind {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        let axes = RingAxes::parse(spec, &s.strategies, &None, &s.backward)?;
        let ranks = spec.list("sweep", "ranks", &s.ranks)?;
        if ranks.contains(&0) {
            return Err(spec.error("sweep", "ranks", "ranks must be at least 1"));
        }
        let seq_lens = spec.list("sweep", "seq_lens", &s.seq_lens)?;
        let causal = spec.list_or("sweep", "causal", &s.causal, vec![true])?;
        let both = vec!["f32".to_string(), "bf16".to_string()];
        let dtypes: Vec<Dtype> = spec.parsed(
            "sweep",
            "dtypes",
            &spec.list_or("sweep", "dtypes", &s.dtypes, both.clone())?,
        )?;
        let merges: Vec<Dtype> = spec.parsed(
            "sweep",
            "merges",
            &spec.list_or("sweep", "merges", &s.merges, both)?,
        )?;
        let kernels: Vec<Kernel> = spec.parsed(
            "sweep",
            "kernels",
            &spec.list_or("sweep", "kernels", &s.kernels, vec!["fused".into()])?,
        )?;
        let shape = parsed.attention;
        if shape.heads == 0 || shape.kv_heads == 0 || !shape.heads.is_multiple_of(shape.kv_heads) {
            return Err(spec.error(
                "attention",
                "kv_heads",
                &format!(
                    "kv_heads = {} must divide heads = {}",
                    shape.kv_heads, shape.heads
                ),
            ));
        }
        let points = grid(&[
            seq_lens.len(),
            causal.len(),
            kernels.len(),
            axes.strategies.len(),
            axes.backward.len(),
            dtypes.len(),
            merges.len(),
            ranks.len(),
        ])
        .into_iter()
        .map(|i| PrecisionPoint {
            seq_len: seq_lens[i[0]],
            causal: causal[i[1]],
            kernel: kernels[i[2]],
            strategy: axes.strategies[i[3]],
            backward: axes.backward[i[4]],
            dtype: dtypes[i[5]],
            merge: merges[i[6]],
            ranks: ranks[i[7]],
        })
        .collect();
        Ok(Box::new(PrecisionPlan {
            points,
            shape,
            references: HashMap::new(),
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // At the longest length, for zig-zag (or the table's first strategy): a panel per (tensor,
        // causality), a line per (dtype, merge, scheme), the tensor's rms error over N.
        let ok: Vec<&Record> = table
            .rows
            .iter()
            .filter(|r| r.get("status") == Some("ok"))
            .collect();
        let Some(longest) = ok.iter().map(|r| r.num("seq_len")).reduce(f64::max) else {
            return Ok(());
        };
        let strategy = if ok.iter().any(|r| r.get("strategy") == Some("zigzag")) {
            "zigzag"
        } else {
            ok[0].get("strategy").unwrap_or("")
        };
        let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for row in ok
            .iter()
            .filter(|r| r.num("seq_len") == longest && r.get("strategy") == Some(strategy))
        {
            let get = |c: &str| row.get(c).unwrap_or("");
            for tensor in ["out", "dq", "dk", "dv"] {
                let panel = format!(
                    "{tensor}, {strategy}, S = {longest}{}",
                    if get("causal") == "true" {
                        ", causal"
                    } else {
                        ""
                    },
                );
                let line = format!(
                    "{} operands, {} merge, {}",
                    get("dtype"),
                    get("merge"),
                    get("backward")
                );
                lines
                    .entry((panel, line))
                    .or_default()
                    .push((row.num("ranks"), row.num(&format!("{tensor}_rms_error"))));
            }
        }
        let chart = Chart {
            title: "Error against float64 of the rounded inputs (‖err‖₂ / ‖x‖₂)",
            x: Axis::new("ranks N", Scale::Discrete),
            y: Axis::new("relative rms error", Scale::Log),
        };
        panels(&dir.join("precision.svg"), &chart, &Panel::grouped(lines))
    }
}

/// A length's f32 inputs (seeded by it, uniform in [−1, 1)) `[1, s, heads, d]`, q, k, v, dO.
struct Inputs32 {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

struct PrecisionPlan {
    points: Vec<PrecisionPoint>,
    shape: Shape,
    /// The float64 references of the inputs rounded to a dtype (f32: the inputs themselves), by
    /// (length, causal, dtype), each computed once.
    references: HashMap<(usize, bool, Dtype), (Inputs32, Reference)>,
}

impl PrecisionPlan {
    /// The inputs of length `s` rounded to `dtype`, and their float64 reference.
    fn reference(
        &mut self,
        s: usize,
        causal: bool,
        dtype: Dtype,
        context: &PointContext,
    ) -> &(Inputs32, Reference) {
        let Shape {
            heads: h,
            kv_heads: hk,
            head_dim: d,
        } = self.shape;
        self.references
            .entry((s, causal, dtype))
            .or_insert_with(|| {
                context.bar.set_message(format!(
                    "float64 reference of the {dtype} inputs, S = {s}{}",
                    if causal { ", causal" } else { "" }
                ));
                let mut rng = reference::inputs::Rng::new(0xB16 ^ s as u64);
                let mut x = Inputs32 {
                    q: rng.vec(s * h * d, 1.0),
                    k: rng.vec(s * hk * d, 1.0),
                    v: rng.vec(s * hk * d, 1.0),
                    d_out: rng.vec(s * h * d, 1.0),
                };
                for values in [&mut x.q, &mut x.k, &mut x.v, &mut x.d_out] {
                    dtype.round(values);
                }
                let inputs = Inputs {
                    q: &x.q,
                    k: &x.k,
                    v: &x.v,
                    d_out: &x.d_out,
                    dims: [1, s, h, d],
                    kv_heads: hk,
                };
                let scale = 1.0 / (d as f64).sqrt();
                let reference = reference_variant(inputs, causal, scale, &[], &Variant::default());
                (x, reference)
            })
    }
}

impl Plan for PrecisionPlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|p| {
                Point::single(Record::new([
                    ("strategy", p.strategy.name().to_string()),
                    ("backward", p.backward.to_string()),
                    ("ranks", p.ranks.to_string()),
                    ("seq_len", p.seq_len.to_string()),
                    ("causal", p.causal.to_string()),
                    ("dtype", p.dtype.to_string()),
                    ("merge", p.merge.to_string()),
                    ("kernel", p.kernel.to_string()),
                ]))
            })
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let p = self.points[index];
        let shape = self.shape;
        let mut row = Row {
            strategy: p.strategy.name().to_string(),
            backward: p.backward.to_string(),
            ranks: p.ranks,
            seq_len: p.seq_len,
            causal: p.causal,
            dtype: p.dtype.to_string(),
            merge: p.merge.to_string(),
            kernel: p.kernel.to_string(),
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            ..Row::default()
        };
        if let Err(e) = p.strategy.validate(p.seq_len, p.ranks) {
            row.status = format!("skipped: {e}");
            return Ok(vec![Record::of(&row)?]);
        }
        // The run reads the rounded inputs (rounding them again changes nothing); the reference of
        // the original inputs gives the total error.
        let (s, h, hk, d) = (p.seq_len, shape.heads, shape.kv_heads, shape.head_dim);
        let (x, _) = self.reference(s, p.causal, p.dtype, context);
        let tensor =
            |data: &[f32], heads: usize| HostTensor::new(vec![1, s, heads, d], data.to_vec());
        let (q, k, v, d_out) = (
            tensor(&x.q, h),
            tensor(&x.k, hk),
            tensor(&x.v, hk),
            tensor(&x.d_out, h),
        );
        context.bar.set_message(format!(
            "{} N={} {} {} operands, {} merge",
            p.strategy.name(),
            p.ranks,
            p.backward,
            p.dtype,
            p.merge
        ));
        let result = run_attention_on(
            BackendName::Flex,
            &AttentionJob {
                q: &q,
                k: &k,
                v: &v,
                d_out: Some(&d_out),
                ranks: p.ranks,
                ulysses: 1,
                strategy: p.strategy,
                config: RingConfig {
                    causal: p.causal,
                    forward: Direction::Cw,
                    backward: p.backward,
                    kernel: p.kernel,
                    precision: Precision {
                        dtype: p.dtype,
                        merge: p.merge,
                    },
                    ..Default::default()
                },
                timeout: Duration::from_secs(600),
                fault: None,
                link: None,
                doc_lens: &[],
                sinks: None,
            },
        )?;
        let own = &self.reference(s, p.causal, p.dtype, context).1;
        let errors: BTreeMap<&str, f64> = deviations(&result, own)
            .into_iter()
            .map(|(name, d)| (name, d.rel))
            .collect();
        let error = |name: &str| {
            errors
                .get(name)
                .copied()
                .ok_or_else(|| anyhow!("no {name} to compare"))
        };
        row.out_error = Some(error("out")?);
        row.lse_error = Some(error("lse")?);
        row.dq_error = Some(error("dq")?);
        row.dk_error = Some(error("dk")?);
        row.dv_error = Some(error("dv")?);
        row.max_error = Some(worst(TENSORS.iter().map(|t| errors[t])));
        let grads = result
            .grads
            .as_ref()
            .ok_or_else(|| anyhow!("the run returned no gradients"))?;
        row.out_rms_error = Some(rms_rel_err(&result.out.data, &own.out));
        row.lse_rms_error = Some(rms_rel_err(&result.lse.data, &own.lse));
        row.dq_rms_error = Some(rms_rel_err(&grads.dq.data, &own.dq));
        row.dk_rms_error = Some(rms_rel_err(&grads.dk.data, &own.dk));
        row.dv_rms_error = Some(rms_rel_err(&grads.dv.data, &own.dv));
        let original = &self.reference(s, p.causal, Dtype::F32, context).1;
        row.total_error = Some(worst(
            deviations(&result, original)
                .into_iter()
                .map(|(_, d)| d.rel),
        ));
        let bytes: u64 = result.traffic.iter().map(|t| t.total_bytes()).sum();
        row.bytes_per_rank = Some(bytes as f64 / p.ranks as f64);
        row.status = "ok".into();
        Ok(vec![Record::of(&row)?])
    }
}
