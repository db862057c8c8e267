//! Blocks: the payload that travels between ranks and that tile kernels read, detached from any
//! autodiff graph, held on the host (the fused CPU kernel, MPI and NCCL staging) or as a tensor of
//! the rank's backend (the generic kernel), in f32 or bf16 ([`Dtype`]). Below both the ring and the
//! transports, which share it.

use crate::dtype::{self, Dtype};
use crate::host::{self, HostRead};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive, backend::Backend};
use half::bf16;
use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

/// What a block carries; traffic is counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockKind {
    /// Keys.
    K,
    /// Values.
    V,
    /// Queries.
    Q,
    /// The output's gradient.
    DOut,
    /// The output (it travels only in head × context parallelism's all-to-all).
    Out,
    /// The forward's log-sum-exp.
    Lse,
    /// δ = rowsum(dO ∘ O).
    Delta,
    /// Keys' gradient.
    DK,
    /// Values' gradient.
    DV,
    /// Queries' gradient.
    DQ,
    /// An all-reduce's vector.
    Reduce,
    /// Attention sinks, one logit a query head (they stay on their rank).
    Sinks,
    /// The sinks' gradient.
    DSinks,
}

impl BlockKind {
    /// Every kind, at its code ([`BlockKind::code`] is the inverse): how a kind travels on a wire
    /// or in gathered accounts.
    pub const ALL: [BlockKind; 13] = [
        BlockKind::K,
        BlockKind::V,
        BlockKind::Q,
        BlockKind::DOut,
        BlockKind::Lse,
        BlockKind::Delta,
        BlockKind::DK,
        BlockKind::DV,
        BlockKind::DQ,
        BlockKind::Reduce,
        BlockKind::Sinks,
        BlockKind::DSinks,
        BlockKind::Out,
    ];

    /// Its code: its index in [`BlockKind::ALL`]. The match is exhaustive, so that a new kind
    /// cannot travel as another.
    pub fn code(self) -> usize {
        match self {
            BlockKind::K => 0,
            BlockKind::V => 1,
            BlockKind::Q => 2,
            BlockKind::DOut => 3,
            BlockKind::Lse => 4,
            BlockKind::Delta => 5,
            BlockKind::DK => 6,
            BlockKind::DV => 7,
            BlockKind::DQ => 8,
            BlockKind::Reduce => 9,
            BlockKind::Sinks => 10,
            BlockKind::DSinks => 11,
            BlockKind::Out => 12,
        }
    }

    /// The kind of `code`, if it is one.
    pub fn from_code(code: usize) -> Option<BlockKind> {
        BlockKind::ALL.get(code).copied()
    }
}

/// Where a block's values live.
#[derive(Clone)]
enum Values {
    /// Host f32, row-major.
    Host(Vec<f32>),
    /// Host bf16, row-major: half the bytes, read as f32 (exactly).
    HostBf16(Vec<bf16>),
    /// A float tensor of some backend, type-erased so that transports need not know the backend.
    Device(DeviceValues),
}

/// A backend's float tensor, flattened to one dimension (a reshape is free on every backend) and
/// behind `Any`, with the one function that reads it to the host.
#[derive(Clone)]
struct DeviceValues {
    flat: Arc<dyn Any + Send + Sync>,
    read: fn(&(dyn Any + Send + Sync)) -> Vec<f32>,
    /// The CUDA memory behind the tensor, when it is one of Burn's CUDA backend's.
    #[cfg(feature = "cuda")]
    cuda_memory: fn(&(dyn Any + Send + Sync)) -> Option<Result<crate::cube::CudaMemory, String>>,
    /// The tensor's element type.
    dtype: Dtype,
}

/// The tensor behind `values` when it is one of `B`'s, as f32 (a bf16 tensor is widened, exactly).
fn flat_of<B: Backend>(values: &(dyn Any + Send + Sync)) -> Option<Tensor<B, 1>> {
    let primitive = values.downcast_ref::<FloatTensor<B>>()?.clone();
    let flat = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(primitive));
    Some(match flat.dtype() {
        DType::F32 => flat,
        _ => flat.cast(FloatDType::F32),
    })
}

fn read_device<B: HostRead>(values: &(dyn Any + Send + Sync)) -> Vec<f32> {
    host::read(flat_of::<B>(values).expect("read is stored with the tensor's own backend"))
}

#[cfg(feature = "cuda")]
fn cuda_memory_of<B: HostRead>(
    values: &(dyn Any + Send + Sync),
) -> Option<Result<crate::cube::CudaMemory, String>> {
    let primitive = values.downcast_ref::<FloatTensor<B>>()?.clone();
    B::cuda_memory(primitive)
}

#[derive(Clone)]
/// A block of values (f32 or bf16) and its shape, on the host or on a device.
pub struct Block {
    /// What it carries.
    pub kind: BlockKind,
    /// Its shape.
    pub shape: Vec<usize>,
    values: Values,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match &self.values {
            Values::Host(_) | Values::HostBf16(_) => "host",
            Values::Device(_) => "device",
        };
        let dtype = self.dtype();
        write!(
            f,
            "Block({:?}, {:?}, {dtype}, {place})",
            self.kind, self.shape
        )
    }
}

impl PartialEq for Block {
    /// Same kind, shape, element type and values (device values are read to compare).
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.shape == other.shape
            && self.dtype() == other.dtype()
            && self.host_values() == other.host_values()
    }
}

impl Block {
    /// A host block of `data` shaped `shape`.
    pub fn host(kind: BlockKind, shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self {
            kind,
            shape,
            values: Values::Host(data),
        }
    }

    /// A host block of bf16 `data` shaped `shape`.
    pub fn host_bf16(kind: BlockKind, shape: Vec<usize>, data: Vec<bf16>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self {
            kind,
            shape,
            values: Values::HostBf16(data),
        }
    }

    /// The values as bf16 on the host: borrowed when they are kept so, else rounded (device values
    /// read first, counted).
    pub fn host_bf16_values(&self) -> Cow<'_, [bf16]> {
        match &self.values {
            Values::HostBf16(data) => Cow::Borrowed(data),
            _ => Cow::Owned(dtype::to_bf16(&self.host_values())),
        }
    }

    /// A host block of zeros.
    pub fn zeros(kind: BlockKind, shape: Vec<usize>) -> Self {
        let len = shape.iter().product();
        Self::host(kind, shape, vec![0.0; len])
    }

    /// A block of zeros on `device`.
    pub fn zeros_on<B: HostRead>(kind: BlockKind, shape: Vec<usize>, device: &B::Device) -> Self {
        let len = shape.iter().product::<usize>();
        Self::flat_on_device(
            kind,
            shape,
            Tensor::<B, 1>::zeros([len], device),
            Dtype::F32,
        )
    }

    /// A block like this one (kind, shape, host or `device`) whose every value is NaN: a test hook's
    /// poisoned tile input.
    pub fn poisoned<B: HostRead>(&self, device: &B::Device) -> Self {
        let shape = self.shape.clone();
        if self.is_on_device() {
            let nan = Tensor::<B, 1>::full([self.len()], f32::NAN, device);
            Self::flat_on_device(self.kind, shape, nan, Dtype::F32)
        } else {
            Self::host(self.kind, shape, vec![f32::NAN; self.len()])
        }
    }

    /// The tensor itself as a block on its device: nothing is copied.
    pub fn on_device<B: HostRead, const D: usize>(kind: BlockKind, tensor: Tensor<B, D>) -> Self {
        let shape = tensor.dims().to_vec();
        let flat = tensor.reshape([shape.iter().product::<usize>()]);
        Self::from_flat_on_device(kind, shape, flat)
    }

    fn flat_on_device<B: HostRead>(
        kind: BlockKind,
        shape: Vec<usize>,
        flat: Tensor<B, 1>,
        dtype: Dtype,
    ) -> Self {
        let primitive: FloatTensor<B> = flat.into_primitive().tensor();
        Self {
            kind,
            shape,
            values: Values::Device(DeviceValues {
                flat: Arc::new(primitive),
                read: read_device::<B>,
                #[cfg(feature = "cuda")]
                cuda_memory: cuda_memory_of::<B>,
                dtype,
            }),
        }
    }

    /// A flat tensor of `B` (any element type) as a block of `shape` on its device: nothing is copied.
    pub fn from_flat_on_device<B: HostRead>(
        kind: BlockKind,
        shape: Vec<usize>,
        flat: Tensor<B, 1>,
    ) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), flat.dims()[0]);
        let dtype = match flat.dtype() {
            DType::BF16 => Dtype::Bf16,
            _ => Dtype::F32,
        };
        Self::flat_on_device(kind, shape, flat, dtype)
    }

    /// The CUDA memory of a block held as a tensor of Burn's CUDA backend, once the kernels that
    /// compute it have run (None for any other block): what NCCL sends from in place.
    #[cfg(feature = "cuda")]
    pub fn cuda_memory(&self) -> Option<Result<crate::cube::CudaMemory, String>> {
        match &self.values {
            Values::Device(d) => (d.cuda_memory)(d.flat.as_ref()),
            _ => None,
        }
    }

    /// The tensor's values copied to the host, as a block of kind `kind`.
    pub fn from_tensor<B: HostRead, const D: usize>(kind: BlockKind, tensor: Tensor<B, D>) -> Self {
        let shape = tensor.dims().to_vec();
        Self::host(kind, shape, host::read(tensor))
    }

    /// Whether the values are a device tensor.
    pub fn is_on_device(&self) -> bool {
        matches!(self.values, Values::Device(_))
    }

    /// The element type its values are kept (and sent) in.
    pub fn dtype(&self) -> Dtype {
        match &self.values {
            Values::Host(_) => Dtype::F32,
            Values::HostBf16(_) => Dtype::Bf16,
            Values::Device(d) => d.dtype,
        }
    }

    /// The block kept in `dtype`: its values rounded to it (bf16: to the nearest, ties to even) and
    /// stored at its size, on the host or as a tensor of `B` of that type on its device; widening a
    /// bf16 block to f32 is exact. A device block needs a backend that stores and computes `dtype`
    /// (`RingConfig::check` asks before a pass).
    pub fn in_dtype<B: HostRead>(self, dtype: Dtype, device: &B::Device) -> Block {
        if self.dtype() == dtype {
            return self;
        }
        let Block {
            kind,
            shape,
            values,
        } = self;
        let values = match (values, dtype) {
            (Values::Host(data), Dtype::Bf16) => Values::HostBf16(dtype::to_bf16(&data)),
            (Values::HostBf16(data), Dtype::F32) => Values::Host(dtype::from_bf16(&data)),
            (Values::Device(d), _) => {
                let flat = flat_of::<B>(d.flat.as_ref())
                    .expect("a device block is converted on its own backend")
                    .to_device(device);
                let target = match dtype {
                    Dtype::F32 => FloatDType::F32,
                    Dtype::Bf16 => FloatDType::BF16,
                };
                return Self::flat_on_device(kind, shape, flat.cast(target), dtype);
            }
            (values, _) => values,
        };
        Block {
            kind,
            shape,
            values,
        }
    }

    /// The values on the host, as f32: borrowed when they are there in f32, widened from bf16, or
    /// read from the device (counted).
    pub fn host_values(&self) -> Cow<'_, [f32]> {
        match &self.values {
            Values::Host(data) => Cow::Borrowed(data),
            Values::HostBf16(data) => Cow::Owned(dtype::from_bf16(data)),
            Values::Device(d) => Cow::Owned((d.read)(d.flat.as_ref())),
        }
    }

    /// Mutable host f32 values; a device block is first read to the host (counted) and a bf16 one
    /// widened, and it stays so (an f32 host block) until [`Block::in_dtype`] narrows it again.
    pub fn host_values_mut(&mut self) -> &mut [f32] {
        match &self.values {
            Values::Device(d) => self.values = Values::Host((d.read)(d.flat.as_ref())),
            Values::HostBf16(data) => self.values = Values::Host(dtype::from_bf16(data)),
            Values::Host(_) => {}
        }
        match &mut self.values {
            Values::Host(data) => data,
            _ => unreachable!("made an f32 host block above"),
        }
    }

    /// The block as a tensor of backend `B` on `device`: the tensor itself when it is one of `B`'s
    /// (no copy), else its host values placed on `device` (counted).
    pub fn tensor<B: Backend, const D: usize>(&self, device: &B::Device) -> Tensor<B, D> {
        let shape: [usize; D] = self
            .shape
            .clone()
            .try_into()
            .expect("a block is read with its own number of dimensions");
        self.flat(device).reshape(shape)
    }

    /// The values as a 1-d tensor of `B` on `device` (no copy when they are one there already; a
    /// tensor of another device of `B`, a peer rank's, moves device to device).
    fn flat<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1> {
        if let Values::Device(d) = &self.values
            && let Some(flat) = flat_of::<B>(d.flat.as_ref())
        {
            return flat.to_device(device);
        }
        host::place(self.host_values().into_owned(), [self.len()], device)
    }

    /// The block as an f32 tensor of backend `B` on `device`: a bf16 block's values widened
    /// (exactly). What the kernels compute with, whatever type the block is kept and sent in (a
    /// CubeCL backend reads both operands of an elementwise op in the first one's type, so a bf16
    /// tensor must never meet an f32 one).
    pub fn f32_tensor<B: Backend, const D: usize>(&self, device: &B::Device) -> Tensor<B, D> {
        f32_of(self.tensor(device))
    }

    /// The block as a tensor of `B` on `device`, consuming it.
    pub fn into_tensor<B: Backend, const D: usize>(self, device: &B::Device) -> Tensor<B, D> {
        self.tensor(device)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its values, at its element type's size.
    pub fn bytes(&self) -> u64 {
        (self.len() * self.dtype().size()) as u64
    }

    /// A copy in this rank's own memory of `device`: a device block's values added to fresh zeros
    /// there (queued on this thread: the caller settles before dropping `self`), a host block cloned.
    pub fn local_copy<B: HostRead>(&self, device: &B::Device) -> Block {
        if !self.is_on_device() {
            return self.clone();
        }
        let mut copy = Self::zeros_on::<B>(self.kind, self.shape.clone(), device);
        copy.add_assign::<B>(self, device);
        copy.in_dtype::<B>(self.dtype(), device)
    }

    /// Elementwise `self += other` (shapes were fixed when the accumulator was created): on the device
    /// when `self` is a device block, on the host when it is a host block. The sum is taken in f32
    /// and kept in `self`'s element type (a bf16 accumulator rounds it: a merge in bf16).
    pub fn add_assign<B: HostRead>(&mut self, other: &Block, device: &B::Device) {
        debug_assert_eq!(self.shape, other.shape);
        let dtype = self.dtype();
        if self.is_on_device() {
            let sum = f32_of(self.flat::<B>(device)) + f32_of(other.flat::<B>(device));
            *self =
                Self::flat_on_device(self.kind, std::mem::take(&mut self.shape), sum, Dtype::F32);
        } else {
            let other = other.host_values();
            for (a, b) in self.host_values_mut().iter_mut().zip(other.iter()) {
                *a += b;
            }
        }
        if dtype != Dtype::F32 {
            *self = std::mem::replace(self, Block::zeros(self.kind, Vec::new()))
                .in_dtype::<B>(dtype, device);
        }
    }
}

/// `x` in f32: itself, or a bf16 tensor widened (exactly).
fn f32_of<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == DType::F32 {
        x
    } else {
        x.cast(FloatDType::F32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    /// A bf16 device block reads as an f32 tensor of the same values, and adding an f32 block into
    /// it sums in f32 and rounds once: 1 + (2⁻⁸ + 2⁻¹⁷) rounds up to 1 + 2⁻⁷ in bf16, where rounding
    /// the addend first (to 2⁻⁸) would leave a tie that rounds to 1. (Flex promotes a mixed-type
    /// add by itself; a CubeCL backend would not, which is why both sides are widened first: only
    /// the GPU check can show that part.)
    #[test]
    fn a_bf16_device_block_reads_and_adds_in_f32() {
        let device = Default::default();
        let on = |v: Vec<f32>| Tensor::<Flex, 1>::from_data(TensorData::new(v, [2]), &device);
        let mut acc = Block::on_device(BlockKind::DK, on(vec![1.0, -3.0]))
            .in_dtype::<Flex>(Dtype::Bf16, &device);
        let read = acc.f32_tensor::<Flex, 1>(&device);
        assert_eq!(read.dtype(), DType::F32);
        assert_eq!(read.into_data().into_vec::<f32>().unwrap(), [1.0, -3.0]);
        let small = 2f32.powi(-8) + 2f32.powi(-17);
        acc.add_assign::<Flex>(
            &Block::on_device(BlockKind::DK, on(vec![small, 0.5])),
            &device,
        );
        assert_eq!(acc.dtype(), Dtype::Bf16);
        assert_eq!(acc.host_values().to_vec(), [1.0 + 2f32.powi(-7), -2.5]);
    }
}
