//! The Agentic Transformer (Liu & Abbeel 2023), the model of the Ring Attention paper's §5.3 /
//! Table 5: a chain of trajectories sorted by return ascending, every step four tokens (target return,
//! state, action, reward) embedded by linear maps into the LLaMA-style trunk, trained to predict each
//! step's action from its state token, causally, with ring attention across the ranks.
//!
//! Every token is one feature row `[kind one-hot (4) | target | state | action | reward]` in which
//! only its kind's slot is filled, so one linear map acts as four per-kind maps plus a kind embedding,
//! and each rank embeds only the rows it owns. Its training objective and single-chain prediction
//! are in `train/agentic.rs`.

use crate::error::RingError;
use crate::model::layer::{LayerBackend, Trunk, run_layers};
use crate::model::lazy::materialize;
use crate::model::llama::LlamaConfig;
use crate::model::weights::DecoderLayer;
use crate::ring::context::{RingConfig, RingContext};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use std::sync::Arc;

/// The four tokens of a step, in sequence order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// The return the chain should reach.
    Target = 0,
    /// The state the agent sees.
    State = 1,
    /// The action it took.
    Action = 2,
    /// The reward it got.
    Reward = 3,
}

/// Tokens per decision: target return, state, action, reward.
pub const TOKENS_PER_STEP: usize = 4;

#[derive(Config, Debug, PartialEq)]
/// Sizes of the Agentic Transformer.
pub struct AgenticConfig {
    /// Length of a state.
    pub obs_dim: usize,
    /// Length of an action.
    pub act_dim: usize,
    #[config(default = 64)]
    /// Model width.
    pub d_model: usize,
    #[config(default = 2)]
    /// Decoder layers.
    pub layers: usize,
    #[config(default = 4)]
    /// Query heads.
    pub heads: usize,
    #[config(default = 2)]
    /// Key/value heads.
    pub kv_heads: usize,
    #[config(default = 10000.0)]
    /// RoPE base.
    pub rope_theta: f64,
    #[config(default = 256)]
    /// Tokens per feed-forward chunk.
    pub ffn_chunk: usize,
}

impl AgenticConfig {
    /// Width of a token's feature row.
    pub fn feature_dim(&self) -> usize {
        TOKENS_PER_STEP + 1 + self.obs_dim + self.act_dim + 1
    }

    fn trunk(&self) -> LlamaConfig {
        LlamaConfig::new(0)
            .with_d_model(self.d_model)
            .with_layers(self.layers)
            .with_heads(self.heads)
            .with_kv_heads(self.kv_heads)
            .with_rope_theta(self.rope_theta)
            .with_ffn_chunk(self.ffn_chunk)
    }

    /// A model with freshly drawn (and materialized) weights, or an error for sizes that do not fit.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<AgenticTransformer<B>, RingError> {
        let trunk = self.trunk();
        trunk.validate()?;
        let model = AgenticTransformer {
            embed: LinearConfig::new(self.feature_dim(), self.d_model).init(device),
            blocks: trunk.init_blocks(device),
            norm: RmsNormConfig::new(self.d_model).init(device),
            action_head: LinearConfig::new(self.d_model, self.act_dim).init(device),
            trunk: trunk.trunk(),
        };
        materialize(&model);
        Ok(model)
    }

    /// The feature row of one token; `value` fills its kind's slot (length 1, obs_dim, act_dim, 1).
    pub fn token(&self, kind: TokenKind, value: &[f32]) -> Vec<f32> {
        let mut row = vec![0.0; self.feature_dim()];
        row[kind as usize] = 1.0;
        let start = TOKENS_PER_STEP
            + match kind {
                TokenKind::Target => 0,
                TokenKind::State => 1,
                TokenKind::Action => 1 + self.obs_dim,
                TokenKind::Reward => 1 + self.obs_dim + self.act_dim,
            };
        row[start..start + value.len()].copy_from_slice(value);
        row
    }
}

#[derive(Module, Debug)]
/// The Agentic Transformer: one linear embedding for all four token kinds, the LLaMA-style decoder layers, an action head.
pub struct AgenticTransformer<B: Backend> {
    embed: Linear<B>,
    blocks: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
    action_head: Linear<B>,
    /// What every layer needs of the config.
    trunk: Trunk,
}

impl<B: Backend> AgenticTransformer<B> {
    /// Every layer's mask on `ring`, grouped: what a layout for this model is balanced for.
    pub fn layer_masks(&self, ring: &RingConfig) -> Vec<strategies::MaskedLayers> {
        self.trunk.layer_masks(self.blocks.len(), ring)
    }
}

impl<B: LayerBackend> AgenticTransformer<B> {
    /// Predicted actions `[b, t, act_dim]` in `(-1, 1)` for this rank's feature rows `[b, t, F]`.
    pub fn forward(
        &self,
        features: Tensor<B, 3>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 3>, RingError> {
        let x = run_layers(
            &self.blocks,
            self.embed.forward(features),
            positions,
            self.trunk,
            ctx,
            ctx.sequence().len,
        )?;
        Ok(self.action_head.forward(self.norm.forward(x)).tanh())
    }
}
