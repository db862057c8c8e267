//! The exactness table's subset for a device backend (wgpu in CI on Mesa's software device, CUDA
//! where a GPU is lent): the fused device kernel and the generic one, every block on the device,
//! against the float64 reference, and what their ring steps copy between host and device (nothing).

use crate::{
    Case, F32_ATTENTION, assert_within, case_with, f32_attention_bound, ran_every_pass, run_case,
};
use burn::tensor::backend::AutodiffBackend;
use strategies::names;
use workbench::{BackwardScheme, Direction, Kernel, RingBackend, RingConfig};

/// Tokens of every case of the subset.
pub const SEQ: usize = 48;
/// Rank counts of the subset.
pub const RANKS: [usize; 3] = [1, 2, 4];

/// Tokens of the case whose tiles cross the fused device kernel's blocks (at the subset's head size
/// 16: cubes of 32 units owning 4 query rows each, key sub-tiles of 32): 320 tokens on 1, 2 and 4
/// ranks leave shards of 320, 160 and 80 (zig-zag: chunks of 40), so query blocks of 128 and the
/// last key sub-tiles are partial.
pub const SEQ_ACROSS_SUB_TILES: usize = 320;

/// The generic kernel's ring options.
pub fn generic(causal: bool, forward: Direction, backward: BackwardScheme) -> RingConfig {
    on(Kernel::Generic, causal, forward, backward)
}

/// `kernel`'s ring options.
pub fn on(
    kernel: Kernel,
    causal: bool,
    forward: Direction,
    backward: BackwardScheme,
) -> RingConfig {
    RingConfig {
        causal,
        forward,
        backward,
        kernel,
        ..Default::default()
    }
}

/// What computes `kernel`'s tiles on a CubeCL device (the `kernel_impl` a run reports).
pub fn device_impl(kernel: Kernel) -> &'static str {
    match kernel {
        Kernel::Fused => "cubecl-fused",
        Kernel::Generic => "generic",
    }
}

/// A case of the subset: S = 48, scale 1/4.
pub fn case(heads: (usize, usize), causal: bool) -> Case {
    case_with(SEQ, heads, causal, 0.25, &[])
}

/// Every strategy × direction × backward scheme × N ∈ {1, 2, 4} × causal × {MHA 4/4, GQA 8/2} at
/// S = 48 on `device` with `kernel`, each within 1e-5 of the float64 reference; returns the runs the
/// engine counted (every rank a whole forward and backward pass), asserted to be all of them.
pub fn exactness_subset<B>(device: &B::Device, kernel: Kernel) -> usize
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    let mut runs = 0;
    for heads in [(4, 4), (8, 2)] {
        for causal in [false, true] {
            let c = case(heads, causal);
            for strategy in names() {
                for ranks in RANKS {
                    for forward in Direction::ALL {
                        for backward in BackwardScheme::ALL {
                            let label = format!(
                                "heads={heads:?} causal={causal} {strategy} N={ranks} fwd={forward} bwd={backward}"
                            );
                            let config = on(kernel, causal, forward, backward);
                            let result = run_case::<B>(&c, strategy, ranks, config, device)
                                .unwrap_or_else(|e| panic!("{label}: {e}"));
                            assert_within(&result, &c.want, F32_ATTENTION, &label);
                            assert_eq!(result.padded_len, SEQ, "{label}: S = 48 needs no padding");
                            assert_eq!(result.kernel_impl, device_impl(kernel), "{label}");
                            runs += usize::from(ran_every_pass(&result, ranks));
                        }
                    }
                }
            }
        }
    }
    assert_eq!(runs, 2 * 2 * names().len() * RANKS.len() * 2 * 3);
    runs
}

/// Tiles that cross the fused device kernel's sub-tiles, with partial last sub-tiles: S = 320,
/// GQA 4/2, causal and not, every strategy on N ∈ {1, 2, 4} (both backward schemes that move
/// different things, alternating), within the f32 bound of tiles of S/N keys
/// ([`f32_attention_bound`]: 2.2e-5 on one rank, 1.2e-5 on two, 1e-5 on four) of the float64 reference with
/// `kernel`.
pub fn across_sub_tiles<B>(device: &B::Device, kernel: Kernel) -> usize
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    let mut runs = 0;
    for causal in [true, false] {
        let c = case_with(SEQ_ACROSS_SUB_TILES, (4, 2), causal, 0.25, &[]);
        for (i, strategy) in names().into_iter().enumerate() {
            for ranks in RANKS {
                let backward = BackwardScheme::ALL[(i + ranks) % BackwardScheme::ALL.len()];
                let label = format!("S=320 causal={causal} {strategy} N={ranks} bwd={backward}");
                let config = on(kernel, causal, Direction::Cw, backward);
                let result = run_case::<B>(&c, strategy, ranks, config, device)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                let bound = f32_attention_bound(result.padded_len.div_ceil(ranks), ranks);
                assert_within(&result, &c.want, bound, &label);
                assert_eq!(result.kernel_impl, device_impl(kernel), "{label}");
                runs += usize::from(ran_every_pass(&result, ranks));
            }
        }
    }
    assert_eq!(runs, 2 * names().len() * RANKS.len());
    runs
}

/// Heads as wide as real models' (d = 64 and 128, where the fused device kernel's rows are 16 and 32
/// four-wide vectors a unit), forward and every gradient, at S = 32, GQA 4/2, scale 1/√d: zig-zag
/// causal on 2 ranks (K/V travelling) and not causal on 1 (the Q side's scheme), each within the f32
/// bound of its chains ([`crate::f32_attention_bound_at`]: d-long scores and dP, S/N-long tiles) of the
/// float64 reference with `kernel`. Returns the runs the engine counted, asserted to be all of them.
/// (Few runs: on Mesa's software device each new width compiles its kernels first.)
pub fn wide_heads<B>(device: &B::Device, kernel: Kernel) -> usize
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    const WIDE_SEQ: usize = 32;
    let mut runs = 0;
    for head_dim in [64, 128] {
        for (causal, ranks, backward) in
            [(true, 2, BackwardScheme::Kv), (false, 1, BackwardScheme::Q)]
        {
            let scale = 1.0 / (head_dim as f64).sqrt();
            let c = crate::case_wide(
                workbench::Dtype::F32,
                WIDE_SEQ,
                (4, 2),
                head_dim,
                causal,
                scale,
                &[],
                Default::default(),
            );
            let label = format!("d={head_dim} causal={causal} zigzag N={ranks} bwd={backward}");
            let config = on(kernel, causal, Direction::Cw, backward);
            let result = run_case::<B>(&c, "zigzag", ranks, config, device)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let bound = crate::f32_attention_bound_at(head_dim, WIDE_SEQ.div_ceil(ranks), ranks);
            assert_within(&result, &c.want, bound, &label);
            assert_eq!(result.kernel_impl, device_impl(kernel), "{label}");
            runs += usize::from(ran_every_pass(&result, ranks));
        }
    }
    assert_eq!(runs, 2 * 2);
    runs
}

/// On a device no ring step of `kernel` copies anything between host and device (the inputs are
/// placed before the first step and the outputs read after the last), and the ranks send each other
/// exactly what they send on Flex.
pub fn ring_steps_stay_on_the_device<B>(device: &B::Device, kernel: Kernel)
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    use burn::backend::{Autodiff, Flex};
    let c = case((8, 2), true);
    for backward in BackwardScheme::ALL {
        let config = on(kernel, true, Direction::Cw, backward);
        let on_device = run_case::<B>(&c, "zigzag", 4, config, device).expect("device run");
        let on_flex = run_case::<Autodiff<Flex>>(&c, "zigzag", 4, config, &Default::default())
            .expect("flex run");
        assert_eq!(
            on_device.traffic.len(),
            4,
            "{backward}: every rank's traffic"
        );
        assert_eq!(
            on_flex.traffic.len(),
            4,
            "{backward}: every rank's traffic on Flex"
        );
        for (rank, (dev, flex)) in on_device.traffic.iter().zip(&on_flex.traffic).enumerate() {
            // Forward and backward: 4 steps each.
            assert_eq!(dev.host_device.len(), 8, "{backward} rank {rank}");
            for step in &dev.host_device {
                assert_eq!(step.bytes, 0, "{backward} rank {rank}: {step:?}");
            }
            assert!(dev.total_bytes() > 0);
            assert_eq!(dev.sends, flex.sends, "{backward} rank {rank}");
        }
    }
}

/// Every byte a device call of `kernel` moves between host and device, per rank: its inputs placed
/// (q, k, v, dO), its outputs read (out, lse, dq, dk, dv), and each pass's positions (every rank's
/// shard prepared once a pass, forward and backward: 2 window ends a query and 1 position a key,
/// f32). No block, tile or accumulator crosses: the count does not depend on the ring's steps.
pub fn host_device_bytes_are_inputs_outputs_and_positions<B>(device: &B::Device, kernel: Kernel)
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    use crate::{BATCH, HEAD_DIM};
    let (heads, kv_heads) = (8, 2);
    let c = case((heads, kv_heads), true);
    for ranks in RANKS {
        for backward in BackwardScheme::ALL {
            let label = format!("{kernel} N={ranks} bwd={backward}");
            let config = on(kernel, true, Direction::Cw, backward);
            let result = run_case::<B>(&c, "zigzag", ranks, config, device)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let t = SEQ / ranks;
            let query_side = BATCH * t * heads * HEAD_DIM;
            let key_side = BATCH * t * kv_heads * HEAD_DIM;
            let inputs = 2 * query_side + 2 * key_side;
            let outputs = query_side + BATCH * t * heads + query_side + 2 * key_side;
            let positions = 2 * ranks * 3 * t;
            let want = 4 * (inputs + outputs + positions) as u64;
            assert_eq!(result.host_device_bytes.len(), ranks, "{label}");
            for (rank, &bytes) in result.host_device_bytes.iter().enumerate() {
                assert_eq!(bytes, want, "{label} rank {rank}");
            }
            assert_eq!(result.kernel_impl, device_impl(kernel), "{label}");
        }
    }
}

/// bf16 operands with an f32 merge on `device` with `kernel` (zig-zag, 2 ranks, causal, GQA, each
/// backward scheme): where the device stores and computes bf16, every tensor lies within the bf16
/// bound ([`crate::bf16`]) of the float64 reference of the rounded inputs; where it does not (Mesa's
/// software device), the run is refused before any step with the typed error naming bf16 and the
/// backend. Returns whether the device ran it.
pub fn bf16_runs_or_says_why_not<B>(device: &B::Device, kernel: Kernel) -> bool
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    use burn::tensor::DType;
    use burn::tensor::backend::Backend;
    use workbench::RingError;
    use workbench::dtype::{Dtype, Precision};
    let c = crate::case_in(
        Dtype::Bf16,
        SEQ,
        (4, 2),
        true,
        0.25,
        &[],
        crate::Variant::default(),
    );
    let runs_bf16 = B::InnerBackend::supports_dtype(device, DType::BF16);
    for backward in BackwardScheme::ALL {
        let config = RingConfig {
            scale: Some(0.25),
            precision: Precision {
                dtype: Dtype::Bf16,
                merge: Dtype::F32,
            },
            ..on(kernel, true, Direction::Cw, backward)
        };
        let label = format!("{kernel:?} {backward}");
        let result = run_case::<B>(&c, "zigzag", 2, config, device);
        if runs_bf16 {
            let result = result.unwrap_or_else(|e| panic!("{label}: {e}"));
            let errors = crate::bf16::errors(&result, &c.want);
            for ((name, e), bound) in errors.into_iter().zip(crate::bf16::bounds()) {
                assert!(e <= bound, "{label}: {name} error {e:.3e} over {bound:.3e}");
            }
        } else {
            match result {
                Err(e @ RingError::DtypeUnsupported { .. }) => {
                    let message = e.to_string();
                    assert!(
                        message.contains("bf16")
                            && message.contains(&B::InnerBackend::name(device)),
                        "{label}: {message}"
                    );
                }
                other => panic!(
                    "{label}: expected DtypeUnsupported, got {:?}",
                    other.map(|_| ())
                ),
            }
        }
    }
    runs_bf16
}
