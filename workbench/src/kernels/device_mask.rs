//! The generic kernel's masks, built on the device: a shard's query windows and key positions are
//! placed once per ring pass, and each tile's additive mask is computed from them there, so a ring
//! step moves nothing between host and device.
//!
//! Positions travel as f32, exact below 2^24 (16.7M tokens); [`DeviceShard::new`] refuses longer.

use super::mask::Window;
use crate::error::RingError;
use crate::host;
use burn::tensor::{Tensor, backend::Backend};

/// Largest position an f32 holds exactly.
const EXACT_F32: usize = 1 << 24;

/// One shard on the device: its queries' windows' first and last visible key `[t]`, and its keys'
/// positions `[t]`.
#[derive(Debug, Clone)]
pub struct DeviceShard<B: Backend> {
    lo: Tensor<B, 1>,
    hi: Tensor<B, 1>,
    positions: Tensor<B, 1>,
}

impl<B: Backend> DeviceShard<B> {
    /// Places the shard's windows and positions on `device`.
    pub fn new(
        windows: &[Window],
        positions: &[usize],
        device: &B::Device,
    ) -> Result<Self, RingError> {
        if let Some(&position) = positions.iter().find(|&&p| p >= EXACT_F32) {
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
            lo: place(windows.iter().map(|w| w.lo as f32).collect()),
            hi: place(windows.iter().map(|w| w.hi as f32).collect()),
            positions: place(positions.iter().map(|&p| p as f32).collect()),
        })
    }

    /// Each query's first visible key position `[t]`.
    pub(super) fn lo(&self) -> &Tensor<B, 1> {
        &self.lo
    }

    /// Each query's last visible key position `[t]`.
    pub(super) fn hi(&self) -> &Tensor<B, 1> {
        &self.hi
    }

    /// Each key's position `[t]`.
    pub(super) fn positions(&self) -> &Tensor<B, 1> {
        &self.positions
    }

    /// The device the shard lies on.
    pub fn device(&self) -> B::Device {
        self.lo.device()
    }

    /// The additive mask `[tq, tk]` of this shard's queries against `keys`' keys: 0 where the key is
    /// inside the query's window, −∞ elsewhere.
    pub fn bias(&self, keys: &DeviceShard<B>) -> Tensor<B, 2> {
        let (tq, tk) = (self.lo.dims()[0], keys.positions.dims()[0]);
        let positions = keys
            .positions
            .clone()
            .unsqueeze_dim::<2>(0)
            .expand([tq, tk]);
        let lo = self.lo.clone().unsqueeze_dim::<2>(1).expand([tq, tk]);
        let hi = self.hi.clone().unsqueeze_dim::<2>(1).expand([tq, tk]);
        let hidden = positions.clone().lower(lo).bool_or(positions.greater(hi));
        Tensor::zeros([tq, tk], &self.lo.device()).mask_fill(hidden, f32::NEG_INFINITY)
    }
}
