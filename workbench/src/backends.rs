//! The device backends the ring runs on besides Flex, as the types every entry point names: Burn's
//! CubeCL runtimes without the fusion layer, so that ringbench's own CubeCL kernels (`crate::cube`)
//! launch on their tensors.

/// Burn's wgpu runtime without its fusion layer. Burn 0.21's fusion (`burn::backend::Wgpu`) computes
/// the generic kernel's normalized tile output `p·v / l` wrong at some tile shapes (measured: 0.28 off
/// at tiles of `[2, 4, 24, 16]`; the regression test is `kernels::reference`'s
/// `unfused_wgpu_tiles_match_flex`), so ringbench runs wgpu unfused.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;

/// Burn's CUDA runtime without its fusion layer, like `Wgpu` (Burn's `burn::backend::Cuda` is fused:
/// its tensors are fusion handles, which the fused device kernel cannot launch on).
#[cfg(feature = "cuda")]
pub type Cuda = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
