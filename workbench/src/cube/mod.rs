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

/// One tile's operands on the device: q `[b, h, tq, d]`, k and v `[b, hk, tk, d]`, the queries'
/// windows' first and last visible key position `[tq]` and the keys' positions `[tk]` (f32), and
/// how scores are made.
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
}

/// Rows each unit owns (query rows forward and for dQ, key rows for dK and dV) for heads of
/// `head_dim`: every vector read from shared memory feeds this many rows. 4 up to 64 dimensions,
/// 2 up to 128, then 1 (the rows' operands and accumulators live in registers).
pub fn rows_per_unit(head_dim: usize) -> usize {
    match head_dim {
        0..=64 => 4,
        65..=128 => 2,
        _ => 1,
    }
}

/// The units of a cube (and the rows of each streamed sub-tile) for heads of `head_dim` on a device
/// that lets one cube use `shared_bytes` of shared memory (CubeCL's `max_shared_memory_size`:
/// WebGPU guarantees 16 KiB, Mesa's software Vulkan device offers 32 KiB, CUDA's opt-in maximum is
/// 227 KiB on H100 and H200): the largest power of two up to 32 whose two streamed sub-tiles
/// (`head_dim` padded to a multiple of 4), four values a streamed row and the windows of the cube's
/// own rows fit, as f32.
pub fn tile_rows(head_dim: usize, shared_bytes: usize) -> usize {
    let padded = head_dim.div_ceil(4) * 4;
    let per_unit = 2 * padded + 4 + 2 * rows_per_unit(head_dim);
    let values = shared_bytes / size_of::<f32>();
    let mut rows = 32;
    while rows > 1 && rows * per_unit > values {
        rows /= 2;
    }
    rows
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use launch::CubeTiles;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod launch {
    use super::{
        BackwardTileResult, DeviceTiles, ForwardTileResult, TileOperands, rows_per_unit, tile_rows,
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
            "the fused device kernel reads f32 tensors (bf16 runs are refused before a pass)"
        );
        primitive
    }

    /// Shared memory one cube may use on the tensors' device, in bytes.
    fn shared_bytes<R: CubeRuntime>(client: &ComputeClient<R>) -> usize {
        client.properties().hardware.max_shared_memory_size
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
            let rows = tile_rows(d, shared_bytes(&client));
            let r = rows_per_unit(d);
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
                )
            };
            ForwardTileResult { out, lse, work }
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
            let rows = tile_rows(d, shared_bytes(&client));
            let r = rows_per_unit(d);
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
mod wgpu_tests {
    use super::*;
    use crate::backends::Wgpu;
    use burn::tensor::TensorData;

    fn on<const D: usize>(data: Vec<f32>, shape: [usize; D]) -> Tensor<Wgpu, D> {
        Tensor::from_data(TensorData::new(data, shape), &Default::default())
    }

    fn values<const D: usize>(t: Tensor<Wgpu, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
    }

    /// A float64 forward of `[1, h, t, d]` with `hk` kv heads, causal over positions `0..t`.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (h, hk, t, d): (usize, usize, usize, usize),
        scale: f64,
    ) -> Vec<f64> {
        let mut out = vec![0.0; h * t * d];
        for head in 0..h {
            let kvh = head / (h / hk);
            for i in 0..t {
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        scale
                            * (0..d)
                                .map(|c| {
                                    q[(head * t + i) * d + c] as f64
                                        * k[(kvh * t + j) * d + c] as f64
                                })
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (j, x) in s.iter().enumerate() {
                    let p = (x - m).exp() / l;
                    for c in 0..d {
                        out[(head * t + i) * d + c] += p * v[(kvh * t + j) * d + c] as f64;
                    }
                }
            }
        }
        out
    }

    /// One causal tile of 320 × 320 (10 key sub-tiles of 32 at d = 16): the output within 1e-5 of
    /// the float64 reference, and each cube computed exactly the key sub-tiles up to its last row's:
    /// the sub-tiles above the diagonal did no work.
    #[test]
    fn a_causal_tile_computes_only_the_sub_tiles_its_rows_see() {
        let rows = causal_tile((4, 2, 320, 16), 1e-5);
        assert_eq!(rows, 32);
    }

    /// Wide heads, where a unit owns 2 rows of 17 vectors (d = 68) and the cube's rows are what the
    /// device's shared memory holds: a causal tile of 80 × 80 within the float64 reference, at a
    /// tolerance derived like `F32_ATTENTION` (`ringbench_tests`): a score sums d = 68 products,
    /// p·V 80 terms, the merge one partial a sub-tile: (68 + 80 + 8)·u ≈ 9.3e-6 of the magnitudes.
    /// (d = 128 took 90 s here, llvmpipe compiling the kernel; d = 68 takes the same path.)
    #[test]
    fn a_causal_tile_of_wide_heads_matches_float64() {
        let u = 2f64.powi(-24);
        causal_tile((4, 2, 80, 68), (68.0 + 80.0 + 8.0) * u);
    }

    /// One causal tile `(h, hk, t, d)`, batch 2, read through strided views, checked against the
    /// float64 reference within `tolerance` of its largest magnitude, with each cube's own count of
    /// the key sub-tiles it computed: those up to its last row's. Returns the cube's rows.
    fn causal_tile((h, hk, t, d): (usize, usize, usize, usize), tolerance: f64) -> usize {
        let device = Default::default();
        let client = <burn::backend::wgpu::WgpuRuntime as cubecl::Runtime>::client(&device);
        let rows = tile_rows(d, client.properties().hardware.max_shared_memory_size);
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin() * 1.5).collect() };
        let (q, k, v) = (
            wave(h * t * d, 0.37),
            wave(hk * t * d, 0.91),
            wave(hk * t * d, 0.53),
        );
        let positions: Vec<f32> = (0..t).map(|p| p as f32).collect();
        let zero: Vec<f32> = vec![0.0; t];
        // Batch 2 (the second a copy of the first), laid out [b, t, h, d] and swapped: strided reads.
        let strided = |x: &[f32], heads: usize| {
            let mut tokens_first = vec![0.0; 2 * t * heads * d];
            for bb in 0..2 {
                for hh in 0..heads {
                    for i in 0..t {
                        for c in 0..d {
                            tokens_first[((bb * t + i) * heads + hh) * d + c] =
                                x[(hh * t + i) * d + c];
                        }
                    }
                }
            }
            on(tokens_first, [2, t, heads, d]).swap_dims(1, 2)
        };
        let (qt, kt, vt) = (strided(&q, h), strided(&k, hk), strided(&v, hk));
        let (lo, hi, pos) = (
            on(zero, [t]),
            on(positions.clone(), [t]),
            on(positions, [t]),
        );
        let result = CubeTiles.forward(
            TileOperands {
                q: &qt,
                k: &kt,
                v: &vt,
                q_lo: &lo,
                q_hi: &hi,
                k_pos: &pos,
                scale: 0.3,
                softcap: None,
            },
            (
                Tensor::zeros([2, h, t, d], &device),
                Tensor::full([2, h, t], f32::NEG_INFINITY, &device),
            ),
        );
        let want = reference(&q, &k, &v, (h, hk, t, d), 0.3);
        let got = values(result.out);
        assert!(want.iter().all(|w| w.is_finite()));
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (i, (g, w)) in got.iter().zip(want.iter().chain(&want)).enumerate() {
            assert!(
                ((*g as f64) - w).abs() <= tolerance * scale,
                "out[{i}] (row {}): {g} vs {w}",
                i / d % t
            );
        }
        // A query block of `rows · rows_per_unit(d)` rows sees the key sub-tiles up to its last row's.
        let work = values(result.work);
        let block_rows = rows * rows_per_unit(d);
        let blocks = t.div_ceil(block_rows);
        let want_work: Vec<f32> = (0..2 * h)
            .flat_map(|_| (0..blocks).map(|qb| (((qb + 1) * block_rows).min(t) - 1) / rows + 1))
            .map(|n| n as f32)
            .collect();
        assert_eq!(work, want_work);
        rows
    }
}
