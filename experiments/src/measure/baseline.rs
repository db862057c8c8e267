//! Measurements every table is taken against: this machine's matmul rate, and seeded random inputs.

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use std::time::Instant;
use workbench::ring::jobs::HostTensor;

/// Best-of-5 GFLOP/s of a square f32 `n³` matmul on the Flex backend.
pub fn matmul_gflops(n: usize) -> f64 {
    matmul_gflops_on::<Flex>(n, &Default::default())
}

/// Best-of-5 GFLOP/s of a square f32 `n³` matmul on backend `B`'s `device` (the result is read back,
/// so a device backend's queue has finished it).
pub fn matmul_gflops_on<B: Backend>(n: usize, device: &B::Device) -> f64 {
    // Host-drawn: Burn's generator is shared by every thread, and a draw from it here would move the
    // weights of a seeded initialization running at the same time (`workbench::model::lazy::seeded`).
    let matrix =
        |seed| workbench::host::place::<B, 2>(random(vec![n, n], seed).data, [n, n], device);
    let (a, b) = (matrix(1), matrix(2));
    let _ = a.clone().matmul(b.clone()).into_data();
    let best = (0..5)
        .map(|_| {
            let start = Instant::now();
            let _ = a.clone().matmul(b.clone()).into_data();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// [`matmul_gflops_on`] on the default device of backend `name`.
pub fn matmul_gflops_of(name: crate::backend::BackendName, n: usize) -> anyhow::Result<f64> {
    struct Matmul(usize);
    impl crate::backend::OnBackend for Matmul {
        type Output = f64;
        fn run<I: workbench::LayerBackend>(self, devices: Vec<I::Device>) -> anyhow::Result<f64> {
            Ok(matmul_gflops_on::<I>(self.0, &devices[0]))
        }
    }
    crate::backend::on_backend(name, &[], Matmul(n))
}

/// Seeded uniform values in [−0.5, 0.5).
pub fn random(shape: Vec<usize>, seed: u64) -> HostTensor {
    let mut rng = datasets::SplitMix64::new(seed);
    let data = (0..shape.iter().product::<usize>())
        .map(|_| rng.uniform() as f32 - 0.5)
        .collect();
    HostTensor::new(shape, data)
}
