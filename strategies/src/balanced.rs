//! `balanced`: a layout solver for any mask. The sequence is cut into equal chunks (`chunks_per_rank`
//! a rank; by default the most, up to 8, that divide a rank's share) and the chunks are assigned to
//! ranks to minimize the ring's simulated time ([`crate::ring_time`]) for the workload's documents,
//! masks, causality and costs, summed over the model's layers when they mask differently. It trades
//! balance against the steps a pass needs: a windowed or packed mask keeps a rank's chunks near each
//! other so the ring stops early, a plain causal one spreads them, and a model mixing the two (Gemma's
//! local and global layers) gets one layout for both.
//!
//! The solve: four starts (contiguous, zig-zag and chunk-striped (chunk c on rank c mod N: a window
//! no wider than a chunk needs 2 steps while the causal work spreads) as chunk assignments, and a
//! longest-processing-time greedy that gives each chunk, heaviest first, to the least loaded rank
//! with room), each
//! improved by the best swap of a chunk of the busiest rank with a chunk of one of the least loaded
//! ranks while a swap shortens the simulated pass; then the fastest of those and of the fixed layouts
//! the length also accepts at token granularity (striped; zig-zag when its chunks do not line up with
//! ours), so it is never slower than they are. Every rank holds the same number of chunks (equal
//! shards, as NCCL needs). Deterministic.

use crate::partition::{Layout, Partition, Workload, check_ranks, require_divisible};
use crate::ring_time::{Pass, cw_owner, workload_time};
use crate::visibility::{Mask, windows};
use crate::{PartitionError, Striped, ZigZag};

/// The most chunks a rank gets by default.
pub const MAX_CHUNKS_PER_RANK: usize = 8;
/// Above this many (token, rank) pairs (S · N), the token-level fixed layouts are not simulated (it
/// would take longer than the solve).
const FIXED_CHECK_LIMIT: usize = 1 << 24;
/// Improvement rounds from one start, at most.
const MAX_ROUNDS: usize = 64;
/// The least loaded ranks a round tries swaps with.
const PARTNERS: usize = 4;

/// Chunks assigned to ranks to minimize the ring's simulated time for the actual mask.
#[derive(Debug, Clone, Copy, Default)]
pub struct Balanced {
    /// Chunks a rank holds; `None`: the most, up to `MAX_CHUNKS_PER_RANK` (8), that divide a rank's
    /// share of the sequence.
    pub chunks_per_rank: Option<usize>,
}

impl Balanced {
    /// Chunks a rank holds for `seq_len` tokens over `ranks` ranks (`seq_len` validated).
    pub fn chunks_per_rank(&self, seq_len: usize, ranks: usize) -> usize {
        let share = seq_len / ranks.max(1);
        self.chunks_per_rank.unwrap_or_else(|| {
            (1..=MAX_CHUNKS_PER_RANK.min(share.max(1)))
                .rev()
                .find(|m| share.is_multiple_of(*m))
                .unwrap_or(1)
        })
    }

    /// The solved layout (after validation).
    fn solve(&self, seq_len: usize, ranks: usize, workload: &Workload) -> Layout {
        let m = self.chunks_per_rank(seq_len, ranks);
        let problem = Problem::new(seq_len, ranks, m, workload);
        let mut best: Option<(f64, Vec<Vec<usize>>)> = None;
        let mut consider = |time: f64, positions: Vec<Vec<usize>>| {
            if best.as_ref().is_none_or(|(t, _)| time < *t) {
                best = Some((time, positions));
            }
        };
        for start in problem.starts() {
            let mut state = State::new(&problem, start);
            state.improve();
            consider(state.time(), problem.positions(&state.chunks));
        }
        if seq_len * ranks <= FIXED_CHECK_LIMIT {
            let mut fixed: Vec<&dyn Partition> = vec![&Striped];
            if !m.is_multiple_of(2) {
                fixed.push(&ZigZag);
            }
            for partition in fixed {
                if let Ok(layout) = partition.layout(seq_len, ranks) {
                    consider(workload_time(&layout, workload), layout.positions);
                }
            }
        }
        let (_, positions) = best.expect("at least one start");
        Layout {
            strategy: self.name(),
            seq_len,
            positions,
        }
    }
}

impl Partition for Balanced {
    fn name(&self) -> &'static str {
        "balanced"
    }

    /// Lengths `ranks · chunks_per_rank` divides (with the default, any multiple of `ranks`).
    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), PartitionError> {
        check_ranks(ranks)?;
        if seq_len < ranks {
            return Err(PartitionError::TooShort {
                strategy: self.name(),
                seq_len,
                min: ranks,
            });
        }
        match self.chunks_per_rank {
            None => require_divisible(self.name(), seq_len, ranks, "ranks"),
            Some(m) => {
                require_divisible(self.name(), seq_len, ranks * m, "ranks * chunks_per_rank")
            }
        }
    }

    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        self.owned_positions_packed(seq_len, &[], ranks, rank)
    }

    fn owned_positions_packed(
        &self,
        seq_len: usize,
        doc_lens: &[usize],
        ranks: usize,
        rank: usize,
    ) -> Vec<usize> {
        let workload = Workload::causal(doc_lens, None, seq_len / ranks);
        self.solve(seq_len, ranks, &workload)
            .positions
            .swap_remove(rank)
    }

    /// A causal pass over the documents at the knee ([`Workload::causal`]).
    fn layout_packed(
        &self,
        seq_len: usize,
        doc_lens: &[usize],
        ranks: usize,
    ) -> Result<Layout, PartitionError> {
        let workload = Workload::causal(doc_lens, None, seq_len / ranks.max(1));
        self.layout_for(seq_len, ranks, &workload)
    }

    fn layout(&self, seq_len: usize, ranks: usize) -> Result<Layout, PartitionError> {
        self.layout_packed(seq_len, &[], ranks)
    }

    fn layout_for(
        &self,
        seq_len: usize,
        ranks: usize,
        workload: &Workload,
    ) -> Result<Layout, PartitionError> {
        self.validate_packed(seq_len, workload.doc_lens, ranks)?;
        workload.check(self.name())?;
        Ok(self.solve(seq_len, ranks, workload))
    }
}

/// One mask's chunk work: `pairs[i · k + j]` visible pairs of chunk i's queries against chunk j's
/// keys, and how many layers attend by it.
struct MaskWork {
    pairs: Vec<u64>,
    layers: usize,
}

/// The chunks' work under every mask of the workload.
struct Problem<'a> {
    ranks: usize,
    /// Chunks a rank holds.
    per_rank: usize,
    /// Chunks.
    k: usize,
    /// Tokens a chunk.
    size: usize,
    masks: Vec<MaskWork>,
    workload: &'a Workload<'a>,
}

/// Visible pairs of every chunk's queries against every chunk's keys under `mask`: per query window,
/// whole key chunks inside it get `size` each (a difference array over chunks) and the chunks at its
/// ends what they hold of it.
fn chunk_pairs(seq_len: usize, k: usize, doc_lens: &[usize], mask: Mask) -> Vec<u64> {
    let size = seq_len / k;
    let mut pairs = vec![0u64; k * k];
    for i in 0..k {
        let queries: Vec<usize> = (i * size..(i + 1) * size).collect();
        let row = &mut pairs[i * k..(i + 1) * k];
        let mut whole = vec![0i64; k + 1];
        for w in windows(&queries, seq_len, doc_lens, mask) {
            let (first, last) = (w.lo / size, w.hi / size);
            if first == last {
                row[first] += (w.hi - w.lo + 1) as u64;
                continue;
            }
            row[first] += ((first + 1) * size - w.lo) as u64;
            row[last] += (w.hi - last * size + 1) as u64;
            if first + 1 < last {
                whole[first + 1] += size as i64;
                whole[last] -= size as i64;
            }
        }
        let mut running = 0i64;
        for (cell, step) in row.iter_mut().zip(&whole) {
            running += step;
            *cell += running as u64;
        }
    }
    pairs
}

impl<'a> Problem<'a> {
    fn new(seq_len: usize, ranks: usize, per_rank: usize, workload: &'a Workload<'a>) -> Self {
        let k = ranks * per_rank;
        let masks = workload
            .masks
            .iter()
            .filter(|m| m.layers > 0)
            .map(|m| MaskWork {
                pairs: chunk_pairs(seq_len, k, workload.doc_lens, m.mask),
                layers: m.layers,
            })
            .collect();
        Problem {
            ranks,
            per_rank,
            k,
            size: seq_len / k,
            masks,
            workload,
        }
    }

    /// Chunk i's queries against chunk j's keys under mask `m`.
    fn w(&self, m: usize, i: usize, j: usize) -> u64 {
        self.masks[m].pairs[i * self.k + j]
    }

    /// The starts: contiguous chunks, zig-zag chunks (when a rank's chunks split in two),
    /// chunk-striped (when a rank has several), and the longest-processing-time greedy; each as the
    /// chunks of every rank.
    fn starts(&self) -> Vec<Vec<Vec<usize>>> {
        let (n, m) = (self.ranks, self.per_rank);
        let contiguous = (0..n).map(|r| (r * m..(r + 1) * m).collect()).collect();
        let mut starts = vec![contiguous];
        if m > 1 {
            starts.push(
                (0..n)
                    .map(|r| (0..m).map(|i| i * n + r).collect())
                    .collect(),
            );
        }
        if m.is_multiple_of(2) {
            let half = m / 2;
            starts.push(
                (0..n)
                    .map(|r| {
                        let mirror = 2 * n - 1 - r;
                        (r * half..(r + 1) * half)
                            .chain(mirror * half..(mirror + 1) * half)
                            .collect()
                    })
                    .collect(),
            );
        }
        // A chunk's work: its pairs under every mask, times the layers that attend by it.
        let mut by_work: Vec<(u64, usize)> = (0..self.k)
            .map(|i| {
                let work = (0..self.masks.len())
                    .map(|m| {
                        self.masks[m].layers as u64
                            * (0..self.k).map(|j| self.w(m, i, j)).sum::<u64>()
                    })
                    .sum();
                (work, i)
            })
            .collect();
        by_work.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut greedy: Vec<Vec<usize>> = vec![Vec::with_capacity(m); n];
        let mut load = vec![0u64; n];
        for (work, chunk) in by_work {
            let rank = (0..n)
                .filter(|&r| greedy[r].len() < m)
                .min_by_key(|&r| (load[r], r))
                .expect("room for every chunk");
            greedy[rank].push(chunk);
            load[rank] += work;
        }
        starts.push(greedy);
        starts
    }

    /// Each rank's positions, ascending, of the chunks `chunks[r]`.
    fn positions(&self, chunks: &[Vec<usize>]) -> Vec<Vec<usize>> {
        chunks
            .iter()
            .map(|mine| {
                let mut sorted = mine.clone();
                sorted.sort_unstable();
                sorted
                    .iter()
                    .flat_map(|&c| c * self.size..(c + 1) * self.size)
                    .collect()
            })
            .collect()
    }
}

/// A rank and the index of one of its chunks.
type Slot = (usize, usize);

/// An assignment and what it costs under each mask m: `queries[m][r][j]`, rank r's queries
/// against chunk j's keys, and `steps[m][r][s]`, its pairs at step s.
struct State<'a> {
    problem: &'a Problem<'a>,
    chunks: Vec<Vec<usize>>,
    queries: Vec<Vec<Vec<u64>>>,
    steps: Vec<Vec<Vec<u64>>>,
}

impl<'a> State<'a> {
    fn new(problem: &'a Problem<'a>, chunks: Vec<Vec<usize>>) -> Self {
        let k = problem.k;
        let queries = (0..problem.masks.len())
            .map(|m| {
                chunks
                    .iter()
                    .map(|mine| {
                        (0..k)
                            .map(|j| mine.iter().map(|&i| problem.w(m, i, j)).sum())
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let mut state = State {
            problem,
            chunks,
            queries,
            steps: Vec::new(),
        };
        state.steps = (0..problem.masks.len())
            .map(|m| (0..problem.ranks).map(|r| state.row(m, r)).collect())
            .collect();
        state
    }

    /// Rank r's pairs at every step under mask m.
    fn row(&self, m: usize, r: usize) -> Vec<u64> {
        let n = self.problem.ranks;
        (0..n)
            .map(|s| {
                self.chunks[cw_owner(r, s, n)]
                    .iter()
                    .map(|&j| self.queries[m][r][j])
                    .sum()
            })
            .collect()
    }

    /// The simulated seconds of this assignment: each mask's pass times its layers, summed.
    fn time(&self) -> f64 {
        let workload = self.problem.workload;
        self.steps
            .iter()
            .zip(&self.problem.masks)
            .map(|(steps, mask)| {
                let pass = Pass::from_pairs(steps.clone());
                let layer: f64 = workload
                    .passes()
                    .map(|costs| pass.simulate(costs).makespan)
                    .sum();
                mask.layers as f64 * layer
            })
            .sum()
    }

    /// Rank r's pairs over a pass, weighted by the layers of each mask.
    fn load(&self, r: usize) -> u64 {
        self.steps
            .iter()
            .zip(&self.problem.masks)
            .map(|(steps, mask)| mask.layers as u64 * steps[r].iter().sum::<u64>())
            .sum()
    }

    /// Swaps chunk slot `a` of rank `p` with slot `b` of rank `q` (its own inverse).
    fn swap(&mut self, (p, a): Slot, (q, b): Slot) {
        let n = self.problem.ranks;
        let (x, y) = (self.chunks[p][a], self.chunks[q][b]);
        self.chunks[p][a] = y;
        self.chunks[q][b] = x;
        for m in 0..self.problem.masks.len() {
            let k = self.problem.k;
            let pairs = &self.problem.masks[m].pairs;
            let (row_x, row_y) = (&pairs[x * k..(x + 1) * k], &pairs[y * k..(y + 1) * k]);
            for (j, (wx, wy)) in row_x.iter().zip(row_y).enumerate() {
                let queries = &mut self.queries[m];
                queries[p][j] = queries[p][j] + wy - wx;
                queries[q][j] = queries[q][j] + wx - wy;
            }
            // As keys: every rank holding p's or q's block at some step.
            for r in 0..n {
                if r == p || r == q {
                    continue;
                }
                let (sp, sq) = ((r + n - p) % n, (r + n - q) % n);
                let (qx, qy) = (self.queries[m][r][x], self.queries[m][r][y]);
                let steps = &mut self.steps[m][r];
                steps[sp] = steps[sp] + qy - qx;
                steps[sq] = steps[sq] + qx - qy;
            }
            self.steps[m][p] = self.row(m, p);
            self.steps[m][q] = self.row(m, q);
        }
    }

    /// Applies the best swap between the busiest rank and the least loaded ones while it shortens
    /// the pass.
    fn improve(&mut self) {
        let n = self.problem.ranks;
        if n < 2 {
            return;
        }
        let mut time = self.time();
        for _ in 0..MAX_ROUNDS {
            let totals: Vec<u64> = (0..n).map(|r| self.load(r)).collect();
            let busiest = (0..n).max_by_key(|&r| (totals[r], n - r)).expect("ranks");
            let mut lightest: Vec<usize> = (0..n).filter(|&r| r != busiest).collect();
            lightest.sort_by_key(|&r| (totals[r], r));
            lightest.truncate(PARTNERS);
            let m = self.problem.per_rank;
            let mut best: Option<(f64, Slot, Slot)> = None;
            for &q in &lightest {
                for a in 0..m {
                    for b in 0..m {
                        self.swap((busiest, a), (q, b));
                        let t = self.time();
                        self.swap((busiest, a), (q, b));
                        if t < best.map_or(time, |(bt, _, _)| bt) {
                            best = Some((t, (busiest, a), (q, b)));
                        }
                    }
                }
            }
            match best {
                Some((t, from, to)) if t < time * (1.0 - 1e-9) => {
                    self.swap(from, to);
                    time = t;
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Contiguous, RingCosts, ZigZag, work_per_rank};

    /// Every position exactly once, the same number on every rank.
    fn assert_partition(layout: &Layout) {
        let mut all: Vec<usize> = layout.positions.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..layout.seq_len).collect::<Vec<_>>());
        let len = layout.positions[0].len();
        assert!(layout.positions.iter().all(|p| p.len() == len));
    }

    #[test]
    fn chunk_pairs_equal_the_visibility_rules_count() {
        let docs = [5, 20, 7];
        let workload = Workload::causal(&docs, Some(6), 8);
        let problem = Problem::new(32, 2, 4, &workload);
        let chunk = |c: usize| (c * 4..(c + 1) * 4).collect::<Vec<_>>();
        for i in 0..8 {
            let w = windows(&chunk(i), 32, &docs, workload.masks[0].mask);
            for j in 0..8 {
                assert_eq!(
                    problem.w(0, i, j),
                    crate::visible_pairs(&w, &chunk(j)),
                    "chunks {i}, {j}"
                );
            }
        }
    }

    #[test]
    fn a_swap_updates_the_steps_as_a_recount_would() {
        // Two masks: windowed layers and full ones, 3 to 1.
        let window = Mask {
            causal: true,
            window: Some(10),
        };
        let layers = [window, window, Mask::causal(true), window];
        let workload = Workload::of_layers(&[9, 23], layers, RingCosts::at_the_knee(8));
        let problem = Problem::new(32, 4, 2, &workload);
        let mut state = State::new(&problem, problem.starts().pop().unwrap());
        state.swap((1, 0), (3, 1));
        state.swap((0, 1), (2, 0));
        let recount = State::new(&problem, state.chunks.clone());
        assert_eq!(state.steps, recount.steps);
        assert_eq!(state.queries, recount.queries);
        // And the steps equal the engine's rule on the positions.
        let layout = Layout {
            strategy: "balanced",
            seq_len: 32,
            positions: problem.positions(&state.chunks),
        };
        for (m, masked) in workload.masks.iter().enumerate() {
            let pass = Pass::of(&layout, workload.doc_lens, masked.mask);
            assert_eq!(pass, Pass::from_pairs(state.steps[m].clone()));
        }
        assert_eq!(state.time(), workload_time(&layout, &workload));
    }

    #[test]
    fn never_slower_than_contiguous_or_striped_and_a_true_partition() {
        for (docs, window) in [
            (vec![], None),
            (vec![], Some(64)),
            (vec![300, 20, 120, 8, 64], None),
            (vec![100, 412], Some(16)),
        ] {
            for ranks in [1, 2, 4, 8] {
                let workload = Workload::causal(&docs, window, 512 / ranks);
                let layout = Balanced::default()
                    .layout_for(512, ranks, &workload)
                    .unwrap();
                assert_partition(&layout);
                let ours = workload_time(&layout, &workload);
                for fixed in [&Contiguous as &dyn Partition, &Striped] {
                    let theirs = workload_time(&fixed.layout(512, ranks).unwrap(), &workload);
                    assert!(
                        ours <= theirs * (1.0 + 1e-12),
                        "{docs:?} {window:?} N={ranks}: {ours} against {} {theirs}",
                        fixed.name()
                    );
                }
            }
        }
    }

    #[test]
    fn plain_causal_is_balanced_and_a_window_keeps_the_ring_short() {
        // Compute-bound (a link 10× faster than a block's compute): balance is what counts. (At the
        // knee the pass is link-bound and a slightly less even layout can finish first.)
        let fast_link = RingCosts {
            seconds_per_pair: 1.0,
            link_seconds: 0.1 * 256.0 * 256.0,
        };
        let plain = Workload::single(&[], Mask::causal(true), fast_link);
        let layout = Balanced::default().layout_for(2048, 8, &plain).unwrap();
        let work = work_per_rank(&layout, &[], plain.masks[0].mask);
        let (max, min) = (work.iter().max().unwrap(), work.iter().min().unwrap());
        assert!(*max as f64 <= 1.02 * *min as f64, "{work:?}");
        // A window of 1/16 of the sequence: a few steps, not all 8.
        let windowed = Workload::causal(&[], Some(128), 256);
        let layout = Balanced::default().layout_for(2048, 8, &windowed).unwrap();
        assert!(Pass::of(&layout, &[], windowed.masks[0].mask).steps < 8);
    }

    #[test]
    fn one_layout_for_windowed_and_full_layers_beats_every_fixed_one() {
        // Gemma 2's 1:1 and Gemma 3's 5:1, a window of 1/32 of the sequence: contiguous is best for
        // the windowed layers, zig-zag for the full ones, and one layout must serve both.
        let window = Mask {
            causal: true,
            window: Some(64),
        };
        for windowed_per_full in [1, 5] {
            let mut layers = vec![window; windowed_per_full];
            layers.push(Mask::causal(true));
            let workload = Workload::of_layers(&[], layers, RingCosts::at_the_knee(512));
            let layout = Balanced::default().layout_for(2048, 4, &workload).unwrap();
            assert_partition(&layout);
            let ours = workload_time(&layout, &workload);
            for fixed in [&Contiguous as &dyn Partition, &Striped, &ZigZag] {
                let theirs = workload_time(&fixed.layout(2048, 4).unwrap(), &workload);
                assert!(
                    ours < 0.99 * theirs,
                    "{windowed_per_full}:1: balanced {ours} against {} {theirs}",
                    fixed.name()
                );
            }
        }
        let none = Workload::of_layers(&[], [], RingCosts::at_the_knee(512));
        assert_eq!(
            Balanced::default().layout_for(2048, 4, &none),
            Err(PartitionError::NoLayers {
                strategy: "balanced"
            })
        );
    }

    #[test]
    fn lengths_and_granularity() {
        let b = Balanced::default();
        assert_eq!(b.chunks_per_rank(4096, 8), 8);
        assert_eq!(b.chunks_per_rank(40, 8), 5);
        assert!(b.validate(40, 8).is_ok());
        assert!(matches!(
            b.validate(41, 8),
            Err(PartitionError::NotDivisible { .. })
        ));
        assert!(matches!(
            b.validate(3, 4),
            Err(PartitionError::TooShort { .. })
        ));
        let fixed = Balanced {
            chunks_per_rank: Some(4),
        };
        assert!(fixed.validate(40, 4).is_err());
        assert!(fixed.validate(48, 4).is_ok());
    }
}
