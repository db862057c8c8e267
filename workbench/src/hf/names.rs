//! The one home of the Hugging Face tensor names of a LLaMA-family model (`model.layers.{i}.…`), read
//! by the loader and written by the export.

/// A decoder layer's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// `input_layernorm.weight`.
    AttnNorm,
    /// `self_attn.q_proj.weight`.
    Q,
    /// `self_attn.k_proj.weight`.
    K,
    /// `self_attn.v_proj.weight`.
    V,
    /// `self_attn.o_proj.weight`.
    O,
    /// `self_attn.q_proj.bias` (Qwen2).
    QBias,
    /// `self_attn.k_proj.bias` (Qwen2).
    KBias,
    /// `self_attn.v_proj.bias` (Qwen2).
    VBias,
    /// `post_attention_layernorm.weight`.
    FfnNorm,
    /// `mlp.gate_proj.weight` (SwiGLU's W1).
    Gate,
    /// `mlp.up_proj.weight` (W3).
    Up,
    /// `mlp.down_proj.weight` (W2).
    Down,
}

impl TensorRole {
    /// Every tensor of a layer.
    pub const ALL: [TensorRole; 12] = [
        TensorRole::AttnNorm,
        TensorRole::Q,
        TensorRole::K,
        TensorRole::V,
        TensorRole::O,
        TensorRole::QBias,
        TensorRole::KBias,
        TensorRole::VBias,
        TensorRole::FfnNorm,
        TensorRole::Gate,
        TensorRole::Up,
        TensorRole::Down,
    ];

    /// Its name below `model.layers.{i}.`.
    pub fn suffix(self) -> &'static str {
        match self {
            TensorRole::AttnNorm => "input_layernorm.weight",
            TensorRole::Q => "self_attn.q_proj.weight",
            TensorRole::K => "self_attn.k_proj.weight",
            TensorRole::V => "self_attn.v_proj.weight",
            TensorRole::O => "self_attn.o_proj.weight",
            TensorRole::QBias => "self_attn.q_proj.bias",
            TensorRole::KBias => "self_attn.k_proj.bias",
            TensorRole::VBias => "self_attn.v_proj.bias",
            TensorRole::FfnNorm => "post_attention_layernorm.weight",
            TensorRole::Gate => "mlp.gate_proj.weight",
            TensorRole::Up => "mlp.up_proj.weight",
            TensorRole::Down => "mlp.down_proj.weight",
        }
    }
}

/// The names of layer `.0`'s tensors.
#[derive(Debug, Clone, Copy)]
pub struct LayerNames(pub usize);

impl LayerNames {
    /// The token embedding `[vocab, d]`.
    pub const EMBED: &'static str = "model.embed_tokens.weight";
    /// The final norm `[d]`.
    pub const NORM: &'static str = "model.norm.weight";
    /// The output head `[vocab, d]` (absent when tied to the embedding).
    pub const HEAD: &'static str = "lm_head.weight";

    /// The full name of this layer's `role` tensor.
    pub fn of(self, role: TensorRole) -> String {
        format!("model.layers.{}.{}", self.0, role.suffix())
    }

    /// Whether `name` is a projection stored `[out, in]` (Burn's `Linear` holds `[in, out]`).
    pub fn is_projection(name: &str) -> bool {
        name == Self::HEAD || (name.ends_with("_proj.weight") && name.starts_with("model.layers."))
    }
}
