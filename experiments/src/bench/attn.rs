//! `ringbench bench attn`: achieved GFLOP/s of ring attention beside this machine's matmul rate.
//!
//! FLOPs are useful FLOPs: 4·d per visible (q, k) pair and head for the forward, 10·d more for the
//! backward (5 matmuls, recomputing the scores), as FlashAttention-2 counts them. Every ratio is taken
//! against a matmul rate measured in the same run, since the machines are shared and noisy.

use super::at_least_one;
use crate::backend::{BackendName, OnBackend, on_backend, parse_devices};
use crate::measure::baseline::{matmul_gflops_on, random};
use crate::measure::timing::fastest_after_warm_up;
use crate::results::{Record, Table};
use crate::units::MIB;
use anyhow::{Context, Result};
use burn::backend::Autodiff;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use workbench::dtype::{Dtype, Precision};
use workbench::kernels::flops::{BACKWARD_PER_PAIR_DIM, FORWARD_PER_PAIR_DIM, sequence_pairs};
use workbench::ring::jobs::{AttentionJob, run_attention_on_devices};
use workbench::{BackwardScheme, Direction, Kernel, LayerBackend, RingBackend, RingConfig};

/// `ringbench bench attn`'s arguments.
#[derive(Debug, clap::Args)]
pub struct BenchAttnArgs {
    /// Total lengths.
    #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096,8192", value_parser = at_least_one)]
    pub seq: Vec<usize>,
    /// Rank counts; include 1 for the ring-vs-single ratio.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8", value_parser = at_least_one)]
    pub ranks: Vec<usize>,
    /// Strategies to run; all registered ones by default.
    #[arg(long, visible_alias = "strategy", value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Kernels to time: fused (the CPU kernel on flex, the CubeCL kernel on a device), generic
    /// (default: both).
    #[arg(long, visible_alias = "kernel", value_delimiter = ',')]
    pub kernels: Vec<Kernel>,
    /// Backend: flex (CPU), wgpu or cuda.
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
    /// Devices of the ranks, comma-separated (rank r on the (r mod n)-th).
    #[arg(long)]
    pub devices: Option<String>,
    /// Side of the square matmul measured beside every row.
    #[arg(long, default_value_t = 1024)]
    pub matmul: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Dimension of a head.
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Timed repetitions per row, after one untimed warm-up run; the fastest is reported.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Element type of q, k, v and dO, of P and dS in their products, and of the outputs (the
    /// accumulators between ring steps stay f32): f32, or bf16 (on the CPU, AVX512-BF16's
    /// `vdpbf16ps` where the CPU has it: `kernel_impl` says which).
    #[arg(long, default_value = "f32")]
    pub dtype: Dtype,
    /// Also write bench_attn.csv and bench_attn.md here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// How the generic kernel multiplies on a CubeCL device: f32 (CubeCL's unit matmul, exact to
    /// 1e-5: the default) or autotuned (Burn's autotuned matmul, which computes f32 in TF32 on
    /// NVIDIA tensor cores; `kernel_impl` then says `generic-autotuned`).
    #[arg(long, default_value = "f32")]
    pub generic_matmul: GenericMatmulArg,
    /// Record every rank's timeline (tiles, ring traffic, the model's layers) into this Chrome
    /// trace-event JSON file (Perfetto, chrome://tracing).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// `--generic-matmul`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GenericMatmulArg {
    /// Every product and sum in f32.
    F32,
    /// Burn's autotuned matmul (TF32 on NVIDIA tensor cores).
    Autotuned,
}

impl From<GenericMatmulArg> for workbench::kernels::GenericMatmul {
    fn from(arg: GenericMatmulArg) -> Self {
        match arg {
            GenericMatmulArg::F32 => workbench::kernels::GenericMatmul::F32,
            GenericMatmulArg::Autotuned => workbench::kernels::GenericMatmul::Autotuned,
        }
    }
}

/// One row of `bench_attn.csv`.
#[derive(Debug, Clone, Serialize)]
pub struct AttnBenchRow {
    /// Total tokens.
    pub seq: usize,
    /// Ranks.
    pub ranks: usize,
    /// Strategy name.
    pub strategy: String,
    /// Causal mask.
    pub causal: bool,
    /// The operands' element type (`--dtype`).
    pub dtype: &'static str,
    /// Kernel name.
    pub kernel: String,
    /// Backend name.
    pub backend: String,
    /// Fastest forward, seconds.
    pub fwd_seconds: f64,
    /// Forward useful GFLOP/s.
    pub fwd_gflops: f64,
    /// Fastest forward + backward, seconds.
    pub fwd_bwd_seconds: f64,
    /// Forward + backward useful GFLOP/s.
    pub fwd_bwd_gflops: f64,
    /// The `--matmul`³ matmul rate on the same backend, measured beside this row.
    pub matmul_gflops: f64,
    /// fwd+bwd GFLOP/s over the matmul GFLOP/s of the same run.
    pub fwd_bwd_over_matmul: f64,
    /// fwd+bwd time of this row over the N = 1 row with the same length, strategy, causal, kernel.
    pub ring_over_single: Option<f64>,
    /// Bytes allocated during fwd+bwd per rank and ring step (forward and backward steps).
    pub alloc_mib_per_rank_step: Option<f64>,
    /// Peak live bytes during fwd+bwd above the start, per rank.
    pub peak_mib_per_rank: Option<f64>,
    /// What one rank must hold in the backward: q, dO, dQ, out, 2 × (K, V, dK, dV), 4 row statistics.
    pub working_set_mib_per_rank: f64,
    /// The most bytes any rank's ring step moved between host and device in fwd+bwd.
    pub host_device_bytes_per_step: u64,
    /// What computed the tiles: `cpu-fused` (`cpu-fused-avx512bf16` with bf16 operands), `cubecl-fused`
    /// or `generic`.
    pub kernel_impl: &'static str,
    /// Every byte fwd+bwd moved between host and device, all ranks: inputs placed, outputs and
    /// gradients read, and the ring steps' (on flex, copies between host arrays and tensors).
    pub host_device_bytes_per_call: u64,
    /// The CPU's model name.
    pub cpu: String,
    /// The SIMD path that ran (`workbench::simd::describe`: ours, and the `gemm` crate's).
    pub simd: String,
}

struct Measured {
    seconds: f64,
    allocated: usize,
    peak: usize,
}

/// `ringbench bench attn`.
pub fn run(args: &BenchAttnArgs) -> Result<()> {
    // Chosen for the whole process before any rank starts; every row's `kernel_impl` says it.
    workbench::kernels::set_generic_matmul(args.generic_matmul.into());
    let devices = args.devices.as_deref().map(parse_devices).transpose()?;
    on_backend(
        args.backend,
        devices.as_deref().unwrap_or(&[]),
        BenchOn(args),
    )
}

struct BenchOn<'a>(&'a BenchAttnArgs);

impl OnBackend for BenchOn<'_> {
    type Output = ();
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<()> {
        bench_attn::<I>(self.0, &devices)
    }
}

fn bench_attn<I: RingBackend>(args: &BenchAttnArgs, devices: &[I::Device]) -> Result<()> {
    let kernels = match &args.kernels[..] {
        [] => Kernel::ALL.to_vec(),
        given => given.to_vec(),
    };
    let matmul_gflops = || matmul_gflops_on::<I>(args.matmul, &devices[0]);
    let strategies: Vec<String> = if args.strategies.is_empty() {
        strategies::names().into_iter().map(String::from).collect()
    } else {
        args.strategies.clone()
    };
    let mut cases = Vec::new();
    for &seq in &args.seq {
        for strategy in &strategies {
            for causal in [false, true] {
                for &kernel in &kernels {
                    for &ranks in &args.ranks {
                        cases.push((seq, ranks, strategy.as_str(), causal, kernel));
                    }
                }
            }
        }
    }
    let counting = crate::alloc::active();
    println!(
        "matmul {n}^3 f32 ({}): {:.1} GFLOP/s",
        args.backend,
        matmul_gflops(),
        n = args.matmul
    );
    let bar = ProgressBar::new(cases.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} {msg}")
            .context("progress template")?,
    );
    let mut rows: Vec<AttnBenchRow> = Vec::new();
    for (seq, ranks, strategy, causal, kernel) in cases {
        bar.set_message(format!(
            "S={seq} N={ranks} {strategy} causal={causal} {kernel}"
        ));
        let (b, h, d) = (args.batch, args.heads, args.head_dim);
        let partition = strategies::by_name(strategy)?;
        if let Err(e) = partition.validate(seq, ranks) {
            bar.println(format!("skip S={seq} N={ranks} {strategy}: {e}"));
            bar.inc(1);
            continue;
        }
        let q = random(vec![b, seq, h, d], 1);
        let k = random(vec![b, seq, h, d], 2);
        let v = random(vec![b, seq, h, d], 3);
        let d_out = random(vec![b, seq, h, d], 4);
        let mut host_device_bytes_per_step = 0;
        let (mut kernel_impl, mut host_device_bytes_per_call) = ("", 0);
        let mut time = |with_grad: bool| -> Result<Measured> {
            let job = AttentionJob {
                q: &q,
                k: &k,
                v: &v,
                d_out: with_grad.then_some(&d_out),
                ranks,
                ulysses: 1,
                strategy: partition,
                config: RingConfig {
                    causal,
                    forward: Direction::Cw,
                    backward: BackwardScheme::Kv,
                    kernel,
                    scale: None,
                    window: None,
                    softcap: None,
                    lockstep: false,
                    precision: Precision {
                        dtype: args.dtype,
                        merge: Dtype::F32,
                    },
                },
                timeout: Duration::from_secs(3600),
                fault: None,
                link: None,
                doc_lens: &[],
                sinks: None,
            };
            fastest_after_warm_up(
                args.repeats,
                || {
                    crate::alloc::reset();
                    let start = Instant::now();
                    let result = run_attention_on_devices::<Autodiff<I>>(&job, devices)?;
                    let seconds = start.elapsed().as_secs_f64();
                    let most = result.traffic.iter().flat_map(|t| &t.host_device);
                    host_device_bytes_per_step = most.map(|r| r.bytes).max().unwrap_or(0);
                    kernel_impl = result.kernel_impl;
                    host_device_bytes_per_call = result.host_device_bytes.iter().sum();
                    let stats = crate::alloc::stats();
                    Ok(Measured {
                        seconds,
                        allocated: stats.allocated,
                        peak: stats.peak_above_start,
                    })
                },
                |m| m.seconds,
            )
        };
        let fwd = time(false)?;
        let fwd_bwd = time(true)?;
        // The baseline is re-measured beside every row: these machines are shared and noisy.
        let matmul = matmul_gflops();
        let pair_dims = (sequence_pairs(seq, causal) * (b * h * d) as u64) as f64;
        let fwd_flops = FORWARD_PER_PAIR_DIM as f64 * pair_dims;
        let fwd_bwd_flops = (FORWARD_PER_PAIR_DIM + BACKWARD_PER_PAIR_DIM) as f64 * pair_dims;
        let single = rows
            .iter()
            .find(|r| {
                r.seq == seq
                    && r.ranks == 1
                    && r.strategy == strategy
                    && r.causal == causal
                    && r.dtype == args.dtype.name()
                    && r.kernel == kernel.to_string()
            })
            .map(|r| r.fwd_bwd_seconds);
        let t = seq / ranks;
        let block = (b * h * t * d * 4) as f64;
        let row = AttnBenchRow {
            seq,
            ranks,
            strategy: strategy.to_owned(),
            causal,
            dtype: args.dtype.name(),
            kernel: kernel.to_string(),
            backend: args.backend.to_string(),
            fwd_seconds: fwd.seconds,
            fwd_gflops: fwd_flops / fwd.seconds / 1e9,
            fwd_bwd_seconds: fwd_bwd.seconds,
            fwd_bwd_gflops: fwd_bwd_flops / fwd_bwd.seconds / 1e9,
            matmul_gflops: matmul,
            fwd_bwd_over_matmul: fwd_bwd_flops / fwd_bwd.seconds / 1e9 / matmul,
            ring_over_single: single.map(|s| fwd_bwd.seconds / s),
            alloc_mib_per_rank_step: counting
                .then(|| fwd_bwd.allocated as f64 / (ranks * 2 * ranks) as f64 / MIB),
            peak_mib_per_rank: counting.then(|| fwd_bwd.peak as f64 / ranks as f64 / MIB),
            working_set_mib_per_rank: (12.0 * block + 4.0 * (b * h * t * 4) as f64) / MIB,
            host_device_bytes_per_step,
            kernel_impl,
            host_device_bytes_per_call,
            cpu: crate::measure::machine::cpu_model(),
            simd: workbench::simd::describe(),
        };
        if bar.is_hidden() {
            println!("{}", format_row(&row));
        } else {
            bar.println(format_row(&row));
        }
        rows.push(row);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let about = about(&rows, args);
    let table = Table::of(rows.iter().map(Record::of).collect::<Result<_>>()?);
    match &args.out {
        Some(dir) => {
            let md = table.write(dir, "bench_attn", "bench attn", &about)?;
            println!("\n{md}");
        }
        None => println!("\n{about}\n\n{}", table.markdown()),
    }
    Ok(())
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn format_row(r: &AttnBenchRow) -> String {
    format!(
        "S={:5} N={} {:10} causal={:5} {:7} ({}) {} fwd {:7.3}s {:6.1} GFLOP/s  fwd+bwd {:7.3}s {:6.1} GFLOP/s ({:.2} of matmul {:.1} GFLOP/s, ring/single {}, host<->device {} B/step, {} B/call)",
        r.seq,
        r.ranks,
        r.strategy,
        r.causal,
        r.kernel,
        r.kernel_impl,
        r.backend,
        r.fwd_seconds,
        r.fwd_gflops,
        r.fwd_bwd_seconds,
        r.fwd_bwd_gflops,
        r.fwd_bwd_over_matmul,
        r.matmul_gflops,
        opt(r.ring_over_single, 2),
        r.host_device_bytes_per_step,
        r.host_device_bytes_per_call,
    )
}

fn about(rows: &[AttnBenchRow], args: &BenchAttnArgs) -> String {
    format!(
        "batch {}, heads {}, head_dim {}; backend {}; matmul {}^3 f32 on the same backend, best of 5, is measured \
         beside every row (first row: {:.1} GFLOP/s) and `fwd_bwd_over_matmul` is against that row's value. FLOPs: \
         4·d (forward) + 10·d (backward) per visible (q, k) pair and head. `host_device_bytes_per_step`: the most \
         any rank's ring step copied between host and device; `host_device_bytes_per_call`: every byte fwd+bwd copied \
         between host and device, inputs and outputs included; `kernel_impl`: what computed the tiles; `simd`: the \
         SIMD path our loops ran at (`RINGBENCH_SIMD`, else the best this CPU has) and the one the `gemm` crate's \
         products chose.",
        args.batch,
        args.heads,
        args.head_dim,
        args.backend,
        args.matmul,
        rows.first().map_or(0.0, |r| r.matmul_gflops),
    )
}
