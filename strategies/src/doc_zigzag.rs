//! Per-document zig-zag: every document of a packed sequence is split into 2N chunks and rank p owns
//! chunks p and 2N−1−p of each, so every document's causal work is balanced on its own.

use crate::{Partition, PartitionError};

/// Zig-zag inside each document (one document when the sequence is not packed).
#[derive(Debug, Clone, Copy, Default)]
pub struct DocZigZag;

impl Partition for DocZigZag {
    fn name(&self) -> &'static str {
        "doc-zigzag"
    }

    /// Any length of at least 2 · ranks (every rank then owns at least two tokens).
    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError> {
        if seq_len < 2 * ranks {
            return Err(PartitionError::TooShort {
                strategy: self.name(),
                seq_len,
                min: 2 * ranks,
            });
        }
        Ok(())
    }

    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        self.owned_positions_packed(seq_len, &[], ranks, rank)
    }

    fn validate_packed(
        &self,
        seq_len: usize,
        doc_lens: &[usize],
        ranks: usize,
    ) -> Result<(), PartitionError> {
        self.validate(seq_len, ranks)?;
        match (0..ranks).find(|&r| {
            self.owned_positions_packed(seq_len, doc_lens, ranks, r)
                .is_empty()
        }) {
            Some(rank) => Err(PartitionError::EmptyShard {
                strategy: self.name(),
                rank,
            }),
            None => Ok(()),
        }
    }

    fn owned_positions_packed(
        &self,
        seq_len: usize,
        doc_lens: &[usize],
        ranks: usize,
        rank: usize,
    ) -> Vec<usize> {
        // The documents, then whatever follows them (padding) as one more.
        let mut docs = doc_lens.to_vec();
        let covered: usize = docs.iter().sum();
        if covered < seq_len {
            docs.push(seq_len - covered);
        }
        let chunks = 2 * ranks;
        let (mut owned, mut start, mut extra) = (Vec::new(), 0, 0);
        for len in docs {
            // Chunk sizes differ by at most one; which chunks get the extra token rotates from
            // document to document, so that no rank collects every remainder.
            let (base, rem) = (len / chunks, len % chunks);
            // The `rem` chunks one token longer are the `rem` after chunk `extra mod chunks`,
            // cyclically: chunk i is one of them when (i − e) mod chunks < rem.
            let e = extra % chunks;
            let size = |i: usize| base + usize::from((i + chunks - e) % chunks < rem);
            let begin = |i: usize| start + i * base + longer_before(i, e, rem, chunks);
            for chunk in [rank, chunks - 1 - rank] {
                owned.extend(begin(chunk)..begin(chunk) + size(chunk));
            }
            extra += rem;
            start += len;
        }
        owned
    }
}

/// How many of chunks `0..i` are among the `rem` longer ones, which run cyclically from chunk `e`
/// (`e < chunks`, `rem < chunks`): the run `[e, e + rem)` cut by `[0, i)`, wrapping past the last
/// chunk. O(1), where summing the sizes before each chunk made a layout O(chunks²) a document.
fn longer_before(i: usize, e: usize, rem: usize, chunks: usize) -> usize {
    let unwrapped = i.saturating_sub(e).min(rem.min(chunks - e));
    let wrapped = i.min((e + rem).saturating_sub(chunks));
    unwrapped + wrapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_chunks_before_one_are_counted_as_a_sum_would() {
        let chunks = 6;
        for e in 0..chunks {
            for rem in 0..chunks {
                let longer = |j: usize| usize::from((j + chunks - e) % chunks < rem);
                for i in 0..=chunks {
                    let summed: usize = (0..i).map(longer).sum();
                    assert_eq!(
                        longer_before(i, e, rem, chunks),
                        summed,
                        "e {e} rem {rem} i {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn chunks_tile_every_document_whatever_its_remainder() {
        // Every position exactly once on 3 ranks (6 chunks a document), for documents whose
        // remainders wrap past the last chunk in turn.
        let docs = [7, 11, 5, 13, 6, 1, 9];
        let len: usize = docs.iter().sum();
        let mut all: Vec<usize> = (0..3)
            .flat_map(|r| DocZigZag.owned_positions_packed(len, &docs, 3, r))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..len).collect::<Vec<_>>());
    }

    #[test]
    fn each_document_is_zigzagged_on_its_own() {
        // Documents of 8 and 4 tokens on 2 ranks: chunks of 2 and 1.
        let p = |rank| DocZigZag.owned_positions_packed(12, &[8, 4], 2, rank);
        assert_eq!(p(0), [0, 1, 6, 7, 8, 11]);
        assert_eq!(p(1), [2, 3, 4, 5, 9, 10]);
        // Unpacked, a length zig-zag accepts gives zig-zag's layout.
        for rank in 0..4 {
            assert_eq!(
                DocZigZag.owned_positions(32, 4, rank),
                crate::ZigZag.owned_positions(32, 4, rank)
            );
        }
    }

    #[test]
    fn remainders_rotate_so_shards_stay_within_a_few_tokens() {
        let docs = [5, 17, 26, 3, 1, 9];
        let lens: Vec<usize> = (0..4)
            .map(|r| DocZigZag.owned_positions_packed(61, &docs, 4, r).len())
            .collect();
        assert_eq!(lens.iter().sum::<usize>(), 61);
        let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
        assert!(hi - lo <= 2, "{lens:?}");
        assert_eq!(
            DocZigZag.validate_packed(3, &[3], 4),
            Err(PartitionError::TooShort {
                strategy: "doc-zigzag",
                seq_len: 3,
                min: 8
            })
        );
    }
}
