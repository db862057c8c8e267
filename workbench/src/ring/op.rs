//! Ring attention as a Burn op: a backend extension whose autodiff twin runs the ring backward.

use crate::block::Block;
use crate::error::RingError;
use crate::host::HostRead;
use crate::primitive::{unwrap, wrap};
use crate::ring::context::{Attend, RingContext};
use crate::ring::engine::{self, Saved};
use crate::ring::ulysses::{self, ExchangeBackward, ExchangeState, HeadsExchange, Way};
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
impl RingBackend for burn::backend::Cuda {}

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

impl<B: RingBackend> Backward<B, 1> for ExchangeBackward {
    type State = ExchangeState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let grad_in = ops.state.backward::<B>(grad);
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
        return ulysses::attention(q, k, v, sinks, ctx, grid, attend);
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
