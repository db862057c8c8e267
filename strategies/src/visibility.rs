//! The one visibility rule: every query sees a window of key positions (its document's start up to
//! itself when causal, up to the document's end when not, cut to a sliding window of W keys either
//! side when there is one; padding sees only itself). Kernels mask with these windows, work counts
//! and layout solvers count with them.

/// What a query may see besides its document: the rule every window is made by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mask {
    /// Only keys at or before the query's position.
    pub causal: bool,
    /// A sliding window: only keys less than `W` positions away (`p − W < k`, and `k < p + W` when
    /// not causal); `None`: the whole document. `W ≥ 1`.
    pub window: Option<usize>,
}

impl Mask {
    /// The whole document, causal or not.
    pub fn causal(causal: bool) -> Mask {
        Mask {
            causal,
            window: None,
        }
    }
}

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

/// Visible (q, k) pairs of queries with windows `win_q` against keys at `pos_k`. Keys already in
/// ascending order are not copied, and windows whose bounds never decrease (queries in ascending
/// order, as every layout keeps them) are counted in one merge-like sweep, O(q + k); anything else
/// by binary search.
pub fn visible_pairs(win_q: &[Window], pos_k: &[usize]) -> u64 {
    let copy;
    let sorted = if pos_k.is_sorted() {
        pos_k
    } else {
        let mut keys = pos_k.to_vec();
        keys.sort_unstable();
        copy = keys;
        &copy
    };
    let monotone = win_q
        .windows(2)
        .all(|w| w[0].lo <= w[1].lo && w[0].hi <= w[1].hi);
    if monotone {
        // `first`: the first key at or past the window's start; `end`: one past its last key.
        let (mut first, mut end) = (0, 0);
        win_q
            .iter()
            .map(|w| {
                while first < sorted.len() && sorted[first] < w.lo {
                    first += 1;
                }
                while end < sorted.len() && sorted[end] <= w.hi {
                    end += 1;
                }
                end.saturating_sub(first) as u64
            })
            .sum()
    } else {
        win_q
            .iter()
            .map(|w| {
                let end = sorted.partition_point(|&k| k <= w.hi);
                end.saturating_sub(sorted.partition_point(|&k| k < w.lo)) as u64
            })
            .sum()
    }
}

/// The windows of queries at `positions` in a sequence of `len` real tokens made of documents of
/// `doc_lens` laid end to end (empty: one document), as `mask` says: a query at p sees
/// `[max(doc_start, p − W + 1), p]` when causal, `[max(doc_start, p − W + 1), min(doc_end − 1,
/// p + W − 1)]` when not (no `W`: the document's bounds). A position at or past `len` is padding: it
/// sees only itself, and no real query sees it.
pub fn windows(positions: &[usize], len: usize, doc_lens: &[usize], mask: Mask) -> Vec<Window> {
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
            let (start, end) = (starts[doc], starts[doc + 1]);
            let reach = mask.window.map_or(usize::MAX, |w| w.max(1) - 1);
            Window {
                lo: start.max(p.saturating_sub(reach)),
                hi: if mask.causal {
                    p
                } else {
                    (end - 1).min(p.saturating_add(reach))
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_and_the_binary_search_count_alike() {
        // Documents, a window, padding; keys in order, shuffled, and queries out of order.
        let mask = Mask {
            causal: false,
            window: Some(5),
        };
        let queries: Vec<usize> = (0..40).step_by(3).collect();
        let keys: Vec<usize> = (0..40).filter(|k| k % 4 != 1).collect();
        let shuffled: Vec<usize> = keys.iter().rev().copied().collect();
        let win = windows(&queries, 36, &[7, 20, 9], mask);
        let brute: u64 = win
            .iter()
            .map(|w| keys.iter().filter(|&&k| w.sees(k)).count() as u64)
            .sum();
        assert_eq!(visible_pairs(&win, &keys), brute);
        assert_eq!(visible_pairs(&win, &shuffled), brute);
        let backwards: Vec<Window> = win.iter().rev().copied().collect();
        assert_eq!(visible_pairs(&backwards, &keys), brute);
    }

    #[test]
    fn windows_follow_documents_causality_and_padding() {
        // Documents of 2 and 3 tokens, one padded position.
        let w = windows(&[0, 1, 2, 4, 5], 5, &[2, 3], Mask::causal(true));
        let pairs: Vec<(usize, usize)> = w.iter().map(|w| (w.lo, w.hi)).collect();
        assert_eq!(pairs, [(0, 0), (0, 1), (2, 2), (2, 4), (5, 5)]);
        let w = windows(&[1, 3], 5, &[2, 3], Mask::causal(false));
        assert_eq!((w[0].lo, w[0].hi, w[1].lo, w[1].hi), (0, 1, 2, 4));
        // No documents: plain causal and plain full attention.
        assert_eq!(
            windows(&[3], 8, &[], Mask::causal(true))[0],
            Window { lo: 0, hi: 3 }
        );
        assert_eq!(
            windows(&[3], 8, &[], Mask::causal(false))[0],
            Window { lo: 0, hi: 7 }
        );
    }

    #[test]
    fn a_sliding_window_cuts_each_side_and_stops_at_documents() {
        let window = |causal| Mask {
            causal,
            window: Some(3),
        };
        // Positions 0..10, documents 4 and 6: p sees p-2..=p (causal), p-2..=p+2 (not), in its document.
        let pairs = |causal| -> Vec<(usize, usize)> {
            windows(&[0, 3, 4, 6, 9], 10, &[4, 6], window(causal))
                .iter()
                .map(|w| (w.lo, w.hi))
                .collect()
        };
        assert_eq!(pairs(true), [(0, 0), (1, 3), (4, 4), (4, 6), (7, 9)]);
        assert_eq!(pairs(false), [(0, 2), (1, 3), (4, 6), (4, 8), (7, 9)]);
        // A window of 1 is the query alone; one wider than the sequence is no window.
        let one = Mask {
            causal: false,
            window: Some(1),
        };
        assert_eq!(windows(&[5], 10, &[], one)[0], Window { lo: 5, hi: 5 });
        let wide = Mask {
            causal: true,
            window: Some(100),
        };
        assert_eq!(
            windows(&[5], 10, &[], wide),
            windows(&[5], 10, &[], Mask::causal(true))
        );
    }
}
