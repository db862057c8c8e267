//! Mask geometry from global positions, shared by both kernels. Every query sees one window of key
//! positions ([`Window`], defined with the work accounting in `strategies`: causal, non-causal,
//! packed documents and padding are all windows); this file says what the windows leave of a tile
//! or sub-tile and builds the additive mask itself.

pub use strategies::{Mask, Window, visible_pairs, windows};

/// What a mask leaves of a block of queries against a block of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cover {
    /// No key is visible to any query.
    Empty,
    /// Every key is visible to every query: no mask is needed.
    Full,
    /// Some pairs are visible.
    Partial,
}

/// `(lowest, highest)` of `positions`; `(usize::MAX, 0)` when empty.
pub fn span(positions: &[usize]) -> (usize, usize) {
    positions
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), &p| (lo.min(p), hi.max(p)))
}

/// The extremes of a set of windows: what every one of them sees, and what any one of them does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Smallest and largest `lo`.
    pub lo: (usize, usize),
    /// Smallest and largest `hi`.
    pub hi: (usize, usize),
}

impl Bounds {
    /// The bounds of `windows`.
    pub fn of<'a>(windows: impl IntoIterator<Item = &'a Window>) -> Bounds {
        windows.into_iter().fold(
            Bounds {
                lo: (usize::MAX, 0),
                hi: (usize::MAX, 0),
            },
            |b, w| Bounds {
                lo: (b.lo.0.min(w.lo), b.lo.1.max(w.lo)),
                hi: (b.hi.0.min(w.hi), b.hi.1.max(w.hi)),
            },
        )
    }

    /// What the windows leave of keys spanning `(k_lo, k_hi)`.
    pub fn cover(&self, (k_lo, k_hi): (usize, usize)) -> Cover {
        if k_hi < self.lo.0 || k_lo > self.hi.1 {
            Cover::Empty
        } else if k_lo >= self.lo.1 && k_hi <= self.hi.0 {
            Cover::Full
        } else {
            Cover::Partial
        }
    }
}

/// How much of a whole tile the mask lets through, with its pair count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// No (q, k) pair is visible: the tile is skipped.
    None,
    /// Every pair is visible: no mask is built.
    Full,
    /// Some pairs are visible (this many).
    Partial {
        /// Visible pairs.
        pairs: u64,
    },
}

impl Visibility {
    /// Its name in traces: `skipped`, `full` or `masked`.
    pub fn name(self) -> &'static str {
        match self {
            Visibility::None => "skipped",
            Visibility::Full => "full",
            Visibility::Partial { .. } => "masked",
        }
    }

    /// The tile's visibility: queries with windows `win_q` against keys at `pos_k`.
    pub fn of(win_q: &[Window], pos_k: &[usize]) -> Self {
        if win_q.is_empty() || pos_k.is_empty() {
            return Visibility::Full;
        }
        match Bounds::of(win_q).cover(span(pos_k)) {
            Cover::Empty => Visibility::None,
            Cover::Full => Visibility::Full,
            Cover::Partial => match visible_pairs(win_q, pos_k) {
                0 => Visibility::None,
                pairs => Visibility::Partial { pairs },
            },
        }
    }

    /// Visible (q, k) pairs of a `tq × tk` tile.
    pub fn pairs(&self, tq: usize, tk: usize) -> u64 {
        match self {
            Visibility::None => 0,
            Visibility::Full => (tq * tk) as u64,
            Visibility::Partial { pairs } => *pairs,
        }
    }
}

/// Additive mask `[tq · tk]`: 0 where key j is in query i's window, −∞ elsewhere.
pub fn bias(win_q: &[Window], pos_k: &[usize]) -> Vec<f32> {
    win_q
        .iter()
        .flat_map(|w| {
            pos_k
                .iter()
                .map(move |&k| if w.sees(k) { 0.0 } else { f32::NEG_INFINITY })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_counts_pairs_inside_windows_only() {
        let w = windows(&[0, 1, 2, 3, 4], 5, &[2, 3], strategies::Mask::causal(true));
        // Pairs: 1 + 2 + 1 + 2 + 3.
        assert_eq!(visible_pairs(&w, &[0, 1, 2, 3, 4]), 9);
        assert_eq!(Visibility::of(&w[..2], &[2, 3, 4]), Visibility::None);
        assert_eq!(Visibility::of(&w[3..], &[2, 3]), Visibility::Full);
        assert_eq!(
            Visibility::of(&w, &[4, 0]),
            Visibility::Partial { pairs: 1 + 1 + 1 }
        );
        let b = bias(&w[1..2], &[0, 1, 2]);
        assert_eq!(b, [0.0, 0.0, f32::NEG_INFINITY]);
    }
}
