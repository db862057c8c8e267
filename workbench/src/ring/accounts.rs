//! One rank's accounts of a job (what it sent, its tiles' times, its host↔device bytes) as words,
//! so that a job of one process per rank can give every process every rank's accounts, as a job on
//! threads does ([`crate::transport::Comm::all_gather_words`]).

use super::context::StepEvent;
use crate::block::BlockKind;
use crate::transport::{Exchanges, HostDeviceRecord, Phase, SendRecord, Traffic};

const PHASES: [Phase; 5] = [
    Phase::Forward,
    Phase::Backward,
    Phase::Collective,
    Phase::AllToAll,
    Phase::Decode,
];

/// What one rank accounted for in a job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankAccounts {
    /// What it sent and waited for.
    pub traffic: Traffic,
    /// Its tiles, in order.
    pub events: Vec<StepEvent>,
    /// Host↔device bytes of the whole call.
    pub host_device_bytes: u64,
}

fn code<T: PartialEq>(all: &[T], value: &T) -> u64 {
    all.iter()
        .position(|v| v == value)
        .expect("every variant is listed") as u64
}

impl RankAccounts {
    /// As words: counts first, then each record's fields (floats by their bits).
    pub fn to_words(&self) -> Vec<u64> {
        let t = &self.traffic;
        let mut w = vec![
            t.sends.len() as u64,
            t.host_device.len() as u64,
            self.events.len() as u64,
            t.wait_seconds.to_bits(),
            t.exchanges.forward as u64,
            t.exchanges.backward as u64,
            t.exchanges.all_to_all as u64,
            t.exchanges.decode as u64,
            self.host_device_bytes,
        ];
        for s in &t.sends {
            w.extend([
                code(&PHASES, &s.phase),
                s.step as u64,
                s.kind.code() as u64,
                s.bytes,
            ]);
        }
        for r in &t.host_device {
            w.extend([code(&PHASES, &r.phase), r.step as u64, r.bytes]);
        }
        for e in &self.events {
            w.extend([
                code(&PHASES, &e.phase),
                e.step as u64,
                e.peer_block as u64,
                e.pairs,
                e.flops,
                e.compute_seconds.to_bits(),
            ]);
        }
        w
    }

    /// Read back from [`RankAccounts::to_words`]; `None` if the words are not such a list.
    pub fn from_words(words: &[u64]) -> Option<RankAccounts> {
        let mut it = words.iter().copied();
        let mut next = || it.next();
        let (sends, host_device, events) = (next()?, next()?, next()?);
        let wait_seconds = f64::from_bits(next()?);
        let exchanges = Exchanges {
            forward: next()? as usize,
            backward: next()? as usize,
            all_to_all: next()? as usize,
            decode: next()? as usize,
        };
        let host_device_bytes = next()?;
        let phase = |c: u64| PHASES.get(c as usize).copied();
        let mut traffic = Traffic {
            wait_seconds,
            exchanges,
            ..Traffic::default()
        };
        for _ in 0..sends {
            traffic.sends.push(SendRecord {
                phase: phase(next()?)?,
                step: next()? as usize,
                kind: BlockKind::from_code(next()? as usize)?,
                bytes: next()?,
            });
        }
        for _ in 0..host_device {
            traffic.host_device.push(HostDeviceRecord {
                phase: phase(next()?)?,
                step: next()? as usize,
                bytes: next()?,
            });
        }
        let mut list = Vec::new();
        for _ in 0..events {
            list.push(StepEvent {
                phase: phase(next()?)?,
                step: next()? as usize,
                peer_block: next()? as usize,
                pairs: next()?,
                flops: next()?,
                compute_seconds: f64::from_bits(next()?),
            });
        }
        next().is_none().then_some(RankAccounts {
            traffic,
            events: list,
            host_device_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_survive_words() {
        let accounts = RankAccounts {
            traffic: Traffic {
                sends: vec![SendRecord {
                    phase: Phase::AllToAll,
                    step: 3,
                    kind: BlockKind::DSinks,
                    bytes: u64::MAX - 5,
                }],
                wait_seconds: 0.125e-3,
                host_device: vec![HostDeviceRecord {
                    phase: Phase::Backward,
                    step: 1,
                    bytes: 1 << 40,
                }],
                exchanges: Exchanges {
                    forward: 4,
                    backward: 4,
                    all_to_all: 2,
                    decode: 0,
                },
            },
            events: vec![StepEvent {
                phase: Phase::Forward,
                step: 2,
                peer_block: 1,
                pairs: 77,
                flops: 123_456_789_012,
                compute_seconds: std::f64::consts::PI,
            }],
            host_device_bytes: 99,
        };
        let words = accounts.to_words();
        assert_eq!(RankAccounts::from_words(&words), Some(accounts));
        assert_eq!(RankAccounts::from_words(&words[..words.len() - 1]), None);
        let mut longer = words.clone();
        longer.push(0);
        assert_eq!(RankAccounts::from_words(&longer), None);
    }
}
