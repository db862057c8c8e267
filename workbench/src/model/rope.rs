//! Rotary position embedding (RoPE) on each token's *global* position, so that a rank's shard,
//! whatever positions its strategy gave it, rotates as the whole sequence would.

use burn::tensor::{Tensor, TensorData, backend::Backend};

/// cos and sin of RoPE angles for each token's global position: `[1, 1, t, head_dim / 2]` each.
#[derive(Debug, Clone)]
pub(crate) struct Rope<B: Backend> {
    pub(crate) cos: Tensor<B, 4>,
    pub(crate) sin: Tensor<B, 4>,
}

impl<B: Backend> Rope<B> {
    pub(crate) fn new(
        positions: &[usize],
        head_dim: usize,
        theta: f64,
        device: &B::Device,
    ) -> Self {
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
