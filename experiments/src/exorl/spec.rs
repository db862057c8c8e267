//! `experiments/exorl.toml`: the data, model, training, tasks and configurations of the Table 5 analog.

use datasets::exorl::EPISODE_STEPS;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `experiments/exorl.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExorlSpec {
    /// `kind = "exorl"` when the file is also a runner spec (`ringbench run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The runner's description of the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Where `ringbench exorl table` writes returns.csv and data.csv.
    #[serde(default = "default_out")]
    pub out: PathBuf,
    /// Root of the ExoRL-layout episodes (collected there if missing).
    pub data_root: PathBuf,
    /// Training seeds; returns are averaged over them.
    pub seeds: Vec<u64>,
    /// Rollouts per trained policy.
    pub eval_episodes: usize,
    /// Per-rank memory budget for the "fits" columns.
    pub memory_budget_mib: f64,
    /// How much data to collect.
    pub data: DataSection,
    /// The Agentic Transformer's shape.
    pub model: ModelSection,
    /// Training settings.
    pub train: ExorlTrainSection,
    /// The tasks (`[[task]]`).
    #[serde(rename = "task")]
    pub tasks: Vec<TaskSection>,
    /// The configurations compared (`[[config]]`).
    #[serde(rename = "config")]
    pub configs: Vec<ConfigSection>,
}

fn default_out() -> PathBuf {
    PathBuf::from("results/exorl")
}

impl ExorlSpec {
    /// What TOML cannot check: `(key, message)` of the first bad value.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if self.seeds.is_empty() {
            return Some(("seeds", "is empty".into()));
        }
        if self.eval_episodes == 0 {
            return Some(("eval_episodes", "must be positive".into()));
        }
        if let Some(c) = self.configs.iter().find(|c| c.k == 0) {
            return Some(("k", format!("config `{}`: k must be positive", c.name)));
        }
        None
    }
}

/// `[data]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Episodes per exploratory policy.
    pub episodes_per_policy: usize,
    /// Seeds the collection.
    pub seed: u64,
}

/// `[model]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Model width.
    pub d_model: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
}

/// `[train]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExorlTrainSection {
    /// Optimizer steps per run.
    pub steps: usize,
    /// Trajectories per step: a step trains on `trajectories_per_step / k` chains, so that every
    /// configuration sees the same number of (state, action) pairs.
    pub trajectories_per_step: usize,
    /// Learning rate.
    pub lr: f64,
    /// Ring ranks.
    pub ranks: usize,
    /// Partition strategy by name.
    pub strategy: String,
}

/// `[[task]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    /// Task name.
    pub name: String,
    /// Control steps per decision (actions are held in between, in the data and in rollouts).
    pub interval: usize,
}

/// `[[config]]`: one compared configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSection {
    /// Its name in the table.
    pub name: String,
    /// Trajectories per chain.
    pub k: usize,
    /// Whether the target-return token carries the chain's best return (AT) or zero (BC).
    pub return_conditioned: bool,
}

impl ConfigSection {
    /// The return-to-go token a rollout conditions on: the data's best return, or 0 without conditioning.
    pub fn target(&self, best: f64) -> f32 {
        if self.return_conditioned {
            (best / EPISODE_STEPS as f64) as f32
        } else {
            0.0
        }
    }
}
