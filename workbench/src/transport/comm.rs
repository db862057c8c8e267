//! `Comm`: the counting, tagging front of a transport. Every byte any engine sends passes here.

use super::{Payload, Pending, Transport};
use crate::block::Block;
use crate::error::TransportError;
use crate::trace::{Recorder, Track};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
/// Which part of the work a message belongs to.
pub enum Phase {
    /// The forward ring pass.
    Forward,
    /// A backward ring pass.
    Backward,
    /// All-reduces and barriers.
    Collective,
    /// Head × context parallelism's all-to-all (Ulysses): sequence shards to head shards and back,
    /// forward and backward (the block's kind says which tensor).
    AllToAll,
    /// Decoding over a sharded KV cache: every rank's partial attention of the new tokens, merged
    /// (`ring::decode`).
    Decode,
}

impl Phase {
    /// The phases whose messages go through [`Comm::exchange`].
    pub const EXCHANGED: [Phase; 4] = [
        Phase::Forward,
        Phase::Backward,
        Phase::AllToAll,
        Phase::Decode,
    ];

    /// Its name in messages: `forward`, `backward`, `collective`, `all-to-all`, `decode`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Collective => "collective",
            Phase::AllToAll => "all-to-all",
            Phase::Decode => "decode",
        }
    }
}

/// Exchanges ([`Comm::exchange`]: one message sent and one received) counted per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exchanges {
    /// The forward ring pass.
    pub forward: usize,
    /// The backward ring pass.
    pub backward: usize,
    /// Ulysses' all-to-alls, forward and backward.
    pub all_to_all: usize,
    /// Decoding's merges of partial attention.
    pub decode: usize,
}

impl Exchanges {
    /// The count of `phase` (collectives are not exchanges: 0).
    pub fn of(&self, phase: Phase) -> usize {
        match phase {
            Phase::Forward => self.forward,
            Phase::Backward => self.backward,
            Phase::AllToAll => self.all_to_all,
            Phase::Decode => self.decode,
            Phase::Collective => 0,
        }
    }

    fn bump(&mut self, phase: Phase) {
        match phase {
            Phase::Forward => self.forward += 1,
            Phase::Backward => self.backward += 1,
            Phase::AllToAll => self.all_to_all += 1,
            Phase::Decode => self.decode += 1,
            Phase::Collective => {}
        }
    }
}

/// What an injected fault does when its rank reaches its exchange ([`Comm::inject_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strike {
    /// The exchange fails with [`TransportError::Injected`], as a transport error would.
    Error,
    /// The process kills itself with SIGKILL (no cleanup, no message): a crashed MPI rank.
    Kill,
}

/// One block sent by this rank.
#[derive(Debug, Clone, PartialEq)]
pub struct SendRecord {
    /// Forward, backward or collective.
    pub phase: Phase,
    /// The ring step.
    pub step: usize,
    /// What the block carried.
    pub kind: crate::block::BlockKind,
    /// Its bytes.
    pub bytes: u64,
}

/// Bytes one ring step moved between host memory and the rank's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostDeviceRecord {
    /// Forward or backward.
    pub phase: Phase,
    /// The ring step.
    pub step: usize,
    /// Bytes copied host to device or device to host during the step (exchange, compute,
    /// accumulation). On the CPU backend these are copies between tensors and host blocks.
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
/// What one rank sent, and how long it waited.
pub struct Traffic {
    /// Every block sent, in order.
    pub sends: Vec<SendRecord>,
    /// Seconds this rank spent blocked waiting for ring blocks (communication it could not hide).
    pub wait_seconds: f64,
    /// Host↔device bytes of every ring step, in order.
    pub host_device: Vec<HostDeviceRecord>,
    /// Exchanges this rank made, per phase.
    pub exchanges: Exchanges,
}

impl Traffic {
    /// (blocks, bytes) sent of one kind in one phase.
    pub fn count(&self, phase: Phase, kind: crate::block::BlockKind) -> (usize, u64) {
        self.sends
            .iter()
            .filter(|s| s.phase == phase && s.kind == kind)
            .fold((0, 0), |(n, b), s| (n + 1, b + s.bytes))
    }

    /// Bytes sent in all.
    pub fn total_bytes(&self) -> u64 {
        self.sends.iter().map(|s| s.bytes).sum()
    }

    /// Host↔device bytes of all ring steps together.
    pub fn host_device_bytes(&self) -> u64 {
        self.host_device.iter().map(|r| r.bytes).sum()
    }
}

/// A transport plus a tag sequence (identical on every rank) and traffic accounting.
#[derive(Debug)]
pub struct Comm {
    transport: Box<dyn Transport>,
    next_tag: u64,
    traffic: Traffic,
    /// Exchanges since the communicator was made (what an injected fault counts).
    exchanges: Exchanges,
    fail_at: Option<(Phase, usize, Strike)>,
    /// Where the traffic's events go while a trace records (`crate::trace`), and each posted
    /// receive's (tag, phase, step) until it is waited for.
    trace: Option<(Arc<Recorder>, Posted)>,
}

/// Posted receives' (tag, phase, step), in posting order.
type Posted = Vec<(u64, Phase, usize)>;

impl Comm {
    /// A communicator over `transport`, with tags from 1 and no traffic yet.
    pub fn new(transport: Box<dyn Transport>) -> Self {
        Self {
            transport,
            next_tag: 0,
            traffic: Traffic::default(),
            exchanges: Exchanges::default(),
            fail_at: None,
            trace: crate::trace::current().map(|r| (r, Vec::new())),
        }
    }

    /// Records a ring-track event of this rank, when a trace records.
    fn traced(&self, name: String, start: Instant, seconds: f64, args: serde_json::Value) {
        if let Some((recorder, _)) = &self.trace {
            let at = (self.rank(), Track::Ring);
            recorder.complete(at, (name, "comm"), start, seconds, args);
        }
    }

    /// Fault injection for tests: at its `step`-th exchange of `phase` (counting from 0) this rank
    /// strikes as `strike` says.
    pub fn inject_fault(&mut self, phase: Phase, step: usize, strike: Strike) {
        self.fail_at = Some((phase, step, strike));
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.transport.rank()
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.transport.world()
    }

    /// The transport's name when every rank's shard must be as long ([`Transport::needs_equal_shards`]).
    pub fn needs_equal_shards(&self) -> Option<&'static str> {
        self.transport.needs_equal_shards()
    }

    /// What this rank has sent so far.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// What this rank has sent, handing it over and starting afresh.
    pub fn take_traffic(&mut self) -> Traffic {
        std::mem::take(&mut self.traffic)
    }

    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    /// Posts and commits one exchange: `payload` to `to`, a receive from `from`.
    pub fn exchange(
        &mut self,
        phase: Phase,
        step: usize,
        to: usize,
        from: usize,
        payload: Payload,
    ) -> Result<Pending, TransportError> {
        if let Some((at, step, strike)) = self.fail_at
            && at == phase
            && step == self.exchanges.of(phase)
        {
            if strike == Strike::Kill {
                kill_this_process();
            }
            let injected = Err(TransportError::Injected {
                rank: self.rank(),
                phase: phase.name(),
                step,
            });
            return self.failed(injected);
        }
        self.exchanges.bump(phase);
        self.traffic.exchanges.bump(phase);
        let tag = self.tag();
        let sent = self.traffic.sends.len();
        self.traffic
            .sends
            .extend(payload.iter().map(|block| SendRecord {
                phase,
                step,
                kind: block.kind,
                bytes: block.bytes(),
            }));
        let start = Instant::now();
        let posted = self.transport.send_recv(to, from, tag, payload);
        let pending = self.failed(posted)?;
        let committed = self.transport.commit();
        self.failed(committed)?;
        if self.trace.is_some() {
            // One event a message, its bytes the records just made.
            let records = &self.traffic.sends[sent..];
            let bytes: u64 = records.iter().map(|r| r.bytes).sum();
            let kinds: Vec<String> = records.iter().map(|r| format!("{:?}", r.kind)).collect();
            let args = json!({"to": to, "phase": phase.name(), "step": step, "bytes": bytes,
                "messages": records.len(), "blocks": kinds});
            let seconds = start.elapsed().as_secs_f64();
            self.traced(format!("send {}", phase.name()), start, seconds, args);
            if let Some((_, posted)) = &mut self.trace {
                posted.push((tag, phase, step));
            }
        }
        Ok(pending)
    }

    /// Passes `result` through; an error first aborts the transport so that peers learn of it now.
    fn failed<T>(&mut self, result: Result<T, TransportError>) -> Result<T, TransportError> {
        if result.is_err() {
            self.transport.abort();
        }
        result
    }

    /// Records the host↔device bytes of one ring step.
    pub fn record_host_device(&mut self, phase: Phase, step: usize, bytes: u64) {
        self.traffic
            .host_device
            .push(HostDeviceRecord { phase, step, bytes });
    }

    /// Waits for a posted receive; the time blocked counts as waiting.
    pub fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError> {
        let (from, tag) = (pending.from, pending.tag);
        let start = Instant::now();
        let received = self.transport.wait(pending);
        let waited = start.elapsed().as_secs_f64();
        self.traffic.wait_seconds += waited;
        if let (Some((_, posted)), Ok(payload)) = (&mut self.trace, &received) {
            let (phase, step) = match posted.iter().position(|p| p.0 == tag) {
                Some(i) => {
                    let (_, phase, step) = posted.remove(i);
                    (phase.name(), step)
                }
                None => ("?", 0),
            };
            let bytes: u64 = payload.iter().map(|b| b.bytes()).sum();
            let args = json!({"from": from, "phase": phase, "step": step});
            self.traced(format!("wait {phase}"), start, waited, args);
            let arrived = start + std::time::Duration::from_secs_f64(waited);
            let args = json!({"from": from, "phase": phase, "step": step, "bytes": bytes});
            self.traced(format!("recv {phase}"), arrived, 0.0, args);
        }
        self.failed(received)
    }

    /// Elementwise sum over ranks, identical bits on every rank.
    pub fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), TransportError> {
        let tag = self.tag();
        let world = self.world() as u64;
        self.traffic.sends.push(SendRecord {
            phase: Phase::Collective,
            step: 0,
            kind: crate::block::BlockKind::Reduce,
            bytes: (world.saturating_sub(1)) * (data.len() * 4) as u64,
        });
        let start = Instant::now();
        let reduced = self.transport.all_reduce_sum(tag, data);
        self.traced_collective("all-reduce", start);
        self.failed(reduced)
    }

    /// Records the collective that began at `start` and the bytes its record says it sent.
    fn traced_collective(&self, name: &str, start: Instant) {
        if self.trace.is_some() {
            let bytes = self.traffic.sends.last().map_or(0, |r| r.bytes);
            let seconds = start.elapsed().as_secs_f64();
            self.traced(name.to_owned(), start, seconds, json!({"bytes": bytes}));
        }
    }

    /// Elementwise sum over ranks of an f32 block (a training step's flat gradient), identical bits
    /// on every rank: in place on the device where the transport can (NCCL on CUDA), else staged
    /// through the host.
    pub fn all_reduce_block(&mut self, block: Block) -> Result<Block, TransportError> {
        let tag = self.tag();
        let world = self.world() as u64;
        self.traffic.sends.push(SendRecord {
            phase: Phase::Collective,
            step: 0,
            kind: block.kind,
            bytes: world.saturating_sub(1) * block.bytes(),
        });
        let start = Instant::now();
        let reduced = self.transport.all_reduce_block(tag, block);
        self.traced_collective("all-reduce", start);
        self.failed(reduced)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self) -> Result<(), TransportError> {
        let tag = self.tag();
        let start = Instant::now();
        let done = self.transport.barrier(tag);
        let seconds = start.elapsed().as_secs_f64();
        self.traced("barrier".into(), start, seconds, json!({}));
        self.failed(done)
    }
}

/// Ends this process at once with SIGKILL, as a crashed node would: no destructor, no message, no
/// flush (what [`Strike::Kill`] does, and the crash hooks of the tests).
pub fn kill_this_process() -> ! {
    #[cfg(unix)]
    // SAFETY: raise(2) takes a signal number; SIGKILL cannot be caught, so it does not return.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
    std::process::abort()
}

impl Comm {
    /// Every rank's `words`, on every rank (rank order), exactly: each word travels as four 16-bit
    /// pieces in an f32 all-reduce over rank-indexed slots (adding zeros to a whole number below
    /// 2^16 is exact). Ranks may give different lengths.
    pub fn all_gather_words(&mut self, words: &[u64]) -> Result<Vec<Vec<u64>>, TransportError> {
        let (rank, world) = (self.rank(), self.world());
        let lengths = self.all_gather_fixed(rank, world, &[words.len() as u64])?;
        let longest = lengths.iter().map(|l| l[0] as usize).max().unwrap_or(0);
        let mut padded = words.to_vec();
        padded.resize(longest, 0);
        let gathered = self.all_gather_fixed(rank, world, &padded)?;
        Ok(gathered
            .into_iter()
            .zip(lengths)
            .map(|(mut w, l)| {
                w.truncate(l[0] as usize);
                w
            })
            .collect())
    }

    /// [`Comm::all_gather_words`] for a length every rank shares.
    fn all_gather_fixed(
        &mut self,
        rank: usize,
        world: usize,
        words: &[u64],
    ) -> Result<Vec<Vec<u64>>, TransportError> {
        const PIECES: usize = 4;
        let n = words.len() * PIECES;
        let mut slots = vec![0.0f32; n * world];
        for (i, w) in words.iter().enumerate() {
            for p in 0..PIECES {
                slots[rank * n + i * PIECES + p] = ((w >> (16 * p)) & 0xffff) as f32;
            }
        }
        self.all_reduce_sum(&mut slots)?;
        Ok((0..world)
            .map(|r| {
                slots[r * n..(r + 1) * n]
                    .chunks(PIECES)
                    .map(|c| {
                        c.iter()
                            .enumerate()
                            .fold(0u64, |w, (p, &x)| w | ((x as u64) << (16 * p)))
                    })
                    .collect()
            })
            .collect())
    }
}
