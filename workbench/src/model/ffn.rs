//! The SwiGLU feed-forward in sequence chunks as one op whose backward recomputes each chunk's hidden
//! activations: the Blockwise Parallel Transformer's feed-forward with rematerialization. Autodiff
//! saves the op's input and weights, not the `[t, ffn]` hidden activations of every chunk.
//!
//! For a chunk x: a = x·W1, g = x·W3, m = silu(a) ∘ g, y = m·W2. Given dy: dW2 = mᵀ·dy,
//! dm = dy·W2ᵀ, da = dm ∘ g ∘ silu′(a), dg = dm ∘ silu(a), dx = da·W1ᵀ + dg·W3ᵀ, dW1 = xᵀ·da,
//! dW3 = xᵀ·dg, with silu′(a) = σ(a)·(1 + a·(1 − σ(a))).

use crate::model::elementwise::{ElementwiseBackend, swiglu, swiglu_backward as gate_backward};
use crate::primitive::{unwrap, wrap};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// `[b, t, d]` rows `start..end` of the sequence as a `[b · (end − start), d]` matrix.
fn rows<B: Backend>(x: &Tensor<B, 3>, start: usize, end: usize) -> Tensor<B, 2> {
    let [b, _, d] = x.dims();
    x.clone()
        .slice([0..b, start..end, 0..d])
        .reshape([b * (end - start), d])
}

/// The chunk starts and ends of a `t`-token sequence in chunks of `chunk`.
fn chunks(t: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..t).step_by(chunk).map(move |s| (s, (s + chunk).min(t)))
}

/// Backends that run the blockwise SwiGLU feed-forward. The default method computes it with tensor
/// ops and the backend's gate (what the inner backend of autodiff runs); the autodiff backend
/// overrides it to register the rematerializing backward.
pub trait FfnBackend: ElementwiseBackend {
    /// `silu(x·W1) ∘ (x·W3) · W2` of `x: [b, t, d]` in chunks of `chunk` tokens; `w1, w3: [d, f]`,
    /// `w2: [f, d]`.
    fn blockwise_swiglu(
        x: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        chunk: usize,
    ) -> FloatTensor<Self> {
        let x = wrap::<Self, 3>(x);
        let (w1, w3, w2) = (
            wrap::<Self, 2>(w1),
            wrap::<Self, 2>(w3),
            wrap::<Self, 2>(w2),
        );
        let [b, t, d] = x.dims();
        let out = chunks(t, chunk)
            .map(|(s, e)| {
                let c = rows(&x, s, e);
                let m = swiglu(c.clone().matmul(w1.clone()), c.matmul(w3.clone()));
                m.matmul(w2.clone()).reshape([b, e - s, d])
            })
            .collect();
        unwrap(Tensor::cat(out, 1))
    }
}

impl FfnBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl FfnBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl FfnBackend for crate::backends::Wgpu {}

/// The blockwise SwiGLU's backward: `(dx, dW1, dW3, dW2)` of `dy` at input `x: [b, t, d]`, each
/// chunk's hidden activations recomputed, used and dropped.
pub(crate) fn swiglu_backward<B: ElementwiseBackend>(
    x: Tensor<B, 3>,
    w1: Tensor<B, 2>,
    w3: Tensor<B, 2>,
    w2: Tensor<B, 2>,
    dy: Tensor<B, 3>,
    chunk: usize,
) -> (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>) {
    let [b, t, d] = x.dims();
    let mut dx = Vec::new();
    let (mut dw1, mut dw3, mut dw2) = (
        Tensor::zeros(w1.dims(), &w1.device()),
        Tensor::zeros(w3.dims(), &w3.device()),
        Tensor::zeros(w2.dims(), &w2.device()),
    );
    for (s, e) in chunks(t, chunk) {
        // Recompute the chunk's hidden activations, use them, drop them.
        let (c, dyc) = (rows(&x, s, e), rows(&dy, s, e));
        let a = c.clone().matmul(w1.clone());
        let g = c.clone().matmul(w3.clone());
        let dm = dyc.clone().matmul(w2.clone().transpose());
        let [da, dg, m] = gate_backward(a, g, dm);
        dw2 = dw2 + m.transpose().matmul(dyc);
        dw1 = dw1 + c.clone().transpose().matmul(da.clone());
        dw3 = dw3 + c.transpose().matmul(dg.clone());
        let dxc = da.matmul(w1.clone().transpose()) + dg.matmul(w3.clone().transpose());
        dx.push(dxc.reshape([b, e - s, d]));
    }
    (Tensor::cat(dx, 1), dw1, dw3, dw2)
}

#[derive(Debug)]
struct SwigluBackward;

#[derive(Debug, Clone)]
struct SwigluState<B: Backend> {
    x: FloatTensor<B>,
    w1: FloatTensor<B>,
    w3: FloatTensor<B>,
    w2: FloatTensor<B>,
    chunk: usize,
}

impl<B: FfnBackend> Backward<B, 4> for SwigluBackward {
    type State = SwigluState<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = wrap::<B, 3>(grads.consume::<B>(&ops.node));
        let SwigluState {
            x,
            w1,
            w3,
            w2,
            chunk,
        } = ops.state;
        let (dx, dw1, dw3, dw2) =
            swiglu_backward(wrap::<B, 3>(x), wrap(w1), wrap(w3), wrap(w2), dy, chunk);
        let [px, p1, p3, p2] = ops.parents;
        let pairs = [
            (px, unwrap(dx)),
            (p1, unwrap(dw1)),
            (p3, unwrap(dw3)),
            (p2, unwrap(dw2)),
        ];
        for (parent, grad) in pairs {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: FfnBackend, C: CheckpointStrategy> FfnBackend for Autodiff<B, C> {
    fn blockwise_swiglu(
        x: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        chunk: usize,
    ) -> FloatTensor<Self> {
        let nodes = [x.node, w1.node, w3.node, w2.node];
        let (x, w1, w3, w2) = (x.primitive, w1.primitive, w3.primitive, w2.primitive);
        let out = B::blockwise_swiglu(x.clone(), w1.clone(), w3.clone(), w2.clone(), chunk);
        match SwigluBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                SwigluState {
                    x,
                    w1,
                    w3,
                    w2,
                    chunk,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// The blockwise SwiGLU feed-forward of `x: [b, t, d]` (weights as Burn's `Linear` holds them,
/// `[in, out]`), whose backward recomputes each chunk's hidden activations instead of keeping them.
pub fn blockwise_swiglu<B: FfnBackend>(
    x: Tensor<B, 3>,
    w1: Tensor<B, 2>,
    w3: Tensor<B, 2>,
    w2: Tensor<B, 2>,
    chunk: usize,
) -> Tensor<B, 3> {
    wrap(B::blockwise_swiglu(
        unwrap(x),
        unwrap(w1),
        unwrap(w3),
        unwrap(w2),
        chunk,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::Distribution;
    use burn::tensor::activation::silu;

    type A = Autodiff<Flex>;

    /// out, dx, dW1, dW3, dW2 of Σ out ∘ r, with the op or with plain autodiff over the chunks.
    fn run(
        remat: bool,
        inputs: &[Tensor<Flex, 2>; 5],
        [b, t, d]: [usize; 3],
    ) -> Vec<Tensor<Flex, 2>> {
        let x = Tensor::<A, 2>::from_inner(inputs[0].clone())
            .reshape([b, t, d])
            .require_grad();
        let leaf = |w: &Tensor<Flex, 2>| Tensor::<A, 2>::from_inner(w.clone()).require_grad();
        let (w1, w3, w2) = (leaf(&inputs[1]), leaf(&inputs[2]), leaf(&inputs[3]));
        // Chunks of 3 tokens: the last one is short.
        let out = if remat {
            blockwise_swiglu(x.clone(), w1.clone(), w3.clone(), w2.clone(), 3)
        } else {
            let chunks = chunks(t, 3)
                .map(|(s, e)| {
                    let c = rows(&x, s, e);
                    let m = silu(c.clone().matmul(w1.clone())) * c.matmul(w3.clone());
                    m.matmul(w2.clone()).reshape([b, e - s, d])
                })
                .collect();
            Tensor::cat(chunks, 1)
        };
        let r = Tensor::<A, 2>::from_inner(inputs[4].clone()).reshape([b, t, d]);
        let grads = (out.clone() * r).sum().backward();
        let gx = x.grad(&grads).unwrap().reshape([b * t, d]);
        let g = |w: &Tensor<A, 2>| w.grad(&grads).unwrap();
        vec![out.inner().reshape([b * t, d]), gx, g(&w1), g(&w3), g(&w2)]
    }

    #[test]
    fn rematerialized_gradients_equal_the_stored_ones() {
        let (b, t, d, f) = (2, 10, 8, 12);
        let device = Default::default();
        let random = |rows: usize, cols: usize| {
            Tensor::<Flex, 2>::random([rows, cols], Distribution::Uniform(-1.0, 1.0), &device)
        };
        let inputs = crate::model::lazy::seeded::<Flex, _>(5, &device, || {
            [
                random(b * t, d),
                random(d, f),
                random(d, f),
                random(f, d),
                random(b * t, d),
            ]
        });
        let (remat, stored) = (
            run(true, &inputs, [b, t, d]),
            run(false, &inputs, [b, t, d]),
        );
        for (i, (a, s)) in remat.into_iter().zip(stored).enumerate() {
            let scale: f32 = s.clone().abs().max().into_scalar();
            let error: f32 = (a - s).abs().max().into_scalar();
            assert!(scale > 0.1, "tensor {i} is (nearly) zero: {scale}");
            assert!(
                error / scale <= 1e-6,
                "tensor {i} (out, dx, dW1, dW3, dW2): {:e}",
                error / scale
            );
        }
    }
}
