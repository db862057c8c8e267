//! The `Partition` trait, the validated `Layout` it produces, and the [`Workload`] a work-aware
//! strategy balances.

use crate::PartitionError;
use crate::visibility::Mask;

/// What one ring pass will cost on the machine, in the units a layout is compared in: seconds per
/// visible (q, k) pair and seconds a block takes over a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RingCosts {
    /// Seconds of one visible (q, k) pair's forward (FLOPs per pair over the device's rate).
    pub seconds_per_pair: f64,
    /// Seconds a block of keys and values takes over one link.
    pub link_seconds: f64,
}

impl RingCosts {
    /// The costs when the machine is not known: a pair costs 1, and a block of `block` tokens
    /// crosses a link in the time a rank computes a whole block of pairs (`block²`): the paper's
    /// knee, where a full block's compute just hides its transfer.
    pub fn at_the_knee(block: usize) -> Self {
        RingCosts {
            seconds_per_pair: 1.0,
            link_seconds: (block as f64).powi(2),
        }
    }
}

/// Layers of a model that attend by one mask: the unit a model's attention is described in (a
/// Gemma 3 is 5 windowed layers to 1 full one; a Mistral is all windowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaskedLayers {
    /// What these layers' queries see.
    pub mask: Mask,
    /// How many layers attend by it.
    pub layers: usize,
}

impl MaskedLayers {
    /// Every layer's mask, in layer order, grouped into distinct masks (in order of first
    /// appearance) with how many layers use each: a pass's time is a sum over layers, so the
    /// order of layers does not change it.
    pub fn group(masks: impl IntoIterator<Item = Mask>) -> Vec<MaskedLayers> {
        let mut groups: Vec<MaskedLayers> = Vec::new();
        for mask in masks {
            match groups.iter_mut().find(|g| g.mask == mask) {
                Some(group) => group.layers += 1,
                None => groups.push(MaskedLayers { mask, layers: 1 }),
            }
        }
        groups
    }
}

/// What a layout will be asked to compute: the documents packed in the sequence, the masks of the
/// model's layers, and the ring's costs (of the forward, and of the backward when training). A fixed strategy ignores it; a work-aware one
/// ([`crate::Balanced`]) minimizes the ring's simulated time summed over the layers
/// ([`crate::ring_time::workload_time`]).
#[derive(Debug, Clone)]
pub struct Workload<'a> {
    /// Documents laid end to end (empty: one).
    pub doc_lens: &'a [usize],
    /// The model's masks and how many layers attend by each (one entry: every layer alike). A
    /// layer count of 0 contributes nothing; a workload needs at least one layer.
    pub masks: Vec<MaskedLayers>,
    /// The machine's costs of a forward pass.
    pub costs: RingCosts,
    /// The costs of each layer's backward pass, when the layout serves training (a backward
    /// visits the blocks its forward did); `None`: the forward alone.
    pub backward: Option<RingCosts>,
}

impl<'a> Workload<'a> {
    /// The costs of every pass a layer runs: the forward's, then the backward's if any.
    pub fn passes(&self) -> impl Iterator<Item = &RingCosts> {
        std::iter::once(&self.costs).chain(&self.backward)
    }

    /// One causal mask over documents `doc_lens` with an optional sliding `window`, at the knee
    /// for blocks of `block` tokens.
    pub fn causal(doc_lens: &'a [usize], window: Option<usize>, block: usize) -> Self {
        Workload::single(
            doc_lens,
            Mask {
                causal: true,
                window,
            },
            RingCosts::at_the_knee(block),
        )
    }

    /// Every layer attending by `mask`.
    pub fn single(doc_lens: &'a [usize], mask: Mask, costs: RingCosts) -> Self {
        Workload {
            doc_lens,
            masks: vec![MaskedLayers { mask, layers: 1 }],
            costs,
            backward: None,
        }
    }

    /// Layers attending by `masks`, grouped ([`MaskedLayers::group`]).
    pub fn of_layers(
        doc_lens: &'a [usize],
        masks: impl IntoIterator<Item = Mask>,
        costs: RingCosts,
    ) -> Self {
        Workload {
            doc_lens,
            masks: MaskedLayers::group(masks),
            costs,
            backward: None,
        }
    }

    /// Layers in all: an error when there are none (nothing to balance for).
    pub fn check(&self, strategy: &'static str) -> Result<usize, PartitionError> {
        match self.masks.iter().map(|m| m.layers).sum() {
            0 => Err(PartitionError::NoLayers { strategy }),
            layers => Ok(layers),
        }
    }
}

/// How global token positions are spread over ranks.
///
/// Implementors say two things: which sequence lengths they accept for a rank count, and which global
/// positions a rank owns, in local order. Everything else is derived.
pub trait Partition: Send + Sync + std::fmt::Debug {
    /// The name used on the command line and in result tables.
    fn name(&self) -> &'static str;

    /// Checks that `seq_len` tokens can be split over `ranks` ranks.
    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError>;

    /// Global positions owned by `rank`, in local order. Only called after `validate` succeeded.
    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize>;

    /// Checks that a packed sequence (documents of `doc_lens` laid end to end, then padding up to
    /// `seq_len`) can be split. Default: documents do not matter, as [`Partition::validate`].
    fn validate_packed(
        &self,
        seq_len: usize,
        _doc_lens: &[usize],
        ranks: usize,
    ) -> Result<(), PartitionError> {
        self.validate(seq_len, ranks)
    }

    /// The positions `rank` owns in a packed sequence. Default: as [`Partition::owned_positions`].
    /// Shards may then differ in length.
    fn owned_positions_packed(
        &self,
        seq_len: usize,
        _doc_lens: &[usize],
        ranks: usize,
        rank: usize,
    ) -> Vec<usize> {
        self.owned_positions(seq_len, ranks, rank)
    }

    /// Validates and returns the positions of every rank of a packed sequence.
    fn layout_packed(
        &self,
        seq_len: usize,
        doc_lens: &[usize],
        ranks: usize,
    ) -> Result<Layout, PartitionError> {
        check_ranks(ranks)?;
        self.validate_packed(seq_len, doc_lens, ranks)?;
        let positions = (0..ranks)
            .map(|rank| self.owned_positions_packed(seq_len, doc_lens, ranks, rank))
            .collect();
        Ok(Layout {
            strategy: self.name(),
            seq_len,
            positions,
        })
    }

    /// Validates and returns the positions of every rank for `workload` (its documents, mask and
    /// costs). Default: the packed layout, whatever the mask and costs; a work-aware strategy
    /// overrides it.
    fn layout_for(
        &self,
        seq_len: usize,
        ranks: usize,
        workload: &Workload,
    ) -> Result<Layout, PartitionError> {
        self.layout_packed(seq_len, workload.doc_lens, ranks)
    }

    /// Validates and returns the positions of every rank.
    fn layout(&self, seq_len: usize, ranks: usize) -> Result<Layout, PartitionError> {
        check_ranks(ranks)?;
        self.validate(seq_len, ranks)?;
        let positions = (0..ranks)
            .map(|rank| self.owned_positions(seq_len, ranks, rank))
            .collect();
        Ok(Layout {
            strategy: self.name(),
            seq_len,
            positions,
        })
    }
}

/// The positions of every rank for one (strategy, length, ranks) triple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The strategy's name.
    pub strategy: &'static str,
    /// Tokens in the whole sequence.
    pub seq_len: usize,
    /// `positions[rank][local]` is the global position of a local token.
    pub positions: Vec<Vec<usize>>,
}

impl Layout {
    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.positions.len()
    }

    /// Local length of `rank`'s shard (equal for every rank, except where a strategy splits packed
    /// documents unevenly).
    pub fn shard_len(&self, rank: usize) -> usize {
        self.positions[rank].len()
    }

    /// The global positions `rank` owns, in local order, or an error for a rank past the last.
    pub fn rank_positions(&self, rank: usize) -> Result<&[usize], PartitionError> {
        self.positions
            .get(rank)
            .map(Vec::as_slice)
            .ok_or(PartitionError::RankOutOfRange {
                rank,
                ranks: self.ranks(),
            })
    }

    /// The layout of a grid of `self.ranks() × parts` ranks (head × context parallelism): rank
    /// `r · parts + i` owns the `i`-th of `parts` consecutive pieces of rank `r`'s positions here
    /// (piece `i` is local rows `i·t/parts .. (i+1)·t/parts`), so that the `parts` ranks of group `r`
    /// together hold rank `r`'s shard, in its order. An error if a shard has fewer than `parts` rows.
    pub fn split_ranks(&self, parts: usize) -> Result<Layout, PartitionError> {
        check_ranks(parts)?;
        let mut positions = Vec::with_capacity(self.ranks() * parts);
        for (rank, owned) in self.positions.iter().enumerate() {
            if owned.len() < parts {
                return Err(PartitionError::EmptyShard {
                    strategy: self.strategy,
                    rank: rank * parts + owned.len(),
                });
            }
            let t = owned.len();
            positions
                .extend((0..parts).map(|i| owned[i * t / parts..(i + 1) * t / parts].to_vec()));
        }
        Ok(Layout {
            strategy: self.strategy,
            seq_len: self.seq_len,
            positions,
        })
    }

    /// Splits rows of a sequence (`row_len` values per token, tokens in global order) into shards.
    pub fn shard<T: Copy>(&self, global: &[T], row_len: usize) -> Vec<Vec<T>> {
        self.positions
            .iter()
            .map(|owned| {
                let mut shard = Vec::with_capacity(owned.len() * row_len);
                for &pos in owned {
                    shard.extend_from_slice(&global[pos * row_len..(pos + 1) * row_len]);
                }
                shard
            })
            .collect()
    }

    /// Inverse of [`Layout::shard`]: puts each rank's rows back at their global positions.
    pub fn unshard<T: Copy + Default, S: AsRef<[T]>>(
        &self,
        shards: &[S],
        row_len: usize,
    ) -> Vec<T> {
        let mut global = vec![T::default(); self.seq_len * row_len];
        for (owned, shard) in self.positions.iter().zip(shards) {
            let shard = shard.as_ref();
            for (local, &pos) in owned.iter().enumerate() {
                global[pos * row_len..(pos + 1) * row_len]
                    .copy_from_slice(&shard[local * row_len..(local + 1) * row_len]);
            }
        }
        global
    }
}

/// The one rule on a rank count, checked wherever a layout (or a length for one) is made: at least 1.
pub fn check_ranks(ranks: usize) -> Result<(), PartitionError> {
    if ranks == 0 {
        Err(PartitionError::NoRanks { ranks })
    } else {
        Ok(())
    }
}

/// Shared check for strategies that need `seq_len % divisor == 0`.
pub(crate) fn require_divisible(
    strategy: &'static str,
    seq_len: usize,
    divisor: usize,
    rule: &'static str,
) -> Result<(), PartitionError> {
    if seq_len.is_multiple_of(divisor) {
        Ok(())
    } else {
        Err(PartitionError::NotDivisible {
            strategy,
            seq_len,
            divisor,
            rule,
        })
    }
}

/// The smallest length ≥ `len` that `partition` accepts for `ranks` ranks.
///
/// The search stops at `2 · len + 64 · ranks` (every registered strategy accepts a multiple of
/// `2 · ranks`); a strategy that accepts nothing up to there is an error naming that range.
pub fn padded_len(
    partition: &dyn Partition,
    len: usize,
    ranks: usize,
) -> Result<usize, PartitionError> {
    check_ranks(ranks)?;
    let (from, to) = (len.max(1), 2 * len.max(1) + 64 * ranks);
    (from..=to)
        .find(|&l| partition.validate(l, ranks).is_ok())
        .ok_or(PartitionError::NoLengthAccepted {
            strategy: partition.name(),
            from,
            to,
            ranks,
        })
}

/// The smallest length ≥ `len` that `partition` accepts for `ring` ranks and whose shards split into
/// `parts` equal pieces ([`Layout::split_ranks`]): with `parts > 1` a multiple of `ring · parts`;
/// `parts = 1` is [`padded_len`].
pub fn padded_grid_len(
    partition: &dyn Partition,
    len: usize,
    ring: usize,
    parts: usize,
) -> Result<usize, PartitionError> {
    check_ranks(ring)?;
    check_ranks(parts)?;
    let (from, to) = (len.max(1), 2 * len.max(1) + 64 * ring * parts);
    (from..=to)
        .find(|&l| {
            (parts == 1 || l.is_multiple_of(ring * parts)) && partition.validate(l, ring).is_ok()
        })
        .ok_or(PartitionError::NoLengthAccepted {
            strategy: partition.name(),
            from,
            to,
            ranks: ring * parts,
        })
}
