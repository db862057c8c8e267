//! What machine a measurement ran on, for every benchmark row: the CPU's model name, the SIMD
//! features it has (detected at run time, so the same binary reports what each machine offers),
//! the threads a rank's kernels may use, and how many cores a timed stretch kept busy.

use std::time::Instant;

/// The CPU's model name (`/proc/cpuinfo`'s first `model name`), or the architecture where there is
/// none.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

/// The vector and matrix features this CPU has that a kernel may use, detected at run time,
/// space-separated (`avx2 fma avx512f avx512bf16 amx-bf16`); empty where none is known.
pub fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut found = Vec::new();
        macro_rules! probe {
            ($($name:tt),*) => {
                $(if std::is_x86_feature_detected!($name) { found.push($name); })*
            };
        }
        probe!("avx2", "fma", "f16c", "avx512f", "avx512bf16", "avx512fp16");
        // AMX's detection is not stable in std: the kernel's flags say whether it is enabled.
        let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = flags.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        for (flag, name) in [("amx_tile", "amx-tile"), ("amx_bf16", "amx-bf16")] {
            if flags.split_whitespace().any(|f| f == flag) {
                found.push(name);
            }
        }
        found.join(" ")
    }
    #[cfg(target_arch = "aarch64")]
    {
        let mut found = Vec::new();
        macro_rules! probe {
            ($($name:tt),*) => {
                $(if std::arch::is_aarch64_feature_detected!($name) { found.push($name); })*
            };
        }
        probe!("neon", "bf16", "sve");
        found.join(" ")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    String::new()
}

/// Threads rayon's pool runs a rank's parallel kernels on (`RAYON_NUM_THREADS`, else one a core).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// This process's CPU seconds so far (user + system, every thread).
fn cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        // SAFETY: getrusage writes the struct it is given and reads nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0 {
            let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            return seconds(usage.ru_utime) + seconds(usage.ru_stime);
        }
    }
    f64::NAN
}

/// Wall time and busy cores of a stretch of work: started by [`Busy::start`], read by
/// [`Busy::stop`].
pub struct Busy {
    wall: Instant,
    cpu: f64,
}

/// What [`Busy::stop`] read.
#[derive(Debug, Clone, Copy)]
pub struct BusyReading {
    /// Wall seconds.
    pub seconds: f64,
    /// (user + system) CPU seconds over wall seconds: the cores the work kept busy on average
    /// (NaN where the CPU time is unknown).
    pub cores: f64,
}

impl Busy {
    /// Starts timing.
    pub fn start() -> Busy {
        Busy {
            wall: Instant::now(),
            cpu: cpu_seconds(),
        }
    }

    /// Wall seconds and busy cores since [`Busy::start`].
    pub fn stop(self) -> BusyReading {
        let seconds = self.wall.elapsed().as_secs_f64();
        BusyReading {
            seconds,
            cores: (cpu_seconds() - self.cpu) / seconds,
        }
    }
}

/// The buffer the read bandwidth is measured over: far beyond any CPU's last-level cache.
pub const BANDWIDTH_BUFFER_BYTES: usize = 1 << 29;

/// The machine's memory read bandwidth in bytes/s: the best of three parallel sums (rayon's pool,
/// the threads a rank's kernels use) over [`BANDWIDTH_BUFFER_BYTES`], far larger than any cache,
/// read once each, as a batch-1 decode step reads every weight once. Measured once a process.
pub fn read_bandwidth() -> f64 {
    static MEASURED: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *MEASURED.get_or_init(|| measure_read_bandwidth(BANDWIDTH_BUFFER_BYTES))
}

fn measure_read_bandwidth(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let values = vec![1.0f32; bytes / std::mem::size_of::<f32>()];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let sum: f32 = values
            .par_chunks(1 << 16)
            .map(|chunk| {
                // Independent lanes, so the adds do not wait on each other.
                let mut lanes = [0.0f32; 16];
                for block in chunk.chunks_exact(16) {
                    for (acc, x) in lanes.iter_mut().zip(block) {
                        *acc += x;
                    }
                }
                lanes.iter().sum::<f32>()
            })
            .sum();
        best = best.min(start.elapsed().as_secs_f64());
        std::hint::black_box(sum);
    }
    bytes as f64 / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_reads_about_one_core() {
        let busy = Busy::start();
        let mut x = 0u64;
        while busy.wall.elapsed().as_millis() < 200 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let reading = busy.stop();
        // One spinning thread keeps a core busy (a loaded machine may lend it less than all of
        // one); the process (other tests run beside it) can keep no more cores busy than exist.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        assert!(
            reading.cores > 0.2 && reading.cores <= cores + 0.1,
            "{reading:?} on {cores} cores"
        );
        assert!(!cpu_model().is_empty());
        assert!(threads() >= 1);
    }
}
