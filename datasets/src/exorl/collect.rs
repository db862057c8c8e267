//! Exploratory data collection, the way ExoRL gathers its buffers with unsupervised agents: here
//! uniform random actions, Ornstein–Uhlenbeck correlated noise, and a scripted controller whose skill
//! varies per episode so that returns spread out. A policy picks an action every `interval` control
//! steps and holds it in between (the decision rate the Agentic Transformer later acts at).

use super::{EPISODE_STEPS, Env, Episode, Matrix};
use crate::SplitMix64;

/// An exploratory behaviour policy, as ExoRL's unsupervised agents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Uniform actions in `[-1, 1]`.
    Random,
    /// `a ← 0.85·a + 0.5·N(0, 1)` per decision, clipped to `[-1, 1]`.
    OuNoise,
    /// The task's controller with skill uniform in `[0.2, 1]` per episode.
    Scripted,
}

impl Policy {
    /// Every policy, in the order collection uses them.
    pub const ALL: [Policy; 3] = [Policy::Random, Policy::OuNoise, Policy::Scripted];

    /// ExoRL's `<algo>` folder name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::OuNoise => "ou_noise",
            Policy::Scripted => "scripted",
        }
    }
}

/// `<YYYYmmddTHHMMSS>_<idx>_<len>.npz`. The timestamp is a fixed date plus `idx` seconds, so that a
/// rerun with the same seed writes the same file names.
pub fn episode_file_name(idx: usize, len: usize) -> String {
    let (h, m, s) = (idx / 3600 % 24, idx / 60 % 60, idx % 60);
    format!("20260101T{h:02}{m:02}{s:02}_{idx}_{len}.npz")
}

/// Runs `episodes` episodes of `policy` on `env`; episode `i` uses the seed `(seed, i)`.
pub fn collect(
    env: &mut dyn Env,
    policy: Policy,
    episodes: usize,
    interval: usize,
    seed: u64,
) -> Vec<Episode> {
    (0..episodes)
        .map(|i| {
            let mut rng = SplitMix64::stream(seed, i as u64);
            run_episode(env, policy, interval.max(1), &mut rng)
        })
        .collect()
}

fn run_episode(
    env: &mut dyn Env,
    policy: Policy,
    interval: usize,
    rng: &mut SplitMix64,
) -> Episode {
    env.reset(rng);
    let (obs_dim, act_dim, phys_dim) = (env.obs_dim(), env.act_dim(), env.phys_dim());
    let rows = EPISODE_STEPS + 1;
    let mut observation = Vec::with_capacity(rows * obs_dim);
    let mut action = Vec::with_capacity(rows * act_dim);
    let mut physics = Vec::with_capacity(rows * phys_dim);
    let mut reward = Vec::with_capacity(rows);
    observation.extend(env.observation());
    action.extend(std::iter::repeat_n(0.0, act_dim));
    physics.extend(env.physics());
    reward.push(0.0);
    let skill = rng.uniform_in(0.2, 1.0);
    let mut held = vec![0.0f32; act_dim];
    for step in 0..EPISODE_STEPS {
        if step % interval == 0 {
            held = match policy {
                Policy::Random => (0..act_dim)
                    .map(|_| rng.uniform_in(-1.0, 1.0) as f32)
                    .collect(),
                Policy::OuNoise => held
                    .iter()
                    .map(|&a| (0.85 * f64::from(a) + 0.5 * rng.normal()).clamp(-1.0, 1.0) as f32)
                    .collect(),
                Policy::Scripted => env.scripted_action(skill, rng),
            };
        }
        reward.push(env.step(&held));
        observation.extend(env.observation());
        action.extend(&held);
        physics.extend(env.physics());
    }
    Episode {
        observation: Matrix::new(rows, obs_dim, observation),
        action: Matrix::new(rows, act_dim, action),
        discount: vec![1.0; rows],
        reward,
        physics: Matrix::new(rows, phys_dim, physics),
    }
}
