//! Adding a strategy is one `Partition` impl and one registration: a throwaway strategy registered
//! here (its own test binary, so the registry changes nowhere else) runs in the exactness table's
//! rows, padded exactly where its own `validate` says, within the float64 bound.

use ringbench_tests::table::{check_case, design};
use ringbench_tests::{HEAD_DIM, case_with};
use strategies::{Partition, PartitionError, names, register};

/// Contiguous blocks handed out last rank first: rank r owns block N − 1 − r. Needs `ranks | seq`.
#[derive(Debug)]
struct Reversed;

impl Partition for Reversed {
    fn name(&self) -> &'static str {
        "reversed-throwaway"
    }

    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError> {
        if seq_len.is_multiple_of(ranks) {
            Ok(())
        } else {
            Err(PartitionError::TooShort {
                strategy: self.name(),
                seq_len,
                min: ranks,
            })
        }
    }

    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        let block = seq_len / ranks;
        let b = ranks - 1 - rank;
        (b * block..(b + 1) * block).collect()
    }
}

#[test]
fn a_registered_strategy_runs_in_the_exactness_table() {
    register(&Reversed).unwrap();
    let index = names()
        .iter()
        .position(|n| *n == "reversed-throwaway")
        .expect("registered");
    let rows = design();
    let ours = rows.iter().filter(|r| r[0] == index).count();
    assert!(ours >= 2, "the design gives the new strategy {ours} rows");
    // 40 tokens: 3 and 8 ranks do not divide it, so some of its rows run padded.
    for (seq, causal) in [(40, true), (48, false)] {
        let c = case_with(seq, (4, 4), causal, 1.0 / (HEAD_DIM as f64).sqrt(), &[]);
        let (runs, _) = check_case(&c, &format!("S={seq} with a new strategy"), causal);
        assert_eq!(runs, rows.len() * 3);
    }
}
