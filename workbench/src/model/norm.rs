//! RMSNorm and its backward written out (the checkpointed layer differentiates by hand), and the
//! `[b, t, n] · [n, m]` projection a layer's linear maps are.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `γ ∘ x / sqrt(mean(x²) + ε)` over the last dimension (Burn's `RmsNorm`), and `1 / sqrt(…)`.
pub(crate) fn rms_norm<B: Backend>(
    x: Tensor<B, 3>,
    gamma: &Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let r = (x.clone().square().mean_dim(2) + eps).sqrt().recip();
    (x * r.clone() * gamma.clone().unsqueeze(), r)
}

/// RMSNorm's backward: `(dx, dγ)` of `dy` at input `x` with `r` from [`rms_norm`].
pub(crate) fn rms_norm_backward<B: Backend>(
    x: Tensor<B, 3>,
    r: Tensor<B, 3>,
    gamma: &Tensor<B, 1>,
    dy: Tensor<B, 3>,
) -> (Tensor<B, 3>, Tensor<B, 1>) {
    let d = gamma.dims()[0];
    let d_gamma = (dy.clone() * x.clone() * r.clone())
        .reshape([-1, d as i32])
        .sum_dim(0)
        .reshape([d]);
    let g = dy * gamma.clone().unsqueeze();
    let mean_gx = (g.clone() * x.clone()).mean_dim(2);
    let dx = g * r.clone() - x * r.clone() * r.clone() * r * mean_gx;
    (dx, d_gamma)
}

/// `[b, t, n]` as `[b · t, n]`.
pub(crate) fn flat<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 2> {
    let [b, t, n] = x.dims();
    x.reshape([b * t, n])
}

/// `x: [b, t, n] · w: [n, m]`.
pub(crate) fn project<B: Backend>(x: Tensor<B, 3>, w: &Tensor<B, 2>) -> Tensor<B, 3> {
    let [b, t, _] = x.dims();
    flat(x).matmul(w.clone()).reshape([b, t, w.dims()[1]])
}
