//! The CUDA memory behind a tensor of Burn's CUDA backend, lent by address so that NCCL sends from it
//! and receives into it in place, with no copy through the host.
//!
//! UNTESTED ON A GPU: no machine with CUDA was available when this was written; CI compiles it.

use crate::backends::Cuda;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use std::any::Any;

/// A tensor's device memory: the address of its first element and its size. Valid while this value
/// lives, because it holds the tensor (and the storage's own keep-alive handle).
pub struct CudaMemory {
    address: u64,
    bytes: usize,
    tensor: CubeTensor<CudaRuntime>,
    _resource: Box<dyn Any + Send>,
}

impl CudaMemory {
    /// The memory of `tensor` once every kernel queued before on this thread's stream, and on the
    /// stream that wrote the tensor, has run: the values are final when this returns, and no kernel
    /// queued before still reads memory that NCCL may then write (a receive buffer reuses freed
    /// memory of this stream's pool). A strided view is first made contiguous (a device copy).
    pub fn of(tensor: FloatTensor<Cuda>) -> Result<Self, String> {
        let tensor = if tensor.is_contiguous() {
            tensor
        } else {
            burn_cubecl::kernel::into_contiguous(tensor)
        };
        let bytes = tensor.meta.shape().num_elements() * tensor.dtype.size();
        // Asking for the memory first makes this thread's stream wait (on the device) for the
        // stream that wrote the tensor, if another thread's; the sync then waits for both.
        let resource = tensor
            .client
            .get_resource(tensor.handle.clone())
            .map_err(|e| format!("the tensor's CUDA memory: {e:?}"))?;
        cubecl::future::block_on(tensor.client.sync())
            .map_err(|e| format!("waiting for the tensor's kernels: {e:?}"))?;
        let address = resource.resource().ptr;
        Ok(Self {
            address,
            bytes,
            tensor,
            _resource: Box::new(resource),
        })
    }

    /// `len` values of `dtype` on `device`, not initialized, and their memory: a receive buffer.
    pub fn empty(len: usize, dtype: DType, device: &CudaDevice) -> Result<Self, String> {
        let tensor = Tensor::<Cuda, 1>::empty([len], (device, dtype));
        Self::of(tensor.into_primitive().tensor())
    }

    /// The device address of the first value.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The tensor it belongs to, flattened (what a receive filled).
    pub fn into_tensor(self) -> Tensor<Cuda, 1> {
        let Self { tensor, .. } = self;
        let len = tensor.meta.shape().num_elements();
        Tensor::<Cuda, 1>::from_primitive(TensorPrimitive::Float(tensor)).reshape([len])
    }
}
