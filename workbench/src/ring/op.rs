//! Ring attention as a Burn op: a backend extension whose autodiff twin runs the ring backward; on a
//! grid of head × context parallelism, the ring wrapped in the heads all-to-all (`ulysses.rs`), itself
//! an op whose backward is the other way.

use crate::block::Block;
use crate::block::BlockKind;
use crate::dtype::Dtype;
use crate::error::RingError;
use crate::host::HostRead;
use crate::primitive::{unwrap, wrap};
use crate::ring::context::HeadParallel;
use crate::ring::context::{Attend, RingContext};
use crate::ring::engine::{self, Saved};
use crate::ring::ulysses::{self, ExchangeState, HeadsExchange, Way};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Shape;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use std::sync::Arc;

/// The inputs of one call of ring attention as a backend op: this rank's shards and, optionally,
/// one sink logit per query head.
pub struct RingInputs<B: Backend> {
    /// Queries `[b, h, t, d]`.
    pub q: FloatTensor<B>,
    /// Keys `[b, hk, t, d]`.
    pub k: FloatTensor<B>,
    /// Values `[b, hk, t, d]`.
    pub v: FloatTensor<B>,
    /// Sink logits `[h]`, each joining its head's softmax denominators (no value).
    pub sinks: Option<FloatTensor<B>>,
}

/// Backends that can run ring attention. The default method runs the engine; the autodiff backend
/// overrides it to register the ring backward.
pub trait RingBackend: HostRead {
    /// Returns this rank's `(out [b, h, t, d], lse [b, h, t])` and what the backward needs; `lse`
    /// carries no gradient.
    fn ring_forward(
        inputs: RingInputs<Self>,
        ctx: &Arc<RingContext>,
        attend: Attend,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>, Saved), RingError> {
        let RingInputs { q, k, v, sinks } = inputs;
        let (out, lse, saved) =
            engine::forward::<Self>(ctx, wrap(q), wrap(k), wrap(v), sinks.map(wrap), attend)?;
        Ok((unwrap(out), unwrap(lse), saved))
    }

    /// One all-to-all of head × context parallelism ([`HeadsExchange`]) on `x` `[b, heads, tokens,
    /// d]`; the autodiff backend registers the other way as its backward.
    fn heads_exchange(
        x: FloatTensor<Self>,
        plan: &Arc<HeadsExchange>,
        way: Way,
    ) -> Result<FloatTensor<Self>, RingError> {
        ulysses::exchange_on_host::<Self>(x, plan, way)
    }
}

impl RingBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl RingBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl RingBackend for crate::backends::Wgpu {}

/// The ring backward as an autodiff step of `N` parents: q, k, v, and the sinks when there are.
#[derive(Debug)]
struct RingBackward<const N: usize>;

#[derive(Debug, Clone)]
struct RingState<B: Backend> {
    saved: Saved,
    out: FloatTensor<B>,
    ctx: Arc<RingContext>,
}

impl<B: RingBackend, const N: usize> Backward<B, N> for RingBackward<N> {
    type State = RingState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = wrap::<B, 4>(grads.consume::<B>(&ops.node));
        let RingState { saved, out, ctx } = ops.state;
        let device = d_out.device();
        let grads_in = match engine::backward(&ctx, &saved, wrap(out), d_out) {
            Ok(g) => {
                let mut all = vec![unwrap(g.dq), unwrap(g.dk), unwrap(g.dv)];
                all.extend(g.dsinks.map(unwrap));
                all
            }
            Err(error) => {
                ctx.set_backward_error(error);
                let zeros = |block: &Block| {
                    let flat = unwrap(Tensor::<B, 1>::zeros([block.len()], &device));
                    B::float_reshape(flat, Shape::from(block.shape.clone()))
                };
                let mut all = vec![zeros(&saved.q), zeros(&saved.k), zeros(&saved.v)];
                all.extend(saved.sinks.as_deref().map(zeros));
                all
            }
        };
        for (parent, grad) in ops.parents.into_iter().zip(grads_in) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: RingBackend, C: CheckpointStrategy> RingBackend for Autodiff<B, C> {
    fn ring_forward(
        inputs: RingInputs<Self>,
        ctx: &Arc<RingContext>,
        attend: Attend,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>, Saved), RingError> {
        let RingInputs { q, k, v, sinks } = inputs;
        let sink_node = sinks.as_ref().map(|s| s.node.clone());
        let inner = RingInputs {
            q: q.primitive,
            k: k.primitive,
            v: v.primitive,
            sinks: sinks.map(|s| s.primitive),
        };
        let (out, lse, saved) = B::ring_forward(inner, ctx, attend)?;
        let state = |out: &FloatTensor<B>| RingState {
            saved: saved.clone(),
            out: out.clone(),
            ctx: ctx.clone(),
        };
        let out = match sink_node {
            None => match RingBackward::<3>
                .prepare::<C>([q.node, k.node, v.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state(&out), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            },
            Some(sink) => match RingBackward::<4>
                .prepare::<C>([q.node, k.node, v.node, sink])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state(&out), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            },
        };
        Ok((out, <Self as AutodiffBackend>::from_inner(lse), saved))
    }

    fn heads_exchange(
        x: FloatTensor<Self>,
        plan: &Arc<HeadsExchange>,
        way: Way,
    ) -> Result<FloatTensor<Self>, RingError> {
        let input: [usize; 4] = wrap::<Self, 4>(x.clone()).dims();
        let out = B::heads_exchange(x.primitive, plan, way)?;
        let state = ExchangeState {
            plan: plan.clone(),
            way,
            input,
        };
        Ok(
            match ExchangeBackward
                .prepare::<C>([x.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            },
        )
    }
}

/// The backward of a heads exchange: the other way, on the gradient.
#[derive(Debug)]
struct ExchangeBackward;

impl<B: RingBackend> Backward<B, 1> for ExchangeBackward {
    type State = ExchangeState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let ExchangeState { plan, way, input } = &ops.state;
        let device = wrap::<B, 4>(grad.clone()).device();
        // A failure is parked on the ring's context (a backward cannot return it); zeros go on.
        let grad_in = B::heads_exchange(grad, plan, way.adjoint()).unwrap_or_else(|error| {
            plan.park(error);
            unwrap(Tensor::<B, 4>::zeros(*input, &device))
        });
        let [parent] = ops.parents;
        if let Some(node) = parent {
            grads.register::<B>(node.id, grad_in);
        }
    }
}

/// Ring attention of this rank's shards, masked and scaled as the context's options say:
/// `(out [b, h, t, d], lse [b, h, t])`.
///
/// On an autodiff backend, `out` takes part in `loss.backward()`; the backward runs the ring scheme of
/// `ctx`, and a failure there is reported by [`RingContext::take_backward_error`].
///
/// # Shapes
/// q `[b, h, t, d]`; k, v `[b, hk, t, d]` with `h % hk == 0`; t is this rank's shard length.
pub fn ring_attention<B: RingBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ctx: &Arc<RingContext>,
) -> Result<(Tensor<B, 4>, Tensor<B, 3>), RingError> {
    ring_attention_with(q, k, v, None, ctx, ctx.config.attend())
}

/// [`ring_attention`] masked and scored as `attend` says (a layer's own causality, window, scale
/// and cap), with `sinks` (`[h]`, learnable: they get a gradient) in every row's softmax.
pub fn ring_attention_with<B: RingBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    sinks: Option<Tensor<B, 1>>,
    ctx: &Arc<RingContext>,
    attend: Attend,
) -> Result<(Tensor<B, 4>, Tensor<B, 3>), RingError> {
    if let Some(grid) = ctx.heads() {
        return grid_attention(q, k, v, sinks, ctx, grid, attend);
    }
    let inputs = RingInputs {
        q: unwrap(q),
        k: unwrap(k),
        v: unwrap(v),
        sinks: sinks.map(unwrap),
    };
    let (out, lse, _) = B::ring_forward(inputs, ctx, attend)?;
    Ok((wrap(out), wrap(lse)))
}

/// All-to-alls of one grid attention call's forward ([`grid_attention`]): q, k and v to heads, out
/// and lse back to tokens; each makes `U − 1` exchanges on a rank of a Ulysses group of `U`.
pub(crate) const GRID_FORWARD_ALL_TO_ALLS: usize = 5;
/// All-to-alls of its backward when only the output reaches the loss: dO to heads, dq, dk and dv
/// back to tokens.
pub(crate) const GRID_BACKWARD_ALL_TO_ALLS: usize = 4;

/// Ulysses × ring attention (head × context parallelism) of this rank's pieces (`q [b, h, t, d]`,
/// `k, v [b, hk, t, d]`): to heads, the ring on this rank's heads over whole shards, back to tokens.
/// `(out [b, h, t, d], lse [b, h, t])`.
fn grid_attention<B: RingBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    sinks: Option<Tensor<B, 1>>,
    ctx: &RingContext,
    grid: &HeadParallel,
    attend: Attend,
) -> Result<(Tensor<B, 4>, Tensor<B, 3>), RingError> {
    let [b, h, t, d] = q.dims();
    let kv_heads = k.dims()[1];
    let u = grid.group.size();
    ulysses::check_heads(u, ctx.world(), h, kv_heads)?;
    let pieces: Vec<usize> = grid
        .group
        .members()
        .iter()
        .map(|&r| ctx.positions(r).len())
        .collect();
    let dtype = ctx.config.precision.dtype;
    let (q_split, kv_split) = (
        ulysses::query_heads(h, u),
        ulysses::kv_heads_of(kv_heads, u),
    );
    let mine = q_split[grid.group.rank()].clone();
    let to_heads = |x: Tensor<B, 4>, split: &[std::ops::Range<usize>], all: usize, kinds| {
        let plan = ulysses::exchange(grid, &pieces, split.to_vec(), all, kinds, dtype);
        B::heads_exchange(unwrap(x), &plan, Way::ToHeads).map(wrap::<B, 4>)
    };
    let q = to_heads(q, &q_split, h, [BlockKind::Q, BlockKind::DQ])?;
    let k = to_heads(k, &kv_split, kv_heads, [BlockKind::K, BlockKind::DK])?;
    let v = to_heads(v, &kv_split, kv_heads, [BlockKind::V, BlockKind::DV])?;
    let sinks = sinks.map(|s| s.slice([mine]));
    let (out, lse) = ring_attention_with(q, k, v, sinks, &grid.ring, attend)?;
    let back = |x: Tensor<B, 4>, kinds, dtype| {
        let plan = ulysses::exchange(grid, &pieces, q_split.clone(), h, kinds, dtype);
        B::heads_exchange(unwrap(x), &plan, Way::ToTokens).map(wrap::<B, 4>)
    };
    let out = back(out, [BlockKind::DOut, BlockKind::Out], dtype)?;
    let lse = back(
        lse.unsqueeze_dim(3),
        [BlockKind::Lse, BlockKind::Lse],
        Dtype::F32,
    )?;
    debug_assert_eq!(out.dims(), [b, h, t, d]);
    Ok((out, lse.reshape([b, h, t])))
}
