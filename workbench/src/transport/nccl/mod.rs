//! Transport over NCCL (cudarc's bindings, loaded at run time): one GPU and one process per rank.
//!
//! UNTESTED ON A GPU: no machine with CUDA was available when this was written. CI compiles it
//! (`cargo check --features nccl` needs no CUDA thanks to dynamic loading) and checks that a machine
//! without CUDA gets [`TransportError::Unavailable`] instead of a panic.
//!
//! A ring exchange is one NCCL group (send to `to`, receive from `from`) queued on the rank's stream,
//! so it runs while the ranks compute. Both sides of an exchange move the same shapes (equal shards),
//! so what a rank receives is shaped like what it sends. Ranks meet through a file holding NCCL's
//! unique id, written by rank 0 ([`rendezvous`]); joining and every wait end within the rank's
//! timeout.
//!
//! Two ways a payload goes:
//! - **In place** (with `cuda`, when every block is a tensor of Burn's CUDA backend): NCCL sends from
//!   the tensors' own memory and receives into fresh tensors on the rank's GPU; only the header (a few
//!   words: kinds, types, shapes) is staged through the host, and `wait` checks it against the
//!   shapes received into.
//! - **Staged** (host blocks: the CPU backend's ranks): the wire format's message is copied to the
//!   device, exchanged, and copied back in `wait`.
//!
//! A block all-reduce (a training step's gradient) goes the same two ways: a CUDA tensor is summed
//! by `ncclAllReduce` from its own memory into a fresh tensor; anything else is staged.

use super::wire::{decode, encode};
use super::{Payload, Pending, Transport};
use crate::block::Block;
use crate::error::TransportError;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "cuda")]
mod in_place;
pub mod rendezvous;

/// A posted receive: the device buffers it fills.
enum Incoming {
    /// One wire-format message.
    Staged(CudaSlice<f32>),
    /// The header, then each block's values in a tensor of its own.
    #[cfg(feature = "cuda")]
    InPlace(in_place::Receive),
}

/// One rank of an NCCL communicator: each exchange is a send and a receive queued on its CUDA stream.
pub struct NcclTransport {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    /// Receives queued on the stream, by tag, with the device buffers they fill.
    incoming: HashMap<u64, Incoming>,
    /// Send buffers (staged messages, lent tensors) that must live until the stream has run their
    /// sends.
    outgoing: Vec<Box<dyn Send>>,
    /// How long any wait on the peers may last.
    timeout: Duration,
    /// Whether a wait ran out: the stream may still be running (or stuck in) a collective.
    stalled: bool,
    /// The GPU, as Burn's CUDA backend names it: where in-place receives are allocated.
    #[cfg(feature = "cuda")]
    device: cubecl::cuda::CudaDevice,
}

/// A joined communicator handed back from the thread that joined it.
struct Joined(Result<Comm, cudarc::nccl::result::NcclError>);

// SAFETY: the communicator is created on the joining thread and from then on used by one thread at
// a time (the rank's); NCCL allows a communicator to move between threads.
unsafe impl Send for Joined {}

impl Drop for NcclTransport {
    /// The stream may still be running sends from `outgoing` and receives into `incoming`: freeing
    /// those buffers first would let NCCL touch freed memory. So the drop waits for the stream (at
    /// most the timeout, and not at all once a wait has run out); if it does not finish, the
    /// buffers are leaked rather than freed under it, and the communicator is aborted (cudarc's
    /// `Comm` aborts on drop), which ends what it still runs.
    fn drop(&mut self) {
        if self.stalled || self.settle().is_err() {
            std::mem::forget(std::mem::take(&mut self.outgoing));
            std::mem::forget(std::mem::take(&mut self.incoming));
        }
    }
}

impl std::fmt::Debug for NcclTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclTransport {{ rank: {}, size: {} }}",
            self.rank, self.size
        )
    }
}

// SAFETY: the communicator and stream are used by one thread at a time (the rank's `Comm` sits
// behind a mutex); NCCL and CUDA allow that handoff between threads.
unsafe impl Send for NcclTransport {}

fn unavailable(rank: usize, what: &'static str, why: impl ToString) -> TransportError {
    TransportError::Unavailable {
        rank,
        what,
        why: why.to_string(),
    }
}

impl NcclTransport {
    /// Joins an NCCL communicator of `size` ranks on GPU `device`. Rank 0 publishes NCCL's unique
    /// id in a file of this run's own name beside `id_file` ([`rendezvous::id_path`]: `.KEY` from
    /// the launcher's job id when it has one), written whole; the others wait for it. Waiting for
    /// the id, joining, and every later wait on the peers end within `timeout` with a typed error
    /// ([`TransportError::Timeout`], [`TransportError::Deadline`]). Once every rank has joined,
    /// rank 0 removes the file.
    pub fn from_id_file(
        rank: usize,
        size: usize,
        device: usize,
        id_file: &Path,
        timeout: Duration,
    ) -> Result<Self, TransportError> {
        // SAFETY: these only try to open the shared libraries.
        let (cuda, nccl) = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nccl::sys::is_culib_present(),
            )
        };
        if !cuda {
            return Err(unavailable(
                rank,
                "CUDA",
                "libcuda was not found (no NVIDIA driver on this machine)",
            ));
        }
        if !nccl {
            return Err(unavailable(rank, "NCCL", "libnccl was not found"));
        }
        let path = rendezvous::id_path(id_file, rendezvous::run_key_from_env().as_deref());
        let id = if rank == 0 {
            let id = Id::new().map_err(|e| unavailable(rank, "NCCL", format!("{e:?}")))?;
            let bytes: [u8; rendezvous::ID_BYTES] = std::array::from_fn(|i| id.internal()[i] as u8);
            rendezvous::publish_id(&path, &bytes, rank)?;
            id
        } else {
            let bytes = rendezvous::await_id(&path, rank, timeout)?;
            Id::uninit(bytes.map(|b| b as std::ffi::c_char))
        };
        let context = CudaContext::new(device)
            .map_err(|e| unavailable(rank, "CUDA device", format!("{e:?}")))?;
        // A stream of its own, non-blocking: NCCL's transfers never wait for (or hold up) the
        // compute streams of Burn's CUDA backend on the same GPU.
        let stream = context
            .new_stream()
            .map_err(|e| unavailable(rank, "CUDA stream", format!("{e:?}")))?;
        // ncclCommInitRank returns once every rank has called it: a peer that never comes would
        // block it for good, so it runs on a thread of its own under the deadline.
        let joining = stream.clone();
        let comm = rendezvous::within(timeout, rank, "joining the NCCL communicator", move || {
            joining.context().bind_to_thread()?;
            Ok(Joined(Comm::from_rank(joining, rank, size, id)))
        })?
        .map_err(|e: cudarc::driver::DriverError| {
            unavailable(rank, "CUDA device", format!("{e:?}"))
        })?
        .0
        .map_err(|e| unavailable(rank, "NCCL", format!("{e:?}")))?;
        if rank == 0 {
            // Every rank has joined, so every rank has read the id: the file has done its job.
            let _ = std::fs::remove_file(&path);
        }
        Ok(Self {
            comm,
            stream,
            rank,
            size,
            timeout,
            stalled: false,
            incoming: HashMap::new(),
            outgoing: Vec::new(),
            #[cfg(feature = "cuda")]
            device: cubecl::cuda::CudaDevice { index: device },
        })
    }

    /// Waits, at most the rank's timeout, until the stream has run everything queued on it so far
    /// (the exchanges and all-reduces posted, the copies after them). A wait that runs out marks the
    /// transport stalled: its drop then leaves the buffers the stream may still use allocated.
    fn settle(&mut self) -> Result<(), TransportError> {
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| self.failed("record a CUDA event", e))?;
        let rank = self.rank;
        let waited =
            rendezvous::poll_until(self.timeout, rank, "an NCCL exchange or all-reduce", || {
                event
                    .try_is_complete()
                    .map_err(|e| TransportError::RankFailed {
                        rank,
                        message: format!("the NCCL stream: {e:?}"),
                    })
            });
        if waited.is_err() {
            self.stalled = true;
        }
        waited
    }

    /// A message copied to the device to be sent, and a zeroed buffer of its length to receive the
    /// peer's into (equal shards: the peer's message is as long).
    fn stage(&self, message: &[f32]) -> Result<(CudaSlice<f32>, CudaSlice<f32>), TransportError> {
        let send = self
            .stream
            .clone_htod(message)
            .map_err(|e| self.failed("copy to device", e))?;
        let recv = self
            .stream
            .alloc_zeros::<f32>(message.len())
            .map_err(|e| self.failed("alloc", e))?;
        Ok((send, recv))
    }

    /// Copies a device buffer to the host once the stream has run everything queued before (within
    /// the rank's timeout).
    fn download(&mut self, buffer: &CudaSlice<f32>) -> Result<Vec<f32>, TransportError> {
        self.settle()?;
        let host = self
            .stream
            .clone_dtoh(buffer)
            .map_err(|e| self.failed("copy to host", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.failed("synchronize", e))?;
        Ok(host)
    }

    fn failed(&self, what: &'static str, e: impl std::fmt::Debug) -> TransportError {
        TransportError::RankFailed {
            rank: self.rank,
            message: format!("{what}: {e:?}"),
        }
    }
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn needs_equal_shards(&self) -> Option<&'static str> {
        Some("NCCL")
    }

    fn send_recv(
        &mut self,
        to: usize,
        from: usize,
        tag: u64,
        payload: Payload,
    ) -> Result<Pending, TransportError> {
        #[cfg(feature = "cuda")]
        if let Some(memories) = in_place::memories(&payload, self.rank)? {
            let (send, receive) = in_place::post(self, to, from, &payload, memories)?;
            self.outgoing.push(Box::new(send));
            self.incoming.insert(tag, Incoming::InPlace(receive));
            return Ok(Pending { from, tag });
        }
        let (send, mut recv) = self.stage(&encode(&payload))?;
        {
            let mut group = self.comm.group();
            group
                .send(send.as_view(), to as i32)
                .map_err(|e| self.failed("ncclSend", e))?;
            group
                .recv(recv.as_view_mut(), from as i32)
                .map_err(|e| self.failed("ncclRecv", e))?;
        }
        self.outgoing.push(Box::new(send));
        self.incoming.insert(tag, Incoming::Staged(recv));
        Ok(Pending { from, tag })
    }

    fn commit(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError> {
        let incoming = self
            .incoming
            .remove(&pending.tag)
            .ok_or(TransportError::Protocol {
                rank: self.rank,
                peer: pending.from,
                expected: pending.tag,
                got: 0,
            })?;
        let payload = match incoming {
            Incoming::Staged(buffer) => {
                let message = self.download(&buffer)?;
                decode(&message, self.rank, pending.from)
            }
            #[cfg(feature = "cuda")]
            Incoming::InPlace(receive) => in_place::finish(self, receive, pending.from),
        };
        // The stream has run everything queued before this receive, the sends included.
        self.outgoing.clear();
        payload
    }

    fn all_reduce_sum(&mut self, _tag: u64, data: &mut [f32]) -> Result<(), TransportError> {
        if data.is_empty() || self.size == 1 {
            return Ok(());
        }
        // NCCL's ring all-reduce reduces each chunk once and forwards the result, so every rank gets
        // the same bits.
        let mut buffer = self
            .stream
            .clone_htod(data)
            .map_err(|e| self.failed("copy to device", e))?;
        self.comm
            .all_reduce_in_place(&mut buffer, &ReduceOp::Sum)
            .map_err(|e| self.failed("ncclAllReduce", e))?;
        data.copy_from_slice(&self.download(&buffer)?);
        Ok(())
    }

    /// A tensor of Burn's CUDA backend (f32) is reduced from its own GPU memory; any other block is
    /// staged through the host.
    fn all_reduce_block(&mut self, tag: u64, block: Block) -> Result<Block, TransportError> {
        #[cfg(feature = "cuda")]
        if block.dtype() == crate::dtype::Dtype::F32
            && let Some(memory) = block.cuda_memory()
        {
            let memory = memory.map_err(|why| self.failed("the block's CUDA memory", why))?;
            return in_place::all_reduce(self, &block, memory);
        }
        crate::transport::all_reduce_staged(self, tag, block)
    }

    /// An all-reduce of one value, waited for on the host: no rank gets past it before every rank has
    /// joined it. (The default barrier, an all-reduce of nothing, would return at once here.)
    fn barrier(&mut self, tag: u64) -> Result<(), TransportError> {
        let mut token = [1.0f32];
        self.all_reduce_sum(tag, &mut token)?;
        if token[0] != self.size as f32 {
            return Err(self.failed(
                "barrier",
                format!("{} ranks joined, expected {}", token[0], self.size),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CUDA's presence, asked of the driver library itself.
    fn cuda_present() -> bool {
        // SAFETY: only tries to open the library.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }

    /// One rank: an exchange with itself, an all-reduce and the barrier, all on the GPU.
    fn one_rank_round_trip() {
        let file = std::env::temp_dir().join(format!("ringbench-nccl-one-{}", std::process::id()));
        let mut t = NcclTransport::from_id_file(0, 1, 0, &file, Duration::from_secs(10)).unwrap();
        let block = crate::block::Block::host(
            crate::block::BlockKind::K,
            vec![2, 3],
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        );
        let pending = t.send_recv(0, 0, 1, vec![Arc::new(block.clone())]).unwrap();
        t.commit().unwrap();
        let got = t.wait(pending).unwrap();
        assert_eq!(*got[0], block);
        let mut data = [1.5f32, -2.0];
        t.all_reduce_sum(2, &mut data).unwrap();
        assert_eq!(data, [1.5, -2.0]);
        t.barrier(3).unwrap();
        #[cfg(feature = "cuda")]
        one_rank_in_place(&mut t);
    }

    /// CUDA tensors (f32 and bf16) sent to this rank itself from their own memory: they arrive as
    /// tensors on the GPU, equal, and only the headers crossed the host (this thread's own count).
    /// Then an f32 tensor all-reduced in place: nothing crosses.
    #[cfg(feature = "cuda")]
    fn one_rank_in_place(t: &mut NcclTransport) {
        use crate::backends::Cuda;
        use burn::tensor::{FloatDType, Tensor, TensorData};
        let device = cubecl::cuda::CudaDevice { index: 0 };
        let values: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 0.5).collect();
        let k = Tensor::<Cuda, 2>::from_data(TensorData::new(values, [2, 3]), &device);
        let payload: Payload = vec![
            Arc::new(crate::block::Block::on_device(
                crate::block::BlockKind::K,
                k.clone(),
            )),
            Arc::new(crate::block::Block::on_device(
                crate::block::BlockKind::V,
                k.clone().cast(FloatDType::BF16),
            )),
        ];
        let before = crate::host::moved_bytes();
        let pending = t.send_recv(0, 0, 4, payload.clone()).unwrap();
        t.commit().unwrap();
        let got = t.wait(pending).unwrap();
        let moved = crate::host::moved_bytes() - before;
        // The header, up and down: the count, then (kind, dtype, ndim = 2, 2 dims) twice.
        assert_eq!(moved, 2 * 4 * (1 + 2 * 5));
        assert!(got.iter().all(|b| b.is_on_device()), "{got:?}");
        assert_eq!(got, payload);
        // A gradient's all-reduce: summed by NCCL from the tensor's memory into a new tensor on the
        // GPU (one rank: the sum is the tensor itself), with nothing crossing the host.
        let gradient = crate::block::Block::on_device(crate::block::BlockKind::Reduce, k);
        let before = crate::host::moved_bytes();
        let reduced = t.all_reduce_block(5, gradient.clone()).unwrap();
        assert_eq!(crate::host::moved_bytes() - before, 0);
        assert!(reduced.is_on_device(), "{reduced:?}");
        assert_eq!(reduced, gradient);
    }

    /// Without CUDA, joining is a typed error with this exact text. On a machine with CUDA that
    /// path cannot be reached (two ranks would wait for a peer), so the test checks the GPU path.
    #[test]
    fn without_cuda_joining_is_an_error_not_a_panic() {
        if cuda_present() {
            one_rank_round_trip();
            return;
        }
        let file = std::env::temp_dir().join(format!("ringbench-nccl-id-{}", std::process::id()));
        let err =
            NcclTransport::from_id_file(0, 2, 0, &file, Duration::from_millis(10)).unwrap_err();
        assert!(
            matches!(err, TransportError::Unavailable { what: "CUDA", .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "rank 0: CUDA is not available: libcuda was not found (no NVIDIA driver on this machine)"
        );
    }

    /// Rank 0 of two, whose peer never comes: joining ends at the deadline with a typed error
    /// (NCCL's own join would wait for ever), and the id file is removed only after a join.
    #[test]
    #[ignore = "needs a GPU with CUDA and NCCL"]
    fn a_rank_whose_peer_never_joins_ends_within_the_timeout() {
        assert!(cuda_present(), "no CUDA driver on this machine");
        let file =
            std::env::temp_dir().join(format!("ringbench-nccl-alone-{}", std::process::id()));
        let began = std::time::Instant::now();
        let err = NcclTransport::from_id_file(0, 2, 0, &file, Duration::from_secs(3)).unwrap_err();
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{:?}",
            began.elapsed()
        );
        assert!(
            matches!(
                err,
                TransportError::Deadline {
                    rank: 0,
                    what: "joining the NCCL communicator",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    #[ignore = "needs a GPU with CUDA and NCCL"]
    fn one_rank_exchanges_with_itself_reduces_and_meets_at_the_barrier() {
        assert!(cuda_present(), "no CUDA driver on this machine");
        one_rank_round_trip();
    }
}
