//! Causal mask geometry from global positions, shared by both kernels: what a mask leaves of a tile
//! or sub-tile, how many pairs it lets through, and the additive mask itself.

/// What a causal mask leaves of a block of queries against a block of keys, from their position spans.
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

/// The cover of queries spanning `(q_lo, q_hi)` against keys spanning `(k_lo, k_hi)`.
pub fn cover(causal: bool, (q_lo, q_hi): (usize, usize), (k_lo, k_hi): (usize, usize)) -> Cover {
    if !causal || k_hi <= q_lo {
        Cover::Full
    } else if k_lo > q_hi {
        Cover::Empty
    } else {
        Cover::Partial
    }
}

/// How much of a whole tile a causal mask lets through, with its pair count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// No (q, k) pair is visible: the tile is skipped.
    None,
    /// Every pair is visible: no mask is built.
    Full,
    /// Some pairs are visible (this many).
    Partial { pairs: u64 },
}

impl Visibility {
    /// Derives the tile's visibility from global positions.
    pub fn of(pos_q: &[usize], pos_k: &[usize], causal: bool) -> Self {
        if pos_q.is_empty() || pos_k.is_empty() {
            return Visibility::Full;
        }
        match cover(causal, span(pos_q), span(pos_k)) {
            Cover::Empty => Visibility::None,
            Cover::Full => Visibility::Full,
            Cover::Partial => Visibility::Partial {
                pairs: strategies::causal_pairs(pos_q, pos_k),
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

/// Additive causal mask `[tq · tk]`: 0 where key j is visible to query i, −∞ elsewhere.
pub fn causal_bias(pos_q: &[usize], pos_k: &[usize]) -> Vec<f32> {
    pos_q
        .iter()
        .flat_map(|&q| {
            pos_k
                .iter()
                .map(move |&k| if k <= q { 0.0 } else { f32::NEG_INFINITY })
        })
        .collect()
}
