//! The ring schedule, written once (Liu et al. 2023, §3 and Algorithm 1).
//!
//! [`ring_pass`] moves a cargo of blocks round the ring while each rank computes on the cargo it holds;
//! the send of the next hop is posted before the compute and waited for after it (double buffer).
//! Forward and every backward scheme are one `ring_pass` each with a different cargo.

use crate::block::{Block, BlockKind};
use crate::dtype::{Dtype, Precision};
use crate::error::RingError;
use crate::host::{self, HostRead};
use crate::kernels::flops::{BACKWARD_PER_PAIR_DIM, FORWARD_PER_PAIR_DIM};
use crate::kernels::mask::{Visibility, Window};
use crate::kernels::{
    BackwardTile, ForwardTile, Keys, Queries, Scores, TileDims, TileKernel, Travelling, WithKernel,
    with_kernel,
};
use crate::ring::context::{Attend, BackwardScheme, Direction, RingContext, StepEvent, Windows};
use crate::ring::ledger::{Charge, Ledger};
use crate::transport::{GroupComm, Phase};
use burn::tensor::{DType, FloatDType, Tensor, backend::Backend};
use std::sync::Arc;
use std::time::Instant;

/// One trip of `cargo` round the ring, `steps` steps long (1 ≤ steps ≤ N: a pass stops once no rank
/// can see the blocks further along, [`steps_needed`]).
///
/// At step s this rank holds the cargo of rank `direction.owner(rank, s)` and calls
/// `compute(step, owner, cargo)`; the cargo crosses `steps − 1` links. When `accumulator` is given, it
/// travels with the cargo: each rank adds the contribution `compute` returns, and after the last step
/// it goes straight home, to the rank whose cargo this rank holds (one more hop when the pass is
/// whole, none when it is one step long), where it is returned.
///
/// `ledger` is charged for the second buffer of each exchange from its post to the end of the step
/// (the received cargo or accumulator it becomes is charged while held), and for the accumulator.
/// The bytes each step moves between host and `device` are recorded in the traffic.
// The pass's eight inputs are each used once below; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ring_pass<B: HostRead>(
    device: &B::Device,
    comm: &mut GroupComm<'_>,
    ledger: &Arc<Ledger>,
    phase: Phase,
    (direction, steps): (Direction, usize),
    cargo: Vec<Arc<Block>>,
    mut accumulator: Option<Vec<Block>>,
    mut compute: impl FnMut(usize, usize, &[Arc<Block>]) -> Result<Option<Vec<Block>>, RingError>,
) -> Result<Option<Vec<Block>>, RingError> {
    let (rank, world) = (comm.rank(), comm.world());
    let (next, prev) = (direction.next(rank, world), direction.prev(rank, world));
    let bytes = |blocks: &[Arc<Block>]| blocks.iter().map(|b| b.bytes()).sum::<u64>();
    let acc_bytes = accumulator
        .as_ref()
        .map_or(0, |acc| acc.iter().map(Block::bytes).sum());
    let _accumulator_charge = ledger.charge(acc_bytes);
    let mut held = cargo;
    // The caller charged the cargo it gave; a received cargo is charged here while held.
    let mut _held_charge: Option<Charge> = None;
    let mut incoming_acc = None;
    for step in 0..steps {
        let last = step + 1 == steps;
        let moved_before = host::moved_bytes();
        let incoming = if !last {
            settle::<B>(device, &held);
            let arriving = ledger.charge(bytes(&held));
            Some((
                comm.exchange(phase, step, next, prev, held.clone())?,
                arriving,
            ))
        } else {
            None
        };
        let contribution = compute(step, direction.owner(rank, step, world), &held)?;
        // The step's reads of the held blocks finish before any of them is replaced and dropped.
        settle::<B>(device, &held);
        if let Some(acc) = accumulator.as_mut() {
            // The received accumulator stays alive until the sums that read it have run.
            let mut received = Vec::new();
            if let Some((pending, _arriving)) = incoming_acc.take() {
                received = comm.wait(pending)?;
                *acc = received.iter().map(|b| Block::clone(b)).collect();
            }
            for (a, c) in acc.iter_mut().zip(contribution.iter().flatten()) {
                a.add_assign::<B>(c, device);
            }
            // On along the ring, or, after the last step, home: to the owner of the cargo held now,
            // from the rank holding this rank's (the ring's next and previous when the pass is whole).
            let (to, from) = if last {
                let home = direction.owner(rank, step, world);
                (home, direction.owner(rank, world - step, world))
            } else {
                (next, prev)
            };
            if to != rank {
                let outgoing: Vec<Arc<Block>> =
                    std::mem::take(acc).into_iter().map(Arc::new).collect();
                settle::<B>(device, &outgoing);
                let arriving = ledger.charge(acc_bytes);
                incoming_acc = Some((comm.exchange(phase, step, to, from, outgoing)?, arriving));
            }
            drop(received);
        }
        if let Some((pending, arriving)) = incoming {
            held = comm.wait(pending)?;
            _held_charge = Some(arriving);
        }
        comm.record_host_device(phase, step, host::moved_bytes() - moved_before);
    }
    if let Some((pending, _arriving)) = incoming_acc {
        // The accumulator comes home in a peer's device memory. Used as it is, it would be dropped
        // later, while kernels this thread queued may still read it, and return to the peer's pool
        // to be written again: seen on wgpu as a wrong dQ (q scheme) or dK/dV (kv) in one gradient
        // of two to five. So it is copied into this rank's memory, and the copy has run before the
        // peer's buffer is dropped.
        let received = comm.wait(pending)?;
        accumulator = Some(if received.iter().any(|b| b.is_on_device()) {
            let home = received.iter().map(|b| b.local_copy::<B>(device)).collect();
            settle::<B>(device, &received);
            home
        } else {
            received.into_iter().map(Arc::unwrap_or_clone).collect()
        });
    }
    Ok(accumulator)
}

/// Executes this thread's queued work on `device` when `blocks` are device tensors: before they leave
/// for another rank's thread, and before a received block this thread read is dropped. A device
/// backend queues operations per thread (CubeCL's streams); without this, a tensor could be handed
/// over before its producing kernels ran, or its buffer reused while a kernel still reads it (seen on
/// wgpu as wrong dK in one run of several). Host blocks need nothing.
fn settle<B: HostRead>(device: &B::Device, blocks: &[Arc<Block>]) {
    if blocks.iter().any(|b| b.is_on_device()) {
        B::sync(device).expect("the rank's device executes its queued operations");
    }
}

/// The process-wide turn of [`RingConfig::lockstep`](crate::RingConfig::lockstep) tile computation.
fn lockstep_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a rank spreads a tile's (batch, kv head) units over the cores: yes when it has them to
/// itself (one rank, or lockstep turns), no when rank threads already fill the cores.
fn parallel_units(ctx: &RingContext) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    ctx.config.lockstep || ctx.world() < cores
}

/// `tensor` with its values rounded to `dtype` (an f32 tensor of bf16 values): by a cast there and
/// back where the backend computes in bf16, else through the host (counted).
pub(crate) fn rounded<B: HostRead, const D: usize>(
    tensor: Tensor<B, D>,
    dtype: Dtype,
) -> Tensor<B, D> {
    match dtype {
        Dtype::F32 => tensor,
        Dtype::Bf16 if B::supports_dtype(&tensor.device(), DType::BF16) => {
            tensor.cast(FloatDType::BF16).cast(FloatDType::F32)
        }
        Dtype::Bf16 => {
            let (shape, device) = (tensor.dims(), tensor.device());
            let mut values = host::read(tensor);
            dtype.round(&mut values);
            host::place(values, shape, &device)
        }
    }
}

/// Whether the blocks a kernel keeps on `device` can be kept in `precision`'s types: host blocks
/// always can; device blocks need a backend that stores and computes bf16.
fn check_precision<B: HostRead>(
    precision: Precision,
    on_device: bool,
    device: &B::Device,
) -> Result<(), RingError> {
    if precision.uses_bf16() && on_device && !B::supports_dtype(device, DType::BF16) {
        return Err(RingError::DtypeUnsupported {
            dtype: Dtype::Bf16.name(),
            backend: B::name(device),
        });
    }
    Ok(())
}

/// How `attend` makes scores for heads of `head_dim`: its scale (1/sqrt(head_dim) by default) and
/// cap, in the ring's `precision`.
fn scores_of(attend: Attend, head_dim: usize, precision: Precision) -> Scores {
    Scores {
        scale: attend
            .scale
            .unwrap_or_else(|| 1.0 / (head_dim as f32).sqrt()),
        softcap: attend.softcap,
        precision,
    }
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

/// The kernel's preparation of every rank's shard (its queries' windows, its keys' positions), once
/// per pass; tiles name them by rank.
fn shards<B: HostRead, K: TileKernel<B>>(
    kernel: &K,
    ctx: &RingContext,
    windows: &Windows,
    device: &B::Device,
) -> Result<Vec<K::Shard>, RingError> {
    (0..ctx.world())
        .map(|r| kernel.shard(&windows[r], ctx.positions(r), device))
        .collect()
}

/// How many steps a pass in `direction` needs: one past the last step at which some rank's tile is
/// visible (its queries' `windows` against the keys it holds then, or, when the queries travel, the
/// held queries against its keys). Every rank computes the same from the layout (`positions`, one
/// list a rank), so every rank stops at the same step; a sliding window or short packed documents
/// stop the ring early.
pub(crate) fn steps_needed(
    positions: &[Vec<usize>],
    windows: &[Vec<Window>],
    direction: Direction,
    travelling: Travelling,
) -> usize {
    let world = positions.len();
    let sees = |step: usize| {
        (0..world).any(|rank| {
            let owner = direction.owner(rank, step, world);
            let (q_rank, k_rank) = match travelling {
                Travelling::Queries => (owner, rank),
                Travelling::Keys => (rank, owner),
            };
            Visibility::of(&windows[q_rank], &positions[k_rank]) != Visibility::None
        })
    };
    (0..world)
        .rev()
        .find(|&s| sees(s))
        .map_or(1, |last| last + 1)
}

/// The exchanges one rank makes in a [`ring_pass`] of `steps` steps: the cargo's `steps − 1` hops
/// and, with a travelling accumulator, its hop after every step but the last and its hop home
/// after the last (none when the pass is one step: it never left).
pub(crate) fn pass_exchanges(steps: usize, accumulator: bool) -> usize {
    let hops = steps.saturating_sub(1);
    if accumulator && steps > 1 {
        2 * hops + 1
    } else {
        hops
    }
}

/// Which way the backward pass goes under `scheme` after a forward in `forward`, and what travels.
pub(crate) fn backward_route(
    scheme: BackwardScheme,
    forward: Direction,
) -> (Direction, Travelling) {
    match scheme {
        BackwardScheme::Kv => (forward, Travelling::Keys),
        BackwardScheme::KvReverse => (forward.reversed(), Travelling::Keys),
        BackwardScheme::Q => (forward, Travelling::Queries),
    }
}

/// Ring forward on one rank: this rank's output `[b, h, t, d]`, log-sum-exp `[b, h, t]`, and what
/// the backward needs, masked and scored as `attend` says, each row's softmax also holding its
/// head's sink logit when `sinks` (`[h]`) are given. The configured kernel computes the tiles.
pub fn forward<B: HostRead>(
    ctx: &RingContext,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    sinks: Option<Tensor<B, 1>>,
    attend: Attend,
) -> Result<(Tensor<B, 4>, Tensor<B, 3>, Saved), RingError> {
    check_shapes(ctx, q.dims(), k.dims(), v.dims())?;
    attend.check()?;
    if let Some(s) = &sinks
        && s.dims()[0] != q.dims()[1]
    {
        return Err(RingError::Shape {
            what: "sinks [heads]",
            expected: vec![q.dims()[1]],
            got: s.dims().to_vec(),
        });
    }
    with_kernel(
        ctx.config.kernel,
        Forward {
            ctx,
            q,
            k,
            v,
            sinks,
            attend,
        },
    )
}

struct Forward<'a, B: Backend> {
    ctx: &'a RingContext,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    sinks: Option<Tensor<B, 1>>,
    attend: Attend,
}

impl<B: HostRead> WithKernel<B> for Forward<'_, B> {
    type Output = Result<(Tensor<B, 4>, Tensor<B, 3>, Saved), RingError>;

    fn run<K: TileKernel<B>>(self, kernel: &K) -> Self::Output {
        let Forward {
            ctx,
            q,
            k,
            v,
            sinks,
            attend,
        } = self;
        let [b, h, t, d] = q.dims();
        let kv_heads = k.dims()[1];
        let precision = ctx.config.precision;
        let how = scores_of(attend, d, precision);
        let device = q.device();
        // A kernel that does not run on this backend says so before anything moves.
        kernel.implementation(&device, precision)?;
        let rank = ctx.rank();
        let windows = ctx.windows(attend.mask());
        let shards = shards(kernel, ctx, &windows, &device)?;
        let q_block = kernel.operand(BlockKind::Q, q);
        check_precision::<B>(precision, q_block.is_on_device(), &device)?;
        // The operands are rounded once, on entry, and kept (and sent) in their type.
        let operand = |block: Block| Arc::new(block.in_dtype::<B>(precision.dtype, &device));
        let q_block = operand(q_block);
        let win_q = &windows[rank];
        let queries = Queries {
            windows: win_q,
            prepared: &shards[rank],
        };
        let mut state = kernel.forward_start(&q_block, kv_heads, queries, how, parallel_units(ctx));
        let steps = steps_needed(
            &ctx.layout.positions,
            &windows,
            ctx.config.forward,
            Travelling::Keys,
        );
        let (k, v) = (
            operand(kernel.operand(BlockKind::K, k)),
            operand(kernel.operand(BlockKind::V, v)),
        );
        let ledger = ctx.ledger();
        let rows = (b * h * t * std::mem::size_of::<f32>()) as u64;
        // What the backward keeps (q, k, v, lse), and the forward's accumulators (out, row max, row sum).
        let saved_charge = ledger.charge(q_block.bytes() + k.bytes() + v.bytes() + rows);
        let _accumulators = ledger.charge(rows * d as u64 + 2 * rows);
        let cargo = vec![k.clone(), v.clone()];
        let mut world = ctx.comm();
        let mut comm = world.in_group(ctx.group());
        ring_pass::<B>(
            &device,
            &mut comm,
            ledger,
            Phase::Forward,
            (ctx.config.forward, steps),
            cargo,
            None,
            |step, owner, held| {
                let _turn = ctx.config.lockstep.then(lockstep_turn);
                let start = Instant::now();
                let pos_k = ctx.positions(owner);
                let visibility = Visibility::of(win_q, pos_k);
                if visibility != Visibility::None {
                    let dims = TileDims {
                        batch: b,
                        heads: h,
                        kv_heads,
                        tq: t,
                        tk: pos_k.len(),
                        head_dim: d,
                    };
                    let _workspace = ledger.charge(kernel.workspace_bytes(&dims, false));
                    let poisoned = ctx.poisons(step).then(|| held[1].poisoned::<B>(&device));
                    let tile = ForwardTile {
                        k: &held[0],
                        v: poisoned.as_ref().unwrap_or(&held[1]),
                        keys: Keys {
                            positions: pos_k,
                            prepared: &shards[owner],
                        },
                        visibility,
                    };
                    kernel.forward_tile(&mut state, tile);
                }
                ctx.record(
                    StepEvent {
                        phase: Phase::Forward,
                        step,
                        peer_block: owner,
                        pairs: visibility.pairs(t, pos_k.len()) * (b * h) as u64,
                        flops: FORWARD_PER_PAIR_DIM
                            * visibility.pairs(t, pos_k.len())
                            * (b * h * d) as u64,
                        compute_seconds: start.elapsed().as_secs_f64(),
                    },
                    (start, visibility.name()),
                );
                Ok(None)
            },
        )?;
        let sinks = sinks.map(|s| Arc::new(kernel.operand(BlockKind::Sinks, s)));
        let finishing = Instant::now();
        let (out, lse) = kernel.forward_finish(state, sinks.as_deref(), &device);
        // The merged partials normalized: the forward's last merge.
        ctx.traced("merge finish", finishing);
        // The output in the operands' type, as a bf16 kernel writes it; lse stays f32.
        let out = rounded(out, precision.dtype);
        let saved = Saved {
            q: q_block,
            k,
            v,
            lse: Arc::new(kernel.operand(BlockKind::Lse, lse.clone())),
            sinks,
            attend,
            _charge: Arc::new(saved_charge),
        };
        Ok((out, lse, saved))
    }
}

/// What the backward needs from the forward, on one rank: the forward's own blocks of q, k, v
/// `[b, h|hk, t, d]` and of the log-sum-exp `[b, h, t]`, where the kernel reads them (host blocks
/// for the fused kernel, device tensors for the generic one). The output is the caller's to keep.
#[derive(Debug, Clone)]
pub struct Saved {
    pub(crate) q: Arc<Block>,
    pub(crate) k: Arc<Block>,
    pub(crate) v: Arc<Block>,
    pub(crate) lse: Arc<Block>,
    /// The sink logits `[h]` the forward's rows held, if any.
    pub(crate) sinks: Option<Arc<Block>>,
    /// How the forward masked and scored: the backward does the same.
    pub(crate) attend: Attend,
    /// These blocks' bytes on the rank's ledger, held (never read) until the last copy is dropped.
    _charge: Arc<Charge>,
}

/// The gradients of one rank's ring attention inputs.
#[derive(Debug)]
pub struct RingGrads<B: Backend> {
    /// Shaped like q.
    pub dq: Tensor<B, 4>,
    /// Shaped like k.
    pub dk: Tensor<B, 4>,
    /// Shaped like v.
    pub dv: Tensor<B, 4>,
    /// With sinks, `[h]`: this rank's rows' part (the sinks are shared by every rank's rows, so
    /// their gradient is the sum of every rank's part).
    pub dsinks: Option<Tensor<B, 1>>,
}

/// Ring backward on one rank: `(dq, dk, dv)` for this rank's shards, by the configured scheme.
///
/// `kv`/`kv-reverse`: K and V travel with the dK/dV accumulator, dQ accumulates here. `q`: Q, dO, lse
/// and delta travel with the dQ accumulator, dK/dV accumulate here. Either way every (query block,
/// key block) pair meets exactly once. Every block and accumulator lies where the kernel keeps
/// its operands (for the generic kernel, a tensor on the rank's device).
pub fn backward<B: HostRead>(
    ctx: &RingContext,
    saved: &Saved,
    out: Tensor<B, 4>,
    d_out: Tensor<B, 4>,
) -> Result<RingGrads<B>, RingError> {
    with_kernel(
        ctx.config.kernel,
        Backward {
            ctx,
            saved,
            out,
            d_out,
        },
    )
}

struct Backward<'a, B: Backend> {
    ctx: &'a RingContext,
    saved: &'a Saved,
    out: Tensor<B, 4>,
    d_out: Tensor<B, 4>,
}

impl<B: HostRead> WithKernel<B> for Backward<'_, B> {
    type Output = Result<RingGrads<B>, RingError>;

    fn run<K: TileKernel<B>>(self, kernel: &K) -> Self::Output {
        let Backward {
            ctx,
            saved,
            out,
            d_out,
        } = self;
        let Saved {
            q,
            k,
            v,
            lse,
            sinks,
            attend,
            ..
        } = saved;
        let device = out.device();
        let [b, h, t, d] = out.dims();
        let kv_heads = k.shape[1];
        let precision = ctx.config.precision;
        let how = scores_of(*attend, d, precision);
        let parallel = parallel_units(ctx);
        let d_out = kernel
            .operand(BlockKind::DOut, d_out)
            .in_dtype::<B>(precision.dtype, &device);
        let delta = kernel.delta(&d_out, out);
        let dsinks = sinks.as_ref().map(|s| {
            kernel
                .sink_gradient(s, lse, &delta, &device)
                .into_tensor::<B, 1>(&device)
        });
        let (d_out, delta) = (Arc::new(d_out), Arc::new(delta));
        let windows = ctx.windows(attend.mask());
        let shards = shards(kernel, ctx, &windows, &device)?;
        // Accumulators are kept (and a travelling one sent) in the merge's type.
        let zeros = |kind: BlockKind, shape: &[usize]| {
            kernel
                .zeros(kind, shape.to_vec(), &device)
                .in_dtype::<B>(precision.merge, &device)
        };
        let dims = TileDims {
            batch: b,
            heads: h,
            kv_heads,
            tq: t,
            tk: t,
            head_dim: d,
        };
        let (q_shape, kv_shape) = (q.shape.clone(), k.shape.clone());

        // The scheme decides what travels and in which direction.
        let (direction, travelling) = backward_route(ctx.config.backward, ctx.config.forward);
        let (cargo, accumulator, mut stay) = match travelling {
            Travelling::Queries => (
                vec![q.clone(), d_out.clone(), lse.clone(), delta.clone()],
                vec![zeros(BlockKind::DQ, &q_shape)],
                vec![
                    zeros(BlockKind::DK, &kv_shape),
                    zeros(BlockKind::DV, &kv_shape),
                ],
            ),
            Travelling::Keys => (
                vec![k.clone(), v.clone()],
                vec![
                    zeros(BlockKind::DK, &kv_shape),
                    zeros(BlockKind::DV, &kv_shape),
                ],
                vec![zeros(BlockKind::DQ, &q_shape)],
            ),
        };
        let rank = ctx.rank();
        let ledger = ctx.ledger();
        let stay_bytes: u64 = stay.iter().map(Block::bytes).sum();
        let _held_here = ledger.charge(d_out.bytes() + delta.bytes() + stay_bytes);
        // Each step's contribution to the travelling accumulator is a fresh block of its size.
        let contribution_bytes: u64 = accumulator.iter().map(Block::bytes).sum();
        let tile_bytes = contribution_bytes + kernel.workspace_bytes(&dims, true);
        let steps = steps_needed(&ctx.layout.positions, &windows, direction, travelling);
        let mut world = ctx.comm();
        let mut comm = world.in_group(ctx.group());
        let home = ring_pass::<B>(
            &device,
            &mut comm,
            ledger,
            Phase::Backward,
            (direction, steps),
            cargo,
            Some(accumulator),
            |step, owner, held| {
                let _turn = ctx.config.lockstep.then(lockstep_turn);
                let start = Instant::now();
                let (q_rank, k_rank) = match travelling {
                    Travelling::Queries => (owner, rank),
                    Travelling::Keys => (rank, owner),
                };
                let (win_q, pos_k) = (&windows[q_rank][..], ctx.positions(k_rank));
                let visibility = Visibility::of(win_q, pos_k);
                let pairs = visibility.pairs(win_q.len(), pos_k.len()) * (b * h) as u64;
                let contribution = (visibility != Visibility::None).then(|| {
                    let _tile = ledger.charge(tile_bytes);
                    let (q, d_out, lse, delta, k, v) = match travelling {
                        Travelling::Queries => (&held[0], &held[1], &held[2], &held[3], k, v),
                        Travelling::Keys => (q, &d_out, lse, &delta, &held[0], &held[1]),
                    };
                    let tile = BackwardTile {
                        q,
                        d_out,
                        lse,
                        delta,
                        k,
                        v,
                        queries: Queries {
                            windows: win_q,
                            prepared: &shards[q_rank],
                        },
                        keys: Keys {
                            positions: pos_k,
                            prepared: &shards[k_rank],
                        },
                        visibility,
                        // Shards may differ in length (a strategy that splits documents unevenly).
                        dims: TileDims {
                            tq: win_q.len(),
                            tk: pos_k.len(),
                            ..dims
                        },
                        scores: how,
                        parallel,
                    };
                    let travelling_part = kernel.backward_tile(&tile, &mut stay, travelling);
                    // A kernel may have widened what stays to accumulate in f32: kept in the
                    // merge's type between steps.
                    for block in &mut stay {
                        let widened =
                            std::mem::replace(block, Block::zeros(block.kind, Vec::new()));
                        *block = widened.in_dtype::<B>(precision.merge, &device);
                    }
                    travelling_part
                });
                ctx.record(
                    StepEvent {
                        phase: Phase::Backward,
                        step,
                        peer_block: owner,
                        pairs,
                        flops: BACKWARD_PER_PAIR_DIM * pairs * d as u64,
                        compute_seconds: start.elapsed().as_secs_f64(),
                    },
                    (start, visibility.name()),
                );
                Ok(contribution)
            },
        )?
        .expect("ring_pass returns the accumulator it was given");
        let (travelled, stayed) = (home.into_iter(), stay.into_iter());
        let mut grads = match travelling {
            Travelling::Queries => travelled.chain(stayed),
            Travelling::Keys => stayed.chain(travelled),
        };
        let mut next = || grads.next().expect("dQ, dK and dV: one block each");
        let (dq, dk, dv) = (next(), next(), next());
        // The gradients in the operands' type, as a bf16 kernel returns them.
        let grad = |block: Block| rounded(block.into_tensor::<B, 4>(&device), precision.dtype);
        Ok(RingGrads {
            dq: grad(dq),
            dk: grad(dk),
            dv: grad(dv),
            dsinks,
        })
    }
}
