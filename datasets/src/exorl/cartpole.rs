//! Cartpole swing-up after dm_control's `cartpole.swingup` (Tassa et al. 2018, suite/cartpole.py and
//! cartpole.xml): a 1 kg cart on a rail, a 0.1 kg uniform 1 m pole, a 10 N force actuator, 0.01 s
//! control step, the pole starting down.
//!
//! Dynamics: the frictionless cart-pole equations of Florian (2007), "Correct equations for the
//! dynamics of the cart-pole system", integrated with RK4; the angle is measured from upright.
//! Reward (dm_control's smooth swing-up reward): `upright · centered · small_control · small_velocity`
//! with `upright = (cos θ + 1) / 2`, `centered = (1 + tol(x, margin 2)) / 2`,
//! `small_control = (4 + tol_quadratic(u, margin 1)) / 5`, `small_velocity = (1 + tol(θ̇, margin 5)) / 2`.

use super::reward::{near_zero, small_control};
use super::{Env, clip_action, rk4};
use crate::SplitMix64;
use std::f64::consts::PI;

const GRAVITY: f64 = 9.81;
const CART_MASS: f64 = 1.0;
const POLE_MASS: f64 = 0.1;
/// Half the pole's length (the distance from the hinge to its centre of mass).
const HALF_LENGTH: f64 = 0.5;
const FORCE_GEAR: f64 = 10.0;
const DT: f64 = 0.01;

/// State `[x, θ, ẋ, θ̇]`; observation `[x, cos θ, sin θ, ẋ, θ̇]` as dm_control's
/// `position` + `velocity`; physics = the state.
#[derive(Debug, Clone, Default)]
pub struct CartpoleSwingup {
    state: [f64; 4],
}

fn derivatives(s: &[f64; 4], force: f64) -> [f64; 4] {
    let [_, theta, xdot, thetadot] = *s;
    let (sin, cos) = theta.sin_cos();
    let total = CART_MASS + POLE_MASS;
    let temp = (force + POLE_MASS * HALF_LENGTH * thetadot * thetadot * sin) / total;
    let theta_acc =
        (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos * cos / total));
    let x_acc = temp - POLE_MASS * HALF_LENGTH * theta_acc * cos / total;
    [xdot, thetadot, x_acc, theta_acc]
}

impl Env for CartpoleSwingup {
    fn domain(&self) -> &'static str {
        "cartpole_swingup"
    }
    fn obs_dim(&self) -> usize {
        5
    }
    fn act_dim(&self) -> usize {
        1
    }
    fn phys_dim(&self) -> usize {
        4
    }

    fn reset(&mut self, rng: &mut SplitMix64) {
        // dm_control: cart at 0.01·N(0,1), pole at π + 0.01·N(0,1), velocities 0.01·N(0,1).
        self.state = [
            0.01 * rng.normal(),
            PI + 0.01 * rng.normal(),
            0.01 * rng.normal(),
            0.01 * rng.normal(),
        ];
    }

    fn observation(&self) -> Vec<f32> {
        let [x, theta, xdot, thetadot] = self.state;
        [x, theta.cos(), theta.sin(), xdot, thetadot]
            .map(|v| v as f32)
            .to_vec()
    }

    fn physics(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn step(&mut self, action: &[f32]) -> f32 {
        let u = clip_action(action[0]);
        self.state = rk4(self.state, DT, |s| derivatives(s, FORCE_GEAR * u));
        let [x, theta, _, thetadot] = self.state;
        let upright = (theta.cos() + 1.0) / 2.0;
        let centered = (1.0 + near_zero(x, 2.0)) / 2.0;
        let small_velocity = (1.0 + near_zero(thetadot, 5.0)) / 2.0;
        (upright * centered * small_control(&[u]) * small_velocity) as f32
    }

    /// Energy pumping (Åström & Furuta 2000) far from upright, a PD balance near it, and a random
    /// action with probability `1 - skill` at each decision.
    fn scripted_action(&self, skill: f64, rng: &mut SplitMix64) -> Vec<f32> {
        if rng.uniform() > skill {
            return vec![rng.uniform_in(-1.0, 1.0) as f32];
        }
        let [x, theta, xdot, thetadot] = self.state;
        let wrapped = (theta + PI).rem_euclid(2.0 * PI) - PI;
        let u = if wrapped.cos() > 0.85 {
            4.0 * wrapped + 0.8 * thetadot + 0.3 * x + 0.5 * xdot
        } else {
            let inertia = 4.0 / 3.0 * POLE_MASS * HALF_LENGTH * HALF_LENGTH;
            let energy = 0.5 * inertia * thetadot * thetadot
                + POLE_MASS * GRAVITY * HALF_LENGTH * (theta.cos() - 1.0);
            8.0 * energy * (thetadot * theta.cos()).signum() - 0.3 * x - 0.3 * xdot
        };
        vec![u.clamp(-1.0, 1.0) as f32]
    }
}
