//! The backend a command runs on, chosen at the edge (`--backend flex|wgpu|cuda`, a spec's
//! `backends` axis): its name, the feature that compiles it in, its devices, and a first call that
//! turns "no such device" into one error line instead of a panic.

use anyhow::{Result, bail};
use std::fmt;
use std::str::FromStr;
use workbench::LayerBackend;

/// A backend by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum BackendName {
    /// Burn's pure-Rust CPU backend (the default; the fused kernel runs here).
    #[default]
    Flex,
    /// Burn's wgpu backend (Vulkan, Metal, DX12; Mesa's software Vulkan device without a GPU).
    Wgpu,
    /// Burn's CUDA backend.
    Cuda,
}

impl BackendName {
    /// The accepted names, for error messages.
    pub const NAMES: &'static str = "flex, wgpu, cuda";

    /// Whether this binary was built with the backend.
    pub fn compiled_in(self) -> bool {
        match self {
            BackendName::Flex => true,
            BackendName::Wgpu => cfg!(feature = "wgpu"),
            BackendName::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// The cargo feature that compiles the backend in (`None`: always there).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            BackendName::Flex => None,
            BackendName::Wgpu => Some("wgpu"),
            BackendName::Cuda => Some("cuda"),
        }
    }
}

impl fmt::Display for BackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendName::Flex => "flex",
            BackendName::Wgpu => "wgpu",
            BackendName::Cuda => "cuda",
        })
    }
}

impl FromStr for BackendName {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "flex" => Ok(BackendName::Flex),
            "wgpu" => Ok(BackendName::Wgpu),
            "cuda" => Ok(BackendName::Cuda),
            _ => bail!("unknown backend '{s}'; expected one of: {}", Self::NAMES),
        }
    }
}

/// Parses `0,1,2,3` (device indices) for `--devices`.
pub fn parse_devices(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| anyhow::anyhow!("--devices {text}: '{d}' is not a device index"))
        })
        .collect()
}

/// Work generic over the backend: [`on_backend`] calls `run` with the chosen inner backend `I` (the
/// work wraps it in `Autodiff` where it trains) and the ranks' devices.
pub trait OnBackend {
    /// What the work returns.
    type Output;
    /// Runs on backend `I`; rank r uses `devices[r % devices.len()]`.
    fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<Self::Output>;
}

/// Runs `work` on backend `name` with the devices at `indices` (empty: the default device). A backend
/// this binary was built without, or whose device does not answer, is an error naming it.
pub fn on_backend<W: OnBackend>(
    name: BackendName,
    indices: &[usize],
    work: W,
) -> Result<W::Output> {
    match name {
        BackendName::Flex => {
            if let Some(&i) = indices.iter().find(|&&i| i != 0) {
                bail!("--devices: flex has one device (0); got {i}");
            }
            work.run::<burn::backend::Flex>(vec![Default::default()])
        }
        BackendName::Wgpu => wgpu::run(indices, work),
        BackendName::Cuda => cuda::run(indices, work),
    }
}

/// Ring attention (with the backward when the job has dO) on the default device of backend `name`:
/// every rank on a thread, or, in a process launched as one rank of a job (`ringbench run
/// --launcher`), this process's rank over MPI.
pub fn run_attention_on(
    name: BackendName,
    job: &workbench::ring::jobs::AttentionJob,
) -> Result<workbench::ring::jobs::AttentionResult> {
    struct Attention<'a, 'j>(&'a workbench::ring::jobs::AttentionJob<'j>);
    impl OnBackend for Attention<'_, '_> {
        type Output = workbench::ring::jobs::AttentionResult;
        fn run<I: LayerBackend>(self, devices: Vec<I::Device>) -> Result<Self::Output> {
            type B<I> = burn::backend::Autodiff<I>;
            // In a process launched as one rank of a job (a sweep point under mpirun or srun), this
            // process runs its rank and every process gets the whole job's results.
            if let Some(comm) = crate::mpi_rank::world_comm(self.0.timeout)? {
                let device = match devices.len() {
                    0 => Default::default(),
                    n => devices[comm.rank() % n].clone(),
                };
                return Ok(workbench::ring::jobs::run_attention_on::<B<I>>(
                    comm, self.0, &device,
                )?);
            }
            Ok(workbench::ring::jobs::run_attention_on_devices::<B<I>>(
                self.0, &devices,
            )?)
        }
    }
    // A launched rank on a GPU backend takes its machine's local-rank-th device (one process a GPU).
    let devices = match crate::mpi_rank::in_process_world() && name != BackendName::Flex {
        true => vec![crate::mpi_rank::local_rank().unwrap_or(0)],
        false => Vec::new(),
    };
    on_backend(name, &devices, Attention(job))
}

/// A first small computation on each device, with the panic a missing device raises turned into an
/// error (the panic's own message is kept, the default hook's report of it is not printed).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn probe<I: burn::tensor::backend::Backend>(
    name: BackendName,
    devices: &[I::Device],
) -> Result<()> {
    use burn::tensor::Tensor;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let answered = devices.iter().try_for_each(|device| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Tensor::<I, 1>::ones([2], device).sum().into_scalar()
        }))
        .map(|_| ())
        .map_err(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow::anyhow!("backend {name}: device {device:?} did not answer: {message}")
        })
    });
    std::panic::set_hook(hook);
    answered
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::{BackendName, OnBackend, probe};
    use anyhow::Result;
    use burn::backend::wgpu::WgpuDevice;
    use workbench::backends::Wgpu;

    /// Index i is the i-th discrete GPU; no index: the default adapter (on a machine without a GPU,
    /// Mesa's software Vulkan device).
    pub fn run<W: OnBackend>(indices: &[usize], work: W) -> Result<W::Output> {
        let devices: Vec<WgpuDevice> = match indices {
            [] => vec![WgpuDevice::DefaultDevice],
            _ => indices
                .iter()
                .map(|&i| WgpuDevice::DiscreteGpu(i))
                .collect(),
        };
        probe::<Wgpu>(BackendName::Wgpu, &devices).map_err(|e| {
            e.context("no wgpu adapter (without a GPU, install Mesa's software Vulkan device: apt install mesa-vulkan-drivers libvulkan1)")
        })?;
        work.run::<Wgpu>(devices)
    }
}

#[cfg(not(feature = "wgpu"))]
mod wgpu {
    use super::OnBackend;
    use anyhow::{Result, bail};

    pub fn run<W: OnBackend>(_: &[usize], _: W) -> Result<W::Output> {
        bail!(
            "backend wgpu: this ringbench was built without it (cargo build --release --features wgpu)"
        )
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{BackendName, OnBackend, probe};
    use anyhow::Result;
    use burn::backend::cuda::CudaDevice;
    use workbench::backends::Cuda;

    /// Index i is CUDA device i; no index: device 0.
    pub fn run<W: OnBackend>(indices: &[usize], work: W) -> Result<W::Output> {
        let devices: Vec<CudaDevice> = match indices {
            [] => vec![CudaDevice::new(0)],
            _ => indices.iter().map(|&i| CudaDevice::new(i)).collect(),
        };
        probe::<Cuda>(BackendName::Cuda, &devices)?;
        work.run::<Cuda>(devices)
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::OnBackend;
    use anyhow::{Result, bail};

    pub fn run<W: OnBackend>(_: &[usize], _: W) -> Result<W::Output> {
        bail!(
            "backend cuda: this ringbench was built without it (cargo build --release --features cuda)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_listed() {
        for name in [BackendName::Flex, BackendName::Wgpu, BackendName::Cuda] {
            assert_eq!(name.to_string().parse::<BackendName>().unwrap(), name);
        }
        let err = "metal".parse::<BackendName>().unwrap_err().to_string();
        assert!(
            err.contains("'metal'") && err.contains("flex, wgpu, cuda"),
            "{err}"
        );
        assert_eq!(parse_devices("0, 2").unwrap(), vec![0, 2]);
        assert!(
            parse_devices("0,x")
                .unwrap_err()
                .to_string()
                .contains("'x'")
        );
    }
}
