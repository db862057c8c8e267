//! Training and acting with the Agentic Transformer (`model/agentic.rs`): its batches of chains, its
//! action-prediction objective, and the action it predicts for one chain.

use super::objective::Objective;
use crate::error::RingError;
use crate::model::agentic::AgenticTransformer;
use crate::model::layer::LayerBackend;
use crate::ring::context::on_one_rank;
use crate::ring::context::{RingConfig, RingContext};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use std::sync::Arc;
use std::time::Duration;

/// A step's chains laid out in global order: `features [batch, len, F]`, action `targets
/// [batch, len, act_dim]` and `weights [batch, len]` (1 on the state tokens whose action is learned).
#[derive(Debug, Clone, PartialEq)]
pub struct ChainBatch {
    /// Chains in the batch.
    pub batch: usize,
    /// Tokens per chain (padded for the partition).
    pub len: usize,
    /// Length of a token's feature row.
    pub feature_dim: usize,
    /// Length of an action.
    pub act_dim: usize,
    /// Feature rows `[batch, len, feature_dim]`.
    pub features: Vec<f32>,
    /// Target actions `[batch, len, act_dim]`, at state tokens.
    pub targets: Vec<f32>,
    /// Weight of each token's prediction (1 at state tokens, 0 elsewhere).
    pub weights: Vec<f32>,
}

/// Mean squared error of the predicted actions at the weighted tokens (the AT's action loss).
pub struct ActionPrediction;

impl<B: AutodiffBackend + LayerBackend> Objective<B> for ActionPrediction {
    type Model = AgenticTransformer<B>;
    type Batch = ChainBatch;

    fn seq_len(&self, batch: &ChainBatch) -> usize {
        batch.len
    }

    fn tokens(&self, batch: &ChainBatch) -> usize {
        batch.batch * batch.len
    }

    fn layer_masks(
        &self,
        model: &AgenticTransformer<B>,
        ring: &RingConfig,
    ) -> Vec<strategies::MaskedLayers> {
        model.layer_masks(ring)
    }

    fn local_loss(
        &self,
        model: &AgenticTransformer<B>,
        batch: &ChainBatch,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 1>, RingError> {
        let (layout, rank) = (&ctx.layout, ctx.rank());
        let (b, t) = (batch.batch, layout.shard_len(rank));
        let device = Default::default();
        let tensor = |global: &[f32], width: usize| {
            Tensor::<B, 3>::from_data(
                TensorData::new(ctx.shard_rows(global, b, width), [b, t, width]),
                &device,
            )
        };
        let features = tensor(&batch.features, batch.feature_dim);
        let targets = tensor(&batch.targets, batch.act_dim);
        let weights = tensor(&batch.weights, 1);
        let total = batch.weights.iter().sum::<f32>() * batch.act_dim as f32;
        let predicted = model.forward(features, &layout.positions[rank], ctx)?;
        let error = (predicted - targets).powi_scalar(2) * weights;
        Ok(error.sum() / total.max(f32::MIN_POSITIVE))
    }
}

/// The action predicted at position `at` of one chain given as feature rows `[len, F]` (positions
/// after `at` do not influence it: attention is causal). Runs on one rank.
pub fn predict_action<B: LayerBackend>(
    model: &AgenticTransformer<B>,
    features: &[f32],
    feature_dim: usize,
    at: usize,
    timeout: Duration,
) -> Result<Vec<f32>, RingError> {
    let len = features.len() / feature_dim;
    let causal = RingConfig {
        causal: true,
        ..Default::default()
    };
    on_one_rank(len, causal, timeout, |ctx| {
        let x = Tensor::<B, 3>::from_data(
            TensorData::new(features.to_vec(), [1, len, feature_dim]),
            &Default::default(),
        );
        let actions = model.forward(x, ctx.positions(0), ctx)?;
        let act_dim = actions.dims()[2];
        Ok(crate::host::read(actions.slice([
            0..1,
            at..at + 1,
            0..act_dim,
        ])))
    })
}
