//! One decoder layer's forward (RMSNorm, grouped-query ring attention with RoPE, SwiGLU feed-forward
//! in chunks) and the checkpointed layer: an op whose state is the layer's input and whose backward
//! recomputes the layer and differentiates it by hand. Its parameters are in `weights.rs`, what it
//! keeps in `checkpoint.rs`, its norm in `norm.rs`, RoPE in `rope.rs`.
//!
//! The checkpointed backward, for `x2 = x + attn(norm₁(x))·Wo` and `y = x2 + ffn(norm₂(x2))`, given
//! dy: the feed-forward's backward (`model::ffn::swiglu_backward`) gives dh₂ and dW1, dW3,
//! dW2; RMSNorm's gives dx2 += ∂norm₂ and dγ₂; `dWo = aᵀ·dx2`, `da = dx2·Woᵀ`; the ring backward
//! (`ring::engine::backward`) gives dq, dk, dv, rotated back by RoPE's inverse (the same
//! rotation with −sin); `dWq = h₁ᵀ·dq` (and k, v), `dh₁ = dq·Wqᵀ + dk·Wkᵀ + dv·Wvᵀ`; RMSNorm's
//! backward of dh₁ is added to dx2. RMSNorm `y = γ ∘ x·r` with `r = (mean(x²) + ε)^(−1/2)` has
//! `dγ = Σ dy ∘ x·r` and `dx = r·g − r³·x·mean(g ∘ x)` for `g = dy ∘ γ`.

use crate::error::RingError;
use crate::kernels::bf16_matmul::PackedBf16;
use crate::model::bf16::{Bf16Backend, Bf16Layer, project_bf16};
use crate::model::elementwise::{heads_first, heads_last, rms_norm, rms_norm_backward, swiglu};
use crate::model::ffn::{FfnBackend, blockwise_swiglu, swiglu_backward};
use crate::model::lora::LoraTarget;
use crate::model::loss::LossBackend;
use crate::model::project::{ProjectBackend, flat, project};
use crate::model::rope::{Rope, RopeBackend};
use crate::model::rope_scaling::RopeFrequencies;
use crate::model::weights::{DecoderLayer, WeightPrimitives, Weights};
use crate::primitive::{unwrap, wrap};
use crate::ring::cache::KvCache;
use crate::ring::context::{Attend, RingConfig, RingContext};
use crate::ring::decode::{DecodeMerge, attend_cached};
use crate::ring::engine::{self, Saved};
use crate::ring::op::{RingBackend, RingInputs};
use crate::trace;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use std::sync::Arc;

pub use crate::model::checkpoint::Checkpoint;

/// The trunk's hyper-parameters that a layer needs (a plain field of the modules built on it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trunk {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RoPE's base and scaling.
    pub rope: RopeFrequencies,
    /// Tokens per feed-forward chunk.
    pub ffn_chunk: usize,
    /// What the layer keeps for its backward.
    pub checkpoint: Checkpoint,
    /// A sliding window of the windowed layers; `None`: every layer attends its whole document.
    pub window: Option<usize>,
    /// Which layers the window applies to: layer i when `i % window_every == 0` (1: all of them;
    /// 2: every other one, the first windowed).
    pub window_every: usize,
    /// Logit soft-capping of every layer's attention.
    pub softcap: Option<f32>,
}

impl Trunk {
    /// What layer `layer`'s attention masks and scores by: the ring's causality and scale, the
    /// trunk's window (on the windowed layers) and cap.
    pub fn attend(&self, layer: usize, ring: &RingConfig) -> Attend {
        Attend {
            window: self
                .window
                .filter(|_| layer.is_multiple_of(self.window_every.max(1))),
            softcap: self.softcap,
            ..ring.attend()
        }
    }

    /// The masks of `layers` layers on `ring`, grouped with how many layers use each: what a
    /// layout is balanced for ([`strategies::Workload`]).
    pub fn layer_masks(&self, layers: usize, ring: &RingConfig) -> Vec<strategies::MaskedLayers> {
        strategies::MaskedLayers::group((0..layers).map(|i| self.attend(i, ring).mask()))
    }
}

/// A layer's forward and what its hand-written backward reads.
struct Forward<B: Backend, S = Saved> {
    /// The layer's output.
    y: Tensor<B, 3>,
    /// First norm's output and its `r`.
    h1: Tensor<B, 3>,
    r1: Tensor<B, 3>,
    /// Attention output `[b, heads, t, hd]` and what the attention kept (the ring backward's blocks).
    out: Tensor<B, 4>,
    saved: S,
    /// The residual after attention, the second norm's output and its `r`.
    x2: Tensor<B, 3>,
    h2: Tensor<B, 3>,
    r2: Tensor<B, 3>,
}

/// The layer's forward with ring attention over the ranks of `ctx`.
fn forward<B: RingBackend + FfnBackend + RopeBackend + Bf16Backend + ProjectBackend>(
    w: &Weights<B>,
    x: Tensor<B, 3>,
    rope: &Rope<B>,
    (trunk, attend): (Trunk, Attend),
    ctx: &Arc<RingContext>,
) -> Result<Forward<B>, RingError> {
    forward_with(w, x, rope, trunk, |q, k, v| ring(w, [q, k, v], attend, ctx))
}

/// Ring attention of the layer's rotated queries and keys and its values, with its sinks.
fn ring<B: RingBackend>(
    w: &Weights<B>,
    [q, k, v]: [Tensor<B, 4>; 3],
    attend: Attend,
    ctx: &Arc<RingContext>,
) -> Result<(Tensor<B, 4>, Saved), RingError> {
    let inputs = RingInputs {
        q: unwrap(q),
        k: unwrap(k),
        v: unwrap(v),
        sinks: w.sinks.clone().map(unwrap),
    };
    let (out, _, saved) = B::ring_forward(inputs, ctx, attend)?;
    Ok((wrap(out), saved))
}

/// The layer's forward with its attention given: `attention(q, k, v)` of the queries and keys
/// (rotated by RoPE, `[b, h | hk, t, hd]`) and the values gives the attention output
/// `[b, h, t, hd]` and what the attention keeps. Prefill, decoding and training share it.
fn forward_with<B: FfnBackend + RopeBackend + Bf16Backend + ProjectBackend, S>(
    w: &Weights<B>,
    x: Tensor<B, 3>,
    rope: &Rope<B>,
    trunk: Trunk,
    attention: impl FnOnce(
        Tensor<B, 4>,
        Tensor<B, 4>,
        Tensor<B, 4>,
    ) -> Result<(Tensor<B, 4>, S), RingError>,
) -> Result<Forward<B, S>, RingError> {
    let [b, t, d] = x.dims();
    let packed = w.bf16.as_deref();
    // The feed-forward's hand-written backward (under `ffn` or `block`) takes its weights alone:
    // its adapters are folded into them (`model::lora`).
    let merged;
    let w = match (&w.lora, packed, trunk.checkpoint) {
        (Some(_), None, Checkpoint::Ffn | Checkpoint::Block) => {
            merged = w.clone().with_merged(&FFN_TARGETS);
            &merged
        }
        _ => w,
    };
    let norm = trace::span(|| "norm".into());
    let (h1, r1) = rms_norm(x.clone(), &w.attn_norm, w.epsilons[0]);
    drop(norm);
    let attending = trace::span(|| "attention".into());
    let [bq, bk, bv] = w
        .qkv_bias
        .clone()
        .map_or([None, None, None], |b| b.map(Some));
    let map = |target| Linear::of(w, target, packed);
    let q = biased(&h1, map(LoraTarget::Q), bq);
    let k = biased(&h1, map(LoraTarget::K), bk);
    let v = biased(&h1, map(LoraTarget::V), bv);
    let q = rope.rotate(heads_first(q, trunk.heads), false);
    let k = rope.rotate(heads_first(k, trunk.kv_heads), false);
    let v = heads_first(v, trunk.kv_heads);
    let (out, saved) = attention(q, k, v)?;
    let a = heads_last(out.clone());
    let x2 = x + biased(&a, map(LoraTarget::O), None);
    drop(attending);
    let norm = trace::span(|| "norm".into());
    let (h2, r2) = rms_norm(x2.clone(), &w.ffn_norm, w.epsilons[1]);
    drop(norm);
    let _ffn = trace::span(|| "ffn".into());
    let chunk = trunk.ffn_chunk.max(1);
    let ffn = match (packed, trunk.checkpoint) {
        (None, Checkpoint::Ffn | Checkpoint::Block) => {
            blockwise_swiglu(h2.clone(), w.w1.clone(), w.w3.clone(), w.w2.clone(), chunk)
        }
        // Chunk by chunk: without checkpointing autodiff keeps each chunk's hidden activations; with
        // bf16 weights (inference) nothing is kept.
        (_, _) => {
            let chunks = (0..t)
                .step_by(chunk)
                .map(|s| {
                    let e = (s + chunk).min(t);
                    let c = h2.clone().slice([0..b, s..e, 0..d]);
                    let up = |linear| flat(biased(&c, linear, None));
                    let m = swiglu(up(map(LoraTarget::Gate)), up(map(LoraTarget::Up)));
                    let f = m.dims()[1];
                    biased(&m.reshape([b, e - s, f]), map(LoraTarget::Down), None)
                })
                .collect();
            Tensor::cat(chunks, 1)
        }
    };
    Ok(Forward {
        y: x2.clone() + ffn,
        h1,
        r1,
        out,
        saved,
        x2,
        h2,
        r2,
    })
}

/// The feed-forward's linear maps.
const FFN_TARGETS: [LoraTarget; 3] = [LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down];

/// One linear map of a layer: its weight `[n, m]`, the packed bf16 copy the layer runs instead when
/// it has one, and its LoRA adapter `(A, B, s)` when one runs beside it.
struct Linear<'a, B: Backend> {
    weight: &'a Tensor<B, 2>,
    packed: Option<&'a PackedBf16>,
    lora: Option<(&'a Tensor<B, 2>, &'a Tensor<B, 2>, f64)>,
}

impl<'a, B: Backend> Linear<'a, B> {
    /// The map `target` of the layer `w`, and its packed copy in `packed` when the layer has one.
    fn of(w: &'a Weights<B>, target: LoraTarget, packed: Option<&'a Bf16Layer>) -> Self {
        let (weight, copy) = match target {
            LoraTarget::Q => (&w.wq, packed.map(|p| &p.wq)),
            LoraTarget::K => (&w.wk, packed.map(|p| &p.wk)),
            LoraTarget::V => (&w.wv, packed.map(|p| &p.wv)),
            LoraTarget::O => (&w.wo, packed.map(|p| &p.wo)),
            LoraTarget::Gate => (&w.w1, packed.map(|p| &p.w1)),
            LoraTarget::Up => (&w.w3, packed.map(|p| &p.w3)),
            LoraTarget::Down => (&w.w2, packed.map(|p| &p.w2)),
        };
        Linear {
            weight,
            packed: copy,
            lora: w.lora(target),
        }
    }
}

/// `x · w (+ s·(x·A)·B) (+ bias)` for `x: [b, t, n]`, `w: [n, m]`, `bias: [m]`: by the packed bf16
/// copy of `w` when the layer has one.
fn biased<B: Bf16Backend + ProjectBackend>(
    x: &Tensor<B, 3>,
    linear: Linear<'_, B>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 3> {
    let mut y = match linear.packed {
        Some(packed) => project_bf16(x.clone(), packed),
        None => project(x.clone(), linear.weight),
    };
    if let Some((a, b, scale)) = linear.lora {
        y = y + project(project(x.clone(), a), b) * scale;
    }
    match bias {
        Some(bias) => y + bias.unsqueeze::<3>(),
        None => y,
    }
}

/// The gradients of a layer's input and parameters for `dy`, recomputing its forward.
fn backward<B: RingBackend + FfnBackend + RopeBackend + Bf16Backend + ProjectBackend>(
    w: &Weights<B>,
    x: Tensor<B, 3>,
    rope: &Rope<B>,
    (trunk, attend): (Trunk, Attend),
    ctx: &Arc<RingContext>,
    dy: Tensor<B, 3>,
) -> Result<(Tensor<B, 3>, Weights<B>), RingError> {
    let f = forward(w, x.clone(), rope, (trunk, attend), ctx)?;
    // y = x2 + ffn(norm₂(x2))
    let (dh2, dw1, dw3, dw2) = swiglu_backward(
        f.h2,
        w.w1.clone(),
        w.w3.clone(),
        w.w2.clone(),
        dy.clone(),
        trunk.ffn_chunk.max(1),
    );
    let (dx2_norm, d_ffn_norm) = rms_norm_backward(f.x2, f.r2, &w.ffn_norm, dh2);
    let dx2 = dy + dx2_norm;
    // x2 = x + a·Wo with a the attention output as [b, t, heads · hd]
    let a = heads_last(f.out.clone());
    let dwo = flat(a).transpose().matmul(flat(dx2.clone()));
    let da = project(dx2.clone(), &w.wo.clone().transpose());
    let d_out = heads_first(da, trunk.heads);
    let engine::RingGrads { dq, dk, dv, dsinks } = engine::backward(ctx, &f.saved, f.out, d_out)?;
    // [b, heads, t, hd] → [b, t, heads · hd], RoPE undone on q and k
    let (dq, dk, dv) = (
        heads_last(rope.rotate(dq, true)),
        heads_last(rope.rotate(dk, true)),
        heads_last(dv),
    );
    // A bias's gradient is its projection's output gradient summed over the tokens.
    let bias_grad = |g: &Tensor<B, 3>| {
        let m = g.dims()[2];
        flat(g.clone()).sum_dim(0).reshape([m])
    };
    let qkv_bias = w
        .qkv_bias
        .as_ref()
        .map(|_| [bias_grad(&dq), bias_grad(&dk), bias_grad(&dv)]);
    let h1 = flat(f.h1.clone());
    let dwq = h1.clone().transpose().matmul(flat(dq.clone()));
    let dwk = h1.clone().transpose().matmul(flat(dk.clone()));
    let dwv = h1.transpose().matmul(flat(dv.clone()));
    let dh1 = project(dq, &w.wq.clone().transpose())
        + project(dk, &w.wk.clone().transpose())
        + project(dv, &w.wv.clone().transpose());
    let (dx_norm, d_attn_norm) = rms_norm_backward(x, f.r1, &w.attn_norm, dh1);
    Ok((
        dx2 + dx_norm,
        Weights {
            attn_norm: d_attn_norm,
            wq: dwq,
            wk: dwk,
            wv: dwv,
            wo: dwo,
            ffn_norm: d_ffn_norm,
            w1: dw1,
            w3: dw3,
            w2: dw2,
            qkv_bias,
            sinks: dsinks,
            epsilons: w.epsilons,
            bf16: None,
            lora: None,
        },
    ))
}

/// Backends that run a decoder layer: ring attention and the rematerializing feed-forward, and the
/// layer as one op. The default method runs its forward; the autodiff backend overrides it to
/// register the checkpointed backward, whose state is the layer's input.
pub trait LayerBackend:
    RingBackend + FfnBackend + RopeBackend + Bf16Backend + ProjectBackend + LossBackend
{
    /// The layer's output for `x: [b, t, d]`; `cos`, `sin` are the RoPE tables `[1, 1, t, hd / 2]`;
    /// `attend` is how its attention masks and scores.
    #[allow(clippy::too_many_arguments)]
    fn checkpointed_layer(
        x: FloatTensor<Self>,
        weights: WeightPrimitives<Self>,
        epsilons: [f64; 2],
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        trunk: Trunk,
        attend: Attend,
        ctx: &Arc<RingContext>,
    ) -> Result<FloatTensor<Self>, RingError> {
        let rope = Rope::<Self> {
            cos: wrap(cos),
            sin: wrap(sin),
        };
        let w = Weights::from_primitives(weights, epsilons);
        Ok(unwrap(forward(&w, wrap(x), &rope, (trunk, attend), ctx)?.y))
    }
}

impl LayerBackend for burn::backend::Flex {}

#[cfg(feature = "cuda")]
impl LayerBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl LayerBackend for crate::backends::Wgpu {}

/// The checkpointed layer's backward, an autodiff step of `N` parents: the input and the nine
/// weights, and the sinks when the layer has them.
#[derive(Debug)]
struct LayerBackward<const N: usize>;

#[derive(Debug, Clone)]
struct LayerState<B: Backend> {
    x: FloatTensor<B>,
    weights: WeightPrimitives<B>,
    epsilons: [f64; 2],
    rope: Rope<B>,
    trunk: Trunk,
    attend: Attend,
    ctx: Arc<RingContext>,
}

impl<B: LayerBackend, const N: usize> Backward<B, N> for LayerBackward<N> {
    type State = LayerState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = wrap::<B, 3>(grads.consume::<B>(&ops.node));
        let LayerState {
            x,
            weights,
            epsilons,
            rope,
            trunk,
            attend,
            ctx,
        } = ops.state;
        let w = Weights::from_primitives(weights, epsilons);
        let x = wrap::<B, 3>(x);
        let layer = (trunk, attend);
        let _span = trace::span(|| "layer backward (recomputed)".into());
        let (dx, dw) = backward(&w, x.clone(), &rope, layer, &ctx, dy).unwrap_or_else(|error| {
            ctx.set_backward_error(error);
            (x.zeros_like(), w.zeros_like())
        });
        let mut grads_in = vec![unwrap(dx)];
        grads_in.extend(dw.into_primitives());
        for (parent, grad) in ops.parents.into_iter().zip(grads_in) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: LayerBackend, C: CheckpointStrategy> LayerBackend for Autodiff<B, C> {
    fn checkpointed_layer(
        x: FloatTensor<Self>,
        weights: WeightPrimitives<Self>,
        epsilons: [f64; 2],
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        trunk: Trunk,
        attend: Attend,
        ctx: &Arc<RingContext>,
    ) -> Result<FloatTensor<Self>, RingError> {
        let mut nodes = vec![x.node];
        let mut inner: WeightPrimitives<B> = Vec::with_capacity(weights.len());
        for w in weights {
            nodes.push(w.node);
            inner.push(w.primitive);
        }
        let rope = Rope::<B> {
            cos: wrap(cos.primitive),
            sin: wrap(sin.primitive),
        };
        let w = Weights::from_primitives(inner.clone(), epsilons);
        // The forward's intermediates (the ring's saved blocks among them) are dropped here.
        let y = unwrap(forward(&w, wrap(x.primitive.clone()), &rope, (trunk, attend), ctx)?.y);
        let state = LayerState {
            x: x.primitive,
            weights: inner,
            epsilons,
            rope,
            trunk,
            attend,
            ctx: ctx.clone(),
        };
        // The input and nine weights, three biases when the layer has them, the sinks when it has
        // them: 10, 11, 13 or 14 parents (the node type is private to Burn, so a macro, not a
        // function, picks the op's arity).
        macro_rules! tracked {
            ($n:literal) => {{
                let nodes: [_; $n] = nodes.try_into().expect("the parents counted");
                match LayerBackward::<$n>
                    .prepare::<C>(nodes)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, y),
                    OpsKind::UnTracked(prep) => prep.finish(y),
                }
            }};
        }
        Ok(match nodes.len() {
            10 => tracked!(10),
            11 => tracked!(11),
            13 => tracked!(13),
            14 => tracked!(14),
            n => unreachable!("a layer has 10, 11, 13 or 14 parents, not {n}"),
        })
    }
}

impl<B: LayerBackend> DecoderLayer<B> {
    /// This layer's output for this rank's hidden states `x: [b, t, d]` at global `positions`, as
    /// the model runs it (alone, so that one layer can be measured).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        positions: &[usize],
        trunk: Trunk,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 3>, RingError> {
        let rope_len = ctx.sequence().len;
        run_layers(
            std::slice::from_ref(self),
            x,
            positions,
            trunk,
            ctx,
            rope_len,
        )
    }
}

/// Runs the decoder layers over this rank's hidden states `x: [b, t, d]` at global `positions`, in
/// a batch whose longest sequence is `rope_len` (what dynamic NTK scaling reads).
pub(crate) fn run_layers<B: LayerBackend>(
    layers: &[DecoderLayer<B>],
    mut x: Tensor<B, 3>,
    positions: &[usize],
    trunk: Trunk,
    ctx: &Arc<RingContext>,
    rope_len: usize,
) -> Result<Tensor<B, 3>, RingError> {
    let rope = rope_of(positions, trunk, rope_len, &x.device());
    for (i, layer) in layers.iter().enumerate() {
        let _layer = trace::span(|| format!("layer {i}"));
        let w = Weights::of(layer);
        let attend = trunk.attend(i, &ctx.config);
        x = match trunk.checkpoint {
            // The checkpointed layer's backward takes its weights alone: its adapters are folded in.
            Checkpoint::Block => wrap(B::checkpointed_layer(
                unwrap(x),
                w.clone().with_merged(&LoraTarget::ALL).into_primitives(),
                w.epsilons,
                unwrap(rope.cos.clone()),
                unwrap(rope.sin.clone()),
                trunk,
                attend,
                ctx,
            )?),
            Checkpoint::None | Checkpoint::Ffn => forward(&w, x, &rope, (trunk, attend), ctx)?.y,
        };
    }
    Ok(x)
}

/// The RoPE tables of this rank's `positions` in a batch whose longest sequence is `rope_len`: the
/// length dynamic NTK scaling reads, as transformers does (the largest position of the forward's
/// whole batch, plus one; a shorter row of a padded batch is rotated as the longest one is).
fn rope_of<B: Backend>(
    positions: &[usize],
    trunk: Trunk,
    rope_len: usize,
    device: &B::Device,
) -> Rope<B> {
    Rope::new(positions, trunk.head_dim, (trunk.rope, rope_len), device)
}

/// Each layer's keys (after RoPE) and values `[b, hk, t, hd]` of a prefill, for a KV cache.
pub type LayerKv<B> = Vec<[Tensor<B, 4>; 2]>;

/// Runs the layers over this rank's prompt `x: [b, t, d]` at global `positions` in a batch whose
/// longest prompt is `rope_len` (the forward of [`run_layers`], whatever the checkpointing: nothing
/// is kept for a backward), keeping each layer's keys (after RoPE) and values `[b, hk, t, hd]`: a
/// prefill.
pub(crate) fn prefill_layers<B: LayerBackend>(
    layers: &[DecoderLayer<B>],
    mut x: Tensor<B, 3>,
    positions: &[usize],
    trunk: Trunk,
    ctx: &Arc<RingContext>,
    rope_len: usize,
) -> Result<(Tensor<B, 3>, LayerKv<B>), RingError> {
    let rope = rope_of(positions, trunk, rope_len, &x.device());
    let mut kept = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let w = Weights::of(layer);
        let attend = trunk.attend(i, &ctx.config);
        x = forward_with(&w, x, &rope, trunk, |q, k, v| {
            kept.push([k.clone(), v.clone()]);
            ring(&w, [q, k, v], attend, ctx)
        })?
        .y;
    }
    Ok((x, kept))
}

/// The tokens of one decoding step: the cache rows they extend, the rank each is placed on and
/// its position (all from [`KvCache::start_token`]).
pub(crate) struct NewTokens<'a> {
    pub(crate) rows: &'a [usize],
    pub(crate) places: &'a [usize],
    pub(crate) positions: &'a [usize],
    /// The step's batch length: its longest sequence with the token (what dynamic NTK scaling
    /// reads; rows that have stopped still count, as their padding does in transformers).
    pub(crate) rope_len: usize,
}

/// One decoding step of the layers over `x: [1, R, d]`, the new tokens of `tokens.rows`: each
/// layer's key and value of a token are kept by the rank it is placed on, and its query attends
/// to every rank's cached keys of its sequence, merged by `merge` (`ring::decode`). Every rank
/// computes the same.
pub(crate) fn decode_layers<B: LayerBackend>(
    layers: &[DecoderLayer<B>],
    mut x: Tensor<B, 3>,
    tokens: &NewTokens<'_>,
    trunk: Trunk,
    (ctx, merge): (&Arc<RingContext>, DecodeMerge),
    cache: &mut KvCache<B>,
) -> Result<Tensor<B, 3>, RingError> {
    let hd = trunk.head_dim;
    // The tokens lie on the time axis: one position each, rotated for the step's batch length.
    let rope = rope_of::<B>(tokens.positions, trunk, tokens.rope_len, &x.device());
    for (i, layer) in layers.iter().enumerate() {
        let w = Weights::of(layer);
        let attend = trunk.attend(i, &ctx.config);
        x = forward_with(&w, x, &rope, trunk, |q, k, v| {
            let kv_heads = k.dims()[1];
            for (j, (&row, &place)) in tokens.rows.iter().zip(tokens.places).enumerate() {
                let one = |t: &Tensor<B, 4>| t.clone().slice([0..1, 0..kv_heads, j..j + 1, 0..hd]);
                cache.append(row, i, place, one(&k), one(&v));
            }
            let sinks = w.sinks.clone();
            let out = attend_cached(ctx, cache, i, tokens.rows, q, sinks, (attend, merge))?;
            Ok((out, ()))
        })?
        .y;
    }
    Ok(x)
}
