//! What a layout's positions hold ([`Sequence`]: documents, then padding) and a rank's rows of a
//! sequence ([`gather_rows`]).

use crate::error::RingError;

/// Rows at `positions` of `global` laid out `[batch, len, width]`: `[batch, positions.len(), width]`;
/// a position at or past `len` is a row of `T::default()` (padding).
pub fn gather_rows<T: Copy + Default>(
    global: &[T],
    batch: usize,
    width: usize,
    positions: &[usize],
) -> Vec<T> {
    let len = global.len() / (batch * width).max(1);
    let mut out = Vec::with_capacity(batch * positions.len() * width);
    for b in 0..batch {
        for &p in positions {
            if p < len {
                let row = (b * len + p) * width;
                out.extend_from_slice(&global[row..row + width]);
            } else {
                out.resize(out.len() + width, T::default());
            }
        }
    }
    out
}

/// What a layout's positions hold: `len` real tokens, packed as documents of `doc_lens` laid end to
/// end (empty: one document), then padding up to the layout's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// Real tokens; positions from here on are padding.
    pub len: usize,
    /// Document lengths, summing to `len`; empty for one document.
    pub doc_lens: Vec<usize>,
}

impl Sequence {
    /// `len` real tokens in one document, no padding in a layout of `len`.
    pub fn unpadded(len: usize) -> Self {
        Sequence {
            len,
            doc_lens: Vec::new(),
        }
    }

    /// An error unless the documents are non-empty and sum to `len`, and `len` fits `layout_len`.
    pub fn check(&self, layout_len: usize) -> Result<(), RingError> {
        let sum: usize = self.doc_lens.iter().sum();
        if self.doc_lens.contains(&0) || (!self.doc_lens.is_empty() && sum != self.len) {
            return Err(RingError::Documents {
                doc_lens: self.doc_lens.clone(),
                len: self.len,
            });
        }
        if self.len > layout_len {
            return Err(RingError::SequenceTooLong {
                len: self.len,
                layout: layout_len,
            });
        }
        Ok(())
    }
}
