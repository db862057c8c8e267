//! `ringbench train`, `ringbench eval-lines` and `ringbench gen-lines`: the LongChat line-retrieval task.
//!
//! `spec.rs` is the training spec and its prompts, [`data`] what a step sees (plain records, chat
//! turns, a user's conversations), `train.rs` one sitting of a training run,
//! [`resume`] its resumable checkpoints, [`metrics`] its `metrics.csv`, `checkpoint.rs` the final
//! checkpoint `eval-lines` reads, [`start`] what a model starts from (its own seeded init or a Hugging
//! Face directory) and is saved as, `eval.rs` evaluation and fresh cases.

mod checkpoint;
pub mod data;
mod eval;
pub mod metrics;
pub mod resume;
mod spec;
pub mod start;
mod train;

pub use checkpoint::load_checkpoint;
pub use eval::{
    AccuracyRow, EvalArgs, Evaluation, GenArgs, Reply, accuracy, decoding, evaluate,
    pretrained_options, run_eval, run_gen,
};
pub(crate) use spec::one_question;
pub use spec::{
    LineTrainSection, ModelSpec, Prompts, RingSpec, Schedule, StageSpec, TrainSpec, example,
    load_spec, trained_lines,
};

use crate::backend::{BackendName, OnBackend, on_backend};
use crate::nccl_rank::NcclRank;
use anyhow::{Result, bail};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use std::path::PathBuf;
use train::train_with;
use workbench::LayerBackend;
use workbench::transport::Comm;

/// `ringbench train`'s arguments.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The training spec, e.g. experiments/line_retrieval.toml.
    #[arg(long)]
    pub config: PathBuf,
    /// Train from step 0 even when the spec's `out` holds a finished run or a checkpoint to resume
    /// (they are removed first).
    #[arg(long)]
    pub force: bool,
    /// Backend: flex (CPU), wgpu or cuda (every rank on the backend's default device; over NCCL,
    /// on its own GPU).
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
    /// GPU ranks over NCCL (feature `nccl`), one process per rank started by a launcher (torchrun
    /// style `RANK`/`WORLD_SIZE`/`LOCAL_RANK`, or mpirun): NCCL's id is exchanged through this file
    /// (rank 0 writes it). The world size must be the spec's `ring.ranks`. On cuda every step's
    /// gradient is all-reduced in GPU memory.
    #[arg(long)]
    pub nccl_id_file: Option<PathBuf>,
    /// Only redraw the spec's `out/loss.svg` from its `metrics.csv`, and exit.
    #[arg(long)]
    pub replot: bool,
    /// Train on this many ranks instead of the spec's `ring.ranks` (e.g. 1, to compare the peak
    /// memory per rank the last line reports).
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Train this many steps instead of the spec's `train.steps` (the schedule stretches with it).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Write the run here instead of the spec's `train.out`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record every rank's timeline (tiles, ring traffic, the model's layers) into this Chrome
    /// trace-event JSON file (Perfetto, chrome://tracing).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// `ringbench train`: trains, or resumes the run in the spec's `out` from its newest good
/// checkpoint, and writes the checkpoint, metrics and loss curve.
pub fn run_train(args: &TrainArgs) -> Result<()> {
    let mut spec = load_spec(&args.config)?;
    if let Some(ranks) = args.ranks {
        spec.ring.ranks = ranks;
    }
    if let Some(steps) = args.steps {
        if !spec.stages.is_empty() {
            bail!("--steps with [[stages]]: each stage gives its own steps");
        }
        spec.train.steps = steps;
    }
    if let Some(out) = &args.out {
        spec.train.out = out.clone();
    }
    if args.replot {
        return train::replot(&spec.train.out);
    }
    let Some(id_file) = &args.nccl_id_file else {
        return on_backend(
            args.backend,
            &[],
            TrainOn {
                spec: &spec,
                comm: None,
                force: args.force,
            },
        );
    };
    let place = NcclRank::from_env()?;
    let timeout = spec
        .train
        .schedule()
        .options(spec.ring.ranks, spec.ring.config()?)
        .timeout;
    let comm = place.join(id_file, timeout)?;
    on_backend(
        args.backend,
        &place.devices(args.backend),
        TrainOn {
            spec: &spec,
            comm: Some(comm),
            force: args.force,
        },
    )
}

/// Training on one backend: every rank on threads (or under mpirun), or this process's rank over
/// `comm`.
struct TrainOn<'a> {
    spec: &'a TrainSpec,
    comm: Option<Comm>,
    force: bool,
}

impl OnBackend for TrainOn<'_> {
    type Output = ();
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<()> {
        let runs = self.spec.runs()?;
        if runs.len() > 1 && self.comm.is_some() {
            bail!(
                "[[stages]] run on threads or under mpirun: over NCCL, give each stage a command"
            );
        }
        let mut comm = self.comm;
        for (i, run) in runs.iter().enumerate() {
            if runs.len() > 1 {
                println!(
                    "== stage {} of {}: {}",
                    i + 1,
                    runs.len(),
                    run.train.out.display()
                );
            }
            if run.model.checkpointing {
                train_with::<Autodiff<I, BalancedCheckpointing>>(
                    run,
                    &devices[0],
                    comm.take(),
                    self.force,
                )?;
            } else {
                train_with::<Autodiff<I>>(run, &devices[0], comm.take(), self.force)?;
            }
        }
        Ok(())
    }
}
