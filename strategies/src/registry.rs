//! Name → strategy lookup. Adding a strategy: one file, one `mod` line in lib.rs, one line here.

use crate::{Contiguous, Partition, PartitionError, Striped, ZigZag};

const STRATEGIES: &[&dyn Partition] = &[&Contiguous, &Striped, &ZigZag];

/// Every registered strategy name, in registry order.
pub fn names() -> Vec<&'static str> {
    STRATEGIES.iter().map(|s| s.name()).collect()
}

/// Looks a strategy up by its name.
pub fn by_name(name: &str) -> Result<&'static dyn Partition, PartitionError> {
    STRATEGIES
        .iter()
        .copied()
        .find(|s| s.name() == name)
        .ok_or_else(|| PartitionError::UnknownStrategy {
            name: name.to_owned(),
            known: names().join(", "),
        })
}
