//! The transport seam: point-to-point ring exchange, the all-to-all of a group of ranks, and the
//! collectives training needs.
//!
//! Transports move blocks; [`Comm`] wraps any transport and counts traffic once for all of them.

mod comm;
mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod threads;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod wire;

pub use comm::{
    Comm, Exchanges, HostDeviceRecord, Phase, SendRecord, Strike, Traffic, kill_this_process,
};
pub use group::{Group, GroupComm};
pub use threads::{
    Link, ThreadTransport, run_ranks, run_ranks_with, thread_ring, thread_ring_with,
};

use crate::block::{Block, BlockKind};
pub use crate::error::TransportError;
use std::sync::Arc;

/// Blocks shared between sender and receiver without copying (in-process) or serialized (MPI).
pub type Payload = Vec<Arc<Block>>;

/// Whether an MPI launcher (Open MPI, MPICH, PMIx) started this process with more than one rank.
pub fn launched_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .any(|n| n.parse::<usize>().is_ok_and(|n| n > 1))
}

/// A posted receive, redeemed with [`Transport::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// The rank it comes from.
    pub from: usize,
    /// Its tag.
    pub tag: u64,
}

/// What a multi-rank engine must provide. Calls are made in the same order on every rank.
pub trait Transport: Send + std::fmt::Debug {
    /// This rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// Posts a send of `payload` to `to` and a receive from `from`, both with `tag`; returns at once.
    fn send_recv(
        &mut self,
        to: usize,
        from: usize,
        tag: u64,
        payload: Payload,
    ) -> Result<Pending, TransportError>;
    /// Starts every operation posted since the last commit.
    fn commit(&mut self) -> Result<(), TransportError>;
    /// Blocks until the posted receive has arrived.
    fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError>;
    /// Elementwise sum over ranks, identical bits on every rank.
    ///
    /// The default sends this rank's vector to every other rank (one exchange per distance round the
    /// ring, all posted before any is waited for) and sums the N vectors in rank order on every rank,
    /// so every replica gets the same bits (a tree or ring reduction associates differently on
    /// different ranks). A transport with a collective that guarantees identical results (NCCL)
    /// overrides it.
    fn all_reduce_sum(&mut self, tag: u64, data: &mut [f32]) -> Result<(), TransportError> {
        let (rank, world) = (self.rank(), self.world());
        if world == 1 {
            return Ok(());
        }
        let mine = Arc::new(Block::host(
            BlockKind::Reduce,
            vec![data.len()],
            data.to_vec(),
        ));
        let mut pending = Vec::with_capacity(world - 1);
        for distance in 1..world {
            let (to, from) = ((rank + distance) % world, (rank + world - distance) % world);
            pending.push(self.send_recv(to, from, tag, vec![mine.clone()])?);
        }
        self.commit()?;
        let mut parts: Vec<Option<Arc<Block>>> = vec![None; world];
        for p in pending {
            let from = p.from;
            let mut payload = self.wait(p)?;
            let block = (!payload.is_empty()).then(|| payload.swap_remove(0));
            let got = block.as_ref().map_or(0, |b| b.len());
            if got != data.len() {
                return Err(TransportError::LengthMismatch {
                    rank,
                    peer: from,
                    expected: data.len(),
                    got,
                });
            }
            parts[from] = block;
        }
        parts[rank] = Some(mine);
        data.fill(0.0);
        for part in parts.iter().flatten() {
            for (acc, x) in data.iter_mut().zip(part.host_values().iter()) {
                *acc += x;
            }
        }
        Ok(())
    }
    /// Elementwise sum over ranks of an f32 block, identical bits on every rank, as a block of the
    /// same kind and shape. The default stages it through the host ([`all_reduce_staged`]); a
    /// transport that reduces device memory in place (NCCL, for tensors of Burn's CUDA backend)
    /// overrides it.
    fn all_reduce_block(&mut self, tag: u64, block: Block) -> Result<Block, TransportError> {
        all_reduce_staged(self, tag, block)
    }
    /// Returns once every rank has called it (by default an all-reduce of nothing, which waits for every rank's message).
    fn barrier(&mut self, tag: u64) -> Result<(), TransportError> {
        self.all_reduce_sum(tag, &mut [])
    }
    /// The transport's name when a receive is sized by the receiver (NCCL: what a rank receives is
    /// shaped like what it sends), so that every rank's shard must be as long; None when messages
    /// carry their own sizes.
    fn needs_equal_shards(&self) -> Option<&'static str> {
        None
    }
    /// Called once this rank has failed: make the failure visible to the peers now (they may be
    /// blocked waiting for this rank) rather than when the rank's thread or process ends.
    fn abort(&mut self) {}
}

/// [`Transport::all_reduce_block`] through host memory: the block's values read to the host
/// (counted, when it is a device block), summed by [`Transport::all_reduce_sum`] and given back as
/// a host block, which the caller places where it needs it. One rank has nothing to sum: its block
/// comes back as it was, wherever it is.
pub fn all_reduce_staged<T: Transport + ?Sized>(
    transport: &mut T,
    tag: u64,
    block: Block,
) -> Result<Block, TransportError> {
    if transport.world() == 1 {
        return Ok(block);
    }
    let mut values = block.host_values().into_owned();
    transport.all_reduce_sum(tag, &mut values)?;
    Ok(Block::host(block.kind, block.shape, values))
}
