//! The negative log-likelihood of every next token of a sequence through the ring, as perplexity
//! evaluation needs it: each rank runs the layers on its own positions, then scores them in chunks of
//! rows (at most `LOSS_CHUNK_ELEMENTS` logits at once), so no `[tokens × vocab]` block is held;
//! each position's `logsumexp(z) − z[target]` is summed in float64 from the f32 logits, rows in
//! parallel.

use crate::error::RingError;
use crate::host;
use crate::model::Llama;
use crate::model::layer::LayerBackend;
use crate::model::loss::LOSS_CHUNK_ELEMENTS;
use crate::train::generation::{Decoding, Prompt, on_each_rank, on_this_rank};
use crate::transport::Comm;
use burn::tensor::{Int, Tensor, TensorData};
use rayon::prelude::*;

/// What scoring a sequence gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// `nll[p]`: −log P(token p + 1 | tokens ≤ p), for p in 0..len − 1.
    pub nll: Vec<f64>,
    /// The attention engine's peak bytes on each rank (its ledger: saved blocks, blocks in flight,
    /// tile workspace).
    pub engine_peak_bytes: Vec<u64>,
}

/// Every next-token NLL of `prompt` (at least 2 tokens) on `decoding.ranks` ranks of
/// `decoding.partition`; a NaN or infinite logit is an error naming its position.
pub fn score<B: LayerBackend>(
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
) -> Result<Scored, RingError> {
    check_len(prompt)?;
    let (per_rank, _) = on_each_rank(model, prompt, decoding, |ctx, positions, tokens| {
        score_rank(model, prompt, ctx, positions, tokens)
    })?;
    Ok(joined(prompt.tokens.len(), per_rank))
}

/// [`score`] as this process's rank over `comm` (one process per rank, as under mpirun): each rank
/// scores its own positions, then every rank's are all-gathered, so every rank returns the whole.
pub fn score_on<B: LayerBackend>(
    comm: Comm,
    model: &Llama<B>,
    prompt: &Prompt,
    decoding: &Decoding,
) -> Result<Scored, RingError> {
    check_len(prompt)?;
    on_this_rank(comm, model, prompt, decoding, |ctx, positions, tokens| {
        let (scored, peak) = score_rank(model, prompt, ctx, positions, tokens)?;
        // As words: the peak, then (position, the NLL's bits) pairs.
        let mut words = vec![peak];
        for (p, v) in &scored {
            words.extend([*p as u64, v.to_bits()]);
        }
        let gathered = ctx.with_comm(|c| c.all_gather_words(&words))?;
        let per_rank = gathered
            .into_iter()
            .map(|w| {
                let pairs = w[1..]
                    .chunks_exact(2)
                    .map(|pv| (pv[0] as usize, f64::from_bits(pv[1])))
                    .collect();
                (pairs, w[0])
            })
            .collect();
        Ok(joined(prompt.tokens.len(), per_rank))
    })
}

fn check_len(prompt: &Prompt) -> Result<(), RingError> {
    if prompt.tokens.len() < 2 {
        return Err(RingError::EmptyPrompt { row: 0 });
    }
    Ok(())
}

/// One rank's NLLs of its positions (those with a next token), and its engine's peak bytes.
fn score_rank<B: LayerBackend>(
    model: &Llama<B>,
    prompt: &Prompt,
    ctx: &std::sync::Arc<crate::ring::context::RingContext>,
    positions: &[usize],
    tokens: Tensor<B, 2, Int>,
) -> Result<(Vec<(usize, f64)>, u64), RingError> {
    let len = prompt.tokens.len();
    let hidden = model.layers_out(tokens, positions, ctx, len)?;
    let scored: Vec<usize> = (0..positions.len())
        .filter(|&i| positions[i] + 1 < len)
        .collect();
    let rows = (LOSS_CHUNK_ELEMENTS / model.vocab().max(1)).max(1);
    let mut out = Vec::with_capacity(scored.len());
    for chunk in scored.chunks(rows) {
        let index = Tensor::<B, 1, Int>::from_data(
            TensorData::new(chunk.iter().map(|&i| i as i64).collect(), [chunk.len()]),
            &Default::default(),
        );
        let logits = host::read(model.logits(hidden.clone().select(1, index)));
        let vocab = logits.len() / chunk.len();
        let scored: Vec<(usize, Result<f64, RingError>)> = logits
            .par_chunks(vocab)
            .zip(chunk.par_iter())
            .map(|(row, &i)| {
                let p = positions[i];
                (p, row_nll(row, prompt.tokens[p + 1] as usize, p))
            })
            .collect();
        for (p, nll) in scored {
            out.push((p, nll?));
        }
    }
    Ok((out, ctx.ledger().peak()))
}

/// Every rank's NLLs of a `len`-token prompt in position order, and their peaks in rank order.
fn joined(len: usize, per_rank: Vec<(Vec<(usize, f64)>, u64)>) -> Scored {
    let mut nll = vec![f64::NAN; len - 1];
    let mut engine_peak_bytes = Vec::with_capacity(per_rank.len());
    for (scored, peak) in per_rank {
        for (p, v) in scored {
            nll[p] = v;
        }
        engine_peak_bytes.push(peak);
    }
    debug_assert!(
        nll.iter().all(|v| v.is_finite()),
        "every position scored once"
    );
    Scored {
        nll,
        engine_peak_bytes,
    }
}

/// `logsumexp(row) − row[target]` in float64; a non-finite logit is an error naming `position`.
fn row_nll(row: &[f32], target: usize, position: usize) -> Result<f64, RingError> {
    if let Some(i) = row.iter().position(|x| !x.is_finite()) {
        return Err(RingError::NonFinite {
            what: "scored logits",
            index: vec![position, i],
            value: row[i],
        });
    }
    let top = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - top).exp()).sum();
    Ok(top + sum.ln() - row[target] as f64)
}
