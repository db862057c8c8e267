//! The SPMD training loop: one rank's steps, and the ranks run together.

use super::error::TrainError;
use super::objective::{Example, NextToken, Objective, assembled, layout_for_layers};
use super::replicas::{checksum, clip_to_norm, norm_pieces, unflatten_gradient};
use super::resume::{Progress, Snapshot};
use super::step::{StepGradient, step_gradient};
use crate::error::{RingError, all_or_root_cause};
use crate::host::HostRead;
use crate::model::Llama;
use crate::model::layer::LayerBackend;
use crate::model::lazy::materialize;
use crate::ring::context::{RingConfig, RingContext, Sequence};
use crate::ring::op::RingBackend;
use crate::transport::{Comm, run_ranks};
use burn::module::Module;
use burn::optim::{AdamWConfig, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use strategies::Partition;

/// How a run trains: ranks, ring options, and AdamW with warmup and a cosine schedule.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// In-process ranks (threads), or the world size under MPI.
    pub ranks: usize,
    /// Head × context parallelism: groups of this many ranks split the heads, the `ranks / ulysses`
    /// groups run the rings ([`RingContext::grid`]); 1: the ring alone.
    pub ulysses: usize,
    /// The ring's options; training always attends causally.
    pub ring: RingConfig,
    /// Optimizer steps.
    pub steps: usize,
    /// Peak learning rate, reached after the warmup.
    pub lr: f64,
    /// Steps of linear warmup from `lr / warmup_steps` to `lr`.
    pub warmup_steps: usize,
    /// The cosine schedule decays to `lr · min_lr_ratio`.
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f32,
    /// Clip the all-reduced gradient to this global L2 norm.
    pub grad_clip: Option<f32>,
    /// Compare parameter checksums across ranks every this many steps (0: never).
    pub checksum_every: usize,
    /// Token used to pad sequences to a length the partition accepts.
    pub pad_token: u32,
    /// How long a rank waits for a silent peer before failing.
    pub timeout: Duration,
    /// Pack a step's examples end to end into one sequence of documents (attention stays inside
    /// each) instead of one padded row each.
    pub pack: bool,
}

impl Default for TrainOptions {
    /// One rank, 100 steps at a constant 1e-3 without warmup, weight decay or clipping, no
    /// checksums, pad token 0, a 60 s timeout.
    fn default() -> Self {
        Self {
            ranks: 1,
            ulysses: 1,
            ring: RingConfig::default(),
            steps: 100,
            lr: 1e-3,
            warmup_steps: 0,
            min_lr_ratio: 1.0,
            weight_decay: 0.0,
            grad_clip: None,
            checksum_every: 0,
            pad_token: 0,
            timeout: Duration::from_secs(60),
            pack: false,
        }
    }
}

impl TrainOptions {
    /// The ranks of each ring: `ranks / ulysses`.
    pub fn ring_ranks(&self) -> usize {
        self.ranks / self.ulysses.max(1)
    }

    /// An error unless `ulysses` is at least 1 and divides the ranks (the heads are checked by the
    /// first attention call, which knows them).
    fn check_grid(&self) -> Result<(), RingError> {
        if self.ulysses == 0 || !self.ranks.is_multiple_of(self.ulysses) {
            return Err(RingError::Ulysses {
                ulysses: self.ulysses,
                ranks: self.ranks,
                rule: format!("the Ulysses degree must divide the {} ranks", self.ranks),
            });
        }
        Ok(())
    }
}

/// What rank 0 reports after every step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLog {
    /// The step, from 0.
    pub step: usize,
    /// The batch's global loss.
    pub loss: f64,
    /// The learning rate applied.
    pub lr: f64,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Seconds the step took.
    pub seconds: f64,
    /// The most bytes rank 0's attention engine held at once during the step ([`crate::ring::ledger`]).
    pub engine_peak_bytes: u64,
}

/// Rank 0's model after training, and the global loss of every step.
pub struct Trained<M> {
    /// Rank 0's trained model.
    pub model: M,
    /// The global loss of every step.
    pub losses: Vec<f64>,
}

fn learning_rate(o: &TrainOptions, step: usize) -> f64 {
    if step < o.warmup_steps {
        return o.lr * (step + 1) as f64 / o.warmup_steps as f64;
    }
    let progress =
        (step - o.warmup_steps) as f64 / (o.steps.saturating_sub(o.warmup_steps)).max(1) as f64;
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos());
    o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine)
}

/// Trains `model` for `options.steps` steps on `options.ranks` threads.
///
/// `batch_for(step)` returns the step's examples (the same on every rank); `on_step` is called by
/// rank 0 after every step. Setting `stop` ends training after the next step on every rank (rank 0's
/// view of it travels with the loss all-reduce, so all ranks stop at the same step). Returns rank 0's
/// model and the global loss of every step.
pub fn train<B, F, L>(
    model: Llama<B>,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    on_step: L,
    stop: &AtomicBool,
) -> Result<Trained<Llama<B>>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend,
    F: Fn(usize) -> Vec<Example> + Sync,
    L: Fn(&StepLog) + Sync,
{
    let run = Watched {
        on_step: &on_step,
        stop,
        progress: Progress::default(),
    };
    train_from(model, partition, options, batch_for, run)
}

/// Who watches a run and where it starts: rank 0's report after every step, the flag that stops
/// it, and its [`Progress`] (the step it starts at, the optimizer's state then, the hook that saves
/// it).
pub struct Watched<'a, B: AutodiffBackend, M: burn::module::AutodiffModule<B>> {
    /// Called on rank 0 after every step.
    pub on_step: &'a (dyn Fn(&StepLog) + Sync),
    /// When set, every rank stops after the step under way.
    pub stop: &'a AtomicBool,
    /// Where the run starts and what rank 0 is shown after each step.
    pub progress: Progress<'a, B, M>,
}

/// [`train`] from where `run.progress` says (steps already done, the optimizer's state then),
/// showing rank 0's model and optimizer to `run.progress.after_step` after every step. Returns rank
/// 0's model and the losses of the steps run here.
pub fn train_from<B, F>(
    model: Llama<B>,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    run: Watched<'_, B, Llama<B>>,
) -> Result<Trained<Llama<B>>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend,
    F: Fn(usize) -> Vec<Example> + Sync,
{
    let batch_for = assembled(&batch_for, partition, options);
    train_ranks(&NextToken, model, partition, options, batch_for, run)
}

/// One training run of an [`Objective`]: what [`train_objective`] takes. [`Training::new`] gives
/// the defaults (one rank, [`TrainOptions::default`], no step callback, no stop flag).
pub struct Training<'a, M, F> {
    /// The model to train (its lazily drawn weights are drawn before the ranks fork it).
    pub model: M,
    /// Which positions each rank owns.
    pub partition: &'a dyn Partition,
    /// Ranks, steps, learning rate schedule, ring options.
    pub options: TrainOptions,
    /// The batch of each step, the same on every rank.
    pub batches: F,
    /// Called on rank 0 after every step (progress, logs).
    pub on_step: Option<&'a (dyn Fn(&StepLog) + Sync)>,
    /// When set (by another thread), training stops after the step under way.
    pub stop: Option<&'a AtomicBool>,
}

impl<'a, M, F> Training<'a, M, F> {
    /// `model` trained on `batches` with `partition`, options at their defaults.
    pub fn new(model: M, partition: &'a dyn Partition, batches: F) -> Self {
        Training {
            model,
            partition,
            options: TrainOptions::default(),
            batches,
            on_step: None,
            stop: None,
        }
    }

    /// The same run with `options`.
    pub fn with_options(self, options: TrainOptions) -> Self {
        Training { options, ..self }
    }
}

/// [`train`] for any [`Objective`]: its model, on its batches, as `run` says.
pub fn train_objective<B, O, F>(
    objective: &O,
    run: Training<'_, O::Model, F>,
) -> Result<Trained<O::Model>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + RingBackend,
    O: Objective<B>,
    F: Fn(usize) -> O::Batch + Sync,
{
    let never = AtomicBool::new(false);
    let batches = &run.batches;
    let on_step = |log: &StepLog| {
        if let Some(on_step) = run.on_step {
            on_step(log)
        }
    };
    let watched = Watched {
        on_step: &on_step,
        stop: run.stop.unwrap_or(&never),
        progress: Progress::default(),
    };
    train_ranks(
        objective,
        run.model,
        run.partition,
        &run.options,
        |step| Ok(batches(step)),
        watched,
    )
}

/// [`train_objective`] over batches whose making may fail (padding them for the partition).
fn train_ranks<B, O, F>(
    objective: &O,
    model: O::Model,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    run: Watched<'_, B, O::Model>,
) -> Result<Trained<O::Model>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + RingBackend,
    O: Objective<B>,
    F: Fn(usize) -> Result<O::Batch, TrainError> + Sync,
{
    // Zero ranks would start no rank thread, so no rank would ever see a layout: check here.
    strategies::check_ranks(options.ranks)?;
    options.check_grid()?;
    run.progress.check(options.steps)?;
    // Every rank forks this model: its lazily initialized parameters must exist before the forks.
    materialize(&model);
    let results = run_ranks(options.ranks, options.timeout, |comm| {
        train_rank(
            comm, objective, &model, partition, options, &batch_for, &run,
        )
    });
    all_or_root_cause(results, TrainError::echo_level)?
        .into_iter()
        .flatten()
        .next()
        .ok_or(TrainError::NoModel)
}

/// This process's rank of a training run over `comm` (one process per rank, e.g. under `mpirun`),
/// from where `run.progress` says. Rank 0 returns the model and losses; the other ranks return
/// `None`.
pub fn train_on<B, F>(
    comm: Comm,
    model: Llama<B>,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    run: Watched<'_, B, Llama<B>>,
) -> Result<Option<Trained<Llama<B>>>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend,
    F: Fn(usize) -> Vec<Example>,
{
    strategies::check_ranks(options.ranks)?;
    options.check_grid()?;
    run.progress.check(options.steps)?;
    if comm.world() != options.ranks {
        return Err(RingError::WorldMismatch {
            world: comm.world(),
            layout: options.ranks,
        }
        .into());
    }
    let batch_for = assembled(&batch_for, partition, options);
    train_rank(
        comm, &NextToken, &model, partition, options, &batch_for, &run,
    )
}

/// One rank's training loop, from step `run.progress.start`.
fn train_rank<B, O, F>(
    comm: Comm,
    objective: &O,
    model: &O::Model,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: &F,
    run: &Watched<'_, B, O::Model>,
) -> Result<Option<Trained<O::Model>>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + RingBackend,
    O: Objective<B>,
    F: Fn(usize) -> Result<O::Batch, TrainError>,
{
    let ring = RingConfig {
        causal: true,
        ..options.ring
    };
    let rank = comm.rank();
    let start = run.progress.start;
    if start == options.steps {
        // A run saved after its last step: nothing left to train.
        return Ok((rank == 0).then(|| Trained {
            model: model.clone(),
            losses: Vec::new(),
        }));
    }
    let mut next = Some(batch_for(start)?);
    let first = next.as_ref().expect("just set");
    let (first_len, first_docs) = (objective.seq_len(first), objective.doc_lens(first));
    // Every layer's mask (a windowed model's window on its windowed layers): what `balanced` lays
    // each step's sequence out for.
    let masks = objective.layer_masks(model, &ring);
    let layout = |len: usize, docs: &[usize]| {
        layout_for_layers(partition, len, docs, options.ring_ranks(), &masks, true)
    };
    let mut ctx = Arc::new(
        RingContext::grid(
            comm,
            Arc::new(layout(first_len, first_docs)?),
            ring,
            options.ulysses,
        )?
        .with_sequence(Sequence {
            len: first_len,
            doc_lens: first_docs.to_vec(),
        })?,
    );
    let mut model = model.clone().fork(&Default::default());
    let mut optim = AdamWConfig::new()
        .with_weight_decay(options.weight_decay)
        .init::<B, O::Model>();
    if let Some(record) = &run.progress.optimizer {
        optim = optim.load_record(record.clone());
    }
    let mut losses = Vec::with_capacity(options.steps - start);
    for step in start..options.steps {
        let started = Instant::now();
        let batch = match next.take() {
            Some(batch) => batch,
            None => batch_for(step)?,
        };
        let tokens = objective.tokens(&batch);
        if tokens == 0 {
            return Err(TrainError::EmptyBatch { step });
        }
        let (len, docs) = (objective.seq_len(&batch), objective.doc_lens(&batch));
        if len != ctx.layout.seq_len || docs != ctx.sequence().doc_lens {
            let layout = Arc::new(layout(len, docs)?);
            let sequence = Sequence {
                len,
                doc_lens: docs.to_vec(),
            };
            ctx = Arc::new(ctx.with_layout(layout)?.with_sequence(sequence)?);
        }
        let stop_requested = rank == 0 && run.stop.load(Ordering::Relaxed);
        ctx.ledger().reset_peak();
        let StepGradient {
            loss: step_loss,
            stop: stop_all,
            mut flat,
        } = step_gradient(objective, &model, &batch, &ctx, step, stop_requested)?;
        if let Some(max_norm) = options.grad_clip {
            // Every rank scales by rank 0's norm: a reduction on the device need not give the
            // same bits twice, and replicas that scaled differently would drift apart.
            let mut pieces = if rank == 0 {
                norm_pieces(&flat)
            } else {
                [0.0; 2]
            };
            ctx.with_comm(|c| c.all_reduce_sum(&mut pieces))?;
            flat = clip_to_norm(flat, pieces, max_norm);
        }
        let grads = unflatten_gradient::<B, _>(&model, flat);
        let lr = learning_rate(options, step);
        let stepping = crate::trace::span(|| "optimizer step".into());
        model = optim.step(lr, model, grads);
        drop(stepping);
        losses.push(step_loss);
        if options.checksum_every > 0 && (step + 1) % options.checksum_every == 0 {
            let mine = checksum::<B, _>(&model);
            let mut sum = mine;
            ctx.with_comm(|c| c.all_reduce_sum(&mut sum))?;
            if sum
                .iter()
                .zip(&mine)
                .any(|(s, m)| *s != m * options.ranks as f32)
            {
                return Err(TrainError::ReplicaMismatch { step, rank });
            }
        }
        if rank == 0 {
            (run.on_step)(&StepLog {
                step,
                loss: step_loss,
                lr,
                tokens,
                seconds: started.elapsed().as_secs_f64(),
                engine_peak_bytes: ctx.ledger().peak(),
            });
            if let Some(after_step) = run.progress.after_step {
                after_step(&Snapshot {
                    steps_done: step + 1,
                    stopping: stop_all,
                    model: &model,
                    optimizer: &optim,
                })?;
            }
        }
        if stop_all {
            break;
        }
    }
    Ok((rank == 0).then_some(Trained { model, losses }))
}
