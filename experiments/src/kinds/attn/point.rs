//! One point of the `attn` kind: its identity, its row, and its measurement (a forward and a
//! forward + backward pass, timed after a warm-up, the traffic and measured balance, and the float64
//! check of a small copy).

use super::{Measure, Shape};
use crate::backend::{BackendName, run_attention_on};
use crate::kinds::documents::Documents;
use crate::kinds::experiment::{Plan, Point, PointContext};
use crate::kinds::window::WindowSpec;
use crate::measure::baseline::{matmul_gflops_of, random};
use crate::measure::exactness::{CheckVariant, Heads, max_rel_error};
use crate::measure::timing::fastest_after_warm_up;
use crate::results::Record;
use anyhow::Result;
use serde::Serialize;
use std::time::{Duration, Instant};
use strategies::Partition;
use workbench::dtype::{Dtype, Precision};
use workbench::ring::jobs::{AttentionJob, AttentionResult};
use workbench::{BackwardScheme, Direction, Kernel, RingConfig};

#[derive(Debug, Clone, Copy)]
pub(super) struct AttnPoint {
    pub(super) strategy: &'static dyn Partition,
    pub(super) forward: Direction,
    pub(super) backward: BackwardScheme,
    pub(super) ranks: usize,
    pub(super) seq_len: usize,
    pub(super) causal: bool,
    pub(super) kv_heads: usize,
    pub(super) kernel: Kernel,
    /// `None` when the sweep has no documents axis.
    pub(super) documents: Option<Documents>,
    /// `None` when the sweep has no backends axis (then flex).
    pub(super) backend: Option<BackendName>,
    /// `None` when the sweep has no windows axis.
    pub(super) window: Option<WindowSpec>,
    /// `None` when the sweep has no softcaps axis; `Some(None)`: no cap.
    pub(super) softcap: Option<Option<f32>>,
    /// `None` when the sweep has no sinks axis.
    pub(super) sinks: Option<bool>,
    /// `None` when the sweep has no dtypes axis (then f32).
    pub(super) dtype: Option<Dtype>,
    /// `None` when the sweep has no merges axis (then f32).
    pub(super) merge: Option<Dtype>,
    /// `None` when the sweep has no ulysses axis (then 1: the ring alone).
    pub(super) ulysses: Option<usize>,
}

/// One row; every measured column is empty on a skipped row.
#[derive(Debug, Default, Serialize)]
struct Row {
    strategy: String,
    forward: String,
    backward: String,
    ranks: usize,
    seq_len: usize,
    causal: bool,
    kv_heads: usize,
    kernel: String,
    /// Empty unless the sweep packs documents.
    documents: Option<String>,
    /// Documents in the sequence, when packed.
    document_count: Option<usize>,
    /// Empty unless the sweep has a backends axis.
    backend: Option<String>,
    /// Empty unless the sweep has a windows axis.
    window: Option<String>,
    /// The window in tokens (empty: none).
    window_tokens: Option<usize>,
    /// Empty unless the sweep has a softcaps axis.
    softcap: Option<String>,
    /// Empty unless the sweep has a sinks axis.
    sinks: Option<bool>,
    /// Empty unless the sweep has a dtypes axis.
    dtype: Option<String>,
    /// Empty unless the sweep has a merges axis.
    merge: Option<String>,
    /// Empty unless the sweep has a ulysses axis: ranks in a group splitting the heads.
    ulysses: Option<usize>,
    /// The most bytes any rank's ring step moved between host and device in fwd+bwd.
    host_device_bytes_per_step: Option<u64>,
    /// What computed the tiles: `cpu-fused` (`cpu-fused-avx512bf16` with bf16 operands), `cubecl-fused`
    /// or `generic`.
    kernel_impl: Option<&'static str>,
    /// Every byte fwd+bwd moved between host and device, all ranks, inputs and outputs included.
    host_device_bytes_per_call: Option<u64>,
    heads: usize,
    head_dim: usize,
    batch: usize,
    /// `ok`, or `skipped: <the typed error>`.
    status: String,
    /// The length the ranks split: `seq_len`, or the next one the strategy accepts (padding).
    padded_len: Option<usize>,
    fwd_seconds: Option<f64>,
    fwd_bwd_seconds: Option<f64>,
    fwd_bwd_gflops: Option<f64>,
    matmul_gflops: Option<f64>,
    fwd_bwd_over_matmul: Option<f64>,
    /// Bytes one rank sent in the forward and backward (mean over ranks).
    bytes_per_rank: Option<f64>,
    /// Messages one rank sent in the forward and backward (mean over ranks).
    messages_per_rank: Option<f64>,
    /// Of `bytes_per_rank`, what the Ulysses all-to-alls sent (with a ulysses axis).
    all_to_all_bytes_per_rank: Option<f64>,
    /// Busiest rank's tile compute time over the mean (forward and backward): the measured balance.
    busy_max_over_mean: Option<f64>,
    /// fwd+bwd seconds over the same point's one-rank row (same strategy, direction, scheme,
    /// length, causality, heads, kernel, documents and backend; with a ulysses axis, its U = 1 row).
    ring_over_single: Option<f64>,
    /// Largest error of out, lse, dq, dk, dv against float64, each relative to its scale, on the
    /// same point at `check_tokens_per_rank` tokens per rank; with bf16 operands, against the
    /// reference of the rounded inputs (the algorithm's own error).
    max_rel_error: Option<f64>,
    /// With a dtypes axis: the same against the reference of the original f32 inputs (the inputs'
    /// rounding included).
    total_rel_error: Option<f64>,
}

pub(super) struct AttnPlan {
    pub(super) points: Vec<AttnPoint>,
    pub(super) shape: Shape,
    pub(super) measure: Measure,
}

pub(super) fn key(p: &AttnPoint) -> Record {
    let mut key = Record::new([
        ("strategy", p.strategy.name().to_string()),
        ("forward", p.forward.to_string()),
        ("backward", p.backward.to_string()),
        ("ranks", p.ranks.to_string()),
        ("seq_len", p.seq_len.to_string()),
        ("causal", p.causal.to_string()),
        ("kv_heads", p.kv_heads.to_string()),
        ("kernel", p.kernel.to_string()),
    ]);
    // A sweep without documents keys its rows as it always did.
    if let Some(documents) = p.documents {
        key.0.push(("documents".into(), documents.name()));
    }
    if let Some(backend) = p.backend {
        key.0.push(("backend".into(), backend.to_string()));
    }
    if let Some(window) = p.window {
        key.0.push(("window".into(), window.name()));
    }
    if let Some(cap) = p.softcap {
        key.0.push(("softcap".into(), cap_name(cap)));
    }
    if let Some(sinks) = p.sinks {
        key.0.push(("sinks".into(), sinks.to_string()));
    }
    if let Some(dtype) = p.dtype {
        key.0.push(("dtype".into(), dtype.to_string()));
    }
    if let Some(merge) = p.merge {
        key.0.push(("merge".into(), merge.to_string()));
    }
    if let Some(ulysses) = p.ulysses {
        key.0.push(("ulysses".into(), ulysses.to_string()));
    }
    key
}

/// A cap as the spec and the table name it.
fn cap_name(cap: Option<f32>) -> String {
    cap.map_or("none".into(), |c| c.to_string())
}

/// Why a point cannot run, as the typed error says it; `None` if it can. A length the strategy
/// cannot split runs padded (the `padded_len` column says to what).
fn unsupported(p: &AttnPoint, heads: usize) -> Option<String> {
    if p.kv_heads == 0 || !heads.is_multiple_of(p.kv_heads) {
        return Some(format!(
            "heads = {heads} is not a multiple of kv_heads = {}",
            p.kv_heads
        ));
    }
    let u = p.ulysses.unwrap_or(1);
    if let Err(e) = workbench::ring::ulysses::check_heads(u, p.ranks, heads, p.kv_heads) {
        return Some(e.to_string());
    }
    strategies::padded_grid_len(p.strategy, p.seq_len, p.ranks / u, u)
        .err()
        .map(|e| e.to_string())
}

impl Plan for AttnPlan {
    fn points(&self) -> Vec<Point> {
        self.points.iter().map(|p| Point::single(key(p))).collect()
    }

    fn processes(&self, index: usize) -> Option<usize> {
        Some(self.points[index].ranks)
    }

    /// A point and its one-rank baseline (the same key at ranks = 1 and U = 1) share a shard.
    fn shard_group(&self, point: &Point) -> Record {
        Record(
            point
                .key
                .0
                .iter()
                .filter(|(c, _)| c != "ranks" && c != "ulysses")
                .cloned()
                .collect(),
        )
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let p = self.points[index];
        let Shape {
            heads,
            head_dim,
            batch,
        } = self.shape;
        let mut row = Row {
            strategy: p.strategy.name().to_owned(),
            forward: p.forward.to_string(),
            backward: p.backward.to_string(),
            ranks: p.ranks,
            seq_len: p.seq_len,
            causal: p.causal,
            kv_heads: p.kv_heads,
            kernel: p.kernel.to_string(),
            documents: p.documents.map(Documents::name),
            document_count: p.documents.map(|d| d.lengths(p.seq_len).len().max(1)),
            backend: p.backend.map(|b| b.to_string()),
            window: p.window.map(WindowSpec::name),
            window_tokens: p.window.and_then(|w| w.tokens(p.seq_len)),
            softcap: p.softcap.map(cap_name),
            sinks: p.sinks,
            dtype: p.dtype.map(|d| d.to_string()),
            merge: p.merge.map(|d| d.to_string()),
            ulysses: p.ulysses,
            heads,
            head_dim,
            batch,
            ..Row::default()
        };
        if let Some(reason) = unsupported(&p, heads) {
            row.status = format!("skipped: {reason}");
            return Ok(vec![Record::of(&row)?]);
        }
        let config = RingConfig {
            causal: p.causal,
            forward: p.forward,
            backward: p.backward,
            kernel: p.kernel,
            scale: None,
            window: p.window.and_then(|w| w.tokens(p.seq_len)),
            softcap: p.softcap.flatten(),
            lockstep: false,
            precision: Precision {
                dtype: p.dtype.unwrap_or_default(),
                merge: p.merge.unwrap_or_default(),
            },
        };
        let (b, s, h, hk, d) = (batch, p.seq_len, heads, p.kv_heads, head_dim);
        let q = random(vec![b, s, h, d], 1);
        let k = random(vec![b, s, hk, d], 2);
        let v = random(vec![b, s, hk, d], 3);
        let d_out = random(vec![b, s, h, d], 4);
        let doc_lens = p.documents.map_or(Vec::new(), |d| d.lengths(s));
        let sinks = (p.sinks == Some(true)).then(|| random(vec![h], 5).data);
        let job = |with_grad: bool| AttentionJob {
            q: &q,
            k: &k,
            v: &v,
            d_out: with_grad.then_some(&d_out),
            ranks: p.ranks,
            ulysses: p.ulysses.unwrap_or(1),
            strategy: p.strategy,
            config,
            timeout: Duration::from_secs(3600),
            fault: None,
            link: None,
            doc_lens: &doc_lens,
            sinks: sinks.as_deref(),
        };
        let backend = p.backend.unwrap_or_default();
        let (fwd, _) = fastest(backend, &job(false), self.measure.repeats)?;
        let (fwd_bwd, result) = fastest(backend, &job(true), self.measure.repeats)?;
        // The baseline is re-measured beside every row: these machines are shared and noisy.
        let matmul = matmul_gflops_of(backend, 1024)?;
        // Useful FLOPs as the engine counted them: every rank's tiles, forward and backward, over
        // the pairs they could see (documents and windows leave fewer than the sequence's).
        let flops = result
            .events
            .iter()
            .flatten()
            .map(|e| e.flops as f64)
            .sum::<f64>();
        let n = p.ranks as f64;
        let busy: Vec<f64> = result
            .events
            .iter()
            .map(|e| e.iter().map(|e| e.compute_seconds).sum())
            .collect();
        let busy_mean = busy.iter().sum::<f64>() / busy.len().max(1) as f64;
        // The same point on one rank: same strategy, direction, scheme and everything else.
        let single = context
            .table
            .find(&key(&AttnPoint {
                ranks: 1,
                ulysses: p.ulysses.map(|_| 1),
                ..p
            }))
            .filter(|r| r.get("status") == Some("ok"))
            .map(|r| r.num("fwd_bwd_seconds"));
        context
            .bar
            .set_message(format!("{} float64 check", point_label(&p)));
        row.status = "ok".into();
        let u = p.ulysses.unwrap_or(1);
        row.padded_len = strategies::padded_grid_len(p.strategy, p.seq_len, p.ranks / u, u).ok();
        row.fwd_seconds = Some(fwd);
        row.fwd_bwd_seconds = Some(fwd_bwd);
        row.fwd_bwd_gflops = Some(flops / fwd_bwd / 1e9);
        row.matmul_gflops = Some(matmul);
        row.fwd_bwd_over_matmul = Some(flops / fwd_bwd / 1e9 / matmul);
        row.bytes_per_rank = Some(
            result
                .traffic
                .iter()
                .map(|t| t.total_bytes() as f64)
                .sum::<f64>()
                / n,
        );
        row.messages_per_rank = Some(
            result
                .traffic
                .iter()
                .map(|t| t.sends.len() as f64)
                .sum::<f64>()
                / n,
        );
        row.all_to_all_bytes_per_rank = p.ulysses.map(|_| {
            result
                .traffic
                .iter()
                .flat_map(|t| &t.sends)
                .filter(|s| s.phase == workbench::transport::Phase::AllToAll)
                .map(|s| s.bytes)
                .sum::<u64>() as f64
                / n
        });
        row.busy_max_over_mean = Some(
            reference::compare::worst(busy.iter().copied()) / busy_mean.max(f64::MIN_POSITIVE),
        );
        row.ring_over_single = single.map(|t| fwd_bwd / t);
        row.kernel_impl = Some(result.kernel_impl);
        row.host_device_bytes_per_call = Some(result.host_device_bytes.iter().sum());
        row.host_device_bytes_per_step = result
            .traffic
            .iter()
            .flat_map(|t| t.host_device.iter().map(|r| r.bytes))
            .max();
        let errors = max_rel_error(
            backend,
            p.strategy,
            (p.ranks, u),
            Heads {
                heads,
                kv_heads: p.kv_heads,
                head_dim,
            },
            config,
            self.measure.check_tokens_per_rank,
            &CheckVariant {
                doc_lens: &|len| p.documents.map_or(Vec::new(), |d| d.lengths(len)),
                window: &|len| p.window.and_then(|w| w.tokens(len)),
                softcap: p.softcap.flatten(),
                sinks: p.sinks == Some(true),
            },
        )?;
        row.max_rel_error = Some(errors.own);
        row.total_rel_error = p.dtype.map(|_| errors.total);
        Ok(vec![Record::of(&row)?])
    }
}

fn point_label(p: &AttnPoint) -> String {
    format!(
        "{} {}/{} N={}{} S={} causal={} hk={} {}",
        p.strategy.name(),
        p.forward,
        p.backward,
        p.ranks,
        p.ulysses.map_or(String::new(), |u| format!(" U={u}")),
        p.seq_len,
        p.causal,
        p.kv_heads,
        p.kernel
    )
}

/// The fastest of `repeats` runs of `job` on `backend` after a warm-up run: its wall seconds and
/// result.
fn fastest(
    backend: BackendName,
    job: &AttentionJob,
    repeats: usize,
) -> Result<(f64, AttentionResult)> {
    fastest_after_warm_up(
        repeats,
        || {
            let start = Instant::now();
            let result = run_attention_on(backend, job)?;
            Ok((start.elapsed().as_secs_f64(), result))
        },
        |(seconds, _)| *seconds,
    )
}
