//! A decoder layer's parameters: the Burn module ([`DecoderLayer`]), the same as plain tensors
//! (`Weights`), and as the primitives a custom autodiff op takes ([`WeightPrimitives`]).

use crate::model::bf16::{Bf16Layer, pack};
use crate::model::lora::{LayerLora, LoraTarget, LoraWeights};
use crate::primitive::{unwrap, wrap};
use burn::module::{Module, Param};
use burn::nn::{Linear, RmsNorm};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use std::sync::Arc;

#[derive(Module, Debug)]
/// One decoder layer: RMSNorm, grouped-query ring attention (with learned sinks, when the model has
/// them), RMSNorm, SwiGLU feed-forward.
pub struct DecoderLayer<B: Backend> {
    pub(crate) attn_norm: RmsNorm<B>,
    pub(crate) wq: Linear<B>,
    pub(crate) wk: Linear<B>,
    pub(crate) wv: Linear<B>,
    pub(crate) wo: Linear<B>,
    pub(crate) ffn_norm: RmsNorm<B>,
    pub(crate) w1: Linear<B>,
    pub(crate) w3: Linear<B>,
    pub(crate) w2: Linear<B>,
    /// Attention sink logits `[heads]`.
    pub(crate) sinks: Option<Param<Tensor<B, 1>>>,
    /// LoRA adapters on the linear maps (`model::lora`), when the model is being adapted.
    pub(crate) lora: Option<LayerLora<B>>,
    /// The projections packed as bf16, when the model runs them so (`model::bf16`).
    #[module(skip)]
    pub(crate) bf16: Option<Arc<Bf16Layer>>,
}

impl<B: Backend> DecoderLayer<B> {
    /// The linear map `target`.
    pub(crate) fn linear(&self, target: LoraTarget) -> &Linear<B> {
        match target {
            LoraTarget::Q => &self.wq,
            LoraTarget::K => &self.wk,
            LoraTarget::V => &self.wv,
            LoraTarget::O => &self.wo,
            LoraTarget::Gate => &self.w1,
            LoraTarget::Up => &self.w3,
            LoraTarget::Down => &self.w2,
        }
    }

    /// The linear map `target`, to change.
    pub(crate) fn linear_mut(&mut self, target: LoraTarget) -> &mut Linear<B> {
        match target {
            LoraTarget::Q => &mut self.wq,
            LoraTarget::K => &mut self.wk,
            LoraTarget::V => &mut self.wv,
            LoraTarget::O => &mut self.wo,
            LoraTarget::Gate => &mut self.w1,
            LoraTarget::Up => &mut self.w3,
            LoraTarget::Down => &mut self.w2,
        }
    }

    /// The layer's projections packed as bf16.
    pub(crate) fn packed(&self) -> Bf16Layer {
        Bf16Layer {
            wq: pack(self.wq.weight.val()),
            wk: pack(self.wk.weight.val()),
            wv: pack(self.wv.weight.val()),
            wo: pack(self.wo.weight.val()),
            w1: pack(self.w1.weight.val()),
            w3: pack(self.w3.weight.val()),
            w2: pack(self.w2.weight.val()),
        }
    }
}

/// A layer's parameters as tensors, in the order of [`DecoderLayer`]'s fields; linear weights are
/// `[in, out]` as Burn's `Linear` holds them.
#[derive(Debug, Clone)]
pub(crate) struct Weights<B: Backend> {
    pub(crate) attn_norm: Tensor<B, 1>,
    pub(crate) wq: Tensor<B, 2>,
    pub(crate) wk: Tensor<B, 2>,
    pub(crate) wv: Tensor<B, 2>,
    pub(crate) wo: Tensor<B, 2>,
    pub(crate) ffn_norm: Tensor<B, 1>,
    pub(crate) w1: Tensor<B, 2>,
    pub(crate) w3: Tensor<B, 2>,
    pub(crate) w2: Tensor<B, 2>,
    /// The query, key and value projections' biases, when the layer has them (Qwen2).
    pub(crate) qkv_bias: Option<[Tensor<B, 1>; 3]>,
    pub(crate) sinks: Option<Tensor<B, 1>>,
    /// The two norms' ε.
    pub(crate) epsilons: [f64; 2],
    /// The projections packed as bf16, when the model runs them so.
    pub(crate) bf16: Option<Arc<Bf16Layer>>,
    /// LoRA adapters applied beside the linear maps (a branch: [`Weights::with_merged`] folds
    /// some or all of them into the weights instead).
    pub(crate) lora: Option<LoraWeights<B>>,
}

/// The primitives of a layer's parameters, in [`DecoderLayer`]'s field order: nine, then the three
/// query, key and value biases when the layer has them, then the sinks when it has them (so 9, 10,
/// 12 or 13 of them, and the count says which).
pub type WeightPrimitives<B> = Vec<FloatTensor<B>>;

impl<B: Backend> Weights<B> {
    pub(crate) fn of(layer: &DecoderLayer<B>) -> Self {
        Weights {
            attn_norm: layer.attn_norm.gamma.val(),
            wq: layer.wq.weight.val(),
            wk: layer.wk.weight.val(),
            wv: layer.wv.weight.val(),
            wo: layer.wo.weight.val(),
            ffn_norm: layer.ffn_norm.gamma.val(),
            w1: layer.w1.weight.val(),
            w3: layer.w3.weight.val(),
            w2: layer.w2.weight.val(),
            qkv_bias: match (&layer.wq.bias, &layer.wk.bias, &layer.wv.bias) {
                (Some(q), Some(k), Some(v)) => Some([q.val(), k.val(), v.val()]),
                _ => None,
            },
            sinks: layer.sinks.as_ref().map(Param::val),
            epsilons: [layer.attn_norm.epsilon, layer.ffn_norm.epsilon],
            bf16: layer.bf16.clone(),
            lora: layer.lora.as_ref().map(LoraWeights::of),
        }
    }

    /// These weights with the adapters on `targets` folded in (`W + s·A·B`) and taken off the
    /// branch: what a hand-written backward, which takes the weights alone, is given.
    pub(crate) fn with_merged(mut self, targets: &[LoraTarget]) -> Self {
        let Some(mut lora) = self.lora.take() else {
            return self;
        };
        for &target in targets {
            let slot = match target {
                LoraTarget::Q => &mut self.wq,
                LoraTarget::K => &mut self.wk,
                LoraTarget::V => &mut self.wv,
                LoraTarget::O => &mut self.wo,
                LoraTarget::Gate => &mut self.w1,
                LoraTarget::Up => &mut self.w3,
                LoraTarget::Down => &mut self.w2,
            };
            *slot = lora.merge(target, slot.clone());
        }
        self.lora = (!lora.is_empty()).then_some(lora);
        self
    }

    /// The adapter on `target` as `(A, B, s)`, when it runs as a branch.
    pub(crate) fn lora(&self, target: LoraTarget) -> Option<(&Tensor<B, 2>, &Tensor<B, 2>, f64)> {
        self.lora.as_ref().and_then(|l| l.get(target))
    }

    pub(crate) fn zeros_like(&self) -> Self {
        Weights {
            attn_norm: self.attn_norm.zeros_like(),
            wq: self.wq.zeros_like(),
            wk: self.wk.zeros_like(),
            wv: self.wv.zeros_like(),
            wo: self.wo.zeros_like(),
            ffn_norm: self.ffn_norm.zeros_like(),
            w1: self.w1.zeros_like(),
            w3: self.w3.zeros_like(),
            w2: self.w2.zeros_like(),
            qkv_bias: self
                .qkv_bias
                .as_ref()
                .map(|b| b.clone().map(|t| t.zeros_like())),
            sinks: self.sinks.as_ref().map(Tensor::zeros_like),
            epsilons: self.epsilons,
            bf16: None,
            lora: None,
        }
    }

    pub(crate) fn into_primitives(self) -> WeightPrimitives<B> {
        let mut all = vec![
            unwrap(self.attn_norm),
            unwrap(self.wq),
            unwrap(self.wk),
            unwrap(self.wv),
            unwrap(self.wo),
            unwrap(self.ffn_norm),
            unwrap(self.w1),
            unwrap(self.w3),
            unwrap(self.w2),
        ];
        all.extend(self.qkv_bias.into_iter().flatten().map(unwrap));
        all.extend(self.sinks.map(unwrap));
        all
    }

    pub(crate) fn from_primitives(p: WeightPrimitives<B>, epsilons: [f64; 2]) -> Self {
        // Nine weights, then 3 biases when 12 or 13 are given, then the sinks when 10 or 13 are.
        let count = p.len();
        let mut p = p.into_iter();
        let mut next = || p.next().expect("nine weights of a layer");
        let (attn_norm, wq, wk, wv, wo) = (next(), next(), next(), next(), next());
        let (ffn_norm, w1, w3, w2) = (next(), next(), next(), next());
        let qkv_bias = (count >= 12).then(|| [wrap(next()), wrap(next()), wrap(next())]);
        Weights {
            attn_norm: wrap(attn_norm),
            wq: wrap(wq),
            wk: wrap(wk),
            wv: wrap(wv),
            wo: wrap(wo),
            ffn_norm: wrap(ffn_norm),
            w1: wrap(w1),
            w3: wrap(w3),
            w2: wrap(w2),
            qkv_bias,
            sinks: p.next().map(wrap),
            epsilons,
            bf16: None,
            lora: None,
        }
    }
}
