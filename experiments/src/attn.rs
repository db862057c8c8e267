//! `ringbench attn`: ring attention on NumPy arrays, for checking against PyTorch or JAX.

use crate::backend::{BackendName, OnBackend, on_backend, parse_devices};
use crate::nccl_rank::NcclRank;
use crate::npy;
use crate::timeline::TraceFile;
use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use std::path::{Path, PathBuf};
use std::time::Duration;
use workbench::dtype::{Dtype, Precision};
use workbench::ring::jobs::{
    AttentionJob, AttentionResult, Fault, FaultKind, HostTensor, run_attention_on_devices,
};
use workbench::transport::{Comm, Phase};
use workbench::{BackwardScheme, Direction, Kernel, LayerBackend, RingConfig};

/// `ringbench attn`'s arguments.
#[derive(Debug, clap::Args)]
pub struct AttnArgs {
    /// Queries, (batch, seq, heads, head_dim), float32 or float64.
    #[arg(long)]
    pub q: PathBuf,
    /// Keys, (batch, seq, kv_heads, head_dim); kv_heads must divide heads.
    #[arg(long)]
    pub k: PathBuf,
    /// Values, shaped like the keys.
    #[arg(long)]
    pub v: PathBuf,
    /// Gradient of the loss with respect to the output; enables dq, dk, dv.
    #[arg(long = "do")]
    pub d_out: Option<PathBuf>,
    /// Ranks (threads), or the world size under a launcher.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Head × context parallelism: groups of U ranks split the heads by an all-to-all (Ulysses) and
    /// the ranks/U groups run the ring; U divides the ranks and the query heads, and divides the
    /// key/value heads or is a multiple of them (replicated). 1: the ring alone.
    #[arg(long, default_value_t = 1)]
    pub ulysses: usize,
    /// Partition strategy by name.
    #[arg(long, visible_alias = "strategies", default_value = "zigzag")]
    pub strategy: String,
    /// Mask keys after each query (causal attention).
    #[arg(long)]
    pub causal: bool,
    /// Forward ring direction: cw (to rank+1) or ccw (to rank−1). Specs call it `forward`.
    #[arg(long, visible_alias = "fwd-dir", default_value = "cw")]
    pub forward: Direction,
    /// Backward scheme: kv, kv-reverse or q. Specs call it `backward`.
    #[arg(long, visible_alias = "bwd", default_value = "kv")]
    pub backward: BackwardScheme,
    /// Tile kernel: fused (fast CPU path, on host blocks) or generic (Burn tensor ops on the
    /// backend's device; what runs on wgpu and cuda).
    #[arg(long, visible_alias = "kernels", default_value = "fused")]
    pub kernel: Kernel,
    /// Backend: flex (CPU), wgpu or cuda (each compiled in by its feature).
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
    /// Devices of the ranks, comma-separated (rank r on the (r mod n)-th); default: the backend's
    /// default device.
    #[arg(long)]
    pub devices: Option<String>,
    /// A sliding window: a query sees only keys less than W positions away (and, causal, not after
    /// it). Default: no window.
    #[arg(long)]
    pub window: Option<usize>,
    /// Logit soft-capping: scores become C·tanh(s/C) before masking (C > 0). Default: none.
    #[arg(long, allow_hyphen_values = true)]
    pub softcap: Option<f32>,
    /// Attention sinks: a .npy of one logit per query head (shape `[heads]`, float32 or float64), joining
    /// every row's softmax denominator; with --do, dsinks.npy is written too.
    #[arg(long)]
    pub sinks: Option<PathBuf>,
    /// Element type of q, k, v and dO (rounded on entry), of every block that travels, of P and dS
    /// in their products, and of the outputs: f32 or bf16 (the .npy files are float32 either way).
    #[arg(long, default_value = "f32")]
    pub dtype: Dtype,
    /// Element type of each rank's running output and gradient accumulators between ring steps (a
    /// travelling accumulator is sent in it): f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub merge: Dtype,
    /// Packed documents: their lengths, comma-separated, summing to seq (a query attends only within
    /// its document). Default: one document.
    #[arg(long)]
    pub doc_lens: Option<String>,
    /// Seconds a rank waits for a peer before giving up.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Directory for out.npy, lse.npy and the gradients.
    #[arg(long)]
    pub out: PathBuf,
    /// GPU ranks over NCCL (feature `nccl`): NCCL's id is exchanged through this file (rank 0 writes
    /// it). Rank, world size and GPU come from RANK / WORLD_SIZE / LOCAL_RANK or Open MPI's variables.
    #[arg(long)]
    pub nccl_id_file: Option<PathBuf>,
    /// Fault injection (tests): this rank fails at its `--fail-step`-th exchange of `--fail-phase`.
    #[arg(long, requires_all = ["fail_phase", "fail_step"])]
    pub fail_rank: Option<usize>,
    /// The phase whose exchanges `--fail-step` counts: fwd (the forward ring pass), bwd (the
    /// backward's) or all-to-all (Ulysses' exchanges of heads, forward and backward).
    #[arg(long, requires = "fail_rank")]
    pub fail_phase: Option<FailPhase>,
    /// The exchange, counted from 0 within the phase on the failing rank; one past the phase's last
    /// is refused before the job starts, naming how many the phase has.
    #[arg(long, requires = "fail_rank")]
    pub fail_step: Option<usize>,
    /// How the rank fails: `error` (a typed transport error; its peers hear of it at once) or
    /// `kill` (its process dies by SIGKILL, as a crashed MPI rank: run it under mpirun).
    #[arg(long, default_value = "error", requires = "fail_rank")]
    pub fail_mode: FailMode,
    /// Record every rank's timeline (tiles, sends, receives, waits) into this Chrome trace-event
    /// JSON file (Perfetto, chrome://tracing); under mpirun rank 0 writes every process's ranks.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// `--fail-phase`: which exchanges `--fail-step` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailPhase {
    /// The forward ring pass.
    Fwd,
    /// The backward ring pass (any scheme).
    Bwd,
    /// Ulysses' all-to-alls (with `--ulysses` above 1).
    AllToAll,
}

impl FailPhase {
    fn phase(self) -> Phase {
        match self {
            FailPhase::Fwd => Phase::Forward,
            FailPhase::Bwd => Phase::Backward,
            FailPhase::AllToAll => Phase::AllToAll,
        }
    }
}

/// `--fail-mode`: what the failing rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailMode {
    /// A typed error at the exchange.
    Error,
    /// SIGKILL of the rank's process at the exchange.
    Kill,
}

/// The job on in-process threads, or, under `mpirun`, as this process's rank, on one backend.
struct AttnOnBackend<'a> {
    job: &'a AttentionJob<'a>,
    timeout: Duration,
}

impl OnBackend for AttnOnBackend<'_> {
    /// The results on the process that writes them (rank 0 under MPI).
    type Output = Option<AttentionResult>;

    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<Self::Output> {
        let ranked = crate::mpi_rank::as_mpi_rank(self.timeout, |comm| {
            let device = &devices[comm.rank() % devices.len()];
            workbench::ring::jobs::run_attention_on::<Autodiff<I>>(comm, self.job, device)
        })?;
        if let Some((rank, result)) = ranked {
            return Ok((rank == 0).then_some(result));
        }
        Ok(Some(run_attention_on_devices::<Autodiff<I>>(
            self.job, &devices,
        )?))
    }
}

/// This process's rank over NCCL, on one device of the chosen backend: on flex NCCL stages every
/// block through host memory; on cuda it sends the tensors' own GPU memory.
fn run_nccl(job: &AttentionJob, id_file: &Path, args: &AttnArgs) -> Result<()> {
    let place = NcclRank::from_env()?;
    let comm = place.join(id_file, Duration::from_secs_f64(args.timeout))?;
    struct OnRank<'a> {
        job: &'a AttentionJob<'a>,
        comm: Comm,
    }
    impl OnBackend for OnRank<'_> {
        type Output = AttentionResult;
        fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<Self::Output> {
            Ok(workbench::ring::jobs::run_attention_on::<Autodiff<I>>(
                self.comm,
                self.job,
                &devices[0],
            )?)
        }
    }
    let result = on_backend(
        args.backend,
        &place.devices(args.backend),
        OnRank { job, comm },
    )?;
    if place.rank == 0 {
        write_outputs(args, &result)?;
    }
    Ok(())
}

/// Reads one input array; it must have the four axes (batch, seq, heads, head_dim).
fn read_4d(path: &Path) -> Result<HostTensor> {
    let array = npy::read(path)?;
    if array.shape.len() != 4 {
        bail!(
            "{}: expected a 4-D array (batch, seq, heads, head_dim), got shape {:?}",
            path.display(),
            array.shape
        );
    }
    Ok(array)
}

/// The sinks' `.npy`: one logit a query head, a 1-D array (its length and values are checked by the
/// job against the heads).
fn read_sinks(path: &Path) -> Result<Vec<f32>> {
    let array = npy::read(path)?;
    if array.shape.len() != 1 {
        bail!(
            "{}: expected a 1-D array of one logit per query head, got shape {:?}",
            path.display(),
            array.shape
        );
    }
    Ok(array.data)
}

/// `--doc-lens 5,17,26` as lengths (checked against the sequence by the job).
fn parse_doc_lens(text: Option<&str>) -> Result<Vec<usize>> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("--doc-lens: '{}' is not a length", s.trim()))
        })
        .collect()
}

/// `ringbench attn`: reads the arrays, runs the ring, writes the outputs.
pub fn run_command(args: &AttnArgs) -> Result<()> {
    let q = read_4d(&args.q)?;
    let k = read_4d(&args.k)?;
    let v = read_4d(&args.v)?;
    let d_out = args.d_out.as_deref().map(read_4d).transpose()?;
    let doc_lens = parse_doc_lens(args.doc_lens.as_deref())?;
    let sinks = args.sinks.as_deref().map(read_sinks).transpose()?;
    let job = AttentionJob {
        q: &q,
        k: &k,
        v: &v,
        d_out: d_out.as_ref(),
        ranks: args.ranks,
        ulysses: args.ulysses,
        strategy: strategies::by_name(&args.strategy)?,
        config: RingConfig {
            causal: args.causal,
            forward: args.forward,
            backward: args.backward,
            kernel: args.kernel,
            scale: None,
            window: args.window,
            softcap: args.softcap,
            lockstep: false,
            precision: Precision {
                dtype: args.dtype,
                merge: args.merge,
            },
        },
        timeout: Duration::from_secs_f64(args.timeout),
        fault: match (args.fail_rank, args.fail_phase, args.fail_step) {
            (Some(rank), Some(phase), Some(step)) => Some(Fault {
                rank,
                phase: phase.phase(),
                step,
                kind: match args.fail_mode {
                    FailMode::Error => FaultKind::Fail,
                    FailMode::Kill => FaultKind::Kill,
                },
            }),
            _ => None,
        },
        link: None,
        doc_lens: &doc_lens,
        sinks: sinks.as_deref(),
    };
    if let Some(id_file) = &args.nccl_id_file {
        return run_nccl(&job, id_file, args);
    }
    let devices = args.devices.as_deref().map(parse_devices).transpose()?;
    let work = AttnOnBackend {
        job: &job,
        timeout: Duration::from_secs_f64(args.timeout),
    };
    let trace = TraceFile::start(args.trace.as_deref());
    let Some(result) = on_backend(args.backend, devices.as_deref().unwrap_or(&[]), work)? else {
        // Another MPI rank: rank 0 wrote the outputs and the trace, its events gathered.
        workbench::trace::uninstall();
        return Ok(());
    };
    write_outputs(args, &result)?;
    if let Some(trace) = trace {
        trace.finish()?;
    }
    Ok(())
}

/// Writes out.npy, lse.npy and, with gradients, dq/dk/dv.npy into `--out`.
fn write_outputs(args: &AttnArgs, result: &AttentionResult) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let write = |name: &str, t| npy::write(&Path::new(&args.out).join(name), t);
    write("out.npy", &result.out)?;
    write("lse.npy", &result.lse)?;
    let mut written = vec!["out.npy", "lse.npy"];
    if let Some(g) = &result.grads {
        write("dq.npy", &g.dq)?;
        write("dk.npy", &g.dk)?;
        write("dv.npy", &g.dv)?;
        written.extend(["dq.npy", "dk.npy", "dv.npy"]);
        if let Some(dsinks) = &g.dsinks {
            write(
                "dsinks.npy",
                &HostTensor::new(vec![dsinks.len()], dsinks.clone()),
            )?;
            written.push("dsinks.npy");
        }
    }
    // Under MPI or NCCL every process holds every rank's traffic; this process's ranks are counted.
    let here = || result.ranks_here.iter().map(|&r| &result.traffic[r]);
    let bytes: u64 = here().map(|t| t.total_bytes()).sum();
    let host_device: u64 = here().map(|t| t.host_device_bytes()).sum();
    let seq = result.out.shape[1];
    let padded = if result.padded_len == seq {
        String::new()
    } else {
        format!(
            "; {} cannot split {seq} tokens over {} ranks: padded to {} (padding masked, its rows dropped)",
            args.strategy, args.ranks, result.padded_len
        )
    };
    let precision = match (args.dtype, args.merge) {
        (Dtype::F32, Dtype::F32) => String::new(),
        (dtype, merge) => format!(", {dtype} operands and blocks, {merge} merge"),
    };
    let grid = match args.ulysses {
        1 => String::new(),
        u => format!(" as {u} Ulysses x {} ring", args.ranks / u),
    };
    println!(
        "wrote {} to {} ({} ranks{grid}, {} on {}, kernel {}{precision}{padded}; the call moved {} bytes between host and device, {} of them in ring steps; this process ran {} of them, which sent {} bytes)",
        written.join(", "),
        args.out.display(),
        args.ranks,
        args.strategy,
        args.backend,
        result.kernel_impl,
        result.host_device_bytes.iter().sum::<u64>(),
        host_device,
        result.ranks_here.len(),
        bytes
    );
    Ok(())
}
