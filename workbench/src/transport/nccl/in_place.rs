//! NCCL's in-place path: blocks that are tensors of Burn's CUDA backend go from their own GPU memory
//! and arrive in fresh tensors on this rank's GPU (only an exchange's header crosses the host), and
//! an f32 tensor is all-reduced the same way.

use super::NcclTransport;
use crate::backends::Cuda;
use crate::block::Block;
use crate::cube::CudaMemory;
use crate::dtype::Dtype;
use crate::error::TransportError;
use crate::transport::Payload;
use crate::transport::wire::{self, Head};
use burn::tensor::DType;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::safe::ReduceOp;
use std::sync::Arc;

/// CubeCL's memory seen by cudarc as a slice of `T` (bytes, to send and receive; f32, to reduce)
/// that cudarc does not own: the slice is handed back (leaked, never freed by cudarc) when this is
/// dropped, and the memory lives as long as the tensor that [`CudaMemory`] holds.
struct Lent<T = u8> {
    slice: Option<CudaSlice<T>>,
    memory: Option<CudaMemory>,
}

impl<T> Lent<T> {
    fn new(stream: &Arc<CudaStream>, memory: CudaMemory) -> Self {
        let len = memory.bytes() / size_of::<T>();
        // SAFETY: the address and size are those of a live CubeCL allocation in this GPU's
        // primary context (CubeCL and cudarc both retain that context), kept alive by `memory`
        // for as long as the slice exists; cudarc never frees it (`Drop` leaks the slice). The
        // callers lend f32 memory as f32 or as bytes.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(memory.address(), len) };
        Self {
            slice: Some(slice),
            memory: Some(memory),
        }
    }

    fn slice(&self) -> &CudaSlice<T> {
        self.slice
            .as_ref()
            .expect("a lent slice lives until the value is dropped")
    }

    fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        self.slice
            .as_mut()
            .expect("a lent slice lives until the value is dropped")
    }

    /// The memory, given back by cudarc.
    fn into_memory(mut self) -> CudaMemory {
        if let Some(slice) = self.slice.take() {
            slice.leak();
        }
        self.memory.take().expect("taken once")
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            slice.leak();
        }
    }
}

/// A posted send: the header and the blocks' memory, alive until the stream has run it.
pub(super) struct Sending {
    _header: CudaSlice<f32>,
    _blocks: Vec<Lent>,
}

/// A posted receive: the header's buffer, the heads it must list, and the tensors it fills.
pub(super) struct Receive {
    header: CudaSlice<f32>,
    expected: Vec<Head>,
    blocks: Vec<Lent>,
}

/// Every block's CUDA memory, once the kernels computing it have run; None when the payload is
/// empty or a block is not a tensor of Burn's CUDA backend (it is then staged).
pub(super) fn memories(
    payload: &Payload,
    rank: usize,
) -> Result<Option<Vec<CudaMemory>>, TransportError> {
    if payload.is_empty() {
        return Ok(None);
    }
    let mut memories = Vec::with_capacity(payload.len());
    for block in payload {
        match block.cuda_memory() {
            None => return Ok(None),
            Some(Ok(memory)) => memories.push(memory),
            Some(Err(why)) => {
                return Err(TransportError::RankFailed {
                    rank,
                    message: format!("the {:?} block's CUDA memory: {why}", block.kind),
                });
            }
        }
    }
    Ok(Some(memories))
}

/// Queues one NCCL group: the header and every block to `to`; from `from`, a header and blocks
/// shaped like this rank's own (equal shards), into fresh tensors.
pub(super) fn post(
    t: &NcclTransport,
    to: usize,
    from: usize,
    payload: &Payload,
    memories: Vec<CudaMemory>,
) -> Result<(Sending, Receive), TransportError> {
    let header = wire::header(payload);
    crate::host::count_bytes((header.len() * size_of::<f32>()) as u64);
    let (send_header, mut recv_header) = t.stage(&header)?;
    let sends: Vec<Lent> = memories
        .into_iter()
        .map(|m| Lent::new(&t.stream, m))
        .collect();
    let mut receives = Vec::with_capacity(payload.len());
    for block in payload {
        let dtype = match block.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::Bf16 => DType::BF16,
        };
        let memory = CudaMemory::empty(block.len(), dtype, &t.device)
            .map_err(|e| t.failed("allocate a receive tensor", e))?;
        receives.push(Lent::new(&t.stream, memory));
    }
    {
        let mut group = t.comm.group();
        group
            .send(send_header.as_view(), to as i32)
            .map_err(|e| t.failed("ncclSend", e))?;
        group
            .recv(recv_header.as_view_mut(), from as i32)
            .map_err(|e| t.failed("ncclRecv", e))?;
        for (send, receive) in sends.iter().zip(receives.iter_mut()) {
            group
                .send(send.slice().as_view(), to as i32)
                .map_err(|e| t.failed("ncclSend", e))?;
            group
                .recv(receive.slice_mut().as_view_mut(), from as i32)
                .map_err(|e| t.failed("ncclRecv", e))?;
        }
    }
    let send = Sending {
        _header: send_header,
        _blocks: sends,
    };
    let receive = Receive {
        header: recv_header,
        expected: payload.iter().map(|b| Head::of(b)).collect(),
        blocks: receives,
    };
    Ok((send, receive))
}

/// Waits for the group, checks the header against the shapes received into, and gives the
/// filled tensors as blocks on this rank's GPU.
pub(super) fn finish(
    t: &mut NcclTransport,
    receive: Receive,
    from: usize,
) -> Result<Payload, TransportError> {
    let header = t.download(&receive.header)?;
    crate::host::count_bytes((header.len() * size_of::<f32>()) as u64);
    let (heads, _) = wire::read_header(&header, t.rank, from)?;
    if heads != receive.expected {
        return Err(TransportError::RankFailed {
            rank: from,
            message: format!(
                "rank {} received into {:?} but rank {from} sent {heads:?} (NCCL moves equal shards)",
                t.rank, receive.expected
            ),
        });
    }
    Ok(receive
        .blocks
        .into_iter()
        .zip(heads)
        .map(|(lent, head)| {
            let flat = lent.into_memory().into_tensor();
            Arc::new(Block::from_flat_on_device::<Cuda>(
                head.kind, head.shape, flat,
            ))
        })
        .collect())
}

/// An f32 block summed over the ranks by NCCL from its own GPU memory into a fresh tensor on this
/// rank's GPU, which it returns once the NCCL stream has run: nothing crosses the host. NCCL's ring
/// all-reduce reduces each chunk once and forwards the result, so every rank gets the same bits.
pub(super) fn all_reduce(
    t: &mut NcclTransport,
    block: &Block,
    memory: CudaMemory,
) -> Result<Block, TransportError> {
    let send = Lent::<f32>::new(&t.stream, memory);
    let reduced = CudaMemory::empty(block.len(), DType::F32, &t.device)
        .map_err(|e| t.failed("allocate the reduced tensor", e))?;
    let mut receive = Lent::<f32>::new(&t.stream, reduced);
    t.comm
        .all_reduce(send.slice(), receive.slice_mut(), &ReduceOp::Sum)
        .map_err(|e| t.failed("ncclAllReduce", e))?;
    t.settle()?;
    drop(send);
    let flat = receive.into_memory().into_tensor();
    Ok(Block::from_flat_on_device::<Cuda>(
        block.kind,
        block.shape.clone(),
        flat,
    ))
}
