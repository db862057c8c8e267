//! A counting global allocator: bytes allocated and peak live bytes, for the benchmarks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers every allocation to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            ALLOCATED.fetch_add(layout.size(), Relaxed);
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

/// Allocation totals since the last [`reset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes requested by every allocation.
    pub allocated: usize,
    /// Highest live bytes above the live bytes at reset.
    pub peak_above_start: usize,
}

static BASE: AtomicUsize = AtomicUsize::new(0);

/// Starts a measurement window. Counts are process-wide (all rank threads).
pub fn reset() {
    let live = LIVE.load(Relaxed);
    BASE.store(live, Relaxed);
    PEAK.store(live, Relaxed);
    ALLOCATED.store(0, Relaxed);
}

pub fn stats() -> AllocStats {
    AllocStats {
        allocated: ALLOCATED.load(Relaxed),
        peak_above_start: PEAK.load(Relaxed).saturating_sub(BASE.load(Relaxed)),
    }
}

/// Whether the counting allocator is installed (it is in the `ringbench` binary).
pub fn active() -> bool {
    let before = ALLOCATED.load(Relaxed);
    let probe = std::hint::black_box(vec![0u8; 64]);
    drop(probe);
    ALLOCATED.load(Relaxed) != before
}
