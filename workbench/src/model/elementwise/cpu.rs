//! The layer's elementwise steps on the CPU backend: each one pass over host memory, rows in
//! parallel on rayon's pool (one task on the calling thread when the input is small, as a decode
//! step's is), the row loops vectorized for the CPU found at run time.

use super::ElementwiseBackend;
use crate::host::{CPU_TASK_ELEMENTS, cpu_tensor, cpu_values};
use crate::kernels::exp::fast_exp;
use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

/// Independent accumulators of a row's sums, so that the loop vectorizes without reassociating one
/// chain.
const LANES: usize = 16;

crate::simd_fn! {
    /// `Σ x²` of a row.
    fn sum_of_squares(x: &[f32]) -> f32 {
        let mut lanes = [0.0f32; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (acc, x) in lanes.iter_mut().zip(chunk) {
                *acc += x * x;
            }
        }
        lanes.iter().sum::<f32>() + chunks.remainder().iter().map(|x| x * x).sum::<f32>()
    }
}

crate::simd_fn! {
    /// `Σ a ∘ b` of two rows.
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut lanes = [0.0f32; LANES];
        let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        for (x, y) in (&mut ca).zip(&mut cb) {
            for ((acc, x), y) in lanes.iter_mut().zip(x).zip(y) {
                *acc += x * y;
            }
        }
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        lanes.iter().sum::<f32>() + tail
    }
}

crate::simd_fn! {
    /// One row of RMSNorm: `y = x·r ∘ γ`, returning r.
    fn norm_row(x: &[f32], gamma: &[f32], eps: f32, y: &mut [f32]) -> f32 {
        let r = 1.0 / (sum_of_squares(x) / x.len() as f32 + eps).sqrt();
        for ((y, &x), &g) in y.iter_mut().zip(x).zip(gamma) {
            *y = x * r * g;
        }
        r
    }
}

crate::simd_fn! {
    /// One row of RMSNorm's backward: `dx = r·g − r³·x·mean(g ∘ x)` with `g = dy ∘ γ`; `dγ += dy ∘ x·r`.
    fn norm_backward_row(
        inputs: (&[f32], &[f32], &[f32]),
        r: f32,
        dx: &mut [f32],
        d_gamma: &mut [f32],
    ) {
        let (x, dy, gamma) = inputs;
        for ((dx, &dy), &g) in dx.iter_mut().zip(dy).zip(gamma) {
            *dx = dy * g;
        }
        let mean_gx = dot(dx, x) / x.len() as f32;
        let r3 = r * r * r;
        for (dx, &x) in dx.iter_mut().zip(x) {
            *dx = *dx * r - x * r3 * mean_gx;
        }
        for ((acc, &dy), &x) in d_gamma.iter_mut().zip(dy).zip(x) {
            *acc += dy * x * r;
        }
    }
}

crate::simd_fn! {
    /// `m = silu(a) ∘ g` elementwise.
    fn swiglu_span(a: &[f32], g: &[f32], m: &mut [f32]) {
        for ((m, &a), &g) in m.iter_mut().zip(a).zip(g) {
            *m = a / (1.0 + fast_exp(-a)) * g;
        }
    }
}

crate::simd_fn! {
    /// The gate's backward elementwise: `da`, `dg` and `m` of `dm` at `a`, `g`.
    fn swiglu_backward_span(
        inputs: (&[f32], &[f32], &[f32]),
        da: &mut [f32],
        dg: &mut [f32],
        m: &mut [f32],
    ) {
        let (a, g, dm) = inputs;
        for i in 0..a.len() {
            let sig = 1.0 / (1.0 + fast_exp(-a[i]));
            let act = a[i] * sig;
            m[i] = act * g[i];
            da[i] = dm[i] * g[i] * (sig * (a[i] * (1.0 - sig) + 1.0));
            dg[i] = dm[i] * act;
        }
    }
}

/// Runs `f` on each task's slice of `rows` rows of `width` (the zipped outputs), in parallel when the
/// input is large enough to pay for it.
fn for_rows<T: Send>(tasks: Vec<T>, elements: usize, f: impl Fn(usize, T) + Sync + Send) {
    if elements <= CPU_TASK_ELEMENTS {
        tasks.into_iter().enumerate().for_each(|(i, t)| f(i, t));
    } else {
        tasks.into_par_iter().enumerate().for_each(|(i, t)| f(i, t));
    }
}

/// Rows per task for rows of `width`.
fn rows_per_task(width: usize) -> usize {
    (CPU_TASK_ELEMENTS / width.max(1)).max(1)
}

/// A CPU tensor's shape.
fn shape_of(x: &FlexTensor) -> Vec<usize> {
    x.layout().shape().to_vec()
}

impl ElementwiseBackend for burn::backend::Flex {
    fn rms_norm(x: FlexTensor, gamma: FlexTensor, eps: f64) -> (FlexTensor, FlexTensor) {
        let shape = shape_of(&x);
        let d = *shape.last().expect("RMSNorm of a [b, t, d] tensor");
        let (values, gamma) = (cpu_values(&x), cpu_values(&gamma));
        let rows = values.len() / d.max(1);
        let mut y = vec![0.0f32; values.len()];
        let mut r = vec![0.0f32; rows];
        let per = rows_per_task(d);
        let tasks: Vec<_> = y.chunks_mut(per * d).zip(r.chunks_mut(per)).collect();
        for_rows(tasks, values.len(), |task, (y, r)| {
            let x = &values[task * per * d..];
            for ((y, r), x) in y.chunks_mut(d).zip(r.iter_mut()).zip(x.chunks(d)) {
                *r = norm_row(x, &gamma, eps as f32, y);
            }
        });
        let mut r_shape = shape.clone();
        *r_shape.last_mut().expect("non-empty above") = 1;
        (cpu_tensor(y, &shape), cpu_tensor(r, &r_shape))
    }

    fn rms_norm_backward(
        x: FlexTensor,
        r: FlexTensor,
        gamma: FlexTensor,
        dy: FlexTensor,
    ) -> (FlexTensor, FlexTensor) {
        let shape = shape_of(&x);
        let d = *shape.last().expect("RMSNorm of a [b, t, d] tensor");
        let (x, r, gamma, dy) = (
            cpu_values(&x),
            cpu_values(&r),
            cpu_values(&gamma),
            cpu_values(&dy),
        );
        let mut dx = vec![0.0f32; x.len()];
        let per = rows_per_task(d);
        // Each task sums its rows' dγ; the tasks' sums are added in task order (a fixed order: the
        // same bits on any number of threads).
        let mut partial = vec![vec![0.0f32; d]; dx.len().div_ceil(per * d)];
        let tasks: Vec<_> = dx.chunks_mut(per * d).zip(partial.iter_mut()).collect();
        for_rows(tasks, x.len(), |task, (dx, d_gamma)| {
            let first = task * per;
            for (i, dx) in dx.chunks_mut(d).enumerate() {
                let row = first + i;
                let span = row * d..(row + 1) * d;
                let operands = (&x[span.clone()], &dy[span], &gamma[..]);
                norm_backward_row(operands, r[row], dx, d_gamma);
            }
        });
        let mut d_gamma = vec![0.0f32; d];
        for part in &partial {
            for (acc, p) in d_gamma.iter_mut().zip(part) {
                *acc += p;
            }
        }
        (cpu_tensor(dx, &shape), cpu_tensor(d_gamma, &[d]))
    }

    fn swiglu(a: FlexTensor, g: FlexTensor) -> FlexTensor {
        let shape = shape_of(&a);
        let (a, g) = (cpu_values(&a), cpu_values(&g));
        let mut m = vec![0.0f32; a.len()];
        let tasks: Vec<_> = m.chunks_mut(CPU_TASK_ELEMENTS).collect();
        for_rows(tasks, a.len(), |task, m| {
            let at = task * CPU_TASK_ELEMENTS;
            let span = at..at + m.len();
            swiglu_span(&a[span.clone()], &g[span], m);
        });
        cpu_tensor(m, &shape)
    }

    fn swiglu_backward(a: FlexTensor, g: FlexTensor, dm: FlexTensor) -> [FlexTensor; 3] {
        let shape = shape_of(&a);
        let (a, g, dm) = (cpu_values(&a), cpu_values(&g), cpu_values(&dm));
        let n = a.len();
        let (mut da, mut dg, mut m) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        let tasks: Vec<_> = da
            .chunks_mut(CPU_TASK_ELEMENTS)
            .zip(dg.chunks_mut(CPU_TASK_ELEMENTS))
            .zip(m.chunks_mut(CPU_TASK_ELEMENTS))
            .collect();
        for_rows(tasks, n, |task, ((da, dg), m)| {
            let at = task * CPU_TASK_ELEMENTS;
            let span = at..at + m.len();
            let operands = (&a[span.clone()], &g[span.clone()], &dm[span]);
            swiglu_backward_span(operands, da, dg, m);
        });
        [da, dg, m].map(|values| cpu_tensor(values, &shape))
    }

    fn heads_first(x: FlexTensor, heads: usize) -> FlexTensor {
        let [b, t, width] = <[usize; 3]>::try_from(shape_of(&x)).expect("a [b, t, n] tensor");
        let view = x
            .reshape([b, t, heads, width / heads].into())
            .transpose(1, 2);
        cpu_tensor(
            cpu_values(&view).into_owned(),
            &[b, heads, t, width / heads],
        )
    }

    fn heads_last(x: FlexTensor) -> FlexTensor {
        let [b, heads, t, hd] =
            <[usize; 4]>::try_from(shape_of(&x)).expect("a [b, h, t, d] tensor");
        let view = x.transpose(1, 2);
        cpu_tensor(cpu_values(&view).into_owned(), &[b, t, heads * hd])
    }
}
