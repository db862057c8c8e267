//! Greedy decoding with a trained model, running the full sequence through the ring at every step.

use crate::error::RingError;
use crate::model::Llama;
use crate::model::layer::LayerBackend;
use crate::ring::context::{RingConfig, RingContext};
use crate::transport::run_ranks;
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;
use std::time::Duration;
use strategies::{Partition, padded_len};

/// How [`greedy`] decodes and where it runs.
#[derive(Debug, Clone, Copy)]
pub struct Decoding<'a> {
    /// Tokens to generate at most.
    pub max_new: usize,
    /// Generation of a row ends at this token (not included in the reply).
    pub stop: u32,
    /// Pads rows to a length the partition accepts; causal attention keeps it out of real positions.
    pub pad: u32,
    /// Which positions each rank owns.
    pub partition: &'a dyn Partition,
    /// Ranks to run.
    pub ranks: usize,
    /// How long a rank waits for a silent peer.
    pub timeout: Duration,
}

/// Greedy continuation of each prompt (up to `max_new` tokens, stopping at `stop`), on `ranks` ranks.
///
/// Each step runs the full sequence through the ring (no KV cache): evaluation, not serving.
pub fn greedy<B: LayerBackend>(
    model: &Llama<B>,
    prompts: &[Vec<u32>],
    decoding: &Decoding,
) -> Result<Vec<Vec<u32>>, RingError> {
    let Decoding {
        max_new,
        stop,
        pad,
        partition,
        ranks,
        timeout,
    } = *decoding;
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut done = vec![false; prompts.len()];
    let mut replies = vec![Vec::new(); prompts.len()];
    for _ in 0..max_new {
        if done.iter().all(|&d| d) {
            break;
        }
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(1);
        let len = padded_len(partition, longest, ranks)?;
        let layout = Arc::new(partition.layout(len, ranks)?);
        let inputs: Vec<i64> = seqs
            .iter()
            .flat_map(|s| (0..len).map(move |i| i64::from(*s.get(i).unwrap_or(&pad))))
            .collect();
        let vocab = std::sync::OnceLock::new();
        let per_rank = run_ranks(ranks, timeout, |comm| -> Result<Vec<f32>, RingError> {
            let rank = comm.rank();
            let ctx = Arc::new(RingContext::new(
                comm,
                layout.clone(),
                RingConfig {
                    causal: true,
                    ..Default::default()
                },
            )?);
            let t = layout.shard_len(rank);
            let tokens = Tensor::<B, 2, Int>::from_data(
                TensorData::new(ctx.shard_rows(&inputs, seqs.len(), 1), [seqs.len(), t]),
                &Default::default(),
            );
            let logits = model
                .clone()
                .forward(tokens, &layout.positions[rank], &ctx)?;
            vocab.get_or_init(|| logits.dims()[2]);
            Ok(crate::host::read(logits))
        });
        let per_rank: Vec<Vec<f32>> = per_rank.into_iter().collect::<Result<_, _>>()?;
        let v = *vocab.get().expect("at least one rank ran");
        for (row, seq) in seqs.iter_mut().enumerate() {
            if done[row] {
                continue;
            }
            let last = seq.len() - 1;
            let owner = (0..ranks)
                .find(|&r| layout.positions[r].contains(&last))
                .expect("owned");
            let local_index = layout.positions[owner]
                .iter()
                .position(|&p| p == last)
                .expect("owned");
            let t = layout.shard_len(owner);
            let logits =
                &per_rank[owner][(row * t + local_index) * v..(row * t + local_index + 1) * v];
            let next = logits
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                    if x > best.1 { (i, x) } else { best }
                })
                .0 as u32;
            if next == stop {
                done[row] = true;
            } else {
                seq.push(next);
                replies[row].push(next);
            }
        }
    }
    Ok(replies)
}
