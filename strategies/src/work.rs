//! Work accounting from the one visibility rule: every query sees a window of key positions (its
//! document's start up to itself when causal, up to the document's end when not; padding sees only
//! itself). The kernels mask with the same windows, so what is counted is what is computed.

use crate::Layout;

/// The key positions one query may see: `lo..=hi`. Causal: from its document's start to itself;
/// non-causal: its whole document; a padded query sees only itself (its output is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First visible key position.
    pub lo: usize,
    /// Last visible key position.
    pub hi: usize,
}

impl Window {
    /// Whether the key at `position` is visible.
    pub fn sees(&self, position: usize) -> bool {
        self.lo <= position && position <= self.hi
    }
}

/// Visible (q, k) pairs of queries with windows `win_q` against keys at `pos_k`.
pub fn visible_pairs(win_q: &[Window], pos_k: &[usize]) -> u64 {
    let mut sorted = pos_k.to_vec();
    sorted.sort_unstable();
    win_q
        .iter()
        .map(|w| {
            let end = sorted.partition_point(|&k| k <= w.hi);
            end.saturating_sub(sorted.partition_point(|&k| k < w.lo)) as u64
        })
        .sum()
}

/// The windows of queries at `positions` in a sequence of `len` real tokens made of documents of
/// `doc_lens` laid end to end (empty: one document), causal or not. A position at or past `len` is
/// padding: it sees only itself, and no real query sees it.
pub fn windows(positions: &[usize], len: usize, doc_lens: &[usize], causal: bool) -> Vec<Window> {
    // Document starts, ascending, ending with `len`.
    let mut starts = vec![0];
    for &l in doc_lens {
        starts.push(starts.last().copied().unwrap_or(0) + l);
    }
    if starts.last() != Some(&len) {
        starts.push(len);
    }
    positions
        .iter()
        .map(|&p| {
            if p >= len {
                return Window { lo: p, hi: p };
            }
            let doc = starts.partition_point(|&s| s <= p) - 1;
            let (lo, end) = (starts[doc], starts[doc + 1]);
            Window {
                lo,
                hi: if causal { p } else { end - 1 },
            }
        })
        .collect()
}

/// Visible (q, k) pairs of each rank's queries against the whole sequence: the work a rank does
/// over a ring pass, for a sequence of documents `doc_lens` (empty: one document).
pub fn work_per_rank(layout: &Layout, doc_lens: &[usize], causal: bool) -> Vec<u64> {
    let all: Vec<usize> = (0..layout.seq_len).collect();
    layout
        .positions
        .iter()
        .map(|mine| visible_pairs(&windows(mine, layout.seq_len, doc_lens, causal), &all))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Partition;

    #[test]
    fn windows_follow_documents_causality_and_padding() {
        // Documents of 2 and 3 tokens, one padded position.
        let w = windows(&[0, 1, 2, 4, 5], 5, &[2, 3], true);
        let pairs: Vec<(usize, usize)> = w.iter().map(|w| (w.lo, w.hi)).collect();
        assert_eq!(pairs, [(0, 0), (0, 1), (2, 2), (2, 4), (5, 5)]);
        let w = windows(&[1, 3], 5, &[2, 3], false);
        assert_eq!((w[0].lo, w[0].hi, w[1].lo, w[1].hi), (0, 1, 2, 4));
        // No documents: plain causal and plain full attention.
        assert_eq!(windows(&[3], 8, &[], true)[0], Window { lo: 0, hi: 3 });
        assert_eq!(windows(&[3], 8, &[], false)[0], Window { lo: 0, hi: 7 });
    }

    #[test]
    fn causal_work_of_a_contiguous_split() {
        let layout = crate::Contiguous.layout(8, 2).unwrap();
        // Rank 0: 1 + 2 + 3 + 4; rank 1: 5 + 6 + 7 + 8.
        assert_eq!(work_per_rank(&layout, &[], true), [10, 26]);
        assert_eq!(work_per_rank(&layout, &[4, 4], true), [10, 10]);
        assert_eq!(work_per_rank(&layout, &[], false), [32, 32]);
    }
}
