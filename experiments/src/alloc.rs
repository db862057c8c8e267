//! A counting global allocator over mimalloc: bytes allocated and peak live bytes, for the benchmarks.
//!
//! mimalloc rather than the system allocator because glibc's returns freed heap tops to the kernel
//! and takes them back page by page: on a 2-core VM the page clearing and TLB-shootdown interrupts
//! cost the fused attention benchmark half of its time (measured: 59 → 133 GFLOP/s, causal S = 1024).

use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The global allocator of `ringbench`: mimalloc, counting live and peak bytes.
pub struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// Counts `size` bytes allocated at `ptr` (nothing when the allocation failed) and passes `ptr` on.
fn counted(ptr: *mut u8, size: usize) -> *mut u8 {
    if !ptr.is_null() {
        ALLOCATED.fetch_add(size, Relaxed);
        LARGEST.fetch_max(size, Relaxed);
        let live = LIVE.fetch_add(size, Relaxed) + size;
        PEAK.fetch_max(live, Relaxed);
    }
    ptr
}

// SAFETY: defers every call to `MiMalloc` unchanged; only counts. A reallocation counts as an
// allocation of the new size and a release of the old one, whether or not it moved.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { MiMalloc.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { MiMalloc.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { MiMalloc.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = counted(unsafe { MiMalloc.realloc(ptr, layout, new_size) }, new_size);
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        new
    }
}

/// mimalloc's `mi_option_purge_delay` (the same index in its v2 and v3 `mimalloc.h`).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory in the process instead of returning it to the kernel: the model's
/// activations are megabytes each, allocated and freed every layer, and each fresh page taken back
/// from the kernel is zeroed first (a quarter of a training step's time on the 2-core machine;
/// `ringbench bench model`: 5.7-6.2 K tokens/s with purging, 7.2-7.3 K without). The process keeps
/// its peak, as PyTorch's caching allocator does. Called once, first thing in `ringbench`.
pub fn keep_freed_memory() {
    // SAFETY: sets one of mimalloc's options; any value is valid (-1: never purge).
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
}

/// Allocation totals since the last [`reset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes requested by every allocation.
    pub allocated: usize,
    /// Highest live bytes above the live bytes at reset.
    pub peak_above_start: usize,
    /// The largest single allocation.
    pub largest: usize,
}

static BASE: AtomicUsize = AtomicUsize::new(0);

/// Starts a measurement window. Counts are process-wide (all rank threads).
pub fn reset() {
    let live = LIVE.load(Relaxed);
    BASE.store(live, Relaxed);
    PEAK.store(live, Relaxed);
    ALLOCATED.store(0, Relaxed);
    LARGEST.store(0, Relaxed);
}

/// Bytes allocated and the peak since the last [`reset`].
pub fn stats() -> AllocStats {
    AllocStats {
        allocated: ALLOCATED.load(Relaxed),
        peak_above_start: PEAK.load(Relaxed).saturating_sub(BASE.load(Relaxed)),
        largest: LARGEST.load(Relaxed),
    }
}

/// Whether the counting allocator is installed (it is in the `ringbench` binary).
pub fn active() -> bool {
    let before = ALLOCATED.load(Relaxed);
    let probe = std::hint::black_box(vec![0u8; 64]);
    drop(probe);
    ALLOCATED.load(Relaxed) != before
}
