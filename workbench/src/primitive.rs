//! Burn tensors to and from their float primitives: what a backend extension's custom autodiff
//! ops (ring attention, the rematerializing feed-forward, the checkpointed layer) take and return.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// A float primitive as a tensor of `D` dimensions.
pub(crate) fn wrap<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// A float tensor's primitive.
pub(crate) fn unwrap<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}
