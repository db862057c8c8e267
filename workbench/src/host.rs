//! Reading a backend's tensor into host memory: the one copy every ring block starts from.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

/// Backends whose tensors the ring reads as host f32. The default goes through `into_data`; a backend
/// that can read its buffer in place overrides it to copy once.
pub trait HostRead: Backend {
    /// The tensor's elements, row-major, as f32 on the host.
    fn to_host<const D: usize>(tensor: Tensor<Self, D>) -> Vec<f32> {
        via_data(tensor)
    }
}

/// Any backend's tensor as host f32, through `into_data` (a shared Flex buffer is copied three times).
pub(crate) fn via_data<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32 above")
}

/// Flex's `into_data` of a shared buffer copies three times (to bytes, to an aligned buffer, to a
/// vector); reading the contiguous buffer in place copies once.
impl HostRead for burn::backend::Flex {
    fn to_host<const D: usize>(tensor: Tensor<Self, D>) -> Vec<f32> {
        let primitive = tensor.into_primitive().tensor();
        if !primitive.is_unique()
            && let Some(data) = primitive.as_slice::<f32>()
        {
            return data.to_vec();
        }
        via_data(Tensor::<Self, D>::from_primitive(TensorPrimitive::Float(
            primitive,
        )))
    }
}

#[cfg(feature = "cuda")]
impl HostRead for burn::backend::Cuda {}

impl<B: Backend, C: CheckpointStrategy> HostRead for Autodiff<B, C> {}
