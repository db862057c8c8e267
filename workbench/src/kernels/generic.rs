//! The generic kernel ([`GenericTwin`]): the tile math in Burn tensor ops on any backend's device,
//! the reference twin of every fused kernel.
//!
//! Forward returns the tile's normalized output and log-sum-exp; [`merge_block`] combines tiles in any
//! order (Liu et al. 2023, §3, blockwise online softmax). Backward recomputes probabilities from the
//! saved log-sum-exp (FlashAttention-2 style). Masks come from global positions only, built on the
//! device (`device_mask.rs`); every operand, accumulator and mask stays a tensor there.
//!
//! # Shapes
//! q, o, dO: `[b, h, tq, d]`; k, v: `[b, hk, tk, d]` with `h = g · hk` (grouped-query attention,
//! query head `i` reads kv head `i / g`); lse, delta: `[b, h, tq]`.

use super::device_mask::DeviceShard;
use super::mask::{Visibility, Window};
use super::tile::{BackwardTile, ForwardTile, Queries, Scores, TileDims, TileKernel, Travelling};
use crate::block::{Block, BlockKind};
use crate::dtype::{Dtype, Precision};
use crate::error::RingError;
use crate::host::HostRead;
use burn::tensor::{FloatDType, Tensor, backend::Backend};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How the generic kernel multiplies on a CubeCL device (wgpu, cuda).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GenericMatmul {
    /// Every product and sum in f32 (CubeCL's unit matmul): the default, and what the exactness
    /// tests hold to 1e-5.
    #[default]
    F32,
    /// Burn's autotuned matmul, for speed: on NVIDIA GPUs since Ampere its tensor-core routines
    /// compute f32 inputs in TF32 (2⁻¹¹ relative), outside the 1e-5 exactness. A run in this mode
    /// reports its kernel as `generic-autotuned`.
    Autotuned,
}

/// Whether this process's generic kernel uses [`GenericMatmul::Autotuned`]: a process-wide choice,
/// made once by a command line (`bench attn --generic-matmul autotuned`) before any rank starts.
static AUTOTUNED: AtomicBool = AtomicBool::new(false);

/// Sets how this process's generic kernel multiplies on a CubeCL device, from now on.
pub fn set_generic_matmul(mode: GenericMatmul) {
    AUTOTUNED.store(mode == GenericMatmul::Autotuned, Ordering::Relaxed);
}

/// How this process's generic kernel multiplies on a CubeCL device.
pub fn generic_matmul() -> GenericMatmul {
    if AUTOTUNED.load(Ordering::Relaxed) {
        GenericMatmul::Autotuned
    } else {
        GenericMatmul::F32
    }
}

/// `lhs · rhs` on `B`'s device: a CubeCL backend's unit matmul in f32 (its autotuned one may pick
/// TF32 tensor cores) unless [`GenericMatmul::Autotuned`] was chosen; any other backend's own.
fn matmul<B: HostRead>(lhs: Tensor<B, 4>, rhs: Tensor<B, 4>) -> Tensor<B, 4> {
    match (B::device_tiles(), generic_matmul()) {
        (Some(tiles), GenericMatmul::F32) => tiles.matmul_f32(lhs, rhs),
        _ => lhs.matmul(rhs),
    }
}

/// A tile's scores `scale · q kᵀ`, soft-capped when `how` says (`C · tanh(s / C)`), with the mask
/// applied, laid out `[b, h, tq, tk]`; and, with a cap, each score's `tanh` (for the backward).
fn scores<B: HostRead>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    bias: Option<Tensor<B, 2>>,
    how: Scores,
) -> (Tensor<B, 4>, Option<Tensor<B, 4>>) {
    let [b, h, tq, d] = q.dims();
    let [_, hk, tk, _] = k.dims();
    let grouped = q.clone().reshape([b, hk, (h / hk) * tq, d]) * how.scale;
    let s = matmul(grouped, k.clone().swap_dims(2, 3)).reshape([b, h, tq, tk]);
    let (s, tanh) = match how.softcap {
        Some(cap) => {
            let t = (s / cap).tanh();
            (t.clone() * cap, Some(t))
        }
        None => (s, None),
    };
    let s = match bias {
        Some(bias) => s + bias.reshape([1, 1, tq, tk]),
        None => s,
    };
    (s, tanh)
}

/// `x` with its values rounded to `dtype` (a cast there and back: the engine checked that the
/// backend computes in it).
pub(super) fn rounded<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: Dtype) -> Tensor<B, D> {
    match dtype {
        Dtype::F32 => x,
        Dtype::Bf16 => x.cast(FloatDType::BF16).cast(FloatDType::F32),
    }
}

/// `p · v` where p is `[b, h, tq, tk]` and v is `[b, hk, tk, d]`: `[b, h, tq, d]`.
fn grouped_matmul<B: HostRead>(p: Tensor<B, 4>, v: &Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, h, tq, tk] = p.dims();
    let [_, hk, _, d] = v.dims();
    matmul(p.reshape([b, hk, (h / hk) * tq, tk]), v.clone()).reshape([b, h, tq, d])
}

/// Forward of one tile: normalized output `[b, h, tq, d]` and log-sum-exp `[b, h, tq]`.
///
/// `bias` is the tile's additive mask `[tq, tk]` (0 or −∞) for partially visible tiles, `None` for
/// fully visible ones.
/// Rows with no visible key get output 0 and lse −∞, which [`merge_block`] treats as empty.
pub fn block_attention<B: HostRead>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    bias: Option<Tensor<B, 2>>,
    how: Scores,
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let (s, _) = scores(q, k, bias, how);
    let m = s.clone().max_dim(3); // [b, h, tq, 1]
    let m_safe = m.clone().mask_fill(m.is_inf(), 0.0);
    let p = (s - m_safe.clone()).exp();
    let l = p.clone().sum_dim(3);
    // P enters the product in the operands' type; its sum l stays f32.
    let p = rounded(p, how.precision.dtype);
    let o = grouped_matmul(p, v) / l.clone().clamp_min(f32::MIN_POSITIVE);
    let lse = m_safe + l.log();
    (o, lse.squeeze_dim(3))
}

/// Combines two partial results over disjoint key sets into their union's, in f32.
pub fn merge_block<B: Backend>(
    (o_a, lse_a): (Tensor<B, 4>, Tensor<B, 3>),
    (o_b, lse_b): (Tensor<B, 4>, Tensor<B, 3>),
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let max = lse_a.clone().max_pair(lse_b.clone());
    let max = max.clone().mask_fill(max.is_inf(), 0.0);
    let w_a = (lse_a - max.clone()).exp();
    let w_b = (lse_b - max.clone()).exp();
    let total = w_a.clone() + w_b.clone();
    let lse = max + total.clone().log();
    let inv = total.clamp_min(f32::MIN_POSITIVE).recip();
    let w_a = (w_a * inv.clone()).unsqueeze_dim(3);
    let w_b = (w_b * inv).unsqueeze_dim(3);
    (o_a * w_a + o_b * w_b, lse)
}

/// Gradients of one tile: `(dq [b, h, tq, d], dk [b, hk, tk, d], dv [b, hk, tk, d])`.
///
/// `lse` and `delta` are the *final* per-row statistics of the full attention, so tiles can be
/// processed in any order and their contributions summed.
#[allow(clippy::too_many_arguments)]
pub fn block_attention_backward<B: HostRead>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    d_out: &Tensor<B, 4>,
    lse: &Tensor<B, 3>,
    delta: &Tensor<B, 3>,
    bias: Option<Tensor<B, 2>>,
    how: Scores,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let [b, h, tq, d] = q.dims();
    let [_, hk, tk, _] = k.dims();
    let rows = (h / hk) * tq;
    let (s, tanh) = scores(q, k, bias, how);
    let p = (s - lse.clone().unsqueeze_dim(3)).exp(); // [b, h, tq, tk]
    let dtype = how.precision.dtype;
    let p_g = rounded(p.clone(), dtype).reshape([b, hk, rows, tk]);
    let do_g = d_out.clone().reshape([b, hk, rows, d]);
    let dv = matmul(p_g.swap_dims(2, 3), do_g.clone());
    let dp = matmul(do_g, v.clone().swap_dims(2, 3)).reshape([b, h, tq, tk]);
    let ds = p * (dp - delta.clone().unsqueeze_dim(3));
    // Through the cap: d(raw score) = dS · (1 − tanh²).
    let ds = match tanh {
        Some(t) => ds * (t.clone() * t).neg().add_scalar(1.0),
        None => ds,
    };
    // dS enters its products in the operands' type.
    let ds_g = rounded(ds, dtype).reshape([b, hk, rows, tk]) * how.scale;
    let dq = matmul(ds_g.clone(), k.clone()).reshape([b, h, tq, d]);
    let dk = matmul(ds_g.swap_dims(2, 3), q.clone().reshape([b, hk, rows, d]));
    (dq, dk, dv)
}

/// The generic kernel as a [`TileKernel`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GenericTwin;

/// The generic kernel's forward accumulator: the queries, their shard on the device, and the
/// merged `(out, lse)` of the tiles so far.
pub struct GenericForward<B: Backend> {
    q: Tensor<B, 4>,
    shard: DeviceShard<B>,
    acc: Option<(Tensor<B, 4>, Tensor<B, 3>)>,
    how: Scores,
}

/// The tile's additive mask when the tile is partly visible; none when fully visible.
fn bias<B: Backend>(
    visibility: Visibility,
    queries: &DeviceShard<B>,
    keys: &DeviceShard<B>,
) -> Option<Tensor<B, 2>> {
    matches!(visibility, Visibility::Partial { .. }).then(|| queries.bias(keys))
}

impl<B: HostRead> TileKernel<B> for GenericTwin {
    type Shard = DeviceShard<B>;
    type Forward = GenericForward<B>;

    fn implementation(&self, _: &B::Device, _: Precision) -> Result<&'static str, RingError> {
        Ok(match (B::device_tiles().is_some(), generic_matmul()) {
            (true, GenericMatmul::Autotuned) => "generic-autotuned",
            _ => "generic",
        })
    }

    fn shard(
        &self,
        windows: &[Window],
        positions: &[usize],
        device: &B::Device,
    ) -> Result<DeviceShard<B>, RingError> {
        DeviceShard::new(windows, positions, device)
    }

    fn operand<const D: usize>(&self, kind: BlockKind, tensor: Tensor<B, D>) -> Block {
        Block::on_device(kind, tensor)
    }

    fn zeros(&self, kind: BlockKind, shape: Vec<usize>, device: &B::Device) -> Block {
        Block::zeros_on::<B>(kind, shape, device)
    }

    /// Full score-sized tensors (scores and probabilities forward; probabilities, their gradient
    /// and the score gradient backward): what makes it the memory-hungry reference.
    fn workspace_bytes(&self, dims: &TileDims, backward: bool) -> u64 {
        let tensors = if backward { 3 } else { 2 };
        (tensors * dims.scores() * std::mem::size_of::<f32>()) as u64
    }

    fn forward_start(
        &self,
        q: &Arc<Block>,
        _: usize,
        queries: Queries<'_, DeviceShard<B>>,
        how: Scores,
        _: bool,
    ) -> GenericForward<B> {
        let shard = queries.prepared.clone();
        GenericForward {
            q: q.f32_tensor(&shard.device()),
            shard,
            acc: None,
            how,
        }
    }

    fn forward_tile(&self, state: &mut GenericForward<B>, tile: ForwardTile<'_, DeviceShard<B>>) {
        let device = state.q.device();
        let (k, v) = (
            tile.k.f32_tensor::<B, 4>(&device),
            tile.v.f32_tensor::<B, 4>(&device),
        );
        let bias = bias(tile.visibility, &state.shard, tile.keys.prepared);
        let part = block_attention(&state.q, &k, &v, bias, state.how);
        let (out, lse) = match state.acc.take() {
            None => part,
            Some(prev) => merge_block(prev, part),
        };
        // Between ring steps the output is kept in the merge's type; lse stays f32.
        state.acc = Some((rounded(out, state.how.precision.merge), lse));
    }

    fn forward_finish(
        &self,
        state: GenericForward<B>,
        sinks: Option<&Block>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 3>) {
        let [b, h, t, d] = state.q.dims();
        let acc = state.acc.unwrap_or_else(|| {
            (
                Tensor::zeros([b, h, t, d], device),
                Tensor::full([b, h, t], f32::NEG_INFINITY, device),
            )
        });
        match sinks {
            // The sink as one more partial: output 0, log-sum-exp the sink's logit.
            Some(sinks) => {
                let sink = sinks
                    .f32_tensor::<B, 1>(device)
                    .reshape([1, h, 1])
                    .expand([b, h, t]);
                merge_block(acc, (Tensor::zeros([b, h, t, d], device), sink))
            }
            None => acc,
        }
    }

    fn sink_gradient(
        &self,
        sinks: &Block,
        lse: &Block,
        delta: &Block,
        device: &B::Device,
    ) -> Block {
        let [b, h, t] = lse.shape[..] else {
            unreachable!("lse blocks are 3-d")
        };
        let lse = lse.f32_tensor::<B, 3>(device);
        let sink = sinks
            .f32_tensor::<B, 1>(device)
            .reshape([1, h, 1])
            .expand([b, h, t]);
        let p = (sink - lse).exp();
        let dsinks = (p * delta.f32_tensor::<B, 3>(device))
            .sum_dim(2)
            .sum_dim(0)
            .reshape([h])
            .neg();
        Block::on_device(BlockKind::DSinks, dsinks)
    }

    fn delta(&self, d_out: &Block, out: Tensor<B, 4>) -> Block {
        let d_out = d_out.f32_tensor::<B, 4>(&out.device());
        let delta: Tensor<B, 3> = (d_out * out).sum_dim(3).squeeze_dim(3);
        Block::on_device(BlockKind::Delta, delta)
    }

    fn backward_tile(
        &self,
        t: &BackwardTile<'_, DeviceShard<B>>,
        stay: &mut [Block],
        travelling: Travelling,
    ) -> Vec<Block> {
        let device = t.queries.prepared.device();
        let (dq, dk, dv) = block_attention_backward(
            &t.q.f32_tensor(&device),
            &t.k.f32_tensor(&device),
            &t.v.f32_tensor(&device),
            &t.d_out.f32_tensor(&device),
            &t.lse.f32_tensor(&device),
            &t.delta.f32_tensor(&device),
            bias(t.visibility, t.queries.prepared, t.keys.prepared),
            t.scores,
        );
        settle_on_device((dq, dk, dv), stay, travelling, &device)
    }
}

/// A backward tile's `(dq, dk, dv)` device tensors where they belong: the staying side's added into
/// `stay` (dK and dV when the queries travel, dQ when the keys do), the travelling side's returned
/// as fresh blocks (dQ, or dK then dV). Both device kernels end their backward tiles here.
pub(super) fn settle_on_device<B: HostRead>(
    (dq, dk, dv): (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>),
    stay: &mut [Block],
    travelling: Travelling,
    device: &B::Device,
) -> Vec<Block> {
    let on_device = Block::on_device::<B, 4>;
    match travelling {
        Travelling::Queries => {
            stay[0].add_assign::<B>(&on_device(BlockKind::DK, dk), device);
            stay[1].add_assign::<B>(&on_device(BlockKind::DV, dv), device);
            vec![on_device(BlockKind::DQ, dq)]
        }
        Travelling::Keys => {
            stay[0].add_assign::<B>(&on_device(BlockKind::DQ, dq), device);
            vec![on_device(BlockKind::DK, dk), on_device(BlockKind::DV, dv)]
        }
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod wgpu_tests {
    use super::*;
    use crate::backends::Wgpu;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    fn on<B: Backend, const D: usize>(data: &[f32], shape: [usize; D]) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(data.to_vec(), shape), &Default::default())
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
    }

    const SCORES: Scores = Scores {
        scale: 0.3,
        softcap: None,
        precision: crate::dtype::Precision::F32,
    };

    /// Two tiles of `[2, 4, 24, 16]` and their merge: outputs and log-sum-exps.
    fn tiles<B: HostRead>(q: &[f32], k: &[f32], v: &[f32]) -> Vec<Vec<f32>> {
        let shape = [2, 4, 24, 16];
        let (q, k0, v0) = (
            on::<B, 4>(q, shape),
            on::<B, 4>(k, shape),
            on::<B, 4>(v, shape),
        );
        let (k1, v1) = (k0.clone() * 0.5, v0.clone() - 0.25);
        let a = block_attention(&q, &k0, &v0, None, SCORES);
        let b = block_attention(&q, &k1, &v1, None, SCORES);
        let (o, lse) = merge_block(a.clone(), b.clone());
        vec![
            values(a.0),
            values(a.1),
            values(b.0),
            values(b.1),
            values(o),
            values(lse),
        ]
    }

    /// The tile math on unfused wgpu equals Flex's (Burn 0.21's fused `Wgpu` is 0.28 off here).
    #[test]
    fn unfused_wgpu_tiles_match_flex() {
        let data = |seed: usize| -> Vec<f32> {
            (0..3072)
                .map(|i| (((i * 37 + seed * 11) % 17) as f32 - 8.0) / 8.0)
                .collect()
        };
        let (q, k, v) = (data(1), data(2), data(3));
        let flex = tiles::<Flex>(&q, &k, &v);
        let wgpu = tiles::<Wgpu>(&q, &k, &v);
        for (i, (a, b)) in flex.iter().zip(&wgpu).enumerate() {
            let d = ringbench_tests::deviation(b, a);
            assert!(d.wrong.is_none() && d.abs < 1e-5, "output {i}: {d}");
        }
    }
}
