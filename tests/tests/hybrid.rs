//! Head × context parallelism (Ulysses inside, the ring outside) against the float64 reference, its
//! all-to-all's bytes against their formula, and its bad degrees as errors.

use burn::backend::{Autodiff, Flex};
use ringbench_tests::covering::{missing_pairs, pairwise};
use ringbench_tests::{
    BATCH, Case, F32_ATTENTION, HEAD_DIM, assert_within, case_with, job, ran_every_pass,
};
use strategies::names;
use workbench::block::BlockKind;
use workbench::dtype::{Dtype, Precision};
use workbench::ring::jobs::{AttentionResult, run_attention};
use workbench::transport::Phase;
use workbench::{BackwardScheme, Direction, Kernel, RingConfig, RingError};

type B = Autodiff<Flex>;

/// (ranks, ulysses): every Ulysses degree in {1, 2, 4} on every rank count in {2, 4, 8} it divides.
const GRIDS: [(usize, usize); 8] = [
    (2, 1),
    (2, 2),
    (4, 1),
    (4, 2),
    (4, 4),
    (8, 1),
    (8, 2),
    (8, 4),
];
/// (query heads, kv heads): multi-head, and grouped-query with kv heads at or above every degree
/// (8, 4: split) and below 4 (8, 2: at ulysses = 4 each rank holds one kv head, replicated).
const HEADS: [(usize, usize); 3] = [(4, 4), (8, 4), (8, 2)];

fn run_grid(
    c: &Case,
    strategy: &str,
    (ranks, ulysses): (usize, usize),
    config: RingConfig,
) -> Result<AttentionResult, RingError> {
    let mut job = job(c, strategy, ranks, config);
    job.ulysses = ulysses;
    run_attention::<B>(&job, &Default::default())
}

/// Every pair of values of strategy, kernel, grid, direction, scheme, causality, heads, packing and
/// length runs (a pairwise covering design, not the product), within the f32 bound of the reference;
/// every rank's all-to-all sent one block of each kind to each other member of its group (the
/// traffic's own records), and none without a group.
#[test]
fn ulysses_table() {
    let strategies = names();
    let docs: [&[usize]; 2] = [&[], &[10, 20, 18]];
    let seqs = [48, 40];
    let levels = [
        strategies.len(),
        Kernel::ALL.len(),
        GRIDS.len(),
        Direction::ALL.len(),
        BackwardScheme::ALL.len(),
        2, // causal
        HEADS.len(),
        docs.len(),
        seqs.len(),
    ];
    let design = pairwise(&levels);
    assert!(missing_pairs(&levels, &design).is_empty());
    let mut runs = 0;
    for row in &design {
        let [st, kn, gr, fw, bw, ca, hd, dc, sq] = row[..] else {
            unreachable!("one value an axis")
        };
        let (strategy, grid, causal) = (strategies[st], GRIDS[gr], ca == 1);
        let seq = if dc == 1 { 48 } else { seqs[sq] };
        let c = case_with(
            seq,
            HEADS[hd],
            causal,
            1.0 / (HEAD_DIM as f64).sqrt(),
            docs[dc],
        );
        let config = RingConfig {
            causal,
            forward: Direction::ALL[fw],
            backward: BackwardScheme::ALL[bw],
            kernel: Kernel::ALL[kn],
            ..Default::default()
        };
        let label = format!(
            "{row:?}: {strategy} N={} U={} S={seq} heads={:?} docs={:?} {config:?}",
            grid.0, grid.1, HEADS[hd], docs[dc]
        );
        let result =
            run_grid(&c, strategy, grid, config).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_within(&result, &c.want, F32_ATTENTION, &label);
        let exchanges = (grid.1 - 1) as u64;
        for (rank, traffic) in result.traffic.iter().enumerate() {
            for kind in [BlockKind::Q, BlockKind::K, BlockKind::Out, BlockKind::DQ] {
                let (n, _) = traffic.count(Phase::AllToAll, kind);
                assert_eq!(n as u64, exchanges, "{label}: rank {rank} {kind:?}");
            }
        }
        runs += usize::from(ran_every_pass(&result, grid.0));
    }
    println!(
        "ulysses table: {runs} runs cover every pair of {} axes",
        levels.len()
    );
    assert_eq!(runs, design.len());
}

/// Bytes each rank's all-to-alls send, kind by kind, against the formula: a rank holding `t` tokens
/// of every head sends each of the other U − 1 members its `t` tokens of that member's heads (to
/// heads: q, k, v forward, dO backward), and each member's `t` tokens of its own heads (to tokens:
/// out and lse forward, dq, dk, dv backward). Query heads split H/U a member; kv heads K/U, or one
/// (replicated) when K < U. And the ring inside carries whole shards (S / R tokens) of a member's
/// heads only.
#[test]
fn all_to_all_bytes_match_the_formula() {
    let seq = 48;
    for ((ranks, ulysses), (heads, kv_heads)) in
        [((4, 2), (4, 4)), ((4, 4), (8, 2)), ((8, 2), (8, 2))]
    {
        let c = case_with(seq, (heads, kv_heads), false, 0.25, &[]);
        let config = RingConfig {
            backward: BackwardScheme::Kv,
            ..Default::default()
        };
        let result = run_grid(&c, "zigzag", (ranks, ulysses), config).unwrap();
        let (u, ring) = (ulysses as u64, (ranks / ulysses) as u64);
        let t = (seq / ranks) as u64;
        let (b, d) = (BATCH as u64, HEAD_DIM as u64);
        let q_heads = (heads / ulysses) as u64;
        let kv_held = (kv_heads / ulysses).max(1) as u64;
        let exchange = |held: u64, width: u64| (u - 1) * b * held * t * width * 4;
        let expected = [
            (BlockKind::Q, exchange(q_heads, d)),
            (BlockKind::K, exchange(kv_held, d)),
            (BlockKind::V, exchange(kv_held, d)),
            (BlockKind::Out, exchange(q_heads, d)),
            (BlockKind::Lse, exchange(q_heads, 1)),
            (BlockKind::DOut, exchange(q_heads, d)),
            (BlockKind::DQ, exchange(q_heads, d)),
            (BlockKind::DK, exchange(kv_held, d)),
            (BlockKind::DV, exchange(kv_held, d)),
        ];
        let ring_kv_block = b * kv_held * (seq as u64 / ring) * d * 4;
        for (rank, traffic) in result.traffic.iter().enumerate() {
            let label = format!("N={ranks} U={ulysses} heads={heads}/{kv_heads} rank {rank}");
            for (kind, bytes) in expected {
                assert_eq!(
                    traffic.count(Phase::AllToAll, kind),
                    ((u - 1) as usize, bytes),
                    "{label}: {kind:?}"
                );
            }
            assert_eq!(
                traffic.count(Phase::Forward, BlockKind::K),
                ((ring - 1) as usize, (ring - 1) * ring_kv_block),
                "{label}: the ring's K"
            );
        }
    }
}

/// In bf16 every block of the all-to-alls travels at half the bytes of f32's, but lse (f32 always).
#[test]
fn bf16_all_to_alls_send_half_the_bytes() {
    let c = case_with(48, (8, 2), true, 0.25, &[]);
    let run = |dtype| {
        let config = RingConfig {
            causal: true,
            precision: Precision {
                dtype,
                merge: dtype,
            },
            ..Default::default()
        };
        run_grid(&c, "zigzag", (4, 4), config).unwrap()
    };
    let (f32_run, bf16_run) = (run(Dtype::F32), run(Dtype::Bf16));
    for (rank, (a, b)) in f32_run.traffic.iter().zip(&bf16_run.traffic).enumerate() {
        for kind in [
            BlockKind::Q,
            BlockKind::K,
            BlockKind::V,
            BlockKind::Out,
            BlockKind::DOut,
            BlockKind::DQ,
            BlockKind::DK,
            BlockKind::DV,
        ] {
            let (f, h) = (
                a.count(Phase::AllToAll, kind),
                b.count(Phase::AllToAll, kind),
            );
            assert!(
                f.0 == 3 && f == (h.0, 2 * h.1),
                "rank {rank} {kind:?}: f32 {f:?}, bf16 {h:?}"
            );
        }
        let lse = BlockKind::Lse;
        assert_eq!(a.count(Phase::AllToAll, lse), b.count(Phase::AllToAll, lse));
    }
}

/// A degree that does not divide the ranks, the query heads, or the kv heads (nor is a multiple of
/// them), or is 0: one error naming the numbers, before any rank starts.
#[test]
fn bad_degrees_are_errors_naming_the_numbers() {
    for ((ranks, ulysses), heads, says) in [
        ((4, 3), (4, 4), "must divide the 4 ranks"),
        ((4, 0), (4, 4), "must divide the 4 ranks"),
        ((8, 8), (4, 4), "must divide the 4 query heads"),
        ((2, 2), (6, 3), "must divide the 3 key/value heads"),
        (
            (4, 4),
            (12, 3),
            "must be a multiple of the 3 key/value heads",
        ),
    ] {
        let c = case_with(24, heads, true, 0.25, &[]);
        let error = run_grid(&c, "zigzag", (ranks, ulysses), RingConfig::default())
            .expect_err("a bad degree");
        let text = error.to_string();
        assert!(
            matches!(error, RingError::Ulysses { .. }) && text.contains(says),
            "N={ranks} U={ulysses} heads={heads:?}: {text}"
        );
    }
}
