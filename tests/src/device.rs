//! The exactness table's subset for a device backend (wgpu in CI on Mesa's software device, CUDA
//! where a GPU is lent): the generic kernel with every block on the device, against the float64
//! reference, and what its ring steps copy between host and device (nothing).

use crate::{Case, F32_ATTENTION, assert_within, case_with, ran_every_pass, run_case};
use burn::tensor::backend::AutodiffBackend;
use strategies::names;
use workbench::{BackwardScheme, Direction, Kernel, RingBackend, RingConfig};

/// Tokens of every case of the subset.
pub const SEQ: usize = 48;
/// Rank counts of the subset.
pub const RANKS: [usize; 3] = [1, 2, 4];

/// The generic kernel's ring options.
pub fn generic(causal: bool, forward: Direction, backward: BackwardScheme) -> RingConfig {
    RingConfig {
        causal,
        forward,
        backward,
        kernel: Kernel::Generic,
        ..Default::default()
    }
}

/// A case of the subset: S = 48, scale 1/4.
pub fn case(heads: (usize, usize), causal: bool) -> Case {
    case_with(SEQ, heads, causal, 0.25, &[])
}

/// Every strategy × direction × backward scheme × N ∈ {1, 2, 4} × causal × {MHA 4/4, GQA 8/2} at
/// S = 48 on `device`, each within 1e-5 of the float64 reference; returns the runs the engine counted
/// (every rank a whole forward and backward pass), asserted to be all of them.
pub fn exactness_subset<B>(device: &B::Device) -> usize
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
                            let config = generic(causal, forward, backward);
                            let result = run_case::<B>(&c, strategy, ranks, config, device)
                                .unwrap_or_else(|e| panic!("{label}: {e}"));
                            assert_within(&result, &c.want, F32_ATTENTION, &label);
                            assert_eq!(result.padded_len, SEQ, "{label}: S = 48 needs no padding");
                            assert_eq!(result.kernel_impl, "generic", "{label}");
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

/// On a device no ring step copies anything between host and device (the inputs are placed before
/// the first step and the outputs read after the last), and the ranks send each other exactly what
/// they send on Flex.
pub fn ring_steps_stay_on_the_device<B>(device: &B::Device)
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    use burn::backend::{Autodiff, Flex};
    let c = case((8, 2), true);
    for backward in BackwardScheme::ALL {
        let config = generic(true, Direction::Cw, backward);
        let on_device = run_case::<B>(&c, "zigzag", 4, config, device).expect("device run");
        let on_flex = run_case::<Autodiff<Flex>>(&c, "zigzag", 4, config, &Default::default())
            .expect("flex run");
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
