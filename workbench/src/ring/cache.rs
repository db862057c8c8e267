//! One rank's share of a decoding batch's key/value cache: for each sequence (a batch row) and each
//! layer, the keys and values this rank holds (after RoPE, at their global positions): the part the
//! prefill left on it (the strategy's shard, padding dropped) and the decoded tokens placed on it
//! since. No rank holds the whole cache. The one placement rule for a new token: the rank holding
//! the fewest of its sequence's keys (the lowest such rank on a tie), which every rank applies alike
//! from counts every rank keeps, and which keeps the cache balanced whatever the prefill's strategy.
//!
//! # Shapes
//! A layer's keys and values of one sequence on one rank: `[1, hk, t, d]`.

use crate::block::{Block, BlockKind};
use crate::dtype::Precision;
use crate::error::RingError;
use crate::host::HostRead;
use crate::kernels::{Kernel, TileKernel, WithKernel, with_kernel};
use crate::ring::sequence::Sequence;
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;
use strategies::Layout;

/// A layer's keys and values of one sequence on this rank.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv<B: HostRead> {
    /// The prefill's keys and values, as the cache's kernel reads its operands (host blocks for
    /// the fused CPU kernel, device tensors otherwise), in the run's element type.
    pub(crate) prefill: Option<[Arc<Block>; 2]>,
    /// The decoded tokens' keys and values placed here, `[1, hk, n, d]` each.
    pub(crate) decoded: Option<[Tensor<B, 4>; 2]>,
}

/// One sequence's part of the cache on this rank.
#[derive(Debug, Clone)]
pub(crate) struct RowCache<B: HostRead> {
    /// Its tokens so far, prompt and decoded (the decoded continue its last document).
    pub(crate) sequence: Sequence,
    /// Keys of this sequence each rank holds.
    pub(crate) counts: Vec<usize>,
    /// This rank's keys' positions: the prefill's, then the decoded ones'.
    pub(crate) positions: Vec<usize>,
    /// How many of `positions` the prefill left.
    pub(crate) prefilled: usize,
    /// The local indices of the prefill's real positions on this rank, when its shard also held
    /// padding (which is dropped).
    keep: Option<Vec<i64>>,
    /// Per layer.
    pub(crate) layers: Vec<LayerKv<B>>,
}

impl<B: HostRead> RowCache<B> {
    /// The prefill's positions on this rank.
    pub(crate) fn prefill_positions(&self) -> &[usize] {
        &self.positions[..self.prefilled]
    }

    /// The decoded tokens' positions on this rank.
    pub(crate) fn decoded_positions(&self) -> &[usize] {
        &self.positions[self.prefilled..]
    }
}

/// One rank's share of a batch's key/value cache.
#[derive(Debug, Clone)]
pub struct KvCache<B: HostRead> {
    rank: usize,
    world: usize,
    layers: usize,
    /// Most tokens a sequence may hold, prompt and decoded.
    capacity: usize,
    /// Which kernel reads the prefill blocks, in which element types.
    pub(crate) kernel: Kernel,
    pub(crate) precision: Precision,
    pub(crate) rows: Vec<RowCache<B>>,
}

impl<B: HostRead> KvCache<B> {
    /// An empty cache of rank `rank` of `world`, for `layers` layers and sequences of at most
    /// `capacity` tokens, read by `kernel` in `precision`.
    pub fn new(
        (rank, world): (usize, usize),
        layers: usize,
        capacity: usize,
        kernel: Kernel,
        precision: Precision,
    ) -> Self {
        KvCache {
            rank,
            world,
            layers,
            capacity,
            kernel,
            precision,
            rows: Vec::new(),
        }
    }

    /// Adds a sequence (`sequence`: its real tokens and documents) whose prefill ran on `layout`;
    /// returns its row. An error when it is empty or longer than the cache's capacity.
    pub fn add_row(&mut self, layout: &Layout, sequence: Sequence) -> Result<usize, RingError> {
        if sequence.len == 0 {
            return Err(RingError::EmptyPrompt {
                row: self.rows.len(),
            });
        }
        if sequence.len > self.capacity {
            return Err(RingError::CacheFull {
                row: self.rows.len(),
                len: sequence.len,
                capacity: self.capacity,
            });
        }
        sequence.check(layout.seq_len)?;
        if layout.ranks() != self.world {
            return Err(RingError::WorldMismatch {
                world: self.world,
                layout: layout.ranks(),
            });
        }
        let real = |r: usize| {
            layout.positions[r]
                .iter()
                .filter(|&&p| p < sequence.len)
                .count()
        };
        let shard = &layout.positions[self.rank];
        let positions: Vec<usize> = shard
            .iter()
            .copied()
            .filter(|&p| p < sequence.len)
            .collect();
        let keep = (positions.len() < shard.len()).then(|| {
            (0..shard.len() as i64)
                .filter(|&i| shard[i as usize] < sequence.len)
                .collect()
        });
        self.rows.push(RowCache {
            counts: (0..self.world).map(real).collect(),
            prefilled: positions.len(),
            keep,
            positions,
            sequence,
            layers: vec![
                LayerKv {
                    prefill: None,
                    decoded: None,
                };
                self.layers
            ],
        });
        Ok(self.rows.len() - 1)
    }

    /// Keeps this rank's prefill keys and values of `row` at `layer`: `[1, hk, t, d]` in the order of
    /// the layout's positions on this rank, padding included (it is dropped here).
    pub fn insert_prefill(&mut self, row: usize, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) {
        let (k, v) = match &self.rows[row].keep {
            Some(keep) => {
                let index = Tensor::<B, 1, Int>::from_data(
                    TensorData::new(keep.clone(), [keep.len()]),
                    &k.device(),
                );
                (k.select(2, index.clone()), v.select(2, index))
            }
            None => (k, v),
        };
        let blocks = with_kernel(
            self.kernel,
            Operands::<B> {
                tensors: [k, v],
                precision: self.precision,
            },
        );
        self.rows[row].layers[layer].prefill = Some(blocks);
    }

    /// The next token of `row`: its position and the rank it is placed on (the rank holding the
    /// fewest of the sequence's keys, the lowest on a tie), counted there from now on. An error when
    /// the sequence would outgrow the cache's capacity.
    pub fn start_token(&mut self, row: usize) -> Result<(usize, usize), RingError> {
        let capacity = self.capacity;
        let me = self.rank;
        let cache = &mut self.rows[row];
        let position = cache.sequence.len;
        if position + 1 > capacity {
            return Err(RingError::CacheFull {
                row,
                len: position + 1,
                capacity,
            });
        }
        let place = (0..cache.counts.len())
            .min_by_key(|&r| (cache.counts[r], r))
            .expect("at least one rank");
        cache.counts[place] += 1;
        cache.sequence.len += 1;
        if let Some(last) = cache.sequence.doc_lens.last_mut() {
            *last += 1;
        }
        if place == me {
            cache.positions.push(position);
        }
        Ok((position, place))
    }

    /// The new token's key and value of `row` at `layer` (`[1, hk, 1, d]`, computed on every rank),
    /// kept when the token was placed on this rank.
    pub fn append(
        &mut self,
        row: usize,
        layer: usize,
        place: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) {
        if place != self.rank {
            return;
        }
        let slot = &mut self.rows[row].layers[layer].decoded;
        *slot = Some(match slot.take() {
            None => [k, v],
            Some([ks, vs]) => [Tensor::cat(vec![ks, k], 2), Tensor::cat(vec![vs, v], 2)],
        });
    }

    /// The keys of `row` each rank holds.
    pub fn counts(&self, row: usize) -> &[usize] {
        &self.rows[row].counts
    }

    /// The tokens of `row` so far (its sequence: length and documents).
    pub fn sequence(&self, row: usize) -> &Sequence {
        &self.rows[row].sequence
    }

    /// Rows of the cache.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Bytes this rank's cache holds: every layer's keys and values of every row.
    pub fn bytes(&self) -> u64 {
        self.rows
            .iter()
            .flat_map(|r| &r.layers)
            .map(|l| {
                let prefill: u64 = l.prefill.iter().flatten().map(|b| b.bytes()).sum();
                let decoded: u64 = l
                    .decoded
                    .iter()
                    .flatten()
                    // Decoded keys are kept in f32 and rounded as they are read.
                    .map(|t| (t.shape().num_elements() * std::mem::size_of::<f32>()) as u64)
                    .sum();
                prefill + decoded
            })
            .sum()
    }
}

/// Keys and values as the cache's kernel reads its operands, in the run's element type.
struct Operands<B: HostRead> {
    tensors: [Tensor<B, 4>; 2],
    precision: Precision,
}

impl<B: HostRead> WithKernel<B> for Operands<B> {
    type Output = [Arc<Block>; 2];
    fn run<K: TileKernel<B>>(self, kernel: &K) -> [Arc<Block>; 2] {
        let [k, v] = self.tensors;
        let device = k.device();
        let operand = |kind, t: Tensor<B, 4>| {
            Arc::new(
                kernel
                    .operand(kind, t)
                    .in_dtype::<B>(self.precision.dtype, &device),
            )
        };
        [operand(BlockKind::K, k), operand(BlockKind::V, v)]
    }
}
