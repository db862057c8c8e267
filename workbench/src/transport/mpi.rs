//! Transport over MPI (rsmpi + Open MPI): one process per rank, started by `mpirun`.
//!
//! Sends are nonblocking (`MPI_Isend`); a receive polls for its message (matched probe) and, while it
//! waits, tests the sends in flight so that MPI makes progress on them. A peer silent past the timeout
//! is an error; a peer that exits makes `mpirun` end the job and name it.

use super::wire::{decode, encode};
use super::{Payload, Pending, Transport};
use crate::error::TransportError;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::time::{Duration, Instant};

/// A send in flight and the buffer it reads; the buffer is freed once the request has completed.
struct InFlight {
    request: Request<'static, [f32], StaticScope>,
    buffer: *mut [f32],
}

/// One rank of an MPI job: nonblocking sends, polled receives, and a timeout on silent peers.
pub struct MpiTransport {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    sends: Vec<InFlight>,
    timeout: Duration,
}

// SAFETY: `experiments::mpi_rank` initializes MPI at `Threading::Serialized` (and refuses a library offering less):
// the transport is created, used and dropped by one thread at a time (the rank's `Comm` sits behind a
// mutex), never concurrently.
unsafe impl Send for MpiTransport {}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MpiTransport {{ rank: {}, size: {}, in_flight: {} }}",
            self.rank,
            self.size,
            self.sends.len()
        )
    }
}

/// MPI tags need only reach 32767; our tags only have to tell apart messages in flight together.
fn mpi_tag(tag: u64) -> i32 {
    (tag % 32_000) as i32
}

impl MpiTransport {
    /// A transport over `world`. The caller keeps the `mpi::environment::Universe` alive (MPI is
    /// finalized when it drops) and can abort the job through it when a rank fails.
    pub fn new(world: SimpleCommunicator, timeout: Duration) -> Self {
        Self {
            rank: world.rank() as usize,
            size: world.size() as usize,
            world,
            sends: Vec::new(),
            timeout,
        }
    }

    fn post(&mut self, to: usize, tag: u64, message: Vec<f32>) {
        let buffer: *mut [f32] = Box::into_raw(message.into_boxed_slice());
        // SAFETY: the buffer stays allocated until the request has completed (see `progress` and
        // `Drop`), so the 'static borrow handed to MPI never dangles.
        let data: &'static [f32] = unsafe { &*buffer };
        let request = self
            .world
            .process_at_rank(to as i32)
            .immediate_send_with_tag(StaticScope, data, mpi_tag(tag));
        self.sends.push(InFlight { request, buffer });
    }

    /// Tests every send in flight once, freeing the buffers of those that completed.
    fn progress(&mut self) {
        let mut still = Vec::with_capacity(self.sends.len());
        for InFlight { request, buffer } in self.sends.drain(..) {
            match request.test() {
                // SAFETY: the request completed; MPI no longer reads the buffer.
                Ok(_) => drop(unsafe { Box::from_raw(buffer) }),
                Err(request) => still.push(InFlight { request, buffer }),
            }
        }
        self.sends = still;
    }

    fn receive(&mut self, from: usize, tag: u64) -> Result<Vec<f32>, TransportError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let probe = self
                .world
                .process_at_rank(from as i32)
                .immediate_matched_probe_with_tag(mpi_tag(tag));
            if let Some(matched) = probe {
                let (data, _) = matched.matched_receive_vec::<f32>();
                return Ok(data);
            }
            self.progress();
            if Instant::now() > deadline {
                return Err(TransportError::Timeout {
                    rank: self.rank,
                    peer: from,
                    seconds: self.timeout.as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

impl Drop for MpiTransport {
    /// Sends still in flight when the transport goes (a peer stopped receiving: the job is failing)
    /// are abandoned with their buffers rather than waited for, so that this rank can exit and
    /// `mpirun` can end the job.
    fn drop(&mut self) {
        self.progress();
        for InFlight { request, .. } in self.sends.drain(..) {
            std::mem::forget(request);
        }
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn send_recv(
        &mut self,
        to: usize,
        from: usize,
        tag: u64,
        payload: Payload,
    ) -> Result<Pending, TransportError> {
        self.post(to, tag, encode(&payload));
        Ok(Pending { from, tag })
    }

    fn commit(&mut self) -> Result<(), TransportError> {
        self.progress();
        Ok(())
    }

    fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError> {
        let message = self.receive(pending.from, pending.tag)?;
        decode(&message, self.rank, pending.from)
    }
}
