//! bf16 operands and blocks: within bf16's roundoff of the float64 reference of the rounded inputs on
//! every strategy, scheme and N; the error with an f32 merge does not grow with N; the bytes bf16
//! sends.
//!
//! The bound is derived in `ringbench_tests::bf16`.

use burn::backend::{Autodiff, Flex};
use ringbench_tests::bf16::{bounds, errors};
use ringbench_tests::{Case, Variant, case_in, ran_every_pass, run_case};
use strategies::names;
use workbench::block::BlockKind;
use workbench::dtype::{Dtype, Precision};
use workbench::transport::Phase;
use workbench::{BackwardScheme, Direction, Kernel, RingConfig};

type B = Autodiff<Flex>;

const BF16: Precision = Precision {
    dtype: Dtype::Bf16,
    merge: Dtype::F32,
};

fn config(backward: BackwardScheme, kernel: Kernel, precision: Precision) -> RingConfig {
    RingConfig {
        causal: true,
        forward: Direction::Cw,
        backward,
        kernel,
        scale: Some(0.25),
        precision,
        ..Default::default()
    }
}

fn bf16_case(seq: usize, causal: bool) -> Case {
    case_in(
        Dtype::Bf16,
        seq,
        (4, 2),
        causal,
        0.25,
        &[],
        Variant::default(),
    )
}

/// Every strategy × backward scheme × N ∈ {1, 2, 4, 8} × kernel, causal and not, GQA: with bf16
/// operands and an f32 merge, out, lse, dq, dk and dv lie within the derived bound of the float64
/// reference of the rounded inputs.
#[test]
fn bf16_operands_with_an_f32_merge_stay_within_bf16_roundoff() {
    let bounds = bounds();
    let mut runs = 0;
    for causal in [true, false] {
        let c = bf16_case(64, causal);
        for strategy in names() {
            for ranks in [1, 2, 4, 8] {
                for backward in BackwardScheme::ALL {
                    for kernel in Kernel::ALL {
                        let config = RingConfig {
                            causal,
                            ..config(backward, kernel, BF16)
                        };
                        let label =
                            format!("{strategy} N={ranks} {backward} {kernel:?} causal={causal}");
                        let result =
                            run_case::<B>(&c, strategy, ranks, config, &Default::default())
                                .unwrap_or_else(|e| panic!("{label}: {e}"));
                        // The fused kernel multiplies bf16 operands with `vdpbf16ps` where the
                        // CPU has it, and says so.
                        if kernel == Kernel::Fused {
                            let dot = workbench::kernels::bf16_matmul::has_bf16_dot();
                            let want = if dot {
                                "cpu-fused-avx512bf16"
                            } else {
                                "cpu-fused"
                            };
                            assert_eq!(result.kernel_impl, want, "{label}");
                        }
                        for ((name, e), bound) in errors(&result, &c.want).into_iter().zip(bounds) {
                            assert!(e <= bound, "{label}: {name} error {e:.3e} over {bound:.3e}");
                        }
                        runs += usize::from(ran_every_pass(&result, ranks));
                    }
                }
            }
        }
    }
    // Runs the engine reports whole (every rank a forward and a backward pass): all of them.
    assert_eq!(runs, 2 * names().len() * 4 * 3 * Kernel::ALL.len());
}

/// With an f32 merge the error does not grow with the ring: at N = 8 each tensor's error is at most
/// 1.5× its error on one rank (the roundings are the same in kind and number per term, only their
/// grouping differs). With a bf16 merge it does grow: the output is rounded once per ring step.
#[test]
fn the_error_of_an_f32_merge_does_not_grow_with_n_and_a_bf16_merge_does() {
    let c = bf16_case(256, true);
    let run = |strategy: &str, ranks: usize, precision: Precision| {
        let config = config(BackwardScheme::Kv, Kernel::Fused, precision);
        let result = run_case::<B>(&c, strategy, ranks, config, &Default::default()).unwrap();
        errors(&result, &c.want)
    };
    let bf16_merge = Precision {
        dtype: Dtype::Bf16,
        merge: Dtype::Bf16,
    };
    for strategy in ["contiguous", "zigzag"] {
        let (one, eight) = (run(strategy, 1, BF16), run(strategy, 8, BF16));
        println!("{strategy}, f32 merge: N=1 {one:?}\n  N=8 {eight:?}");
        for ((name, e1), (_, e8)) in one.into_iter().zip(eight) {
            assert!(e1 > 0.0, "{strategy} {name}: a bf16 run has some error");
            assert!(
                e8 <= 1.5 * e1,
                "{strategy} {name}: N=8 {e8:.3e} vs N=1 {e1:.3e}"
            );
        }
        let merged = run(strategy, 8, bf16_merge);
        println!("  N=8, bf16 merge {merged:?}");
        let (out_f32, out_bf16) = (eight[0].1, merged[0].1);
        assert!(
            out_bf16 > 1.5 * out_f32,
            "{strategy}: out with a bf16 merge {out_bf16:.3e} vs f32 merge {out_f32:.3e}"
        );
    }
}

/// Bytes one rank sends, per block kind, with bf16 against f32 (threads; the MPI test compares the
/// processes' bytes with these): operand blocks (K, V, Q, dO) half, travelling accumulators half
/// with a bf16 merge and the same with an f32 one, lse and δ the same (they stay f32).
#[test]
fn bf16_blocks_send_half_the_bytes_of_f32() {
    let c = bf16_case(64, true);
    for backward in BackwardScheme::ALL {
        let bytes = |precision: Precision| {
            let config = config(backward, Kernel::Fused, precision);
            let r = run_case::<B>(&c, "zigzag", 4, config, &Default::default()).unwrap();
            r.traffic.clone()
        };
        let f32s = bytes(Precision::F32);
        let halves = bytes(Precision {
            dtype: Dtype::Bf16,
            merge: Dtype::Bf16,
        });
        let operands_only = bytes(BF16);
        for traffic in [&f32s, &halves, &operands_only] {
            assert_eq!(traffic.len(), 4, "{backward}: every rank's traffic");
        }
        for rank in 0..4 {
            let mut all = (0, 0);
            for phase in [Phase::Forward, Phase::Backward] {
                for kind in [
                    BlockKind::K,
                    BlockKind::V,
                    BlockKind::Q,
                    BlockKind::DOut,
                    BlockKind::Lse,
                    BlockKind::Delta,
                    BlockKind::DK,
                    BlockKind::DV,
                    BlockKind::DQ,
                ] {
                    let (n, full) = f32s[rank].count(phase, kind);
                    let (n2, half) = halves[rank].count(phase, kind);
                    let (n3, mixed) = operands_only[rank].count(phase, kind);
                    assert_eq!((n, n), (n2, n3), "{backward} rank {rank} {kind:?}: blocks");
                    let label = format!("{backward} rank {rank} {phase:?} {kind:?}");
                    let accumulator = matches!(kind, BlockKind::DK | BlockKind::DV | BlockKind::DQ);
                    match kind {
                        BlockKind::Lse | BlockKind::Delta => {
                            assert_eq!((half, mixed), (full, full), "{label}")
                        }
                        _ => {
                            assert_eq!(2 * half, full, "{label}");
                            let want = if accumulator { full } else { full / 2 };
                            assert_eq!(mixed, want, "{label}");
                        }
                    }
                    all = (all.0 + full, all.1 + half);
                }
            }
            assert!(all.0 > 0, "{backward} rank {rank} sent something");
            if backward != BackwardScheme::Q {
                // K/V schemes send no lse or δ: exactly half.
                assert_eq!(2 * all.1, all.0, "{backward} rank {rank}");
                assert_eq!(2 * halves[rank].total_bytes(), f32s[rank].total_bytes());
            }
        }
    }
}
