//! The fused device tile kernels: the trait through which a backend offers them ([`DeviceTiles`]),
//! and, with a CubeCL backend compiled in (`wgpu`, `cuda`), their CubeCL source (`tiles.rs`) and
//! launches on Burn's tensors (`CubeTiles`). The ring reaches them through
//! [`crate::host::HostRead::device_tiles`]; `kernels/device_fused.rs` makes them a tile kernel. With
//! `cuda`, also the CUDA memory behind a tensor (`CudaMemory`), which NCCL sends from in place.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

#[cfg(feature = "cuda")]
mod cuda_memory;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod tiles;

#[cfg(feature = "cuda")]
pub use cuda_memory::CudaMemory;

/// One tile's operands on the device: q `[b, h, tq, d]`, k and v `[b, hk, tk, d]` (f32 tensors),
/// the queries' windows' first and last visible key position `[tq]` and the keys' positions `[tk]`
/// (f32), and how scores are made.
pub struct TileOperands<'a, B: Backend> {
    /// Queries.
    pub q: &'a Tensor<B, 4>,
    /// Keys.
    pub k: &'a Tensor<B, 4>,
    /// Values.
    pub v: &'a Tensor<B, 4>,
    /// Each query's first visible key position.
    pub q_lo: &'a Tensor<B, 1>,
    /// Each query's last visible key position.
    pub q_hi: &'a Tensor<B, 1>,
    /// Each key's position.
    pub k_pos: &'a Tensor<B, 1>,
    /// Softmax scale.
    pub scale: f32,
    /// The soft cap, if any.
    pub softcap: Option<f32>,
    /// A bf16 run: P and dS are rounded to bf16 before their products (the operands, f32 tensors,
    /// hold bf16 values).
    pub bf16: bool,
}

/// A forward tile's result: the running output and log-sum-exp with this tile merged in, and how
/// many key sub-tiles each cube computed (`[cubes]`; one that no row of the cube sees is skipped
/// and not counted).
pub struct ForwardTileResult<B: Backend> {
    /// `[b, h, tq, d]`.
    pub out: Tensor<B, 4>,
    /// `[b, h, tq]`.
    pub lse: Tensor<B, 3>,
    /// Sub-tiles computed, per cube.
    pub work: Tensor<B, 1>,
}

/// A backward tile's gradients, and the sub-tiles each of its two kernels' cubes computed.
pub struct BackwardTileResult<B: Backend> {
    /// `[b, h, tq, d]`.
    pub dq: Tensor<B, 4>,
    /// `[b, hk, tk, d]`.
    pub dk: Tensor<B, 4>,
    /// `[b, hk, tk, d]`.
    pub dv: Tensor<B, 4>,
    /// Query sub-tiles computed by each cube of the dK/dV kernel.
    pub work_dkdv: Tensor<B, 1>,
    /// Key sub-tiles computed by each cube of the dQ kernel.
    pub work_dq: Tensor<B, 1>,
}

/// Fused tile kernels a backend runs on its own device: nothing they touch crosses to the host.
pub trait DeviceTiles<B: Backend>: Sync {
    /// One tile's forward merged into the running `(out, lse)` (0 and −∞ before the first tile).
    fn forward(
        &self,
        tile: TileOperands<'_, B>,
        running: (Tensor<B, 4>, Tensor<B, 3>),
    ) -> ForwardTileResult<B>;

    /// One tile's dQ, dK and dV from the forward's final `lse` and δ = rowsum(dO ∘ O).
    fn backward(
        &self,
        tile: TileOperands<'_, B>,
        d_out: &Tensor<B, 4>,
        lse: &Tensor<B, 3>,
        delta: &Tensor<B, 3>,
    ) -> BackwardTileResult<B>;

    /// `lhs · rhs` over the last two axes (batched over the first two) with every product and
    /// sum in f32: the generic kernel's matmuls. Burn's own matmul on a CubeCL backend is
    /// autotuned, and on recent NVIDIA GPUs its tensor-core candidates compute f32 inputs in TF32
    /// (a 10-bit mantissa: 2⁻¹¹ relative), which the generic kernel's 1e-5 exactness cannot
    /// absorb; this one asks CubeCL for its unit (no tensor core) matmul.
    fn matmul_f32(&self, lhs: Tensor<B, 4>, rhs: Tensor<B, 4>) -> Tensor<B, 4>;
}

/// Where a unit of the fused kernels keeps its rows (their operands and accumulators), as the
/// device's CubeCL properties tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowStorage {
    /// A GPU's register file, of which the rows may take `floats` 32-bit values a unit before
    /// they spill to local memory.
    Registers {
        /// Row values a unit keeps in registers.
        floats: usize,
    },
    /// A device that does not describe itself (CubeCL's wgpu runtime reports no multiprocessors
    /// and cannot tell a GPU from Mesa's software device): the sizing measured on the software
    /// device, whose units are SIMD lanes of a CPU (no register cliff).
    Unknown,
}

/// Row values a CUDA unit keeps in registers: half of the 255 32-bit registers a thread may have
/// (every NVIDIA GPU since Maxwell), the other half left to addresses, loop state and temporaries.
pub const CUDA_ROW_REGISTERS: usize = 128;

impl RowStorage {
    /// The storage of a device with these CubeCL hardware properties: one that reports its
    /// streaming multiprocessors (CUDA) is a GPU with NVIDIA's register file; any other is
    /// [`RowStorage::Unknown`].
    pub fn of(streaming_multiprocessors: Option<u32>) -> RowStorage {
        match streaming_multiprocessors {
            Some(_) => RowStorage::Registers {
                floats: CUDA_ROW_REGISTERS,
            },
            None => RowStorage::Unknown,
        }
    }
}

/// Rows each unit owns (query rows forward and for dQ, key rows for dK and dV) for heads of
/// `head_dim` on a device whose units keep rows in `storage`: every vector read from shared memory
/// feeds this many rows. In registers, as many as the widest kernel's rows fit (dK/dV keeps four
/// values a column a row: k, v, dk, dv), at least 1 and at most 4. Elsewhere 4 up to 64
/// dimensions, 2 up to 128, then 1 (measured on Mesa's software device).
pub fn rows_per_unit(head_dim: usize, storage: RowStorage) -> usize {
    match storage {
        RowStorage::Registers { floats } => {
            let per_row = 4 * head_dim.div_ceil(4) * 4;
            (floats / per_row).clamp(1, 4)
        }
        RowStorage::Unknown => match head_dim {
            0..=64 => 4,
            65..=128 => 2,
            _ => 1,
        },
    }
}

/// The units of a cube (and the rows of each streamed sub-tile) for heads of `head_dim`, each unit
/// owning `r` rows, on a device that lets one cube use `shared_bytes` of shared memory (CubeCL's
/// `max_shared_memory_size`: WebGPU guarantees 16 KiB, Mesa's software Vulkan device offers 32
/// KiB, CUDA's opt-in maximum is 227 KiB on H100 and H200): the largest power of two up to 32 whose
/// two streamed sub-tiles (`head_dim` padded to a multiple of 4), four values a streamed row and
/// the windows of the cube's own rows fit, as f32.
pub fn tile_rows(head_dim: usize, r: usize, shared_bytes: usize) -> usize {
    let padded = head_dim.div_ceil(4) * 4;
    let per_unit = 2 * padded + 4 + 2 * r;
    let values = shared_bytes / size_of::<f32>();
    let mut rows = 32;
    while rows > 1 && rows * per_unit > values {
        rows /= 2;
    }
    rows
}

/// The rows a unit owns and the units of a cube (the sub-tile width) for heads of `head_dim` on a
/// device with these storage and shared memory.
pub fn cube_shape(head_dim: usize, storage: RowStorage, shared_bytes: usize) -> (usize, usize) {
    let r = rows_per_unit(head_dim, storage);
    (r, tile_rows(head_dim, r, shared_bytes))
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use launch::CubeTiles;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod launch {
    use super::{
        BackwardTileResult, DeviceTiles, ForwardTileResult, RowStorage, TileOperands, cube_shape,
        tiles,
    };
    use burn::tensor::Tensor;
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
    use cubecl::prelude::*;

    /// The CubeCL kernels of `tiles.rs`, launched on a CubeCL backend's tensors.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct CubeTiles;

    /// The tensor's CubeCL handle (shared, not copied).
    fn handle<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement, const D: usize>(
        tensor: &Tensor<CubeBackend<R, F, I, BT>, D>,
    ) -> CubeTensor<R> {
        let primitive = tensor.clone().into_primitive().tensor();
        assert_eq!(
            primitive.dtype,
            burn::tensor::DType::F32,
            "the fused device kernel reads f32 tensors (a bf16 block is widened before the launch)"
        );
        primitive
    }

    /// The rows a unit owns and the units of a cube for heads of `d` on the client's device, from
    /// its CubeCL properties (multiprocessors, shared memory).
    fn shape_on<R: CubeRuntime>(client: &ComputeClient<R>, d: usize) -> (usize, usize) {
        let hardware = &client.properties().hardware;
        cube_shape(
            d,
            RowStorage::of(hardware.num_streaming_multiprocessors),
            hardware.max_shared_memory_size,
        )
    }

    /// `n` per-cube counters, zero.
    fn counters<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
        n: usize,
        device: &R::Device,
    ) -> Tensor<CubeBackend<R, F, I, BT>, 1> {
        Tensor::zeros([n], device)
    }

    impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>
        DeviceTiles<CubeBackend<R, F, I, BT>> for CubeTiles
    {
        fn forward(
            &self,
            t: TileOperands<'_, CubeBackend<R, F, I, BT>>,
            (out_prev, lse_prev): (
                Tensor<CubeBackend<R, F, I, BT>, 4>,
                Tensor<CubeBackend<R, F, I, BT>, 3>,
            ),
        ) -> ForwardTileResult<CubeBackend<R, F, I, BT>> {
            let [b, h, tq, d] = t.q.dims();
            let device = t.q.device();
            let q = handle(t.q);
            let client = q.client.clone();
            let (r, rows) = shape_on(&client, d);
            let blocks = tq.div_ceil(rows * r);
            let out = Tensor::empty([b, h, tq, d], &device);
            let lse = Tensor::empty([b, h, tq], &device);
            let work = counters(blocks * h * b, &device);
            // SAFETY: every index the kernel reads or writes is inside its tensor: reads clamp
            // the row to the last one, writes are guarded by the row's bounds.
            unsafe {
                tiles::forward_tile::launch_unchecked::<R>(
                    &client,
                    CubeCount::Static(blocks as u32, h as u32, b as u32),
                    CubeDim::new_1d(rows as u32),
                    q.into_tensor_arg(),
                    handle(t.k).into_tensor_arg(),
                    handle(t.v).into_tensor_arg(),
                    handle(t.q_lo).into_tensor_arg(),
                    handle(t.q_hi).into_tensor_arg(),
                    handle(t.k_pos).into_tensor_arg(),
                    handle(&out_prev).into_tensor_arg(),
                    handle(&lse_prev).into_tensor_arg(),
                    handle(&out).into_tensor_arg(),
                    handle(&lse).into_tensor_arg(),
                    handle(&work).into_tensor_arg(),
                    t.scale,
                    t.softcap.unwrap_or(1.0),
                    f32::NEG_INFINITY,
                    rows,
                    r,
                    d,
                    t.softcap.is_some(),
                    t.bf16,
                )
            };
            ForwardTileResult { out, lse, work }
        }

        fn matmul_f32(
            &self,
            lhs: Tensor<CubeBackend<R, F, I, BT>, 4>,
            rhs: Tensor<CubeBackend<R, F, I, BT>, 4>,
        ) -> Tensor<CubeBackend<R, F, I, BT>, 4> {
            use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
            use cubek::matmul::launch::Strategy;
            use cubek::matmul::routines::BlueprintStrategy;
            use cubek::std::InputBinding;
            let (lhs, rhs) = (handle(&lhs), handle(&rhs));
            let dtype = burn::tensor::DType::F32;
            let out = burn_cubecl::kernel::matmul::init_matmul_output(&lhs, &rhs, dtype);
            let client = out.client.clone();
            let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
                lhs: dtype.into(),
                rhs: dtype.into(),
                out: dtype.into(),
            });
            // A unit matmul keeps f32 stage and register types (only tensor-core routines
            // switch f32 to TF32).
            cubek::matmul::launch::launch_ref(
                &Strategy::SimpleUnit(BlueprintStrategy::Inferred(Default::default())),
                &client,
                InputBinding::new(lhs.binding(), dtype.into()),
                InputBinding::new(rhs.binding(), dtype.into()),
                out.clone().binding(),
                &mut dtypes,
            )
            .unwrap_or_else(|e| panic!("CubeCL's unit matmul could not be set up: {e:?}"));
            Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(out))
        }

        fn backward(
            &self,
            t: TileOperands<'_, CubeBackend<R, F, I, BT>>,
            d_out: &Tensor<CubeBackend<R, F, I, BT>, 4>,
            lse: &Tensor<CubeBackend<R, F, I, BT>, 3>,
            delta: &Tensor<CubeBackend<R, F, I, BT>, 3>,
        ) -> BackwardTileResult<CubeBackend<R, F, I, BT>> {
            let [b, h, tq, d] = t.q.dims();
            let [_, hk, tk, _] = t.k.dims();
            let device = t.q.device();
            let q = handle(t.q);
            let client = q.client.clone();
            let (r, rows) = shape_on(&client, d);
            let (q_blocks, k_blocks) = (tq.div_ceil(rows * r), tk.div_ceil(rows * r));
            let dq = Tensor::empty([b, h, tq, d], &device);
            let dk = Tensor::empty([b, hk, tk, d], &device);
            let dv = Tensor::empty([b, hk, tk, d], &device);
            let work_dkdv = counters(k_blocks * hk * b, &device);
            let work_dq = counters(q_blocks * h * b, &device);
            let cap = t.softcap.unwrap_or(1.0);
            // SAFETY: every index the kernel reads or writes is inside its tensor: reads clamp
            // the row to the last one, writes are guarded by the row's bounds.
            unsafe {
                tiles::backward_dkdv::launch_unchecked::<R>(
                    &client,
                    CubeCount::Static(k_blocks as u32, hk as u32, b as u32),
                    CubeDim::new_1d(rows as u32),
                    q.clone().into_tensor_arg(),
                    handle(t.k).into_tensor_arg(),
                    handle(t.v).into_tensor_arg(),
                    handle(d_out).into_tensor_arg(),
                    handle(lse).into_tensor_arg(),
                    handle(delta).into_tensor_arg(),
                    handle(t.q_lo).into_tensor_arg(),
                    handle(t.q_hi).into_tensor_arg(),
                    handle(t.k_pos).into_tensor_arg(),
                    handle(&dk).into_tensor_arg(),
                    handle(&dv).into_tensor_arg(),
                    handle(&work_dkdv).into_tensor_arg(),
                    t.scale,
                    cap,
                    f32::NEG_INFINITY,
                    rows,
                    r,
                    d,
                    t.softcap.is_some(),
                    t.bf16,
                )
            };
            // SAFETY: every index the kernel reads or writes is inside its tensor: reads clamp
            // the row to the last one, writes are guarded by the row's bounds.
            unsafe {
                tiles::backward_dq::launch_unchecked::<R>(
                    &client,
                    CubeCount::Static(q_blocks as u32, h as u32, b as u32),
                    CubeDim::new_1d(rows as u32),
                    q.into_tensor_arg(),
                    handle(t.k).into_tensor_arg(),
                    handle(t.v).into_tensor_arg(),
                    handle(d_out).into_tensor_arg(),
                    handle(lse).into_tensor_arg(),
                    handle(delta).into_tensor_arg(),
                    handle(t.q_lo).into_tensor_arg(),
                    handle(t.q_hi).into_tensor_arg(),
                    handle(t.k_pos).into_tensor_arg(),
                    handle(&dq).into_tensor_arg(),
                    handle(&work_dq).into_tensor_arg(),
                    t.scale,
                    cap,
                    f32::NEG_INFINITY,
                    rows,
                    r,
                    d,
                    t.softcap.is_some(),
                    t.bf16,
                )
            };
            BackwardTileResult {
                dq,
                dk,
                dv,
                work_dkdv,
                work_dq,
            }
        }
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod wgpu_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// On CUDA (a device that reports its multiprocessors) a unit owns as many rows as the dK/dV
    /// kernel's four values a column fit in 128 registers, and a cube is a full warp of 32 units
    /// (227 KiB of shared memory); on a device that does not say (wgpu), the software device's
    /// measured sizing stays.
    #[test]
    fn cubes_are_shaped_from_the_device_properties() {
        let cuda = RowStorage::of(Some(132));
        assert_eq!(cuda, RowStorage::Registers { floats: 128 });
        assert_eq!(RowStorage::of(None), RowStorage::Unknown);
        let h100_shared = 227 * 1024;
        let shapes: Vec<(usize, usize)> = [16, 32, 64, 128]
            .iter()
            .map(|&d| cube_shape(d, cuda, h100_shared))
            .collect();
        assert_eq!(shapes, [(2, 32), (1, 32), (1, 32), (1, 32)]);
        // Up to d = 32 every kernel's rows fit the register budget; wider heads spill the dK/dV
        // kernel's (4·d values a unit), which this sizing cannot avoid with one row a unit.
        for d in [16, 32] {
            let (r, _) = cube_shape(d, cuda, h100_shared);
            assert!(4 * d * r <= CUDA_ROW_REGISTERS, "d = {d}");
        }
        let llvmpipe_shared = 32 * 1024;
        let measured: Vec<usize> = [16, 64, 128, 256]
            .iter()
            .map(|&d| rows_per_unit(d, RowStorage::Unknown))
            .collect();
        assert_eq!(measured, [4, 4, 2, 1]);
        // Shared memory bounds the sub-tile: 32 KiB holds 32 rows of 2 × 64 floats, not of 2 × 128.
        assert_eq!(tile_rows(64, 4, llvmpipe_shared), 32);
        assert_eq!(tile_rows(128, 2, llvmpipe_shared), 16);
        // WebGPU's guaranteed 16 KiB.
        assert_eq!(tile_rows(128, 2, 16 * 1024), 8);
    }
}
