//! Measurement on this machine, shared by the measured kinds and `bench`: baselines, timed ring
//! passes, training steps of a small model.

pub mod baseline;
pub mod ring;
pub mod training;
