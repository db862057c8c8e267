//! Kernel dispatch: the same tile operations on the fused CPU kernel or its generic Burn twin.
//!
//! The engine hands host blocks to these functions and never asks which kernel runs.

pub mod flops;
pub mod fused;
pub mod mask;
pub(crate) mod reference;

use crate::host::via_data;
use crate::ring::block::Block;
use crate::ring::context::Kernel;
use burn::tensor::{Tensor, TensorData, backend::Backend};
use fused::{BackwardTile, OnlineSoftmax, TileDims};
use mask::{Visibility, Window};
use reference::{block_attention, block_attention_backward, merge_block};
use std::sync::Arc;

fn tensor<B: Backend, const D: usize>(
    data: &[f32],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

fn bias(visibility: Visibility, win_q: &[Window], pos_k: &[usize]) -> Option<Vec<f32>> {
    matches!(visibility, Visibility::Partial { .. }).then(|| mask::bias(win_q, pos_k))
}

fn kv_shape(d: &TileDims) -> [usize; 4] {
    [d.batch, d.kv_heads, d.tk, d.head_dim]
}

fn q_shape(d: &TileDims) -> [usize; 4] {
    [d.batch, d.heads, d.tq, d.head_dim]
}

/// Bytes of workspace one tile of `dims` needs on `kernel`: the fused kernel's sub-tile scratch, or the
/// generic twin's full score-sized tensors (scores and probabilities forward; probabilities, their
/// gradient and the score gradient backward), which is what makes it the memory-hungry reference.
pub(crate) fn workspace_bytes(kernel: Kernel, dims: &TileDims, backward: bool) -> u64 {
    match kernel {
        Kernel::Fused => dims.scratch_bytes(backward),
        Kernel::Generic => {
            let scores = dims.batch * dims.heads * dims.tq * dims.tk;
            let tensors = if backward { 3 } else { 2 };
            (tensors * scores * std::mem::size_of::<f32>()) as u64
        }
    }
}

/// One rank's forward accumulator over the blocks of a ring pass.
pub(crate) enum ForwardTiles<B: Backend> {
    Generic {
        q: Tensor<B, 4>,
        acc: Option<(Tensor<B, 4>, Tensor<B, 3>)>,
        win_q: Vec<Window>,
        scale: f32,
    },
    Fused {
        q: Arc<Block>,
        state: OnlineSoftmax,
    },
}

impl<B: Backend> ForwardTiles<B> {
    /// `q` as a tensor (the generic twin) and as the host block the fused kernel reads.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kernel: Kernel,
        q: Tensor<B, 4>,
        q_host: Arc<Block>,
        kv_heads: usize,
        win_q: &[Window],
        scale: f32,
        parallel: bool,
    ) -> Self {
        match kernel {
            Kernel::Generic => ForwardTiles::Generic {
                q,
                acc: None,
                win_q: win_q.to_vec(),
                scale,
            },
            Kernel::Fused => {
                let [batch, heads, tq, head_dim] = q.dims();
                let dims = TileDims {
                    batch,
                    heads,
                    kv_heads,
                    tq,
                    tk: 0,
                    head_dim,
                };
                ForwardTiles::Fused {
                    q: q_host,
                    state: OnlineSoftmax::new(dims, win_q, scale).with_parallel(parallel),
                }
            }
        }
    }

    /// Folds a key/value block (`[b, hk, tk, d]`) with global positions `pos_k` into the state.
    pub fn attend(&mut self, k: &Block, v: &Block, pos_k: &[usize], visibility: Visibility) {
        match self {
            ForwardTiles::Generic {
                q,
                acc,
                win_q,
                scale,
            } => {
                let device = q.device();
                let shape: [usize; 4] = k.shape.clone().try_into().expect("k/v blocks are 4-d");
                let (k, v) = (
                    tensor::<B, 4>(&k.data, shape, &device),
                    tensor::<B, 4>(&v.data, shape, &device),
                );
                let bias = bias(visibility, win_q, pos_k);
                let tile = block_attention(q, &k, &v, bias.as_deref(), *scale);
                *acc = Some(match acc.take() {
                    None => tile,
                    Some(prev) => merge_block(prev, tile),
                });
            }
            ForwardTiles::Fused { q, state } => state.attend(&q.data, &k.data, &v.data, pos_k),
        }
    }

    /// This rank's `(out [b, h, t, d], lse [b, h, t])`.
    pub fn finish(self, device: &B::Device) -> (Tensor<B, 4>, Tensor<B, 3>) {
        match self {
            ForwardTiles::Generic { q, acc, .. } => acc.unwrap_or_else(|| {
                let [b, h, t, d] = q.dims();
                (
                    Tensor::zeros([b, h, t, d], device),
                    Tensor::full([b, h, t], f32::NEG_INFINITY, device),
                )
            }),
            ForwardTiles::Fused { state, .. } => {
                let dims = state.dims();
                let (out, lse) = state.finish();
                let rows = [dims.batch, dims.heads, dims.tq];
                (
                    Tensor::from_data(TensorData::new(out, q_shape(&dims)), device),
                    Tensor::from_data(TensorData::new(lse, rows), device),
                )
            }
        }
    }
}

/// Adds one tile's gradient contributions to `[dq, dk, dv]` (host buffers shaped like q, k, v).
pub(crate) fn backward_tile<B: Backend>(
    kernel: Kernel,
    device: &B::Device,
    tile: &BackwardTile,
    visibility: Visibility,
    [dq, dk, dv]: [&mut [f32]; 3],
) {
    let dims = tile.dims;
    match kernel {
        Kernel::Fused => fused::backward(tile, dq, dk, dv),
        Kernel::Generic => {
            let rows = [dims.batch, dims.heads, dims.tq];
            let q = tensor::<B, 4>(tile.q, q_shape(&dims), device);
            let k = tensor::<B, 4>(tile.k, kv_shape(&dims), device);
            let v = tensor::<B, 4>(tile.v, kv_shape(&dims), device);
            let d_out = tensor::<B, 4>(tile.d_out, q_shape(&dims), device);
            let lse = tensor::<B, 3>(tile.lse, rows, device);
            let delta = tensor::<B, 3>(tile.delta, rows, device);
            let bias = bias(visibility, tile.win_q, tile.pos_k);
            let (dq_t, dk_t, dv_t) = block_attention_backward(
                &q,
                &k,
                &v,
                &d_out,
                &lse,
                &delta,
                bias.as_deref(),
                tile.scale,
            );
            for (sum, part) in [
                (dq, via_data(dq_t)),
                (dk, via_data(dk_t)),
                (dv, via_data(dv_t)),
            ] {
                sum.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
        }
    }
}
