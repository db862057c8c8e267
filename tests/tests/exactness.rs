//! The declarative exactness table: every pair of strategy, kernel (fused, generic twin), ranks and
//! forward direction (a covering design) with every backward scheme, × causal × {MHA, GQA}, against
//! the float64 reference, plus scheme agreement and traffic accounting.

use burn::backend::{Autodiff, Flex};
use ringbench_tests::table::{RANKS, check_case, design, run};
use ringbench_tests::{
    BATCH, Case, F32_ATTENTION, HEAD_DIM, assert_within, case_with, deviations,
    f32_attention_bound, job, ran_every_pass,
};
use strategies::{by_name, names};
use workbench::block::BlockKind;
use workbench::ring::jobs::{Fault, FaultKind, run_attention};
use workbench::transport::Phase;
use workbench::{BackwardScheme, Direction, Kernel, RingConfig, RingError};

type B = Autodiff<Flex>;

/// Max-abs error relative to each tensor's max magnitude, in f32 (derived in [`F32_ATTENTION`]).
const TOLERANCE: f64 = F32_ATTENTION;
const SEQ_LENS: [usize; 2] = [48, 40];
/// (query heads, kv heads): multi-head and grouped-query (8 query heads sharing 2 kv heads).
const HEADS: [(usize, usize); 2] = [(4, 4), (8, 2)];

fn case(seq: usize, heads: (usize, usize), causal: bool) -> Case {
    case_with(seq, heads, causal, 1.0 / (HEAD_DIM as f64).sqrt(), &[])
}

fn case_scaled(seq: usize, heads: (usize, usize), causal: bool, scale: f64) -> Case {
    case_with(seq, heads, causal, scale, &[])
}

#[test]
fn exactness_table() {
    let (mut runs, mut padded) = (0, 0);
    for seq in SEQ_LENS {
        for heads in HEADS {
            for causal in [false, true] {
                let c = case(seq, heads, causal);
                let (r, p) = check_case(
                    &c,
                    &format!("S={seq} heads={heads:?} causal={causal}"),
                    causal,
                );
                runs += r;
                padded += p;
            }
        }
    }
    println!("exactness table: {runs} runs, {padded} of them padded");
    let per_case = design().len() * BackwardScheme::ALL.len();
    assert_eq!(runs, SEQ_LENS.len() * HEADS.len() * 2 * per_case);
    // S = 40 does not split into zig-zag's 16 chunks on 8 ranks, nor into 3 ranks: those run padded.
    assert!(padded > 0);
}

/// (name, length, (heads, kv heads), causal, document lengths).
type PackedCase = (&'static str, usize, (usize, usize), bool, &'static [usize]);

/// Packed documents and lengths no strategy splits: document-causal (and document-only) masks from
/// global positions, padding masked as keys and dropped as outputs.
#[test]
fn packed_and_padded_table() {
    let cases: [PackedCase; 6] = [
        ("documents 5/17/26", 48, (4, 4), true, &[5, 17, 26]),
        (
            "5 documents, GQA 8/2",
            96,
            (8, 2),
            true,
            &[7, 30, 11, 24, 24],
        ),
        (
            "documents 5/17/26, non-causal",
            48,
            (4, 4),
            false,
            &[5, 17, 26],
        ),
        ("S=47", 47, (4, 4), true, &[]),
        ("S=45 non-causal", 45, (8, 2), false, &[]),
        ("S=61, documents 10/51", 61, (4, 4), true, &[10, 51]),
    ];
    let (mut runs, mut padded) = (0, 0);
    for (name, seq, heads, causal, doc_lens) in cases {
        let c = case_with(seq, heads, causal, 1.0 / (HEAD_DIM as f64).sqrt(), doc_lens);
        let (r, p) = check_case(&c, name, causal);
        runs += r;
        padded += p;
    }
    println!("packed and padded table: {runs} runs, {padded} of them padded");
    assert_eq!(runs, 6 * design().len() * BackwardScheme::ALL.len());
    // 47, 45 and 61 split over no rank count above 1 but their divisors: those runs pad (doc-zigzag
    // never needs to).
    assert!(padded > runs / 4, "{padded} of {runs}");
    // doc-zigzag gave some ranks more tokens than others here, and the ring was exact anyway.
    let doc_zigzag = by_name("doc-zigzag").unwrap();
    let layout = doc_zigzag.layout_packed(61, &[10, 51], 8).unwrap();
    let lens: Vec<usize> = (0..8).map(|r| layout.shard_len(r)).collect();
    assert!(lens.iter().min() < lens.iter().max(), "{lens:?}");
}

/// The variants (sliding windows, logit soft-capping, attention sinks) against the float64 reference,
/// over every strategy, kernel, rank count, direction, scheme, causality, head layout, packing and
/// length: a pairwise covering design (every pair of values of every two axes runs at least once),
/// not their product, so the table's time stays flat as axes join. Windows: 5 (shorter than a shard
/// at N ≤ 8) and 20 (crossing documents); a cap of 4 (scores reach ±8 here, so it bends them);
/// sinks of either sign.
#[test]
fn variants_table() {
    use ringbench_tests::Variant;
    use ringbench_tests::covering::{missing_pairs, pairwise};
    let strategies = names();
    let windows = [None, Some(5), Some(20)];
    let softcaps = [None, Some(4.0)];
    let heads = [(4, 4), (8, 2)];
    let docs: [&[usize]; 2] = [&[], &[10, 20, 18]];
    let seqs = [48, 40];
    let levels = [
        strategies.len(),
        Kernel::ALL.len(),
        RANKS.len(),
        Direction::ALL.len(),
        BackwardScheme::ALL.len(),
        2, // causal
        heads.len(),
        docs.len(),
        windows.len(),
        softcaps.len(),
        2, // sinks
        seqs.len(),
    ];
    let design = pairwise(&levels);
    assert!(missing_pairs(&levels, &design).is_empty());
    let mut runs = 0;
    for row in &design {
        let [st, kn, rk, fw, bw, ca, hd, dc, wn, sc, sk, sq] = row[..] else {
            unreachable!("one value a axis")
        };
        let (strategy, ranks, causal) = (strategies[st], RANKS[rk], ca == 1);
        // Packed documents fill 48 tokens: with them the case is 48 long.
        let seq = if dc == 1 { 48 } else { seqs[sq] };
        let h = heads[hd].0;
        let variant = Variant {
            window: windows[wn],
            softcap: softcaps[sc],
            sinks: (sk == 1).then(|| (0..h).map(|i| i as f32 * 0.75 - 1.5).collect()),
        };
        let c = ringbench_tests::case_variant(
            seq,
            heads[hd],
            causal,
            1.0 / (HEAD_DIM as f64).sqrt(),
            docs[dc],
            variant,
        );
        let config = RingConfig {
            causal,
            forward: Direction::ALL[fw],
            backward: BackwardScheme::ALL[bw],
            kernel: Kernel::ALL[kn],
            ..Default::default()
        };
        let label = format!(
            "{row:?}: {strategy} N={ranks} S={seq} {config:?} {:?}",
            c.variant
        );
        let result = run(&c, strategy, ranks, config).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_within(&result, &c.want, TOLERANCE, &label);
        assert_eq!(
            result.grads.as_ref().map(|g| g.dsinks.is_some()),
            Some(c.variant.sinks.is_some()),
            "{label}"
        );
        runs += usize::from(ran_every_pass(&result, ranks));
    }
    println!(
        "variants table: {runs} runs cover every pair of {} axes",
        levels.len()
    );
    assert_eq!(runs, design.len());
}

/// A window of one token: every query sees only itself, so out = v, and dq and dk cancel to zero
/// exactly (p = 1, dP = δ). Their computed values are rounding noise, which the comparison measures
/// against the terms that cancelled (`Reference::dq_terms`), not against a scale of zero; a wrong
/// mask (a second visible key) would make them as large as those terms.
#[test]
fn a_window_of_one_attends_each_query_to_itself() {
    use ringbench_tests::Variant;
    let variant = Variant {
        window: Some(1),
        ..Variant::default()
    };
    for causal in [true, false] {
        let c = ringbench_tests::case_variant(32, (4, 2), causal, 0.25, &[], variant.clone());
        assert!(c.want.dq.iter().chain(&c.want.dk).all(|&x| x == 0.0));
        for strategy in ["contiguous", "zigzag"] {
            for kernel in Kernel::ALL {
                let config = RingConfig {
                    causal,
                    kernel,
                    scale: Some(0.25),
                    ..Default::default()
                };
                let result = run(&c, strategy, 4, config).unwrap();
                let label = format!("window 1, {strategy}, {kernel:?}, causal {causal}");
                assert_within(&result, &c.want, TOLERANCE, &label);
            }
        }
    }
}

/// A causal window no wider than a shard (W = S / N = 8 on 8 contiguous ranks of 8 tokens) lets each
/// rank see only its own keys and its predecessor's: the ring stops after two steps. Each rank's
/// forward sends one K and one V block (not N − 1 = 7 of each), and the kv backward sends K and V
/// once and its dK/dV accumulator twice (on, then straight home). A pass stops early only when its
/// cargo flows the way causality looks, keys towards later queries: kv-reverse sends K and V the
/// other way, and the q scheme sends the queries forward, so a rank meets its successor's queries
/// (or, reversed, its predecessor's keys) last and both need the whole ring (7 hops, the
/// accumulator 8). The outputs stay exact either way.
#[test]
fn a_causal_window_within_a_shard_stops_the_forward_and_kv_backward_after_two_steps() {
    use ringbench_tests::Variant;
    let (seq, ranks) = (64, 8);
    let variant = Variant {
        window: Some(seq / ranks),
        ..Variant::default()
    };
    let c = ringbench_tests::case_variant(seq, (4, 2), true, 0.25, &[], variant);
    for backward in BackwardScheme::ALL {
        let config = RingConfig {
            causal: true,
            backward,
            scale: Some(0.25),
            ..Default::default()
        };
        let result = run(&c, "contiguous", ranks, config).unwrap();
        assert_within(
            &result,
            &c.want,
            TOLERANCE,
            &format!("window 8, {backward}"),
        );
        let expected: &[(Phase, BlockKind, usize)] = match backward {
            BackwardScheme::Kv => &[
                (Phase::Forward, BlockKind::K, 1),
                (Phase::Forward, BlockKind::V, 1),
                (Phase::Backward, BlockKind::K, 1),
                (Phase::Backward, BlockKind::V, 1),
                (Phase::Backward, BlockKind::DK, 2),
                (Phase::Backward, BlockKind::DV, 2),
            ],
            BackwardScheme::KvReverse => &[
                (Phase::Forward, BlockKind::K, 1),
                (Phase::Forward, BlockKind::V, 1),
                (Phase::Backward, BlockKind::K, 7),
                (Phase::Backward, BlockKind::V, 7),
                (Phase::Backward, BlockKind::DK, 8),
                (Phase::Backward, BlockKind::DV, 8),
            ],
            BackwardScheme::Q => &[
                (Phase::Forward, BlockKind::K, 1),
                (Phase::Forward, BlockKind::V, 1),
                (Phase::Backward, BlockKind::Q, 7),
                (Phase::Backward, BlockKind::DOut, 7),
                (Phase::Backward, BlockKind::Lse, 7),
                (Phase::Backward, BlockKind::Delta, 7),
                (Phase::Backward, BlockKind::DQ, 8),
            ],
        };
        let blocks = |phase| {
            expected
                .iter()
                .filter(|e| e.0 == phase)
                .map(|e| e.2)
                .sum::<usize>()
        };
        for (rank, traffic) in result.traffic.iter().enumerate() {
            for &(phase, kind, n) in expected {
                assert_eq!(
                    traffic.count(phase, kind).0,
                    n,
                    "{backward} rank {rank}: {kind:?}"
                );
            }
            let sends = |phase| traffic.sends.iter().filter(|s| s.phase == phase).count();
            assert_eq!(
                sends(Phase::Forward),
                blocks(Phase::Forward),
                "{backward} rank {rank}"
            );
            assert_eq!(
                sends(Phase::Backward),
                blocks(Phase::Backward),
                "{backward} rank {rank}"
            );
        }
        // The engine ran two steps of each pass on every rank (all 8 of the other backwards).
        let backward_steps = if backward == BackwardScheme::Kv { 2 } else { 8 };
        for events in &result.events {
            let last = |phase| {
                events
                    .iter()
                    .filter(|e| e.phase == phase)
                    .map(|e| e.step)
                    .max()
            };
            assert_eq!(last(Phase::Forward), Some(1), "{backward}");
            assert_eq!(
                last(Phase::Backward),
                Some(backward_steps - 1),
                "{backward}"
            );
        }
    }
}

/// The checks catch a wrong kernel whose output holds NaN: one forward tile of one rank reads all-NaN
/// values (the engine's test hook), on both kernels, and the table's assertion fails naming the
/// tensor. (Folded with `f64::max`, as the comparison once was, those NaNs counted as no error.)
#[test]
fn a_poisoned_tile_fails_the_table() {
    let c = case(48, (4, 4), true);
    for kernel in Kernel::ALL {
        let config = RingConfig {
            causal: true,
            kernel,
            ..Default::default()
        };
        let mut poisoned = job(&c, "zigzag", 4, config);
        poisoned.fault = Some(Fault {
            rank: 1,
            phase: workbench::transport::Phase::Forward,
            step: 0,
            kind: FaultKind::PoisonTile,
        });
        let result = run_attention::<B>(&poisoned, &Default::default()).unwrap();
        assert!(
            result.out.data.iter().any(|x| x.is_nan()),
            "{kernel}: the poisoned tile left no NaN in the output"
        );
        let found = deviations(&result, &c.want);
        assert_eq!(found[0].0, "out");
        assert!(!found[0].1.within(TOLERANCE), "{kernel}: {}", found[0].1);
        let label = format!("poisoned {kernel}");
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_within(&result, &c.want, TOLERANCE, &label)
        }));
        let message = failed.expect_err("the table's assertion passed a NaN output");
        let message = message
            .downcast_ref::<String>()
            .expect("assert! panics with a message");
        assert!(
            message.contains("poisoned") && message.contains("out got NaN"),
            "{message}"
        );
        // The same job without the hook passes.
        let clean = run(&c, "zigzag", 4, config).unwrap();
        assert_within(&clean, &c.want, TOLERANCE, "clean");
    }
}

#[test]
fn documents_that_do_not_sum_to_the_length_are_an_error() {
    let mut c = case(48, (4, 4), true);
    for bad in [vec![5, 17], vec![0, 48], vec![50]] {
        c.doc_lens = bad.clone();
        let e = run(&c, "zigzag", 2, RingConfig::default()).unwrap_err();
        assert!(
            matches!(&e, RingError::Documents { doc_lens, len: 48 } if *doc_lens == bad),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn traffic_is_counted_per_cargo() {
    let (heads, kv_heads) = (8, 2);
    let c = case(48, (heads, kv_heads), true);
    for ranks in RANKS {
        let t = 48 / ranks;
        let kv_bytes = (BATCH * kv_heads * t * HEAD_DIM * 4) as u64;
        let q_bytes = (BATCH * heads * t * HEAD_DIM * 4) as u64;
        let row_bytes = (BATCH * heads * t * 4) as u64;
        let hops = (ranks - 1) as u64;
        let home = if ranks > 1 { ranks as u64 } else { 0 };
        for backward in BackwardScheme::ALL {
            let config = RingConfig {
                causal: true,
                backward,
                ..Default::default()
            };
            let result = run(&c, "zigzag", ranks, config).unwrap();
            for traffic in &result.traffic {
                let count = |phase, cargo| {
                    let (n, bytes) = traffic.count(phase, cargo);
                    (n as u64, bytes)
                };
                assert_eq!(count(Phase::Forward, BlockKind::K), (hops, hops * kv_bytes));
                assert_eq!(count(Phase::Forward, BlockKind::V), (hops, hops * kv_bytes));
                let expected: &[(BlockKind, u64, u64)] = match backward {
                    BackwardScheme::Kv | BackwardScheme::KvReverse => &[
                        (BlockKind::K, hops, kv_bytes),
                        (BlockKind::V, hops, kv_bytes),
                        (BlockKind::DK, home, kv_bytes),
                        (BlockKind::DV, home, kv_bytes),
                    ],
                    BackwardScheme::Q => &[
                        (BlockKind::Q, hops, q_bytes),
                        (BlockKind::DOut, hops, q_bytes),
                        (BlockKind::Lse, hops, row_bytes),
                        (BlockKind::Delta, hops, row_bytes),
                        (BlockKind::DQ, home, q_bytes),
                    ],
                };
                for &(cargo, n, bytes) in expected {
                    assert_eq!(
                        count(Phase::Backward, cargo),
                        (n, n * bytes),
                        "{backward} {cargo:?} N={ranks}"
                    );
                }
                let expected_total: u64 =
                    2 * hops * kv_bytes + expected.iter().map(|(_, n, b)| n * b).sum::<u64>();
                assert_eq!(
                    traffic.total_bytes(),
                    expected_total,
                    "nothing else is sent"
                );
            }
        }
    }
}

#[test]
fn causal_tiles_are_skipped_and_counted() {
    let c = case(48, (4, 4), true);
    for strategy in names() {
        let result = run(
            &c,
            strategy,
            4,
            RingConfig {
                causal: true,
                ..Default::default()
            },
        )
        .unwrap();
        let pairs: u64 = result
            .events
            .iter()
            .flatten()
            .filter(|e| e.phase == Phase::Forward)
            .map(|e| e.pairs)
            .sum();
        // Σ over queries of visible keys, times batch and heads.
        let causal_pairs = (48 * 49 / 2) as u64 * (BATCH * 4) as u64;
        assert_eq!(pairs, causal_pairs, "{strategy}");
    }
}

/// A tile whose queries and keys lie in different documents is skipped: no compute, no pairs; and a
/// ring step no rank can see is not run at all.
#[test]
fn cross_document_tiles_are_skipped_and_counted() {
    // Two documents of 24 on 2 contiguous ranks: each rank holds one document whole.
    let c = case_with(48, (4, 4), true, 0.25, &[24, 24]);
    for causal in [true, false] {
        let config = RingConfig {
            causal,
            ..Default::default()
        };
        let result = run(&c, "contiguous", 2, config).unwrap();
        let forward: Vec<_> = result
            .events
            .iter()
            .flatten()
            .filter(|e| e.phase == Phase::Forward)
            .collect();
        // Each rank attends its own block (step 0); no rank can see the other's document, so the
        // ring stops there: no step 1, and nothing is sent, forward or backward.
        for e in &forward {
            assert_eq!(e.step, 0, "causal={causal}: {e:?}");
            assert!(e.pairs > 0 && e.flops > 0, "causal={causal}: {e:?}");
        }
        assert_eq!(forward.len(), 2);
        for traffic in &result.traffic {
            assert_eq!(traffic.total_bytes(), 0, "causal={causal}: {traffic:?}");
        }
        let per_doc = if causal { 24 * 25 / 2 } else { 24 * 24 };
        let pairs: u64 = forward.iter().map(|e| e.pairs).sum();
        assert_eq!(pairs, 2 * per_doc * (BATCH * 4) as u64, "causal={causal}");
    }
}

/// Lengths that span several fused sub-tiles in both directions (128 rows × 128 keys), so that the
/// sub-tile skipping, partial masks and online-softmax rescaling across sub-tiles are exercised: every
/// backward scheme and both directions, zig-zag on 4 ranks, and a softmax scale other than the default;
/// each within the f32 bound of its tiles' length ([`f32_attention_bound`]: 4.1e-5 for 640 keys).
#[test]
fn fused_kernel_across_sub_tiles() {
    let cases: [(usize, &str, usize, Direction, f64); 5] = [
        (640, "contiguous", 1, Direction::Cw, 0.25),
        (640, "zigzag", 2, Direction::Cw, 0.25),
        (640, "striped", 2, Direction::Ccw, 0.25),
        (1024, "zigzag", 4, Direction::Ccw, 0.25),
        (1024, "zigzag", 4, Direction::Cw, 0.4),
    ];
    for causal in [true, false] {
        for (seq, strategy, ranks, forward, scale) in cases {
            let c = case_scaled(seq, (4, 2), causal, scale);
            for kernel in Kernel::ALL {
                for backward in BackwardScheme::ALL {
                    let config = RingConfig {
                        causal,
                        kernel,
                        forward,
                        backward,
                        scale: Some(scale as f32),
                        window: None,
                        softcap: None,
                        lockstep: false,
                        precision: Default::default(),
                    };
                    let label = format!(
                        "S={seq} causal={causal} {strategy} N={ranks} {forward} {backward} {kernel} scale={scale}"
                    );
                    let result = run(&c, strategy, ranks, config).unwrap();
                    // Tiles of S/N keys, longer than F32_ATTENTION's derivation covers.
                    let bound = f32_attention_bound(seq / ranks, ranks);
                    assert_within(&result, &c.want, bound, &label);
                }
            }
        }
    }
}

/// The tables above ran at the SIMD level `RINGBENCH_SIMD` forces (scripts/test.sh runs this file
/// once per level the CPU has), or at the best one detected when it is unset.
#[test]
fn the_tables_run_at_the_forced_simd_level() {
    use workbench::simd::{self, ENV, Level};
    let running = simd::level();
    match std::env::var(ENV) {
        Ok(value) if !value.trim().is_empty() => {
            assert_eq!(simd::parse(&value), Ok(running), "{ENV}={value}");
            assert_eq!(simd::check(), Ok(running));
        }
        _ => assert_eq!(running, Level::detected()),
    }
    // The bf16 dot product's AVX512-BF16 tile runs only at the AVX-512 level.
    if running != Level::Avx512 {
        assert!(!workbench::kernels::bf16_matmul::has_bf16_dot());
    }
}
