//! The fused device kernels' own tests on wgpu: a causal tile against float64, and the sub-tiles
//! each cube counts it computed.

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
                                q[(head * t + i) * d + c] as f64 * k[(kvh * t + j) * d + c] as f64
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
                        tokens_first[((bb * t + i) * heads + hh) * d + c] = x[(hh * t + i) * d + c];
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
