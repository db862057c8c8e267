//! The next-token loss without a `[tokens × vocab]` block: `Σ_r w_r·(lse_r − z_r[t_r])` for the
//! logits `z = h·W` of rows `h: [n, d]` and head `W: [d, vocab]`, computed over rows in chunks of at
//! most [`LOSS_CHUNK_ELEMENTS`] logits, as one op whose backward recomputes each chunk's logits:
//! `dz = w·g·(softmax(z) − onehot(t))`, `dh = dz·Wᵀ`, `dW = Σ_chunks hᵀ·dz`. Only the rows, the head
//! and one chunk's logits are ever held, whatever the vocabulary (49,152 for SmolLM2: a
//! `[16 × 1,931, 49,152]` block would be 6 GB in f32).

use crate::primitive::{unwrap, wrap};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor};

/// Logits a chunk holds at most (16 M: 64 MB in f32): the rows per chunk are this over the
/// vocabulary.
pub const LOSS_CHUNK_ELEMENTS: usize = 1 << 24;

/// Rows per chunk for a vocabulary of `vocab`.
fn chunk_rows(vocab: usize) -> usize {
    (LOSS_CHUNK_ELEMENTS / vocab.max(1)).max(1)
}

/// Backends that compute the chunked next-token loss. The default is its forward in Burn tensor ops;
/// the autodiff backend overrides it to register the recomputing backward.
pub trait LossBackend: Backend {
    /// `Σ_r w_r·(logsumexp(h_r·W) − (h_r·W)[t_r])` as `[1]`, for `h: [n, d]`, `head: [d, vocab]`,
    /// `targets: [n]`, `weights: [n]`, in chunks of `rows` rows.
    fn next_token_nll(
        h: FloatTensor<Self>,
        head: FloatTensor<Self>,
        targets: IntTensor<Self>,
        weights: FloatTensor<Self>,
        rows: usize,
    ) -> FloatTensor<Self> {
        let (h, head) = (wrap::<Self, 2>(h), wrap::<Self, 2>(head));
        let targets = Tensor::<Self, 1, Int>::from_primitive(targets);
        let weights = wrap::<Self, 1>(weights);
        let [n, _] = h.dims();
        let rows = rows.max(1);
        let mut total = Tensor::<Self, 1>::zeros([1], &h.device());
        for s in (0..n).step_by(rows) {
            let e = (s + rows).min(n);
            let z = h.clone().slice(s..e).matmul(head.clone());
            let lse = logsumexp(z.clone());
            let picked = z.gather(1, targets.clone().slice(s..e).unsqueeze_dim(1));
            let w = weights.clone().slice(s..e).unsqueeze_dim(1);
            total = total + ((lse - picked) * w).sum();
        }
        unwrap(total)
    }
}

/// Each row's `log Σ exp` of `z: [c, vocab]`, as `[c, 1]` (shifted by the row's max).
fn logsumexp<B: Backend>(z: Tensor<B, 2>) -> Tensor<B, 2> {
    let m = z.clone().max_dim(1);
    (z - m.clone()).exp().sum_dim(1).log() + m
}

/// The backward: `(dh, dW)` for `g`, the loss's gradient (`[1]`), each chunk's logits recomputed.
fn next_token_nll_backward<B: Backend>(
    (h, head): (Tensor<B, 2>, Tensor<B, 2>),
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
    (g, rows): (Tensor<B, 1>, usize),
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let [n, _] = h.dims();
    let vocab = head.dims()[1];
    let rows = rows.max(1);
    let mut dh = Vec::new();
    let mut d_head = Tensor::<B, 2>::zeros(head.dims(), &head.device());
    for s in (0..n).step_by(rows) {
        let e = (s + rows).min(n);
        let hc = h.clone().slice(s..e);
        let z = hc.clone().matmul(head.clone());
        let p = (z.clone() - logsumexp(z)).exp();
        let onehot = targets.clone().slice(s..e).one_hot::<2>(vocab).float();
        let scale = weights.clone().slice(s..e).unsqueeze_dim::<2>(1) * g.clone().unsqueeze();
        let dz = (p - onehot) * scale;
        dh.push(dz.clone().matmul(head.clone().transpose()));
        d_head = d_head + hc.transpose().matmul(dz);
    }
    (Tensor::cat(dh, 0), d_head)
}

impl LossBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl LossBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl LossBackend for crate::backends::Wgpu {}

#[derive(Debug)]
struct NllBackward;

#[derive(Debug, Clone)]
struct NllState<B: Backend> {
    h: FloatTensor<B>,
    head: FloatTensor<B>,
    targets: IntTensor<B>,
    weights: FloatTensor<B>,
    rows: usize,
}

impl<B: LossBackend> Backward<B, 2> for NllBackward {
    type State = NllState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = wrap::<B, 1>(grads.consume::<B>(&ops.node));
        let NllState {
            h,
            head,
            targets,
            weights,
            rows,
        } = ops.state;
        let (dh, d_head) = next_token_nll_backward(
            (wrap(h), wrap(head)),
            Tensor::from_primitive(targets),
            wrap(weights),
            (g, rows),
        );
        let [ph, pw] = ops.parents;
        for (parent, grad) in [(ph, unwrap(dh)), (pw, unwrap(d_head))] {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The rows and the head carry gradients; the targets and weights are data.
impl<B: LossBackend, C: CheckpointStrategy> LossBackend for Autodiff<B, C> {
    fn next_token_nll(
        h: FloatTensor<Self>,
        head: FloatTensor<Self>,
        targets: IntTensor<Self>,
        weights: FloatTensor<Self>,
        rows: usize,
    ) -> FloatTensor<Self> {
        let nodes = [h.node, head.node];
        let (h, head, weights) = (h.primitive, head.primitive, weights.primitive);
        let out = B::next_token_nll(
            h.clone(),
            head.clone(),
            targets.clone(),
            weights.clone(),
            rows,
        );
        match NllBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(
                NllState {
                    h,
                    head,
                    targets,
                    weights,
                    rows,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// The chunked loss of rows `h: [n, d]` under `head: [d, vocab]`, chunks of at most
/// [`LOSS_CHUNK_ELEMENTS`] logits.
pub(crate) fn next_token_nll<B: LossBackend>(
    h: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let rows = chunk_rows(head.dims()[1]);
    next_token_nll_in(h, head, targets, weights, rows)
}

/// [`next_token_nll`] in chunks of `rows` rows.
fn next_token_nll_in<B: LossBackend>(
    h: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
    rows: usize,
) -> Tensor<B, 1> {
    wrap(B::next_token_nll(
        unwrap(h),
        unwrap(head),
        targets.into_primitive(),
        unwrap(weights),
        rows,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::read;
    use burn::backend::Flex;
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Distribution, TensorData};
    use ringbench_tests::{F32_UNIT_ROUNDOFF, deviation};

    type A = Autodiff<Flex>;

    /// The chunked op (7 rows in chunks of 2: four chunks, the last short) and plain autodiff
    /// through `log_softmax` give the same loss and gradients: both sum the same terms in f32 in
    /// another order, within (d + vocab + n)·u of the scale (a dot product of d, a sum over the
    /// vocabulary, a sum over the rows).
    #[test]
    fn the_chunked_loss_and_its_gradients_are_the_plain_ones() {
        let device = Default::default();
        let (n, d, vocab) = (7, 8, 50);
        assert_eq!(chunk_rows(49_152), 341);
        let (h, head) = crate::model::lazy::seeded::<Flex, _>(8, &device, || {
            (
                Tensor::<Flex, 2>::random([n, d], Distribution::Uniform(-1.0, 1.0), &device),
                Tensor::<Flex, 2>::random([d, vocab], Distribution::Uniform(-1.0, 1.0), &device),
            )
        });
        let targets: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % vocab as i64).collect();
        let weights: Vec<f32> = (0..n).map(|i| [1.0, 0.5, 0.0][i % 3]).collect();
        let targets = Tensor::<A, 1, Int>::from_data(TensorData::new(targets, [n]), &device);
        let weights = Tensor::<A, 1>::from_data(TensorData::new(weights, [n]), &device);
        let run = |chunked: bool| {
            let h = Tensor::<A, 2>::from_inner(h.clone()).require_grad();
            let head = Tensor::<A, 2>::from_inner(head.clone()).require_grad();
            let loss = if chunked {
                next_token_nll_in(h.clone(), head.clone(), targets.clone(), weights.clone(), 2)
            } else {
                let picked = log_softmax(h.clone().matmul(head.clone()), 1)
                    .gather(1, targets.clone().unsqueeze_dim(1))
                    .squeeze_dim::<1>(1);
                (picked * weights.clone()).sum().neg()
            };
            let grads = loss.backward();
            [
                read(loss.inner()),
                read(h.grad(&grads).expect("dh")),
                read(head.grad(&grads).expect("dW")),
            ]
        };
        let (chunked, plain) = (run(true), run(false));
        let bound = (d + vocab + n) as f64 * F32_UNIT_ROUNDOFF;
        for (name, (a, b)) in ["loss", "dh", "dW"].iter().zip(chunked.iter().zip(&plain)) {
            let got = deviation(a, b);
            assert!(got.within(bound), "{name}: {got} (bound {bound:e})");
        }
    }
}
