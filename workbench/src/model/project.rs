//! The `[b, t, n] · [n, m]` projection a layer's linear maps are, and the backends' product behind
//! it ([`ProjectBackend`]).

use crate::host::{cpu_tensor, cpu_values, zeros_in_parallel};
use crate::primitive::{unwrap, wrap};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// `[b, t, n]` as `[b · t, n]`.
pub(crate) fn flat<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 2> {
    let [b, t, n] = x.dims();
    x.reshape([b * t, n])
}

/// `x: [b, t, n] · w: [n, m]` by the backend's product ([`ProjectBackend`]).
pub(crate) fn project<B: ProjectBackend>(x: Tensor<B, 3>, w: &Tensor<B, 2>) -> Tensor<B, 3> {
    let [b, t, n] = x.dims();
    let y = wrap::<B, 2>(B::project_matmul(
        unwrap(x.reshape([b * t, n])),
        unwrap(w.clone()),
    ));
    y.reshape([b, t, w.dims()[1]])
}

/// Backends that multiply a layer's activations by a weight. The default is Burn's matmul (what a
/// device backend and autodiff run). The CPU backend's own writes the product into a buffer that
/// its rayon tasks zero (Burn's CPU matmul zeroes a fresh buffer and then copies it into an aligned
/// one on the calling thread: two serial passes over every output while the other cores wait).
pub trait ProjectBackend: Backend {
    /// `x: [n, k] · w: [k, m]`, `[n, m]`.
    fn project_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        unwrap(wrap::<Self, 2>(x).matmul(wrap::<Self, 2>(w)))
    }
}

/// Products at least this many multiply-adds run on rayon's pool (Burn's CPU matmul's threshold).
const PARALLEL_PRODUCT: usize = 192 * 192 * 192;

impl ProjectBackend for burn::backend::Flex {
    fn project_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = |t: &FloatTensor<Self>| -> [usize; 2] {
            t.layout()
                .shape()
                .to_vec()
                .try_into()
                .expect("a 2-d matrix")
        };
        let ([n, k], [k_w, m]) = (shape(&x), shape(&w));
        assert_eq!(k, k_w, "project: [{n}, {k}] · [{k_w}, {m}]");
        let x = cpu_values(&x);
        // The weight as stored (a transposed view too): its strides go to gemm as they are.
        let layout = w.layout();
        let [w_rs, w_cs] =
            <[isize; 2]>::try_from(layout.strides()).expect("a 2-d matrix's strides");
        let storage = w.storage::<f32>();
        let w_first = layout.start_offset();
        let last = w_first as isize + (k as isize - 1) * w_rs + (m as isize - 1) * w_cs;
        assert!(
            n == 0
                || k == 0
                || m == 0
                || (w_rs >= 0 && w_cs >= 0 && (last as usize) < storage.len()),
            "project: the weight's strides reach outside its buffer"
        );
        let mut out = zeros_in_parallel(n * m);
        if n > 0 && k > 0 && m > 0 {
            let parallelism = if n * m * k >= PARALLEL_PRODUCT {
                gemm::Parallelism::Rayon(0)
            } else {
                gemm::Parallelism::None
            };
            // SAFETY: `x` holds n·k row-major values, the assert above keeps every index the
            // weight's strides reach inside its buffer, and `out` (n·m, row-major) is ours alone.
            unsafe {
                gemm::gemm(
                    n,
                    m,
                    k,
                    out.as_mut_ptr(),
                    1,
                    m as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    storage.as_ptr().add(w_first),
                    w_cs,
                    w_rs,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
        }
        cpu_tensor(out, &[n, m])
    }
}

#[cfg(feature = "cuda")]
impl ProjectBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl ProjectBackend for crate::backends::Wgpu {}

/// Autodiff runs Burn's matmul, which records the product's backward.
impl<B: ProjectBackend, C: CheckpointStrategy> ProjectBackend for Autodiff<B, C> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::read;
    use burn::backend::Flex;
    use burn::tensor::Distribution;
    use ringbench_tests::F32_UNIT_ROUNDOFF;

    /// The CPU product against a float64 one, on a contiguous weight and a transposed view, on
    /// rayon's pool and off it: within k·u of `|x|·|w|` (k f32 additions, each product exact to u).
    #[test]
    fn the_cpu_product_is_the_float64_product_to_k_roundoffs() {
        let device = Default::default();
        for (n, k, m) in [(5, 7, 3), (200, 190, 210)] {
            let (x, w) = crate::model::lazy::seeded::<Flex, _>(31, &device, || {
                let x =
                    Tensor::<Flex, 2>::random([n, k], Distribution::Uniform(-2.0, 2.0), &device);
                let w =
                    Tensor::<Flex, 2>::random([m, k], Distribution::Uniform(-1.0, 1.0), &device);
                (x, w)
            });
            let (xs, ws) = (read(x.clone()), read(w.clone()));
            // The weight as [k, m]: a transposed view of [m, k], then a contiguous copy of it.
            let views = [
                w.clone().transpose(),
                Tensor::from_data(w.transpose().to_data(), &device),
            ];
            for view in views {
                let y = read(wrap::<Flex, 2>(Flex::project_matmul(
                    unwrap(x.clone()),
                    unwrap(view),
                )));
                assert_eq!(y.len(), n * m);
                for (i, &got) in y.iter().enumerate() {
                    let (r, c) = (i / m, i % m);
                    let terms =
                        (0..k).map(|j| (f64::from(xs[r * k + j]), f64::from(ws[c * k + j])));
                    let (exact, size) =
                        terms.fold((0.0, 0.0), |(e, s), (a, b)| (e + a * b, s + (a * b).abs()));
                    let err = (f64::from(got) - exact).abs();
                    let bound = k as f64 * F32_UNIT_ROUNDOFF * size;
                    assert!(
                        err <= bound,
                        "[{n}, {k}, {m}] element {i}: {got} against {exact}: {err:e} > {bound:e}"
                    );
                }
            }
        }
    }
}
