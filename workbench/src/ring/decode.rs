//! Decoding over a sequence-sharded KV cache: each new token's query meets every rank's cached keys
//! of its sequence. Each rank attends the queries to the keys it holds with the ring's own tile
//! kernel (a tile of one query row: causal, documents, windows, soft cap, GQA, bf16, as the ring
//! does; a part none of whose keys the query sees is skipped), giving a [`Partial`] per row; the
//! ranks' partials are merged exactly by one of two collectives, and the sinks joined once. Every
//! rank ends with the same bits, so every rank picks the same next token.
//!
//! - [`DecodeMerge::AllGather`]: every rank's partials to every rank in one collective (N − 1
//!   messages a rank, all posted at once, as decode context parallelism does), merged in rank order.
//! - [`DecodeMerge::Ring`]: a ring all-reduce whose sum is the merge: the rows split into N chunks,
//!   each merged on the way round the ring (reduce-scatter, N − 1 hops), then passed round whole
//!   (all-gather, N − 1 hops): 2(N − 1)/N of a partial a rank, in 2(N − 1) sequential hops.
//!
//! A rank's bytes per token depend on heads × head_dim × ranks, never on the context's length.

use crate::block::BlockKind;
use crate::error::RingError;
use crate::host::{self, HostRead};
use crate::kernels::flops::FORWARD_PER_PAIR_DIM;
use crate::kernels::mask::{Visibility, windows};
use crate::kernels::{ForwardTile, Keys, Queries, Scores, TileKernel, WithKernel, with_kernel};
use crate::ring::cache::KvCache;
use crate::ring::context::{Attend, RingContext, StepEvent};
use crate::ring::partial::Partial;
use crate::transport::{GroupComm, Phase};
use burn::tensor::{Tensor, TensorData};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

/// How the ranks' partial attention of a decoded token is merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DecodeMerge {
    /// Every rank's partials to every rank in one collective; merged in rank order on each.
    #[default]
    AllGather,
    /// A ring all-reduce whose sum is the merge (reduce-scatter, then all-gather).
    Ring,
}

impl DecodeMerge {
    /// Both, in the order tables list them.
    pub const ALL: [DecodeMerge; 2] = [DecodeMerge::AllGather, DecodeMerge::Ring];

    /// Its name (`--merge`, `merges = [...]`): `allgather` or `ring`.
    pub fn name(self) -> &'static str {
        match self {
            DecodeMerge::AllGather => "allgather",
            DecodeMerge::Ring => "ring",
        }
    }
}

impl fmt::Display for DecodeMerge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DecodeMerge {
    type Err = RingError;
    fn from_str(s: &str) -> Result<Self, RingError> {
        DecodeMerge::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| RingError::UnknownOption {
                what: "decode merge",
                got: s.into(),
                expected: "allgather, ring",
            })
    }
}

/// Attention at `layer` of each active row's new query to every rank's cached keys of its sequence.
/// `rows[i]` is the cache row of query `i`, whose token [`KvCache::start_token`] has placed and
/// [`KvCache::append`] has cached at this layer; `q` is `[1, h, R, d]` for the R active rows, the same
/// on every rank. Returns `[1, h, R, d]`, the same bits on every rank.
pub fn attend_cached<B: HostRead>(
    ctx: &RingContext,
    cache: &KvCache<B>,
    layer: usize,
    rows: &[usize],
    q: Tensor<B, 4>,
    sinks: Option<Tensor<B, 1>>,
    (attend, merge): (Attend, DecodeMerge),
) -> Result<Tensor<B, 4>, RingError> {
    attend.check()?;
    if ctx.ulysses() > 1 {
        return Err(RingError::Ulysses {
            ulysses: ctx.ulysses(),
            ranks: ctx.world(),
            rule: "decoding runs on the ring alone (Ulysses degree 1)".into(),
        });
    }
    if cache.kernel != ctx.config.kernel {
        return Err(RingError::UnknownOption {
            what: "kernel of a cache read by another kernel",
            got: ctx.config.kernel.name().into(),
            expected: cache.kernel.name(),
        });
    }
    let [_, heads, active, head_dim] = q.dims();
    if active != rows.len() {
        return Err(RingError::Shape {
            what: "decode queries [1, heads, active rows, head_dim]",
            expected: vec![1, heads, rows.len(), head_dim],
            got: q.dims().to_vec(),
        });
    }
    let device = q.device();
    let mine = with_kernel(
        ctx.config.kernel,
        LocalParts {
            ctx,
            cache,
            layer,
            rows,
            q,
            attend,
        },
    )?;
    let merging = Instant::now();
    let mut merged = {
        let mut world = ctx.comm();
        let mut comm = world.in_group(ctx.group());
        match merge {
            DecodeMerge::AllGather => merge_all_gathered(&mut comm, mine)?,
            DecodeMerge::Ring => merge_round_the_ring(&mut comm, mine, ctx.config.forward)?,
        }
    };
    // The ranks' partials exchanged (the ring track shows the messages) and merged.
    ctx.traced("merge decode", merging);
    if let Some(sinks) = sinks {
        let sinks = host::read(sinks);
        let per_row: Vec<f32> = (0..active).flat_map(|_| sinks.iter().copied()).collect();
        merged.join_sinks(&per_row);
    }
    // Rows are (query, head) pairs: [R, h, d] → [1, h, R, d].
    let out = Tensor::<B, 4>::from_data(
        TensorData::new(merged.out, [1, active, heads, head_dim]),
        &device,
    )
    .swap_dims(1, 2);
    host::count_bytes((active * heads * head_dim * std::mem::size_of::<f32>()) as u64);
    Ok(crate::ring::engine::rounded(
        out,
        ctx.config.precision.dtype,
    ))
}

/// This rank's partials of every active row: `[R · h]` rows of `(query, head)`.
struct LocalParts<'a, B: HostRead> {
    ctx: &'a RingContext,
    cache: &'a KvCache<B>,
    layer: usize,
    rows: &'a [usize],
    q: Tensor<B, 4>,
    attend: Attend,
}

impl<B: HostRead> WithKernel<B> for LocalParts<'_, B> {
    type Output = Result<Partial, RingError>;

    fn run<K: TileKernel<B>>(self, kernel: &K) -> Self::Output {
        let LocalParts {
            ctx,
            cache,
            layer,
            rows,
            q,
            attend,
        } = self;
        let [_, heads, active, head_dim] = q.dims();
        let precision = cache.precision;
        let device = q.device();
        kernel.implementation(&device, precision)?;
        let scores = Scores {
            scale: attend
                .scale
                .unwrap_or_else(|| 1.0 / (head_dim as f32).sqrt()),
            softcap: attend.softcap,
            precision,
        };
        let mut parts = Partial::empty(active * heads, head_dim);
        let start = Instant::now();
        let mut pairs = 0u64;
        for (i, &row) in rows.iter().enumerate() {
            let cached = &cache.rows[row];
            let layer_kv = &cached.layers[layer];
            // The query's position: the token `start_token` placed last.
            let position = cached.sequence.len - 1;
            let window = windows(
                &[position],
                cached.sequence.len,
                &cached.sequence.doc_lens,
                attend.mask(),
            );
            let decoded = layer_kv.decoded.as_ref().map(|[k, v]| {
                [(BlockKind::K, k), (BlockKind::V, v)].map(|(kind, t)| {
                    Arc::new(
                        kernel
                            .operand(kind, t.clone())
                            .in_dtype::<B>(precision.dtype, &device),
                    )
                })
            });
            let sources = [
                (layer_kv.prefill.clone(), cached.prefill_positions()),
                (decoded, cached.decoded_positions()),
            ];
            let seen: Vec<_> = sources
                .iter()
                .filter_map(|(blocks, positions)| {
                    let blocks = blocks.as_ref().filter(|_| !positions.is_empty())?;
                    let visibility = Visibility::of(&window, positions);
                    (visibility != Visibility::None).then_some((blocks, *positions, visibility))
                })
                .collect();
            if seen.is_empty() {
                continue; // every key this rank holds lies outside the query's window
            }
            let q_row = q.clone().slice([0..1, 0..heads, i..i + 1, 0..head_dim]);
            let q_block = Arc::new(
                kernel
                    .operand(BlockKind::Q, q_row)
                    .in_dtype::<B>(precision.dtype, &device),
            );
            let query_shard = kernel.shard(&window, &[position], &device)?;
            let kv_heads = seen[0].0[0].shape[1];
            let mut state = kernel.forward_start(
                &q_block,
                kv_heads,
                Queries {
                    windows: &window,
                    prepared: &query_shard,
                },
                scores,
                ctx.world() == 1,
            );
            for (blocks, positions, visibility) in seen {
                let key_shard = kernel.shard(&[], positions, &device)?;
                kernel.forward_tile(
                    &mut state,
                    ForwardTile {
                        k: &blocks[0],
                        v: &blocks[1],
                        keys: Keys {
                            positions,
                            prepared: &key_shard,
                        },
                        visibility,
                    },
                );
                pairs += visibility.pairs(1, positions.len()) * heads as u64;
            }
            let (out, lse) = kernel.forward_finish(state, None, &device);
            let part = Partial {
                out: host::read(out),
                lse: host::read(lse),
                head_dim,
            };
            parts.set_rows(i * heads, &part);
        }
        ctx.record(
            StepEvent {
                phase: Phase::Decode,
                step: layer,
                peer_block: ctx.rank(),
                pairs,
                flops: FORWARD_PER_PAIR_DIM * pairs * head_dim as u64,
                compute_seconds: start.elapsed().as_secs_f64(),
            },
            (start, "cached"),
        );
        Ok(parts)
    }
}

/// Every member's partials to every member, merged in member order: the same bits everywhere.
fn merge_all_gathered(comm: &mut GroupComm<'_>, mine: Partial) -> Result<Partial, RingError> {
    let (rows, d) = (mine.rows(), mine.head_dim);
    let me = comm.rank();
    let all = comm.all_gather(Phase::Decode, mine.to_payload())?;
    let mut merged = Partial::empty(rows, d);
    for (peer, payload) in all.iter().enumerate() {
        if peer == me {
            merged.merge(&mine);
        } else {
            merged.merge(&Partial::from_payload(payload, rows, d, (me, peer))?);
        }
    }
    Ok(merged)
}

/// The rows of chunk `c` of `n` over `rows` rows.
fn chunk(c: usize, n: usize, rows: usize) -> std::ops::Range<usize> {
    c * rows / n..(c + 1) * rows / n
}

/// A ring all-reduce of partials whose sum is the merge: chunk `c` of the rows starts on member `c`
/// and gathers each next member's part on its way round (reduce-scatter: after N − 1 hops member
/// `c − 1` holds it whole); the whole chunks then go round once more (all-gather). Each chunk is
/// merged once, in one order, and copied: the same bits on every member.
fn merge_round_the_ring(
    comm: &mut GroupComm<'_>,
    mine: Partial,
    direction: crate::ring::context::Direction,
) -> Result<Partial, RingError> {
    let (me, n) = (comm.rank(), comm.world());
    let (rows, d) = (mine.rows(), mine.head_dim);
    let (next, prev) = (direction.next(me, n), direction.prev(me, n));
    // The chunk index this member holds `hops` hops after it held its own, going round `direction`.
    let travelled = |member: usize, hops: usize| direction.owner(member, hops, n);
    let mut acc = mine.clone();
    for step in 0..n.saturating_sub(1) {
        let (send, receive) = (travelled(me, step), travelled(me, step + 1));
        let sent = acc.slice(chunk(send, n, rows)).to_payload();
        let pending = comm.exchange(Phase::Decode, step, next, prev, sent)?;
        let got = comm.wait(pending)?;
        let range = chunk(receive, n, rows);
        let mut part = Partial::from_payload(&got, range.len(), d, (me, prev))?;
        part.merge(&mine.slice(range.clone()));
        acc.set_rows(range.start, &part);
    }
    // This member now holds chunk `travelled(me, n − 1)` whole; pass the whole chunks round.
    for step in 0..n.saturating_sub(1) {
        let (send, receive) = (travelled(me, n - 1 + step), travelled(me, n + step));
        let sent = acc.slice(chunk(send, n, rows)).to_payload();
        let pending = comm.exchange(Phase::Decode, n - 1 + step, next, prev, sent)?;
        let got = comm.wait(pending)?;
        let range = chunk(receive, n, rows);
        let part = Partial::from_payload(&got, range.len(), d, (me, prev))?;
        acc.set_rows(range.start, &part);
    }
    Ok(acc)
}
