//! Ring attention as a Burn op: a backend extension whose autodiff twin runs the ring backward.

use crate::config::RingContext;
use crate::engine::{self, Saved};
use crate::error::RingError;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use std::sync::Arc;

fn wrap<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

fn unwrap<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// Backends that can run ring attention. The default method runs the generic engine; the autodiff
/// backend overrides it to register the ring backward.
pub trait RingBackend: Backend {
    /// Returns this rank's `(out [b, h, t, d], lse [b, h, t])`; `lse` carries no gradient.
    fn ring_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        ctx: &Arc<RingContext>,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>), RingError> {
        let (out, lse) = engine::forward::<Self>(ctx, wrap(q), wrap(k), wrap(v))?;
        Ok((unwrap(out), unwrap(lse)))
    }
}

impl RingBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl RingBackend for burn::backend::Cuda {}

#[derive(Debug)]
struct RingBackward;

#[derive(Debug, Clone)]
struct RingState<B: Backend> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    ctx: Arc<RingContext>,
}

impl<B: Backend> Backward<B, 3> for RingBackward {
    type State = RingState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = wrap::<B, 4>(grads.consume::<B>(&ops.node));
        let RingState {
            q,
            k,
            v,
            out,
            lse,
            ctx,
        } = ops.state;
        let saved = Saved::<B> {
            q: wrap(q),
            k: wrap(k),
            v: wrap(v),
            out: wrap(out),
            lse: wrap(lse),
        };
        let (dq, dk, dv) = engine::backward(&ctx, &saved, d_out).unwrap_or_else(|error| {
            ctx.set_backward_error(error);
            (
                saved.q.zeros_like(),
                saved.k.zeros_like(),
                saved.v.zeros_like(),
            )
        });
        for (parent, grad) in ops.parents.into_iter().zip([dq, dk, dv]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, unwrap(grad));
            }
        }
    }
}

impl<B: RingBackend, C: CheckpointStrategy> RingBackend for Autodiff<B, C> {
    fn ring_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        ctx: &Arc<RingContext>,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>), RingError> {
        let (out, lse) = B::ring_attention(
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
            ctx,
        )?;
        let prep = RingBackward
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful();
        let out = match prep {
            OpsKind::Tracked(prep) => {
                let state = RingState {
                    q: q.primitive,
                    k: k.primitive,
                    v: v.primitive,
                    out: out.clone(),
                    lse: lse.clone(),
                    ctx: ctx.clone(),
                };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        Ok((out, <Self as AutodiffBackend>::from_inner(lse)))
    }
}

/// Ring attention of this rank's shards: `(out [b, h, t, d], lse [b, h, t])`.
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
    let (out, lse) = B::ring_attention(unwrap(q), unwrap(k), unwrap(v), ctx)?;
    Ok((wrap(out), wrap(lse)))
}
