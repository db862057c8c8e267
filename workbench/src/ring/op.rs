//! Ring attention as a Burn op: a backend extension whose autodiff twin runs the ring backward.

use crate::block::Block;
use crate::error::RingError;
use crate::host::HostRead;
use crate::primitive::{unwrap, wrap};
use crate::ring::context::{Attend, RingContext};
use crate::ring::engine::{self, Saved};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use std::sync::Arc;

/// Backends that can run ring attention. The default method runs the engine; the autodiff backend
/// overrides it to register the ring backward.
pub trait RingBackend: HostRead {
    /// Returns this rank's `(out [b, h, t, d], lse [b, h, t])` and what the backward needs; `lse`
    /// carries no gradient.
    fn ring_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        ctx: &Arc<RingContext>,
        attend: Attend,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>, Saved), RingError> {
        let (out, lse, saved) = engine::forward::<Self>(ctx, wrap(q), wrap(k), wrap(v), attend)?;
        Ok((unwrap(out), unwrap(lse), saved))
    }
}

impl RingBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl RingBackend for burn::backend::Cuda {}

#[cfg(feature = "wgpu")]
impl RingBackend for crate::backends::Wgpu {}

#[derive(Debug)]
struct RingBackward;

#[derive(Debug, Clone)]
struct RingState<B: Backend> {
    saved: Saved,
    out: FloatTensor<B>,
    ctx: Arc<RingContext>,
}

impl<B: RingBackend> Backward<B, 3> for RingBackward {
    type State = RingState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = wrap::<B, 4>(grads.consume::<B>(&ops.node));
        let RingState { saved, out, ctx } = ops.state;
        let device = d_out.device();
        let (dq, dk, dv) =
            engine::backward(&ctx, &saved, wrap(out), d_out).unwrap_or_else(|error| {
                ctx.set_backward_error(error);
                let zeros = |block: &Block| Tensor::zeros(block.shape.clone(), &device);
                (zeros(&saved.q), zeros(&saved.k), zeros(&saved.v))
            });
        for (parent, grad) in ops.parents.into_iter().zip([dq, dk, dv]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, unwrap(grad));
            }
        }
    }
}

impl<B: RingBackend, C: CheckpointStrategy> RingBackend for Autodiff<B, C> {
    fn ring_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        ctx: &Arc<RingContext>,
        attend: Attend,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>, Saved), RingError> {
        let nodes = [q.node, k.node, v.node];
        let (out, lse, saved) =
            B::ring_forward(q.primitive, k.primitive, v.primitive, ctx, attend)?;
        let prep = RingBackward.prepare::<C>(nodes).compute_bound().stateful();
        let out = match prep {
            OpsKind::Tracked(prep) => {
                let state = RingState {
                    saved: saved.clone(),
                    out: out.clone(),
                    ctx: ctx.clone(),
                };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        Ok((out, <Self as AutodiffBackend>::from_inner(lse), saved))
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
    ring_attention_with(q, k, v, ctx, ctx.config.attend())
}

/// [`ring_attention`] masked and scaled as `attend` says (a layer's own causality and scale).
pub fn ring_attention_with<B: RingBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ctx: &Arc<RingContext>,
    attend: Attend,
) -> Result<(Tensor<B, 4>, Tensor<B, 3>), RingError> {
    let (out, lse, _) = B::ring_forward(unwrap(q), unwrap(k), unwrap(v), ctx, attend)?;
    Ok((wrap(out), wrap(lse)))
}
