//! `ringbench bench`: how fast ring attention (`attn`) and the whole model (`model`) run on this
//! machine, each beside a baseline measured in the same run.

pub mod attn;
pub mod model;

pub use attn::{AttnBenchRow, BenchAttnArgs};
pub use model::{BenchModelArgs, ModelBenchRow};

use anyhow::Result;

/// `ringbench bench`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Forward and forward+backward GFLOP/s per (length, ranks, strategy, causal).
    Attn(BenchAttnArgs),
    /// The whole model's prefill, decoding and training tokens/s, with the CPU and threads named.
    Model(BenchModelArgs),
}

/// `ringbench bench`.
pub fn run(command: &BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Attn(args) => {
            crate::timeline::traced(args.trace.as_deref(), || attn::run(args))
        }
        BenchCommand::Model(args) => model::run(args),
    }
}

/// A length or count of at least 1: clap refuses 0 in one line naming the flag (a length or rank
/// count of 0 would time nothing and print an empty table).
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
