//! Point-mass reach after dm_control's `point_mass` (Tassa et al. 2018, suite/point_mass.py): a
//! damped 2-D point mass driven by two force actuators in a 0.6 m square arena, here with a random
//! target per episode (dm_control's target sits at the origin) so that the observation carries it.
//!
//! Dynamics: `m·p̈ = gear·u − damping·ṗ` per axis, RK4 with a 0.02 s control step; the walls stop the
//! mass (position clamped, the normal velocity zeroed). Reward as dm_control's:
//! `near_target · small_control` with `near_target = tol(|p − target|, bounds (0, size), margin)`.

use super::reward::{Sigmoid, small_control, tolerance};
use super::{Env, clip_action, rk4};
use crate::SplitMix64;

const MASS: f64 = 0.3;
const DAMPING: f64 = 1.0;
const GEAR: f64 = 1.0;
const ARENA: f64 = 0.3;
const TARGET_SIZE: f64 = 0.02;
const TARGET_MARGIN: f64 = 0.1;
const DT: f64 = 0.02;

/// State `[px, py, vx, vy]` and the target; observation `[px, py, vx, vy, tx − px, ty − py]`;
/// physics `[px, py, vx, vy, tx, ty]`.
#[derive(Debug, Clone, Default)]
pub struct PointMassReach {
    state: [f64; 4],
    target: [f64; 2],
}

impl Env for PointMassReach {
    fn domain(&self) -> &'static str {
        "point_mass_reach"
    }
    fn obs_dim(&self) -> usize {
        6
    }
    fn act_dim(&self) -> usize {
        2
    }
    fn phys_dim(&self) -> usize {
        6
    }

    fn reset(&mut self, rng: &mut SplitMix64) {
        let mut position = || rng.uniform_in(-ARENA, ARENA);
        self.state = [position(), position(), 0.0, 0.0];
        self.target = [position(), position()];
    }

    fn observation(&self) -> Vec<f32> {
        let [px, py, vx, vy] = self.state;
        let [tx, ty] = self.target;
        [px, py, vx, vy, tx - px, ty - py]
            .map(|v| v as f32)
            .to_vec()
    }

    fn physics(&self) -> Vec<f64> {
        let [px, py, vx, vy] = self.state;
        vec![px, py, vx, vy, self.target[0], self.target[1]]
    }

    fn step(&mut self, action: &[f32]) -> f32 {
        let u = [clip_action(action[0]), clip_action(action[1])];
        let mut s = rk4(self.state, DT, |s| {
            [
                s[2],
                s[3],
                (GEAR * u[0] - DAMPING * s[2]) / MASS,
                (GEAR * u[1] - DAMPING * s[3]) / MASS,
            ]
        });
        for axis in 0..2 {
            if s[axis].abs() > ARENA {
                s[axis] = s[axis].clamp(-ARENA, ARENA);
                s[axis + 2] = 0.0;
            }
        }
        self.state = s;
        let distance = (s[0] - self.target[0]).hypot(s[1] - self.target[1]);
        let near = tolerance(
            distance,
            (0.0, TARGET_SIZE),
            TARGET_MARGIN,
            Sigmoid::Gaussian,
            0.1,
        );
        (near * small_control(&u)) as f32
    }

    /// A PD controller towards the target with a random action with probability `1 - skill`.
    fn scripted_action(&self, skill: f64, rng: &mut SplitMix64) -> Vec<f32> {
        if rng.uniform() > skill {
            return (0..2).map(|_| rng.uniform_in(-1.0, 1.0) as f32).collect();
        }
        (0..2)
            .map(|axis| {
                let error = self.target[axis] - self.state[axis];
                (6.0 * error - 0.8 * self.state[axis + 2]).clamp(-1.0, 1.0) as f32
            })
            .collect()
    }
}
