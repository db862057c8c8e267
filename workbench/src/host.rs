//! Moving values between host memory and a backend's device: the one home of those copies, each
//! counted on the calling thread (a rank's thread), so that the ring can report what a step moved.

use crate::cube::DeviceTiles;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use std::cell::Cell;

/// Backends whose tensors the ring reads as host f32. The default goes through `into_data`; a backend
/// that can read its buffer in place overrides it to copy once.
pub trait HostRead: Backend {
    /// Whether the backend's tensors live in host memory (the CPU backend): a kernel that computes
    /// on host blocks runs there without crossing to a device.
    const HOST_MEMORY: bool = false;

    /// The fused tile kernels the backend runs on its own device (the CubeCL backends: wgpu, cuda),
    /// if it has them.
    fn device_tiles() -> Option<&'static dyn DeviceTiles<Self>> {
        None
    }

    /// The CUDA memory behind one of the backend's tensors, for NCCL to send from in place (Burn's
    /// CUDA backend), or None (every other backend).
    #[cfg(feature = "cuda")]
    fn cuda_memory(
        _tensor: burn::tensor::ops::FloatTensor<Self>,
    ) -> Option<Result<crate::cube::CudaMemory, String>> {
        None
    }

    /// The tensor's elements, row-major, as f32 on the host.
    fn to_host<const D: usize>(tensor: Tensor<Self, D>) -> Vec<f32> {
        via_data(tensor)
    }
}

thread_local! {
    static MOVED: Cell<u64> = const { Cell::new(0) };
}

/// Bytes this thread has moved between host and device (both ways) through [`read`] and [`place`].
/// On the CPU backend the "device" is host memory: these are then copies between tensors and host
/// blocks.
pub fn moved_bytes() -> u64 {
    MOVED.with(Cell::get)
}

fn count(shape: &[usize]) {
    count_bytes((shape.iter().product::<usize>() * std::mem::size_of::<f32>()) as u64);
}

/// Counts `bytes` moved between host and device by a copy that is not [`read`] or [`place`] (a
/// transport's own staging of a message header).
pub fn count_bytes(bytes: u64) {
    MOVED.with(|m| m.set(m.get() + bytes));
}

/// The tensor's values on the host (counted).
pub fn read<B: HostRead, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    count(&tensor.dims());
    B::to_host(tensor)
}

/// Host values placed on `device` as a tensor of `shape` (counted).
pub fn place<B: Backend, const D: usize>(
    data: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    count(&shape);
    Tensor::from_data(TensorData::new(data, shape), device)
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
    const HOST_MEMORY: bool = true;

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
impl HostRead for crate::backends::Cuda {
    fn device_tiles() -> Option<&'static dyn DeviceTiles<Self>> {
        Some(&crate::cube::CubeTiles)
    }

    fn cuda_memory(
        tensor: burn::tensor::ops::FloatTensor<Self>,
    ) -> Option<Result<crate::cube::CudaMemory, String>> {
        Some(crate::cube::CudaMemory::of(tensor))
    }
}

#[cfg(feature = "wgpu")]
impl HostRead for crate::backends::Wgpu {
    fn device_tiles() -> Option<&'static dyn DeviceTiles<Self>> {
        Some(&crate::cube::CubeTiles)
    }
}

impl<B: Backend, C: CheckpointStrategy> HostRead for Autodiff<B, C> {}
