//! A task's offline data as the Agentic Transformer sees it: trajectories at the decision rate, the
//! observation normalizer, chains of trajectories as token rows, and training batches.

use super::spec::ConfigSection;
use crate::extremes::largest;
use anyhow::{Result, ensure};
use datasets::SplitMix64;
use datasets::exorl::{Episode, episode_files, read_episode};
use std::path::Path;
use workbench::model::agentic::{AgenticConfig, TokenKind};
use workbench::train::agentic::ChainBatch;

/// One episode seen at the agent's decision rate: the state before each decision, the held action,
/// and the reward over the interval divided by its length (so in `[0, 1]`).
#[derive(Debug, Clone)]
pub struct Trajectory {
    pub states: Vec<Vec<f32>>,
    pub actions: Vec<Vec<f32>>,
    pub rewards: Vec<f32>,
    pub total: f64,
}

pub fn trajectory(e: &Episode, interval: usize) -> Trajectory {
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
pub struct Dataset {
    pub trajectories: Vec<Trajectory>,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub best: f64,
    pub interval: usize,
    /// Decisions in the longest trajectory.
    pub decisions: usize,
}

impl Dataset {
    pub fn load(dir: &Path, interval: usize) -> Result<Self> {
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
        let best = largest(trajectories.iter().map(|t| t.total)).unwrap_or(0.0);
        Ok(Self {
            trajectories,
            mean: mean.iter().map(|&m| m as f32).collect(),
            std,
            best,
            interval,
            decisions,
        })
    }

    pub fn normalize(&self, obs: &[f32]) -> Vec<f32> {
        obs.iter()
            .zip(self.mean.iter().zip(&self.std))
            .map(|(x, (m, s))| (x - m) / s)
            .collect()
    }

    /// `k` distinct trajectories drawn with `rng`, sorted by return ascending.
    pub fn chain(&self, k: usize, rng: &mut SplitMix64) -> Vec<&Trajectory> {
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
pub fn chain_rows(
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

pub fn batch_for(
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
        let best = largest(chain.iter().map(|t| t.total)).unwrap_or(0.0);
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
