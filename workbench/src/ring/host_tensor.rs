//! A dense f32 array in the caller's layout: what one-call jobs take and return (NumPy's and
//! PyTorch's row-major arrays).

use crate::error::RingError;

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
