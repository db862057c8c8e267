//! `ringbench`: the workbench's command line.

use clap::{Parser, Subcommand};
use experiments::{alloc, attn, bench};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

#[derive(Debug, Parser)]
#[command(
    name = "ringbench",
    version,
    about = "A research workbench for Ring Attention"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Ring attention on .npy arrays (batch, seq, heads, head_dim); writes out.npy, lse.npy, grads.
    Attn(attn::AttnArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Attn(args) => attn::run(args),
        Command::Bench(command) => bench::run(command),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
