//! A LLaMA-style decoder whose attention is ring attention: RMSNorm, RoPE on global positions,
//! grouped-query attention, SwiGLU feed-forward computed in sequence chunks (the paper's blockwise FFN);
//! the layers' math is [`crate::model::layer`]'s.
//!
//! One instance runs on every rank over that rank's shard; positions come from the partition, so
//! striped and zig-zag shards get the right rotations and causal masks.

use crate::error::RingError;
use crate::kernels::bf16_matmul::PackedBf16;
use crate::model::bf16::{pack, project_bf16};
use crate::model::layer::{
    Checkpoint, LayerBackend, LayerKv, NewTokens, Trunk, decode_layers, prefill_layers, run_layers,
};
use crate::model::lazy::materialize;
use crate::model::lora::{LayerLora, LoraConfig, LoraTarget};
use crate::model::rope_scaling::{RopeFrequencies, RopeScaling};
use crate::model::weights::DecoderLayer;
use crate::ring::cache::KvCache;
use crate::ring::context::{RingConfig, RingContext};
use crate::ring::decode::DecodeMerge;
use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use std::sync::Arc;

#[derive(Config, Debug, PartialEq)]
/// Sizes of the LLaMA-style decoder.
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab: usize,
    #[config(default = 128)]
    /// Model width.
    pub d_model: usize,
    #[config(default = 2)]
    /// Decoder layers.
    pub layers: usize,
    #[config(default = 4)]
    /// Query heads.
    pub heads: usize,
    #[config(default = 2)]
    /// Key/value heads (grouped-query attention).
    pub kv_heads: usize,
    /// SwiGLU hidden size is 8/3 · d_model rounded up to a multiple of this (LLaMA's `multiple_of`).
    #[config(default = 32)]
    pub ffn_multiple_of: usize,
    #[config(default = 10000.0)]
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE's context-extension scaling (position interpolation, dynamic NTK, llama3, YaRN).
    #[config(default = "RopeScaling::Default")]
    pub rope_scaling: RopeScaling,
    /// Width of one head; `None`: `d_model / heads` (Hugging Face's `head_dim`).
    #[config(default = "None")]
    pub head_dim: Option<usize>,
    /// SwiGLU hidden width; `None`: 8/3 · `d_model` rounded up to `ffn_multiple_of` (Hugging
    /// Face's `intermediate_size`).
    #[config(default = "None")]
    pub ffn_hidden_size: Option<usize>,
    /// The RMSNorms' ε.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Biases on the query, key and value projections (Qwen2).
    #[config(default = false)]
    pub qkv_bias: bool,
    /// The output head is the embedding's transpose (Hugging Face's `tie_word_embeddings`).
    #[config(default = false)]
    pub tie_embeddings: bool,
    /// Tokens per feed-forward chunk (blockwise FFN).
    #[config(default = 256)]
    pub ffn_chunk: usize,
    /// What each layer keeps for its backward: everything (`none`), all but the feed-forward's
    /// hidden activations (`ffn`: the Blockwise Parallel Transformer), or only its input (`block`).
    #[config(default = "Checkpoint::None")]
    pub checkpoint: Checkpoint,
    /// A sliding window of the windowed layers (Mistral, Gemma 2/3, gpt-oss); `None`: none.
    #[config(default = "None")]
    pub window: Option<usize>,
    /// Which layers are windowed: layer i when `i % window_every == 0` (1: all; 2: every other one,
    /// alternating with full attention as Gemma 2 and gpt-oss do).
    #[config(default = 1)]
    pub window_every: usize,
    /// Logit soft-capping `C · tanh(s / C)` in every layer (Gemma 2); `None`: none.
    #[config(default = "None")]
    pub softcap: Option<f32>,
    /// Learned attention sinks: one logit per query head in every layer (gpt-oss), from 0.
    #[config(default = false)]
    pub sinks: bool,
}

impl LlamaConfig {
    /// Width of one head: `head_dim`, or `d_model / heads`.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.heads.max(1))
    }

    /// SwiGLU hidden width: `ffn_hidden_size`, or 8/3 of the model width rounded up to
    /// `ffn_multiple_of`.
    pub fn ffn_hidden(&self) -> usize {
        self.ffn_hidden_size.unwrap_or_else(|| {
            let raw = 8 * self.d_model / 3;
            raw.div_ceil(self.ffn_multiple_of) * self.ffn_multiple_of
        })
    }

    /// RoPE's base and scaling.
    pub fn rope(&self) -> RopeFrequencies {
        RopeFrequencies {
            theta: self.rope_theta,
            scaling: self.rope_scaling,
        }
    }

    /// What a decoder layer needs of these sizes.
    pub fn trunk(&self) -> Trunk {
        Trunk {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim(),
            rope: self.rope(),
            ffn_chunk: self.ffn_chunk,
            checkpoint: self.checkpoint,
            window: self.window,
            window_every: self.window_every,
            softcap: self.softcap,
        }
    }

    /// Number of float parameters.
    pub fn num_params(&self) -> usize {
        let (d, hd, f) = (self.d_model, self.head_dim(), self.ffn_hidden());
        let (q, kv) = (self.heads * hd, self.kv_heads * hd);
        let biases = if self.qkv_bias { q + 2 * kv } else { 0 };
        let sinks = if self.sinks { self.heads } else { 0 };
        let layer = 2 * d + 2 * d * q + 2 * d * kv + 3 * d * f + biases + sinks;
        let heads = if self.tie_embeddings { 1 } else { 2 };
        self.vocab * d * heads + d + self.layers * layer
    }

    /// Checks the sizes that must divide each other and the values that must be positive.
    pub fn validate(&self) -> Result<(), RingError> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(RingError::Heads {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        match self.head_dim {
            None if !self.d_model.is_multiple_of(self.heads) || self.head_dim() % 2 == 1 => {
                return Err(RingError::ModelWidth {
                    d_model: self.d_model,
                    heads: self.heads,
                });
            }
            Some(hd) if hd == 0 || hd % 2 == 1 => {
                return Err(RingError::ModelConfig(format!(
                    "head_dim = {hd} must be even and above 0 (RoPE rotates pairs)"
                )));
            }
            _ => {}
        }
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return Err(RingError::ModelConfig(format!(
                "norm_eps = {} must be above 0",
                self.norm_eps
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(RingError::ModelConfig(format!(
                "rope_theta = {} must be a number above 1",
                self.rope_theta
            )));
        }
        if self.window == Some(0) || self.window_every == 0 {
            return Err(RingError::ModelConfig(format!(
                "window = {:?}, window_every = {}: a window is at least 1 token and windowed \
                 layers come every 1 or more",
                self.window, self.window_every
            )));
        }
        if let Some(fault) = self
            .rope_scaling
            .fault()
            .or_else(|| self.rope_scaling.head_fault(self.head_dim()))
        {
            return Err(RingError::ModelConfig(format!(
                "rope scaling {}: {fault}",
                self.rope_scaling.name()
            )));
        }
        // (A vocabulary of 0 is a trunk without embedding or head: the Agentic Transformer's.)
        if self.ffn_hidden() == 0 || self.d_model == 0 {
            return Err(RingError::ModelConfig(format!(
                "d_model {} and the feed-forward width {} must be above 0",
                self.d_model,
                self.ffn_hidden()
            )));
        }
        Ok(())
    }

    /// The decoder blocks (attention + SwiGLU), shared by every model built on this trunk. Their
    /// weights are not drawn yet (Burn draws on first use), so that a model's `init` draws all of its
    /// weights in field order; a caller that uses the blocks alone draws them under
    /// [`seeded`](crate::model::lazy::seeded) with [`materialize`], or its first forward would draw
    /// them outside the lock.
    pub fn init_blocks<B: Backend>(&self, device: &B::Device) -> Vec<DecoderLayer<B>> {
        let linear = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        let biased = |i, o| {
            LinearConfig::new(i, o)
                .with_bias(self.qkv_bias)
                .init(device)
        };
        let norm = || {
            RmsNormConfig::new(self.d_model)
                .with_epsilon(self.norm_eps)
                .init(device)
        };
        let hd = self.head_dim();
        (0..self.layers)
            .map(|_| DecoderLayer {
                attn_norm: norm(),
                wq: biased(self.d_model, self.heads * hd),
                wk: biased(self.d_model, self.kv_heads * hd),
                wv: biased(self.d_model, self.kv_heads * hd),
                wo: linear(self.heads * hd, self.d_model),
                ffn_norm: norm(),
                w1: linear(self.d_model, self.ffn_hidden()),
                w3: linear(self.d_model, self.ffn_hidden()),
                w2: linear(self.ffn_hidden(), self.d_model),
                sinks: self
                    .sinks
                    .then(|| Param::from_tensor(Tensor::zeros([self.heads], device))),
                lora: None,
                bf16: None,
            })
            .collect()
    }

    /// A model with freshly drawn (and materialized) weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Llama<B> {
        let model = Llama {
            embed: EmbeddingConfig::new(self.vocab, self.d_model)
                .with_initializer(burn::nn::Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                })
                .init(device),
            blocks: self.init_blocks(device),
            norm: RmsNormConfig::new(self.d_model)
                .with_epsilon(self.norm_eps)
                .init(device),
            head: (!self.tie_embeddings).then(|| {
                LinearConfig::new(self.d_model, self.vocab)
                    .with_bias(false)
                    .init(device)
            }),
            trunk: self.trunk(),
            head_bf16: None,
        };
        materialize(&model);
        model
    }
}

#[derive(Module, Debug)]
/// The LLaMA-style language model: embedding, decoder layers, final norm, head (the embedding's
/// transpose when tied).
pub struct Llama<B: Backend> {
    pub(crate) embed: Embedding<B>,
    pub(crate) blocks: Vec<DecoderLayer<B>>,
    pub(crate) norm: RmsNorm<B>,
    /// `None`: tied to the embedding.
    pub(crate) head: Option<Linear<B>>,
    /// What every layer needs of the config (sizes, checkpointing, window, cap).
    trunk: Trunk,
    /// The head (or the embedding's transpose) packed as bf16, when the model runs in bf16
    /// (`model::bf16`).
    #[module(skip)]
    pub(crate) head_bf16: Option<Arc<PackedBf16>>,
}

impl<B: Backend> Llama<B> {
    /// The model from its parts (a checkpoint reader's: weights it read, not drawn).
    pub(crate) fn from_parts(
        embed: Embedding<B>,
        blocks: Vec<DecoderLayer<B>>,
        norm: RmsNorm<B>,
        head: Option<Linear<B>>,
        trunk: Trunk,
    ) -> Self {
        Llama {
            embed,
            blocks,
            norm,
            head,
            trunk,
            head_bf16: None,
        }
    }
}

impl<B: Backend> Llama<B> {
    /// The model with bf16 copies of its projections and output head, which its prefill and decoding
    /// then multiply by (see the module's doc). Bytes added: half the f32 weights' (less the
    /// embedding's, when untied). LoRA adapters are folded in first.
    pub fn with_bf16_weights(self) -> Self {
        let mut model = self.merge_lora();
        for layer in &mut model.blocks {
            layer.bf16 = Some(Arc::new(layer.packed()));
        }
        let head = match &model.head {
            Some(head) => head.weight.val(),
            None => model.embed.weight.val().transpose(),
        };
        model.head_bf16 = Some(Arc::new(pack(head)));
        model
    }

    /// The model adapted with LoRA (`model::lora`): every base weight frozen (no gradient, no
    /// optimizer state), adapters on `config.targets` of every layer (A drawn from `seed` as PEFT
    /// draws it, B zero: the model computes as before), and the embedding and norms trainable where
    /// `config` says. A model already adapted is refused.
    pub fn with_lora(self, config: &LoraConfig, seed: u64) -> Result<Self, RingError> {
        config.validate()?;
        let device = self.embed.weight.device();
        let layers = self
            .blocks
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                let dims = |target: LoraTarget| {
                    let [inputs, outputs] = layer.linear(target).weight.dims();
                    (inputs, outputs)
                };
                LayerLora::drawn(config, dims, seed.wrapping_add(i as u64), &device)
            })
            .collect();
        self.with_adapters(layers, config)
    }

    /// The model with `layers[i]` on layer i (adapters read from a PEFT directory, say): the base
    /// frozen, the embedding and norms trainable where `config` says (its targets and scale are
    /// the adapters' own).
    pub fn with_adapters(
        self,
        layers: Vec<LayerLora<B>>,
        config: &LoraConfig,
    ) -> Result<Self, RingError> {
        if self.blocks.iter().any(|b| b.lora.is_some()) {
            return Err(RingError::ModelConfig(
                "LoRA: the model has adapters already; merge them first".into(),
            ));
        }
        if layers.len() != self.blocks.len() {
            return Err(RingError::ModelConfig(format!(
                "LoRA: adapters for {} layers, the model has {}",
                layers.len(),
                self.blocks.len()
            )));
        }
        if config.train_embeddings && self.head.is_none() {
            return Err(RingError::ModelConfig(
                "LoRA: train_embeddings on a model whose head is its embedding (tied): PEFT's \
                 modules_to_save would train a copy and leave the head on the original; train \
                 norms and adapters only"
                    .into(),
            ));
        }
        let mut model = self.no_grad();
        for (block, lora) in model.blocks.iter_mut().zip(layers) {
            block.lora = Some(lora);
            if config.train_norms {
                block.attn_norm.gamma = block.attn_norm.gamma.clone().set_require_grad(true);
                block.ffn_norm.gamma = block.ffn_norm.gamma.clone().set_require_grad(true);
            }
        }
        if config.train_norms {
            model.norm.gamma = model.norm.gamma.set_require_grad(true);
        }
        if config.train_embeddings {
            model.embed.weight = model.embed.weight.set_require_grad(true);
        }
        Ok(model)
    }

    /// Each layer's adapters, when the model is adapted.
    pub fn lora_layers(&self) -> Option<Vec<&LayerLora<B>>> {
        self.blocks.iter().map(|b| b.lora.as_ref()).collect()
    }

    /// The adapters folded into the weights (`W + s·A·B`) and removed: the plain model they
    /// compute (for export, inference, or packing in bf16). A model without adapters is returned
    /// as it is.
    pub fn merge_lora(mut self) -> Self {
        for block in &mut self.blocks {
            let Some(lora) = block.lora.take() else {
                continue;
            };
            for target in LoraTarget::ALL {
                if let Some(pair) = lora.pair(target) {
                    let linear = block.linear_mut(target);
                    let merged = (linear.weight.val() + pair.delta(lora.scale())).detach();
                    linear.weight = Param::from_tensor(merged);
                }
            }
        }
        self
    }

    /// Whether the projections run in bf16.
    pub fn bf16_weights(&self) -> bool {
        self.head_bf16.is_some()
    }
}

impl<B: Backend> Llama<B> {
    /// The same weights run with `config`'s trunk options (feed-forward chunking, checkpointing,
    /// window, cap): a loaded model trained or evaluated with a spec's options. The sizes must be
    /// the model's own.
    pub fn with_trunk_of(mut self, config: &LlamaConfig) -> Self {
        self.trunk = config.trunk();
        self
    }
}

impl<B: LayerBackend> Llama<B> {
    /// Logits `[b, t, vocab]` for this rank's tokens `[b, t]` at global `positions`.
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 3>, RingError> {
        self.forward_in_batch(tokens, positions, ctx, ctx.sequence().len)
    }

    /// [`Llama::forward`] of a sequence that runs in a batch whose longest sequence is `batch_len`:
    /// dynamic NTK RoPE scaling reads the batch's length, as transformers does for a padded batch
    /// (every row rotated as the longest), so a row's logits depend on the rows beside it.
    pub fn forward_in_batch(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
        batch_len: usize,
    ) -> Result<Tensor<B, 3>, RingError> {
        let x = self.layers_out(tokens, positions, ctx, batch_len)?;
        Ok(self.logits(x))
    }

    /// Logits `[b, t, vocab]` of the last layer's output `[b, t, d]`: the final norm, then the head
    /// (or the embedding's transpose).
    pub(crate) fn logits(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = self.norm.forward(x);
        if let Some(head) = &self.head_bf16 {
            return project_bf16(x, head);
        }
        let [b, t, d] = x.dims();
        let head = self.head_weight();
        let vocab = head.dims()[1];
        x.reshape([b * t, d]).matmul(head).reshape([b, t, vocab])
    }

    /// The output head as `[d, vocab]`: the head's weight, or the embedding's transpose when tied.
    pub(crate) fn head_weight(&self) -> Tensor<B, 2> {
        match &self.head {
            Some(head) => head.weight.val(),
            None => self.embed.weight.val().transpose(),
        }
    }

    /// The final norm's output `[b, t, d]` for this rank's tokens at global `positions`: what the
    /// head multiplies (the training loss multiplies it in chunks, `model::loss`).
    pub(crate) fn normed_hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 3>, RingError> {
        let x = self.layers_out(tokens, positions, ctx, ctx.sequence().len)?;
        Ok(self.norm.forward(x))
    }

    /// The last layer's output `[b, t, d]` (before the final norm) in a batch whose longest
    /// sequence is `batch_len`.
    pub(crate) fn layers_out(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
        batch_len: usize,
    ) -> Result<Tensor<B, 3>, RingError> {
        run_layers(
            &self.blocks,
            self.embed.forward(tokens),
            positions,
            self.trunk,
            ctx,
            batch_len,
        )
    }

    /// A prefill of this rank's tokens `[b, t]` at global `positions` in a batch whose longest prompt
    /// is `batch_len` (as [`Llama::forward_in_batch`]): each layer's keys (after RoPE) and values
    /// `[b, hk, t, hd]`, for a [`KvCache`], and the logits `[b, vocab]` after the token at local index
    /// `last` alone (the prompt's last token, on the rank that holds it): a decoding reads no
    /// others, and a real vocabulary's `[t, vocab]` block is most of a long prefill's memory.
    pub fn prefill(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
        batch_len: usize,
        last: Option<usize>,
    ) -> Result<(Option<Tensor<B, 2>>, LayerKv<B>), RingError> {
        let (x, kept) = prefill_layers(
            &self.blocks,
            self.embed.forward(tokens),
            positions,
            self.trunk,
            ctx,
            batch_len,
        )?;
        let logits = last.map(|i| {
            let [b, _, d] = x.dims();
            // [b, 1, d] → [b, 1, vocab]: the norm and head are per token.
            let logits = self.logits(x.slice([0..b, i..i + 1, 0..d]));
            let vocab = logits.dims()[2];
            logits.reshape([b, vocab])
        });
        Ok((logits, kept))
    }

    /// One decoding step over the ranks of `ctx`: `tokens[i]` is the next token of the cache's row
    /// `rows[i]`; each is placed in the cache (on the rank the placement rule picks) and attends to
    /// every rank's cached keys of its sequence, the ranks' parts merged by `merge`. Returns the
    /// logits `[R, vocab]` after each token, the same bits on every rank. `batch_len` is the step's
    /// batch length, its longest sequence with the new token (rows that stopped count, as their
    /// padding does in transformers): what dynamic NTK scaling reads.
    pub fn decode_step(
        &self,
        tokens: &[u32],
        rows: &[usize],
        cache: &mut KvCache<B>,
        batch_len: usize,
        (ctx, merge): (&Arc<RingContext>, DecodeMerge),
    ) -> Result<Tensor<B, 2>, RingError> {
        if tokens.len() != rows.len() {
            return Err(RingError::Shape {
                what: "decode tokens, one a row",
                expected: vec![rows.len()],
                got: vec![tokens.len()],
            });
        }
        let mut places = Vec::with_capacity(rows.len());
        let mut positions = Vec::with_capacity(rows.len());
        for &row in rows {
            let (position, place) = cache.start_token(row)?;
            positions.push(position);
            places.push(place);
        }
        let device = self.embed.weight.val().device();
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let tokens_in =
            Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, rows.len()]), &device);
        let new = NewTokens {
            rows,
            places: &places,
            positions: &positions,
            rope_len: batch_len,
        };
        let x = decode_layers(
            &self.blocks,
            self.embed.forward(tokens_in),
            &new,
            self.trunk,
            (ctx, merge),
            cache,
        )?;
        let logits = self.logits(x);
        let vocab = logits.dims()[2];
        Ok(logits.reshape([rows.len(), vocab]))
    }

    /// Every layer's mask on `ring` (its window on the windowed layers), grouped: what a layout
    /// for this model is balanced for.
    pub fn layer_masks(&self, ring: &RingConfig) -> Vec<strategies::MaskedLayers> {
        self.trunk.layer_masks(self.blocks.len(), ring)
    }

    /// Decoder layers (the KV cache's layer count).
    pub fn layers(&self) -> usize {
        self.blocks.len()
    }

    /// Tokens in the vocabulary (the logits' width).
    pub fn vocab(&self) -> usize {
        self.embed.weight.val().dims()[0]
    }
}
