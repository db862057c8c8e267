//! Work accounting from the visibility rule ([`crate::visibility`]): the (q, k) pairs each rank's
//! queries see over a ring pass, so that what is counted is what is computed.

use crate::Layout;
use crate::visibility::{Mask, visible_pairs, windows};

/// Visible (q, k) pairs of each rank's queries against the whole sequence: the work a rank does
/// over a ring pass, for a sequence of documents `doc_lens` (empty: one document) masked by `mask`.
pub fn work_per_rank(layout: &Layout, doc_lens: &[usize], mask: Mask) -> Vec<u64> {
    let all: Vec<usize> = (0..layout.seq_len).collect();
    layout
        .positions
        .iter()
        .map(|mine| visible_pairs(&windows(mine, layout.seq_len, doc_lens, mask), &all))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Partition;

    #[test]
    fn causal_work_of_a_contiguous_split() {
        let layout = crate::Contiguous.layout(8, 2).unwrap();
        // Rank 0: 1 + 2 + 3 + 4; rank 1: 5 + 6 + 7 + 8.
        assert_eq!(work_per_rank(&layout, &[], Mask::causal(true)), [10, 26]);
        assert_eq!(
            work_per_rank(&layout, &[4, 4], Mask::causal(true)),
            [10, 10]
        );
        assert_eq!(work_per_rank(&layout, &[], Mask::causal(false)), [32, 32]);
    }
}
