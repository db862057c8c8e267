//! The `[b, t, n] · [n, m]` projection a layer's linear maps are.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

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
