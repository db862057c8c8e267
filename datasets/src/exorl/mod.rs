//! ExoRL-style offline RL at workbench scale (the paper's §5.3 / Table 5 setting): two dm_control-style
//! continuous-control tasks in Rust, exploratory data collection, and episodes stored exactly as ExoRL
//! stores them (`datasets/<domain>/<algo>/buffer/<YYYYmmddTHHMMSS>_<idx>_<len>.npz`).

mod buffer;
mod cartpole;
mod collect;
mod point_mass;
mod reward;

pub use buffer::{Episode, ExorlError, Matrix, episode_files, read_episode, write_episode};
pub use cartpole::CartpoleSwingup;
pub use collect::{Policy, collect, episode_file_name};
pub use point_mass::PointMassReach;

use crate::SplitMix64;

/// Control steps per episode, as in dm_control and ExoRL.
pub const EPISODE_STEPS: usize = 1000;

/// A deterministic continuous-control task: actions in `[-1, 1]^act_dim`, rewards in `[0, 1]`.
pub trait Env: Send {
    /// ExoRL's domain folder name.
    fn domain(&self) -> &'static str;
    /// Length of an observation.
    fn obs_dim(&self) -> usize;
    /// Length of an action.
    fn act_dim(&self) -> usize;
    /// Length of the physics state.
    fn phys_dim(&self) -> usize;
    /// Starts an episode from a state drawn with `rng`.
    fn reset(&mut self, rng: &mut SplitMix64);
    /// What the agent sees now.
    fn observation(&self) -> Vec<f32>;
    /// The full physics state (positions, velocities, and any task state such as a target).
    fn physics(&self) -> Vec<f64>;
    /// Applies `action` (clipped to `[-1, 1]`) for one control step; returns the reward.
    fn step(&mut self, action: &[f32]) -> f32;
    /// A controller of partial skill: `skill` in `[0, 1]` (1 = the best this controller does).
    fn scripted_action(&self, skill: f64, rng: &mut SplitMix64) -> Vec<f32>;
}

/// The tasks by name: `cartpole_swingup`, `point_mass_reach`.
pub const TASKS: [&str; 2] = ["cartpole_swingup", "point_mass_reach"];

/// A fresh environment of `task` (one of [`TASKS`]), or an error naming the known ones.
pub fn make_env(task: &str) -> Result<Box<dyn Env>, ExorlError> {
    match task {
        "cartpole_swingup" => Ok(Box::new(CartpoleSwingup::default())),
        "point_mass_reach" => Ok(Box::new(PointMassReach::default())),
        other => Err(ExorlError::UnknownTask {
            task: other.to_owned(),
            known: TASKS.join(", "),
        }),
    }
}

/// One classical Runge–Kutta step of `dx/dt = f(x)`.
pub(crate) fn rk4<const N: usize>(
    x: [f64; N],
    dt: f64,
    f: impl Fn(&[f64; N]) -> [f64; N],
) -> [f64; N] {
    let add = |a: &[f64; N], b: &[f64; N], s: f64| std::array::from_fn(|i| a[i] + s * b[i]);
    let k1 = f(&x);
    let k2 = f(&add(&x, &k1, dt / 2.0));
    let k3 = f(&add(&x, &k2, dt / 2.0));
    let k4 = f(&add(&x, &k3, dt));
    std::array::from_fn(|i| x[i] + dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]))
}

pub(crate) fn clip_action(a: f32) -> f64 {
    f64::from(a.clamp(-1.0, 1.0))
}
