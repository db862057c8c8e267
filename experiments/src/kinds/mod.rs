//! The experiment kinds, one file each, and their registry. Adding a kind: one file implementing
//! [`Experiment`], one `mod` line and one entry in [`KINDS`].

mod attn;
mod axes;
mod balance;
mod documents;
mod exorl;
pub mod experiment;
mod knee;
mod memory;
mod memory_model;
mod mfu;
mod overlap;
mod shape;
mod train;

pub use experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};

/// Every kind, in the order `ringbench run --kinds` lists them.
pub const KINDS: &[&dyn Experiment] = &[
    &attn::Attn,
    &train::TrainKind,
    &balance::Balance,
    &overlap::Overlap,
    &knee::Knee,
    &memory::Memory,
    &mfu::Mfu,
    &memory_model::MemoryModel,
    &exorl::Exorl,
];

/// The kind called `name`, or an error listing the known kinds.
pub fn by_name(name: &str) -> Result<&'static dyn Experiment, String> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.card().name == name)
        .ok_or_else(|| {
            let known: Vec<&str> = KINDS.iter().map(|k| k.card().name).collect();
            format!("unknown kind '{name}'; known: {}", known.join(", "))
        })
}

/// One line per kind: its name, what it shows and its sweep keys.
pub fn listing() -> String {
    KINDS
        .iter()
        .map(|k| {
            format!(
                "{:13} {} [sweep: {}]\n",
                k.card().name,
                k.card().about,
                k.card().sweep_keys.join(", ")
            )
        })
        .collect()
}
