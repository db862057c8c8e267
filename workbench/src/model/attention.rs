//! Ring attention as a Burn module, the way Burn's `MultiHeadAttention` is one: a config, `init`,
//! and `forward` on this rank's tokens. Queries, keys and values are projected from the tokens
//! (grouped-query when `kv_heads < heads`), rotated by RoPE at each token's global position when
//! asked, attended across the ranks with the ring (a sliding window, a logit cap and learned sinks
//! when configured), and projected back.
//!
//! # Shapes
//! `forward`: x `[batch, t, d_model]` → `[batch, t, d_model]`, t this rank's shard length.

use crate::error::RingError;
use crate::model::lazy::materialize;
use crate::model::rope::{Rope, rotate_generic};
use crate::model::rope_scaling::RopeFrequencies;
use crate::ring::context::{Attend, RingContext};
use crate::ring::op::{RingBackend, ring_attention_with};
use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use std::sync::Arc;

/// A [`RingAttention`] layer's shape and masking.
#[derive(Config, Debug)]
pub struct RingAttentionConfig {
    /// Width of the tokens.
    pub d_model: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads, a divisor of `heads` (grouped-query attention); `None`: `heads`.
    #[config(default = "None")]
    pub kv_heads: Option<usize>,
    /// Width of a head; `None`: `d_model / heads`.
    #[config(default = "None")]
    pub head_dim: Option<usize>,
    /// Whether a token sees only tokens at or before its position.
    #[config(default = true)]
    pub causal: bool,
    /// A sliding window: a token sees only tokens less than `W` positions away; `None`: no window.
    #[config(default = "None")]
    pub window: Option<usize>,
    /// Logit soft-capping `C · tanh(s / C)`; `None`: none.
    #[config(default = "None")]
    pub softcap: Option<f32>,
    /// Learned attention sinks: one logit per query head joining its softmax denominators
    /// (initialized at 0).
    #[config(default = false)]
    pub sinks: bool,
    /// RoPE base (each token rotated at its global position); `None`: no rotary embedding.
    #[config(default = "None")]
    pub rope_theta: Option<f64>,
}

/// Multi-head (or grouped-query) attention whose attention is ring attention across the ranks of
/// the [`RingContext`] it is called with.
#[derive(Module, Debug)]
pub struct RingAttention<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    out: Linear<B>,
    /// Sink logits `[heads]`, when the layer has them.
    sinks: Option<Param<Tensor<B, 1>>>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    causal: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    rope_theta: Option<f64>,
}

impl RingAttentionConfig {
    /// The layer on `device`, its weights drawn now (Burn draws a parameter on first use otherwise,
    /// so that two clones of a fresh module would train from different weights).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<RingAttention<B>, RingError> {
        let heads = self.heads;
        let kv_heads = self.kv_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(RingError::Heads { heads, kv_heads });
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.d_model.is_multiple_of(heads) => self.d_model / heads,
            None => {
                return Err(RingError::ModelWidth {
                    d_model: self.d_model,
                    heads,
                });
            }
        };
        if self.rope_theta.is_some() && !head_dim.is_multiple_of(2) {
            return Err(RingError::ModelWidth {
                d_model: self.d_model,
                heads,
            });
        }
        Attend {
            causal: self.causal,
            scale: None,
            window: self.window,
            softcap: self.softcap,
        }
        .check()?;
        let linear = |from, to| LinearConfig::new(from, to).with_bias(false).init(device);
        let layer = RingAttention {
            q: linear(self.d_model, heads * head_dim),
            k: linear(self.d_model, kv_heads * head_dim),
            v: linear(self.d_model, kv_heads * head_dim),
            out: linear(heads * head_dim, self.d_model),
            sinks: self
                .sinks
                .then(|| Param::from_tensor(Tensor::zeros([heads], device))),
            heads,
            kv_heads,
            head_dim,
            causal: self.causal,
            window: self.window,
            softcap: self.softcap,
            rope_theta: self.rope_theta,
        };
        materialize(&layer);
        Ok(layer)
    }
}

impl<B: RingBackend> RingAttention<B> {
    /// Attends this rank's tokens `x` (`[batch, t, d_model]`, in the order `ctx` gave the rank its
    /// positions: [`RingContext::shard`] makes them) to every rank's.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 3>, RingError> {
        let [b, t, _] = x.dims();
        let d = self.head_dim;
        // [b, t, heads · d] → [b, heads, t, d], the layout ring attention takes.
        let split = |y: Tensor<B, 3>, heads: usize| y.reshape([b, t, heads, d]).swap_dims(1, 2);
        let mut q = split(self.q.forward(x.clone()), self.heads);
        let mut k = split(self.k.forward(x.clone()), self.kv_heads);
        let v = split(self.v.forward(x), self.kv_heads);
        if let Some(theta) = self.rope_theta {
            let frequencies = (RopeFrequencies::plain(theta), ctx.sequence().len);
            let rope = Rope::new(ctx.positions(ctx.rank()), d, frequencies, &q.device());
            // With tensor ops: a user's model need not be on a backend with a fused rotation.
            let rotate = |x| rotate_generic(x, rope.cos.clone(), rope.sin.clone(), false);
            (q, k) = (rotate(q), rotate(k));
        }
        let attend = Attend {
            causal: self.causal,
            scale: None,
            window: self.window,
            softcap: self.softcap,
        };
        let sinks = self.sinks.as_ref().map(Param::val);
        let (out, _) = ring_attention_with(q, k, v, sinks, ctx, attend)?;
        Ok(self
            .out
            .forward(out.swap_dims(1, 2).reshape([b, t, self.heads * d])))
    }
}
