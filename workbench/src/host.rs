//! Moving values between host memory and a backend's device: the one home of those copies, each
//! counted on the calling thread (a rank's thread), so that the ring can report what a step moved.

use crate::cube::DeviceTiles;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::flex::FlexTensor;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;
use std::borrow::Cow;
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
        cpu_vec(tensor.into_primitive().tensor())
    }
}

/// Elements per parallel task of the CPU tensors' passes below (and of the model's elementwise
/// steps): smaller inputs are one task on the calling thread, as a decode step's are.
pub(crate) const CPU_TASK_ELEMENTS: usize = 1 << 14;

/// `n` zeros, written by rayon's tasks when there are more than [`CPU_TASK_ELEMENTS`]: a large
/// buffer's pages are first touched (faulted in and cleared) on every core instead of on the
/// calling thread alone.
pub(crate) fn zeros_in_parallel(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    let zero = |chunk: &mut [std::mem::MaybeUninit<f32>]| {
        for x in chunk {
            x.write(0.0);
        }
    };
    let spare = &mut v.spare_capacity_mut()[..n];
    if n <= CPU_TASK_ELEMENTS {
        zero(spare);
    } else {
        spare.par_chunks_mut(CPU_TASK_ELEMENTS).for_each(zero);
    }
    // SAFETY: the capacity is at least n, and every one of the first n elements was written above.
    unsafe { v.set_len(n) };
    v
}

/// A CPU tensor's values, row-major: borrowed when they already lie contiguous, else gathered from
/// its strides (rows in parallel). Non-f32 tensors go through `into_data`.
pub(crate) fn cpu_values(tensor: &FlexTensor) -> Cow<'_, [f32]> {
    if let Some(values) = tensor.as_slice::<f32>() {
        return Cow::Borrowed(values);
    }
    if tensor.dtype() != DType::F32 {
        return Cow::Owned(
            tensor
                .clone()
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .expect("converted to f32 above"),
        );
    }
    Cow::Owned(gather(tensor))
}

/// A CPU tensor's values, row-major, owned: its own buffer when it holds it alone and whole,
/// else a copy.
pub(crate) fn cpu_vec(tensor: FlexTensor) -> Vec<f32> {
    let layout = tensor.layout();
    let whole = tensor.is_unique()
        && layout.is_contiguous()
        && layout.start_offset() == 0
        && tensor.bytes().len() == layout.num_elements() * std::mem::size_of::<f32>();
    if whole && tensor.dtype() == DType::F32 {
        // Burn's byte buffer handed over; `into_vec` keeps it when it is aligned for f32.
        return tensor
            .into_data()
            .into_vec::<f32>()
            .expect("an f32 tensor's data");
    }
    cpu_values(&tensor).into_owned()
}

/// `values` of `shape` as a CPU tensor (the vector becomes its buffer).
pub(crate) fn cpu_tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    debug_assert_eq!(values.len(), shape.iter().product::<usize>());
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// A strided f32 tensor copied row-major: each row of its last dimension from the strides, rows in
/// parallel.
fn gather(tensor: &FlexTensor) -> Vec<f32> {
    let layout = tensor.layout();
    let shape = layout.shape().to_vec();
    let strides = layout.strides().to_vec();
    let storage = tensor.storage::<f32>();
    let n: usize = shape.iter().product();
    let mut out = vec![0.0f32; n];
    let Some((&last, outer)) = shape.split_last() else {
        out.copy_from_slice(&storage[layout.start_offset()..layout.start_offset() + n]);
        return out;
    };
    if n == 0 {
        return out;
    }
    let step = strides[outer.len()];
    let rows_per_task = (CPU_TASK_ELEMENTS / last.max(1)).max(1);
    let row_start = |mut row: usize| {
        let mut at = layout.start_offset() as isize;
        for (dim, &size) in outer.iter().enumerate().rev() {
            at += (row % size) as isize * strides[dim];
            row /= size;
        }
        at
    };
    let copy_rows = |(task, chunk): (usize, &mut [f32])| {
        for (i, row) in chunk.chunks_mut(last).enumerate() {
            let at = row_start(task * rows_per_task + i);
            if step == 1 {
                row.copy_from_slice(&storage[at as usize..at as usize + last]);
            } else {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = storage[(at + j as isize * step) as usize];
                }
            }
        }
    };
    if n <= CPU_TASK_ELEMENTS {
        out.chunks_mut(rows_per_task * last)
            .enumerate()
            .for_each(copy_rows);
    } else {
        out.par_chunks_mut(rows_per_task * last)
            .enumerate()
            .for_each(copy_rows);
    }
    out
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
