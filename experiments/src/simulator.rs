//! Discrete-event model of one ring pass (the paper's §3 overlap argument made executable).
//!
//! Rank r starts step s + 1 when its compute of step s is done and the block for step s + 1 has
//! arrived; that block left rank r − 1 (clockwise) when r − 1 started step s, and takes
//! latency + bytes / bandwidth to cross the link.

use crate::extremes::largest;

/// The outcome of one simulated pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Seconds from the first compute to the last rank's finish.
    pub makespan: f64,
    /// Per-rank sum of compute seconds.
    pub compute: Vec<f64>,
    /// makespan − the busiest rank's compute: communication nobody could hide.
    pub exposed_comm: f64,
    /// Busiest rank's compute over the makespan (1 = communication fully hidden).
    pub overlap_efficiency: f64,
}

/// Simulates `compute[r][s]` seconds of work on rank r at step s, with `link_seconds` per hop.
pub fn simulate(compute: &[Vec<f64>], link_seconds: f64) -> Simulation {
    let n = compute.len();
    let steps = compute.first().map_or(0, Vec::len);
    let mut start = vec![0.0f64; n];
    let mut end = vec![0.0f64; n];
    for s in 0..steps {
        for ((end, start), work) in end.iter_mut().zip(&start).zip(compute) {
            *end = start + work[s];
        }
        if s + 1 < steps {
            start = (0..n)
                .map(|r| {
                    let prev = (r + n - 1) % n;
                    let arrival = start[prev] + link_seconds;
                    largest([end[r], arrival]).unwrap_or(arrival)
                })
                .collect();
        }
    }
    // A NaN compute time makes a NaN makespan, never a finite one that leaves it out.
    let makespan = largest(end.iter().copied()).unwrap_or(0.0);
    let totals: Vec<f64> = compute.iter().map(|c| c.iter().sum()).collect();
    let busiest = largest(totals.iter().copied()).unwrap_or(0.0);
    Simulation {
        makespan,
        exposed_comm: largest([makespan - busiest, 0.0]).unwrap_or(0.0),
        overlap_efficiency: if makespan > 0.0 || makespan.is_nan() {
            busiest / makespan
        } else {
            1.0
        },
        compute: totals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_compute_time_makes_a_nan_makespan() {
        let mut work = vec![vec![1.0; 4]; 4];
        work[2][1] = f64::NAN;
        let sim = simulate(&work, 0.5);
        assert!(sim.makespan.is_nan(), "{sim:?}");
        assert!(sim.overlap_efficiency.is_nan(), "{sim:?}");
        assert!(sim.exposed_comm.is_nan(), "{sim:?}");
    }

    #[test]
    fn hidden_and_exposed_communication() {
        let even = vec![vec![1.0; 4]; 4];
        let fast_link = simulate(&even, 0.5);
        assert_eq!(fast_link.makespan, 4.0);
        assert_eq!(fast_link.exposed_comm, 0.0);
        // A link slower than compute sets the pace: the first step plus 3 hops of 2 s.
        let slow_link = simulate(&even, 2.0);
        assert_eq!(slow_link.makespan, 1.0 + 3.0 * 2.0);
        assert!((slow_link.overlap_efficiency - 4.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn a_slow_rank_delays_its_successors() {
        let mut work = vec![vec![1.0; 3]; 3];
        work[0][0] = 5.0;
        let sim = simulate(&work, 0.0);
        // Rank 0 finishes step 0 at 5 and everything downstream waits for it only through blocks
        // that leave at step starts, so only rank 0 itself is late.
        assert_eq!(sim.makespan, 7.0);
    }
}
