//! Measured experiments on this machine (the runner's `knee`, `memory` and `mfu` kinds): the overlap
//! knee of a rate-limited thread ring (Table 2's untested claim), per-rank peak memory and maximum
//! context (Table 3), and model FLOPs utilization of training steps (Table 4).

use crate::bench::{matmul_gflops, random};
use crate::runner::Row;
use anyhow::Result;
use burn::backend::{Autodiff, Flex};
use datasets::SplitMix64;
use indicatif::ProgressBar;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use workbench::launch::{AttentionJob, run_attention};
use workbench::model::LlamaConfig;
use workbench::train::{Example, TrainOptions, train};
use workbench::transport::Link;
use workbench::{Kernel, RingConfig};

type Train = Autodiff<Flex>;
const TIMEOUT: Duration = Duration::from_secs(3600);
const MIB: f64 = 1024.0 * 1024.0;

/// One timed configuration of the knee experiment.
#[derive(Debug, Clone, Copy)]
struct RingTiming {
    /// Mean tile compute seconds per rank and step (from the ranks' step events).
    compute_per_step: f64,
    /// Median over repeats of the mean seconds a rank spent blocked waiting for blocks in a pass.
    wait_per_pass: f64,
}

/// Times a non-causal forward ring pass with `block` tokens per rank.
fn time_ring(
    ranks: usize,
    block: usize,
    heads: usize,
    head_dim: usize,
    link: Option<Link>,
    repeats: usize,
) -> Result<RingTiming> {
    let seq = ranks * block;
    let q = random(vec![1, seq, heads, head_dim], 1);
    let k = random(vec![1, seq, heads, head_dim], 2);
    let v = random(vec![1, seq, heads, head_dim], 3);
    let job = AttentionJob {
        q: &q,
        k: &k,
        v: &v,
        d_out: None,
        ranks,
        strategy: &strategies::Contiguous,
        config: RingConfig {
            causal: false,
            kernel: Kernel::Fused,
            ..Default::default()
        },
        timeout: TIMEOUT,
        fault: None,
        link,
    };
    let mut waits = Vec::new();
    let mut compute = Vec::new();
    for _ in 0..repeats.max(1) {
        let result = run_attention::<Train>(&job, &Default::default())?;
        compute.extend(result.events.iter().flatten().map(|e| e.compute_seconds));
        waits.push(result.traffic.iter().map(|t| t.wait_seconds).sum::<f64>() / ranks as f64);
    }
    waits.sort_by(f64::total_cmp);
    Ok(RingTiming {
        compute_per_step: compute.iter().sum::<f64>() / compute.len().max(1) as f64,
        wait_per_pass: waits[waits.len() / 2],
    })
}

/// The overlap knee: the link is set so that sending one K/V block takes exactly as long as
/// computing one tile at `set_tokens` tokens per rank (compute measured in this run), i.e. F/B =
/// `set_tokens`; then every block size runs over unlimited and over rate-limited links.
pub fn knee_rows(
    ranks: usize,
    blocks: &[usize],
    set_tokens: usize,
    heads: usize,
    head_dim: usize,
    repeats: usize,
    bar: &ProgressBar,
) -> Result<Vec<Row>> {
    let block_bytes = |c: usize| (2 * c * heads * head_dim * 4) as f64;
    let at_set = time_ring(ranks, set_tokens, heads, head_dim, None, repeats)?;
    let bytes_per_s = block_bytes(set_tokens) / at_set.compute_per_step;
    let link = Link {
        bytes_per_s,
        latency: Duration::ZERO,
    };
    let mut measured: Vec<(usize, RingTiming, RingTiming)> = Vec::new();
    for &c in blocks {
        bar.set_message(format!("knee c={c}"));
        let free = time_ring(ranks, c, heads, head_dim, None, repeats)?;
        let limited = time_ring(ranks, c, heads, head_dim, Some(link), repeats)?;
        measured.push((c, free, limited));
        bar.inc(1);
    }
    // Theory: each of the N − 1 transfers exposes max(0, T_comm − T_comp).
    let exposed = |free: &RingTiming, limited: &RingTiming| {
        (limited.wait_per_pass - free.wait_per_pass).max(0.0)
    };
    let points: Vec<(usize, f64, f64)> = measured
        .iter()
        .map(|(c, free, limited)| {
            let pass = ranks as f64 * limited.compute_per_step;
            (*c, exposed(free, limited), pass)
        })
        .collect();
    let knee = measured_knee(&points);
    Ok(measured
        .iter()
        .zip(&points)
        .map(|((c, free, limited), &(_, exposed_s, compute_s))| {
            let t_comp = free.compute_per_step;
            let t_comm = block_bytes(*c) / bytes_per_s;
            let theory = (ranks - 1) as f64 * (t_comm - t_comp).max(0.0);
            Row {
                keys: vec![("ranks", ranks.to_string()), ("block_size", c.to_string())],
                values: vec![
                    ("set_knee_tokens", set_tokens.to_string()),
                    ("link_mb_per_s", format!("{:.1}", bytes_per_s / 1e6)),
                    ("compute_ms_per_step", format!("{:.3}", t_comp * 1e3)),
                    ("comm_ms_per_step", format!("{:.3}", t_comm * 1e3)),
                    (
                        "wait_ms_free_link",
                        format!("{:.3}", free.wait_per_pass * 1e3),
                    ),
                    (
                        "wait_ms_limited_link",
                        format!("{:.3}", limited.wait_per_pass * 1e3),
                    ),
                    (
                        "exposed_comm_fraction",
                        format!("{:.4}", exposed_s / (exposed_s + compute_s)),
                    ),
                    (
                        "theory_exposed_fraction",
                        format!("{:.4}", theory / (theory + ranks as f64 * t_comp)),
                    ),
                    (
                        "measured_knee_tokens",
                        knee.map_or("-".into(), |k| format!("{k:.0}")),
                    ),
                    (
                        "measured_over_set",
                        knee.map_or("-".into(), |k| format!("{:.3}", k / set_tokens as f64)),
                    ),
                ],
            }
        })
        .collect())
}

/// Where the exposed communication reaches zero. Per transfer it is `T_comm − T_comp = βc − γc²`
/// below the knee, so `exposed / c` falls on a line in c that crosses zero at the knee `β / γ`:
/// fit that line (least squares) through the link-bound block sizes — those from the smallest up to
/// the first whose exposed share is within noise (≤ 5%) — and return its zero.
/// `points` are (block size, exposed seconds per pass, compute seconds per pass).
fn measured_knee(points: &[(usize, f64, f64)]) -> Option<f64> {
    let bound: Vec<(f64, f64)> = points
        .iter()
        .take_while(|&&(_, exposed, compute)| exposed / (exposed + compute) > 0.05)
        .map(|&(c, exposed, _)| (c as f64, exposed / c as f64))
        .collect();
    if bound.len() < 2 {
        return None;
    }
    let n = bound.len() as f64;
    let (mx, my) = bound
        .iter()
        .fold((0.0, 0.0), |(x, y), &(c, e)| (x + c / n, y + e / n));
    let sxy: f64 = bound.iter().map(|&(c, e)| (c - mx) * (e - my)).sum();
    let sxx: f64 = bound.iter().map(|&(c, _)| (c - mx) * (c - mx)).sum();
    let slope = sxy / sxx;
    (slope < 0.0).then(|| mx - my / slope)
}

/// Tile compute seconds `[rank][step]` of a causal forward ring pass, measured in lockstep (one rank
/// computes at a time, so the thread ranks do not contend for the cores).
pub fn lockstep_tile_seconds(
    partition: &dyn strategies::Partition,
    ranks: usize,
    block: usize,
    heads: usize,
    head_dim: usize,
) -> Result<Vec<Vec<f64>>> {
    let seq = ranks * block;
    let q = random(vec![1, seq, heads, head_dim], 1);
    let k = random(vec![1, seq, heads, head_dim], 2);
    let v = random(vec![1, seq, heads, head_dim], 3);
    let job = AttentionJob {
        q: &q,
        k: &k,
        v: &v,
        d_out: None,
        ranks,
        strategy: partition,
        config: RingConfig {
            causal: true,
            kernel: Kernel::Fused,
            lockstep: true,
            ..Default::default()
        },
        timeout: TIMEOUT,
        fault: None,
        link: None,
    };
    // A warm-up pass, then the best of three per tile.
    run_attention::<Train>(&job, &Default::default())?;
    let mut best = vec![vec![f64::INFINITY; ranks]; ranks];
    for _ in 0..3 {
        let result = run_attention::<Train>(&job, &Default::default())?;
        for (r, events) in result.events.iter().enumerate() {
            for e in events {
                best[r][e.step] = best[r][e.step].min(e.compute_seconds);
            }
        }
    }
    Ok(best)
}

/// How a memory row runs one training step of the small model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// One rank, the generic kernel: the full `S × S` score matrix is materialized.
    Vanilla,
    /// One rank, the fused blockwise kernel, the feed-forward on the whole sequence at once.
    MemoryEfficient,
    /// One rank, blockwise attention and blockwise feed-forward (chunks of the block size).
    Blockwise,
    /// N ranks, ring attention, blockwise feed-forward.
    Ring,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Vanilla => "vanilla",
            Method::MemoryEfficient => "memory-efficient",
            Method::Blockwise => "blockwise-attn+ffn",
            Method::Ring => "ring",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [
            Method::Vanilla,
            Method::MemoryEfficient,
            Method::Blockwise,
            Method::Ring,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// The small model of the memory and MFU tables.
#[derive(Debug, Clone, Copy)]
pub struct SmallModel {
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub vocab: usize,
}

fn llama(m: &SmallModel, ffn_chunk: usize) -> LlamaConfig {
    LlamaConfig::new(m.vocab)
        .with_d_model(m.d_model)
        .with_layers(m.layers)
        .with_heads(m.heads)
        .with_kv_heads(m.heads)
        .with_ffn_chunk(ffn_chunk)
}

/// Trains `steps` steps on random tokens; returns (process peak bytes in the first step, seconds of
/// each step after the first).
fn train_steps(
    m: &SmallModel,
    ranks: usize,
    seq: usize,
    ffn_chunk: usize,
    kernel: Kernel,
    steps: usize,
) -> Result<(usize, Vec<f64>)> {
    let config = llama(m, ffn_chunk);
    <Train as burn::tensor::backend::Backend>::seed(&Default::default(), 0);
    let model = config.init::<Train>(&Default::default());
    let options = TrainOptions {
        ranks,
        ring: RingConfig {
            kernel,
            ..Default::default()
        },
        steps,
        lr: 1e-4,
        warmup_steps: 1,
        min_lr_ratio: 1.0,
        weight_decay: 0.0,
        grad_clip: None,
        seed: 0,
        checksum_every: 0,
        pad_token: 0,
        timeout: TIMEOUT,
    };
    let partition = strategies::by_name("zigzag")?;
    let partition = if partition.validate(seq, ranks).is_ok() {
        partition
    } else {
        &strategies::Contiguous
    };
    let peak = AtomicUsize::new(0);
    let times = std::sync::Mutex::new(Vec::new());
    crate::alloc::reset();
    train(
        model,
        partition,
        &options,
        |step| {
            let mut rng = SplitMix64::new(step as u64);
            vec![Example {
                tokens: (0..=seq)
                    .map(|_| rng.below(m.vocab as u64) as u32)
                    .collect(),
                weights: vec![1.0; seq],
            }]
        },
        |log| {
            if log.step == 0 {
                peak.store(crate::alloc::stats().peak_above_start, Ordering::Relaxed);
            } else {
                times.lock().expect("times").push(log.seconds);
            }
        },
        &AtomicBool::new(false),
    )?;
    Ok((peak.into_inner(), times.into_inner().expect("times")))
}

/// Per-rank peak bytes of one training step: the process peak over the rank count (rank threads
/// share the process; ranks are symmetric).
pub fn peak_per_rank(
    m: &SmallModel,
    method: Method,
    ranks: usize,
    seq: usize,
    block: usize,
) -> Result<f64> {
    let (ranks, ffn_chunk, kernel) = match method {
        Method::Vanilla => (1, seq, Kernel::Generic),
        Method::MemoryEfficient => (1, seq, Kernel::Fused),
        Method::Blockwise => (1, block, Kernel::Fused),
        Method::Ring => (ranks, block, Kernel::Fused),
    };
    // The smaller of two runs: a fresh rank thread sometimes allocates once-only buffers (e.g. a
    // matmul packing workspace) inside the measured step.
    let (first, _) = train_steps(m, ranks, seq, ffn_chunk, kernel, 1)?;
    let (second, _) = train_steps(m, ranks, seq, ffn_chunk, kernel, 1)?;
    Ok(first.min(second) as f64 / ranks as f64)
}

/// The longest power-of-two sequence (from `start`) whose per-rank peak fits `budget` bytes;
/// stops at `cap`.
pub fn max_context(
    m: &SmallModel,
    method: Method,
    ranks: usize,
    block_cap: usize,
    budget: f64,
    start: usize,
    cap: usize,
) -> Result<Option<usize>> {
    let mut best = None;
    let mut seq = start;
    while seq <= cap {
        let block = (seq / ranks).min(block_cap);
        if peak_per_rank(m, method, ranks, seq, block)? > budget {
            break;
        }
        best = Some(seq);
        seq *= 2;
    }
    Ok(best)
}

/// Training FLOPs of one step: 6 · (non-embedding + head parameters) · tokens for the matmuls, and
/// 12 · d_model · (causal pairs) per layer for attention (QKᵀ and PV forward, twice that backward).
pub fn model_flops(m: &SmallModel, seq: usize) -> f64 {
    let config = llama(m, seq);
    let matmul_params = config.num_params() - m.vocab * m.d_model;
    let pairs = seq as f64 * (seq as f64 + 1.0) / 2.0;
    6.0 * matmul_params as f64 * seq as f64 + 12.0 * m.d_model as f64 * pairs * m.layers as f64
}

/// MFU of training steps: (model FLOPs / step time) over the square-matmul rate measured beside it.
pub fn mfu_row(m: &SmallModel, ranks: usize, seq: usize, steps: usize) -> Result<Row> {
    let block = seq / ranks;
    let (_, times) = train_steps(m, ranks, seq, block.min(1024), Kernel::Fused, steps + 1)?;
    let matmul = matmul_gflops(1024);
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let gflops = model_flops(m, seq) / mean / 1e9;
    Ok(Row {
        keys: vec![("ranks", ranks.to_string()), ("seq_len", seq.to_string())],
        values: vec![
            ("tokens_per_rank", block.to_string()),
            ("step_s", format!("{mean:.3}")),
            ("tokens_per_s", format!("{:.0}", seq as f64 / mean)),
            (
                "model_gflop_per_step",
                format!("{:.2}", model_flops(m, seq) / 1e9),
            ),
            ("achieved_gflops", format!("{gflops:.1}")),
            ("matmul_gflops", format!("{matmul:.1}")),
            ("mfu", format!("{:.3}", gflops / matmul)),
        ],
    })
}

pub fn mib(bytes: f64) -> String {
    format!("{:.2}", bytes / MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knee_estimate_recovers_the_crossing_of_the_model() {
        // exposed = βc − γc² below c* = β/γ = 500, zero above; compute = 2 T_comp = 2γc².
        let (beta, gamma) = (1e-5, 2e-8);
        let points: Vec<(usize, f64, f64)> = [100, 200, 300, 400, 450, 500, 600, 800]
            .iter()
            .map(|&c| {
                let c_f = c as f64;
                (
                    c,
                    (beta * c_f - gamma * c_f * c_f).max(0.0),
                    2.0 * gamma * c_f * c_f,
                )
            })
            .collect();
        let knee = measured_knee(&points).unwrap();
        assert!((knee - 500.0).abs() < 1e-6, "{knee}");
        assert_eq!(measured_knee(&points[5..]), None);
    }
}
