//! Rotary position embedding (RoPE) on each token's *global* position, so that a rank's shard,
//! whatever positions its strategy gave it, rotates as the whole sequence would; its frequencies
//! (and their scaling) are [`crate::model::rope_scaling`]'s.

use crate::host::{CPU_TASK_ELEMENTS, cpu_tensor, cpu_values, cpu_vec};
use crate::model::rope_scaling::RopeFrequencies;
use crate::primitive::{unwrap, wrap};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData, backend::Backend};
use rayon::prelude::*;

/// cos and sin of RoPE angles for each token's global position, times the scaling's attention
/// factor: `[1, 1, t, head_dim / 2]` each.
#[derive(Debug, Clone)]
pub(crate) struct Rope<B: Backend> {
    pub(crate) cos: Tensor<B, 4>,
    pub(crate) sin: Tensor<B, 4>,
}

impl<B: Backend> Rope<B> {
    /// The tables of `positions` for a forward whose sequence is `seq_len` long (its largest
    /// position + 1: what dynamic NTK scaling reads).
    pub(crate) fn new(
        positions: &[usize],
        head_dim: usize,
        (frequencies, seq_len): (RopeFrequencies, usize),
        device: &B::Device,
    ) -> Self {
        let half = head_dim / 2;
        let (inverse, factor) = frequencies.inverse_frequencies(head_dim, seq_len);
        // A prefill's tables are a few hundred thousand f64 cos and sin: positions in parallel
        // (each entry's arithmetic is the same whatever the split).
        let (mut cos, mut sin) = (
            vec![0.0f32; positions.len() * half],
            vec![0.0f32; positions.len() * half],
        );
        let per = (CPU_TASK_ELEMENTS / half.max(1)).max(1);
        let fill = |((cos, sin), positions): ((&mut [f32], &mut [f32]), &[usize])| {
            let rows = cos.chunks_mut(half).zip(sin.chunks_mut(half));
            for ((cos, sin), &p) in rows.zip(positions) {
                for ((c, s), w) in cos.iter_mut().zip(sin.iter_mut()).zip(&inverse) {
                    let angle = p as f64 * w;
                    *c = (factor * angle.cos()) as f32;
                    *s = (factor * angle.sin()) as f32;
                }
            }
        };
        let tasks = cos
            .chunks_mut(per * half)
            .zip(sin.chunks_mut(per * half))
            .zip(positions.chunks(per));
        if positions.len() <= per {
            tasks.for_each(fill);
        } else {
            tasks.collect::<Vec<_>>().into_par_iter().for_each(fill);
        }
        let table = |data: Vec<f32>| {
            Tensor::from_data(TensorData::new(data, [1, 1, positions.len(), half]), device)
        };
        Rope {
            cos: table(cos),
            sin: table(sin),
        }
    }

    /// Rotates pairs `(x[i], x[i + d/2])` of `[b, h, t, d]` by the angles (`inverse`: by minus them),
    /// as the backend does it ([`RopeBackend`]).
    pub(crate) fn rotate(&self, x: Tensor<B, 4>, inverse: bool) -> Tensor<B, 4>
    where
        B: RopeBackend,
    {
        wrap(B::rope_rotate(
            unwrap(x),
            unwrap(self.cos.clone()),
            unwrap(self.sin.clone()),
            inverse,
        ))
    }
}

/// The rotation with Burn tensor ops, the reference twin of every backend's own: `[b, h, t, d]` by
/// `cos`, `sin` `[1, 1, t, d / 2]`: `(x1·cos − x2·sin, x1·sin + x2·cos)` of the halves `x1`, `x2`,
/// `sin` negated for the inverse.
pub(crate) fn rotate_generic<B: Backend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    inverse: bool,
) -> Tensor<B, 4> {
    let [b, h, t, d] = x.dims();
    let sin = if inverse { sin.neg() } else { sin };
    let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..d / 2]);
    let x2 = x.slice([0..b, 0..h, 0..t, d / 2..d]);
    Tensor::cat(
        vec![
            x1.clone() * cos.clone() - x2.clone() * sin.clone(),
            x1 * sin + x2 * cos,
        ],
        3,
    )
}

/// Backends that rotate by RoPE. The default method is [`rotate_generic`] (what a device backend
/// and autodiff's inner backend run); the CPU backend rotates in one pass over host memory, the
/// same arithmetic in the same order (so the same bits), instead of ten strided tensor ops; the
/// autodiff backend registers the rotation by minus the angles as the backward.
pub trait RopeBackend: Backend {
    /// `x: [b, h, t, d]` rotated by `cos`, `sin` `[1, 1, t, d / 2]` (`inverse`: by minus the
    /// angles), contiguous.
    fn rope_rotate(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        inverse: bool,
    ) -> FloatTensor<Self> {
        unwrap(rotate_generic::<Self>(
            wrap(x),
            wrap(cos),
            wrap(sin),
            inverse,
        ))
    }
}

impl RopeBackend for burn::backend::Flex {
    fn rope_rotate(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        inverse: bool,
    ) -> FloatTensor<Self> {
        let shape = x.layout().shape().to_vec();
        let [_, _, t, d] = <[usize; 4]>::try_from(shape.clone()).expect("a [b, h, t, d] tensor");
        let half = d / 2;
        // [b, h, t, d] in that order: the buffer itself when the tensor holds it alone, else one copy.
        let mut data = cpu_vec(x);
        let (cos, sin) = (cpu_values(&cos), cpu_values(&sin));
        let rotate = |row: usize, x: &mut [f32]| {
            let at = (row % t) * half;
            let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
            let (x1, x2) = x.split_at_mut(half);
            for i in 0..half {
                let s = if inverse { -sin[i] } else { sin[i] };
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * cos[i] - b * s;
                x2[i] = a * s + b * cos[i];
            }
        };
        let per = (CPU_TASK_ELEMENTS / d.max(1)).max(1);
        let task = |(i, rows): (usize, &mut [f32])| {
            for (j, x) in rows.chunks_exact_mut(d).enumerate() {
                rotate(i * per + j, x);
            }
        };
        if data.len() <= CPU_TASK_ELEMENTS {
            data.chunks_mut(per * d).enumerate().for_each(task);
        } else {
            data.par_chunks_mut(per * d).enumerate().for_each(task);
        }
        cpu_tensor(data, &shape)
    }
}

#[cfg(feature = "cuda")]
impl RopeBackend for crate::backends::Cuda {}

#[cfg(feature = "wgpu")]
impl RopeBackend for crate::backends::Wgpu {}

#[derive(Debug)]
struct RopeRotateBackward;

#[derive(Debug, Clone)]
struct RopeRotateState<B: Backend> {
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
    inverse: bool,
}

impl<B: RopeBackend> Backward<B, 1> for RopeRotateBackward {
    type State = RopeRotateState<B>;

    /// A rotation's gradient is the rotation by minus the angles.
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let RopeRotateState { cos, sin, inverse } = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::rope_rotate(dy, cos, sin, !inverse));
        }
    }
}

impl<B: RopeBackend, C: CheckpointStrategy> RopeBackend for Autodiff<B, C> {
    fn rope_rotate(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        inverse: bool,
    ) -> FloatTensor<Self> {
        // The tables are constants (made from data): only x carries a gradient.
        let (cos, sin) = (cos.primitive, sin.primitive);
        let out = B::rope_rotate(x.primitive, cos.clone(), sin.clone(), inverse);
        match RopeRotateBackward
            .prepare::<C>([x.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(RopeRotateState { cos, sin, inverse }, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::read;
    use burn::backend::Flex;
    use burn::tensor::Distribution;

    type Ad = Autodiff<Flex>;

    /// Tables of 5 positions for 8-wide heads, with the angles of a real RoPE.
    fn tables<B: Backend>(device: &B::Device) -> Rope<B> {
        let frequencies = RopeFrequencies::plain(10000.0);
        Rope::new(&[3, 0, 7, 1, 12], 8, (frequencies, 13), device)
    }

    /// The CPU's one-pass rotation gives the generic twin's bits, both ways, on a tensor whose heads
    /// were split off by a transpose (not contiguous).
    #[test]
    fn the_cpu_rotation_is_the_generic_twin_bit_for_bit() {
        let device = Default::default();
        let rope = tables::<Flex>(&device);
        let x = Tensor::<Flex, 4>::random([2, 5, 3, 8], Distribution::Uniform(-2.0, 2.0), &device)
            .swap_dims(1, 2);
        for inverse in [false, true] {
            let fused = read(rope.rotate(x.clone(), inverse));
            let generic = read(rotate_generic(
                x.clone(),
                rope.cos.clone(),
                rope.sin.clone(),
                inverse,
            ));
            assert_eq!(fused.len(), 2 * 3 * 5 * 8);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&generic), "inverse {inverse}");
        }
        // The inverse undoes the rotation (to rounding).
        let back = read(rope.rotate(rope.rotate(x.clone(), false), true));
        let d = crate::host::read(x);
        let worst = back
            .iter()
            .zip(&d)
            .map(|(a, b)| (a - b).abs())
            .fold(
                0.0f32,
                |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) },
            );
        assert!(worst < 1e-5, "{worst}");
    }

    /// Autodiff's gradient through the one-pass rotation equals the gradient through the generic
    /// twin's tensor ops.
    #[test]
    fn the_rotations_gradient_is_the_generic_twins() {
        let device = Default::default();
        let rope = tables::<Ad>(&device);
        let x = Tensor::<Ad, 4>::random([1, 5, 2, 8], Distribution::Uniform(-2.0, 2.0), &device)
            .swap_dims(1, 2)
            .require_grad();
        let weights =
            Tensor::<Ad, 4>::random([1, 2, 5, 8], Distribution::Uniform(-1.0, 1.0), &device);
        for inverse in [false, true] {
            let fused = (rope.rotate(x.clone(), inverse) * weights.clone()).sum();
            let generic = (rotate_generic(x.clone(), rope.cos.clone(), rope.sin.clone(), inverse)
                * weights.clone())
            .sum();
            let (gf, gg) = (fused.backward(), generic.backward());
            let (a, b) = (read(x.grad(&gf).unwrap()), read(x.grad(&gg).unwrap()));
            assert_eq!(a.len(), 80);
            let worst = a
                .iter()
                .zip(&b)
                .map(|(p, q)| (p - q).abs())
                .fold(
                    0.0f32,
                    |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) },
                );
            // Both rotate dy by minus the angles: the same products, summed in the same order.
            assert!(worst <= 1e-6, "inverse {inverse}: {worst}");
        }
    }
}
