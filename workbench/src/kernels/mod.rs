//! Tile math: one trait for a tile's forward and backward ([`TileKernel`], `tile.rs`), the fused CPU
//! kernel (`fused.rs`), the fused device kernel (`device_fused.rs`, CubeCL source in `crate::cube`)
//! and their generic Burn twin (`generic.rs`, masks built on the device in `device_mask.rs`)
//! implementing it, the visibility geometry they share ([`mask`]), the FLOP model
//! ([`flops`]), and the registry below: a line and a runner function a kernel.
//!
//! Nothing here knows ranks, rings or transports: a kernel sees blocks, each shard's query windows
//! and key positions, and tiles.

pub mod bf16_matmul;
mod device_fused;
mod device_mask;
pub(crate) mod exp;
pub mod flops;
pub mod fused;
mod generic;
pub mod mask;
mod tile;

use crate::dtype::Precision;
use crate::error::RingError;
use crate::host::HostRead;
use std::fmt;
use std::str::FromStr;

pub use generic::{GenericMatmul, generic_matmul, set_generic_matmul};
pub use tile::{
    BackwardTile, ForwardTile, Keys, Queries, Scores, TileDims, TileKernel, Travelling,
};

/// Work to be done with whichever kernel a ring is configured with: [`with_kernel`] calls `run`
/// with the kernel itself, so the work is written once, generic over [`TileKernel`].
pub trait WithKernel<B: HostRead> {
    /// What the work returns.
    type Output;
    /// Does the work with `kernel`.
    fn run<K: TileKernel<B>>(self, kernel: &K) -> Self::Output;
}

/// The registry: each kernel's variant of [`Kernel`], its name (`--kernel`, `kernels = [...]`), the
/// function that runs work with the type implementing [`TileKernel`] on a backend, and what it is.
macro_rules! registry {
    ($first:ident => $first_name:literal, $first_run:ident, $first_doc:literal;
     $($variant:ident => $name:literal, $run:ident, $doc:literal;)*) => {
        /// Which tile kernel computes a ring's tiles.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum Kernel {
            #[doc = $first_doc]
            #[default]
            $first,
            $(#[doc = $doc] $variant,)*
        }

        impl Kernel {
            /// The accepted names, for error messages.
            pub const NAMES: &'static str = concat!($first_name $(, ", ", $name)*);
            /// Every kernel, in registry order.
            pub const ALL: [Kernel; [$first_name $(, $name)*].len()] =
                [Kernel::$first $(, Kernel::$variant)*];

            /// Its name.
            pub fn name(self) -> &'static str {
                match self {
                    Kernel::$first => $first_name,
                    $(Kernel::$variant => $name,)*
                }
            }
        }

        /// Runs `work` with the kernel `kernel` names.
        pub fn with_kernel<B: HostRead, W: WithKernel<B>>(kernel: Kernel, work: W) -> W::Output {
            match kernel {
                Kernel::$first => $first_run::<B, W>(work),
                $(Kernel::$variant => $run::<B, W>(work),)*
            }
        }
    };
}

registry! {
    Fused => "fused", fused_where_the_tensors_are,
        "The fused kernel where the backend keeps its tensors: on the CPU, gemm sub-tiles and an online softmax on host blocks (`fused.rs`); on a CubeCL device (wgpu, cuda), the CubeCL kernels (`device_fused.rs`).";
    Generic => "generic", generic_twin,
        "Burn tensor ops on the backend's device (`generic.rs`): the reference twin of every fused kernel.";
}

/// `work` with the fused kernel for backend `B`: the CPU kernel where tensors live in host memory,
/// the device kernel elsewhere (which says so when the backend has none).
fn fused_where_the_tensors_are<B: HostRead, W: WithKernel<B>>(work: W) -> W::Output {
    if B::HOST_MEMORY {
        work.run(&fused::FusedCpu)
    } else {
        work.run(&device_fused::DeviceFused)
    }
}

/// `work` with the generic kernel.
fn generic_twin<B: HostRead, W: WithKernel<B>>(work: W) -> W::Output {
    work.run(&generic::GenericTwin)
}

/// What computes `kernel`'s tiles on backend `B` in `precision` (`cpu-fused`, `cubecl-fused`,
/// `generic`), or why it does not run there ([`TileKernel::implementation`]).
pub fn implementation<B: HostRead>(
    kernel: Kernel,
    device: &B::Device,
    precision: Precision,
) -> Result<&'static str, RingError> {
    struct Ask<'a, B: HostRead>(&'a B::Device, Precision);
    impl<B: HostRead> WithKernel<B> for Ask<'_, B> {
        type Output = Result<&'static str, RingError>;
        fn run<K: TileKernel<B>>(self, kernel: &K) -> Self::Output {
            kernel.implementation(self.0, self.1)
        }
    }
    with_kernel(kernel, Ask::<B>(device, precision))
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kernel {
    type Err = RingError;
    fn from_str(s: &str) -> Result<Self, RingError> {
        Kernel::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| RingError::UnknownOption {
                what: "kernel",
                got: s.into(),
                expected: Kernel::NAMES,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_kernel_has_a_name_that_parses_back() {
        assert_eq!(Kernel::NAMES, "fused, generic");
        for kernel in Kernel::ALL {
            assert_eq!(kernel.name().parse::<Kernel>().unwrap(), kernel);
        }
        assert_eq!(Kernel::default(), Kernel::ALL[0]);
        let e = "spiral".parse::<Kernel>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown kernel 'spiral'; expected one of: fused, generic"
        );
    }
}
