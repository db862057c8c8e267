//! Rotary position embedding (RoPE) on each token's *global* position, so that a rank's shard,
//! whatever positions its strategy gave it, rotates as the whole sequence would; its frequencies
//! (and their scaling) are [`crate::model::rope_scaling`]'s.

use crate::model::rope_scaling::RopeFrequencies;
use burn::tensor::{Tensor, TensorData, backend::Backend};

/// cos and sin of RoPE angles for each token's global position, times the scaling's attention
/// factor: `[1, 1, t, head_dim / 2]` each.
#[derive(Debug, Clone)]
pub(crate) struct Rope<B: Backend> {
    pub(crate) cos: Tensor<B, 4>,
    pub(crate) sin: Tensor<B, 4>,
}

impl<B: Backend> Rope<B> {
    /// The tables of `positions` for a forward whose sequence is `seq_len` long (its largest
    /// position + 1: what dynamic NTK scaling reads).
    pub(crate) fn new(
        positions: &[usize],
        head_dim: usize,
        (frequencies, seq_len): (RopeFrequencies, usize),
        device: &B::Device,
    ) -> Self {
        let half = head_dim / 2;
        let (inverse, factor) = frequencies.inverse_frequencies(head_dim, seq_len);
        let angles: Vec<f64> = positions
            .iter()
            .flat_map(|&p| inverse.iter().map(move |w| p as f64 * w))
            .collect();
        let table = |f: fn(f64) -> f64| {
            let data: Vec<f32> = angles.iter().map(|&a| (factor * f(a)) as f32).collect();
            Tensor::from_data(TensorData::new(data, [1, 1, positions.len(), half]), device)
        };
        Rope {
            cos: table(f64::cos),
            sin: table(f64::sin),
        }
    }

    /// Rotates pairs `(x[i], x[i + d/2])` of `[b, h, t, d]` by the angles (`inverse`: by minus them).
    pub(crate) fn rotate(&self, x: Tensor<B, 4>, inverse: bool) -> Tensor<B, 4> {
        let [b, h, t, d] = x.dims();
        let sin = if inverse {
            self.sin.clone().neg()
        } else {
            self.sin.clone()
        };
        let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..d / 2]);
        let x2 = x.slice([0..b, 0..h, 0..t, d / 2..d]);
        Tensor::cat(
            vec![
                x1.clone() * self.cos.clone() - x2.clone() * sin.clone(),
                x1 * sin + x2 * self.cos.clone(),
            ],
            3,
        )
    }
}
