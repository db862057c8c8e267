//! What training optimizes (next-token prediction, or any [`Objective`]) and how a step's examples
//! are padded and laid out for a partition's ranks.

use super::error::TrainError;
use crate::error::RingError;
use crate::model::Llama;
use crate::ring::context::RingContext;
use crate::ring::op::RingBackend;
use burn::module::AutodiffModule;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;

use strategies::{Layout, Partition, padded_len};

/// One training sequence: token ids, and the weight of predicting each next token.
///
/// `weights[i]` weighs the prediction of `tokens[i + 1]` from `tokens[..=i]`; `weights.len() ==
/// tokens.len() - 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// `weights[i]` weighs the prediction of `tokens[i + 1]`.
    pub weights: Vec<f32>,
}

/// What SPMD training optimizes: the model, the batch one step sees (the same on every rank), and
/// this rank's share of the global loss. Next-token prediction and the Agentic Transformer are two
/// objectives of the one training loop below.
pub trait Objective<B: AutodiffBackend + RingBackend>: Sync {
    /// The model trained.
    type Model: AutodiffModule<B> + Sync;
    /// What one step sees.
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
pub(crate) struct NextToken;

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
pub(crate) struct Batch {
    pub(crate) batch: usize,
    pub(crate) len: usize,
    pub(crate) inputs: Vec<i64>,
    pub(crate) targets: Vec<i64>,
    pub(crate) weights: Vec<f32>,
}

pub(crate) fn assemble(
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
pub(crate) fn assembled<'a, F: Fn(usize) -> Vec<Example>>(
    batch_for: &'a F,
    partition: &'a dyn Partition,
    ranks: usize,
    pad_token: u32,
) -> impl Fn(usize) -> Result<Batch, TrainError> + 'a {
    move |step| assemble(&batch_for(step), partition, ranks, pad_token)
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
