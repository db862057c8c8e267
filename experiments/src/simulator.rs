//! The discrete-event model of one ring pass lives with the layouts it times
//! ([`strategies::ring_time`]): one definition for the experiments that report it and the `balanced`
//! strategy that minimizes it.

pub use strategies::ring_time::{Simulation, simulate};
