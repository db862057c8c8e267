//! `ringbench exorl`: ExoRL-layout data (collect, stats) and the workbench's analog of the paper's
//! Table 5: behaviour cloning vs the Agentic Transformer with short and long chains of trajectories,
//! trained with ring attention, evaluated by rolling out in the Rust environments.

use crate::alloc;
use crate::units::MIB;
use anyhow::{Context, Result, bail, ensure};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use clap::{Args, Subcommand};
use datasets::SplitMix64;
use datasets::exorl::{
    EPISODE_STEPS, Episode, Policy, collect, episode_file_name, episode_files, make_env,
    read_episode, write_episode,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use workbench::model::agentic::{
    ActionPrediction, AgenticConfig, AgenticTransformer, ChainBatch, TOKENS_PER_STEP, TokenKind,
    predict_action,
};
use workbench::train::{TrainOptions, padded_len, train_objective};
use workbench::{Kernel, RingConfig};

type Train = Autodiff<Flex>;
const TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Subcommand)]
pub enum ExorlCommand {
    /// Collect episodes with the exploratory policies into ROOT/datasets/DOMAIN/ALGO/buffer/.
    Collect(CollectArgs),
    /// Print `file,steps,return,obs_dim,act_dim` for every episode (.npz) under DIR.
    Stats(StatsArgs),
    /// Train BC and Agentic Transformers and evaluate them: the Table 5 analog.
    Table(TableArgs),
}

#[derive(Debug, Args)]
pub struct CollectArgs {
    #[arg(long)]
    pub task: String,
    #[arg(long, default_value = "target/exorl")]
    pub root: PathBuf,
    /// Episodes per exploratory policy (random, ou_noise, scripted).
    #[arg(long, default_value_t = 20)]
    pub episodes: usize,
    /// Control steps an action is held for.
    #[arg(long, default_value_t = 20)]
    pub interval: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct TableArgs {
    #[arg(long, default_value = "experiments/exorl.toml")]
    pub spec: PathBuf,
}

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
        ExorlCommand::Table(a) => table(&a.spec),
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

/// One episode seen at the agent's decision rate: the state before each decision, the held action,
/// and the reward over the interval divided by its length (so in `[0, 1]`).
#[derive(Debug, Clone)]
struct Trajectory {
    states: Vec<Vec<f32>>,
    actions: Vec<Vec<f32>>,
    rewards: Vec<f32>,
    total: f64,
}

fn trajectory(e: &Episode, interval: usize) -> Trajectory {
    let decisions = e.steps() / interval;
    let mut t = Trajectory {
        states: Vec::new(),
        actions: Vec::new(),
        rewards: Vec::new(),
        total: e.total_return(),
    };
    for d in 0..decisions {
        let r = d * interval;
        t.states.push(e.observation.row(r).to_vec());
        t.actions.push(e.action.row(r + 1).to_vec());
        let sum: f32 = e.reward[r + 1..=r + interval].iter().sum();
        t.rewards.push(sum / interval as f32);
    }
    t
}

/// A task's offline data: trajectories and the observation normalizer.
struct Dataset {
    trajectories: Vec<Trajectory>,
    mean: Vec<f32>,
    std: Vec<f32>,
    best: f64,
    interval: usize,
    /// Decisions in the longest trajectory.
    decisions: usize,
}

impl Dataset {
    fn load(dir: &Path, interval: usize) -> Result<Self> {
        let trajectories: Vec<Trajectory> = episode_files(dir)?
            .iter()
            .map(|p| {
                let t = trajectory(&read_episode(p)?, interval);
                ensure!(
                    !t.states.is_empty(),
                    "{}: shorter than one decision of {interval} steps",
                    p.display()
                );
                Ok(t)
            })
            .collect::<Result<_>>()?;
        let decisions = trajectories
            .iter()
            .map(|t| t.states.len())
            .max()
            .unwrap_or(0);
        let dim = trajectories[0].states[0].len();
        let states = trajectories.iter().flat_map(|t| t.states.iter());
        let n = trajectories.iter().map(|t| t.states.len()).sum::<usize>() as f64;
        let mut mean = vec![0.0f64; dim];
        let mut sq = vec![0.0f64; dim];
        for s in states {
            for (i, &x) in s.iter().enumerate() {
                mean[i] += f64::from(x) / n;
                sq[i] += f64::from(x) * f64::from(x) / n;
            }
        }
        let std = mean
            .iter()
            .zip(&sq)
            .map(|(m, s)| (s - m * m).max(0.0).sqrt().max(1e-3) as f32)
            .collect();
        let best = trajectories.iter().map(|t| t.total).fold(0.0, f64::max);
        Ok(Self {
            trajectories,
            mean: mean.iter().map(|&m| m as f32).collect(),
            std,
            best,
            interval,
            decisions,
        })
    }

    fn normalize(&self, obs: &[f32]) -> Vec<f32> {
        obs.iter()
            .zip(self.mean.iter().zip(&self.std))
            .map(|(x, (m, s))| (x - m) / s)
            .collect()
    }

    /// `k` distinct trajectories drawn with `rng`, sorted by return ascending.
    fn chain(&self, k: usize, rng: &mut SplitMix64) -> Vec<&Trajectory> {
        let mut picked: Vec<usize> = Vec::with_capacity(k);
        while picked.len() < k.min(self.trajectories.len()) {
            let i = rng.below(self.trajectories.len() as u64) as usize;
            if !picked.contains(&i) {
                picked.push(i);
            }
        }
        let mut chain: Vec<&Trajectory> = picked.iter().map(|&i| &self.trajectories[i]).collect();
        chain.sort_by(|a, b| a.total.total_cmp(&b.total));
        chain
    }
}

/// A chain's token rows, action targets and weights (1 at every state token).
fn chain_rows(
    cfg: &AgenticConfig,
    data: &Dataset,
    chain: &[&Trajectory],
    target: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut rows, mut targets, mut weights) = (Vec::new(), Vec::new(), Vec::new());
    let zeros = vec![0.0; cfg.act_dim];
    for t in chain {
        for d in 0..t.states.len() {
            let tokens = [
                cfg.token(TokenKind::Target, &[target]),
                cfg.token(TokenKind::State, &data.normalize(&t.states[d])),
                cfg.token(TokenKind::Action, &t.actions[d]),
                cfg.token(TokenKind::Reward, &[t.rewards[d]]),
            ];
            for (i, token) in tokens.into_iter().enumerate() {
                rows.extend(token);
                let learn = i == TokenKind::State as usize;
                targets.extend(if learn { &t.actions[d] } else { &zeros });
                weights.push(if learn { 1.0 } else { 0.0 });
            }
        }
    }
    (rows, targets, weights)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExorlSpec {
    pub out: PathBuf,
    pub data_root: PathBuf,
    pub seeds: Vec<u64>,
    pub eval_episodes: usize,
    /// Per-rank memory budget for the "fits" columns.
    pub memory_budget_mib: f64,
    pub data: DataSection,
    pub model: ModelSection,
    pub train: ExorlTrainSection,
    #[serde(rename = "task")]
    pub tasks: Vec<TaskSection>,
    #[serde(rename = "config")]
    pub configs: Vec<ConfigSection>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    pub episodes_per_policy: usize,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExorlTrainSection {
    pub steps: usize,
    /// Trajectories per step: a step trains on `trajectories_per_step / k` chains, so that every
    /// configuration sees the same number of (state, action) pairs.
    pub trajectories_per_step: usize,
    pub lr: f64,
    pub ranks: usize,
    pub strategy: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    pub name: String,
    /// Control steps per decision (actions are held in between, in the data and in rollouts).
    pub interval: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSection {
    pub name: String,
    /// Trajectories per chain.
    pub k: usize,
    /// Whether the target-return token carries the chain's best return (AT) or zero (BC).
    pub return_conditioned: bool,
}

impl ConfigSection {
    fn target(&self, best: f64) -> f32 {
        if self.return_conditioned {
            (best / EPISODE_STEPS as f64) as f32
        } else {
            0.0
        }
    }
}

fn batch_for(
    cfg: &AgenticConfig,
    data: &Dataset,
    config: &ConfigSection,
    batch: usize,
    len: usize,
    seed: u64,
    step: usize,
) -> ChainBatch {
    let mut rng = SplitMix64::new(seed ^ (step as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let f = cfg.feature_dim();
    let mut out = ChainBatch {
        batch,
        len,
        feature_dim: f,
        act_dim: cfg.act_dim,
        features: Vec::with_capacity(batch * len * f),
        targets: Vec::with_capacity(batch * len * cfg.act_dim),
        weights: Vec::with_capacity(batch * len),
    };
    for _ in 0..batch {
        let chain = data.chain(config.k, &mut rng);
        let best = chain.iter().map(|t| t.total).fold(0.0, f64::max);
        let (rows, targets, weights) = chain_rows(cfg, data, &chain, config.target(best));
        let pad = len - weights.len();
        out.features.extend(rows);
        out.features.extend(std::iter::repeat_n(0.0, pad * f));
        out.targets.extend(targets);
        out.targets
            .extend(std::iter::repeat_n(0.0, pad * cfg.act_dim));
        out.weights.extend(weights);
        out.weights.extend(std::iter::repeat_n(0.0, pad));
    }
    out
}

/// One training run's size.
#[derive(Debug, Clone, Copy)]
struct RunSize {
    seed: u64,
    ranks: usize,
    steps: usize,
    /// Chains per step.
    chains: usize,
}

/// Trains one policy; returns the model and the process's peak bytes during its first step.
fn train_policy(
    spec: &ExorlSpec,
    cfg: &AgenticConfig,
    data: &Dataset,
    config: &ConfigSection,
    size: RunSize,
) -> Result<(AgenticTransformer<Train>, usize)> {
    let RunSize {
        seed,
        ranks,
        steps,
        chains,
    } = size;
    let partition = strategies::by_name(&spec.train.strategy)?;
    let len = padded_len(
        partition,
        config.k.min(data.trajectories.len()) * data.decisions * TOKENS_PER_STEP,
        ranks,
    )?;
    <Train as Backend>::seed(&Default::default(), seed);
    let model = cfg.init::<Train>(&Default::default())?;
    let options = TrainOptions {
        ranks,
        ring: RingConfig {
            kernel: Kernel::Fused,
            ..Default::default()
        },
        steps,
        lr: spec.train.lr,
        warmup_steps: (steps / 10).max(1),
        min_lr_ratio: 0.1,
        weight_decay: 0.01,
        grad_clip: Some(1.0),
        checksum_every: 50,
        pad_token: 0,
        timeout: TIMEOUT,
    };
    let peak = std::sync::atomic::AtomicUsize::new(0);
    alloc::reset();
    let trained = train_objective(
        &ActionPrediction,
        model,
        partition,
        &options,
        |step| batch_for(cfg, data, config, chains, len, seed, step),
        |log| {
            if log.step == 0 {
                peak.store(
                    alloc::stats().peak_above_start,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        },
        &AtomicBool::new(false),
    )?;
    Ok((trained.model, peak.into_inner()))
}

/// Return of one episode: the policy acts every `interval` steps on the live trajectory, after a
/// chain of `k − 1` data trajectories drawn with the episode's seed, targeting the data's best return.
fn rollout(
    model: &AgenticTransformer<Flex>,
    cfg: &AgenticConfig,
    data: &Dataset,
    config: &ConfigSection,
    task: &str,
    seed: u64,
) -> Result<f64> {
    let mut env = make_env(task)?;
    let mut rng = SplitMix64::new(seed);
    env.reset(&mut rng);
    let prefix = if config.k > 1 {
        data.chain(config.k - 1, &mut rng)
    } else {
        Vec::new()
    };
    let target = config.target(data.best);
    let (mut rows, _, _) = chain_rows(cfg, data, &prefix, target);
    let f = cfg.feature_dim();
    let mut total = 0.0f64;
    for _ in 0..EPISODE_STEPS / data.interval {
        rows.extend(cfg.token(TokenKind::Target, &[target]));
        rows.extend(cfg.token(TokenKind::State, &data.normalize(&env.observation())));
        let at = rows.len() / f - 1;
        let action = predict_action(model, &rows, f, at, TIMEOUT)?;
        let mut reward = 0.0f32;
        for _ in 0..data.interval {
            reward += env.step(&action);
        }
        total += f64::from(reward);
        rows.extend(cfg.token(TokenKind::Action, &action));
        rows.extend(cfg.token(TokenKind::Reward, &[reward / data.interval as f32]));
    }
    Ok(total)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

fn table(spec_path: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(spec_path).with_context(|| spec_path.display().to_string())?;
    let spec: ExorlSpec = toml::from_str(&text).with_context(|| spec_path.display().to_string())?;
    ensure!(
        !spec.seeds.is_empty(),
        "{}: `seeds` is empty",
        spec_path.display()
    );
    ensure!(
        spec.eval_episodes > 0,
        "{}: `eval_episodes` must be positive",
        spec_path.display()
    );
    std::fs::create_dir_all(&spec.out)?;
    std::fs::write(spec.out.join("exorl.toml"), &text)?;
    let runs = spec.tasks.len() * spec.configs.len() * spec.seeds.len();
    let bar = ProgressBar::new(runs as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("template")?,
    );
    let mut csv = String::from(
        "task,config,k,return_conditioned,chain_tokens,seeds,mean_return,std_return,seed_returns,\
         data_mean_return,data_best_return,chain_peak_mib_1_rank,chain_peak_mib_per_rank_ring,ring_ranks,\
         budget_mib,fits_1_rank,fits_ring,train_s_per_run\n",
    );
    let mut data_csv = String::from("task,algo,episodes,mean_return,min_return,max_return\n");
    for task in &spec.tasks {
        collect_task(
            &spec.data_root,
            &task.name,
            spec.data.episodes_per_policy,
            task.interval,
            spec.data.seed,
        )?;
        let domain = spec.data_root.join("datasets").join(&task.name);
        for policy in Policy::ALL {
            let returns: Vec<f64> = episode_files(&domain.join(policy.name()))?
                .iter()
                .map(|p| Ok(read_episode(p)?.total_return()))
                .collect::<Result<_>>()?;
            let (mean, _) = mean_std(&returns);
            let min = returns.iter().copied().fold(f64::INFINITY, f64::min);
            let max = returns.iter().copied().fold(0.0, f64::max);
            writeln!(
                data_csv,
                "{},{},{},{mean:.1},{min:.1},{max:.1}",
                task.name,
                policy.name(),
                returns.len()
            )?;
        }
        let data = Dataset::load(&domain, task.interval)?;
        let data_mean =
            data.trajectories.iter().map(|t| t.total).sum::<f64>() / data.trajectories.len() as f64;
        let env = make_env(&task.name)?;
        let cfg = AgenticConfig::new(env.obs_dim(), env.act_dim())
            .with_d_model(spec.model.d_model)
            .with_layers(spec.model.layers)
            .with_heads(spec.model.heads)
            .with_kv_heads(spec.model.kv_heads);
        for config in &spec.configs {
            ensure!(config.k > 0, "config `{}`: k must be positive", config.name);
            let tokens = config.k * data.decisions * TOKENS_PER_STEP;
            // Memory of one chain's forward + backward, on one rank and per rank of the ring.
            let probe = |ranks| {
                let size = RunSize {
                    seed: 0,
                    ranks,
                    steps: 1,
                    chains: 1,
                };
                train_policy(&spec, &cfg, &data, config, size).map(|(_, peak)| peak)
            };
            let peak_single = probe(1)?;
            let peak_ring = probe(spec.train.ranks)?;
            let chains = (spec.train.trajectories_per_step / config.k).max(1);
            let mut seed_returns = Vec::new();
            let mut seconds = 0.0;
            for &seed in &spec.seeds {
                bar.set_message(format!("{} {} seed {seed}", task.name, config.name));
                let start = Instant::now();
                let size = RunSize {
                    seed,
                    ranks: spec.train.ranks,
                    steps: spec.train.steps,
                    chains,
                };
                let (model, _) = train_policy(&spec, &cfg, &data, config, size)?;
                seconds += start.elapsed().as_secs_f64();
                let model = model.valid();
                let mut returns = Vec::new();
                for e in 0..spec.eval_episodes {
                    let eval_seed = 1_000_000 + 1000 * seed + e as u64;
                    returns.push(rollout(&model, &cfg, &data, config, &task.name, eval_seed)?);
                }
                let again = rollout(
                    &model,
                    &cfg,
                    &data,
                    config,
                    &task.name,
                    1_000_000 + 1000 * seed,
                )?;
                if again != returns[0] {
                    bail!(
                        "{} {} seed {seed}: the same rollout returned {} and {again}",
                        task.name,
                        config.name,
                        returns[0]
                    );
                }
                seed_returns.push(mean_std(&returns).0);
                bar.inc(1);
            }
            let (mean, std) = mean_std(&seed_returns);
            let single = peak_single as f64 / MIB;
            let ring = peak_ring as f64 / MIB / spec.train.ranks as f64;
            let list: Vec<String> = seed_returns.iter().map(|r| format!("{r:.1}")).collect();
            writeln!(
                csv,
                "{},{},{},{},{tokens},{},{mean:.1},{std:.1},{},{data_mean:.1},{:.1},{single:.1},{ring:.1},{},{},{},{},{:.1}",
                task.name,
                config.name,
                config.k,
                config.return_conditioned,
                spec.seeds.len(),
                list.join(";"),
                data.best,
                spec.train.ranks,
                spec.memory_budget_mib,
                single <= spec.memory_budget_mib,
                ring <= spec.memory_budget_mib,
                seconds / spec.seeds.len() as f64,
            )?;
        }
    }
    bar.finish();
    std::fs::write(spec.out.join("returns.csv"), &csv)?;
    std::fs::write(spec.out.join("data.csv"), &data_csv)?;
    let md = crate::markdown::from_csv(&csv);
    std::fs::write(spec.out.join("returns.md"), &md)?;
    print!("{md}");
    print!("{}", crate::markdown::from_csv(&data_csv));
    Ok(())
}
