//! The SIMD level the CPU kernels run at: the best this CPU has, found at run time, or the one
//! `RINGBENCH_SIMD` (`avx512`, `avx2`, `portable`) forces, refused by name when the CPU lacks it.
//!
//! Every vectorized loop of ours (the fused attention tile's softmax rows and its backward's, the
//! model's RMSNorm and SwiGLU forward and backward, bf16 packing and the AVX512-BF16 product) is
//! written once and compiled three times by [`simd_fn!`](crate::simd_fn): for AVX-512 (F, VL, and FMA), for AVX2 with
//! FMA, and for the target's baseline (x86-64's SSE2; aarch64's NEON). They compute the same bits:
//! each loop's reductions run in a fixed order over [`LANES`]-wide accumulators and every fused
//! multiply-add is written as one (`mul_add`), so the compiler cannot reassociate or contract
//! differently per level. The f32 matrix products go through the `gemm` crate, which picks its own
//! microkernels from the CPU (it has no override): [`gemm_level`] says which.

use std::fmt;
use std::sync::OnceLock;

/// Independent accumulators of a vectorized reduction.
pub const LANES: usize = 16;

/// The environment variable that forces a level.
pub const ENV: &str = "RINGBENCH_SIMD";

/// A level of vector instructions the CPU kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The target's baseline (x86-64: SSE2; aarch64: NEON): runs on any CPU of the architecture.
    Portable,
    /// x86-64 AVX2 with FMA (Intel since Haswell, AMD since Zen).
    Avx2,
    /// x86-64 AVX-512 F and VL with FMA (Intel since Skylake-SP, AMD since Zen 4).
    Avx512,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 3] = [Level::Portable, Level::Avx2, Level::Avx512];

    /// Its name, as `RINGBENCH_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// The CPU features it needs.
    pub fn needs(self) -> &'static [&'static str] {
        match self {
            Level::Portable => &[],
            Level::Avx2 => &["avx2", "fma"],
            Level::Avx512 => &["avx512f", "avx512vl", "fma"],
        }
    }

    /// Whether this CPU has every feature it needs.
    pub fn available(self) -> bool {
        self.needs().iter().all(|f| has_feature(f))
    }

    /// The highest level this CPU has.
    pub fn detected() -> Level {
        Level::ALL
            .into_iter()
            .rev()
            .find(|l| l.available())
            .unwrap_or(Level::Portable)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this CPU has `feature` (an x86 feature name; false on other architectures).
fn has_feature(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
            "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
            "avx512bf16" => std::is_x86_feature_detected!("avx512bf16"),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

/// `RINGBENCH_SIMD` asked for something this process cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimdError {
    /// Not a level's name.
    Unknown {
        /// What was asked.
        value: String,
    },
    /// A level whose instructions this CPU lacks.
    Unavailable {
        /// The level asked for.
        level: Level,
        /// The features it needs that the CPU lacks.
        missing: Vec<&'static str>,
        /// The highest level the CPU has.
        detected: Level,
    },
}

impl fmt::Display for SimdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimdError::Unknown { value } => write!(
                f,
                "{ENV}={value:?} is not a SIMD level: one of avx512, avx2, portable (or unset: the best this CPU has)"
            ),
            SimdError::Unavailable {
                level,
                missing,
                detected,
            } => write!(
                f,
                "{ENV}={level} needs {}, which this CPU lacks; it runs at most {detected}",
                missing.join(", ")
            ),
        }
    }
}

impl std::error::Error for SimdError {}

/// The level `value` (a `RINGBENCH_SIMD` setting) asks for, if this CPU has it.
pub fn parse(value: &str) -> Result<Level, SimdError> {
    let level = Level::ALL
        .into_iter()
        .find(|l| l.name() == value.trim().to_ascii_lowercase())
        .ok_or_else(|| SimdError::Unknown {
            value: value.to_owned(),
        })?;
    let missing: Vec<&'static str> = level
        .needs()
        .iter()
        .copied()
        .filter(|f| !has_feature(f))
        .collect();
    if missing.is_empty() {
        Ok(level)
    } else {
        Err(SimdError::Unavailable {
            level,
            missing,
            detected: Level::detected(),
        })
    }
}

/// The level `RINGBENCH_SIMD` sets (the detected one when it is unset or empty), read once.
fn chosen() -> &'static Result<Level, SimdError> {
    static CHOSEN: OnceLock<Result<Level, SimdError>> = OnceLock::new();
    CHOSEN.get_or_init(|| match std::env::var(ENV) {
        Ok(value) if !value.trim().is_empty() => parse(&value),
        _ => Ok(Level::detected()),
    })
}

/// Checks `RINGBENCH_SIMD` once, at a program's start: the level the kernels will run at, or why
/// the setting cannot be honoured (a command refuses to run then).
pub fn check() -> Result<Level, SimdError> {
    chosen().clone()
}

/// The level the kernels run at: `RINGBENCH_SIMD`'s when it is valid, else the detected one (a
/// program that calls [`check`] first never reaches that fallback).
pub fn level() -> Level {
    match chosen() {
        Ok(level) => *level,
        Err(_) => Level::detected(),
    }
}

/// The `gemm` crate's f32 microkernels on this CPU: `avx512f`, `fma` (AVX2 + FMA) or `scalar`, as
/// its own dispatch chooses them (from the CPU alone).
pub fn gemm_level() -> &'static str {
    if has_feature("avx512f") {
        "avx512f"
    } else if has_feature("fma") {
        "fma"
    } else {
        "scalar"
    }
}

/// What ran, for a results row: `ours=avx2 gemm=fma`.
pub fn describe() -> String {
    format!("ours={} gemm={}", level(), gemm_level())
}

/// A function compiled at every [`Level`] and called at [`level()`]'s.
///
/// ```ignore
/// simd_fn! {
///     /// `row[j] *= factor`.
///     fn scale_row(row: &mut [f32], factor: f32) {
///         for x in row.iter_mut() { *x *= factor; }
///     }
/// }
/// ```
/// The body is compiled once as an `#[inline(always)]` function and inlined into one wrapper per
/// level that enables that level's instructions; plain argument names only (no patterns).
#[macro_export]
macro_rules! simd_fn {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match $crate::simd::level() {
                    // SAFETY: `level()` says Avx512 only when the CPU has avx512f, avx512vl and fma.
                    $crate::simd::Level::Avx512 => unsafe { avx512($($arg),*) },
                    // SAFETY: and Avx2 only when it has avx2 and fma.
                    $crate::simd::Level::Avx2 => unsafe { avx2($($arg),*) },
                    $crate::simd::Level::Portable => body($($arg),*),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                body($($arg),*)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_is_refused_by_name_when_unknown_or_missing() {
        let err = parse("avx3").unwrap_err();
        assert!(err.to_string().contains("\"avx3\""), "{err}");
        assert_eq!(parse("portable"), Ok(Level::Portable));
        assert_eq!(parse(" AVX2 ").is_ok(), Level::Avx2.available());
        for level in Level::ALL {
            match parse(level.name()) {
                Ok(l) => assert!(l.available() && l <= Level::detected()),
                Err(SimdError::Unavailable { missing, .. }) => {
                    assert!(!level.available());
                    assert!(!missing.is_empty());
                }
                Err(e) => panic!("{level}: {e}"),
            }
        }
    }

    simd_fn! {
        /// A sum in LANES accumulators (a reduction whose order is fixed).
        fn lane_sum(x: &[f32]) -> f32 {
            let mut lanes = [0.0f32; LANES];
            let mut chunks = x.chunks_exact(LANES);
            for chunk in &mut chunks {
                for (acc, x) in lanes.iter_mut().zip(chunk) {
                    *acc += x;
                }
            }
            lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
        }
    }

    #[test]
    fn a_simd_fn_runs_at_the_chosen_level() {
        let x: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut lanes = [0.0f32; LANES];
        for (i, v) in x.iter().enumerate().take(96) {
            lanes[i % LANES] += v;
        }
        let expected = lanes.iter().sum::<f32>() + x[96..].iter().sum::<f32>();
        assert_eq!(lane_sum(&x).to_bits(), expected.to_bits());
        assert!(describe().starts_with(&format!("ours={}", level())));
    }
}
