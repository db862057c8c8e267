//! `ringbench reproduce quick|full`: every implemented table from its spec under `experiments/`.

use crate::runner::{self, RunArgs};
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Size {
    Quick,
    Full,
}

#[derive(Debug, clap::Args)]
pub struct ReproduceArgs {
    pub size: Size,
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    #[arg(long)]
    pub force: bool,
}

/// (quick spec, full spec) per table.
const TABLES: &[(&str, &str)] = &[
    ("experiments/balance_quick.toml", "experiments/balance.toml"),
    ("experiments/overlap.toml", "experiments/overlap.toml"),
    ("experiments/knee.toml", "experiments/knee.toml"),
    ("experiments/memory_quick.toml", "experiments/memory.toml"),
    ("experiments/mfu_quick.toml", "experiments/mfu.toml"),
    (
        "experiments/memory_model.toml",
        "experiments/memory_model.toml",
    ),
];

pub fn run(args: &ReproduceArgs) -> Result<()> {
    for (quick, full) in TABLES {
        let spec = match args.size {
            Size::Quick => quick,
            Size::Full => full,
        };
        runner::run(&RunArgs {
            spec: PathBuf::from(spec),
            force: args.force,
            results: args.results.clone(),
        })?;
    }
    Ok(())
}
