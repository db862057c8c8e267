//! What a decoder layer keeps for its backward: everything, all but the feed-forward's hidden
//! activations (recomputed), or only its input (the layer recomputed).

use serde::{Deserialize, Serialize};

/// What a decoder layer keeps for its backward (`checkpoint` in the model config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpoint {
    /// Every activation autodiff needs, the feed-forward's `[t, ffn]` hidden activations included.
    #[default]
    None,
    /// The feed-forward's backward recomputes each chunk's hidden activations
    /// ([`crate::model::ffn`]): the Blockwise Parallel Transformer's saving.
    Ffn,
    /// The layer keeps only its input; its backward recomputes the whole layer, ring attention
    /// included (per-layer activation checkpointing).
    Block,
}

impl Checkpoint {
    /// Every choice, least recomputation first.
    pub const ALL: [Checkpoint; 3] = [Checkpoint::None, Checkpoint::Ffn, Checkpoint::Block];

    /// Its name in configs and tables.
    pub fn name(self) -> &'static str {
        match self {
            Checkpoint::None => "none",
            Checkpoint::Ffn => "ffn",
            Checkpoint::Block => "block",
        }
    }
}

impl std::fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Checkpoint {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Checkpoint::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Checkpoint::ALL.iter().map(|c| c.name()).collect();
                format!("unknown checkpoint '{name}'; known: {}", known.join(", "))
            })
    }
}
