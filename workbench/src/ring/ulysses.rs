//! Head × context parallelism (DeepSpeed-Ulysses inside, the ring outside): the all-to-all that turns
//! a Ulysses group's sequence pieces into head shards and back, either way, and the rule on the
//! degree. `op.rs` makes it a differentiable op and wraps the ring in it; the ring loop is untouched.
//!
//! A group of U ranks holds one ring shard in U pieces, every head. To heads: member i receives
//! every member's piece of its heads (`heads[i]`), so it holds the whole shard for those heads, and
//! runs the ring with the members i of the other groups. To tokens is the adjoint: each member sends
//! back every other member's piece of its heads, and a head held by several members (key/value heads
//! replicated under grouped-query attention) is their sum. Each is the other's backward.

use crate::block::{Block, BlockKind};
use crate::dtype::Dtype;
use crate::error::{RingError, TransportError};
use crate::host::HostRead;
use crate::primitive::{unwrap, wrap};
use crate::ring::context::{HeadParallel, RingContext};
use crate::transport::Group;
use burn::tensor::ops::FloatTensor;
use std::ops::Range;
use std::sync::Arc;

/// An error unless `ulysses` splits `heads` query heads, and splits `kv_heads` key/value heads or is
/// a multiple of them (each member then holds one key/value head, replicated), on `ranks` ranks.
pub fn check_heads(
    ulysses: usize,
    ranks: usize,
    heads: usize,
    kv_heads: usize,
) -> Result<(), RingError> {
    let fail = |rule: String| {
        Err(RingError::Ulysses {
            ulysses,
            ranks,
            rule,
        })
    };
    if ulysses == 0 || !ranks.is_multiple_of(ulysses) {
        return fail(format!("the Ulysses degree must divide the {ranks} ranks"));
    }
    if !heads.is_multiple_of(ulysses) {
        return fail(format!("it must divide the {heads} query heads"));
    }
    if kv_heads >= ulysses && !kv_heads.is_multiple_of(ulysses) {
        return fail(format!(
            "it must divide the {kv_heads} key/value heads (or be a multiple of them)"
        ));
    }
    if kv_heads < ulysses && !ulysses.is_multiple_of(kv_heads.max(1)) {
        return fail(format!(
            "it must be a multiple of the {kv_heads} key/value heads (or divide them)"
        ));
    }
    Ok(())
}

/// The query heads member `i` of `u` holds: a contiguous `heads / u`.
pub(crate) fn query_heads(heads: usize, u: usize) -> Vec<Range<usize>> {
    (0..u).map(|i| i * heads / u..(i + 1) * heads / u).collect()
}

/// The key/value heads member `i` of `u` holds: `kv_heads / u` of them when there are at least `u`,
/// else the one its query heads read (`i · kv_heads / u`), replicated on `u / kv_heads` members.
pub(crate) fn kv_heads_of(kv_heads: usize, u: usize) -> Vec<Range<usize>> {
    if kv_heads >= u {
        query_heads(kv_heads, u)
    } else {
        (0..u)
            .map(|i| i * kv_heads / u..i * kv_heads / u + 1)
            .collect()
    }
}

/// Which way an exchange goes; each is the other's adjoint (and backward).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// `[b, H, piece, d]` on each member → `[b, heads[me], shard, d]`.
    ToHeads,
    /// The adjoint: `[b, heads[me], shard, d]` → `[b, H, piece, d]`, replicated heads summed.
    ToTokens,
}

impl Way {
    /// The other way: this way's backward.
    pub(crate) fn adjoint(self) -> Self {
        match self {
            Way::ToHeads => Way::ToTokens,
            Way::ToTokens => Way::ToHeads,
        }
    }
}

/// One tensor's all-to-all within a Ulysses group, either way.
#[derive(Debug)]
pub struct HeadsExchange {
    group: Group,
    /// The ring context: its communicator carries the messages, and a failed backward is parked there.
    ring: Arc<RingContext>,
    /// The heads each member holds after [`Way::ToHeads`].
    heads: Vec<Range<usize>>,
    /// All heads of the tensor.
    total_heads: usize,
    /// Each member's piece of the shard: its tokens.
    pieces: Vec<usize>,
    /// What the blocks are, going to heads and going to tokens.
    kinds: [BlockKind; 2],
    /// The type they travel in.
    dtype: Dtype,
}

impl HeadsExchange {
    /// Parks the error of a backward exchange on the ring's context (a backward cannot return it).
    pub(crate) fn park(&self, error: RingError) {
        self.ring.set_backward_error(error);
    }

    /// Runs the exchange on this member's host values `x` of `dims`; returns the result and its dims.
    pub(crate) fn run<B: HostRead>(
        &self,
        x: &[f32],
        dims: [usize; 4],
        way: Way,
        device: &B::Device,
    ) -> Result<(Vec<f32>, [usize; 4]), RingError> {
        let (me, n) = (self.group.rank(), self.group.size());
        let [b, _, _, d] = dims;
        let shard: usize = self.pieces.iter().sum();
        let offsets: Vec<usize> = self
            .pieces
            .iter()
            .scan(0, |at, &t| {
                *at += t;
                Some(*at - t)
            })
            .collect();
        let mine = self.heads[me].len();
        let (expected, kind) = match way {
            Way::ToHeads => ([b, self.total_heads, self.pieces[me], d], self.kinds[0]),
            Way::ToTokens => ([b, mine, shard, d], self.kinds[1]),
        };
        if dims != expected {
            return Err(RingError::Shape {
                what: "a Ulysses exchange's input [b, heads, tokens, d]",
                expected: expected.to_vec(),
                got: dims.to_vec(),
            });
        }
        // What goes to member i: (its heads, my tokens) to heads; (my heads, its tokens) to tokens.
        let part = |i: usize| -> (Range<usize>, Range<usize>) {
            match way {
                Way::ToHeads => (self.heads[i].clone(), 0..self.pieces[me]),
                Way::ToTokens => (0..mine, offsets[i]..offsets[i] + self.pieces[i]),
            }
        };
        let payloads = (0..n)
            .map(|i| {
                let (heads, tokens) = part(i);
                let data = select(x, dims, &heads, &tokens);
                let shape = vec![b, heads.len(), tokens.len(), d];
                let block = Block::host(kind, shape, data).in_dtype::<B>(self.dtype, device);
                vec![Arc::new(block)]
            })
            .collect();
        let received = {
            let mut world = self.ring.comm();
            let mut comm = world.in_group(&self.group);
            comm.all_to_all(payloads)?
        };
        // From member m: (my heads, its tokens) to heads; (its heads, my tokens) to tokens.
        let out_dims = match way {
            Way::ToHeads => [b, mine, shard, d],
            Way::ToTokens => [b, self.total_heads, self.pieces[me], d],
        };
        let mut out = vec![0.0f32; out_dims.iter().product()];
        for (m, payload) in received.iter().enumerate() {
            let (heads, tokens) = match way {
                Way::ToHeads => (0..mine, offsets[m]..offsets[m] + self.pieces[m]),
                Way::ToTokens => (self.heads[m].clone(), 0..self.pieces[me]),
            };
            let want = b * heads.len() * tokens.len() * d;
            let block = payload.first().filter(|blk| blk.len() == want).ok_or(
                TransportError::LengthMismatch {
                    rank: self.group.world_rank(me),
                    peer: self.group.world_rank(m),
                    expected: want,
                    got: payload.first().map_or(0, |blk| blk.len()),
                },
            )?;
            add_into(&mut out, out_dims, &heads, &tokens, &block.host_values());
        }
        Ok((out, out_dims))
    }
}

/// `x[:, heads, tokens, :]` of `x` laid out `dims`.
fn select(x: &[f32], dims: [usize; 4], heads: &Range<usize>, tokens: &Range<usize>) -> Vec<f32> {
    let [b, h, t, d] = dims;
    let mut out = Vec::with_capacity(b * heads.len() * tokens.len() * d);
    for bi in 0..b {
        for hi in heads.clone() {
            let row = ((bi * h + hi) * t + tokens.start) * d;
            out.extend_from_slice(&x[row..row + tokens.len() * d]);
        }
    }
    debug_assert!(out.len() == b * heads.len() * tokens.len() * d && heads.end <= h);
    out
}

/// `out[:, heads, tokens, :] += part` (`part` laid out `[b, heads.len(), tokens.len(), d]`).
fn add_into(
    out: &mut [f32],
    dims: [usize; 4],
    heads: &Range<usize>,
    tokens: &Range<usize>,
    part: &[f32],
) {
    let [b, h, t, d] = dims;
    let width = tokens.len() * d;
    let mut rows = part.chunks_exact(width.max(1));
    for bi in 0..b {
        for hi in heads.clone() {
            let at = ((bi * h + hi) * t + tokens.start) * d;
            if let Some(row) = rows.next() {
                for (o, x) in out[at..at + width].iter_mut().zip(row) {
                    *o += x;
                }
            }
        }
    }
}

/// The exchange of a tensor of `total_heads` heads split as `heads`, its blocks `kinds`.
pub(crate) fn exchange(
    heads: &HeadParallel,
    pieces: &[usize],
    split: Vec<Range<usize>>,
    total_heads: usize,
    kinds: [BlockKind; 2],
    dtype: Dtype,
) -> Arc<HeadsExchange> {
    Arc::new(HeadsExchange {
        group: heads.group.clone(),
        ring: heads.ring.clone(),
        heads: split,
        total_heads,
        pieces: pieces.to_vec(),
        kinds,
        dtype,
    })
}

/// The exchange on the host: what `RingBackend::heads_exchange` does on every backend.
pub(crate) fn exchange_on_host<B: HostRead>(
    x: FloatTensor<B>,
    plan: &HeadsExchange,
    way: Way,
) -> Result<FloatTensor<B>, RingError> {
    let x = wrap::<B, 4>(x);
    let (device, dims) = (x.device(), x.dims());
    let (data, dims) = plan.run::<B>(&crate::host::read(x), dims, way, &device)?;
    Ok(unwrap(crate::host::place::<B, 4>(data, dims, &device)))
}

/// What the backward of an exchange needs: the exchange, its way (the backward goes the other), and
/// the input's shape (for zeros when the backward fails).
#[derive(Debug, Clone)]
pub(crate) struct ExchangeState {
    pub(crate) plan: Arc<HeadsExchange>,
    pub(crate) way: Way,
    pub(crate) input: [usize; 4],
}
