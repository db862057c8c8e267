//! One attention job on N in-process ranks: shard global arrays, run the ring, gather the results.
//!
//! This is what `ringbench attn` and the exactness test table run.

use crate::config::{RingConfig, RingContext, StepEvent};
use crate::error::RingError;
use crate::ops::{RingBackend, ring_attention};
use crate::transport::{Traffic, TransportError, run_ranks};
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
        <[usize; 4]>::try_from(self.shape.as_slice()).map_err(|_| RingError::Shape {
            what,
            expected: vec![0; 4],
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
fn unshard_batched(layout: &Layout, shards: &[Vec<f32>], batch: usize, row: usize) -> Vec<f32> {
    let mut global = Vec::new();
    for i in 0..batch {
        let pieces: Vec<Vec<f32>> = shards
            .iter()
            .map(|s| {
                let n = s.len() / batch;
                s[i * n..(i + 1) * n].to_vec()
            })
            .collect();
        global.extend(layout.unshard(&pieces, row));
    }
    global
}

/// Picks the error that caused the others: a rank's own failure over its peers' "gone away".
/// `errors` is not empty.
fn root_cause(mut errors: Vec<RingError>) -> RingError {
    let is_echo =
        |e: &RingError| matches!(e, RingError::Transport(TransportError::PeerGone { .. }));
    let first_cause = errors.iter().position(|e| !is_echo(e)).unwrap_or(0);
    errors.swap_remove(first_cause)
}

/// Runs ring attention (and, with `d_out`, its backward) on `job.ranks` threads.
pub fn run_attention<B>(
    job: &AttentionJob,
    device: &B::Device,
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend + RingBackend,
{
    let ([batch, seq, heads, head_dim], kv_heads) = check_job(job)?;
    let layout = Arc::new(job.strategy.layout(seq, job.ranks)?);
    let shards = |t: &HostTensor, h: usize| shard_batched(&layout, &t.data, batch, h * head_dim);
    let (q, k, v) = (
        shards(job.q, heads),
        shards(job.k, kv_heads),
        shards(job.v, kv_heads),
    );
    let d_out = job.d_out.map(|t| shards(t, heads));

    let results = run_ranks(job.ranks, job.timeout, |comm| {
        let rank = comm.rank();
        let ctx = Arc::new(RingContext::new(comm, layout.clone(), job.config)?);
        let local = layout.shard_len(rank);
        // [b, t, h, d] → [b, h, t, d]
        let load = |data: &[f32], h: usize| {
            Tensor::<B, 4>::from_data(
                TensorData::new(data.to_vec(), [batch, local, h, head_dim]),
                device,
            )
            .swap_dims(1, 2)
        };
        let train = d_out.is_some();
        let track = |t: Tensor<B, 4>| if train { t.require_grad() } else { t };
        let q = track(load(&q[rank], heads));
        let k = track(load(&k[rank], kv_heads));
        let v = track(load(&v[rank], kv_heads));
        let (out, lse) = ring_attention(q.clone(), k.clone(), v.clone(), &ctx)?;
        let host = |t: Tensor<B::InnerBackend, 4>| {
            t.swap_dims(1, 2)
                .into_data()
                .into_vec::<f32>()
                .expect("f32 backend")
        };
        let grads = match &d_out {
            None => None,
            Some(d_out) => {
                let loss = (out.clone() * load(&d_out[rank], heads)).sum();
                let grads = loss.backward();
                if let Some(error) = ctx.take_backward_error() {
                    return Err(error);
                }
                let grad = |t: &Tensor<B, 4>| t.grad(&grads).map(host).unwrap_or_default();
                Some([grad(&q), grad(&k), grad(&v)])
            }
        };
        Ok(RankOutput {
            out: host(out.inner()),
            lse: lse
                .inner()
                .swap_dims(1, 2)
                .into_data()
                .into_vec::<f32>()
                .expect("f32 backend"),
            grads,
            traffic: ctx.take_traffic(),
            events: ctx.take_events(),
        })
    });

    let mut outputs = Vec::new();
    let mut errors = Vec::new();
    for result in results {
        match result {
            Ok(o) => outputs.push(o),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(root_cause(errors));
    }

    let gather = |pick: &dyn Fn(&RankOutput) -> &Vec<f32>, row: usize| {
        let shards: Vec<Vec<f32>> = outputs.iter().map(|o| pick(o).clone()).collect();
        unshard_batched(&layout, &shards, batch, row)
    };
    let out = HostTensor::new(
        vec![batch, seq, heads, head_dim],
        gather(&|o| &o.out, heads * head_dim),
    );
    // [b, s, h] → [b, h, s]
    let lse_bsh = gather(&|o| &o.lse, heads);
    let mut lse = vec![0.0; lse_bsh.len()];
    for bi in 0..batch {
        for si in 0..seq {
            for hi in 0..heads {
                lse[(bi * heads + hi) * seq + si] = lse_bsh[(bi * seq + si) * heads + hi];
            }
        }
    }
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
    Ok(AttentionResult {
        out,
        lse: HostTensor::new(vec![batch, heads, seq], lse),
        grads,
        traffic: outputs.iter().map(|o| o.traffic.clone()).collect(),
        events: outputs.into_iter().map(|o| o.events).collect(),
    })
}
