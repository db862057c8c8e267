//! The fused device kernels' own tests on wgpu: a causal tile against float64, the sub-tiles each
//! cube counts it computed, and a bf16 run's rounding of P and dS.

use super::*;
use crate::backends::Wgpu;
use burn::tensor::TensorData;

fn on<const D: usize>(data: Vec<f32>, shape: [usize; D]) -> Tensor<Wgpu, D> {
    Tensor::from_data(TensorData::new(data, shape), &Default::default())
}

fn values<const D: usize>(t: Tensor<Wgpu, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// A causal tile's windows over positions `0..t` (each query sees keys 0 up to its own position)
/// and its keys' positions: `[lo, hi, positions]`.
fn causal_windows(t: usize) -> [Tensor<Wgpu, 1>; 3] {
    let positions: Vec<f32> = (0..t).map(|p| p as f32).collect();
    [
        on(vec![0.0; t], [t]),
        on(positions.clone(), [t]),
        on(positions, [t]),
    ]
}

/// The operands of a causal tile of `[q, k, v]` with `windows` ([`causal_windows`]), no cap.
fn causal_operands<'a>(
    [q, k, v]: [&'a Tensor<Wgpu, 4>; 3],
    [q_lo, q_hi, k_pos]: &'a [Tensor<Wgpu, 1>; 3],
    scale: f32,
    bf16: bool,
) -> TileOperands<'a, Wgpu> {
    TileOperands {
        q,
        k,
        v,
        q_lo,
        q_hi,
        k_pos,
        scale,
        softcap: None,
        bf16,
    }
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

/// One causal tile of 320 × 320 (10 key sub-tiles of 32 at d = 16): the output within the float64
/// reference at a tolerance derived like `F32_ATTENTION` for this tile's length (a score sums d = 16
/// products, p·V up to 320 terms, the merge one partial a sub-tile: (16 + 320 + 10)·u ≈ 2.1e-5 of
/// the magnitudes), and each cube computed exactly the key sub-tiles up to its last row's: the
/// sub-tiles above the diagonal did no work.
#[test]
fn a_causal_tile_computes_only_the_sub_tiles_its_rows_see() {
    let u = 2f64.powi(-24);
    let rows = causal_tile((4, 2, 320, 16), (16.0 + 320.0 + 10.0) * u);
    assert_eq!(rows, 32);
}

/// Wide heads, where a unit owns 2 rows of 17 vectors (d = 68) and the cube's rows are what the
/// device's shared memory holds: a causal tile of 80 × 80 within the float64 reference, at a
/// tolerance derived like `F32_ATTENTION` (`reference::bounds`): a score sums d = 68 products,
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
    let hardware = &client.properties().hardware;
    let (r, rows) = cube_shape(
        d,
        RowStorage::of(hardware.num_streaming_multiprocessors),
        hardware.max_shared_memory_size,
    );
    let wave =
        |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin() * 1.5).collect() };
    let (q, k, v) = (
        wave(h * t * d, 0.37),
        wave(hk * t * d, 0.91),
        wave(hk * t * d, 0.53),
    );
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
    let windows = causal_windows(t);
    let result = CubeTiles.forward(
        causal_operands([&qt, &kt, &vt], &windows, 0.3, false),
        (
            Tensor::zeros([2, h, t, d], &device),
            Tensor::full([2, h, t], f32::NEG_INFINITY, &device),
        ),
    );
    let want = reference(&q, &k, &v, (h, hk, t, d), 0.3);
    let got = values(result.out);
    assert!(want.iter().all(|w| w.is_finite()));
    // Both batches: the second is a copy of the first.
    assert_eq!(got.len(), 2 * want.len(), "the output's length");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want.iter().chain(&want)).enumerate() {
        assert!(
            ((*g as f64) - w).abs() <= tolerance * scale,
            "out[{i}] (row {}): {g} vs {w}",
            i / d % t
        );
    }
    // A query block of `rows · r` rows sees the key sub-tiles up to its last row's.
    let work = values(result.work);
    let block_rows = rows * r;
    let blocks = t.div_ceil(block_rows);
    let want_work: Vec<f32> = (0..2 * h)
        .flat_map(|_| (0..blocks).map(|qb| (((qb + 1) * block_rows).min(t) - 1) / rows + 1))
        .map(|n| n as f32)
        .collect();
    assert_eq!(work, want_work);
    rows
}

/// One causal tile `[1, h, t, d]` (kv head `head / (h / hk)`) in float64, as the kernels compute
/// it, with P and dS rounded to bf16 before their products when `round`: forward one key at a time
/// with an online softmax (P relative to the running max, as the forward kernel rounds it),
/// backward from the final lse. Every output comes with its terms' magnitude (the sum of the
/// absolute values it is summed from), the scale a rounding of each term is bounded at.
struct Tile64 {
    out: Vec<(f64, f64)>,
    lse: Vec<f64>,
    delta: Vec<f64>,
    dq: Vec<(f64, f64)>,
    dk: Vec<(f64, f64)>,
    dv: Vec<(f64, f64)>,
}

#[allow(clippy::too_many_arguments)]
fn tile64(
    [q, k, v, d_out]: [&[f32]; 4],
    (h, hk, t, d): (usize, usize, usize, usize),
    scale: f64,
    round: bool,
    // The forward's lse and δ, when the backward must use the exact ones (as the ring gives it).
    given: Option<(&[f64], &[f64])>,
) -> Tile64 {
    let r = |x: f64| {
        if round {
            f64::from(crate::dtype::round_bf16(x as f32))
        } else {
            x
        }
    };
    let at = |x: &[f32], head: usize, i: usize, c: usize| f64::from(x[(head * t + i) * d + c]);
    let score = |head: usize, i: usize, j: usize| {
        let kvh = head / (h / hk);
        scale
            * (0..d)
                .map(|c| at(q, head, i, c) * at(k, kvh, j, c))
                .sum::<f64>()
    };
    let mut out = vec![(0.0, 0.0); h * t * d];
    let mut lse = vec![0.0; h * t];
    for head in 0..h {
        let kvh = head / (h / hk);
        for i in 0..t {
            let (mut m, mut l) = (f64::NEG_INFINITY, 0.0);
            let mut acc = vec![(0.0, 0.0); d];
            for j in 0..=i {
                let s = score(head, i, j);
                let m_new = m.max(s);
                let (correction, p) = ((m - m_new).exp(), (s - m_new).exp());
                l = l * correction + p;
                for (c, a) in acc.iter_mut().enumerate() {
                    let term = r(p) * at(v, kvh, j, c);
                    *a = (a.0 * correction + term, a.1 * correction + term.abs());
                }
                m = m_new;
            }
            lse[head * t + i] = m + l.ln();
            for (c, a) in acc.iter().enumerate() {
                out[(head * t + i) * d + c] = (a.0 / l, a.1 / l);
            }
        }
    }
    let delta: Vec<f64> = (0..h * t)
        .map(|row| {
            (0..d)
                .map(|c| f64::from(d_out[row * d + c]) * out[row * d + c].0)
                .sum()
        })
        .collect();
    let (lse_b, delta_b) = given.unwrap_or((&lse, &delta));
    let mut dq = vec![(0.0, 0.0); h * t * d];
    let mut dk = vec![(0.0, 0.0); hk * t * d];
    let mut dv = vec![(0.0, 0.0); hk * t * d];
    let add = |x: &mut (f64, f64), term: f64| *x = (x.0 + term, x.1 + term.abs());
    for head in 0..h {
        let kvh = head / (h / hk);
        for i in 0..t {
            for j in 0..=i {
                let p = (score(head, i, j) - lse_b[head * t + i]).exp();
                let dp: f64 = (0..d)
                    .map(|c| at(d_out, head, i, c) * at(v, kvh, j, c))
                    .sum();
                let ds = r(p * (dp - delta_b[head * t + i])) * scale;
                for c in 0..d {
                    add(&mut dv[(kvh * t + j) * d + c], r(p) * at(d_out, head, i, c));
                    add(&mut dq[(head * t + i) * d + c], ds * at(k, kvh, j, c));
                    add(&mut dk[(kvh * t + j) * d + c], ds * at(q, head, i, c));
                }
            }
        }
    }
    Tile64 {
        out,
        lse,
        delta,
        dq,
        dk,
        dv,
    }
}

/// The root mean square of `got − want`; NaN when any value is not finite (a failure for `<`).
fn rms(got: &[f32], want: &[(f64, f64)]) -> f64 {
    assert_eq!(got.len(), want.len());
    let sum: f64 = got
        .iter()
        .zip(want)
        .map(|(g, (w, _))| (f64::from(*g) - w).powi(2))
        .sum();
    (sum / got.len() as f64).sqrt()
}

/// A bf16 run's tile (operands holding bf16 values, `bf16: true`): every output within bf16's
/// roundoff of its terms (P and dS each move by at most u = 2⁻⁸ of themselves, so each output by
/// at most u of its terms' magnitude) plus f32's tolerance, 1e-5 of the output's scale; and the
/// rounding happened where it should: with it, each output is closer to the float64 tile that
/// rounds P and dS than to the one that does not, and without it (`bf16: false`, same operands)
/// the other way round. Forward and both backward kernels, grouped-query heads, causal, 64 rows.
#[test]
fn a_bf16_tile_rounds_p_and_ds_before_their_products() {
    let (h, hk, t, d) = (2, 1, 64, 16);
    let device = Default::default();
    let wave = |n: usize, f: f32| -> Vec<f32> {
        (0..n)
            .map(|i| crate::dtype::round_bf16((i as f32 * f).sin() * 1.5))
            .collect()
    };
    let (q, k, v, d_out) = (
        wave(h * t * d, 0.37),
        wave(hk * t * d, 0.91),
        wave(hk * t * d, 0.53),
        wave(h * t * d, 0.29),
    );
    let scale = 0.3;
    let exact = tile64([&q, &k, &v, &d_out], (h, hk, t, d), scale, false, None);
    let given = Some((exact.lse.as_slice(), exact.delta.as_slice()));
    let rounded = tile64([&q, &k, &v, &d_out], (h, hk, t, d), scale, true, given);
    let windows = causal_windows(t);
    let (qt, kt, vt, dot) = (
        on(q.clone(), [1, h, t, d]),
        on(k.clone(), [1, hk, t, d]),
        on(v.clone(), [1, hk, t, d]),
        on(d_out.clone(), [1, h, t, d]),
    );
    let f32s = |x: &[f64], shape: [usize; 3]| on(x.iter().map(|&y| y as f32).collect(), shape);
    let (lse, delta) = (f32s(&exact.lse, [1, h, t]), f32s(&exact.delta, [1, h, t]));
    let run = |bf16: bool| {
        let operands = || causal_operands([&qt, &kt, &vt], &windows, scale as f32, bf16);
        let running = (
            Tensor::zeros([1, h, t, d], &device),
            Tensor::full([1, h, t], f32::NEG_INFINITY, &device),
        );
        let forward = CubeTiles.forward(operands(), running);
        let backward = CubeTiles.backward(operands(), &dot, &lse, &delta);
        [
            values(forward.out),
            values(backward.dq),
            values(backward.dk),
            values(backward.dv),
        ]
    };
    let (with, without) = (run(true), run(false));
    let u = crate::dtype::Dtype::Bf16.unit_roundoff();
    let names = ["out", "dq", "dk", "dv"];
    let exact_of = [&exact.out, &exact.dq, &exact.dk, &exact.dv];
    let rounded_of = [&rounded.out, &rounded.dq, &rounded.dk, &rounded.dv];
    for (n, name) in names.iter().enumerate() {
        let (want, want_rounded) = (exact_of[n], rounded_of[n]);
        let largest = want.iter().fold(0.0f64, |m, (w, _)| m.max(w.abs()));
        assert_eq!(with[n].len(), want.len(), "{name}: the output's length");
        for (i, (g, (w, terms))) in with[n].iter().zip(want.iter()).enumerate() {
            let bound = u * terms + 1e-5 * largest;
            assert!(
                (f64::from(*g) - w).abs() <= bound,
                "{name}[{i}]: {g} vs {w}, bound {bound:e}"
            );
        }
        let (on_rounded, on_exact) = (rms(&with[n], want_rounded), rms(&with[n], want));
        assert!(
            on_rounded < on_exact,
            "{name} with bf16: rms {on_rounded:e} from the rounding tile, {on_exact:e} from the exact one"
        );
        let (off_rounded, off_exact) = (rms(&without[n], want_rounded), rms(&without[n], want));
        assert!(
            off_exact < off_rounded,
            "{name} without: rms {off_exact:e} from the exact tile, {off_rounded:e} from the rounding one"
        );
    }
}
