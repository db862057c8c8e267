//! The layer's elementwise steps as autodiff ops: each forward runs the inner backend's step, each
//! backward the inner backend's backward pass (RMSNorm's, the gate's, moving the heads back).

use super::ElementwiseBackend;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::TensorMetadata;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

/// Each step as one autodiff op whose backward is the inner backend's own pass: RMSNorm's backward,
/// the gate's, and moving the heads back.
impl<B: ElementwiseBackend, C: CheckpointStrategy> ElementwiseBackend for Autodiff<B, C> {
    /// `r` is returned untracked: a value the checkpointed layer's hand-written backward reads, never
    /// differentiated through.
    fn rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [x.node, gamma.node];
        let (x, gamma) = (x.primitive, gamma.primitive);
        let (y, r) = B::rms_norm(x.clone(), gamma.clone(), eps);
        let y = match RmsNormBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((x, r.clone(), gamma), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        (y, <Self as AutodiffBackend>::from_inner(r))
    }

    fn swiglu(a: FloatTensor<Self>, g: FloatTensor<Self>) -> FloatTensor<Self> {
        let nodes = [a.node, g.node];
        let (a, g) = (a.primitive, g.primitive);
        let m = B::swiglu(a.clone(), g.clone());
        match GateBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((a, g), m),
            OpsKind::UnTracked(prep) => prep.finish(m),
        }
    }

    fn heads_first(x: FloatTensor<Self>, heads: usize) -> FloatTensor<Self> {
        let out = B::heads_first(x.primitive, heads);
        match HeadsBackward::First
            .prepare::<C>([x.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(heads, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn heads_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let heads = x.shape()[1];
        let out = B::heads_last(x.primitive);
        match HeadsBackward::Last
            .prepare::<C>([x.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(heads, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// RMSNorm's autodiff step: state `(x, r, γ)`, parents `[x, γ]`.
#[derive(Debug)]
struct RmsNormBackward;

impl<B: ElementwiseBackend> Backward<B, 2> for RmsNormBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (x, r, gamma) = ops.state;
        let (dx, d_gamma) = B::rms_norm_backward(x, r, gamma, dy);
        let [px, pg] = ops.parents;
        for (parent, grad) in [(px, dx), (pg, d_gamma)] {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The gate's autodiff step: state `(a, g)`, parents `[a, g]`.
#[derive(Debug)]
struct GateBackward;

impl<B: ElementwiseBackend> Backward<B, 2> for GateBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dm = grads.consume::<B>(&ops.node);
        let (a, g) = ops.state;
        let [da, dg, _] = B::swiglu_backward(a, g, dm);
        let [pa, pg] = ops.parents;
        for (parent, grad) in [(pa, da), (pg, dg)] {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// Moving heads first or last: the gradient moves back. State: the number of heads.
#[derive(Debug)]
enum HeadsBackward {
    First,
    Last,
}

impl<B: ElementwiseBackend> Backward<B, 1> for HeadsBackward {
    type State = usize;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let heads = ops.state;
        let dx = match self {
            HeadsBackward::First => B::heads_last(dy),
            HeadsBackward::Last => B::heads_first(dy, heads),
        };
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, dx);
        }
    }
}
