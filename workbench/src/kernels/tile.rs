//! The seam between the ring and the tile math: [`TileKernel`], one tile's forward and backward on
//! blocks, with no notion of ranks, rings or transports. The ring hands a kernel each shard's query
//! windows and key positions once per pass ([`TileKernel::shard`]) and then tiles that name them.
//!
//! # Shapes
//! q, out, dO, dq: `[b, h, tq, d]`; k, v, dk, dv: `[b, hk, tk, d]`; lse, δ: `[b, h, tq]`.

use super::mask::{Visibility, Window};
use crate::block::{Block, BlockKind};
use crate::dtype::Precision;
use crate::error::RingError;
use crate::host::HostRead;
use burn::tensor::Tensor;
use std::sync::Arc;

/// Sizes of one tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileDims {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Query rows of the tile.
    pub tq: usize,
    /// Key rows of the tile.
    pub tk: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl TileDims {
    /// (batch, kv head) units: each attends its group of query heads to one key/value head.
    pub fn units(&self) -> usize {
        self.batch * self.kv_heads
    }

    /// Query rows per unit: the `heads / kv_heads` heads of a group, `tq` rows each.
    pub fn rows(&self) -> usize {
        self.heads / self.kv_heads * self.tq
    }

    /// Score elements of the whole tile, `b · h · tq · tk`.
    pub fn scores(&self) -> usize {
        self.batch * self.heads * self.tq * self.tk
    }
}

/// How a tile's scores are made from `q · kᵀ`: scaled, then soft-capped when asked
/// (`s = C · tanh(s / C)`, before masking; its backward multiplies by `1 − (s / C)²`); and in which
/// element types its probabilities enter the products and its accumulators are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    /// Softmax scale.
    pub scale: f32,
    /// The cap `C > 0`, if any.
    pub softcap: Option<f32>,
    /// With `dtype` bf16, P (forward and backward) and dS are rounded to bf16 before they enter a
    /// matmul; with `merge` bf16, the forward accumulator's output is rounded to bf16 after every
    /// tile (the engine keeps the backward's accumulators in bf16 itself).
    pub precision: Precision,
}

/// A shard's queries as a kernel sees them: their key windows on the host, and what the kernel
/// prepared for them.
#[derive(Debug, Clone, Copy)]
pub struct Queries<'a, S> {
    /// Each query's window of visible key positions, in local order.
    pub windows: &'a [Window],
    /// What [`TileKernel::shard`] made of them.
    pub prepared: &'a S,
}

/// A shard's keys as a kernel sees them: their global positions on the host, and what the kernel
/// prepared for them.
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a, S> {
    /// Each key's global position, in local order.
    pub positions: &'a [usize],
    /// What [`TileKernel::shard`] made of them.
    pub prepared: &'a S,
}

/// One forward tile: a key/value block folded into a forward accumulator.
#[derive(Debug)]
pub struct ForwardTile<'a, S> {
    /// Keys `[b, hk, tk, d]`.
    pub k: &'a Block,
    /// Values `[b, hk, tk, d]`.
    pub v: &'a Block,
    /// Where the keys sit.
    pub keys: Keys<'a, S>,
    /// What the accumulator's queries see of them (never [`Visibility::None`]: such a tile is
    /// skipped before it reaches a kernel).
    pub visibility: Visibility,
}

/// One backward tile's blocks; `lse` and `delta` are the final per-row statistics.
#[derive(Debug)]
pub struct BackwardTile<'a, S> {
    /// Queries `[b, h, tq, d]`.
    pub q: &'a Block,
    /// The output's gradient `[b, h, tq, d]`.
    pub d_out: &'a Block,
    /// The forward's log-sum-exp `[b, h, tq]`.
    pub lse: &'a Block,
    /// δ = rowsum(dO ∘ O) `[b, h, tq]`.
    pub delta: &'a Block,
    /// Keys `[b, hk, tk, d]`.
    pub k: &'a Block,
    /// Values `[b, hk, tk, d]`.
    pub v: &'a Block,
    /// Whose queries.
    pub queries: Queries<'a, S>,
    /// Whose keys.
    pub keys: Keys<'a, S>,
    /// What the queries see of the keys (never [`Visibility::None`]).
    pub visibility: Visibility,
    /// The tile's sizes.
    pub dims: TileDims,
    /// How scores are made.
    pub scores: Scores,
    /// Whether the kernel may spread its work over the cores (the rank has them to itself).
    pub parallel: bool,
}

/// Which gradients of a backward tile stay on this rank and which travel with the cargo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Travelling {
    /// Q, dO, lse and δ travel: dK and dV stay (accumulated in place), dQ travels.
    Queries,
    /// K and V travel: dQ stays, dK and dV travel.
    Keys,
}

/// A tile kernel: the forward and backward of one (query block, key/value block) tile, on the
/// blocks where it keeps its operands (the host, or the backend's device). The ring engine drives
/// one through [`super::with_kernel`], never asking which it holds; adding one is a file that
/// implements this trait, a line in the registry and the function it names (`kernels/mod.rs`).
pub trait TileKernel<B: HostRead> {
    /// What the kernel prepares once per ring pass for a shard's queries and keys (the generic
    /// kernel: their windows and positions on the device; the fused CPU kernel: nothing, it reads
    /// the host slices).
    type Shard;
    /// A rank's forward accumulator over the key/value blocks of a pass.
    type Forward;

    /// What runs the tiles on backend `B` in `precision` (`cpu-fused`, `cubecl-fused`, `generic`,
    /// …: the `kernel_impl` that tables and `ringbench attn` report), or why this kernel does not
    /// run there: a kernel never runs somewhere else than asked without saying so.
    fn implementation(
        &self,
        device: &B::Device,
        precision: Precision,
    ) -> Result<&'static str, RingError>;

    /// Prepares a shard: queries seeing `windows`, keys at `positions` (both in local order).
    fn shard(
        &self,
        windows: &[Window],
        positions: &[usize],
        device: &B::Device,
    ) -> Result<Self::Shard, RingError>;

    /// `tensor` as a block where this kernel reads its operands: a host copy, or the tensor itself.
    fn operand<const D: usize>(&self, kind: BlockKind, tensor: Tensor<B, D>) -> Block;

    /// A block of zeros where this kernel accumulates.
    fn zeros(&self, kind: BlockKind, shape: Vec<usize>, device: &B::Device) -> Block;

    /// Bytes of workspace one tile of `dims` needs, forward or backward (charged to the ledger).
    fn workspace_bytes(&self, dims: &TileDims, backward: bool) -> u64;

    /// The forward accumulator of queries `q` (an operand block) seeing `queries`, before any key.
    fn forward_start(
        &self,
        q: &Arc<Block>,
        kv_heads: usize,
        queries: Queries<'_, Self::Shard>,
        scores: Scores,
        parallel: bool,
    ) -> Self::Forward;

    /// Folds one key/value block into the accumulator.
    fn forward_tile(&self, state: &mut Self::Forward, tile: ForwardTile<'_, Self::Shard>);

    /// The accumulator's `(out [b, h, tq, d], lse [b, h, tq])` on `device`; a row that saw no key
    /// has output 0 and lse −∞. With `sinks` (an operand block `[h]`), each row's denominator also
    /// holds `exp(sinks[h])`, once: `lse = log(Σ exp(s) + exp(sink))`, and the output shrinks by its
    /// share.
    fn forward_finish(
        &self,
        state: Self::Forward,
        sinks: Option<&Block>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 3>);

    /// The sinks' gradient from this shard's rows, `dsinks[h] = −Σ_rows exp(sinks[h] − lse) · δ`
    /// (a sink's probability times the row's δ), as a block `[h]`: its rows' part of the whole.
    fn sink_gradient(&self, sinks: &Block, lse: &Block, delta: &Block, device: &B::Device)
    -> Block;

    /// δ = rowsum(dO ∘ O) `[b, h, t]` as a block where this kernel reads it; `d_out` is an operand
    /// block.
    fn delta(&self, d_out: &Block, out: Tensor<B, 4>) -> Block;

    /// One backward tile. The gradients of the side that stays accumulate into `stay` (dK and dV
    /// when the queries travel, dQ when the keys do); the travelling side's come back as fresh
    /// blocks for its accumulator, in the order dQ, or dK then dV.
    fn backward_tile(
        &self,
        tile: &BackwardTile<'_, Self::Shard>,
        stay: &mut [Block],
        travelling: Travelling,
    ) -> Vec<Block>;
}
