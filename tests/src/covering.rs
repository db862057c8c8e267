//! Pairwise covering designs: rows of axis values in which every pair of values of every two axes
//! appears at least once. An exactness table over many axes covers every pair of them in a few dozen
//! runs instead of running their full product (the product stays a `run` sweep).

use std::collections::BTreeSet;

/// A pair of (axis, value)s, the lower axis first.
type Pair = ((usize, usize), (usize, usize));

fn pairs_of(row: &[usize]) -> impl Iterator<Item = Pair> + '_ {
    (0..row.len()).flat_map(move |a| ((a + 1)..row.len()).map(move |b| ((a, row[a]), (b, row[b]))))
}

/// Rows of value indices, one per axis (axis i takes values `0..levels[i]`), covering every pair of
/// values of every two axes; deterministic. Greedy: each row starts from the first pair still
/// uncovered and picks, axis by axis, the value covering the most uncovered pairs with the axes
/// already set (the best of a few axis orders).
pub fn pairwise(levels: &[usize]) -> Vec<Vec<usize>> {
    let mut uncovered: BTreeSet<Pair> = BTreeSet::new();
    for a in 0..levels.len() {
        for b in (a + 1)..levels.len() {
            for va in 0..levels[a] {
                for vb in 0..levels[b] {
                    uncovered.insert(((a, va), (b, vb)));
                }
            }
        }
    }
    let mut rows = Vec::new();
    while let Some(&((a, va), (b, vb))) = uncovered.iter().next() {
        let mut best: Option<(usize, Vec<usize>)> = None;
        for attempt in 0..levels.len().max(1) {
            let mut row: Vec<Option<usize>> = vec![None; levels.len()];
            row[a] = Some(va);
            row[b] = Some(vb);
            // Axes in a rotated order, so that attempts differ.
            let order: Vec<usize> = (0..levels.len())
                .map(|i| (i + attempt) % levels.len())
                .filter(|&i| row[i].is_none())
                .collect();
            for axis in order {
                let gain = |value: usize| {
                    row.iter()
                        .enumerate()
                        .filter_map(|(other, v)| v.map(|v| (other, v)))
                        .filter(|&(other, v)| {
                            let pair = if other < axis {
                                ((other, v), (axis, value))
                            } else {
                                ((axis, value), (other, v))
                            };
                            uncovered.contains(&pair)
                        })
                        .count()
                };
                let value = (0..levels[axis])
                    .max_by_key(|&value| (gain(value), std::cmp::Reverse(value)))
                    .unwrap_or(0);
                row[axis] = Some(value);
            }
            let row: Vec<usize> = row.into_iter().map(|v| v.unwrap_or(0)).collect();
            let gain = pairs_of(&row).filter(|p| uncovered.contains(p)).count();
            if best.as_ref().is_none_or(|(g, _)| gain > *g) {
                best = Some((gain, row));
            }
        }
        let (_, row) = best.expect("at least one attempt");
        for pair in pairs_of(&row) {
            uncovered.remove(&pair);
        }
        rows.push(row);
    }
    rows
}

/// The pairs of values of two axes that no row of `rows` holds (empty when `rows` covers them all).
pub fn missing_pairs(levels: &[usize], rows: &[Vec<usize>]) -> Vec<Pair> {
    let mut missing = Vec::new();
    for a in 0..levels.len() {
        for b in (a + 1)..levels.len() {
            for va in 0..levels[a] {
                for vb in 0..levels[b] {
                    if !rows.iter().any(|r| r[a] == va && r[b] == vb) {
                        missing.push(((a, va), (b, vb)));
                    }
                }
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_is_covered_in_far_fewer_rows_than_the_product() {
        let levels = [4, 2, 5, 2, 3, 2, 2, 2, 3, 2, 2, 2];
        let rows = pairwise(&levels);
        assert!(missing_pairs(&levels, &rows).is_empty());
        let product: usize = levels.iter().product();
        // At least the two largest axes' product; the greedy stays within twice that here.
        assert!(rows.len() >= 20 && rows.len() <= 40, "{} rows", rows.len());
        assert!(rows.len() * 100 < product);
        assert_eq!(pairwise(&levels), rows, "deterministic");
    }

    #[test]
    fn a_missing_pair_is_found() {
        let rows = vec![vec![0, 0], vec![1, 1]];
        assert_eq!(
            missing_pairs(&[2, 2], &rows),
            [((0, 0), (1, 1)), ((0, 1), (1, 0))]
        );
    }
}
