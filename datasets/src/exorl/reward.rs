//! dm_control's `rewards.tolerance` (Tassa et al. 2018, dm_control/utils/rewards.py) for the two
//! sigmoids the tasks use: 1 inside `bounds`, falling off over `margin` outside them.

#[derive(Debug, Clone, Copy)]
pub(crate) enum Sigmoid {
    /// `exp(-½ (d·s)²)` with `s` chosen so that the value at `d = 1` is `value_at_margin`.
    Gaussian,
    /// `1 - (d·s)²` clipped at 0, with `s = sqrt(1 - value_at_margin)`.
    Quadratic,
}

pub(crate) fn tolerance(
    x: f64,
    bounds: (f64, f64),
    margin: f64,
    sigmoid: Sigmoid,
    value_at_margin: f64,
) -> f64 {
    let (lo, hi) = bounds;
    if (lo..=hi).contains(&x) {
        return 1.0;
    }
    if margin == 0.0 {
        return 0.0;
    }
    let d = if x < lo { lo - x } else { x - hi } / margin;
    match sigmoid {
        Sigmoid::Gaussian => {
            let scale = (-2.0 * value_at_margin.ln()).sqrt();
            (-0.5 * (d * scale).powi(2)).exp()
        }
        Sigmoid::Quadratic => {
            let scaled = d * (1.0 - value_at_margin).sqrt();
            if scaled.abs() < 1.0 {
                1.0 - scaled * scaled
            } else {
                0.0
            }
        }
    }
}

/// dm_control's default: a Gaussian that is 0.1 at the margin, bounds at 0.
pub(crate) fn near_zero(x: f64, margin: f64) -> f64 {
    tolerance(x, (0.0, 0.0), margin, Sigmoid::Gaussian, 0.1)
}

/// dm_control's control cost, mapped to `[0.8, 1]`: `(4 + tolerance(u, margin 1, quadratic, 0)) / 5`.
pub(crate) fn small_control(u: &[f64]) -> f64 {
    let mean = u
        .iter()
        .map(|&x| tolerance(x, (0.0, 0.0), 1.0, Sigmoid::Quadratic, 0.0))
        .sum::<f64>()
        / u.len().max(1) as f64;
    (4.0 + mean) / 5.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_matches_dm_control_definitions() {
        assert_eq!(near_zero(0.0, 2.0), 1.0);
        assert!((near_zero(2.0, 2.0) - 0.1).abs() < 1e-12);
        assert!((near_zero(-2.0, 2.0) - 0.1).abs() < 1e-12);
        assert!((small_control(&[1.0]) - 0.8).abs() < 1e-12);
        assert!((small_control(&[0.5]) - (4.0 + 0.75) / 5.0).abs() < 1e-12);
        assert_eq!(tolerance(0.3, (0.0, 0.5), 1.0, Sigmoid::Gaussian, 0.1), 1.0);
    }
}
