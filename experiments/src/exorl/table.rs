//! `ringbench exorl table`: the Table 5 analog. Behaviour cloning and Agentic Transformers trained
//! with ring attention on each task's offline data, evaluated by rollouts, written as `returns.csv`
//! and `data.csv`.

use super::collect_task;
use super::dataset::{Dataset, batch_for, chain_rows};
use super::spec::{ConfigSection, ExorlSpec, TaskSection};
use crate::alloc;
use crate::extremes::{largest, smallest};
use crate::results::{Record, Table};
use crate::units::MIB;
use anyhow::{Context, Result, bail};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use datasets::SplitMix64;
use datasets::exorl::{EPISODE_STEPS, Policy, episode_files, make_env, read_episode};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};
use workbench::model::agentic::{AgenticConfig, AgenticTransformer, TOKENS_PER_STEP, TokenKind};
use workbench::model::lazy::seeded;
use workbench::train::agentic::{ActionPrediction, predict_action};
use workbench::train::{StepLog, TrainOptions, Training, padded_len, train_objective};
use workbench::{Kernel, RingConfig};

type Train = Autodiff<Flex>;
const TIMEOUT: Duration = Duration::from_secs(600);

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
    let device = Default::default();
    let model =
        seeded::<Train, _>(seed, &device, || cfg.init(&device)).map_err(anyhow::Error::from)?;
    let options = TrainOptions {
        ranks,
        ulysses: 1,
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
        pack: false,
    };
    let peak = std::sync::atomic::AtomicUsize::new(0);
    alloc::reset();
    let on_step = |log: &StepLog| {
        if log.step == 0 {
            peak.store(
                alloc::stats().peak_above_start,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    };
    let run = Training {
        on_step: Some(&on_step),
        ..Training::new(model, partition, |step| {
            batch_for(cfg, data, config, chains, len, seed, step)
        })
        .with_options(options)
    };
    let trained = train_objective(&ActionPrediction, run)?;
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

/// A task's data, collected if missing, with the per-policy statistics and the model config.
pub struct PreparedTask {
    /// The task's name.
    pub name: String,
    /// Its trajectories at the decision rate.
    pub data: Dataset,
    /// One `data.csv` row per exploratory policy.
    pub data_rows: Vec<Record>,
    /// The Agentic Transformer for the task's observation and action sizes.
    pub cfg: AgenticConfig,
}

/// Collects `task`'s episodes (those not on disk yet) and loads them.
pub fn prepare_task(spec: &ExorlSpec, task: &TaskSection) -> Result<PreparedTask> {
    collect_task(
        &spec.data_root,
        &task.name,
        spec.data.episodes_per_policy,
        task.interval,
        spec.data.seed,
    )?;
    let domain = spec.data_root.join("datasets").join(&task.name);
    let mut data_rows = Vec::new();
    for policy in Policy::ALL {
        let returns: Vec<f64> = episode_files(&domain.join(policy.name()))?
            .iter()
            .map(|p| Ok(read_episode(p)?.total_return()))
            .collect::<Result<_>>()?;
        let (mean, _) = mean_std(&returns);
        // NaN-aware, and a task whose returns are all negative keeps its negative maximum.
        let min = smallest(returns.iter().copied()).unwrap_or(f64::NAN);
        let max = largest(returns.iter().copied()).unwrap_or(f64::NAN);
        data_rows.push(Record::of(&DataRow {
            task: &task.name,
            algo: policy.name(),
            episodes: returns.len(),
            mean_return: mean,
            min_return: min,
            max_return: max,
        })?);
    }
    let data = Dataset::load(&domain, task.interval)?;
    let env = make_env(&task.name)?;
    let cfg = AgenticConfig::new(env.obs_dim(), env.act_dim())
        .with_d_model(spec.model.d_model)
        .with_layers(spec.model.layers)
        .with_heads(spec.model.heads)
        .with_kv_heads(spec.model.kv_heads);
    Ok(PreparedTask {
        name: task.name.clone(),
        data,
        data_rows,
        cfg,
    })
}

/// One configuration on one task over every seed: train, roll out, and its `returns.csv` row (`bar`
/// shows which seed trains; the caller advances it).
pub fn config_row(
    spec: &ExorlSpec,
    task: &PreparedTask,
    config: &ConfigSection,
    bar: &ProgressBar,
) -> Result<Record> {
    let (data, cfg) = (&task.data, &task.cfg);
    let data_mean =
        data.trajectories.iter().map(|t| t.total).sum::<f64>() / data.trajectories.len() as f64;
    let tokens = config.k * data.decisions * TOKENS_PER_STEP;
    // Memory of one chain's forward + backward, on one rank and per rank of the ring.
    let probe = |ranks| {
        let size = RunSize {
            seed: 0,
            ranks,
            steps: 1,
            chains: 1,
        };
        train_policy(spec, cfg, data, config, size).map(|(_, peak)| peak)
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
        let (model, _) = train_policy(spec, cfg, data, config, size)?;
        seconds += start.elapsed().as_secs_f64();
        let model = model.valid();
        let mut returns = Vec::new();
        for e in 0..spec.eval_episodes {
            let eval_seed = 1_000_000 + 1000 * seed + e as u64;
            returns.push(rollout(&model, cfg, data, config, &task.name, eval_seed)?);
        }
        let again = rollout(
            &model,
            cfg,
            data,
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
    }
    let (mean, std) = mean_std(&seed_returns);
    let single = peak_single as f64 / MIB;
    let ring = peak_ring as f64 / MIB / spec.train.ranks as f64;
    let list: Vec<String> = seed_returns.iter().map(|r| format!("{r:.1}")).collect();
    Record::of(&ReturnsRow {
        task: &task.name,
        config: &config.name,
        k: config.k,
        return_conditioned: config.return_conditioned,
        chain_tokens: tokens,
        seeds: spec.seeds.len(),
        mean_return: mean,
        std_return: std,
        seed_returns: list.join(";"),
        data_mean_return: data_mean,
        data_best_return: data.best,
        chain_peak_mib_1_rank: single,
        chain_peak_mib_per_rank_ring: ring,
        ring_ranks: spec.train.ranks,
        budget_mib: spec.memory_budget_mib,
        fits_1_rank: single <= spec.memory_budget_mib,
        fits_ring: ring <= spec.memory_budget_mib,
        train_s_per_run: seconds / spec.seeds.len() as f64,
    })
}

/// One row of `returns.csv`: a (task, configuration) over every seed.
#[derive(Debug, Serialize)]
struct ReturnsRow<'a> {
    task: &'a str,
    config: &'a str,
    k: usize,
    return_conditioned: bool,
    chain_tokens: usize,
    seeds: usize,
    mean_return: f64,
    std_return: f64,
    seed_returns: String,
    data_mean_return: f64,
    data_best_return: f64,
    chain_peak_mib_1_rank: f64,
    chain_peak_mib_per_rank_ring: f64,
    ring_ranks: usize,
    budget_mib: f64,
    fits_1_rank: bool,
    fits_ring: bool,
    train_s_per_run: f64,
}

/// One row of `data.csv`: the episodes one exploratory policy collected.
#[derive(Debug, Serialize)]
struct DataRow<'a> {
    task: &'a str,
    algo: &'a str,
    episodes: usize,
    mean_return: f64,
    min_return: f64,
    max_return: f64,
}

/// `ringbench exorl table`: every (task, configuration) into `returns.csv`, the data into `data.csv`.
pub fn table(spec_path: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(spec_path).with_context(|| spec_path.display().to_string())?;
    let spec: ExorlSpec = toml::from_str(&text).with_context(|| spec_path.display().to_string())?;
    if let Some((key, problem)) = spec.problem() {
        bail!("{}: {key} {problem}", spec_path.display());
    }
    std::fs::create_dir_all(&spec.out)?;
    std::fs::write(spec.out.join("exorl.toml"), &text)?;
    let runs = spec.tasks.len() * spec.configs.len() * spec.seeds.len();
    let bar = ProgressBar::new(runs as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("template")?,
    );
    let mut returns_rows = Vec::new();
    let mut data_rows = Vec::new();
    for task in &spec.tasks {
        let prepared = prepare_task(&spec, task)?;
        data_rows.extend(prepared.data_rows.iter().cloned());
        for config in &spec.configs {
            returns_rows.push(config_row(&spec, &prepared, config, &bar)?);
            bar.inc(spec.seeds.len() as u64);
        }
    }
    bar.finish();
    let regenerate = format!(
        "Regenerate: `ringbench exorl table --spec {}`",
        spec_path.display()
    );
    let md = Table::of(returns_rows).write(
        &spec.out,
        "returns",
        "ExoRL: returns by configuration",
        &regenerate,
    )?;
    print!("{md}");
    print!(
        "{}",
        Table::of(data_rows).write(
            &spec.out,
            "data",
            "ExoRL: the collected episodes",
            &regenerate
        )?
    );
    Ok(())
}
