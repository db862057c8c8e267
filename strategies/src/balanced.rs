//! `balanced`: a layout solver for any mask. The sequence is cut into equal chunks (`chunks_per_rank`
//! a rank; by default the most, up to 8, that divide a rank's share) and the chunks are assigned to
//! ranks to minimize the ring's simulated time ([`crate::ring_time`]) for the workload's documents,
//! window, causality and costs. It trades balance against the steps a pass needs: a windowed or
//! packed mask keeps a rank's chunks near each other so the ring stops early, a plain causal one
//! spreads them.
//!
//! The solve: three starts (contiguous and zig-zag as chunk assignments, and a longest-processing-
//! time greedy that gives each chunk, heaviest first, to the least loaded rank with room), each
//! improved by the best swap of a chunk of the busiest rank with a chunk of one of the least loaded
//! ranks while a swap shortens the simulated pass; then the fastest of those and of the fixed layouts
//! the length also accepts at token granularity (striped; zig-zag when its chunks do not line up with
//! ours), so it is never slower than they are. Every rank holds the same number of chunks (equal
//! shards, as NCCL needs). Deterministic.

use crate::partition::{Layout, Partition, Workload, check_ranks, require_divisible};
use crate::ring_time::{Pass, cw_owner, simulate};
use crate::visibility::windows;
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
                    let time = Pass::of(&layout, workload).simulate(workload).makespan;
                    consider(time, layout.positions);
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
        Ok(self.solve(seq_len, ranks, workload))
    }
}

/// The chunks' work: `pairs[i · k + j]` visible pairs of chunk i's queries against chunk j's keys.
struct Problem<'a> {
    ranks: usize,
    /// Chunks a rank holds.
    per_rank: usize,
    /// Chunks.
    k: usize,
    /// Tokens a chunk.
    size: usize,
    pairs: Vec<u64>,
    workload: &'a Workload<'a>,
}

impl<'a> Problem<'a> {
    fn new(seq_len: usize, ranks: usize, per_rank: usize, workload: &'a Workload<'a>) -> Self {
        let k = ranks * per_rank;
        let size = seq_len / k;
        let mut pairs = vec![0u64; k * k];
        // Per query window, whole key chunks inside it get `size` each (a difference array over
        // chunks) and the chunks at its ends what they hold of it.
        for i in 0..k {
            let queries: Vec<usize> = (i * size..(i + 1) * size).collect();
            let row = &mut pairs[i * k..(i + 1) * k];
            let mut whole = vec![0i64; k + 1];
            for w in windows(&queries, seq_len, workload.doc_lens, workload.mask) {
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
        Problem {
            ranks,
            per_rank,
            k,
            size,
            pairs,
            workload,
        }
    }

    /// Chunk i's queries against chunk j's keys.
    fn w(&self, i: usize, j: usize) -> u64 {
        self.pairs[i * self.k + j]
    }

    /// The starts: contiguous chunks, zig-zag chunks (when a rank's chunks split in two), and the
    /// longest-processing-time greedy; each as the chunks of every rank.
    fn starts(&self) -> Vec<Vec<Vec<usize>>> {
        let (n, m) = (self.ranks, self.per_rank);
        let contiguous = (0..n).map(|r| (r * m..(r + 1) * m).collect()).collect();
        let mut starts = vec![contiguous];
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
        let mut by_work: Vec<(u64, usize)> = (0..self.k)
            .map(|i| ((0..self.k).map(|j| self.w(i, j)).sum(), i))
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

/// An assignment and what it costs: `queries[r][j]`, rank r's queries against chunk j's keys, and
/// `steps[r][s]`, its pairs at step s.
struct State<'a> {
    problem: &'a Problem<'a>,
    chunks: Vec<Vec<usize>>,
    queries: Vec<Vec<u64>>,
    steps: Vec<Vec<u64>>,
}

impl<'a> State<'a> {
    fn new(problem: &'a Problem<'a>, chunks: Vec<Vec<usize>>) -> Self {
        let k = problem.k;
        let queries = chunks
            .iter()
            .map(|mine| {
                (0..k)
                    .map(|j| mine.iter().map(|&i| problem.w(i, j)).sum())
                    .collect()
            })
            .collect();
        let mut state = State {
            problem,
            chunks,
            queries,
            steps: Vec::new(),
        };
        state.steps = (0..problem.ranks).map(|r| state.row(r)).collect();
        state
    }

    /// Rank r's pairs at every step.
    fn row(&self, r: usize) -> Vec<u64> {
        let n = self.problem.ranks;
        (0..n)
            .map(|s| {
                self.chunks[cw_owner(r, s, n)]
                    .iter()
                    .map(|&j| self.queries[r][j])
                    .sum()
            })
            .collect()
    }

    /// The simulated seconds of this assignment's pass.
    fn time(&self) -> f64 {
        let pass = Pass::from_pairs(self.steps.clone());
        let costs = self.problem.workload.costs;
        let compute: Vec<Vec<f64>> = pass
            .pairs
            .iter()
            .map(|row| {
                row.iter()
                    .map(|&p| p as f64 * costs.seconds_per_pair)
                    .collect()
            })
            .collect();
        simulate(&compute, costs.link_seconds).makespan
    }

    /// Swaps chunk slot `a` of rank `p` with slot `b` of rank `q` (its own inverse).
    fn swap(&mut self, (p, a): Slot, (q, b): Slot) {
        let n = self.problem.ranks;
        let (x, y) = (self.chunks[p][a], self.chunks[q][b]);
        self.chunks[p][a] = y;
        self.chunks[q][b] = x;
        for j in 0..self.problem.k {
            let (wx, wy) = (self.problem.w(x, j), self.problem.w(y, j));
            self.queries[p][j] = self.queries[p][j] + wy - wx;
            self.queries[q][j] = self.queries[q][j] + wx - wy;
        }
        // As keys: every rank holding p's or q's block at some step.
        for r in 0..n {
            if r == p || r == q {
                continue;
            }
            let (sp, sq) = ((r + n - p) % n, (r + n - q) % n);
            self.steps[r][sp] = self.steps[r][sp] + self.queries[r][y] - self.queries[r][x];
            self.steps[r][sq] = self.steps[r][sq] + self.queries[r][x] - self.queries[r][y];
        }
        self.steps[p] = self.row(p);
        self.steps[q] = self.row(q);
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
            let totals: Vec<u64> = self.steps.iter().map(|row| row.iter().sum()).collect();
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
    use crate::ring_time::makespan;
    use crate::{Contiguous, work_per_rank};

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
            let w = windows(&chunk(i), 32, &docs, workload.mask);
            for j in 0..8 {
                assert_eq!(
                    problem.w(i, j),
                    crate::visible_pairs(&w, &chunk(j)),
                    "chunks {i}, {j}"
                );
            }
        }
    }

    #[test]
    fn a_swap_updates_the_steps_as_a_recount_would() {
        let workload = Workload::causal(&[9, 23], Some(10), 8);
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
        let pass = Pass::of(&layout, &workload);
        let cut = Pass::from_pairs(state.steps.clone());
        assert_eq!(pass, cut);
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
                let ours = makespan(&layout, &workload);
                for fixed in [&Contiguous as &dyn Partition, &Striped] {
                    let theirs = makespan(&fixed.layout(512, ranks).unwrap(), &workload);
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
        let plain = Workload::causal(&[], None, 256);
        let layout = Balanced::default().layout_for(2048, 8, &plain).unwrap();
        let work = work_per_rank(&layout, &[], plain.mask);
        let (max, min) = (work.iter().max().unwrap(), work.iter().min().unwrap());
        assert!(*max as f64 <= 1.02 * *min as f64, "{work:?}");
        // A window of 1/16 of the sequence: a few steps, not all 8.
        let windowed = Workload::causal(&[], Some(128), 256);
        let layout = Balanced::default().layout_for(2048, 8, &windowed).unwrap();
        assert!(Pass::of(&layout, &windowed).steps < 8);
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
