//! The ring algorithm (Liu et al. 2023, §3): the schedule written once (`engine`), the ring's
//! options ([`options`]) and each rank's context ([`context`]; what its positions hold, [`sequence`]), the bytes a rank holds ([`ledger`]),
//! ring attention as a Burn autodiff op ([`op`]), and one-call jobs over N ranks ([`jobs`], with
//! injected faults) on host arrays ([`host_tensor`]); head × context parallelism wraps the ring in a
//! Ulysses all-to-all ([`ulysses`]). Decoding keeps each rank's share of the keys and values
//! ([`cache`]) and merges the ranks' [`partial`] attention of each new token ([`decode`]).
//! What travels is [`crate::block`]; what computes a tile is a [`crate::kernels::TileKernel`].

mod accounts;
pub mod cache;
pub mod context;
pub mod decode;
pub(crate) mod engine;
mod fault;
pub mod host_tensor;
pub mod jobs;
pub mod ledger;
pub mod op;
pub mod options;
pub mod partial;
pub mod sequence;
pub mod ulysses;

pub use engine::Saved;
