//! Measurement on this machine, shared by the measured kinds and `bench`: baselines, timed ring
//! passes (each after a warm-up run), the float64 check, training steps of a small model and one
//! layer's forward alone, and what machine it all ran on.

pub mod baseline;
pub mod exactness;
pub mod layer;
pub mod machine;
pub mod ring;
pub mod timing;
pub mod training;
