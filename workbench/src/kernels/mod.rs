//! Kernel dispatch: the same tile operations on the fused CPU kernel or its generic Burn twin.
//!
//! The engine hands blocks (on the host for the fused kernel, on the device for the generic one) to
//! these functions; which kernel computes a tile is decided here.

pub(crate) mod device_mask;
pub mod flops;
pub mod fused;
pub mod mask;
pub(crate) mod reference;

use crate::host::HostRead;
use crate::ring::block::{Block, BlockKind};
use crate::ring::context::Kernel;
use burn::tensor::{Tensor, TensorData, backend::Backend};
use device_mask::DeviceMasks;
use fused::{BackwardTile, OnlineSoftmax, TileDims};
use mask::{Visibility, Window};
use reference::{block_attention, block_attention_backward, merge_block};
use std::sync::Arc;

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
    /// The generic twin: everything stays a tensor on the rank's device.
    Generic {
        q: Tensor<B, 4>,
        acc: Option<(Tensor<B, 4>, Tensor<B, 3>)>,
        masks: DeviceMasks<B>,
        rank: usize,
        scale: f32,
    },
    /// The fused CPU kernel, on host blocks.
    Fused { q: Arc<Block>, state: OnlineSoftmax },
}

impl<B: HostRead> ForwardTiles<B> {
    /// The generic twin's state for rank `rank`'s queries, with every rank's masks on the device.
    pub fn generic(q: Tensor<B, 4>, masks: DeviceMasks<B>, rank: usize, scale: f32) -> Self {
        ForwardTiles::Generic {
            q,
            acc: None,
            masks,
            rank,
            scale,
        }
    }

    /// The fused kernel's state for the host block `q` (`[b, h, t, d]`).
    pub fn fused(
        q: Arc<Block>,
        kv_heads: usize,
        win_q: &[Window],
        scale: f32,
        parallel: bool,
    ) -> Self {
        let [batch, heads, tq, head_dim] = q.shape[..] else {
            unreachable!("q blocks are 4-d")
        };
        let dims = TileDims {
            batch,
            heads,
            kv_heads,
            tq,
            tk: 0,
            head_dim,
        };
        ForwardTiles::Fused {
            q,
            state: OnlineSoftmax::new(dims, win_q, scale).with_parallel(parallel),
        }
    }

    /// Folds rank `owner`'s key/value block (`[b, hk, tk, d]`, keys at global `pos_k`) into the state.
    pub fn attend(
        &mut self,
        k: &Block,
        v: &Block,
        owner: usize,
        pos_k: &[usize],
        visibility: Visibility,
    ) {
        match self {
            ForwardTiles::Generic {
                q,
                acc,
                masks,
                rank,
                scale,
            } => {
                let device = q.device();
                let (k, v) = (k.tensor::<B, 4>(&device), v.tensor::<B, 4>(&device));
                let bias = matches!(visibility, Visibility::Partial { .. })
                    .then(|| masks.bias(*rank, owner));
                let tile = block_attention(q, &k, &v, bias, *scale);
                *acc = Some(match acc.take() {
                    None => tile,
                    Some(prev) => merge_block(prev, tile),
                });
            }
            ForwardTiles::Fused { q, state } => {
                state.attend(&q.host_values(), &k.host_values(), &v.host_values(), pos_k)
            }
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

/// The inputs of one backward tile as blocks (host blocks for the fused kernel; device tensors, or
/// host blocks from another process, for the generic one): q and dO `[b, h, tq, d]`, lse and δ
/// `[b, h, tq]`, k and v `[b, hk, tk, d]`.
pub(crate) struct BackwardBlocks<'a> {
    pub q: &'a Block,
    pub d_out: &'a Block,
    pub lse: &'a Block,
    pub delta: &'a Block,
    pub k: &'a Block,
    pub v: &'a Block,
    /// The queries' key windows and the keys' global positions.
    pub win_q: &'a [Window],
    pub pos_k: &'a [usize],
    /// (query rank, key rank): whose masks the generic kernel takes.
    pub ranks: (usize, usize),
    pub visibility: Visibility,
    pub dims: TileDims,
    pub scale: f32,
    /// The fused kernel spreads its units over rayon's pool.
    pub parallel: bool,
}

/// One backward tile, on the generic kernel when `masks` are given (on `device`), else on the fused
/// one. The gradients of the side that stays accumulate into `stay` (dK and dV when Q travels, dQ
/// otherwise); those of the travelling side are returned as fresh blocks for its accumulator.
pub(crate) fn backward_tile<B: HostRead>(
    t: &BackwardBlocks,
    masks: Option<&DeviceMasks<B>>,
    device: &B::Device,
    stay: &mut [Block],
    travelling_q: bool,
) -> Vec<Block> {
    if let Some(masks) = masks {
        let bias = matches!(t.visibility, Visibility::Partial { .. })
            .then(|| masks.bias(t.ranks.0, t.ranks.1));
        let (dq, dk, dv) = block_attention_backward(
            &t.q.tensor(device),
            &t.k.tensor(device),
            &t.v.tensor(device),
            &t.d_out.tensor(device),
            &t.lse.tensor(device),
            &t.delta.tensor(device),
            bias,
            t.scale,
        );
        let on_device = Block::on_device::<B, 4>;
        return if travelling_q {
            stay[0].add_assign::<B>(&on_device(BlockKind::DK, dk), device);
            stay[1].add_assign::<B>(&on_device(BlockKind::DV, dv), device);
            vec![on_device(BlockKind::DQ, dq)]
        } else {
            stay[0].add_assign::<B>(&on_device(BlockKind::DQ, dq), device);
            vec![on_device(BlockKind::DK, dk), on_device(BlockKind::DV, dv)]
        };
    }
    let (q, k, v) = (t.q.host_values(), t.k.host_values(), t.v.host_values());
    let (d_out, lse, delta) = (
        t.d_out.host_values(),
        t.lse.host_values(),
        t.delta.host_values(),
    );
    let tile = BackwardTile {
        dims: t.dims,
        q: &q,
        k: &k,
        v: &v,
        d_out: &d_out,
        lse: &lse,
        delta: &delta,
        win_q: t.win_q,
        pos_k: t.pos_k,
        scale: t.scale,
        parallel: t.parallel,
    };
    // The fused kernel adds into host buffers: those that stay, in place.
    if travelling_q {
        let mut dq = Block::zeros(BlockKind::DQ, t.q.shape.clone());
        let [dk, dv] = stay else {
            unreachable!("two stay-at-home blocks: dK, dV")
        };
        fused::backward(
            &tile,
            dq.host_values_mut(),
            dk.host_values_mut(),
            dv.host_values_mut(),
        );
        vec![dq]
    } else {
        let mut dk = Block::zeros(BlockKind::DK, t.k.shape.clone());
        let mut dv = Block::zeros(BlockKind::DV, t.v.shape.clone());
        fused::backward(
            &tile,
            stay[0].host_values_mut(),
            dk.host_values_mut(),
            dv.host_values_mut(),
        );
        vec![dk, dv]
    }
}
