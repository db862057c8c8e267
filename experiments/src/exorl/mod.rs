//! `ringbench exorl`: ExoRL-layout data (collect, stats) and the workbench's analog of the paper's
//! Table 5 (`table.rs`): behaviour cloning vs the Agentic Transformer with short and long chains of
//! trajectories, trained with ring attention, evaluated by rolling out in the Rust environments.

mod dataset;
mod spec;
pub mod table;

use anyhow::{Context, Result, ensure};
use clap::{Args, Subcommand};
use datasets::exorl::{
    EPISODE_STEPS, Policy, collect, episode_file_name, episode_files, make_env, read_episode,
    write_episode,
};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use spec::{
    ConfigSection, DataSection, ExorlSpec, ExorlTrainSection, ModelSection, TaskSection,
};

/// `ringbench exorl`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum ExorlCommand {
    /// Collect episodes with the exploratory policies into ROOT/datasets/DOMAIN/ALGO/buffer/.
    Collect(CollectArgs),
    /// Print `file,steps,return,obs_dim,act_dim` for every episode (.npz) under DIR.
    Stats(StatsArgs),
    /// Train BC and Agentic Transformers and evaluate them: the Table 5 analog.
    Table(TableArgs),
}

/// `ringbench exorl collect`'s arguments.
#[derive(Debug, Args)]
pub struct CollectArgs {
    /// Task name (`cartpole_swingup`, `point_mass_reach`).
    #[arg(long)]
    pub task: String,
    /// Root of the ExoRL layout.
    #[arg(long, default_value = "target/exorl")]
    pub root: PathBuf,
    /// Episodes per exploratory policy (random, ou_noise, scripted).
    #[arg(long, default_value_t = 20)]
    pub episodes: usize,
    /// Control steps an action is held for.
    #[arg(long, default_value_t = 20)]
    pub interval: usize,
    /// Seeds the policies and the environments.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `ringbench exorl stats`'s arguments.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Directory searched for episodes.
    pub dir: PathBuf,
}

/// `ringbench exorl table`'s arguments.
#[derive(Debug, Args)]
pub struct TableArgs {
    /// The table's spec.
    #[arg(long, default_value = "experiments/exorl.toml")]
    pub spec: PathBuf,
}

/// `ringbench exorl`.
pub fn run(command: &ExorlCommand) -> Result<()> {
    match command {
        ExorlCommand::Collect(a) => {
            let written = collect_task(&a.root, &a.task, a.episodes, a.interval, a.seed)?;
            println!("{written} episodes under {}", a.root.display());
            Ok(())
        }
        ExorlCommand::Stats(a) => {
            print!("{}", stats_csv(&a.dir)?);
            Ok(())
        }
        ExorlCommand::Table(a) => table::table(&a.spec),
    }
}

/// The stats CSV; file paths relative to `dir`.
pub fn stats_csv(dir: &Path) -> Result<String> {
    let mut out = String::from("file,steps,return,obs_dim,act_dim\n");
    for path in episode_files(dir)? {
        let e = read_episode(&path)?;
        let shown = path.strip_prefix(dir).unwrap_or(&path);
        writeln!(
            out,
            "{},{},{:.6},{},{}",
            shown.display(),
            e.steps(),
            e.total_return(),
            e.observation.cols,
            e.action.cols
        )?;
    }
    Ok(out)
}

/// Writes the task's episodes (skipping files already there); returns how many the task has.
fn collect_task(
    root: &Path,
    task: &str,
    per_policy: usize,
    interval: usize,
    seed: u64,
) -> Result<usize> {
    let mut env = make_env(task)?;
    ensure!(
        interval > 0 && EPISODE_STEPS.is_multiple_of(interval),
        "interval {interval} must divide the episode length {EPISODE_STEPS}"
    );
    let mut idx = 0;
    for (p, policy) in Policy::ALL.into_iter().enumerate() {
        let dir = root
            .join("datasets")
            .join(env.domain())
            .join(policy.name())
            .join("buffer");
        let names: Vec<PathBuf> = (0..per_policy)
            .map(|i| dir.join(episode_file_name(idx + i, EPISODE_STEPS)))
            .collect();
        idx += per_policy;
        if names.iter().all(|n| n.exists()) {
            continue;
        }
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        let episodes = collect(
            env.as_mut(),
            policy,
            per_policy,
            interval,
            seed + 1000 * p as u64,
        );
        for (name, episode) in names.iter().zip(&episodes) {
            write_episode(name, episode)?;
        }
    }
    Ok(idx)
}
