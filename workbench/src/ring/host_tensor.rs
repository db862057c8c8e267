//! A dense f32 array in the caller's layout: what one-call jobs take and return (NumPy's and
//! PyTorch's row-major arrays), and a rank's shard of one in the engine's head-major layout.

use crate::error::RingError;
use crate::ring::context::RingContext;

/// A dense f32 array in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// An array of `shape` holding `data`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }

    /// The first element that is NaN or infinite, as an error naming `what` and its index.
    pub fn check_finite(&self, what: &'static str) -> Result<(), RingError> {
        let Some(at) = self.data.iter().position(|x| !x.is_finite()) else {
            return Ok(());
        };
        let mut index = vec![0; self.shape.len()];
        let mut rest = at;
        for (i, &n) in self.shape.iter().enumerate().rev() {
            index[i] = rest % n;
            rest /= n;
        }
        Err(RingError::NonFinite {
            what,
            index,
            value: self.data[at],
        })
    }

    /// The shape as four dimensions, or an error naming `what` and the shape.
    pub(crate) fn dims4(&self, what: &'static str) -> Result<[usize; 4], RingError> {
        <[usize; 4]>::try_from(self.shape.as_slice()).map_err(|_| RingError::Rank {
            what,
            got: self.shape.clone(),
        })
    }
}

/// A rank's rows of global `[b, s, h, d]` as the engine's head-major `[b, h, t, d]`: the shard
/// ([`RingContext::shard_rows`], padding as zero rows) with its heads moved before its tokens on
/// the host (a strided Burn view would be made contiguous element by element inside the engine).
pub(crate) fn gather_rank(ctx: &RingContext, global: &[f32], [b, s, h, d]: [usize; 4]) -> Vec<f32> {
    debug_assert_eq!(global.len(), b * s * h * d);
    let rows = ctx.shard_rows(global, b, h * d);
    let t = rows.len() / (b * h * d).max(1);
    let mut local = Vec::with_capacity(rows.len());
    for i in 0..b {
        for j in 0..h {
            for p in 0..t {
                let at = ((i * t + p) * h + j) * d;
                local.extend_from_slice(&rows[at..at + d]);
            }
        }
    }
    local
}

/// Inverse of [`gather_rank`]: writes a rank's `[b, h, t, d]` into its rows of global `[b, s, h, d]`,
/// dropping the rows of padded positions.
pub(crate) fn scatter_rank(
    global: &mut [f32],
    [b, s, h, d]: [usize; 4],
    positions: &[usize],
    local: &[f32],
) {
    let mut rows = local.chunks_exact(d);
    for i in 0..b {
        for j in 0..h {
            for &p in positions {
                let row = rows.next().expect("a rank's output matches its positions");
                if p < s {
                    let at = ((i * s + p) * h + j) * d;
                    global[at..at + d].copy_from_slice(row);
                }
            }
        }
    }
}
