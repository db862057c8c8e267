//! The experiment kinds, one file each, and their registry. Adding a kind: one file implementing
//! [`Experiment`], one `mod` line and one entry in [`KINDS`].

mod attn;
mod axes;
mod balance;
mod decode;
mod documents;
mod exorl;
pub mod experiment;
mod hybrid;
mod knee;
mod layer_mix;
mod memory;
mod memory_model;
mod mfu;
mod model;
mod overlap;
mod ppl;
mod precision;
mod published;
mod retrieval;
mod shape;
mod train;
mod window;

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
    &model::ModelKind,
    &memory_model::MemoryModel,
    &precision::PrecisionKind,
    &published::Published,
    &hybrid::Hybrid,
    &exorl::Exorl,
    &decode::DecodeKind,
    &retrieval::Retrieval,
    &ppl::PplKind,
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

/// Per kind: its name, what it shows and its sweep keys, then its columns grouped by how
/// `ringbench reproduce` compares them.
pub fn listing() -> String {
    KINDS
        .iter()
        .map(|k| {
            let card = k.card();
            let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
            for column in card.columns {
                let how = match column.check {
                    Check::Exact => "exact".to_owned(),
                    Check::Within(t) => format!("within {t:e} relative"),
                    Check::AtMost(b) => format!("at most {b:e}"),
                    Check::Absolute(a) => format!("within {a} absolutely"),
                    Check::Measured => "measured (ratio)".to_owned(),
                    Check::Shown => "shown".to_owned(),
                };
                match groups.iter_mut().find(|(h, _)| *h == how) {
                    Some((_, names)) => names.push(column.name),
                    None => groups.push((how, vec![column.name])),
                }
            }
            let columns: Vec<String> = groups
                .into_iter()
                .map(|(how, names)| format!("{how}: {}", names.join(", ")))
                .collect();
            format!(
                "{:13} {} [sweep: {}]\n{:13} key: {}; {}\n",
                card.name,
                card.about,
                card.sweep_keys.join(", "),
                "",
                card.key_columns.join(", "),
                columns.join("; ")
            )
        })
        .collect()
}
