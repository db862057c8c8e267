//! Parameter replicas: gradients as one flat tensor on the device in module order (one all-reduce
//! carries them all), parameters as one host vector, the replica checksum, and global-norm clipping.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};

/// Collects every trained float parameter's gradient, in module order, as a 1-d tensor on its
/// device (zeros where a parameter got none), to be joined into one flat gradient. A frozen
/// parameter (one that requires no gradient: a LoRA run's base weights) has no place in it.
struct Flatten<'a, I: Backend> {
    grads: &'a mut GradientsParams,
    parts: Vec<Tensor<I, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !param.val().is_require_grad() {
            return;
        }
        let n = param.val().shape().num_elements();
        let grad = match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(g) => g,
            None => param.val().inner().zeros_like(),
        };
        self.parts.push(grad.reshape([n]));
    }
}

/// Every trained parameter's gradient in `grads`, in module order, joined on the device into one
/// 1-d tensor (zeros where a parameter got none; frozen parameters left out), so that one
/// all-reduce carries them all.
pub(crate) fn flat_gradient<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &mut GradientsParams,
) -> Tensor<B::InnerBackend, 1> {
    let mut flatten = Flatten {
        grads,
        parts: Vec::new(),
    };
    module.visit(&mut flatten);
    if flatten.parts.is_empty() {
        return Tensor::zeros([0], &Default::default());
    }
    Tensor::cat(flatten.parts, 0)
}

/// Whether every value of `flat` is finite, asked on its device (one value read back).
pub(crate) fn all_finite<B: Backend>(flat: &Tensor<B, 1>) -> bool {
    flat.clone()
        .is_finite()
        .all()
        .int()
        .into_scalar()
        .elem::<i64>()
        == 1
}

/// Inverse of [`flat_gradient`]: registers slices of the reduced tensor as the parameters'
/// gradients (views on its device, nothing copied).
struct Unflatten<I: Backend> {
    flat: Tensor<I, 1>,
    offset: usize,
    grads: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !param.val().is_require_grad() {
            return;
        }
        let shape = param.val().shape();
        let n = shape.num_elements();
        let grad = self.flat.clone().narrow(0, self.offset, n).reshape(shape);
        self.offset += n;
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}

/// The parameters' gradients as slices of `flat` (module order, as [`flat_gradient`] joins them).
pub(crate) fn unflatten_gradient<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    flat: Tensor<B::InnerBackend, 1>,
) -> GradientsParams {
    let mut unflatten = Unflatten {
        flat,
        offset: 0,
        grads: GradientsParams::new(),
    };
    module.visit(&mut unflatten);
    unflatten.grads
}

/// Every parameter value, in module order.
pub fn flat_params<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.extend(crate::host::via_data(param.val()));
        }
    }
    let mut c = Collect(Vec::new());
    module.visit(&mut c);
    c.0
}

/// `module` with its parameters replaced by `flat` (module order, as [`flat_params`] gives them).
pub fn with_flat_params<B: Backend, M: Module<B>>(module: M, flat: &[f32]) -> M {
    struct Replace<'a> {
        flat: &'a [f32],
        offset: usize,
    }
    impl<B: Backend> burn::module::ModuleMapper<B> for Replace<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let shape = tensor.shape();
            let n = shape.num_elements();
            let values = self.flat[self.offset..self.offset + n].to_vec();
            self.offset += n;
            let device = tensor.device();
            let mut replaced = Tensor::from_data(TensorData::new(values, shape), &device);
            if tensor.is_require_grad() {
                replaced = replaced.require_grad();
            }
            Param::from_mapped_value(id, replaced, mapper)
        }
    }
    module.map(&mut Replace { flat, offset: 0 })
}

/// A 64-bit FNV-1a hash of the parameters' bits, as four exact 16-bit pieces.
pub(crate) fn checksum<B: Backend, M: Module<B>>(module: &M) -> [f32; 4] {
    let hash = flat_params::<B, M>(module)
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
        });
    std::array::from_fn(|i| ((hash >> (16 * i)) & 0xffff) as f32)
}

/// What a gradient's global L2 norm is made of, computed on its device without overflow: its largest
/// magnitude `m` and the sum of squares of `flat / m` (at least 1 unless `flat` is all zeros); the
/// norm is `m · √s` ([`clip_to_norm`] takes it in f64). A gradient of 1e20s, whose squares overflow
/// f32, still gets its norm.
pub(crate) fn norm_pieces<B: Backend>(flat: &Tensor<B, 1>) -> [f32; 2] {
    if flat.dims()[0] == 0 {
        return [0.0, 0.0];
    }
    let largest = flat.clone().abs().max().into_scalar().elem::<f32>();
    if largest == 0.0 || !largest.is_finite() {
        return [largest, 0.0];
    }
    let scaled = flat.clone().div_scalar(largest);
    let squares = scaled.clone().mul(scaled).sum().into_scalar().elem::<f32>();
    [largest, squares]
}

/// `flat` scaled so that its global L2 norm, `m · √s` from `pieces` ([`norm_pieces`]), is at most
/// `max_norm`; unchanged when it already is.
///
/// Every rank must pass the same pieces (rank 0's: a reduction on the device may sum in a different
/// order on each run), so that every replica applies the same scale and they do not drift apart.
pub(crate) fn clip_to_norm<B: Backend>(
    flat: Tensor<B, 1>,
    pieces: [f32; 2],
    max_norm: f32,
) -> Tensor<B, 1> {
    let norm = f64::from(pieces[0]) * f64::from(pieces[1]).sqrt();
    if norm > f64::from(max_norm) {
        flat.mul_scalar((f64::from(max_norm) / norm) as f32)
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn tensor(values: &[f32]) -> Tensor<Flex, 1> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), [values.len()]),
            &Default::default(),
        )
    }

    fn values(t: Tensor<Flex, 1>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    /// NaN, +inf and -inf anywhere are found, and a finite tensor passes, on `B`'s device.
    fn finiteness_is_found_on<B: Backend>(device: &B::Device) {
        let at = |i: usize, x: f32| {
            let mut v = vec![1.5f32; 37];
            v[i] = x;
            Tensor::<B, 1>::from_data(TensorData::new(v, [37]), device)
        };
        assert!(all_finite(&at(0, f32::MAX)));
        for (i, bad) in [(0, f32::NAN), (36, f32::INFINITY), (17, f32::NEG_INFINITY)] {
            assert!(!all_finite(&at(i, bad)), "{bad} at {i}");
        }
    }

    #[test]
    fn a_non_finite_gradient_is_found() {
        finiteness_is_found_on::<Flex>(&Default::default());
    }

    /// WGSL may assume that no value is NaN or infinite; the check must still see them there.
    #[cfg(feature = "wgpu")]
    #[test]
    fn a_non_finite_gradient_is_found_on_wgpu() {
        finiteness_is_found_on::<crate::backends::Wgpu>(&Default::default());
    }

    /// A gradient whose squares overflow f32 is clipped to the norm asked for (a plain f32 sum of
    /// squares would read an infinite norm and zero it); one under the norm is left as it is.
    #[test]
    fn clipping_scales_to_the_norm_without_overflow_and_leaves_small_gradients() {
        let huge = tensor(&[3e30, -4e30, 0.0]);
        let pieces = norm_pieces(&huge);
        assert_eq!(pieces[0], 4e30);
        let clipped = values(clip_to_norm(huge, pieces, 1.0));
        let want = [0.6, -0.8, 0.0];
        // One division, one square root and one multiplication each, in f32 and f64: a few units
        // of f32 roundoff.
        for (got, want) in clipped.iter().zip(want) {
            assert!((got - want).abs() <= 4.0 * f32::EPSILON, "{clipped:?}");
        }
        let small = tensor(&[0.3, 0.4]);
        let pieces = norm_pieces(&small);
        assert_eq!(values(clip_to_norm(small, pieces, 1.0)), [0.3, 0.4]);
        let zeros = tensor(&[0.0, 0.0]);
        assert_eq!(norm_pieces(&zeros), [0.0, 0.0]);
        assert_eq!(norm_pieces(&tensor(&[])), [0.0, 0.0]);
    }
}
