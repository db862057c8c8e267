//! Inference with bf16 weights: every layer's seven projections and the output head packed once
//! (`Llama::with_bf16_weights`), each product's activations rounded to bf16 as it reads them, f32
//! accumulation (`kernels::bf16_matmul`: AVX512-BF16's `vdpbf16ps` where the CPU has it). The f32
//! weights stay the default and the reference, and stay in the model (training never reads the
//! packed copies); norms, RoPE, attention and the residual stream stay f32.
//!
//! Error: each operand rounded to bf16 is off by at most u = 2⁻⁸ of itself, so a product of two by
//! 2u + u² ≈ 2⁻⁷, and k f32 additions add about k·2⁻²⁴: `|C − A·B| ≤ (2⁻⁷ + k·2⁻²⁴)·(|A|·|B|)`
//! elementwise, to first order ([`bf16_product_bound`], which states it exactly).

use crate::kernels::bf16_matmul::{self, PackedBf16};
use crate::primitive::{unwrap, wrap};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData};

/// The relative error of a bf16 product of inner dimension `k` with f32 accumulation, as a
/// fraction of `|A|·|B|` (see the module's doc; derived in [`bf16_matmul::product_bound`]).
pub fn bf16_product_bound(k: usize) -> f64 {
    bf16_matmul::product_bound(k)
}

/// One layer's projections, packed: `[in, out]` as Burn's `Linear` holds them.
#[derive(Debug)]
pub struct Bf16Layer {
    pub(crate) wq: PackedBf16,
    pub(crate) wk: PackedBf16,
    pub(crate) wv: PackedBf16,
    pub(crate) wo: PackedBf16,
    pub(crate) w1: PackedBf16,
    pub(crate) w3: PackedBf16,
    pub(crate) w2: PackedBf16,
}

/// Backends that multiply by packed bf16 weights. The default is the reference twin in Burn ops:
/// the activations rounded to bf16 on the host, the weights unpacked (their bf16 values as f32), an
/// f32 matmul; the CPU backend runs the packed kernel.
pub trait Bf16Backend: Backend {
    /// `x: [n, k] · w` (`w: [k, m]`), `[n, m]`.
    fn matmul_bf16(x: FloatTensor<Self>, w: &PackedBf16) -> FloatTensor<Self> {
        let x = wrap::<Self, 2>(x);
        let device = x.device();
        let [n, k] = x.dims();
        let rounded: Vec<f32> = crate::host::via_data(x)
            .into_iter()
            .map(|v| half::bf16::from_f32(v).to_f32())
            .collect();
        let x = Tensor::<Self, 2>::from_data(TensorData::new(rounded, [n, k]), &device);
        let weights = Tensor::<Self, 2>::from_data(TensorData::new(w.unpack(), w.dims()), &device);
        unwrap(x.matmul(weights))
    }
}

impl Bf16Backend for burn::backend::Flex {
    fn matmul_bf16(x: FloatTensor<Self>, w: &PackedBf16) -> FloatTensor<Self> {
        let [n, _] = <[usize; 2]>::try_from(x.layout().shape().to_vec()).expect("a [n, k] matrix");
        let values = crate::host::cpu_values(&x);
        let out = bf16_matmul::matmul(&values, n, w);
        crate::host::cpu_tensor(out, &[n, w.dims()[1]])
    }
}

#[cfg(feature = "cuda")]
impl Bf16Backend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl Bf16Backend for crate::backends::Wgpu {}

/// Autodiff runs the twin: packed weights are for inference, and carry no gradient.
impl<B: Bf16Backend, C: CheckpointStrategy> Bf16Backend for Autodiff<B, C> {}

/// `x: [b, t, k] · w` in bf16.
pub(crate) fn project_bf16<B: Bf16Backend>(x: Tensor<B, 3>, w: &PackedBf16) -> Tensor<B, 3> {
    let [b, t, k] = x.dims();
    let y = wrap::<B, 2>(B::matmul_bf16(unwrap(x.reshape([b * t, k])), w));
    y.reshape([b, t, w.dims()[1]])
}

/// A host copy of a weight `[k, n]`, packed.
pub(crate) fn pack<B: Backend>(w: Tensor<B, 2>) -> PackedBf16 {
    let [k, n] = w.dims();
    PackedBf16::pack(&crate::host::via_data(w), k, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::read;
    use burn::backend::Flex;
    use burn::tensor::Distribution;
    use ringbench_tests::F32_UNIT_ROUNDOFF;

    /// The CPU kernel and the reference twin multiply the same bf16 values (each product exact in
    /// f32) and differ only in the order of k f32 additions: within 2·k·u of `|A|·|B|` of each other.
    #[test]
    fn the_cpu_kernel_is_its_twin_to_the_order_of_the_sums() {
        let device = Default::default();
        let (n, k, m) = (37, 70, 90);
        let (x, w) = crate::model::lazy::seeded::<Flex, _>(21, &device, || {
            let x = Tensor::<Flex, 2>::random([n, k], Distribution::Uniform(-2.0, 2.0), &device);
            let w = Tensor::<Flex, 2>::random([k, m], Distribution::Uniform(-1.0, 1.0), &device);
            (x, w)
        });
        let packed = pack(w.clone());
        let fast = read(wrap::<Flex, 2>(Flex::matmul_bf16(
            unwrap(x.clone()),
            &packed,
        )));
        type Twin = Autodiff<Flex>;
        let x_twin = unwrap(Tensor::<Twin, 2>::from_inner(x.clone()));
        let twin = read(wrap::<Twin, 2>(Twin::matmul_bf16(x_twin, &packed)));
        let size = read(x.abs().matmul(w.abs()));
        assert_eq!((fast.len(), twin.len(), size.len()), (n * m, n * m, n * m));
        for (i, ((a, b), s)) in fast.iter().zip(&twin).zip(&size).enumerate() {
            let err = f64::from((a - b).abs());
            let bound = 2.0 * k as f64 * F32_UNIT_ROUNDOFF * f64::from(*s);
            assert!(
                err <= bound,
                "element {i}: {a} against {b}: {err:e} > {bound:e}"
            );
        }
    }
}
