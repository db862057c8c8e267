//! Timed ring passes on in-process thread ranks: the forward pass behind the knee, and every tile of a
//! causal pass in lockstep behind the measured balance.

use super::baseline::random;
use super::timing::fastest_after_warm_up;
use anyhow::Result;
use burn::backend::{Autodiff, Flex};
use std::time::Duration;
use workbench::ring::jobs::{AttentionJob, HostTensor, run_attention};
use workbench::trace::{self, Event, Recorder};
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
        ulysses: 1,
        strategy,
        config,
        timeout: TIMEOUT,
        fault: None,
        link,
        doc_lens: &[],
        sinks: None,
    }
}

/// One timed configuration of the knee experiment: the fastest of the repeated passes.
#[derive(Debug, Clone, Copy)]
pub struct RingTiming {
    /// Mean tile compute seconds per rank and step (from the ranks' step events).
    pub compute_per_step: f64,
    /// Mean seconds a rank spent blocked waiting for blocks in the pass.
    pub wait_per_pass: f64,
}

/// The pass the knee times and draws: non-causal, forward only, the fused kernel.
fn knee_pass() -> RingConfig {
    RingConfig {
        causal: false,
        kernel: Kernel::Fused,
        ..Default::default()
    }
}

/// Times a non-causal forward ring pass with `block` tokens per rank.
pub fn time_ring(
    ranks: usize,
    block: usize,
    heads: usize,
    head_dim: usize,
    link: Option<Link>,
    repeats: usize,
) -> Result<RingTiming> {
    let qkv = random_qkv(ranks, block, heads, head_dim);
    let job = forward_job(&qkv, ranks, &strategies::Contiguous, knee_pass(), link);
    // Jitter only ever adds time: keep the repeat whose pass (compute plus waiting) was fastest,
    // its compute and wait together (they trade off against each other within a pass).
    fastest_after_warm_up(
        repeats,
        || {
            let result = run_attention::<Train>(&job, &Default::default())?;
            let steps: Vec<f64> = result
                .events
                .iter()
                .flatten()
                .map(|e| e.compute_seconds)
                .collect();
            let compute = steps.iter().sum::<f64>() / steps.len().max(1) as f64;
            let wait = result.traffic.iter().map(|t| t.wait_seconds).sum::<f64>() / ranks as f64;
            Ok(RingTiming {
                compute_per_step: compute,
                wait_per_pass: wait,
            })
        },
        |t| ranks as f64 * t.compute_per_step + t.wait_per_pass,
    )
}

/// The events of one pass `time_ring` times (after an untraced warm-up pass), recorded into a
/// recorder of its own: the knee figure's timelines. Another ring that runs in this process at the
/// same time records into it too (the recorder is the process's); the caller keeps its ranks.
pub fn trace_ring(
    ranks: usize,
    block: usize,
    heads: usize,
    head_dim: usize,
    link: Option<Link>,
) -> Result<Vec<Event>> {
    let qkv = random_qkv(ranks, block, heads, head_dim);
    let job = forward_job(&qkv, ranks, &strategies::Contiguous, knee_pass(), link);
    run_attention::<Train>(&job, &Default::default())?;
    // A trace the command records (`[measure] trace`) resumes afterwards, without this pass.
    let outer = trace::uninstall();
    let recorder = Recorder::new();
    trace::install(recorder.clone());
    let traced = run_attention::<Train>(&job, &Default::default());
    trace::uninstall();
    if let Some(outer) = outer {
        trace::install(outer);
    }
    traced?;
    Ok(recorder.events())
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
