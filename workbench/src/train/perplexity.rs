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
use crate::train::generation::{Decoding, Prompt, on_each_rank};
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
    let len = prompt.tokens.len();
    if len < 2 {
        return Err(RingError::EmptyPrompt { row: 0 });
    }
    let (per_rank, _) = on_each_rank(model, prompt, decoding, |ctx, positions, tokens| {
        let hidden = model.layers_out(tokens, positions, ctx, len)?;
        // The positions this rank scores: those with a next token.
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
    })?;
    let mut nll = vec![f64::NAN; len - 1];
    let mut engine_peak_bytes = Vec::with_capacity(decoding.ranks);
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
    Ok(Scored {
        nll,
        engine_peak_bytes,
    })
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
