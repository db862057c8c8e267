//! The ring schedule, written once (Liu et al. 2023, §3 and Algorithm 1).
//!
//! [`ring_pass`] moves a cargo of blocks round the ring while each rank computes on the cargo it holds;
//! the send of the next hop is posted before the compute and waited for after it (double buffer).
//! Forward and every backward scheme are one `ring_pass` each with a different cargo.

use crate::block::{Block, Cargo};
use crate::config::{BackwardScheme, Direction, RingContext, StepEvent};
use crate::error::RingError;
use crate::kernels::{
    Visibility, block_attention, block_attention_backward, merge_block, softmax_delta,
};
use crate::transport::{Comm, Phase};
use burn::tensor::{Tensor, backend::Backend};
use std::sync::Arc;
use std::time::Instant;

/// One trip of `cargo` round the ring.
///
/// At step s this rank holds the cargo of rank `direction.owner(rank, s)` and calls
/// `compute(step, owner, cargo)`. When `accumulator` is given, it travels with the cargo: each rank adds
/// the contribution `compute` returns, and after N steps one more hop brings it home, where it is
/// returned. K/V cross N−1 links; an accumulator crosses N.
pub(crate) fn ring_pass(
    comm: &mut Comm,
    phase: Phase,
    direction: Direction,
    cargo: Vec<Arc<Block>>,
    mut accumulator: Option<Vec<Block>>,
    mut compute: impl FnMut(usize, usize, &[Arc<Block>]) -> Result<Option<Vec<Block>>, RingError>,
) -> Result<Option<Vec<Block>>, RingError> {
    let (rank, world) = (comm.rank(), comm.world());
    let (next, prev) = (direction.next(rank, world), direction.prev(rank, world));
    let mut held = cargo;
    let mut incoming_acc = None;
    for step in 0..world {
        let incoming = if step + 1 < world {
            Some(comm.exchange(phase, step, next, prev, held.clone())?)
        } else {
            None
        };
        let contribution = compute(step, direction.owner(rank, step, world), &held)?;
        if let Some(acc) = accumulator.as_mut() {
            if let Some(pending) = incoming_acc.take() {
                *acc = comm
                    .wait(pending)?
                    .into_iter()
                    .map(Arc::unwrap_or_clone)
                    .collect();
            }
            for (a, c) in acc.iter_mut().zip(contribution.iter().flatten()) {
                a.add_assign(c);
            }
            if world > 1 {
                let outgoing = std::mem::take(acc).into_iter().map(Arc::new).collect();
                incoming_acc = Some(comm.exchange(phase, step, next, prev, outgoing)?);
            }
        }
        if let Some(pending) = incoming {
            held = comm.wait(pending)?;
        }
    }
    if let Some(pending) = incoming_acc {
        accumulator = Some(
            comm.wait(pending)?
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect(),
        );
    }
    Ok(accumulator)
}

fn scale_of(ctx: &RingContext, head_dim: usize) -> f32 {
    ctx.config
        .scale
        .unwrap_or_else(|| 1.0 / (head_dim as f32).sqrt())
}

/// Checks q `[b, h, t, d]`, k and v `[b, hk, t, d]` against each other and the layout.
pub(crate) fn check_shapes(
    ctx: &RingContext,
    q: [usize; 4],
    k: [usize; 4],
    v: [usize; 4],
) -> Result<(), RingError> {
    let local = ctx.positions(ctx.rank()).len();
    let [b, h, t, d] = q;
    if t != local {
        return Err(RingError::Shape {
            what: "query shard [batch, heads, local_len, head_dim]",
            expected: vec![b, h, local, d],
            got: q.to_vec(),
        });
    }
    let hk = k[1];
    if hk == 0 || !h.is_multiple_of(hk) {
        return Err(RingError::Heads {
            heads: h,
            kv_heads: hk,
        });
    }
    for (what, got) in [("key shard", k), ("value shard", v)] {
        if got != [b, hk, t, d] {
            return Err(RingError::Shape {
                what,
                expected: vec![b, hk, t, d],
                got: got.to_vec(),
            });
        }
    }
    Ok(())
}

/// Takes the tensor from the cargo unless this rank still holds its own copy.
fn held_tensor<B: Backend, const D: usize>(
    own: &Tensor<B, D>,
    step: usize,
    block: &Block,
) -> Tensor<B, D> {
    if step == 0 {
        own.clone()
    } else {
        block.to_tensor(&own.device())
    }
}

/// Ring forward on one rank: this rank's output `[b, h, t, d]` and log-sum-exp `[b, h, t]`.
pub fn forward<B: Backend>(
    ctx: &RingContext,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Result<(Tensor<B, 4>, Tensor<B, 3>), RingError> {
    check_shapes(ctx, q.dims(), k.dims(), v.dims())?;
    let [b, h, t, d] = q.dims();
    let scale = scale_of(ctx, d);
    let pos_q = ctx.positions(ctx.rank());
    let cargo = vec![
        Arc::new(Block::from_tensor(Cargo::K, k.clone())),
        Arc::new(Block::from_tensor(Cargo::V, v.clone())),
    ];
    let mut acc: Option<(Tensor<B, 4>, Tensor<B, 3>)> = None;
    let mut comm = ctx.comm();
    ring_pass(
        &mut comm,
        Phase::Forward,
        ctx.config.forward,
        cargo,
        None,
        |step, owner, held| {
            let start = Instant::now();
            let pos_k = ctx.positions(owner);
            let visibility = Visibility::of(pos_q, pos_k, ctx.config.causal);
            let pairs = visibility.pairs(t, pos_k.len()) * (b * h) as u64;
            if visibility != Visibility::None {
                let k = held_tensor(&k, step, &held[0]);
                let v = held_tensor(&v, step, &held[1]);
                let tile = block_attention(&q, &k, &v, &visibility, scale);
                acc = Some(match acc.take() {
                    None => tile,
                    Some(prev) => merge_block(prev, tile),
                });
            }
            ctx.record(StepEvent {
                phase: Phase::Forward,
                step,
                peer_block: owner,
                pairs,
                flops: 4 * pairs * d as u64,
                compute_seconds: start.elapsed().as_secs_f64(),
            });
            Ok(None)
        },
    )?;
    // Every query sees at least its own key under a causal mask, so some tile was computed.
    Ok(acc.unwrap_or_else(|| {
        let device = q.device();
        (
            Tensor::zeros([b, h, t, d], &device),
            Tensor::full([b, h, t], f32::NEG_INFINITY, &device),
        )
    }))
}

/// Everything the backward needs from the forward, on one rank.
pub struct Saved<B: Backend> {
    pub q: Tensor<B, 4>,
    pub k: Tensor<B, 4>,
    pub v: Tensor<B, 4>,
    pub out: Tensor<B, 4>,
    pub lse: Tensor<B, 3>,
}

/// `(dq, dk, dv)`, shaped like `(q, k, v)`.
pub type QkvGrads<B> = (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>);

/// Ring backward on one rank: `(dq, dk, dv)` for this rank's shards, by the configured scheme.
pub fn backward<B: Backend>(
    ctx: &RingContext,
    saved: &Saved<B>,
    d_out: Tensor<B, 4>,
) -> Result<QkvGrads<B>, RingError> {
    let Saved { q, k, v, out, lse } = saved;
    let [b, h, t, d] = q.dims();
    let scale = scale_of(ctx, d);
    let delta = softmax_delta(&d_out, out);
    let rank = ctx.rank();
    let causal = ctx.config.causal;
    let device = q.device();
    let mut comm = ctx.comm();
    let timed = |step: usize, owner: usize, pairs: u64, start: Instant| {
        ctx.record(StepEvent {
            phase: Phase::Backward,
            step,
            peer_block: owner,
            pairs,
            flops: 10 * pairs * d as u64,
            compute_seconds: start.elapsed().as_secs_f64(),
        })
    };
    match ctx.config.backward {
        BackwardScheme::Kv | BackwardScheme::KvReverse => {
            let direction = match ctx.config.backward {
                BackwardScheme::Kv => ctx.config.forward,
                _ => ctx.config.forward.reversed(),
            };
            let kv_shape = k.dims().to_vec();
            let cargo = vec![
                Arc::new(Block::from_tensor(Cargo::K, k.clone())),
                Arc::new(Block::from_tensor(Cargo::V, v.clone())),
            ];
            let acc = vec![
                Block::zeros(Cargo::DK, kv_shape.clone()),
                Block::zeros(Cargo::DV, kv_shape),
            ];
            let mut dq = Tensor::<B, 4>::zeros([b, h, t, d], &device);
            let pos_q = ctx.positions(rank);
            let home = ring_pass(
                &mut comm,
                Phase::Backward,
                direction,
                cargo,
                Some(acc),
                |step, owner, held| {
                    let start = Instant::now();
                    let pos_k = ctx.positions(owner);
                    let visibility = Visibility::of(pos_q, pos_k, causal);
                    let pairs = visibility.pairs(t, pos_k.len()) * (b * h) as u64;
                    let result = (visibility != Visibility::None).then(|| {
                        let k = held_tensor(k, step, &held[0]);
                        let v = held_tensor(v, step, &held[1]);
                        let (dq_t, dk_t, dv_t) = block_attention_backward(
                            q,
                            &k,
                            &v,
                            &d_out,
                            lse,
                            &delta,
                            &visibility,
                            scale,
                        );
                        dq = dq.clone() + dq_t;
                        vec![
                            Block::from_tensor(Cargo::DK, dk_t),
                            Block::from_tensor(Cargo::DV, dv_t),
                        ]
                    });
                    timed(step, owner, pairs, start);
                    Ok(result)
                },
            )?
            .expect("ring_pass returns the accumulator it was given");
            Ok((dq, home[0].to_tensor(&device), home[1].to_tensor(&device)))
        }
        BackwardScheme::Q => {
            let cargo = vec![
                Arc::new(Block::from_tensor(Cargo::Q, q.clone())),
                Arc::new(Block::from_tensor(Cargo::DOut, d_out.clone())),
                Arc::new(Block::from_tensor(Cargo::Lse, lse.clone())),
                Arc::new(Block::from_tensor(Cargo::Delta, delta.clone())),
            ];
            let acc = vec![Block::zeros(Cargo::DQ, vec![b, h, t, d])];
            let mut dk = Tensor::<B, 4>::zeros(k.dims(), &device);
            let mut dv = Tensor::<B, 4>::zeros(v.dims(), &device);
            let pos_k = ctx.positions(rank);
            let home = ring_pass(
                &mut comm,
                Phase::Backward,
                ctx.config.forward,
                cargo,
                Some(acc),
                |step, owner, held| {
                    let start = Instant::now();
                    let pos_q = ctx.positions(owner);
                    let visibility = Visibility::of(pos_q, pos_k, causal);
                    let pairs = visibility.pairs(pos_q.len(), t) * (b * h) as u64;
                    let result = (visibility != Visibility::None).then(|| {
                        let q = held_tensor(q, step, &held[0]);
                        let d_out = held_tensor(&d_out, step, &held[1]);
                        let lse = held_tensor(lse, step, &held[2]);
                        let delta = held_tensor(&delta, step, &held[3]);
                        let (dq_t, dk_t, dv_t) = block_attention_backward(
                            &q,
                            k,
                            v,
                            &d_out,
                            &lse,
                            &delta,
                            &visibility,
                            scale,
                        );
                        dk = dk.clone() + dk_t;
                        dv = dv.clone() + dv_t;
                        vec![Block::from_tensor(Cargo::DQ, dq_t)]
                    });
                    timed(step, owner, pairs, start);
                    Ok(result)
                },
            )?
            .expect("ring_pass returns the accumulator it was given");
            Ok((home[0].to_tensor(&device), dk, dv))
        }
    }
}
