//! One attention job on N in-process ranks: shard global arrays, run the ring, gather the results.
//!
//! This is what `ringbench attn` and the exactness test table run.

use crate::config::{RingConfig, RingContext, StepEvent};
use crate::error::{RingError, root_cause};
use crate::ops::{RingBackend, ring_attention};
use crate::transport::{Comm, Link, Traffic, run_ranks_with};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use std::sync::Arc;
use std::time::Duration;
use strategies::{Layout, Partition};

/// A dense f32 array in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }

    fn dims4(&self, what: &'static str) -> Result<[usize; 4], RingError> {
        <[usize; 4]>::try_from(self.shape.as_slice()).map_err(|_| RingError::Rank {
            what,
            got: self.shape.clone(),
        })
    }
}

/// Inputs in the (batch, seq, heads, head_dim) layout NumPy and PyTorch users have.
#[derive(Debug, Clone)]
pub struct AttentionJob<'a> {
    pub q: &'a HostTensor,
    pub k: &'a HostTensor,
    pub v: &'a HostTensor,
    pub d_out: Option<&'a HostTensor>,
    pub ranks: usize,
    pub strategy: &'a dyn Partition,
    pub config: RingConfig,
    pub timeout: Duration,
    /// Fault injection for tests: `(rank, step)` fails that rank at its `step`-th ring exchange.
    pub fault: Option<(usize, usize)>,
    /// Rate-limits the in-process links (overlap experiments); `None`: channels at memory speed.
    pub link: Option<Link>,
}

/// Gradients with respect to q, k, v, in the inputs' layout.
#[derive(Debug, Clone)]
pub struct Grads {
    pub dq: HostTensor,
    pub dk: HostTensor,
    pub dv: HostTensor,
}

#[derive(Debug, Clone)]
pub struct AttentionResult {
    /// `[b, s, h, d]`.
    pub out: HostTensor,
    /// `[b, h, s]`, natural log.
    pub lse: HostTensor,
    pub grads: Option<Grads>,
    /// Per rank.
    pub traffic: Vec<Traffic>,
    /// Per rank.
    pub events: Vec<Vec<StepEvent>>,
}

struct RankOutput {
    out: Vec<f32>,
    lse: Vec<f32>,
    grads: Option<[Vec<f32>; 3]>,
    traffic: Traffic,
    events: Vec<StepEvent>,
}

fn check_job(job: &AttentionJob) -> Result<([usize; 4], usize), RingError> {
    let [b, s, h, d] = job.q.dims4("q [batch, seq, heads, head_dim]")?;
    let [_, _, hk, _] = job.k.dims4("k [batch, seq, kv_heads, head_dim]")?;
    if hk == 0 || !h.is_multiple_of(hk) {
        return Err(RingError::Heads {
            heads: h,
            kv_heads: hk,
        });
    }
    for (what, t, expected) in [
        ("k [batch, seq, kv_heads, head_dim]", job.k, [b, s, hk, d]),
        ("v [batch, seq, kv_heads, head_dim]", job.v, [b, s, hk, d]),
    ]
    .into_iter()
    .chain(
        job.d_out
            .map(|t| ("dO [batch, seq, heads, head_dim]", t, [b, s, h, d])),
    ) {
        if t.shape != expected {
            return Err(RingError::Shape {
                what,
                expected: expected.to_vec(),
                got: t.shape.clone(),
            });
        }
    }
    Ok(([b, s, h, d], hk))
}

/// Splits `[b, s, row]` into per-rank `[b, t, row]` by the layout.
fn shard_batched(layout: &Layout, data: &[f32], batch: usize, row: usize) -> Vec<Vec<f32>> {
    let per_batch = data.len() / batch;
    let mut shards = vec![Vec::new(); layout.ranks()];
    for chunk in data.chunks(per_batch) {
        for (shard, piece) in shards.iter_mut().zip(layout.shard(chunk, row)) {
            shard.extend(piece);
        }
    }
    shards
}

/// Inverse of [`shard_batched`].
fn unshard_batched(layout: &Layout, shards: &[&[f32]], batch: usize, row: usize) -> Vec<f32> {
    let mut global = Vec::with_capacity(shards.iter().map(|s| s.len()).sum());
    for i in 0..batch {
        let pieces: Vec<&[f32]> = shards
            .iter()
            .map(|s| {
                let n = s.len() / batch;
                &s[i * n..(i + 1) * n]
            })
            .collect();
        global.extend(layout.unshard(&pieces, row));
    }
    global
}

/// The job's inputs split by the layout: per rank `[b, t, h, d]` shards.
struct Shards {
    layout: Arc<Layout>,
    dims: [usize; 4],
    kv_heads: usize,
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    d_out: Option<Vec<Vec<f32>>>,
}

fn shard_job(job: &AttentionJob) -> Result<Shards, RingError> {
    let (dims, kv_heads) = check_job(job)?;
    let [batch, seq, heads, head_dim] = dims;
    let layout = Arc::new(job.strategy.layout(seq, job.ranks)?);
    let shards = |t: &HostTensor, h: usize| shard_batched(&layout, &t.data, batch, h * head_dim);
    Ok(Shards {
        q: shards(job.q, heads),
        k: shards(job.k, kv_heads),
        v: shards(job.v, kv_heads),
        d_out: job.d_out.map(|t| shards(t, heads)),
        layout,
        dims,
        kv_heads,
    })
}

/// Row-major `[a, x, y, d]` → `[a, y, x, d]`.
fn swap_middle(data: &[f32], [a, x, y, d]: [usize; 4]) -> Vec<f32> {
    debug_assert_eq!(data.len(), a * x * y * d);
    let mut out = Vec::with_capacity(data.len());
    for i in 0..a {
        for j in 0..y {
            for k in 0..x {
                let at = ((i * x + k) * y + j) * d;
                out.extend_from_slice(&data[at..at + d]);
            }
        }
    }
    out
}

/// One rank's part of the job: forward, and with dO the backward, on this rank's shards.
fn attend_rank<B>(
    mut comm: Comm,
    job: &AttentionJob,
    s: &Shards,
    device: &B::Device,
) -> Result<(RankOutput, Arc<RingContext>), RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    let [batch, _, heads, head_dim] = s.dims;
    let rank = comm.rank();
    if let Some((failing, step)) = job.fault
        && failing == rank
    {
        comm.inject_fault(step);
    }
    let ctx = Arc::new(RingContext::new(comm, s.layout.clone(), job.config)?);
    let local = s.layout.shard_len(rank);
    // [b, t, h, d] → [b, h, t, d], permuted here: a strided Burn view would be made contiguous
    // element by element inside the engine.
    let load = |data: &[f32], h: usize| {
        Tensor::<B, 4>::from_data(
            TensorData::new(
                swap_middle(data, [batch, local, h, head_dim]),
                [batch, h, local, head_dim],
            ),
            device,
        )
    };
    let train = s.d_out.is_some();
    let track = |t: Tensor<B, 4>| if train { t.require_grad() } else { t };
    let q = track(load(&s.q[rank], heads));
    let k = track(load(&s.k[rank], s.kv_heads));
    let v = track(load(&s.v[rank], s.kv_heads));
    let (out, lse) = ring_attention(q.clone(), k.clone(), v.clone(), &ctx)?;
    // [b, h, t, d] → [b, t, h, d] on the host
    let host = |t: Tensor<B::InnerBackend, 4>| {
        let dims = t.dims();
        swap_middle(&B::InnerBackend::to_host(t), dims)
    };
    let grads = match &s.d_out {
        None => None,
        Some(d_out) => {
            let loss = (out.clone() * load(&d_out[rank], heads)).sum();
            let mut grads = loss.backward();
            if let Some(error) = ctx.take_backward_error() {
                return Err(error);
            }
            let mut grad =
                |t: &Tensor<B, 4>| t.grad_remove(&mut grads).map(host).unwrap_or_default();
            Some([grad(&q), grad(&k), grad(&v)])
        }
    };
    let output = RankOutput {
        out: host(out.inner()),
        lse: host(lse.inner().unsqueeze_dim(3)),
        grads,
        traffic: ctx.take_traffic(),
        events: ctx.take_events(),
    };
    Ok((output, ctx))
}

/// Runs ring attention (and, with `d_out`, its backward) on `job.ranks` threads.
pub fn run_attention<B>(
    job: &AttentionJob,
    device: &B::Device,
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    let shards = shard_job(job)?;
    let results = run_ranks_with(job.ranks, job.timeout, job.link, |comm| {
        attend_rank::<B>(comm, job, &shards, device).map(|(output, _)| output)
    });
    let mut outputs = Vec::new();
    let mut errors = Vec::new();
    for result in results {
        match result {
            Ok(o) => outputs.push(o),
            Err(e) => errors.push(e),
        }
    }
    if let Some(cause) = root_cause(errors, RingError::echo_level) {
        return Err(cause);
    }
    Ok(assemble(job, &shards, outputs))
}

/// Runs this process's rank of the job over `comm` (one process per rank, e.g. under `mpirun`), then
/// gathers every rank's results so that each process returns the whole job's outputs. Traffic and
/// events are this rank's only; the other ranks' entries are empty.
pub fn run_attention_on<B>(
    comm: Comm,
    job: &AttentionJob,
    device: &B::Device,
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    if comm.world() != job.ranks {
        return Err(RingError::WorldMismatch {
            world: comm.world(),
            layout: job.ranks,
        });
    }
    let shards = shard_job(job)?;
    let rank = comm.rank();
    let (mine, ctx) = attend_rank::<B>(comm, job, &shards, device)?;
    // Every output is gathered by a sum over rank-indexed slots (adding zeros is exact).
    let gather = |part: &[f32]| -> Result<Vec<Vec<f32>>, RingError> {
        let n = part.len();
        let mut slots = vec![0.0f32; n * job.ranks];
        slots[rank * n..(rank + 1) * n].copy_from_slice(part);
        ctx.with_comm(|c| c.all_reduce_sum(&mut slots))?;
        Ok(slots.chunks(n.max(1)).map(<[f32]>::to_vec).collect())
    };
    let outs = gather(&mine.out)?;
    let lses = gather(&mine.lse)?;
    let grads: Option<Vec<[Vec<f32>; 3]>> = match &mine.grads {
        None => None,
        Some([dq, dk, dv]) => {
            let (dq, dk, dv) = (gather(dq)?, gather(dk)?, gather(dv)?);
            Some(
                (0..job.ranks)
                    .map(|r| [dq[r].clone(), dk[r].clone(), dv[r].clone()])
                    .collect(),
            )
        }
    };
    let outputs = (0..job.ranks)
        .map(|r| RankOutput {
            out: outs[r].clone(),
            lse: lses[r].clone(),
            grads: grads.as_ref().map(|g| g[r].clone()),
            traffic: if r == rank {
                mine.traffic.clone()
            } else {
                Traffic::default()
            },
            events: if r == rank {
                mine.events.clone()
            } else {
                Vec::new()
            },
        })
        .collect();
    Ok(assemble(job, &shards, outputs))
}

/// Puts the ranks' outputs back into the job's layout.
fn assemble(job: &AttentionJob, shards: &Shards, outputs: Vec<RankOutput>) -> AttentionResult {
    let [batch, seq, heads, head_dim] = shards.dims;
    let kv_heads = shards.kv_heads;
    let layout = &shards.layout;
    let gather = |pick: &dyn Fn(&RankOutput) -> &Vec<f32>, row: usize| {
        let shards: Vec<&[f32]> = outputs.iter().map(|o| pick(o).as_slice()).collect();
        unshard_batched(layout, &shards, batch, row)
    };
    let out = HostTensor::new(
        vec![batch, seq, heads, head_dim],
        gather(&|o| &o.out, heads * head_dim),
    );
    // [b, s, h] → [b, h, s]
    let lse = swap_middle(&gather(&|o| &o.lse, heads), [batch, seq, heads, 1]);
    let grads = job.d_out.map(|_| {
        let g = |i: usize, h: usize| {
            let data = gather(
                &|o| &o.grads.as_ref().expect("backward ran on every rank")[i],
                h * head_dim,
            );
            HostTensor::new(vec![batch, seq, h, head_dim], data)
        };
        Grads {
            dq: g(0, heads),
            dk: g(1, kv_heads),
            dv: g(2, kv_heads),
        }
    });
    AttentionResult {
        out,
        lse: HostTensor::new(vec![batch, heads, seq], lse),
        grads,
        traffic: outputs.iter().map(|o| o.traffic.clone()).collect(),
        events: outputs.into_iter().map(|o| o.events).collect(),
    }
}
