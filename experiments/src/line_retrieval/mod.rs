//! `ringbench train`, `ringbench eval-lines` and `ringbench gen-lines`: the LongChat line-retrieval task.

mod checkpoint;
mod eval;
mod spec;

pub use checkpoint::load_checkpoint;
pub use eval::{AccuracyRow, EvalArgs, GenArgs, accuracy, run_eval, run_gen};
pub use spec::{
    LineTrainSection, ModelSpec, Prompts, RingSpec, Schedule, TrainSpec, example, load_spec,
};

use crate::backend::{BackendName, OnBackend, on_backend};
use crate::nccl_rank::NcclRank;
use crate::results::RowWriter;
use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::tensor::backend::{AutodiffBackend, Backend};
use checkpoint::save_checkpoint;
use datasets::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;
use workbench::model::lazy::seeded;
use workbench::model::{Llama, LlamaConfig};
use workbench::train::{Example, StepLog, TrainOptions, train};
use workbench::transport::Comm;
use workbench::{HostRead, LayerBackend};

/// One row of `metrics.csv`.
#[derive(Debug, Serialize)]
struct MetricsRow {
    step: usize,
    loss: f64,
    lr: f64,
    tokens_per_second: f64,
    elapsed_seconds: f64,
}

/// `ringbench train`'s arguments.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The training spec, e.g. experiments/line_retrieval.toml.
    #[arg(long)]
    pub config: PathBuf,
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
}

/// `ringbench train`: trains and writes the checkpoint, metrics and loss curve.
pub fn run_train(args: &TrainArgs) -> Result<()> {
    let spec = load_spec(&args.config)?;
    let Some(id_file) = &args.nccl_id_file else {
        return on_backend(
            args.backend,
            &[],
            TrainOn {
                spec: &spec,
                comm: None,
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
        },
    )
}

/// Training on one backend: every rank on threads (or under mpirun), or this process's rank over
/// `comm`.
struct TrainOn<'a> {
    spec: &'a TrainSpec,
    comm: Option<Comm>,
}

impl OnBackend for TrainOn<'_> {
    type Output = ();
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<()> {
        if self.spec.model.checkpointing {
            train_with::<Autodiff<I, BalancedCheckpointing>>(self.spec, &devices[0], self.comm)
        } else {
            train_with::<Autodiff<I>>(self.spec, &devices[0], self.comm)
        }
    }
}

fn train_with<B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend>(
    spec: &TrainSpec,
    device: &B::Device,
    comm: Option<Comm>,
) -> Result<()> {
    let tokenizer = Tokenizer::line_retrieval();
    let config = spec.model.config(tokenizer.vocab_size());
    config.validate()?;
    let t = &spec.train;
    let partition = strategies::by_name(&spec.ring.strategy)?;
    let options = t.schedule().options(spec.ring.ranks, spec.ring.config()?);
    std::fs::create_dir_all(&t.out)?;
    std::fs::write(t.out.join("train.toml"), toml::to_string(spec)?)?;
    let model = match &t.init {
        None => seeded::<B, _>(t.seed, device, || config.init::<B>(device)),
        Some(dir) => start_from::<B>(dir, &config, device)?,
    };
    println!(
        "training {} parameters{} on {} ranks ({}), {} steps of {} prompts with {}..={} lines",
        config.num_params(),
        t.init
            .as_ref()
            .map(|d| format!(" from {}", d.display()))
            .unwrap_or_default(),
        options.ranks,
        spec.ring.strategy,
        t.steps,
        t.batch,
        t.min_lines,
        t.num_lines
    );
    let prompts = Prompts {
        seed: t.seed,
        batch: t.batch,
        min_lines: t.min_lines,
        num_lines: t.num_lines,
        lm_weight: t.lm_weight,
    };
    prompts.check().context("train")?;
    let batch_for = |step: usize| prompts.batch(&tokenizer, step);
    let bar = ProgressBar::new(t.steps as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("template")?,
    );
    // Created by the first step's report, which only rank 0 makes (other MPI ranks must not truncate it).
    let metrics: std::sync::Mutex<Option<RowWriter>> = std::sync::Mutex::new(None);
    let start = Instant::now();
    let recent = std::sync::Mutex::new(std::collections::VecDeque::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let on_step = |log: &StepLog| {
        let tokens_per_s = log.tokens as f64 / log.seconds;
        bar.set_message(format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            log.loss, log.lr, tokens_per_s
        ));
        bar.inc(1);
        let mut w = metrics.lock().expect("metrics lock");
        if w.is_none() {
            *w = RowWriter::create(&t.out.join("metrics.csv")).ok();
        }
        if let Some(w) = w.as_mut() {
            // Metrics are a record of the run, not the run: a full disk must not stop training.
            let _ = w.write(&MetricsRow {
                step: log.step,
                loss: log.loss,
                lr: log.lr,
                tokens_per_second: tokens_per_s,
                elapsed_seconds: start.elapsed().as_secs_f64(),
            });
        }
        let mut r = recent.lock().expect("recent lock");
        r.push_back(log.loss);
        if r.len() > 50 {
            r.pop_front();
        }
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let late = t.max_minutes > 0.0 && start.elapsed().as_secs_f64() > t.max_minutes * 60.0;
        if (t.stop_loss > 0.0 && r.len() == 50 && mean < t.stop_loss) || late {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if bar.is_hidden() && log.step.is_multiple_of(50) {
            println!(
                "step {} loss {:.4} lr {:.2e} {:.0} tok/s",
                log.step, log.loss, log.lr, tokens_per_s
            );
        }
    };
    let trained = run_training(comm, model, partition, &options, batch_for, on_step, &stop)?;
    let Some(trained) = trained else {
        return Ok(()); // a rank other than 0 of a launcher: rank 0 writes the checkpoint
    };
    bar.finish();
    save_checkpoint(&t.out, &trained.model, &config, &tokenizer)?;
    // Mean loss over windows of up to 50 steps, so that the curve is readable at thousands of steps.
    let window = trained.losses.len().div_ceil(200).clamp(1, 50);
    let curve = trained
        .losses
        .chunks(window)
        .enumerate()
        .map(|(i, c)| ((i * window) as f64, c.iter().sum::<f64>() / c.len() as f64))
        .collect();
    let chart = crate::plot::Chart {
        title: "Training loss (weighted next-token cross-entropy)",
        x: crate::plot::Axis::new("step", crate::plot::Scale::Linear),
        y: crate::plot::Axis::new("loss", crate::plot::Scale::Linear),
    };
    crate::plot::line_chart(
        &t.out.join("loss.svg"),
        &chart,
        vec![crate::plot::Series {
            name: format!("mean over {window} steps"),
            points: curve,
        }],
    )?;
    println!(
        "trained {} steps in {:.1} min; final loss {:.4}; checkpoint in {}",
        trained.losses.len(),
        start.elapsed().as_secs_f64() / 60.0,
        trained.losses.last().copied().unwrap_or(f64::NAN),
        t.out.display()
    );
    Ok(())
}

/// The weights of the checkpoint in `dir`, which must have the architecture `config` describes
/// (feed-forward chunking and checkpointing may differ: they do not change the weights).
fn start_from<B: Backend>(
    dir: &Path,
    config: &LlamaConfig,
    device: &B::Device,
) -> Result<Llama<B>> {
    let (model, found, _) = load_checkpoint::<B>(dir, device)?;
    let comparable = found
        .clone()
        .with_ffn_chunk(config.ffn_chunk)
        .with_checkpoint(config.checkpoint);
    if &comparable != config {
        bail!(
            "train.init = {}: the checkpoint's model ({found:?}) is not the spec's [model] ({config:?})",
            dir.display()
        );
    }
    Ok(model)
}

/// Trains as this process's rank over `comm` (NCCL), or, under `mpirun`, over MPI (a failing rank
/// aborts the whole job at once), or else on in-process threads. Only rank 0 gets the model back.
fn run_training<B, F, L>(
    comm: Option<Comm>,
    model: Llama<B>,
    partition: &dyn strategies::Partition,
    options: &TrainOptions,
    batch_for: F,
    on_step: L,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Option<workbench::train::Trained<workbench::model::Llama<B>>>>
where
    B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend,
    F: Fn(usize) -> Vec<Example> + Sync,
    L: Fn(&StepLog) + Sync,
{
    if let Some(comm) = comm {
        let trained =
            workbench::train::train_on(comm, model, partition, options, &batch_for, &on_step, stop);
        return Ok(trained?);
    }
    let ranked = crate::mpi_rank::as_mpi_rank(options.timeout, |comm| {
        let model = model.clone();
        workbench::train::train_on(comm, model, partition, options, &batch_for, &on_step, stop)
    })?;
    if let Some((_, trained)) = ranked {
        return Ok(trained);
    }
    Ok(Some(train(
        model, partition, options, batch_for, on_step, stop,
    )?))
}
