//! What ring attention is checked against, in the product and in the tests alike: an independent
//! float64 reference of attention and its gradients, the workspace's one NaN-aware comparison, and
//! the bounds f32 and bf16 arithmetic may not exceed.

pub mod attention;
pub mod bf16;
pub mod bounds;
pub mod compare;
pub mod inputs;

pub use attention::{
    Inputs, Reference, Variant, deviations, reference, reference_packed, reference_variant,
};
