//! SPMD training on in-process ranks: every rank holds its shard of the tokens and a replica of the
//! parameters; gradients are all-reduced through the transport before each AdamW step, so replicas
//! stay identical (checked by a checksum every few steps).

use crate::error::{RingError, TransportError, all_or_root_cause};
use crate::model::Llama;
use crate::ring::context::{RingConfig, RingContext};
use crate::ring::op::RingBackend;
use crate::transport::{Comm, run_ranks};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use strategies::{Layout, Partition, PartitionError};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum TrainError {
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(
        "step {step}: parameter replicas differ between ranks (checksum mismatch on rank {rank})"
    )]
    ReplicaMismatch { step: usize, rank: usize },
    #[error("step {step}: the batch is empty")]
    EmptyBatch { step: usize },
    #[error(
        "step {step}: the {what} of rank {rank} is not finite (NaN or infinite); training stopped before applying it"
    )]
    NonFinite {
        step: usize,
        rank: usize,
        what: &'static str,
    },
    #[error("training ended without rank 0's model")]
    NoModel,
}

impl TrainError {
    /// [`RingError::echo_level`] of a ring error; other training errors are a rank's own (0).
    fn echo_level(&self) -> u8 {
        match self {
            TrainError::Ring(e) => e.echo_level(),
            _ => 0,
        }
    }
}

impl From<strategies::PartitionError> for TrainError {
    fn from(e: strategies::PartitionError) -> Self {
        TrainError::Ring(e.into())
    }
}

impl From<TransportError> for TrainError {
    fn from(e: TransportError) -> Self {
        TrainError::Ring(e.into())
    }
}

/// One training sequence: token ids, and the weight of predicting each next token.
///
/// `weights[i]` weighs the prediction of `tokens[i + 1]` from `tokens[..=i]`; `weights.len() ==
/// tokens.len() - 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub tokens: Vec<u32>,
    pub weights: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub ranks: usize,
    pub ring: RingConfig,
    pub steps: usize,
    pub lr: f64,
    pub warmup_steps: usize,
    /// The cosine schedule decays to `lr · min_lr_ratio`.
    pub min_lr_ratio: f64,
    pub weight_decay: f32,
    /// Clip the all-reduced gradient to this global L2 norm.
    pub grad_clip: Option<f32>,
    /// Compare parameter checksums across ranks every this many steps (0: never).
    pub checksum_every: usize,
    /// Token used to pad sequences to a length the partition accepts.
    pub pad_token: u32,
    pub timeout: Duration,
}

/// What rank 0 reports after every step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLog {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub tokens: usize,
    pub seconds: f64,
    /// The most bytes rank 0's attention engine held at once during the step ([`crate::ring::ledger`]).
    pub engine_peak_bytes: u64,
}

/// Rank 0's model after training, and the global loss of every step.
pub struct Trained<M> {
    pub model: M,
    pub losses: Vec<f64>,
}

/// What SPMD training optimizes: the model, the batch one step sees (the same on every rank), and
/// this rank's share of the global loss. Next-token prediction and the Agentic Transformer are two
/// objectives of the one training loop below.
pub trait Objective<B: AutodiffBackend + RingBackend>: Sync {
    type Model: AutodiffModule<B> + Sync;
    type Batch;
    /// The batch's global sequence length (one the partition accepts for the run's rank count).
    fn seq_len(&self, batch: &Self::Batch) -> usize;
    /// Sequences × positions, for tokens/s; 0 means the batch is empty.
    fn tokens(&self, batch: &Self::Batch) -> usize;
    /// This rank's part of the global loss: summed over ranks it is the loss of the whole batch.
    fn local_loss(
        &self,
        model: &Self::Model,
        batch: &Self::Batch,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 1>, RingError>;
}

/// Next-token cross-entropy on token sequences (the language-model objective).
struct NextToken;

impl<B: AutodiffBackend + RingBackend> Objective<B> for NextToken {
    type Model = Llama<B>;
    type Batch = Batch;

    fn seq_len(&self, batch: &Batch) -> usize {
        batch.len
    }

    fn tokens(&self, batch: &Batch) -> usize {
        batch.batch * batch.len
    }

    fn local_loss(
        &self,
        model: &Llama<B>,
        batch: &Batch,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 1>, RingError> {
        local_loss(model, batch, &ctx.layout, ctx)
    }
}

/// A batch laid out for one step: `[batch, len]` inputs, targets and weights, in global order.
struct Batch {
    batch: usize,
    len: usize,
    inputs: Vec<i64>,
    targets: Vec<i64>,
    weights: Vec<f32>,
}

/// The smallest length ≥ `len` that `partition` accepts for `ranks` ranks.
///
/// The search stops at `2 · len + 64 · ranks` (every registered strategy accepts a multiple of
/// `2 · ranks`); a strategy that accepts nothing up to there is an error naming that range.
pub fn padded_len(
    partition: &dyn Partition,
    len: usize,
    ranks: usize,
) -> Result<usize, PartitionError> {
    strategies::check_ranks(ranks)?;
    let (from, to) = (len.max(1), 2 * len.max(1) + 64 * ranks);
    (from..=to)
        .find(|&l| partition.validate(l, ranks).is_ok())
        .ok_or(PartitionError::NoLengthAccepted {
            strategy: partition.name(),
            from,
            to,
            ranks,
        })
}

fn assemble(
    examples: &[Example],
    partition: &dyn Partition,
    ranks: usize,
    pad: u32,
) -> Result<Batch, TrainError> {
    let longest = examples
        .iter()
        .map(|e| e.tokens.len().saturating_sub(1))
        .max()
        .unwrap_or(0);
    let len = padded_len(partition, longest, ranks)?;
    let mut batch = Batch {
        batch: examples.len(),
        len,
        inputs: Vec::with_capacity(examples.len() * len),
        targets: Vec::with_capacity(examples.len() * len),
        weights: Vec::with_capacity(examples.len() * len),
    };
    for e in examples {
        let n = e.tokens.len().saturating_sub(1);
        let at = |i: usize| i64::from(*e.tokens.get(i).unwrap_or(&pad));
        batch
            .inputs
            .extend((0..len).map(|i| if i < n { at(i) } else { i64::from(pad) }));
        batch
            .targets
            .extend((0..len).map(|i| if i < n { at(i + 1) } else { i64::from(pad) }));
        batch
            .weights
            .extend((0..len).map(|i| if i < n { e.weights[i] } else { 0.0 }));
    }
    Ok(batch)
}

/// Each step's examples laid out for the partition (the next-token objective's batches).
fn assembled<'a, F: Fn(usize) -> Vec<Example>>(
    batch_for: &'a F,
    partition: &'a dyn Partition,
    options: &'a TrainOptions,
) -> impl Fn(usize) -> Result<Batch, TrainError> + 'a {
    move |step| {
        assemble(
            &batch_for(step),
            partition,
            options.ranks,
            options.pad_token,
        )
    }
}

/// Rows `[batch, t]` of this rank's positions.
pub(crate) fn local<T: Copy>(global: &[T], batch: usize, layout: &Layout, rank: usize) -> Vec<T> {
    local_rows(global, batch, 1, layout, rank)
}

/// Rows `[batch, t, width]` of this rank's positions out of `[batch, len, width]`.
pub(crate) fn local_rows<T: Copy>(
    global: &[T],
    batch: usize,
    width: usize,
    layout: &Layout,
    rank: usize,
) -> Vec<T> {
    let len = layout.seq_len;
    let mut out = Vec::with_capacity(batch * layout.shard_len(rank) * width);
    for b in 0..batch {
        for &p in &layout.positions[rank] {
            let row = (b * len + p) * width;
            out.extend_from_slice(&global[row..row + width]);
        }
    }
    out
}

/// Masked next-token cross-entropy of this rank's tokens, divided by the global weight.
fn local_loss<B: RingBackend>(
    model: &Llama<B>,
    batch: &Batch,
    layout: &Layout,
    ctx: &Arc<RingContext>,
) -> Result<Tensor<B, 1>, RingError> {
    let rank = ctx.rank();
    let t = layout.shard_len(rank);
    let device = Default::default();
    let ints =
        |v: Vec<i64>| Tensor::<B, 2, Int>::from_data(TensorData::new(v, [batch.batch, t]), &device);
    let inputs = ints(local(&batch.inputs, batch.batch, layout, rank));
    let targets = ints(local(&batch.targets, batch.batch, layout, rank));
    let weights = Tensor::<B, 2>::from_data(
        TensorData::new(
            local(&batch.weights, batch.batch, layout, rank),
            [batch.batch, t],
        ),
        &device,
    );
    let total: f32 = batch.weights.iter().sum();
    let logits = model.forward(inputs, &layout.positions[rank], ctx)?;
    let picked = log_softmax(logits, 2)
        .gather(2, targets.unsqueeze_dim(2))
        .squeeze_dim::<2>(2);
    Ok((picked * weights).sum().neg() / total.max(f32::MIN_POSITIVE))
}

/// Collects every float parameter's gradient, in module order, into one flat vector (zeros where a
/// parameter got none), so that one all-reduce carries them all.
struct Flatten<'a> {
    grads: &'a mut GradientsParams,
    flat: Vec<f32>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(g) => self.flat.extend(
                g.into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("f32"),
            ),
            None => self
                .flat
                .extend(std::iter::repeat_n(0.0, param.val().shape().num_elements())),
        }
    }
}

/// Inverse of [`Flatten`]: registers slices of the reduced vector as the parameters' gradients.
struct Unflatten<'a> {
    flat: &'a [f32],
    offset: usize,
    grads: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape = param.val().shape();
        let n = shape.num_elements();
        let data = self.flat[self.offset..self.offset + n].to_vec();
        self.offset += n;
        let device = param.val().device();
        let grad = Tensor::<B::InnerBackend, D>::from_data(TensorData::new(data, shape), &device);
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}

/// Every parameter value, in module order.
pub fn flat_params<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.extend(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("f32"),
            );
        }
    }
    let mut c = Collect(Vec::new());
    module.visit(&mut c);
    c.0
}

/// `module` with its parameters replaced by `flat` (module order, as [`flat_params`] gives them).
pub fn with_flat_params<B: Backend, M: Module<B>>(module: M, flat: &[f32]) -> M {
    struct Replace<'a> {
        flat: &'a [f32],
        offset: usize,
    }
    impl<B: Backend> burn::module::ModuleMapper<B> for Replace<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let shape = tensor.shape();
            let n = shape.num_elements();
            let values = self.flat[self.offset..self.offset + n].to_vec();
            self.offset += n;
            let device = tensor.device();
            let mut replaced = Tensor::from_data(TensorData::new(values, shape), &device);
            if tensor.is_require_grad() {
                replaced = replaced.require_grad();
            }
            Param::from_mapped_value(id, replaced, mapper)
        }
    }
    module.map(&mut Replace { flat, offset: 0 })
}

/// A 64-bit FNV-1a hash of the parameters' bits, as four exact 16-bit pieces.
fn checksum<B: Backend, M: Module<B>>(module: &M) -> [f32; 4] {
    let hash = flat_params::<B, M>(module)
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
        });
    std::array::from_fn(|i| ((hash >> (16 * i)) & 0xffff) as f32)
}

/// Scales the gradient so that its global L2 norm is at most `max_norm`.
///
/// Computed sequentially on the reduced vector, so that every rank gets the same bits (a parallel
/// reduction could sum in a different order on each rank and let the replicas drift apart).
fn clip_global_norm(flat: &mut [f32], max_norm: f32) {
    let norm = flat
        .iter()
        .map(|&g| f64::from(g) * f64::from(g))
        .sum::<f64>()
        .sqrt();
    if norm > f64::from(max_norm) {
        let scale = (f64::from(max_norm) / norm) as f32;
        flat.iter_mut().for_each(|g| *g *= scale);
    }
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
    B: AutodiffBackend + RingBackend,
    F: Fn(usize) -> Vec<Example> + Sync,
    L: Fn(&StepLog) + Sync,
{
    let batch_for = assembled(&batch_for, partition, options);
    train_ranks(
        &NextToken, model, partition, options, batch_for, on_step, stop,
    )
}

/// [`train`] for any [`Objective`].
pub fn train_objective<B, O, F, L>(
    objective: &O,
    model: O::Model,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    on_step: L,
    stop: &AtomicBool,
) -> Result<Trained<O::Model>, TrainError>
where
    B: AutodiffBackend + RingBackend,
    O: Objective<B>,
    F: Fn(usize) -> O::Batch + Sync,
    L: Fn(&StepLog) + Sync,
{
    train_ranks(
        objective,
        model,
        partition,
        options,
        |step| Ok(batch_for(step)),
        on_step,
        stop,
    )
}

/// [`train_objective`] over batches whose making may fail (padding them for the partition).
fn train_ranks<B, O, F, L>(
    objective: &O,
    model: O::Model,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    on_step: L,
    stop: &AtomicBool,
) -> Result<Trained<O::Model>, TrainError>
where
    B: AutodiffBackend + RingBackend,
    O: Objective<B>,
    F: Fn(usize) -> Result<O::Batch, TrainError> + Sync,
    L: Fn(&StepLog) + Sync,
{
    // Zero ranks would start no rank thread, so no rank would ever see a layout: check here.
    strategies::check_ranks(options.ranks)?;
    let results = run_ranks(options.ranks, options.timeout, |comm| {
        train_rank(
            comm, objective, &model, partition, options, &batch_for, &on_step, stop,
        )
    });
    all_or_root_cause(results, TrainError::echo_level)?
        .into_iter()
        .flatten()
        .next()
        .ok_or(TrainError::NoModel)
}

/// This process's rank of a training run over `comm` (one process per rank, e.g. under `mpirun`).
/// Rank 0 returns the model and losses; the other ranks return `None`.
pub fn train_on<B, F, L>(
    comm: Comm,
    model: Llama<B>,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: F,
    on_step: L,
    stop: &AtomicBool,
) -> Result<Option<Trained<Llama<B>>>, TrainError>
where
    B: AutodiffBackend + RingBackend,
    F: Fn(usize) -> Vec<Example>,
    L: Fn(&StepLog),
{
    strategies::check_ranks(options.ranks)?;
    if comm.world() != options.ranks {
        return Err(RingError::WorldMismatch {
            world: comm.world(),
            layout: options.ranks,
        }
        .into());
    }
    let batch_for = assembled(&batch_for, partition, options);
    train_rank(
        comm, &NextToken, &model, partition, options, &batch_for, &on_step, stop,
    )
}

/// One step's global loss and all-reduced gradient, as every rank sees them.
struct StepGradient {
    /// The batch's loss: the sum over ranks of their local losses.
    loss: f64,
    /// Whether rank 0 asked every rank to stop after this step.
    stop: bool,
    /// Every parameter's gradient summed over ranks, in module order, before any clipping.
    flat: Vec<f32>,
}

/// This rank's loss and gradient for `batch`, all-reduced over the ranks of `ctx`.
///
/// A non-finite loss or gradient on any rank is an error on every rank, naming the first such rank,
/// before any gradient is exchanged (nothing non-finite reaches the parameters).
fn step_gradient<B, O>(
    objective: &O,
    model: &O::Model,
    batch: &O::Batch,
    ctx: &Arc<RingContext>,
    step: usize,
    stop_requested: bool,
) -> Result<StepGradient, TrainError>
where
    B: AutodiffBackend + RingBackend,
    O: Objective<B>,
{
    let rank = ctx.rank();
    let loss = objective.local_loss(model, batch, ctx)?;
    let local_loss = loss.clone().into_scalar().elem::<f32>();
    let grads = loss.backward();
    if let Some(error) = ctx.take_backward_error() {
        return Err(error.into());
    }
    let mut params = GradientsParams::from_grads(grads, model);
    let mut flatten = Flatten {
        grads: &mut params,
        flat: Vec::new(),
    };
    model.visit(&mut flatten);
    let mut flat = flatten.flat;
    // One all-reduce carries the loss, rank 0's stop request and every rank's health (0: finite,
    // 1: its loss is not, 2: its gradient is not), so all ranks stop at the same step together.
    let mut reduced = vec![0.0f32; 2 + ctx.world()];
    reduced[0] = local_loss;
    reduced[1] = f32::from(u8::from(stop_requested));
    reduced[2 + rank] = if !local_loss.is_finite() {
        1.0
    } else if flat.iter().any(|x| !x.is_finite()) {
        2.0
    } else {
        0.0
    };
    ctx.with_comm(|c| c.all_reduce_sum(&mut reduced))?;
    // A non-finite loss is reported before the gradients it poisoned on the other ranks.
    for (code, what) in [(1.0, "loss"), (2.0, "gradient")] {
        if let Some(bad) = reduced[2..].iter().position(|&h| h == code) {
            return Err(TrainError::NonFinite {
                step,
                rank: bad,
                what,
            });
        }
    }
    ctx.with_comm(|c| c.all_reduce_sum(&mut flat))?;
    Ok(StepGradient {
        loss: f64::from(reduced[0]),
        stop: reduced[1] > 0.0,
        flat,
    })
}

/// The global loss and the all-reduced gradient (module order, unclipped) of `model` on
/// `examples`, computed on `ranks` in-process ranks: what one training step applies, for checking
/// gradients (finite differences, agreement across rank counts).
pub fn global_gradient<B>(
    model: &Llama<B>,
    partition: &dyn Partition,
    ranks: usize,
    ring: RingConfig,
    examples: &[Example],
    timeout: Duration,
) -> Result<(f64, Vec<f32>), TrainError>
where
    B: AutodiffBackend + RingBackend,
{
    strategies::check_ranks(ranks)?;
    let batch = assemble(examples, partition, ranks, 0)?;
    let layout = Arc::new(partition.layout(batch.len, ranks)?);
    let results = run_ranks(ranks, timeout, |comm| -> Result<_, TrainError> {
        let ctx = Arc::new(RingContext::new(
            comm,
            layout.clone(),
            RingConfig {
                causal: true,
                ..ring
            },
        )?);
        // Each rank's own parameters, as in training: shared autodiff tensors would tie the ranks'
        // graphs together.
        let model = model.clone().fork(&Default::default());
        let g = step_gradient(&NextToken, &model, &batch, &ctx, 0, false)?;
        Ok((g.loss, g.flat))
    });
    all_or_root_cause(results, TrainError::echo_level)?
        .into_iter()
        .next()
        .ok_or(TrainError::NoModel)
}

/// One rank's training loop.
#[allow(clippy::too_many_arguments)]
fn train_rank<B, O, F, L>(
    comm: Comm,
    objective: &O,
    model: &O::Model,
    partition: &dyn Partition,
    options: &TrainOptions,
    batch_for: &F,
    on_step: &L,
    stop: &AtomicBool,
) -> Result<Option<Trained<O::Model>>, TrainError>
where
    B: AutodiffBackend + RingBackend,
    O: Objective<B>,
    F: Fn(usize) -> Result<O::Batch, TrainError>,
    L: Fn(&StepLog),
{
    let ring = RingConfig {
        causal: true,
        ..options.ring
    };
    let rank = comm.rank();
    let mut next = Some(batch_for(0)?);
    let first_len = objective.seq_len(next.as_ref().expect("just set"));
    let mut ctx = Arc::new(RingContext::new(
        comm,
        Arc::new(partition.layout(first_len, options.ranks)?),
        ring,
    )?);
    let mut model = model.clone().fork(&Default::default());
    let mut optim = AdamWConfig::new()
        .with_weight_decay(options.weight_decay)
        .init::<B, O::Model>();
    let mut losses = Vec::with_capacity(options.steps);
    for step in 0..options.steps {
        let start = Instant::now();
        let batch = match next.take() {
            Some(batch) => batch,
            None => batch_for(step)?,
        };
        let tokens = objective.tokens(&batch);
        if tokens == 0 {
            return Err(TrainError::EmptyBatch { step });
        }
        let len = objective.seq_len(&batch);
        if len != ctx.layout.seq_len {
            ctx = Arc::new(ctx.with_layout(Arc::new(partition.layout(len, options.ranks)?))?);
        }
        let stop_requested = rank == 0 && stop.load(Ordering::Relaxed);
        ctx.ledger().reset_peak();
        let StepGradient {
            loss: step_loss,
            stop: stop_all,
            mut flat,
        } = step_gradient(objective, &model, &batch, &ctx, step, stop_requested)?;
        if let Some(max_norm) = options.grad_clip {
            clip_global_norm(&mut flat, max_norm);
        }
        let mut unflatten = Unflatten {
            flat: &flat,
            offset: 0,
            grads: GradientsParams::new(),
        };
        model.visit(&mut unflatten);
        let lr = learning_rate(options, step);
        model = optim.step(lr, model, unflatten.grads);
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
            on_step(&StepLog {
                step,
                loss: step_loss,
                lr,
                tokens,
                seconds: start.elapsed().as_secs_f64(),
                engine_peak_bytes: ctx.ledger().peak(),
            });
        }
        if stop_all {
            break;
        }
    }
    Ok((rank == 0).then_some(Trained { model, losses }))
}

/// Greedy continuation of each prompt (up to `max_new` tokens, stopping at `stop`), on `ranks` ranks.
///
/// See [`Decoding`] for the options.
///
/// Each step runs the full sequence through the ring (no KV cache): evaluation, not serving.
/// How [`greedy`] decodes and where it runs.
#[derive(Debug, Clone, Copy)]
pub struct Decoding<'a> {
    pub max_new: usize,
    /// Generation of a row ends at this token (not included in the reply).
    pub stop: u32,
    /// Pads rows to a length the partition accepts; causal attention keeps it out of real positions.
    pub pad: u32,
    pub partition: &'a dyn Partition,
    pub ranks: usize,
    pub timeout: Duration,
}

pub fn greedy<B: RingBackend>(
    model: &Llama<B>,
    prompts: &[Vec<u32>],
    decoding: &Decoding,
) -> Result<Vec<Vec<u32>>, RingError> {
    let Decoding {
        max_new,
        stop,
        pad,
        partition,
        ranks,
        timeout,
    } = *decoding;
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut done = vec![false; prompts.len()];
    let mut replies = vec![Vec::new(); prompts.len()];
    for _ in 0..max_new {
        if done.iter().all(|&d| d) {
            break;
        }
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(1);
        let len = padded_len(partition, longest, ranks)?;
        let layout = Arc::new(partition.layout(len, ranks)?);
        let inputs: Vec<i64> = seqs
            .iter()
            .flat_map(|s| (0..len).map(move |i| i64::from(*s.get(i).unwrap_or(&pad))))
            .collect();
        let vocab = std::sync::OnceLock::new();
        let per_rank = run_ranks(ranks, timeout, |comm| -> Result<Vec<f32>, RingError> {
            let rank = comm.rank();
            let ctx = Arc::new(RingContext::new(
                comm,
                layout.clone(),
                RingConfig {
                    causal: true,
                    ..Default::default()
                },
            )?);
            let t = layout.shard_len(rank);
            let tokens = Tensor::<B, 2, Int>::from_data(
                TensorData::new(local(&inputs, seqs.len(), &layout, rank), [seqs.len(), t]),
                &Default::default(),
            );
            let logits = model
                .clone()
                .forward(tokens, &layout.positions[rank], &ctx)?;
            vocab.get_or_init(|| logits.dims()[2]);
            Ok(logits
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .expect("f32"))
        });
        let per_rank: Vec<Vec<f32>> = per_rank.into_iter().collect::<Result<_, _>>()?;
        let v = *vocab.get().expect("at least one rank ran");
        for (row, seq) in seqs.iter_mut().enumerate() {
            if done[row] {
                continue;
            }
            let last = seq.len() - 1;
            let owner = (0..ranks)
                .find(|&r| layout.positions[r].contains(&last))
                .expect("owned");
            let local_index = layout.positions[owner]
                .iter()
                .position(|&p| p == last)
                .expect("owned");
            let t = layout.shard_len(owner);
            let logits =
                &per_rank[owner][(row * t + local_index) * v..(row * t + local_index + 1) * v];
            let next = logits
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                    if x > best.1 { (i, x) } else { best }
                })
                .0 as u32;
            if next == stop {
                done[row] = true;
            } else {
                seq.push(next);
                replies[row].push(next);
            }
        }
    }
    Ok(replies)
}
