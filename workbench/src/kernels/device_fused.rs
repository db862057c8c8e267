//! The fused device kernel ([`DeviceFused`], `cubecl-fused`): each tile is one launch of the CubeCL
//! forward kernel, or two of the backward (`crate::cube`), on the backend's own device; operands,
//! accumulators and masks never leave it. Masks are made inside the kernels from the shard's
//! windows and positions, placed once per pass as the generic kernel's are (`device_mask.rs`).
//! `--kernel fused` is this kernel on a device backend and the CPU kernel on the CPU. In a bf16 run
//! a tile widens its bf16 blocks to f32 (exactly) before the launch, and the kernels round P and dS
//! to bf16 before their products, as the other kernels do.

use super::device_mask::DeviceShard;
use super::generic::{GenericTwin, merge_block, rounded, settle_on_device};
use super::mask::Window;
use super::tile::{BackwardTile, ForwardTile, Queries, Scores, TileDims, TileKernel, Travelling};
use crate::block::{Block, BlockKind};
use crate::cube::{DeviceTiles, TileOperands};
use crate::dtype::{Dtype, Precision};
use crate::error::RingError;
use crate::host::HostRead;
use burn::tensor::Tensor;
use std::sync::Arc;

/// The fused device kernel as a [`TileKernel`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceFused;

/// Its forward accumulator: the queries, their shard, the launches, and the running
/// `(out, lse)` (0 and −∞ before the first tile).
pub struct DeviceForward<B: HostRead> {
    q: Tensor<B, 4>,
    shard: DeviceShard<B>,
    tiles: &'static dyn DeviceTiles<B>,
    running: (Tensor<B, 4>, Tensor<B, 3>),
    how: Scores,
}

/// The backend's fused device kernels; only reached after [`DeviceFused::implementation`] said yes.
fn tiles<B: HostRead>() -> &'static dyn DeviceTiles<B> {
    B::device_tiles().expect("the engine asks `implementation` before a pass")
}

/// One tile's operands for the launches.
fn operands<'a, B: HostRead>(
    q: &'a Tensor<B, 4>,
    (k, v): (&'a Tensor<B, 4>, &'a Tensor<B, 4>),
    queries: &'a DeviceShard<B>,
    keys: &'a DeviceShard<B>,
    how: Scores,
) -> TileOperands<'a, B> {
    TileOperands {
        q,
        k,
        v,
        q_lo: queries.lo(),
        q_hi: queries.hi(),
        k_pos: keys.positions(),
        scale: how.scale,
        softcap: how.softcap,
        bf16: how.precision.dtype == Dtype::Bf16,
    }
}

impl<B: HostRead> TileKernel<B> for DeviceFused {
    type Shard = DeviceShard<B>;
    type Forward = DeviceForward<B>;

    /// Any precision: a bf16 run's blocks are widened to f32 as a tile reads them, and the
    /// kernels round P and dS to bf16 before their products (the engine refuses bf16 blocks on a
    /// device that does not store them).
    fn implementation(&self, device: &B::Device, _: Precision) -> Result<&'static str, RingError> {
        let unavailable = |why| RingError::KernelUnavailable {
            kernel: "fused",
            backend: B::name(device),
            why,
        };
        match B::device_tiles() {
            None => Err(unavailable(
                "this backend has no fused device kernel (CubeCL backends do: wgpu, cuda); use --kernel generic",
            )),
            Some(_) => Ok("cubecl-fused"),
        }
    }

    /// Shards, operands and accumulators live where the generic kernel keeps them: on the device.
    fn shard(
        &self,
        windows: &[Window],
        positions: &[usize],
        device: &B::Device,
    ) -> Result<DeviceShard<B>, RingError> {
        TileKernel::<B>::shard(&GenericTwin, windows, positions, device)
    }

    fn operand<const D: usize>(&self, kind: BlockKind, tensor: Tensor<B, D>) -> Block {
        TileKernel::<B>::operand(&GenericTwin, kind, tensor)
    }

    fn zeros(&self, kind: BlockKind, shape: Vec<usize>, device: &B::Device) -> Block {
        TileKernel::<B>::zeros(&GenericTwin, kind, shape, device)
    }

    /// No score-sized tensor: the tiles' scores live in registers and shared memory. A forward tile
    /// writes a fresh running `(out, lse)`; a backward tile fresh dQ, dK and dV.
    fn workspace_bytes(&self, dims: &TileDims, backward: bool) -> u64 {
        let query_rows = dims.batch * dims.heads * dims.tq;
        let values = if backward {
            query_rows * dims.head_dim + 2 * dims.batch * dims.kv_heads * dims.tk * dims.head_dim
        } else {
            query_rows * (dims.head_dim + 1)
        };
        (values * std::mem::size_of::<f32>()) as u64
    }

    fn forward_start(
        &self,
        q: &Arc<Block>,
        _: usize,
        queries: Queries<'_, DeviceShard<B>>,
        how: Scores,
        _: bool,
    ) -> DeviceForward<B> {
        let shard = queries.prepared.clone();
        let device = shard.device();
        let q: Tensor<B, 4> = q.f32_tensor(&device);
        let [b, h, t, d] = q.dims();
        DeviceForward {
            running: (
                Tensor::zeros([b, h, t, d], &device),
                Tensor::full([b, h, t], f32::NEG_INFINITY, &device),
            ),
            q,
            shard,
            tiles: tiles::<B>(),
            how,
        }
    }

    fn forward_tile(&self, state: &mut DeviceForward<B>, tile: ForwardTile<'_, DeviceShard<B>>) {
        let device = state.q.device();
        let (k, v) = (
            tile.k.f32_tensor::<B, 4>(&device),
            tile.v.f32_tensor::<B, 4>(&device),
        );
        let running = state.running.clone();
        let operands = operands(
            &state.q,
            (&k, &v),
            &state.shard,
            tile.keys.prepared,
            state.how,
        );
        let result = state.tiles.forward(operands, running);
        // Between ring steps the output is kept in the merge's type; lse stays f32.
        state.running = (rounded(result.out, state.how.precision.merge), result.lse);
    }

    fn forward_finish(
        &self,
        state: DeviceForward<B>,
        sinks: Option<&Block>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 3>) {
        let [b, h, t, d] = state.q.dims();
        match sinks {
            // The sink as one more partial: output 0, log-sum-exp the sink's logit.
            Some(sinks) => {
                let sink = sinks
                    .f32_tensor::<B, 1>(device)
                    .reshape([1, h, 1])
                    .expand([b, h, t]);
                merge_block(state.running, (Tensor::zeros([b, h, t, d], device), sink))
            }
            None => state.running,
        }
    }

    fn sink_gradient(
        &self,
        sinks: &Block,
        lse: &Block,
        delta: &Block,
        device: &B::Device,
    ) -> Block {
        TileKernel::<B>::sink_gradient(&GenericTwin, sinks, lse, delta, device)
    }

    fn delta(&self, d_out: &Block, out: Tensor<B, 4>) -> Block {
        TileKernel::<B>::delta(&GenericTwin, d_out, out)
    }

    fn backward_tile(
        &self,
        t: &BackwardTile<'_, DeviceShard<B>>,
        stay: &mut [Block],
        travelling: Travelling,
    ) -> Vec<Block> {
        let device = t.queries.prepared.device();
        let (q, k, v) = (
            t.q.f32_tensor::<B, 4>(&device),
            t.k.f32_tensor::<B, 4>(&device),
            t.v.f32_tensor::<B, 4>(&device),
        );
        let operands = operands(&q, (&k, &v), t.queries.prepared, t.keys.prepared, t.scores);
        let grads = tiles::<B>().backward(
            operands,
            &t.d_out.f32_tensor(&device),
            &t.lse.f32_tensor(&device),
            &t.delta.f32_tensor(&device),
        );
        settle_on_device((grads.dq, grads.dk, grads.dv), stay, travelling, &device)
    }
}
