//! Property tests of every registered partition strategy.

use strategies::{Partition, PartitionError, by_name, names, work_per_rank};

const RANKS: [usize; 6] = [1, 2, 3, 4, 8, 16];

fn layouts() -> impl Iterator<Item = (&'static dyn Partition, usize, usize)> {
    names().into_iter().flat_map(|name| {
        let strategy = by_name(name).unwrap();
        RANKS
            .into_iter()
            .flat_map(move |n| [2 * n, 6 * n, 32 * n].map(move |s| (strategy, s, n)))
    })
}

#[test]
fn every_position_owned_exactly_once() {
    for (strategy, seq_len, ranks) in layouts() {
        let layout = strategy.layout(seq_len, ranks).unwrap();
        let mut count = vec![0usize; seq_len];
        for owned in &layout.positions {
            assert_eq!(
                owned.len(),
                seq_len / ranks,
                "{} equal shards",
                strategy.name()
            );
            for &p in owned {
                count[p] += 1;
            }
        }
        assert!(
            count.iter().all(|&c| c == 1),
            "{} S={seq_len} N={ranks}: {count:?}",
            strategy.name()
        );
    }
}

#[test]
fn shard_then_unshard_is_identity() {
    for (strategy, seq_len, ranks) in layouts() {
        let layout = strategy.layout(seq_len, ranks).unwrap();
        let row = 3;
        let global: Vec<u32> = (0..(seq_len * row) as u32).collect();
        let shards = layout.shard(&global, row);
        assert_eq!(layout.unshard(&shards, row), global, "{}", strategy.name());
    }
}

#[test]
fn causal_work_balance() {
    for ranks in RANKS {
        let seq_len = 64 * ranks;
        let work = |name| {
            work_per_rank(
                &by_name(name).unwrap().layout(seq_len, ranks).unwrap(),
                &[],
                strategies::Mask::causal(true),
            )
        };
        let total: u64 = (1..=seq_len as u64).sum();

        let zigzag = work("zigzag");
        assert!(
            zigzag.iter().all(|&w| w == zigzag[0]),
            "zigzag equal: {zigzag:?}"
        );
        assert_eq!(zigzag.iter().sum::<u64>(), total);

        // Striped: rank r's row j (position jN + r) sees jN + r + 1 keys, so rank r does exactly one
        // key per row (S/N rows) more than rank r − 1: ranks a and b differ by |a − b| · S/N pairs.
        let striped = work("striped");
        let rows = (seq_len / ranks) as u64;
        for (r, w) in striped.iter().enumerate() {
            assert_eq!(
                *w,
                striped[0] + r as u64 * rows,
                "striped one row per rank step: {striped:?}"
            );
        }
        assert_eq!(striped.iter().sum::<u64>(), total);

        let contiguous = work("contiguous");
        let max = *contiguous.iter().max().unwrap() as f64;
        let mean = total as f64 / ranks as f64;
        let expected = (2 * ranks - 1) as f64 / ranks as f64;
        // Exact ratio is (2N−1)/N + O(N/S); S = 64N keeps the O(1/S) term under 1%.
        assert!(
            (max / mean - expected).abs() <= 0.01 * expected,
            "contiguous max/mean {} vs (2N-1)/N {expected}",
            max / mean
        );
    }
}

#[test]
fn typed_errors_name_the_values() {
    let err = by_name("zigzag").unwrap().layout(1000, 8).unwrap_err();
    assert_eq!(
        err,
        PartitionError::NotDivisible {
            strategy: "zigzag",
            seq_len: 1000,
            divisor: 16,
            rule: "2 * ranks"
        }
    );
    assert_eq!(
        err.to_string(),
        "sequence length 1000 is not divisible by 16 (2 * ranks) required by zigzag"
    );
    assert!(matches!(
        by_name("striped").unwrap().layout(10, 3),
        Err(PartitionError::NotDivisible { divisor: 3, .. })
    ));
    assert!(matches!(
        by_name("contiguous").unwrap().layout(8, 0),
        Err(PartitionError::NoRanks { .. })
    ));
    let unknown = by_name("diagonal").unwrap_err();
    assert!(unknown.to_string().contains("diagonal") && unknown.to_string().contains("zigzag"));
}

#[test]
fn zigzag_layout_matches_definition() {
    let layout = by_name("zigzag").unwrap().layout(16, 2).unwrap();
    assert_eq!(layout.positions[0], vec![0, 1, 2, 3, 12, 13, 14, 15]);
    assert_eq!(layout.positions[1], vec![4, 5, 6, 7, 8, 9, 10, 11]);
    let striped = by_name("striped").unwrap().layout(6, 3).unwrap();
    assert_eq!(striped.positions, vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
}
