//! Attention over a part of the keys, as decoding exchanges it: each query row's normalized output
//! over those keys and its log-sum-exp, and the one exact merge of two parts over disjoint keys
//! (the online softmax's, in f32: `lse = m + ln(e^(a−m) + e^(b−m))`, outputs weighted by their
//! shares), the sinks' logits joined once after every part.
//!
//! # Shapes
//! `out` `[rows, d]`, `lse` `[rows]`, rows being (query, head) pairs in the caller's order.

use crate::block::{Block, BlockKind};
use crate::error::TransportError;
use std::sync::Arc;

/// Attention of `rows` query rows over a part of the keys. A row that sees none of them has output
/// 0 and log-sum-exp −∞, which every merge treats as nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    /// `[rows, d]`, row-major.
    pub out: Vec<f32>,
    /// `[rows]`, natural log.
    pub lse: Vec<f32>,
    /// `d`.
    pub head_dim: usize,
}

impl Partial {
    /// A part with no keys: every row empty.
    pub fn empty(rows: usize, head_dim: usize) -> Self {
        Partial {
            out: vec![0.0; rows * head_dim],
            lse: vec![f32::NEG_INFINITY; rows],
            head_dim,
        }
    }

    /// Its rows.
    pub fn rows(&self) -> usize {
        self.lse.len()
    }

    /// Folds `other` (over keys disjoint from this part's) into this part, row by row.
    pub fn merge(&mut self, other: &Partial) {
        let d = self.head_dim;
        for (row, (lse, &lse_b)) in self.lse.iter_mut().zip(&other.lse).enumerate() {
            let lse_a = *lse;
            if lse_b == f32::NEG_INFINITY {
                continue;
            }
            let out = &mut self.out[row * d..(row + 1) * d];
            let out_b = &other.out[row * d..(row + 1) * d];
            if lse_a == f32::NEG_INFINITY {
                out.copy_from_slice(out_b);
                *lse = lse_b;
                continue;
            }
            let m = lse_a.max(lse_b);
            let (w_a, w_b) = ((lse_a - m).exp(), (lse_b - m).exp());
            let total = w_a + w_b;
            let (w_a, w_b) = (w_a / total, w_b / total);
            for (o, &b) in out.iter_mut().zip(out_b) {
                *o = *o * w_a + b * w_b;
            }
            *lse = m + total.ln();
        }
    }

    /// Joins one sink logit per row (`sinks[row]`) to each row's denominator, once: the output
    /// shrinks by the sink's share and the log-sum-exp grows by it.
    pub fn join_sinks(&mut self, sinks: &[f32]) {
        let sink = Partial {
            out: vec![0.0; self.out.len()],
            lse: sinks.to_vec(),
            head_dim: self.head_dim,
        };
        self.merge(&sink);
    }

    /// The rows `range` of this part.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Partial {
        let d = self.head_dim;
        Partial {
            out: self.out[range.start * d..range.end * d].to_vec(),
            lse: self.lse[range].to_vec(),
            head_dim: d,
        }
    }

    /// Overwrites the rows from `start` with `part`'s.
    pub fn set_rows(&mut self, start: usize, part: &Partial) {
        let d = self.head_dim;
        self.out[start * d..(start + part.rows()) * d].copy_from_slice(&part.out);
        self.lse[start..start + part.rows()].copy_from_slice(&part.lse);
    }

    /// As a message: an `Out` block `[rows, d]` and an `Lse` block `[rows]`, on the host.
    pub fn to_payload(&self) -> Vec<Arc<Block>> {
        vec![
            Arc::new(Block::host(
                BlockKind::Out,
                vec![self.rows(), self.head_dim],
                self.out.clone(),
            )),
            Arc::new(Block::host(
                BlockKind::Lse,
                vec![self.rows()],
                self.lse.clone(),
            )),
        ]
    }

    /// A message of [`Partial::to_payload`] from `peer` back as a part of `rows` rows; an error naming
    /// the peer when it holds another number of values.
    pub fn from_payload(
        payload: &[Arc<Block>],
        rows: usize,
        head_dim: usize,
        (rank, peer): (usize, usize),
    ) -> Result<Partial, TransportError> {
        let mismatch = |got: usize| TransportError::LengthMismatch {
            rank,
            peer,
            expected: rows * (head_dim + 1),
            got,
        };
        let [out, lse] = payload else {
            return Err(mismatch(payload.iter().map(|b| b.len()).sum()));
        };
        if out.len() != rows * head_dim || lse.len() != rows {
            return Err(mismatch(out.len() + lse.len()));
        }
        Ok(Partial {
            out: out.host_values().into_owned(),
            lse: lse.host_values().into_owned(),
            head_dim,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax attention of one row over scores `s` and values `v` (`[keys, d]`), in f64.
    fn exact(s: &[f64], v: &[[f64; 2]]) -> ([f64; 2], f64) {
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
        let mut out = [0.0; 2];
        for (x, vi) in s.iter().zip(v) {
            for (o, ve) in out.iter_mut().zip(vi) {
                *o += (x - m).exp() / sum * ve;
            }
        }
        (out, m + sum.ln())
    }

    fn part(s: &[f64], v: &[[f64; 2]]) -> Partial {
        let (out, lse) = exact(s, v);
        Partial {
            out: out.iter().map(|&x| x as f32).collect(),
            lse: vec![lse as f32],
            head_dim: 2,
        }
    }

    #[test]
    fn merging_parts_over_disjoint_keys_gives_the_whole_and_empty_parts_change_nothing() {
        let s = [0.3, -1.2, 2.5, 0.0, 40.0];
        let v = [
            [1.0, -2.0],
            [0.5, 0.25],
            [-3.0, 1.0],
            [2.0, 2.0],
            [0.125, -1.0],
        ];
        let (want, want_lse) = exact(&s, &v);
        let mut merged = Partial::empty(1, 2);
        for range in [0..2, 2..3, 3..5] {
            merged.merge(&part(&s[range.clone()], &v[range]));
            merged.merge(&Partial::empty(1, 2));
        }
        // Bounds: about 16 roundings of u = 6e-8 (the parts' f32 inputs, each merge's rescaling
        // by exp of an lse difference) of each quantity's scale: |v| ≤ 3, lse ≈ 41.
        for (got, want) in merged.out.iter().zip(want) {
            assert!((f64::from(*got) - want).abs() <= 1e-6 * 3.0, "{merged:?}");
        }
        assert!((f64::from(merged.lse[0]) - want_lse).abs() <= 1e-6 * 41.0);
        // A sink is a part with no values: the whole with the sink's logit in the denominator.
        let mut with_sink = merged.clone();
        with_sink.join_sinks(&[1.5]);
        let share = 1.0 / (1.0 + (1.5 - want_lse).exp());
        // The share is exp of an lse difference of ~38.5, whose f32 rounding (u · 41) it carries.
        for (got, want) in with_sink.out.iter().zip(want) {
            assert!((f64::from(*got) - want * share).abs() <= 1e-5);
        }
        let back = Partial::from_payload(&merged.to_payload(), 1, 2, (0, 1)).unwrap();
        assert_eq!(back, merged);
        assert!(matches!(
            Partial::from_payload(&merged.to_payload(), 2, 2, (0, 1)),
            Err(TransportError::LengthMismatch { peer: 1, .. })
        ));
    }
}
