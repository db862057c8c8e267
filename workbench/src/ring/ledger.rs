//! Deterministic accounting of the bytes one rank's engine holds, charged where its blocks are made.
//!
//! An allocator's peak depends on the CPU's matmul kernels, the allocator and thread scheduling; this
//! ledger depends only on shapes. The engine charges what a rank holds as if it were its own process:
//! its saved q, k, v and log-sum-exp, the forward's accumulators, the backward's dO, δ and gradients,
//! both buffers of every block in flight round the ring (the one computed on and the one arriving),
//! travelling accumulators, and the workspace a tile kernel needs for one tile. In-process ranks share
//! a block that travels (one `Arc`), but each is charged for it, as a rank of its own would be.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live and peak bytes of one rank.
#[derive(Debug, Default)]
pub struct Ledger {
    live: AtomicU64,
    peak: AtomicU64,
}

impl Ledger {
    /// Charges `bytes` until the returned [`Charge`] is dropped.
    pub fn charge(self: &Arc<Self>, bytes: u64) -> Charge {
        let live = self.live.fetch_add(bytes, Relaxed) + bytes;
        self.peak.fetch_max(live, Relaxed);
        Charge {
            ledger: self.clone(),
            bytes,
        }
    }

    /// Bytes charged now.
    pub fn live(&self) -> u64 {
        self.live.load(Relaxed)
    }

    /// The most bytes charged at once since the last [`Ledger::reset_peak`].
    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    /// Starts a new measurement: the peak becomes what is charged now.
    pub fn reset_peak(&self) {
        self.peak.store(self.live(), Relaxed);
    }
}

/// Bytes held until dropped.
#[derive(Debug)]
pub struct Charge {
    ledger: Arc<Ledger>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger.live.fetch_sub(self.bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_the_most_charged_at_once() {
        let ledger = Arc::new(Ledger::default());
        let a = ledger.charge(100);
        let b = ledger.charge(50);
        drop(a);
        let c = ledger.charge(70);
        assert_eq!((ledger.live(), ledger.peak()), (120, 150));
        drop((b, c));
        assert_eq!(ledger.live(), 0);
        ledger.reset_peak();
        assert_eq!(ledger.peak(), 0);
    }
}
