//! In-process transport: one std thread per rank, blocks moved through channels without copying.

use super::{Comm, Payload, Pending, Transport};
use crate::error::TransportError;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Envelope {
    tag: u64,
    payload: Payload,
    /// When a rate-limited link delivers it (`None`: at once).
    arrives: Option<Instant>,
}

/// A modelled link for measuring overlap: a message of n bytes arrives `latency + n / bytes_per_s`
/// after its link is free (messages to one peer queue behind each other). Senders never block, like
/// a NIC's DMA; the receiver's wait ends when the message has arrived.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Link bandwidth.
    pub bytes_per_s: f64,
    /// Time from a message's last byte leaving to its arrival.
    pub latency: Duration,
}

/// One rank's end of a full mesh of channels.
#[derive(Debug)]
pub struct ThreadTransport {
    rank: usize,
    to: Vec<Sender<Envelope>>,
    from: Vec<Receiver<Envelope>>,
    /// Messages that arrived before the receive that wants them.
    early: HashMap<(usize, u64), Envelope>,
    timeout: Duration,
    link: Option<Link>,
    /// Per destination: when its link finishes the last message queued on it.
    link_free: Vec<Instant>,
}

/// Builds the transports of an N-rank in-process ring; a peer silent for `timeout` is an error.
pub fn thread_ring(world: usize, timeout: Duration) -> Vec<ThreadTransport> {
    thread_ring_with(world, timeout, None)
}

/// [`thread_ring`] whose links are rate-limited by `link`.
pub fn thread_ring_with(
    world: usize,
    timeout: Duration,
    link: Option<Link>,
) -> Vec<ThreadTransport> {
    let mut senders: Vec<Vec<Sender<Envelope>>> = (0..world).map(|_| Vec::new()).collect();
    let mut receivers: Vec<Vec<Receiver<Envelope>>> = (0..world).map(|_| Vec::new()).collect();
    for sender_rank in senders.iter_mut() {
        for receiver_rank in receivers.iter_mut() {
            let (tx, rx) = channel();
            sender_rank.push(tx);
            receiver_rank.push(rx);
        }
    }
    // receivers[dst][src] was pushed in src order, as wanted.
    senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(rank, (to, from))| ThreadTransport {
            rank,
            to,
            from,
            early: HashMap::new(),
            timeout,
            link,
            link_free: vec![Instant::now(); world],
        })
        .collect()
}

impl ThreadTransport {
    fn post(&mut self, to: usize, tag: u64, payload: Payload) -> Result<(), TransportError> {
        let gone = || TransportError::PeerGone {
            rank: self.rank,
            peer: to,
        };
        let arrives = match self.link {
            Some(link) if to != self.rank => {
                let bytes: usize = payload.iter().map(|b| 4 * b.len()).sum();
                let wire = Duration::from_secs_f64(bytes as f64 / link.bytes_per_s);
                let done = self.link_free[to].max(Instant::now()) + wire;
                self.link_free[to] = done;
                Some(done + link.latency)
            }
            _ => None,
        };
        let sender = self.to.get(to).ok_or_else(gone)?;
        sender
            .send(Envelope {
                tag,
                payload,
                arrives,
            })
            .map_err(|_| gone())
    }

    fn receive(&mut self, from: usize, tag: u64) -> Result<Payload, TransportError> {
        let envelope = self.next_envelope(from, tag)?;
        if let Some(at) = envelope.arrives {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
        }
        Ok(envelope.payload)
    }

    fn next_envelope(&mut self, from: usize, tag: u64) -> Result<Envelope, TransportError> {
        if let Some(envelope) = self.early.remove(&(from, tag)) {
            return Ok(envelope);
        }
        loop {
            let envelope = self.from[from]
                .recv_timeout(self.timeout)
                .map_err(|e| match e {
                    RecvTimeoutError::Timeout => TransportError::Timeout {
                        rank: self.rank,
                        peer: from,
                        seconds: self.timeout.as_secs_f64(),
                    },
                    RecvTimeoutError::Disconnected => TransportError::PeerGone {
                        rank: self.rank,
                        peer: from,
                    },
                })?;
            if envelope.tag == tag {
                return Ok(envelope);
            }
            if envelope.tag < tag {
                return Err(TransportError::Protocol {
                    rank: self.rank,
                    peer: from,
                    expected: tag,
                    got: envelope.tag,
                });
            }
            self.early.insert((from, envelope.tag), envelope);
        }
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.from.len()
    }

    fn send_recv(
        &mut self,
        to: usize,
        from: usize,
        tag: u64,
        payload: Payload,
    ) -> Result<Pending, TransportError> {
        self.post(to, tag, payload)?;
        Ok(Pending { from, tag })
    }

    fn commit(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError> {
        self.receive(pending.from, pending.tag)
    }

    /// Closes this rank's sending ends: every peer waiting on it sees `PeerGone` at once.
    fn abort(&mut self) {
        self.to.clear();
    }
}

/// Runs `body` on `world` in-process ranks, one thread each, and returns every rank's result.
///
/// A rank that panics is reported as [`TransportError::RankFailed`]; its peers see it as gone.
pub fn run_ranks<T, E, F>(world: usize, timeout: Duration, body: F) -> Vec<Result<T, E>>
where
    T: Send,
    E: Send + From<TransportError>,
    F: Fn(Comm) -> Result<T, E> + Sync,
{
    run_ranks_with(world, timeout, None, body)
}

/// [`run_ranks`] over links rate-limited by `link`.
pub fn run_ranks_with<T, E, F>(
    world: usize,
    timeout: Duration,
    link: Option<Link>,
    body: F,
) -> Vec<Result<T, E>>
where
    T: Send,
    E: Send + From<TransportError>,
    F: Fn(Comm) -> Result<T, E> + Sync,
{
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> = thread_ring_with(world, timeout, link)
            .into_iter()
            .map(|transport| {
                let rank = transport.rank;
                let handle = std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || body(Comm::new(Box::new(transport))))
                    .expect("spawning a rank thread");
                (rank, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, handle)| {
                handle.join().unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into());
                    Err(TransportError::RankFailed { rank, message }.into())
                })
            })
            .collect()
    })
}
