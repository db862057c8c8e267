//! Measured experiments on this machine (the runner's `knee`, `memory` and `mfu` kinds): the overlap
//! knee of a rate-limited thread ring (Table 2's untested claim), per-rank peak memory and maximum
//! context (Table 3), and model FLOPs utilization of training steps (Table 4).

use crate::bench::{matmul_gflops, random};
use crate::row::Row;
use crate::units::MIB;
use anyhow::Result;
use burn::backend::{Autodiff, Flex};
use datasets::SplitMix64;
use indicatif::ProgressBar;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use workbench::kernels::flops::{DENSE_PER_PARAM_TOKEN, MODEL_PER_PAIR_DIM, visible_pairs};
use workbench::model::LlamaConfig;
use workbench::ring::jobs::{AttentionJob, HostTensor, run_attention};
use workbench::train::{Example, TrainOptions, train};
use workbench::transport::Link;
use workbench::{Kernel, RingConfig};

type Train = Autodiff<Flex>;
const TIMEOUT: Duration = Duration::from_secs(3600);

/// Seeded random q, k, v of `[1, ranks · block, heads, head_dim]`.
fn random_qkv(ranks: usize, block: usize, heads: usize, head_dim: usize) -> [HostTensor; 3] {
    let shape = vec![1, ranks * block, heads, head_dim];
    [1, 2, 3].map(|seed| random(shape.clone(), seed))
}

/// A forward-only ring job over `qkv`.
fn forward_job<'a>(
    qkv: &'a [HostTensor; 3],
    ranks: usize,
    strategy: &'a dyn strategies::Partition,
    config: RingConfig,
    link: Option<Link>,
) -> AttentionJob<'a> {
    AttentionJob {
        q: &qkv[0],
        k: &qkv[1],
        v: &qkv[2],
        d_out: None,
        ranks,
        strategy,
        config,
        timeout: TIMEOUT,
        fault: None,
        link,
    }
}

/// One timed configuration of the knee experiment: the fastest of the repeated passes.
#[derive(Debug, Clone, Copy)]
struct RingTiming {
    /// Mean tile compute seconds per rank and step (from the ranks' step events).
    compute_per_step: f64,
    /// Mean seconds a rank spent blocked waiting for blocks in the pass.
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
    let qkv = random_qkv(ranks, block, heads, head_dim);
    let config = RingConfig {
        causal: false,
        kernel: Kernel::Fused,
        ..Default::default()
    };
    let job = forward_job(&qkv, ranks, &strategies::Contiguous, config, link);
    // Jitter only ever adds time: keep the repeat whose pass (compute plus waiting) was fastest,
    // its compute and wait together (they trade off against each other within a pass).
    let mut best = RingTiming {
        compute_per_step: f64::INFINITY,
        wait_per_pass: f64::INFINITY,
    };
    let pass = |t: &RingTiming| ranks as f64 * t.compute_per_step + t.wait_per_pass;
    for _ in 0..repeats.max(1) {
        let result = run_attention::<Train>(&job, &Default::default())?;
        let steps: Vec<f64> = result
            .events
            .iter()
            .flatten()
            .map(|e| e.compute_seconds)
            .collect();
        let compute = steps.iter().sum::<f64>() / steps.len().max(1) as f64;
        let wait = result.traffic.iter().map(|t| t.wait_seconds).sum::<f64>() / ranks as f64;
        let timing = RingTiming {
            compute_per_step: compute,
            wait_per_pass: wait,
        };
        if pass(&timing) < pass(&best) {
            best = timing;
        }
    }
    Ok(best)
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
    let mut free = Vec::new();
    for &c in blocks {
        bar.set_message(format!("knee c={c}, free link"));
        free.push(time_ring(ranks, c, heads, head_dim, None, repeats)?);
    }
    let at_set = match blocks.iter().position(|&c| c == set_tokens) {
        Some(i) => free[i],
        None => time_ring(ranks, set_tokens, heads, head_dim, None, repeats)?,
    };
    let bytes_per_s = block_bytes(set_tokens) / at_set.compute_per_step;
    let link = Link {
        bytes_per_s,
        latency: Duration::ZERO,
    };
    let mut points = Vec::new();
    let mut limited = Vec::new();
    for (&c, f) in blocks.iter().zip(&free) {
        bar.set_message(format!("knee c={c}, limited link"));
        let l = time_ring(ranks, c, heads, head_dim, Some(link), repeats)?;
        points.push(KneePoint {
            block: c,
            exposed: (l.wait_per_pass - f.wait_per_pass).max(0.0),
            compute: f.compute_per_step,
        });
        limited.push(l);
        bar.inc(1);
    }
    let knee = measured_knee(&points, ranks);
    Ok(points
        .iter()
        .zip(free.iter().zip(&limited))
        .map(|(p, (f, l))| {
            let t_comm = block_bytes(p.block) / bytes_per_s;
            // Theory: each of the N − 1 transfers exposes max(0, T_comm − T_comp).
            let theory = (ranks - 1) as f64 * (t_comm - p.compute).max(0.0);
            let pass = ranks as f64 * p.compute;
            Row {
                keys: vec![
                    ("ranks", ranks.to_string()),
                    ("block_size", p.block.to_string()),
                ],
                values: vec![
                    ("set_knee_tokens", set_tokens.to_string()),
                    ("link_mb_per_s", format!("{:.1}", bytes_per_s / 1e6)),
                    ("compute_ms_per_step", format!("{:.3}", p.compute * 1e3)),
                    ("comm_ms_per_step", format!("{:.3}", t_comm * 1e3)),
                    ("wait_ms_free_link", format!("{:.3}", f.wait_per_pass * 1e3)),
                    (
                        "wait_ms_limited_link",
                        format!("{:.3}", l.wait_per_pass * 1e3),
                    ),
                    (
                        "exposed_comm_fraction",
                        format!("{:.4}", p.exposed / (p.exposed + pass)),
                    ),
                    (
                        "theory_exposed_fraction",
                        format!("{:.4}", theory / (theory + pass)),
                    ),
                    (
                        "measured_link_mb_per_s",
                        knee.map_or("-".into(), |k| {
                            format!("{:.1}", k.link_bytes_per_s(heads, head_dim) / 1e6)
                        }),
                    ),
                    (
                        "measured_knee_tokens",
                        knee.map_or("-".into(), |k| format!("{:.0}", k.tokens)),
                    ),
                    (
                        "measured_over_set",
                        knee.map_or("-".into(), |k| {
                            format!("{:.3}", k.tokens / set_tokens as f64)
                        }),
                    ),
                ],
            }
        })
        .collect())
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
struct Knee {
    tokens: f64,
    /// Seconds per token of a block on the link, as the ranks saw it.
    seconds_per_token: f64,
}

impl Knee {
    fn link_bytes_per_s(&self, heads: usize, head_dim: usize) -> f64 {
        (2 * heads * head_dim * 4) as f64 / self.seconds_per_token
    }
}

/// The knee from the measurements alone. Below it a rank waits `T_comm − T_comp` per transfer, so
/// on the link-bound block sizes (from the smallest up to the first whose exposed share is within
/// noise, ≤ 5%) `exposed / (N − 1) + T_comp` is the link time of a block: fit it as `β·c` (least
/// squares through the origin), then find where the measured compute time per step `T_comp(c)`
/// overtakes `β·c` (linear interpolation between block sizes).
fn measured_knee(points: &[KneePoint], ranks: usize) -> Option<Knee> {
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
    points.windows(2).find_map(|w| {
        let (g0, g1) = (gap(&w[0]), gap(&w[1]));
        (g0 < 0.0 && g1 >= 0.0).then(|| {
            let (c0, c1) = (w[0].block as f64, w[1].block as f64);
            Knee {
                tokens: c0 + (c1 - c0) * (-g0) / (g1 - g0),
                seconds_per_token: beta,
            }
        })
    })
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
    let qkv = random_qkv(ranks, block, heads, head_dim);
    let config = RingConfig {
        causal: true,
        kernel: Kernel::Fused,
        lockstep: true,
        ..Default::default()
    };
    let job = forward_job(&qkv, ranks, partition, config, None);
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

/// What [`train_steps`] measured.
struct Measured {
    /// Process peak bytes above the start, in the first step (the counting allocator's).
    allocator_peak: usize,
    /// Rank 0's engine ledger peak in the first step (deterministic: shapes only).
    engine_peak: u64,
    /// Seconds of each step after the first.
    times: Vec<f64>,
}

/// Trains `steps` steps on random tokens.
fn train_steps(
    m: &SmallModel,
    ranks: usize,
    seq: usize,
    ffn_chunk: usize,
    kernel: Kernel,
    steps: usize,
) -> Result<Measured> {
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
    let engine_peak = AtomicU64::new(0);
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
                engine_peak.store(log.engine_peak_bytes, Ordering::Relaxed);
            } else {
                times.lock().expect("times").push(log.seconds);
            }
        },
        &AtomicBool::new(false),
    )?;
    Ok(Measured {
        allocator_peak: peak.into_inner(),
        engine_peak: engine_peak.into_inner(),
        times: times.into_inner().expect("times"),
    })
}

/// Per-rank peak bytes of one training step, two ways.
#[derive(Debug, Clone, Copy)]
pub struct PeakPerRank {
    /// The process peak over the rank count (rank threads share the process; ranks are symmetric):
    /// what the machine allocated, which depends on its CPU's kernels and on scheduling.
    pub allocator: f64,
    /// What rank 0's attention engine held at once ([`workbench::ring::ledger`]): shapes only, the same on
    /// every machine; the model's other activations are not in it.
    pub engine: u64,
}

/// Per-rank peak bytes of one training step of `method`.
pub fn peak_per_rank(
    m: &SmallModel,
    method: Method,
    ranks: usize,
    seq: usize,
    block: usize,
) -> Result<PeakPerRank> {
    let (ranks, ffn_chunk, kernel) = match method {
        Method::Vanilla => (1, seq, Kernel::Generic),
        Method::MemoryEfficient => (1, seq, Kernel::Fused),
        Method::Blockwise => (1, block, Kernel::Fused),
        Method::Ring => (ranks, block, Kernel::Fused),
    };
    // The smaller of two runs: a fresh rank thread sometimes allocates once-only buffers (e.g. a
    // matmul packing workspace) inside the measured step.
    let first = train_steps(m, ranks, seq, ffn_chunk, kernel, 1)?;
    let second = train_steps(m, ranks, seq, ffn_chunk, kernel, 1)?;
    Ok(PeakPerRank {
        allocator: first.allocator_peak.min(second.allocator_peak) as f64 / ranks as f64,
        engine: first.engine_peak,
    })
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
        if peak_per_rank(m, method, ranks, seq, block)?.allocator > budget {
            break;
        }
        best = Some(seq);
        seq *= 2;
    }
    Ok(best)
}

/// Training FLOPs of one step ([`workbench::kernels::flops`]): 6 · (non-embedding + head
/// parameters) · tokens for the matmuls, and 12 · d_model · (causal pairs) per layer for attention.
pub fn model_flops(m: &SmallModel, seq: usize) -> f64 {
    let config = llama(m, seq);
    let matmul_params = (config.num_params() - m.vocab * m.d_model) as f64;
    let dense = DENSE_PER_PARAM_TOKEN as f64 * matmul_params * seq as f64;
    let attention =
        (MODEL_PER_PAIR_DIM * visible_pairs(seq, true)) as f64 * m.d_model as f64 * m.layers as f64;
    dense + attention
}

/// MFU of training steps: (model FLOPs / step time) over the square-matmul rate measured beside it.
pub fn mfu_row(m: &SmallModel, ranks: usize, seq: usize, steps: usize) -> Result<Row> {
    let block = seq / ranks;
    let times = train_steps(m, ranks, seq, block.min(1024), Kernel::Fused, steps + 1)?.times;
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
        assert_eq!(measured_knee(&points[5..], 2), None);
    }
}
