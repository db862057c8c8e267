//! Name → strategy lookup. Adding a strategy: one file, one `mod` line in lib.rs, one line here; or,
//! from outside this crate (a test, a user's crate), one call to [`register`].

use crate::{Balanced, Contiguous, DocZigZag, Partition, PartitionError, Striped, ZigZag};
use std::sync::RwLock;

const BUILT_IN: &[&dyn Partition] = &[
    &Contiguous,
    &Striped,
    &ZigZag,
    &DocZigZag,
    &Balanced {
        chunks_per_rank: None,
    },
];

/// Strategies registered at run time, after the built-in ones.
static REGISTERED: RwLock<Vec<&'static dyn Partition>> = RwLock::new(Vec::new());

fn all() -> Vec<&'static dyn Partition> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    BUILT_IN
        .iter()
        .copied()
        .chain(registered.iter().copied())
        .collect()
}

/// Every registered strategy name, built-in ones first, in registration order.
pub fn names() -> Vec<&'static str> {
    all().iter().map(|s| s.name()).collect()
}

/// Looks a strategy up by its name.
pub fn by_name(name: &str) -> Result<&'static dyn Partition, PartitionError> {
    all()
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| PartitionError::UnknownStrategy {
            name: name.to_owned(),
            known: names().join(", "),
        })
}

/// Makes `strategy` known by its name to [`by_name`], and so to every command and experiment that
/// takes strategy names. Registering the same strategy twice is a no-op; another strategy under a
/// name already taken is an error.
pub fn register(strategy: &'static dyn Partition) -> Result<(), PartitionError> {
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    let taken = BUILT_IN
        .iter()
        .chain(registered.iter())
        .find(|s| s.name() == strategy.name());
    match taken {
        None => {
            registered.push(strategy);
            Ok(())
        }
        Some(s)
            if std::ptr::addr_eq(*s as *const dyn Partition, strategy as *const dyn Partition) =>
        {
            Ok(())
        }
        Some(_) => Err(PartitionError::NameTaken {
            name: strategy.name().to_owned(),
        }),
    }
}
