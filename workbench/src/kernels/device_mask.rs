//! The generic kernel's masks, built on the device: every rank's query windows and key positions are
//! placed once per ring pass, and each tile's additive mask is computed from them there, so a ring
//! step moves nothing between host and device.
//!
//! Positions travel as f32, exact below 2^24 (16.7M tokens); [`DeviceMasks::new`] refuses longer.

use super::mask::Window;
use crate::error::RingError;
use crate::host;
use burn::tensor::{Tensor, backend::Backend};

/// Largest position an f32 holds exactly.
const EXACT_F32: usize = 1 << 24;

/// Per rank: the windows' first and last visible key `[t]`, and the positions `[t]`.
#[derive(Debug, Clone)]
pub(crate) struct DeviceMasks<B: Backend> {
    lo: Vec<Tensor<B, 1>>,
    hi: Vec<Tensor<B, 1>>,
    positions: Vec<Tensor<B, 1>>,
}

impl<B: Backend> DeviceMasks<B> {
    /// Places every rank's windows and positions on `device` (rank r: `windows[r]`, `positions[r]`).
    pub fn new(
        windows: &[&[Window]],
        positions: &[&[usize]],
        device: &B::Device,
    ) -> Result<Self, RingError> {
        let longest = positions.iter().flat_map(|p| p.iter()).max().copied();
        if let Some(position) = longest.filter(|&p| p >= EXACT_F32) {
            return Err(RingError::TooLongForDeviceMasks {
                position,
                limit: EXACT_F32,
            });
        }
        let place = |values: Vec<f32>| {
            let len = values.len();
            host::place::<B, 1>(values, [len], device)
        };
        Ok(Self {
            lo: windows
                .iter()
                .map(|w| place(w.iter().map(|w| w.lo as f32).collect()))
                .collect(),
            hi: windows
                .iter()
                .map(|w| place(w.iter().map(|w| w.hi as f32).collect()))
                .collect(),
            positions: positions
                .iter()
                .map(|p| place(p.iter().map(|&p| p as f32).collect()))
                .collect(),
        })
    }

    /// The additive mask `[tq, tk]` of rank `q_rank`'s queries against rank `k_rank`'s keys: 0 where
    /// the key is inside the query's window, −∞ elsewhere.
    pub fn bias(&self, q_rank: usize, k_rank: usize) -> Tensor<B, 2> {
        let (lo, hi) = (&self.lo[q_rank], &self.hi[q_rank]);
        let keys = &self.positions[k_rank];
        let (tq, tk) = (lo.dims()[0], keys.dims()[0]);
        let keys = keys.clone().unsqueeze_dim::<2>(0).expand([tq, tk]);
        let lo = lo.clone().unsqueeze_dim::<2>(1).expand([tq, tk]);
        let hi = hi.clone().unsqueeze_dim::<2>(1).expand([tq, tk]);
        let hidden = keys.clone().lower(lo).bool_or(keys.greater(hi));
        Tensor::zeros([tq, tk], &self.lo[q_rank].device()).mask_fill(hidden, f32::NEG_INFINITY)
    }
}
