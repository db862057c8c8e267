//! The ring's simulated time for a layout: which rank's keys a rank holds at each step, the steps a
//! pass needs (it stops once no rank can see the blocks further along, as the engine does), each
//! (rank, step)'s visible pairs, and the discrete-event model of one pass that turns them into a
//! makespan (the paper's §3 overlap argument made executable). A model whose layers mask differently
//! takes the sum over its layers ([`workload_time`]). The `balance` experiments report this time and
//! the `balanced` strategy minimizes it: one definition for both.
//!
//! Rank r starts step s + 1 when its compute of step s is done and the block for step s + 1 has
//! arrived; that block left rank r − 1 (clockwise) when r − 1 started step s, and takes the link's
//! seconds to cross.

use crate::Layout;
use crate::partition::{RingCosts, Workload};
use crate::visibility::{Mask, Window, visible_pairs, windows};

/// The rank whose keys rank `rank` holds at step `step` of a clockwise ring of `world` ranks (blocks
/// travel to rank + 1).
pub fn cw_owner(rank: usize, step: usize, world: usize) -> usize {
    (rank + world - step % world) % world
}

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

/// The larger of two numbers, NaN if either is (`f64::max` would drop it).
fn larger(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// When each rank starts each step of the pass `simulate` models: `starts[r][s]` seconds after the
/// pass began (rank r starts step s + 1 once its step s is computed and the block that left rank
/// r − 1 at its step s has crossed the link). The timeline the overlap figure draws.
pub fn step_starts(compute: &[Vec<f64>], link_seconds: f64) -> Vec<Vec<f64>> {
    let n = compute.len();
    let steps = compute.first().map_or(0, Vec::len);
    let mut starts = vec![Vec::with_capacity(steps); n];
    let mut start = vec![0.0f64; n];
    // `s` is a column of every rank's row, not an index into one slice.
    #[allow(clippy::needless_range_loop)]
    for s in 0..steps {
        for (mine, at) in starts.iter_mut().zip(&start) {
            mine.push(*at);
        }
        if s + 1 < steps {
            start = (0..n)
                .map(|r| {
                    let end = start[r] + compute[r][s];
                    larger(end, start[(r + n - 1) % n] + link_seconds)
                })
                .collect();
        }
    }
    starts
}

/// Simulates `compute[r][s]` seconds of work on rank r at step s, with `link_seconds` per hop. A NaN
/// compute time makes a NaN makespan, never a finite one that leaves it out.
pub fn simulate(compute: &[Vec<f64>], link_seconds: f64) -> Simulation {
    let starts = step_starts(compute, link_seconds);
    let end: Vec<f64> = starts
        .iter()
        .zip(compute)
        .map(|(at, work)| at.last().map_or(0.0, |last| last + work[at.len() - 1]))
        .collect();
    let makespan = end.iter().copied().fold(0.0, larger);
    let totals: Vec<f64> = compute.iter().map(|c| c.iter().sum()).collect();
    let busiest = totals.iter().copied().fold(0.0, larger);
    Simulation {
        makespan,
        exposed_comm: larger(makespan - busiest, 0.0),
        overlap_efficiency: if makespan > 0.0 || makespan.is_nan() {
            busiest / makespan
        } else {
            1.0
        },
        compute: totals,
    }
}

/// A layout's pass under a workload: each (rank, step)'s visible pairs and the steps run.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    /// `pairs[r][s]`: visible (q, k) pairs of rank r's queries against the keys it holds at step s,
    /// for the steps run.
    pub pairs: Vec<Vec<u64>>,
    /// Steps run: one past the last at which some rank sees its block (at least 1).
    pub steps: usize,
}

impl Pass {
    /// The pass of `layout` over documents `doc_lens` under `mask` (clockwise).
    pub fn of(layout: &Layout, doc_lens: &[usize], mask: Mask) -> Pass {
        let win: Vec<Vec<Window>> = layout
            .positions
            .iter()
            .map(|mine| windows(mine, layout.seq_len, doc_lens, mask))
            .collect();
        let n = layout.ranks();
        let all: Vec<Vec<u64>> = (0..n)
            .map(|r| {
                (0..n)
                    .map(|s| visible_pairs(&win[r], &layout.positions[cw_owner(r, s, n)]))
                    .collect()
            })
            .collect();
        Pass::from_pairs(all)
    }

    /// The pass of every step's pairs `all[r][s]` (s < N): cut after the last step anyone sees.
    pub fn from_pairs(mut all: Vec<Vec<u64>>) -> Pass {
        let n = all.len();
        let steps = (0..n)
            .rev()
            .find(|&s| all.iter().any(|row| row[s] > 0))
            .map_or(1, |last| last + 1);
        for row in &mut all {
            row.truncate(steps);
        }
        Pass { pairs: all, steps }
    }

    /// The simulated pass with `costs`.
    pub fn simulate(&self, costs: &RingCosts) -> Simulation {
        let c = costs;
        let compute: Vec<Vec<f64>> = self
            .pairs
            .iter()
            .map(|row| row.iter().map(|&p| p as f64 * c.seconds_per_pair).collect())
            .collect();
        simulate(&compute, c.link_seconds)
    }
}

/// The simulated seconds of one layer of `layout` under `mask` with `workload`'s documents and
/// costs: its forward pass, and its backward's when the workload has one.
pub fn makespan(layout: &Layout, workload: &Workload, mask: Mask) -> f64 {
    let pass = Pass::of(layout, workload.doc_lens, mask);
    workload
        .passes()
        .map(|costs| pass.simulate(costs).makespan)
        .sum()
}

/// The simulated seconds of one forward (and backward, when the workload trains) through every
/// layer of `workload`: each mask's layer time times the layers that attend by it, summed (layers
/// run one after another).
pub fn workload_time(layout: &Layout, workload: &Workload) -> f64 {
    workload
        .masks
        .iter()
        .map(|m| m.layers as f64 * makespan(layout, workload, m.mask))
        .sum()
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
    fn each_step_starts_when_its_block_has_arrived_and_the_last_is_computed() {
        let mut work = vec![vec![1.0; 3]; 3];
        work[0][0] = 5.0;
        // Rank 1's step 1 waits for the block rank 0 sent at 0 over a 2 s link (it arrives at 2),
        // rank 0's for its own slow step 0 (done at 5); rank 1's step 2 for the block rank 0 sent
        // when it started its step 1, at 5 (it arrives at 7).
        let starts = step_starts(&work, 2.0);
        assert_eq!(
            starts,
            vec![
                vec![0.0, 5.0, 6.0],
                vec![0.0, 2.0, 7.0],
                vec![0.0, 2.0, 4.0]
            ]
        );
        let sim = simulate(&work, 2.0);
        assert_eq!(sim.makespan, 8.0);
        assert_eq!(step_starts(&[], 1.0), Vec::<Vec<f64>>::new());
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

    #[test]
    fn a_pass_stops_after_the_last_step_anyone_sees() {
        // Causal, contiguous on 4 ranks: rank r sees ranks 0..=r, so every step is needed; a window
        // of one block: only the own block and the one before.
        let layout = crate::Partition::layout(&crate::Contiguous, 16, 4).unwrap();
        assert_eq!(Pass::of(&layout, &[], Mask::causal(true)).steps, 4);
        let windowed = Mask {
            causal: true,
            window: Some(4),
        };
        let pass = Pass::of(&layout, &[], windowed);
        assert_eq!(pass.steps, 2);
        // Rank 1 at step 1 holds rank 0's keys 0..4 and its queries 4..8 see 1 + 2 + 3 of them.
        assert_eq!(pass.pairs[1], [10, 6]);
    }

    #[test]
    fn a_model_of_several_masks_sums_its_layers_passes() {
        let layout = crate::Partition::layout(&crate::Contiguous, 16, 4).unwrap();
        let windowed = Mask {
            causal: true,
            window: Some(4),
        };
        let costs = RingCosts::at_the_knee(4);
        let single = |mask| workload_time(&layout, &Workload::single(&[], mask, costs));
        // Gemma 3's 5 windowed layers to 1 full one, in any order.
        let mut layers = vec![windowed; 5];
        layers.insert(2, Mask::causal(true));
        let gemma = Workload::of_layers(&[], layers, costs);
        assert_eq!(gemma.masks.len(), 2);
        assert_eq!(gemma.check("test"), Ok(6));
        let summed = workload_time(&layout, &gemma);
        assert_eq!(summed, 5.0 * single(windowed) + single(Mask::causal(true)));
        assert!(single(windowed) < single(Mask::causal(true)));
        // Training adds each layer's backward, over the same blocks.
        let backward_costs = RingCosts {
            seconds_per_pair: 2.5,
            link_seconds: 2.0 * costs.link_seconds,
        };
        let training = Workload {
            backward: Some(backward_costs),
            ..gemma.clone()
        };
        let backward = |mask| {
            Pass::of(&layout, &[], mask)
                .simulate(&backward_costs)
                .makespan
        };
        assert_eq!(
            workload_time(&layout, &training),
            5.0 * (single(windowed) + backward(windowed))
                + (single(Mask::causal(true)) + backward(Mask::causal(true)))
        );
        let empty = Workload::of_layers(&[], [], costs);
        assert_eq!(
            empty.check("test"),
            Err(crate::PartitionError::NoLayers { strategy: "test" })
        );
    }
}
