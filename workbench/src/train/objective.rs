//! What training optimizes (next-token prediction, or any [`Objective`]) and how a step's examples
//! are padded and laid out for a partition's ranks.

use super::error::TrainError;
use crate::error::RingError;
use crate::kernels::flops::{BACKWARD_PER_PAIR_DIM, FORWARD_PER_PAIR_DIM};
use crate::model::Llama;
use crate::model::layer::LayerBackend;
use crate::model::loss::next_token_nll;
use crate::ring::context::{RingConfig, RingContext};
use crate::ring::op::RingBackend;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;

use strategies::{Layout, MaskedLayers, Partition, RingCosts, Workload, padded_grid_len};

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
    /// Sequences × positions, for tokens/s; 0 means the batch is empty. Default: one sequence.
    fn tokens(&self, batch: &Self::Batch) -> usize {
        self.seq_len(batch)
    }
    /// Documents packed end to end in each sequence, summing to its length (empty: one document).
    fn doc_lens<'a>(&self, _batch: &'a Self::Batch) -> &'a [usize] {
        &[]
    }
    /// The masks of the model's layers on `ring`, with how many layers use each: what a
    /// work-aware partition (`balanced`) lays the sequence out for. Default: every layer as `ring`
    /// says (no window).
    fn layer_masks(&self, _model: &Self::Model, ring: &RingConfig) -> Vec<MaskedLayers> {
        vec![MaskedLayers {
            mask: ring.attend().mask(),
            layers: 1,
        }]
    }
    /// This rank's part of the global loss: summed over ranks it is the loss of the whole batch.
    fn local_loss(
        &self,
        model: &Self::Model,
        batch: &Self::Batch,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 1>, RingError>;
}

/// The layout `partition` gives `len` tokens of documents `doc_lens` over `ranks` ring ranks for a
/// model whose layers mask by `masks`: a work-aware partition (`balanced`) balances every layer's
/// pass at the knee's costs (the machine is not known), and each layer's backward too when
/// `training` (a pair costs `BACKWARD_PER_PAIR_DIM / FORWARD_PER_PAIR_DIM` = 2.5 forward pairs, and
/// a hop carries dK and dV beside K and V: twice the forward's bytes); a fixed one ignores them.
pub fn layout_for_layers(
    partition: &dyn Partition,
    len: usize,
    doc_lens: &[usize],
    ranks: usize,
    masks: &[MaskedLayers],
    training: bool,
) -> Result<Layout, strategies::PartitionError> {
    let costs = RingCosts::at_the_knee(len / ranks.max(1));
    let workload = Workload {
        doc_lens,
        masks: masks.to_vec(),
        costs,
        backward: training.then(|| RingCosts {
            seconds_per_pair: costs.seconds_per_pair * BACKWARD_PER_PAIR_DIM as f64
                / FORWARD_PER_PAIR_DIM as f64,
            link_seconds: 2.0 * costs.link_seconds,
        }),
    };
    partition.layout_for(len, ranks, &workload)
}

/// Next-token cross-entropy on token sequences (the language-model objective).
pub(crate) struct NextToken;

impl<B: AutodiffBackend + LayerBackend> Objective<B> for NextToken {
    type Model = Llama<B>;
    type Batch = Batch;

    fn seq_len(&self, batch: &Batch) -> usize {
        batch.len
    }

    fn tokens(&self, batch: &Batch) -> usize {
        batch.batch * batch.len
    }

    fn doc_lens<'a>(&self, batch: &'a Batch) -> &'a [usize] {
        &batch.doc_lens
    }

    fn layer_masks(&self, model: &Llama<B>, ring: &RingConfig) -> Vec<MaskedLayers> {
        model.layer_masks(ring)
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
    /// Packed: the examples' lengths, then the padding's (empty: one example a row).
    pub(crate) doc_lens: Vec<usize>,
}

pub(crate) fn assemble(
    examples: &[Example],
    partition: &dyn Partition,
    (ring, ulysses): (usize, usize),
    pad: u32,
    pack: bool,
) -> Result<Batch, TrainError> {
    // (inputs, targets, weights) of every example, unpadded.
    let rows: Vec<(Vec<i64>, Vec<i64>, Vec<f32>)> = examples
        .iter()
        .map(|e| {
            let n = e.tokens.len().saturating_sub(1);
            let id = |i: usize| i64::from(e.tokens[i]);
            (
                (0..n).map(id).collect(),
                (0..n).map(|i| id(i + 1)).collect(),
                e.weights[..n].to_vec(),
            )
        })
        .collect();
    let (rows, doc_lens) = if pack {
        let lens: Vec<usize> = rows.iter().map(|r| r.0.len()).filter(|&n| n > 0).collect();
        let joined = rows
            .into_iter()
            .fold((vec![], vec![], vec![]), |mut all, r| {
                all.0.extend(r.0);
                all.1.extend(r.1);
                all.2.extend(r.2);
                all
            });
        (vec![joined], lens)
    } else {
        (rows, Vec::new())
    };
    let longest = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let len = padded_grid_len(partition, longest, ring, ulysses)?;
    let mut batch = Batch {
        batch: rows.len(),
        len,
        inputs: Vec::with_capacity(rows.len() * len),
        targets: Vec::with_capacity(rows.len() * len),
        weights: Vec::with_capacity(rows.len() * len),
        doc_lens,
    };
    if !batch.doc_lens.is_empty() && len > longest {
        // The padding is a document of its own (weight 0), so the documents cover the row.
        batch.doc_lens.push(len - longest);
    }
    let pad = i64::from(pad);
    for (inputs, targets, weights) in rows {
        let n = inputs.len();
        batch
            .inputs
            .extend(inputs.into_iter().chain((n..len).map(|_| pad)));
        batch
            .targets
            .extend(targets.into_iter().chain((n..len).map(|_| pad)));
        batch
            .weights
            .extend(weights.into_iter().chain((n..len).map(|_| 0.0)));
    }
    Ok(batch)
}

/// Each step's examples laid out for the partition (the next-token objective's batches).
pub(crate) fn assembled<'a, F: Fn(usize) -> Vec<Example>>(
    batch_for: &'a F,
    partition: &'a dyn Partition,
    options: &'a super::TrainOptions,
) -> impl Fn(usize) -> Result<Batch, TrainError> + 'a {
    move |step| {
        assemble(
            &batch_for(step),
            partition,
            (options.ring_ranks(), options.ulysses),
            options.pad_token,
            options.pack,
        )
    }
}

/// Rows `[batch, t]` of this rank's positions.
/// Masked next-token cross-entropy of this rank's tokens, divided by the global weight.
fn local_loss<B: LayerBackend>(
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
    let inputs = ints(ctx.shard_rows(&batch.inputs, batch.batch, 1));
    let targets = ints(ctx.shard_rows(&batch.targets, batch.batch, 1));
    let weights = Tensor::<B, 2>::from_data(
        TensorData::new(
            ctx.shard_rows(&batch.weights, batch.batch, 1),
            [batch.batch, t],
        ),
        &device,
    );
    let total: f32 = batch.weights.iter().sum();
    // The loss over the final norm's rows in chunks (`model::loss`): no [tokens × vocab] block.
    let h = model.normed_hidden(inputs, &layout.positions[rank], ctx)?;
    let [b, t, d] = h.dims();
    let nll = next_token_nll(
        h.reshape([b * t, d]),
        model.head_weight(),
        targets.reshape([b * t]),
        weights.reshape([b * t]),
    );
    Ok(nll / total.max(f32::MIN_POSITIVE))
}
