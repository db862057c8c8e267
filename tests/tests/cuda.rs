//! The exactness table's backend subset on Burn's CUDA backend (feature `cuda`): the fused device
//! kernel (CubeCL) and the generic one, every block on the GPU, against the float64 reference, and
//! no host↔device copy in a ring step.
//! It needs a GPU: CI compiles it (clippy with every feature); `scripts/gpu-check.sh` runs it.
#![cfg(feature = "cuda")]

use burn::backend::Autodiff;
use burn::backend::cuda::CudaDevice;
use workbench::Kernel;
use workbench::backends::Cuda;

type OnCuda = Autodiff<Cuda>;

/// Every strategy × direction × backward scheme × N ∈ {1, 2, 4} × causal × {MHA, GQA} at S = 48,
/// within 1e-5 of the float64 reference, with the generic kernel.
#[test]
fn cuda_exactness_subset() {
    let runs =
        ringbench_tests::device::exactness_subset::<OnCuda>(&CudaDevice::new(0), Kernel::Generic);
    println!("cuda exactness subset, generic: {runs} runs within 1e-5");
}

/// The same with the fused device kernel, and S = 320 across its sub-tiles.
#[test]
fn cuda_fused_exactness_subset() {
    let device = CudaDevice::new(0);
    let runs = ringbench_tests::device::exactness_subset::<OnCuda>(&device, Kernel::Fused);
    let across = ringbench_tests::device::across_sub_tiles::<OnCuda>(&device, Kernel::Fused);
    println!("cuda exactness subset, cubecl-fused: {runs} + {across} runs within 1e-5");
}

/// Heads 64 and 128 wide, forward and backward, both kernels, within the f32 bound of the float64
/// reference.
#[test]
fn cuda_wide_heads_forward_and_backward() {
    let device = CudaDevice::new(0);
    for kernel in Kernel::ALL {
        let runs = ringbench_tests::device::wide_heads::<OnCuda>(&device, kernel);
        println!("cuda d = 64 and 128, {kernel:?}: {runs} runs within the bound");
    }
}

/// On CUDA no ring step copies anything between host and device, and the ranks send each other
/// exactly what they send on Flex.
#[test]
fn cuda_ring_steps_stay_on_the_device() {
    use ringbench_tests::device::{
        host_device_bytes_are_inputs_outputs_and_positions, ring_steps_stay_on_the_device,
    };
    let device = CudaDevice::new(0);
    for kernel in Kernel::ALL {
        ring_steps_stay_on_the_device::<OnCuda>(&device, kernel);
        host_device_bytes_are_inputs_outputs_and_positions::<OnCuda>(&device, kernel);
    }
}

/// bf16 operands on CUDA with each kernel (the fused one widens bf16 blocks as a tile reads them and
/// rounds P and dS to bf16 in the kernel): every tensor within the bf16 bound of the float64
/// reference of the rounded inputs.
#[test]
fn cuda_bf16_within_the_bound() {
    let device = CudaDevice::new(0);
    for kernel in Kernel::ALL {
        let ran = ringbench_tests::device::bf16_runs_or_says_why_not::<OnCuda>(&device, kernel);
        assert!(ran, "CUDA stores and computes bf16");
    }
}
