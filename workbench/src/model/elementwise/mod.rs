//! A layer's steps between its matmuls (RMSNorm and its backward, SwiGLU's gate and its backward, the
//! heads' layout) as one backend trait: Burn tensor ops by default (the reference twin), one parallel
//! pass over host memory on the CPU backend (`cpu.rs`) instead of a chain of single-threaded,
//! allocating tensor ops, and one autodiff op each whose backward is the inner backend's own pass
//! (`autodiff.rs`).
//!
//! RMSNorm: `y = γ ∘ x·r`, `r = (mean(x²) + ε)^(−1/2)` over the last dimension; given dy,
//! `dγ = Σ dy ∘ x·r` and `dx = r·g − r³·x·mean(g ∘ x)` for `g = dy ∘ γ`. SwiGLU's gate:
//! `m = silu(a) ∘ g`, `silu(a) = a·σ(a)`; given dm, `da = dm ∘ g ∘ σ(a)·(1 + a·(1 − σ(a)))` and
//! `dg = dm ∘ silu(a)`.

mod autodiff;
mod cpu;

use crate::primitive::{unwrap, wrap};
use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// Backends that run a layer's elementwise steps. Every default method is the reference twin in Burn
/// tensor ops; the CPU backend overrides each with one pass over host memory.
pub trait ElementwiseBackend: Backend {
    /// RMSNorm of `x: [b, t, d]` by `γ: [d]`: `(y [b, t, d], r [b, t, 1])`.
    fn rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, gamma) = (wrap::<Self, 3>(x), wrap::<Self, 1>(gamma));
        let r = (x.clone().square().mean_dim(2) + eps).sqrt().recip();
        (unwrap(x * r.clone() * gamma.unsqueeze()), unwrap(r))
    }

    /// RMSNorm's backward: `(dx [b, t, d], dγ [d])` of `dy` at input `x` with `r` from the forward.
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        r: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, r, dy) = (wrap::<Self, 3>(x), wrap::<Self, 3>(r), wrap::<Self, 3>(dy));
        let gamma = wrap::<Self, 1>(gamma);
        let d = gamma.dims()[0];
        let d_gamma = (dy.clone() * x.clone() * r.clone())
            .reshape([-1, d as i32])
            .sum_dim(0)
            .reshape([d]);
        let g = dy * gamma.unsqueeze();
        let mean_gx = (g.clone() * x.clone()).mean_dim(2);
        let dx = g * r.clone() - x * r.clone() * r.clone() * r * mean_gx;
        (unwrap(dx), unwrap(d_gamma))
    }

    /// SwiGLU's gate `silu(a) ∘ g` of two `[n, f]` matrices.
    fn swiglu(a: FloatTensor<Self>, g: FloatTensor<Self>) -> FloatTensor<Self> {
        unwrap(silu(wrap::<Self, 2>(a)) * wrap::<Self, 2>(g))
    }

    /// The gate's backward: `(da, dg, m)` of `dm` at `a`, `g` (`m = silu(a) ∘ g` recomputed, for
    /// the down projection's weight gradient).
    fn swiglu_backward(
        a: FloatTensor<Self>,
        g: FloatTensor<Self>,
        dm: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let (a, g, dm) = (wrap::<Self, 2>(a), wrap::<Self, 2>(g), wrap::<Self, 2>(dm));
        let sig = sigmoid(a.clone());
        let act = a.clone() * sig.clone();
        let m = act.clone() * g.clone();
        let d_silu = sig.clone() * (a * (sig.neg() + 1.0) + 1.0);
        let da = dm.clone() * g * d_silu;
        let dg = dm * act;
        [unwrap(da), unwrap(dg), unwrap(m)]
    }

    /// `[b, t, heads · hd]` as `[b, heads, t, hd]`, contiguous.
    fn heads_first(x: FloatTensor<Self>, heads: usize) -> FloatTensor<Self> {
        let x = wrap::<Self, 3>(x);
        let [b, t, width] = x.dims();
        unwrap(x.reshape([b, t, heads, width / heads]).swap_dims(1, 2))
    }

    /// `[b, heads, t, hd]` as `[b, t, heads · hd]`, contiguous.
    fn heads_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let x = wrap::<Self, 4>(x);
        let [b, heads, t, hd] = x.dims();
        unwrap(x.swap_dims(1, 2).reshape([b, t, heads * hd]))
    }
}

#[cfg(feature = "cuda")]
impl ElementwiseBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl ElementwiseBackend for crate::backends::Wgpu {}

/// The tensor-level entry points the layer calls.
pub(crate) fn rms_norm<B: ElementwiseBackend>(
    x: Tensor<B, 3>,
    gamma: &Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let (y, r) = B::rms_norm(unwrap(x), unwrap(gamma.clone()), eps);
    (wrap(y), wrap(r))
}

/// RMSNorm's backward: `(dx, dγ)` of `dy` at input `x` with `r` from [`rms_norm`].
pub(crate) fn rms_norm_backward<B: ElementwiseBackend>(
    x: Tensor<B, 3>,
    r: Tensor<B, 3>,
    gamma: &Tensor<B, 1>,
    dy: Tensor<B, 3>,
) -> (Tensor<B, 3>, Tensor<B, 1>) {
    let (dx, d_gamma) =
        B::rms_norm_backward(unwrap(x), unwrap(r), unwrap(gamma.clone()), unwrap(dy));
    (wrap(dx), wrap(d_gamma))
}

/// `silu(a) ∘ g` of `[n, f]` matrices.
pub(crate) fn swiglu<B: ElementwiseBackend>(a: Tensor<B, 2>, g: Tensor<B, 2>) -> Tensor<B, 2> {
    wrap(B::swiglu(unwrap(a), unwrap(g)))
}

/// `(da, dg, m)` of `dm` at `a`, `g`.
pub(crate) fn swiglu_backward<B: ElementwiseBackend>(
    a: Tensor<B, 2>,
    g: Tensor<B, 2>,
    dm: Tensor<B, 2>,
) -> [Tensor<B, 2>; 3] {
    B::swiglu_backward(unwrap(a), unwrap(g), unwrap(dm)).map(wrap)
}

/// `[b, t, heads · hd]` as `[b, heads, t, hd]`.
pub(crate) fn heads_first<B: ElementwiseBackend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    wrap(B::heads_first(unwrap(x), heads))
}

/// `[b, heads, t, hd]` as `[b, t, heads · hd]`.
pub(crate) fn heads_last<B: ElementwiseBackend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    wrap(B::heads_last(unwrap(x)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::read;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::activation::silu;
    use burn::tensor::{Distribution, TensorData};
    use ringbench_tests::{F32_UNIT_ROUNDOFF, deviation};

    /// The reference twins: autodiff runs the default methods' tensor ops.
    type Twin = Autodiff<Flex>;

    /// A `[2, t, 24]` tensor that is a strided view (transposed back from `[t, 2, 24]`), values in
    /// [−3, 3], and the same values as a float64 vector row-major.
    fn strided_input(seed: u64, t: usize) -> (Tensor<Flex, 3>, Vec<f64>) {
        let device = Default::default();
        let x = crate::model::lazy::seeded::<Flex, _>(seed, &device, || {
            Tensor::<Flex, 3>::random([t, 2, 24], Distribution::Uniform(-3.0, 3.0), &device)
        })
        .swap_dims(0, 1);
        let values = read(x.clone()).into_iter().map(f64::from).collect();
        (x, values)
    }

    fn twin<const D: usize>(x: &Tensor<Flex, D>) -> Tensor<Twin, D> {
        Tensor::from_inner(x.clone())
    }

    fn flex_of(values: &[f64], shape: &[usize]) -> Tensor<Flex, 1> {
        let data: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        Tensor::from_data(
            TensorData::new(data, [shape.iter().product::<usize>()]),
            &Default::default(),
        )
    }

    /// RMSNorm of a row of d: d squares summed (d·u), a division, a square root and a reciprocal,
    /// two products (4u): the float64 value to (d + 8)·u relative to the output's scale.
    /// 5 tokens run as one task, 400 (19,200 elements) as several in parallel.
    #[test]
    fn rms_norm_and_its_backward_match_float64_and_the_twin() {
        for t in [5, 400] {
            rms_norm_case(t);
        }
    }

    fn rms_norm_case(t: usize) {
        let (x, xs) = strided_input(3, t);
        let (gamma_v, _) = strided_input(4, 1);
        let gamma_values: Vec<f64> = read(gamma_v)
            .iter()
            .take(24)
            .map(|&v| f64::from(v))
            .collect();
        let gamma = flex_of(&gamma_values, &[24]);
        let (dy, dys) = strided_input(5, t);
        let eps = 1e-6;
        // float64: y, r, dx, dγ
        let (mut y64, mut dx64, mut dg64) = (vec![], vec![], vec![0.0f64; 24]);
        for (row, dy) in xs.chunks(24).zip(dys.chunks(24)) {
            let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / 24.0 + eps).sqrt();
            y64.extend(row.iter().zip(&gamma_values).map(|(v, g)| v * r * g));
            let g: Vec<f64> = dy.iter().zip(&gamma_values).map(|(a, b)| a * b).collect();
            let mean_gx = g.iter().zip(row).map(|(a, b)| a * b).sum::<f64>() / 24.0;
            dx64.extend(
                g.iter()
                    .zip(row)
                    .map(|(g, v)| r * g - r * r * r * v * mean_gx),
            );
            for ((acc, d), v) in dg64.iter_mut().zip(dy).zip(row) {
                *acc += d * v * r;
            }
        }
        let tolerance = (24.0 + 8.0) * F32_UNIT_ROUNDOFF;
        let (y, r) = rms_norm(x.clone(), &gamma, eps);
        let got = deviation(&read(y.clone()), &y64);
        assert!(got.within(tolerance), "y: {got}");
        let (y_twin, _) = rms_norm(twin(&x), &twin(&gamma), eps);
        assert!(deviation(&read(y), &read(y_twin.inner())).within(2.0 * tolerance));
        // The backward: a dot product of d, then the same few products per element; dγ sums the
        // 2t rows' products: (d + 2t + 8)·u.
        let (dx, dg) = rms_norm_backward(x, r, &gamma, dy);
        let got = deviation(&read(dx), &dx64);
        assert!(got.within((24.0 + 8.0) * F32_UNIT_ROUNDOFF), "dx: {got}");
        let got = deviation(&read(dg), &dg64);
        assert!(
            got.within((24.0 + 2.0 * t as f64 + 8.0) * F32_UNIT_ROUNDOFF),
            "dγ: {got}"
        );
    }

    /// The gate and its backward against float64: exp to 4e-7 relative (its test), then a division
    /// and three products: within 4e-7 + 8u of each element's scale.
    #[test]
    fn the_gate_and_its_backward_match_float64() {
        let (a, av) = strided_input(6, 400);
        let (g, gv) = strided_input(7, 400);
        let (dm, dmv) = strided_input(8, 400);
        let flat = |x: Tensor<Flex, 3>| x.reshape([800, 24]);
        let sig = |a: f64| 1.0 / (1.0 + (-a).exp());
        let m64: Vec<f64> = av.iter().zip(&gv).map(|(a, g)| a * sig(*a) * g).collect();
        let da64: Vec<f64> = (0..av.len())
            .map(|i| {
                let s = sig(av[i]);
                dmv[i] * gv[i] * s * (1.0 + av[i] * (1.0 - s))
            })
            .collect();
        let dg64: Vec<f64> = (0..av.len()).map(|i| dmv[i] * av[i] * sig(av[i])).collect();
        let tolerance = 4e-7 + 8.0 * F32_UNIT_ROUNDOFF;
        let m = swiglu(flat(a.clone()), flat(g.clone()));
        let got = deviation(&read(m), &m64);
        assert!(got.within(tolerance), "m: {got}");
        let [da, dg, m] = swiglu_backward(flat(a), flat(g), flat(dm));
        for (name, got, want) in [("da", da, &da64), ("dg", dg, &dg64), ("m", m, &m64)] {
            let got = deviation(&read(got), want);
            assert!(got.within(tolerance), "{name}: {got}");
        }
    }

    /// Moving heads first and back are copies: the twins' bits, from a strided input too.
    #[test]
    fn heads_move_as_the_twins_move_them() {
        let (x, _) = strided_input(9, 5);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let first = heads_first(x.clone(), 4);
        assert_eq!(first.dims(), [2, 4, 5, 6]);
        assert_eq!(
            bits(read(first.clone())),
            bits(read(heads_first(twin(&x), 4).inner()))
        );
        let back = heads_last(first);
        assert_eq!(bits(read(back)), bits(read(x)));
    }

    /// Autodiff through each step (one op, the inner pass as its backward) gives the gradients that
    /// autodiff through the twin's tensor ops gives: both are f32 approximations of the same values,
    /// each within the float64 bounds above, so within twice the larger of them of each other.
    #[test]
    fn autodiff_through_each_step_gives_the_tensor_ops_gradients() {
        let leaf = |seed: u64| Tensor::<Twin, 3>::from_inner(strided_input(seed, 400).0);
        let (x, g, weight) = (leaf(10).require_grad(), leaf(11).require_grad(), leaf(12));
        let gamma = Tensor::<Twin, 1>::from_inner(flex_of(&[0.5; 24], &[24])).require_grad();
        let eps = 1e-6;
        // The steps chained: RMSNorm, the gate, heads first and back.
        let ours = |x: &Tensor<Twin, 3>, g: &Tensor<Twin, 3>, gamma: &Tensor<Twin, 1>| {
            let (y, _) = rms_norm(x.clone(), gamma, eps);
            let m = swiglu(y.reshape([800, 24]), g.clone().reshape([800, 24]));
            heads_last(heads_first(m.reshape([2, 400, 24]), 4))
        };
        let twins = |x: &Tensor<Twin, 3>, g: &Tensor<Twin, 3>, gamma: &Tensor<Twin, 1>| {
            let r = (x.clone().square().mean_dim(2) + eps).sqrt().recip();
            let y = x.clone() * r * gamma.clone().unsqueeze();
            let m = silu(y) * g.clone();
            m.reshape([2, 400, 4, 6])
                .swap_dims(1, 2)
                .swap_dims(1, 2)
                .reshape([2, 400, 24])
        };
        let grads = |out: Tensor<Twin, 3>| {
            let grads = (out * weight.clone()).sum().backward();
            [
                read(x.grad(&grads).expect("x's gradient")),
                read(g.grad(&grads).expect("g's gradient")),
                read(gamma.grad(&grads).expect("γ's gradient")),
            ]
        };
        let (a, b) = (grads(ours(&x, &g, &gamma)), grads(twins(&x, &g, &gamma)));
        // dγ sums 800 rows: (d + 800 + 8)·u; the others (d + 8)·u and the gate's 4e-7.
        let u = F32_UNIT_ROUNDOFF;
        let bounds = [
            2.0 * (32.0 * u + 4e-7),
            2.0 * (8.0 * u + 4e-7),
            2.0 * (832.0 * u + 4e-7),
        ];
        for (name, ((a, b), bound)) in ["dx", "dg", "dγ"].iter().zip(a.iter().zip(&b).zip(bounds))
        {
            let got = deviation(a, b);
            assert!(got.within(bound), "{name}: {got}");
        }
    }
}
