//! `ringbench`: the workbench's command line.

use clap::{Parser, Subcommand};
use experiments::{alloc, attn, bench, exorl, hf, line_retrieval, reproduce, runner, timeline};

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
    /// Train the LLaMA-style model on line retrieval (SPMD over in-process ranks).
    Train(line_retrieval::TrainArgs),
    /// Exact-match accuracy of a checkpoint on LongChat line-retrieval cases, per number of lines.
    EvalLines(line_retrieval::EvalArgs),
    /// Write fresh line-retrieval cases as LongChat JSONL.
    GenLines(line_retrieval::GenArgs),
    /// Run an experiment spec (TOML) into results/NAME/: CSV, Markdown, spec copy, SVG.
    Run(runner::RunArgs),
    /// ExoRL-layout offline RL: collect episodes, print their stats, build the Table 5 analog.
    #[command(subcommand)]
    Exorl(exorl::ExorlCommand),
    /// Hugging Face LLaMA-family models and GGUF files: logits, generation (chat, sampling), tokenization, perplexity by position, export.
    #[command(subcommand)]
    Hf(hf::HfCommand),
    /// Regenerate the paper-analog tables: `quick` (minutes on a laptop CPU) or `full`.
    Reproduce(reproduce::ReproduceArgs),
    /// One point of a spec as this process's rank of a launched job (started by `run --launcher`).
    #[command(hide = true)]
    Point(runner::worker::PointArgs),
}

fn main() {
    alloc::keep_freed_memory();
    let cli = Cli::parse();
    // A forced SIMD level the CPU lacks (or misspelt) stops every command before it computes.
    if let Err(error) = workbench::simd::check() {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
    let result = match &cli.command {
        Command::Attn(args) => attn::run_command(args),
        Command::Bench(command) => bench::run(command),
        Command::Train(args) => {
            timeline::traced(args.trace.as_deref(), || line_retrieval::run_train(args))
        }
        Command::EvalLines(args) => timeline::traced(args.trace.as_deref(), || {
            line_retrieval::run_eval(args).map(|_| ())
        }),
        Command::GenLines(args) => line_retrieval::run_gen(args),
        Command::Run(args) => runner::run_command(args),
        Command::Exorl(command) => exorl::run(command),
        Command::Hf(command) => hf::run(command),
        Command::Reproduce(args) => reproduce::run(args),
        Command::Point(args) => runner::worker::run_point(args),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
