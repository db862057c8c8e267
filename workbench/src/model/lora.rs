//! LoRA adapters on a decoder layer's linear maps, as PEFT's `LoraLayer` computes them:
//! `y = x·W + s·(x·A)·B` with `A: [in, r]`, `B: [r, out]` (Burn's `[in, out]` orientation; PEFT
//! stores their transposes) and `s = alpha / r` (`alpha / √r` with rsLoRA). A new adapter draws A
//! as PEFT does (Kaiming-uniform with a = √5: uniform in ±1/√in) and starts B at zero, so that it
//! starts as the base model. The base weights are frozen (no gradient, no optimizer state);
//! embeddings and norms may train beside the adapters (LongLoRA's "+").
//!
//! How a layer applies them depends on what it keeps for its backward: without checkpointing the
//! adapters run as a branch beside the frozen product (autodiff differentiates A and B and never
//! forms the frozen weight's gradient); where a hand-written backward takes the layer's weights
//! (the feed-forward's under `ffn`, every one under `block`), the layer is given `W + s·A·B`,
//! whose gradient autodiff carries on to A and B. Both are exact: `x·(W + sAB) = xW + s(xA)B`.

use crate::error::RingError;
use crate::model::lazy::seeded;
use burn::backend::Flex;
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// A linear map of a decoder layer that an adapter can sit on, named as PEFT's `target_modules`
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LoraTarget {
    /// The query projection, `q_proj`.
    #[serde(rename = "q_proj")]
    Q,
    /// The key projection, `k_proj`.
    #[serde(rename = "k_proj")]
    K,
    /// The value projection, `v_proj`.
    #[serde(rename = "v_proj")]
    V,
    /// The output projection, `o_proj`.
    #[serde(rename = "o_proj")]
    O,
    /// SwiGLU's gate, `gate_proj`.
    #[serde(rename = "gate_proj")]
    Gate,
    /// SwiGLU's up projection, `up_proj`.
    #[serde(rename = "up_proj")]
    Up,
    /// SwiGLU's down projection, `down_proj`.
    #[serde(rename = "down_proj")]
    Down,
}

impl LoraTarget {
    /// Every target, in a layer's order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// Its module name (PEFT's `target_modules`, transformers' attribute).
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// The target a name gives: PEFT's (`q_proj`) or the short one (`q`, `gate`).
    pub fn from_name(name: &str) -> Result<LoraTarget, RingError> {
        LoraTarget::ALL
            .into_iter()
            .find(|t| t.name() == name || t.name().strip_suffix("_proj") == Some(name))
            .ok_or_else(|| {
                let known: Vec<&str> = LoraTarget::ALL.iter().map(|t| t.name()).collect();
                RingError::ModelConfig(format!(
                    "LoRA target {name:?} is not a linear map of the layer; known: {}",
                    known.join(", ")
                ))
            })
    }

    /// Its index in [`LoraTarget::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How new adapters start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoraInit {
    /// PEFT's default: A Kaiming-uniform (±1/√in), B zero, so the adapted model starts as the base.
    #[default]
    Peft,
    /// B drawn too, as `torch.nn.Linear` draws it (±1/√r): what PEFT's `init_lora_weights=False`
    /// leaves; a model that starts away from its base (for tests of the gradient through B).
    Random,
}

/// How a model is adapted: the adapters' rank, scale and targets, and what trains beside them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank r.
    pub rank: usize,
    /// The scale's numerator: `s = alpha / r` (`alpha / √r` with `rslora`).
    pub alpha: f64,
    /// Dropout on an adapter's input, as PEFT's `lora_dropout`.
    #[serde(default)]
    pub dropout: f64,
    /// The linear maps adapted.
    pub targets: Vec<LoraTarget>,
    /// Rank-stabilized scaling (PEFT's `use_rslora`): `s = alpha / √r`.
    #[serde(default)]
    pub rslora: bool,
    /// The token embedding trains too (LongLoRA's "+"; an untied model's, so that PEFT's
    /// `modules_to_save` copy means the same).
    #[serde(default)]
    pub train_embeddings: bool,
    /// Every RMSNorm's weight trains too (LongLoRA's "+").
    #[serde(default)]
    pub train_norms: bool,
    /// How new adapters start.
    #[serde(default)]
    pub init: LoraInit,
}

impl LoraConfig {
    /// The scale `s` an adapter's product is multiplied by.
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Checks the values, naming the first that cannot adapt a model.
    pub fn validate(&self) -> Result<(), RingError> {
        let bad = |what: String| Err(RingError::ModelConfig(format!("LoRA: {what}")));
        if self.rank == 0 {
            return bad("rank = 0: an adapter needs a rank of at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad(format!("alpha = {} must be a number above 0", self.alpha));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout = {} must be in [0, 1)", self.dropout));
        }
        if self.dropout != 0.0 {
            return bad(format!(
                "dropout = {}: the adapters run without dropout here (0, PEFT's default)",
                self.dropout
            ));
        }
        if self.targets.is_empty() && !self.train_embeddings && !self.train_norms {
            return bad("no targets and nothing else trains: nothing would train".into());
        }
        let mut seen = self.targets.clone();
        seen.sort();
        if let Some(twice) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("target {} is given twice", twice[0].name()));
        }
        Ok(())
    }
}

/// One adapter: `A: [in, r]` and `B: [r, out]`.
#[derive(Module, Debug)]
pub struct LoraPair<B: Backend> {
    /// `[in, r]`.
    pub(crate) a: Param<Tensor<B, 2>>,
    /// `[r, out]`.
    pub(crate) b: Param<Tensor<B, 2>>,
}

impl<B: Backend> LoraPair<B> {
    /// A pair from its values: `a` `[in, r]` and `b` `[r, out]`, row-major.
    pub fn from_values(
        a: Vec<f32>,
        b: Vec<f32>,
        [inputs, rank, outputs]: [usize; 3],
        device: &B::Device,
    ) -> Self {
        let tensor = |v: Vec<f32>, shape: [usize; 2]| {
            Param::from_tensor(Tensor::from_data(TensorData::new(v, shape), device))
        };
        LoraPair {
            a: tensor(a, [inputs, rank]),
            b: tensor(b, [rank, outputs]),
        }
    }

    /// A new adapter as `init` says: A uniform in ±1/√in, B zero (PEFT's) or uniform in ±1/√r;
    /// drawn on the host from `seed`, so that every backend draws the same.
    fn drawn(
        [inputs, rank, outputs]: [usize; 3],
        init: LoraInit,
        seed: u64,
        device: &B::Device,
    ) -> Self {
        let host = Default::default();
        let uniform = |shape: [usize; 2], fan_in: usize| {
            let bound = 1.0 / (fan_in as f64).sqrt();
            Tensor::<Flex, 2>::random(shape, Distribution::Uniform(-bound, bound), &host)
        };
        let (a, b) = seeded::<Flex, _>(seed, &host, || {
            let a = uniform([inputs, rank], inputs);
            let b = match init {
                LoraInit::Peft => Tensor::zeros([rank, outputs], &host),
                LoraInit::Random => uniform([rank, outputs], rank),
            };
            (a, b)
        });
        let (a, b) = (crate::host::read(a), crate::host::read(b));
        LoraPair::from_values(a, b, [inputs, rank, outputs], device)
    }

    /// `s·A·B`, `[in, out]`.
    pub(crate) fn delta(&self, scale: f64) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val()) * scale
    }

    /// `A` `[in, r]` and `B` `[r, out]`, as values.
    pub fn values(&self) -> [Tensor<B, 2>; 2] {
        [self.a.val(), self.b.val()]
    }
}

/// A layer's adapters, one slot per [`LoraTarget`], and their scale.
#[derive(Module, Debug)]
pub struct LayerLora<B: Backend> {
    /// Indexed by [`LoraTarget::index`].
    pub(crate) pairs: Vec<Option<LoraPair<B>>>,
    /// `s`.
    #[module(skip)]
    pub(crate) scale: f64,
}

impl<B: Backend> LayerLora<B> {
    /// Adapters on `targets` of a layer whose maps have the `(in, out)` sizes `dims` gives, drawn
    /// from `seed` (each target its own stream).
    pub(crate) fn drawn(
        config: &LoraConfig,
        dims: impl Fn(LoraTarget) -> (usize, usize),
        seed: u64,
        device: &B::Device,
    ) -> Self {
        let mut pairs: Vec<Option<LoraPair<B>>> =
            (0..LoraTarget::ALL.len()).map(|_| None).collect();
        for &target in &config.targets {
            let (inputs, outputs) = dims(target);
            let stream = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (target.index() as u64 + 1);
            let dims = [inputs, config.rank, outputs];
            pairs[target.index()] = Some(LoraPair::drawn(dims, config.init, stream, device));
        }
        LayerLora {
            pairs,
            scale: config.scale(),
        }
    }

    /// Adapters from their pairs (one slot per target, in the order of [`LoraTarget::ALL`]) and scale.
    pub fn from_pairs(pairs: Vec<Option<LoraPair<B>>>, scale: f64) -> Self {
        assert_eq!(pairs.len(), LoraTarget::ALL.len(), "one slot per target");
        LayerLora { pairs, scale }
    }

    /// The adapter on `target`, if any.
    pub fn pair(&self, target: LoraTarget) -> Option<&LoraPair<B>> {
        self.pairs[target.index()].as_ref()
    }

    /// The scale `s`.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// A layer's adapters as tensors: `(A, B)` per target, and the scale.
#[derive(Debug, Clone)]
pub(crate) struct LoraWeights<B: Backend> {
    pub(crate) pairs: [Option<[Tensor<B, 2>; 2]>; 7],
    pub(crate) scale: f64,
}

impl<B: Backend> LoraWeights<B> {
    pub(crate) fn of(lora: &LayerLora<B>) -> Self {
        LoraWeights {
            pairs: std::array::from_fn(|i| lora.pairs[i].as_ref().map(LoraPair::values)),
            scale: lora.scale,
        }
    }

    /// `(A, B, s)` of `target`, if adapted.
    pub(crate) fn get(&self, target: LoraTarget) -> Option<(&Tensor<B, 2>, &Tensor<B, 2>, f64)> {
        self.pairs[target.index()]
            .as_ref()
            .map(|[a, b]| (a, b, self.scale))
    }

    /// `W + s·A·B` for `target` (`w` itself when not adapted), and the adapter taken out.
    pub(crate) fn merge(&mut self, target: LoraTarget, w: Tensor<B, 2>) -> Tensor<B, 2> {
        match self.pairs[target.index()].take() {
            Some([a, b]) => w + a.matmul(b) * self.scale,
            None => w,
        }
    }

    /// Whether no adapter is left.
    pub(crate) fn is_empty(&self) -> bool {
        self.pairs.iter().all(Option::is_none)
    }
}
