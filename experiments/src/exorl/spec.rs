//! `experiments/exorl.toml`: the data, model, training, tasks and configurations of the Table 5 analog.

use datasets::exorl::EPISODE_STEPS;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    pub fn target(&self, best: f64) -> f32 {
        if self.return_conditioned {
            (best / EPISODE_STEPS as f64) as f32
        } else {
            0.0
        }
    }
}
