//! Parameter replicas: gradients and parameters as one flat vector in module order (one all-reduce
//! carries them all), the replica checksum, and global-norm clipping.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

/// Collects every float parameter's gradient, in module order, into one flat vector (zeros where a
/// parameter got none), so that one all-reduce carries them all.
pub(crate) struct Flatten<'a> {
    pub(crate) grads: &'a mut GradientsParams,
    pub(crate) flat: Vec<f32>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(g) => self.flat.extend(crate::host::via_data(g)),
            None => self
                .flat
                .extend(std::iter::repeat_n(0.0, param.val().shape().num_elements())),
        }
    }
}

/// Inverse of [`Flatten`]: registers slices of the reduced vector as the parameters' gradients.
pub(crate) struct Unflatten<'a> {
    pub(crate) flat: &'a [f32],
    pub(crate) offset: usize,
    pub(crate) grads: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape = param.val().shape();
        let n = shape.num_elements();
        let data = self.flat[self.offset..self.offset + n].to_vec();
        self.offset += n;
        let device = param.val().device();
        let grad = Tensor::<B::InnerBackend, D>::from_data(TensorData::new(data, shape), &device);
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
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

/// Scales the gradient so that its global L2 norm is at most `max_norm`.
///
/// Computed sequentially on the reduced vector, so that every rank gets the same bits (a parallel
/// reduction could sum in a different order on each rank and let the replicas drift apart).
pub(crate) fn clip_global_norm(flat: &mut [f32], max_norm: f32) {
    let norm = flat
        .iter()
        .map(|&g| f64::from(g) * f64::from(g))
        .sum::<f64>()
        .sqrt();
    if norm > f64::from(max_norm) {
        let scale = (f64::from(max_norm) / norm) as f32;
        flat.iter_mut().for_each(|g| *g *= scale);
    }
}
