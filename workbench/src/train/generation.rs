//! Decoding (greedy, or sampled: `sampling.rs`) with a trained model on N ranks: by default a
//! prefill of each prompt through the ring into a KV cache sharded over the ranks, then one token a
//! step attended to every rank's cached keys and merged (`ring::decode`); or, as the check, the full
//! sequence run through the ring again for every new token.

use crate::error::{RingError, all_or_root_cause};
use crate::host;
use crate::model::Llama;
use crate::model::layer::LayerBackend;
use crate::ring::cache::KvCache;
use crate::ring::context::{RingConfig, RingContext, Sequence};
use crate::ring::decode::DecodeMerge;
use crate::train::objective::layout_for_layers;
use crate::train::sampling::Sampling;
use crate::transport::{Comm, Phase, run_ranks};
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strategies::{Partition, padded_len};

/// Whether a reply is over, given its prompt's index and its tokens so far.
pub type StopReply<'a> = dyn Fn(usize, &[u32]) -> bool + Sync + 'a;

/// How [`greedy`] decodes and where it runs.
#[derive(Clone, Copy)]
pub struct Decoding<'a> {
    /// Tokens to generate at most.
    pub max_new: usize,
    /// Generation of a row ends at any of these tokens (not included in the reply; see
    /// [`Decoded::ended_by`]).
    pub stop: &'a [u32],
    /// Pads a recomputed batch's rows to one length the partition accepts (causal attention keeps
    /// it out of real positions).
    pub pad: u32,
    /// Which positions each rank owns in the prefill (and in every recompute).
    pub partition: &'a dyn Partition,
    /// Ranks to run.
    pub ranks: usize,
    /// How long a rank waits for a silent peer.
    pub timeout: Duration,
    /// The KV cache's merge of the ranks' partial attention; `None`: no cache, the whole sequence
    /// recomputed for every new token.
    pub cache: Option<DecodeMerge>,
    /// Prompts decoded together, in one cache (0: all of them).
    pub batch: usize,
    /// Told, on rank 0, how many prompts' replies each batch finished (a progress bar).
    pub on_batch: Option<&'a (dyn Fn(usize) + Sync)>,
    /// Whether [`Decoded::logits`] keeps the logits every reply token was picked from (the
    /// exactness checks' input: a reply's length times the vocabulary per prompt).
    pub keep_logits: bool,
    /// How each token is picked from its logits (greedy by default).
    pub sampling: Sampling,
    /// Ends a row's reply once it returns true for (the prompt's index, the reply so far): a stop
    /// string, say. Every rank asks it of the same tokens, so all agree.
    pub stop_reply: Option<&'a StopReply<'a>>,
}

impl Decoding<'_> {
    /// Prompts decoded together out of `prompts` (`batch` 0: all of them).
    fn batch_size(&self, prompts: usize) -> usize {
        match self.batch {
            0 => prompts.max(1),
            b => b,
        }
    }
}

impl std::fmt::Debug for Decoding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoding")
            .field("max_new", &self.max_new)
            .field("stop", &self.stop)
            .field("pad", &self.pad)
            .field("ranks", &self.ranks)
            .field("timeout", &self.timeout)
            .field("cache", &self.cache)
            .field("batch", &self.batch)
            .field("keep_logits", &self.keep_logits)
            .field("sampling", &self.sampling)
            .field("stop_reply", &self.stop_reply.is_some())
            .finish_non_exhaustive()
    }
}

/// A prompt: its tokens, packed as documents of `doc_lens` (empty: one document). Decoding
/// continues its last document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompt {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Its documents' lengths, summing to its length; empty: one document.
    pub doc_lens: Vec<usize>,
}

impl From<Vec<u32>> for Prompt {
    fn from(tokens: Vec<u32>) -> Self {
        Prompt {
            tokens,
            doc_lens: Vec::new(),
        }
    }
}

/// What a decoding run produced and what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Each prompt's reply (the stop token not included).
    pub replies: Vec<Vec<u32>>,
    /// Per prompt: seconds of its prefill (0 without a cache).
    pub prefill_seconds: Vec<f64>,
    /// Per prompt: its share of the seconds of its batch's token steps after the prefill (by the
    /// tokens it decoded; without a cache, the seconds of its recomputes).
    pub decode_seconds: Vec<f64>,
    /// Per prompt: the stop token that ended its reply, or `None` when it ran to `max_new`.
    pub ended_by: Vec<Option<u32>>,
    /// Per prompt: tokens run through a decoding step (its reply's tokens but the last).
    pub decoded_tokens: Vec<usize>,
    /// Per rank: bytes sent merging decoded tokens' attention ([`Phase::Decode`]); under a
    /// launcher only this process's rank is known (the others 0).
    pub decode_bytes: Vec<u64>,
    /// Per rank: the most bytes its KV cache held (0 without a cache, or where unknown).
    pub cache_bytes: Vec<u64>,
    /// Per rank: the keys of the last batch's rows it held after their last step.
    pub cache_keys: Vec<usize>,
    /// With [`Decoding::keep_logits`], per prompt: the logits each token was picked from, one row of
    /// the vocabulary a step (`[steps, vocab]` flat): step `i` follows the prompt's last token and
    /// the reply's first `i`; the stop token's row is included. Empty otherwise.
    pub logits: Vec<Vec<f32>>,
}

impl Decoded {
    /// Bytes a rank sent per decoded token: the known ranks' mean (every rank under threads, this
    /// process's under a launcher); 0 when nothing was decoded.
    pub fn bytes_per_token_per_rank(&self) -> f64 {
        let known: Vec<u64> = self
            .decode_bytes
            .iter()
            .copied()
            .filter(|&b| b > 0)
            .collect();
        let tokens: usize = self.decoded_tokens.iter().sum();
        if known.is_empty() || tokens == 0 {
            return 0.0;
        }
        known.iter().sum::<u64>() as f64 / known.len() as f64 / tokens as f64
    }
}

/// Greedy continuation of each prompt (up to `max_new` tokens, stopping at `stop`), on `ranks` ranks.
pub fn greedy<B: LayerBackend>(
    model: &Llama<B>,
    prompts: &[Vec<u32>],
    decoding: &Decoding,
) -> Result<Vec<Vec<u32>>, RingError> {
    let prompts: Vec<Prompt> = prompts.iter().cloned().map(Prompt::from).collect();
    Ok(decode(model, &prompts, decoding)?.replies)
}

/// [`greedy`] of `prompts` (with their documents), with what it took, on in-process ranks.
pub fn decode<B: LayerBackend>(
    model: &Llama<B>,
    prompts: &[Prompt],
    decoding: &Decoding,
) -> Result<Decoded, RingError> {
    strategies::check_ranks(decoding.ranks)?;
    if let Some(row) = prompts.iter().position(|p| p.tokens.is_empty()) {
        return Err(RingError::EmptyPrompt { row });
    }
    let Some(merge) = decoding.cache else {
        return recompute(model, prompts, decoding);
    };
    let results = run_ranks(decoding.ranks, decoding.timeout, |comm| {
        decode_rank(comm, model, prompts, decoding, merge)
    });
    let ranks = all_or_root_cause(results, RingError::echo_level)?;
    // Each rank's result holds its own bytes at its index.
    let own = |pick: fn(&Decoded) -> &Vec<u64>| -> Vec<u64> {
        ranks.iter().enumerate().map(|(r, d)| pick(d)[r]).collect()
    };
    Ok(Decoded {
        decode_bytes: own(|d| &d.decode_bytes),
        cache_bytes: own(|d| &d.cache_bytes),
        ..ranks[0].clone()
    })
}

/// This process's rank of a cached decoding over `comm` (one process per rank, e.g. under mpirun):
/// every rank returns the same replies; its own bytes and cache are at its index.
pub fn decode_on<B: LayerBackend>(
    comm: Comm,
    model: &Llama<B>,
    prompts: &[Prompt],
    decoding: &Decoding,
) -> Result<Decoded, RingError> {
    if comm.world() != decoding.ranks {
        return Err(RingError::WorldMismatch {
            world: comm.world(),
            layout: decoding.ranks,
        });
    }
    if let Some(row) = prompts.iter().position(|p| p.tokens.is_empty()) {
        return Err(RingError::EmptyPrompt { row });
    }
    decode_rank(
        comm,
        model,
        prompts,
        decoding,
        decoding.cache.unwrap_or_default(),
    )
}

/// One rank's cached decoding, `decoding.batch` prompts at a time, each batch in a cache of its
/// own: each prompt prefilled on its own layout into the cache, the first token's logits gathered
/// from the rank holding the prompt's last position, then a step a token for the batch's rows.
fn decode_rank<B: LayerBackend>(
    comm: Comm,
    model: &Llama<B>,
    prompts: &[Prompt],
    decoding: &Decoding,
    merge: DecodeMerge,
) -> Result<Decoded, RingError> {
    let (rank, world) = (comm.rank(), comm.world());
    let mut rings = Rings {
        comm: Some(comm),
        ctx: None,
    };
    let mut decoded = Decoded {
        replies: Vec::with_capacity(prompts.len()),
        prefill_seconds: Vec::with_capacity(prompts.len()),
        decode_seconds: Vec::with_capacity(prompts.len()),
        decoded_tokens: Vec::with_capacity(prompts.len()),
        ended_by: Vec::with_capacity(prompts.len()),
        decode_bytes: vec![0; world],
        cache_bytes: vec![0; world],
        cache_keys: vec![0; world],
        logits: Vec::new(),
    };
    for group in prompts.chunks(decoding.batch_size(prompts.len())) {
        decode_batch(&mut rings, model, group, decoding, merge, &mut decoded)?;
        if let Some(report) = decoding.on_batch.filter(|_| rank == 0) {
            report(group.len());
        }
    }
    if let Some(ctx) = &rings.ctx {
        decoded.decode_bytes[rank] = decode_bytes_sent(ctx);
    }
    Ok(decoded)
}

/// The communicator, until the first context takes it, and the last context made (later contexts
/// share its communicator).
struct Rings {
    comm: Option<Comm>,
    ctx: Option<Arc<RingContext>>,
}

impl Rings {
    /// This rank's context on `layout`, its positions holding `sequence`.
    fn on(
        &mut self,
        layout: Arc<strategies::Layout>,
        sequence: Sequence,
        config: RingConfig,
    ) -> Result<Arc<RingContext>, RingError> {
        let ctx = match (self.comm.take(), &self.ctx) {
            (Some(comm), _) => RingContext::new(comm, layout, config)?,
            (None, Some(ctx)) => ctx.with_layout(layout)?,
            (None, None) => unreachable!("the communicator makes the first context"),
        };
        let ctx = Arc::new(ctx.with_sequence(sequence)?);
        self.ctx = Some(ctx.clone());
        Ok(ctx)
    }
}

/// One batch of a rank's cached decoding, its replies and figures added to `decoded`.
fn decode_batch<B: LayerBackend>(
    rings: &mut Rings,
    model: &Llama<B>,
    prompts: &[Prompt],
    decoding: &Decoding,
    merge: DecodeMerge,
    decoded: &mut Decoded,
) -> Result<(), RingError> {
    // The prompts' indices in the whole decode key the sampling draws.
    let first = decoded.replies.len();
    let world = decoding.ranks;
    let config = RingConfig {
        causal: true,
        ..Default::default()
    };
    let longest = prompts.iter().map(|p| p.tokens.len()).max().unwrap_or(0);
    let device = B::Device::default();
    let mut cache: Option<KvCache<B>> = None;
    let mut logits: Vec<Vec<f32>> = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let started = Instant::now();
        let len = prompt.tokens.len();
        let padded = padded_len(decoding.partition, len, world)?;
        let masks = model.layer_masks(&config);
        let layout = Arc::new(layout_for_layers(
            decoding.partition,
            padded,
            &[],
            world,
            &masks,
            false,
        )?);
        let sequence = Sequence {
            len,
            doc_lens: prompt.doc_lens.clone(),
        };
        let ctx = rings.on(layout.clone(), sequence.clone(), config)?;
        let rank = ctx.rank();
        let cache = cache.get_or_insert_with(|| {
            KvCache::new(
                (rank, world),
                model.layers(),
                longest + decoding.max_new,
                config.kernel,
                config.precision,
            )
        });
        let positions = &layout.positions[rank];
        let ids: Vec<i64> = positions
            .iter()
            .map(|&p| i64::from(*prompt.tokens.get(p).unwrap_or(&decoding.pad)))
            .collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, positions.len()]), &device);
        // Every prompt of the batch is rotated for the batch's longest (dynamic NTK); only the rank
        // that holds the prompt's last token computes logits, of that token alone.
        let holder = positions.iter().position(|&p| p == len - 1);
        let prefilling = crate::trace::span(|| format!("prefill {len} tokens"));
        let (local, kept) = model.prefill(tokens, positions, &ctx, longest, holder)?;
        drop(prefilling);
        let row = cache.add_row(&layout, sequence)?;
        for (layer, [k, v]) in kept.into_iter().enumerate() {
            cache.insert_prefill(row, layer, k, v);
        }
        // The last prompt token's logits, from the rank that holds it, to every rank (a sum of
        // one row and zeros is that row, bit for bit).
        let mut last = vec![0.0f32; model.vocab()];
        if let Some(local) = local {
            last.copy_from_slice(&host::read(local));
        }
        ctx.with_comm(|c| c.all_reduce_sum(&mut last))?;
        logits.push(last);
        decoded
            .prefill_seconds
            .push(started.elapsed().as_secs_f64());
    }
    let (Some(mut cache), Some(ctx)) = (cache, rings.ctx.clone()) else {
        return Ok(());
    };
    let started = Instant::now();
    let mut replies = vec![Vec::new(); prompts.len()];
    let mut done = vec![false; prompts.len()];
    let mut ended = vec![None; prompts.len()];
    let mut tokens = vec![0usize; prompts.len()];
    let mut kept = vec![
        Vec::new();
        if decoding.keep_logits {
            prompts.len()
        } else {
            0
        }
    ];
    for step in 0..decoding.max_new {
        let (mut feed, mut rows) = (Vec::new(), Vec::new());
        for row in 0..prompts.len() {
            if done[row] {
                continue;
            }
            if let Some(kept) = kept.get_mut(row) {
                kept.extend_from_slice(&logits[row]);
            }
            let next = decoding.sampling.pick(&logits[row], first + row, step)?;
            if decoding.stop.contains(&next) {
                done[row] = true;
                ended[row] = Some(next);
                continue;
            }
            replies[row].push(next);
            if decoding
                .stop_reply
                .is_some_and(|stop| stop(first + row, &replies[row]))
            {
                done[row] = true;
                continue;
            }
            if step + 1 < decoding.max_new {
                feed.push(next);
                rows.push(row);
            }
        }
        if feed.is_empty() {
            break;
        }
        // This step's forward: the batch's longest prompt with `step + 1` reply tokens.
        let batch_len = longest + step + 1;
        let stepping = crate::trace::span(|| format!("decode step {step}"));
        let stepped = model.decode_step(&feed, &rows, &mut cache, batch_len, (&ctx, merge))?;
        drop(stepping);
        let vocab = stepped.dims()[1];
        let values = host::read(stepped);
        for (i, &row) in rows.iter().enumerate() {
            logits[row] = values[i * vocab..(i + 1) * vocab].to_vec();
            tokens[row] += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let total: usize = tokens.iter().sum();
    decoded.ended_by.extend(ended);
    for (reply, &n) in replies.into_iter().zip(&tokens) {
        decoded.replies.push(reply);
        decoded.decoded_tokens.push(n);
        decoded.decode_seconds.push(if total == 0 {
            0.0
        } else {
            seconds * n as f64 / total as f64
        });
    }
    decoded.logits.extend(kept);
    let rank = ctx.rank();
    decoded.cache_bytes[rank] = decoded.cache_bytes[rank].max(cache.bytes());
    decoded.cache_keys = vec![0; world];
    for row in 0..cache.rows() {
        for (keys, &n) in decoded.cache_keys.iter_mut().zip(cache.counts(row)) {
            *keys += n;
        }
    }
    Ok(())
}

/// Bytes this rank has sent merging decoded tokens' attention so far.
fn decode_bytes_sent(ctx: &RingContext) -> u64 {
    ctx.traffic()
        .sends
        .iter()
        .filter(|s| s.phase == Phase::Decode)
        .map(|s| s.bytes)
        .sum()
}

/// Greedy decoding without a cache: each prompt's whole sequence through the ring for every new
/// token (each prompt on its own layout, with its documents), rotated as its batch's rows are
/// (`decoding.batch` prompts together; the longest, grown by the tokens generated so far).
fn recompute<B: LayerBackend>(
    model: &Llama<B>,
    prompts: &[Prompt],
    decoding: &Decoding,
) -> Result<Decoded, RingError> {
    let mut decoded = Decoded {
        replies: Vec::with_capacity(prompts.len()),
        prefill_seconds: vec![0.0; prompts.len()],
        decode_seconds: Vec::with_capacity(prompts.len()),
        decoded_tokens: Vec::with_capacity(prompts.len()),
        ended_by: Vec::with_capacity(prompts.len()),
        decode_bytes: vec![0; decoding.ranks],
        cache_bytes: vec![0; decoding.ranks],
        cache_keys: vec![0; decoding.ranks],
        logits: Vec::new(),
    };
    let batch = decoding.batch_size(prompts.len());
    let longest_of = |i: usize| {
        let group = i / batch * batch;
        prompts[group..(group + batch).min(prompts.len())]
            .iter()
            .map(|p| p.tokens.len())
            .max()
            .unwrap_or(0)
    };
    for (i, prompt) in prompts.iter().enumerate() {
        let start = Instant::now();
        let longest = longest_of(i);
        let mut seq = prompt.clone();
        let mut reply = Vec::new();
        let mut kept = Vec::new();
        let mut ended = None;
        for step in 0..decoding.max_new {
            let all = logits_in_batch(model, &seq, decoding, longest + step)?;
            let vocab = all.len() / seq.tokens.len();
            let logits = all[all.len() - vocab..].to_vec();
            let next = decoding.sampling.pick(&logits, i, step)?;
            if decoding.keep_logits {
                kept.extend_from_slice(&logits);
            }
            if decoding.stop.contains(&next) {
                ended = Some(next);
                break;
            }
            seq.tokens.push(next);
            if let Some(last) = seq.doc_lens.last_mut() {
                *last += 1;
            }
            reply.push(next);
            if decoding.stop_reply.is_some_and(|stop| stop(i, &reply)) {
                break;
            }
        }
        decoded.decoded_tokens.push(reply.len().saturating_sub(1));
        decoded.ended_by.push(ended);
        decoded.replies.push(reply);
        if decoding.keep_logits {
            decoded.logits.push(kept);
        }
        decoded.decode_seconds.push(start.elapsed().as_secs_f64());
        if let Some(report) = decoding.on_batch {
            report(1);
        }
    }
    Ok(decoded)
}

/// The logits after the last token of `prompt`, its whole sequence run through the ring.
pub fn last_logits<B: LayerBackend>(
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
) -> Result<Vec<f32>, RingError> {
    let all = full_logits(model, prompt, decoding)?;
    let vocab = all.len() / prompt.tokens.len();
    Ok(all[all.len() - vocab..].to_vec())
}

/// The logits `[len, vocab]` after every token of `prompt`, its whole sequence run through the ring
/// on `decoding.ranks` ranks: the recompute a cached decoding is checked against.
pub fn full_logits<B: LayerBackend>(
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
) -> Result<Vec<f32>, RingError> {
    logits_in_batch(model, prompt, decoding, prompt.tokens.len())
}

/// `work` on each of `decoding.ranks` thread ranks of `prompt`'s causal layout: its context, the
/// global positions it holds and their token ids `[1, t]` (padding past the prompt: `decoding.pad`).
/// Returns each rank's result, in rank order, and the layout; a failed rank's root cause is the error.
pub(crate) fn on_each_rank<B: LayerBackend, T: Send>(
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
    work: impl Fn(&Arc<RingContext>, &[usize], Tensor<B, 2, Int>) -> Result<T, RingError> + Sync,
) -> Result<(Vec<T>, Arc<strategies::Layout>), RingError> {
    let (layout, sequence) = causal_layout(model, prompt, decoding)?;
    let per_rank = run_ranks(decoding.ranks, decoding.timeout, |comm| {
        let (ctx, tokens) = rank_of(comm, &layout, &sequence, prompt, decoding)?;
        work(&ctx, &layout.positions[ctx.rank()], tokens)
    });
    Ok((all_or_root_cause(per_rank, RingError::echo_level)?, layout))
}

/// `work` as this process's rank of `prompt`'s causal layout over `comm` (one process per rank, as
/// under mpirun): what [`on_each_rank`] runs on one of its threads.
pub(crate) fn on_this_rank<B: LayerBackend, T>(
    comm: Comm,
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
    work: impl FnOnce(&Arc<RingContext>, &[usize], Tensor<B, 2, Int>) -> Result<T, RingError>,
) -> Result<T, RingError> {
    if comm.world() != decoding.ranks {
        return Err(RingError::WorldMismatch {
            world: comm.world(),
            layout: decoding.ranks,
        });
    }
    let (layout, sequence) = causal_layout(model, prompt, decoding)?;
    let (ctx, tokens) = rank_of(comm, &layout, &sequence, prompt, decoding)?;
    work(&ctx, &layout.positions[ctx.rank()], tokens)
}

/// `prompt`'s causal layout over `decoding.ranks` ranks of `decoding.partition`, balanced for every
/// layer's mask (the model's window on its windowed layers), and the sequence it holds.
fn causal_layout<B: LayerBackend>(
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
) -> Result<(Arc<strategies::Layout>, Sequence), RingError> {
    let (ranks, partition) = (decoding.ranks, decoding.partition);
    let len = prompt.tokens.len();
    let masks = model.layer_masks(&causal());
    let padded = padded_len(partition, len, ranks)?;
    let layout = Arc::new(layout_for_layers(
        partition,
        padded,
        &[],
        ranks,
        &masks,
        false,
    )?);
    let sequence = Sequence {
        len,
        doc_lens: prompt.doc_lens.clone(),
    };
    Ok((layout, sequence))
}

/// The ring a prompt runs on: causal, the rest as its defaults.
fn causal() -> RingConfig {
    RingConfig {
        causal: true,
        ..Default::default()
    }
}

/// The context of `comm`'s rank on `layout` holding `sequence`, and its positions' token ids
/// `[1, t]` (padding past the prompt: `decoding.pad`).
fn rank_of<B: LayerBackend>(
    comm: Comm,
    layout: &Arc<strategies::Layout>,
    sequence: &Sequence,
    prompt: &Prompt,
    decoding: &Decoding,
) -> Result<(Arc<RingContext>, Tensor<B, 2, Int>), RingError> {
    let rank = comm.rank();
    let ctx = Arc::new(
        RingContext::new(comm, layout.clone(), causal())?.with_sequence(sequence.clone())?,
    );
    let positions = &layout.positions[rank];
    let ids: Vec<i64> = positions
        .iter()
        .map(|&p| i64::from(*prompt.tokens.get(p).unwrap_or(&decoding.pad)))
        .collect();
    let tokens = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids, [1, positions.len()]),
        &Default::default(),
    );
    Ok((ctx, tokens))
}

/// [`full_logits`] of `prompt` run in a batch whose longest sequence is `batch_len` (what dynamic
/// NTK scaling reads).
fn logits_in_batch<B: LayerBackend>(
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
    batch_len: usize,
) -> Result<Vec<f32>, RingError> {
    let len = prompt.tokens.len();
    let (mut per_rank, layout) =
        on_each_rank(model, prompt, decoding, |ctx, positions, tokens| {
            let logits = model.forward_in_batch(tokens, positions, ctx, batch_len)?;
            Ok(host::read(logits))
        })?;
    // One rank holding every position in order: its logits are the answer as they are (no copy of
    // a [len, vocab] block, which is large for a real vocabulary).
    if let [only] = &layout.positions[..]
        && only.iter().copied().eq(0..only.len())
    {
        let mut logits = per_rank.swap_remove(0);
        let vocab = logits.len() / only.len().max(1);
        logits.truncate(len * vocab);
        return Ok(logits);
    }
    let vocab = per_rank
        .iter()
        .zip(&layout.positions)
        .find(|(_, p)| !p.is_empty())
        .map_or(0, |(l, p)| l.len() / p.len());
    let mut all = vec![0.0f32; len * vocab];
    for (logits, positions) in per_rank.iter().zip(&layout.positions) {
        for (i, &p) in positions.iter().enumerate() {
            if p < len {
                all[p * vocab..(p + 1) * vocab]
                    .copy_from_slice(&logits[i * vocab..(i + 1) * vocab]);
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::{Decoding, decode};

    /// A model with bf16 weights decodes through them, on 1 and 3 ranks: the first token's logits
    /// move from the f32 model's (bf16 is used), stay finite, and move by rounding's size, not a
    /// wrong product's: each product is off by at most (2⁻⁷ + k·2⁻²⁴) ≈ 0.8% of |A|·|B| (k ≤ 128
    /// here), and nine products stand between the tokens and the logits (four a layer, two layers,
    /// the head): relative to the logits' scale, 9 × 0.8% = 7.1% bounds the first-order sum.
    #[test]
    fn bf16_weights_move_the_logits_by_rounding_alone_on_any_rank_count() {
        use crate::model::LlamaConfig;
        use crate::model::bf16::bf16_product_bound;
        use burn::backend::Flex;
        let device = Default::default();
        let mut config = LlamaConfig::new(61);
        (config.d_model, config.layers, config.heads, config.kv_heads) = (32, 2, 4, 2);
        let model: crate::model::Llama<Flex> =
            crate::model::lazy::seeded::<Flex, _>(4, &device, || config.init(&device));
        let prompt: Vec<u32> = (0..12).map(|i| (i * 5) % 61).collect();
        let logits = |model: &crate::model::Llama<Flex>, ranks: usize| {
            let decoding = Decoding {
                max_new: 1,
                stop: &[],
                pad: 0,
                partition: strategies::by_name("zigzag").expect("zigzag"),
                ranks,
                timeout: std::time::Duration::from_secs(60),
                cache: Some(crate::ring::decode::DecodeMerge::AllGather),
                batch: 1,
                on_batch: None,
                keep_logits: true,
                sampling: Default::default(),
                stop_reply: None,
            };
            let decoded = decode(model, &[prompt.clone().into()], &decoding).expect("a decoding");
            decoded.logits[0].clone()
        };
        let reference = logits(&model, 1);
        let model = model.with_bf16_weights();
        assert!(model.bf16_weights());
        for ranks in [1, 3] {
            let got = logits(&model, ranks);
            let moved = ringbench_tests::deviation(&got, &reference);
            assert!(
                moved.abs > 0.0,
                "{ranks} ranks: bf16 weights left every logit unchanged"
            );
            assert!(
                moved.within(9.0 * bf16_product_bound(128)),
                "{ranks} ranks: {moved}"
            );
        }
    }
}
