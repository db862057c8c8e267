//! The exactness table's backend subset on Burn's wgpu backend (feature `wgpu`; without a GPU, Mesa's
//! software Vulkan device): the fused device kernel (CubeCL) and the generic one, every block on the
//! device, against the float64 reference; and what a ring step moves between host and device
//! (nothing) and between ranks (what Flex moves).
#![cfg(feature = "wgpu")]

use burn::backend::Autodiff;
use burn::backend::wgpu::WgpuDevice;
use ringbench_tests::device::{SEQ, case, generic, on};
use ringbench_tests::{F32_ATTENTION, assert_within, ran_every_pass, run_case};
use strategies::names;
use workbench::backends::Wgpu;
use workbench::{BackwardScheme, Direction, Kernel};

type OnWgpu = Autodiff<Wgpu>;

/// Max-abs error relative to each tensor's max magnitude, in f32 (the exactness table's, derived in
/// [`F32_ATTENTION`]).
const TOLERANCE: f64 = F32_ATTENTION;

/// Every strategy × direction × backward scheme × N ∈ {1, 2, 4} × causal × {MHA, GQA} at S = 48,
/// the generic kernel.
#[test]
fn wgpu_exactness_subset() {
    let device = WgpuDevice::DefaultDevice;
    let runs = ringbench_tests::device::exactness_subset::<OnWgpu>(&device, Kernel::Generic);
    println!("wgpu exactness subset, generic: {runs} runs within {TOLERANCE:e}");
}

/// The same subset with the fused device kernel (CubeCL), and S = 320 across its sub-tiles.
#[test]
fn wgpu_fused_exactness_subset() {
    let device = WgpuDevice::DefaultDevice;
    let runs = ringbench_tests::device::exactness_subset::<OnWgpu>(&device, Kernel::Fused);
    let across = ringbench_tests::device::across_sub_tiles::<OnWgpu>(&device, Kernel::Fused);
    println!("wgpu exactness subset, cubecl-fused: {runs} + {across} runs within {TOLERANCE:e}");
}

/// Heads 64 and 128 wide, forward and backward, with the fused device kernel (whose per-unit rows
/// grow with d), within the f32 bound of the float64 reference. Slow on the software device (each
/// width compiles its kernels, ~2 minutes): `cargo test` skips it in scripts/test.sh and the GPU
/// check's dry run (`bash scripts/gpu-check.sh dry-run`) runs it; on CUDA both kernels run it.
#[test]
fn wgpu_wide_heads_forward_and_backward() {
    let device = WgpuDevice::DefaultDevice;
    let runs = ringbench_tests::device::wide_heads::<OnWgpu>(&device, Kernel::Fused);
    println!("wgpu d = 64 and 128, fused: {runs} runs within the bound");
}

/// On wgpu no ring step copies anything between host and device, and the ranks send each other
/// exactly what they send on Flex; a whole call moves its inputs, its outputs and the shards'
/// positions, nothing else: both kernels.
#[test]
fn wgpu_ring_steps_stay_on_the_device() {
    use ringbench_tests::device::{
        host_device_bytes_are_inputs_outputs_and_positions, ring_steps_stay_on_the_device,
    };
    let device = WgpuDevice::DefaultDevice;
    for kernel in Kernel::ALL {
        ring_steps_stay_on_the_device::<OnWgpu>(&device, kernel);
        host_device_bytes_are_inputs_outputs_and_positions::<OnWgpu>(&device, kernel);
    }
}

/// The variants on the device: a sliding window shorter than a shard (5, causal) and one crossing
/// packed documents (20, not causal), a logit cap of 4 and sinks, on every strategy, N ∈ {2, 4}, each
/// backward scheme once per strategy and window, against the float64 reference within 1e-5 (dsinks
/// included), with both kernels: the generic kernel's tanh, sink terms and windowed masks as device
/// tensors, and the fused kernel's inside its CubeCL kernels.
#[test]
fn wgpu_windows_softcap_and_sinks() {
    use ringbench_tests::{Variant, case_variant};
    let device = WgpuDevice::DefaultDevice;
    let mut runs = 0;
    for (window, causal, docs) in [(5, true, &[][..]), (20, false, &[10, 20, 18][..])] {
        let variant = Variant {
            window: Some(window),
            softcap: Some(4.0),
            sinks: Some(vec![-1.5, 0.5, 1.0, -0.25]),
        };
        let c = case_variant(SEQ, (4, 2), causal, 0.25, docs, variant);
        for (i, strategy) in names().into_iter().enumerate() {
            for (ranks, kernel) in [2, 4].into_iter().flat_map(|n| Kernel::ALL.map(|k| (n, k))) {
                let backward = BackwardScheme::ALL[(i + ranks) % 3];
                let label = format!(
                    "window {window} causal={causal} {strategy} N={ranks} {backward} {kernel}"
                );
                let config = on(kernel, causal, Direction::Cw, backward);
                let result = run_case::<OnWgpu>(&c, strategy, ranks, config, &device)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_within(&result, &c.want, TOLERANCE, &label);
                let grads = result.grads.as_ref().expect("gradients");
                assert_eq!(grads.dsinks.as_ref().map(Vec::len), Some(4), "{label}");
                runs += usize::from(ran_every_pass(&result, ranks));
            }
        }
    }
    // Runs the engine reports whole (every rank a forward and a backward pass): all of them.
    assert_eq!(runs, 2 * names().len() * 2 * Kernel::ALL.len());
}

/// bf16 on the device, with each kernel: where the device computes bf16 the run keeps its blocks in
/// bf16 and every tensor lies within the bf16 bound of the float64 reference of the rounded inputs;
/// where it does not (Mesa's software device), the run is refused before any step with the typed
/// error naming bf16 and the backend ([`ringbench_tests::device::bf16_runs_or_says_why_not`]).
#[test]
fn wgpu_bf16_runs_or_says_why_not() {
    for kernel in Kernel::ALL {
        let ran = ringbench_tests::device::bf16_runs_or_says_why_not::<OnWgpu>(
            &WgpuDevice::DefaultDevice,
            kernel,
        );
        println!(
            "wgpu, {kernel:?} kernel: bf16 {}",
            if ran {
                "ran within the bound"
            } else {
                "refused"
            }
        );
    }
}

/// Head × context parallelism on the device: 2 × 2 grids (the all-to-all's blocks pass through the
/// host), MHA with the kv scheme and GQA with the q scheme, causal, within the f32 bound.
#[test]
fn wgpu_ulysses_grid() {
    let device = WgpuDevice::DefaultDevice;
    for (heads, backward) in [((4, 4), BackwardScheme::Kv), ((8, 2), BackwardScheme::Q)] {
        let c = case(heads, true);
        let mut job = ringbench_tests::job(&c, "zigzag", 4, generic(true, Direction::Cw, backward));
        job.ulysses = 2;
        let label = format!("heads={heads:?} bwd={backward} 2 x 2");
        let result = workbench::ring::jobs::run_attention::<OnWgpu>(&job, &device)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_within(&result, &c.want, TOLERANCE, &label);
        assert!(ran_every_pass(&result, 4), "{label}");
    }
}
