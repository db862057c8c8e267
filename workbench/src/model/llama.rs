//! A LLaMA-style decoder whose attention is ring attention: RMSNorm, RoPE on global positions,
//! grouped-query attention, SwiGLU feed-forward computed in sequence chunks (the paper's blockwise FFN).
//!
//! One instance runs on every rank over that rank's shard; positions come from the partition, so
//! striped and zig-zag shards get the right rotations and causal masks.

use crate::error::RingError;
use crate::model::ffn::blockwise_swiglu;
use crate::model::lazy::materialize;
use crate::ring::context::RingContext;
use crate::ring::op::{RingBackend, ring_attention};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::silu;
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
    /// Tokens per feed-forward chunk (blockwise FFN).
    #[config(default = 256)]
    pub ffn_chunk: usize,
    /// The feed-forward's backward recomputes each chunk's hidden activations instead of keeping
    /// them ([`crate::model::ffn`]): the Blockwise Parallel Transformer's memory saving.
    #[config(default = false)]
    pub rematerialize_ffn: bool,
}

impl LlamaConfig {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }

    /// SwiGLU hidden width: 8/3 of the model width, rounded up to `ffn_multiple_of`.
    pub fn ffn_hidden(&self) -> usize {
        let raw = 8 * self.d_model / 3;
        raw.div_ceil(self.ffn_multiple_of) * self.ffn_multiple_of
    }

    /// Number of float parameters.
    pub fn num_params(&self) -> usize {
        let (d, hd, f) = (self.d_model, self.head_dim(), self.ffn_hidden());
        let layer = 2 * d + d * self.heads * hd * 2 + 2 * d * self.kv_heads * hd + 3 * d * f;
        self.vocab * d * 2 + d + self.layers * layer
    }

    /// Checks the sizes that must divide each other.
    pub fn validate(&self) -> Result<(), RingError> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(RingError::Heads {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        if !self.d_model.is_multiple_of(self.heads) || !self.head_dim().is_multiple_of(2) {
            return Err(RingError::ModelWidth {
                d_model: self.d_model,
                heads: self.heads,
            });
        }
        Ok(())
    }

    /// The decoder blocks (attention + SwiGLU), shared by every model built on this trunk.
    pub fn init_blocks<B: Backend>(&self, device: &B::Device) -> Vec<DecoderLayer<B>> {
        let linear = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        let hd = self.head_dim();
        (0..self.layers)
            .map(|_| DecoderLayer {
                attn_norm: RmsNormConfig::new(self.d_model).init(device),
                wq: linear(self.d_model, self.heads * hd),
                wk: linear(self.d_model, self.kv_heads * hd),
                wv: linear(self.d_model, self.kv_heads * hd),
                wo: linear(self.heads * hd, self.d_model),
                ffn_norm: RmsNormConfig::new(self.d_model).init(device),
                w1: linear(self.d_model, self.ffn_hidden()),
                w3: linear(self.d_model, self.ffn_hidden()),
                w2: linear(self.ffn_hidden(), self.d_model),
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
            norm: RmsNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, self.vocab)
                .with_bias(false)
                .init(device),
            heads: self.heads,
            kv_heads: self.kv_heads,
            rope_theta: self.rope_theta,
            ffn_chunk: self.ffn_chunk,
            rematerialize_ffn: self.rematerialize_ffn,
        };
        materialize(&model);
        model
    }
}

#[derive(Module, Debug)]
/// One decoder layer: RMSNorm, grouped-query ring attention, RMSNorm, SwiGLU feed-forward.
pub struct DecoderLayer<B: Backend> {
    attn_norm: RmsNorm<B>,
    wq: Linear<B>,
    wk: Linear<B>,
    wv: Linear<B>,
    wo: Linear<B>,
    ffn_norm: RmsNorm<B>,
    w1: Linear<B>,
    w3: Linear<B>,
    w2: Linear<B>,
}

#[derive(Module, Debug)]
/// The LLaMA-style language model: embedding, decoder layers, final norm, head.
pub struct Llama<B: Backend> {
    embed: Embedding<B>,
    blocks: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
    head: Linear<B>,
    heads: usize,
    kv_heads: usize,
    rope_theta: f64,
    ffn_chunk: usize,
    rematerialize_ffn: bool,
}

/// cos and sin of RoPE angles for each token's global position: `[1, 1, t, head_dim / 2]` each.
fn rope_tables<B: Backend>(
    positions: &[usize],
    head_dim: usize,
    theta: f64,
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let half = head_dim / 2;
    let angles: Vec<f64> = positions
        .iter()
        .flat_map(|&p| {
            (0..half).map(move |i| p as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64))
        })
        .collect();
    let table = |f: fn(f64) -> f64| {
        let data: Vec<f32> = angles.iter().map(|&a| f(a) as f32).collect();
        Tensor::from_data(TensorData::new(data, [1, 1, positions.len(), half]), device)
    };
    (table(f64::cos), table(f64::sin))
}

/// Rotates pairs `(x[i], x[i + d/2])` of `[b, h, t, d]` by the tables' angles.
fn rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, h, t, d] = x.dims();
    let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..d / 2]);
    let x2 = x.slice([0..b, 0..h, 0..t, d / 2..d]);
    Tensor::cat(
        vec![
            x1.clone() * cos.clone() - x2.clone() * sin.clone(),
            x1 * sin.clone() + x2 * cos.clone(),
        ],
        3,
    )
}

/// The trunk's hyper-parameters that `forward` needs (plain fields of the modules built on it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trunk {
    pub heads: usize,
    pub kv_heads: usize,
    pub rope_theta: f64,
    pub ffn_chunk: usize,
    pub rematerialize_ffn: bool,
}

/// Runs the decoder blocks over this rank's hidden states `x: [b, t, d]` at global `positions`.
pub(crate) fn run_layers<B: RingBackend>(
    blocks: &[DecoderLayer<B>],
    mut x: Tensor<B, 3>,
    positions: &[usize],
    trunk: Trunk,
    ctx: &Arc<RingContext>,
) -> Result<Tensor<B, 3>, RingError> {
    let [b, t, d] = x.dims();
    let hd = d / trunk.heads;
    let (cos, sin) = rope_tables::<B>(positions, hd, trunk.rope_theta, &x.device());
    for block in blocks {
        let h = block.attn_norm.forward(x.clone());
        // [b, t, heads · hd] → [b, heads, t, hd]
        let split = |y: Tensor<B, 3>, heads: usize| y.reshape([b, t, heads, hd]).swap_dims(1, 2);
        let q = rope(split(block.wq.forward(h.clone()), trunk.heads), &cos, &sin);
        let k = rope(
            split(block.wk.forward(h.clone()), trunk.kv_heads),
            &cos,
            &sin,
        );
        let v = split(block.wv.forward(h), trunk.kv_heads);
        let (attn, _) = ring_attention(q, k, v, ctx)?;
        x = x + block.wo.forward(attn.swap_dims(1, 2).reshape([b, t, d]));
        let h = block.ffn_norm.forward(x.clone());
        let chunk = trunk.ffn_chunk.max(1);
        if trunk.rematerialize_ffn {
            let (w1, w3, w2) = (
                block.w1.weight.val(),
                block.w3.weight.val(),
                block.w2.weight.val(),
            );
            x = x + blockwise_swiglu(h, w1, w3, w2, chunk);
            continue;
        }
        let chunks = (0..t)
            .step_by(chunk)
            .map(|s| {
                let c = h.clone().slice([0..b, s..(s + chunk).min(t), 0..d]);
                block
                    .w2
                    .forward(silu(block.w1.forward(c.clone())) * block.w3.forward(c))
            })
            .collect();
        x = x + Tensor::cat(chunks, 1);
    }
    Ok(x)
}

impl<B: RingBackend> Llama<B> {
    /// Logits `[b, t, vocab]` for this rank's tokens `[b, t]` at global `positions`.
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: &[usize],
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 3>, RingError> {
        let trunk = Trunk {
            heads: self.heads,
            kv_heads: self.kv_heads,
            rope_theta: self.rope_theta,
            ffn_chunk: self.ffn_chunk,
            rematerialize_ffn: self.rematerialize_ffn,
        };
        let x = run_layers(
            &self.blocks,
            self.embed.forward(tokens),
            positions,
            trunk,
            ctx,
        )?;
        Ok(self.head.forward(self.norm.forward(x)))
    }
}
