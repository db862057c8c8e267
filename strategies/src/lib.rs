//! Partition strategies for ring attention: which global token positions each rank owns.
//!
//! A strategy only decides ownership (Liu et al. 2023, §3; striped and zig-zag load balancing for the
//! causal case). Masks, RoPE angles and work counts are all derived from the positions returned here,
//! so any strategy is correct by construction.

#![warn(missing_docs)]

mod balanced;
mod contiguous;
mod doc_zigzag;
mod error;
mod partition;
mod registry;
pub mod ring_time;
mod striped;
mod visibility;
mod work;
mod zigzag;

pub use balanced::Balanced;
pub use contiguous::Contiguous;
pub use doc_zigzag::DocZigZag;
pub use error::PartitionError;
pub use partition::{
    Layout, MaskedLayers, Partition, RingCosts, Workload, check_ranks, padded_grid_len, padded_len,
};
pub use registry::{by_name, names, register};
pub use striped::Striped;
pub use visibility::{Mask, Window, visible_pairs, windows};
pub use work::work_per_rank;
pub use zigzag::ZigZag;
