//! The per-rank context shared by forward and backward: the communicator, the layout and what its
//! positions hold, each query's visible window, what a rank measured; and a rank's rows of a
//! sequence ([`RingContext::shard`]). The ring's options are in `options.rs`.

use crate::error::RingError;
use crate::host::HostRead;
pub use crate::kernels::Kernel;
use crate::kernels::mask::{Mask, Window, windows};
use crate::ring::ledger::Ledger;
pub use crate::ring::options::{Attend, BackwardScheme, Direction, RingConfig};
pub use crate::ring::sequence::{Sequence, gather_rows};
use crate::trace::{Recorder, Track};
use crate::transport::{Comm, Group, Traffic, run_ranks_with};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use serde_json::json;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use strategies::{Layout, Partition};

/// Work done by one rank in one ring step, for measurement and simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEvent {
    /// Forward or backward.
    pub phase: crate::transport::Phase,
    /// The ring step (0 is the rank's own block).
    pub step: usize,
    /// Rank whose block was combined with this rank's at this step.
    pub peer_block: usize,
    /// Visible (q, k) pairs summed over batch and heads.
    pub pairs: u64,
    /// FLOPs of the tile ([`crate::kernels::flops`]).
    pub flops: u64,
    /// Seconds the tile took.
    pub compute_seconds: f64,
}

/// One rank's view of a ring: its communicator, the layout, the options, and what it measured.
///
/// Shared (behind `Arc`) by the forward call and its autodiff backward, which may run later.
#[derive(Debug)]
pub struct RingContext {
    /// The ring's options.
    pub config: RingConfig,
    /// Which global positions each rank owns.
    pub layout: Arc<Layout>,
    /// What the positions hold: real tokens in documents, then padding.
    sequence: Arc<Sequence>,
    /// The key window of every rank's every query ([`crate::kernels::mask::windows`]) under each
    /// mask asked for so far, each made when first asked for.
    windows: Mutex<Vec<(Mask, Windows)>>,
    rank: usize,
    /// The ranks of this ring, in ring order (every rank of the communicator but under head × context
    /// parallelism, where it is this rank's column of the grid).
    group: Group,
    comm: Arc<Mutex<Comm>>,
    events: Mutex<Vec<StepEvent>>,
    backward_error: Mutex<Option<RingError>>,
    ledger: Arc<Ledger>,
    /// Test hook: the forward step whose tile reads all-NaN values.
    poisoned_step: Option<usize>,
    /// Head × context parallelism: this rank's Ulysses group and the ring its attention runs on.
    heads: Option<HeadParallel>,
    /// Where its tiles' events go while a trace records (`crate::trace`), and its world rank.
    trace: Option<(Arc<Recorder>, usize)>,
}

/// A rank's place in a grid of head × context parallelism ([`RingContext::grid`]): its Ulysses group
/// and the ring it runs with its column (`ring/ulysses.rs` exchanges the heads around that ring).
#[derive(Debug)]
pub(crate) struct HeadParallel {
    /// The ranks holding the pieces of this rank's ring shard, in piece order.
    pub(crate) group: Group,
    /// The ring over whole shards, among the ranks with this rank's member index.
    pub(crate) ring: Arc<RingContext>,
}

/// What every context of one rank shares, and builds contexts from.
struct Shared {
    config: RingConfig,
    comm: Arc<Mutex<Comm>>,
    ledger: Arc<Ledger>,
    /// The world rank.
    rank: usize,
    /// The world's ranks.
    world: usize,
}

impl Shared {
    /// The context of this rank on `ring_layout` with Ulysses degree `ulysses` (rank counts checked
    /// by the caller), its positions holding `sequence`.
    fn build(
        &self,
        ring_layout: Arc<Layout>,
        ulysses: usize,
        sequence: Arc<Sequence>,
        poisoned_step: Option<usize>,
    ) -> Result<RingContext, RingError> {
        let context = |layout, rank, group, heads| RingContext {
            config: self.config,
            layout,
            sequence: sequence.clone(),
            windows: Mutex::default(),
            rank,
            group,
            comm: self.comm.clone(),
            events: Mutex::new(Vec::new()),
            backward_error: Mutex::new(None),
            ledger: self.ledger.clone(),
            poisoned_step,
            heads,
            trace: crate::trace::current().map(|r| (r, self.rank)),
        };
        // The model's spans on this thread name its rank (a rank's context is made on its thread).
        crate::trace::set_thread_rank(self.rank);
        let needs_equal_shards = lock(&self.comm).needs_equal_shards();
        if let Some(transport) = needs_equal_shards {
            let lens: Vec<usize> = (0..ring_layout.ranks())
                .map(|r| ring_layout.shard_len(r))
                .collect();
            if lens.iter().min() != lens.iter().max() {
                return Err(RingError::UnequalShards {
                    transport,
                    strategy: ring_layout.strategy,
                    lens,
                });
            }
        }
        let world = Group::world(self.rank, self.world);
        if ulysses == 1 {
            return Ok(context(ring_layout, self.rank, world, None));
        }
        let layout = Arc::new(ring_layout.split_ranks(ulysses)?);
        let (shard, member) = (self.rank / ulysses, self.rank % ulysses);
        let group = |members: Vec<usize>| {
            Group::of(members, self.rank).expect("a rank is a member of its grid row and column")
        };
        let ring_group = group(
            (0..ring_layout.ranks())
                .map(|s| s * ulysses + member)
                .collect(),
        );
        let ulysses_group = group((0..ulysses).map(|m| shard * ulysses + m).collect());
        let ring = context(ring_layout, shard, ring_group, None);
        let heads = HeadParallel {
            group: ulysses_group,
            ring: Arc::new(ring),
        };
        Ok(context(layout, self.rank, world, Some(heads)))
    }
}

/// An error unless `world` ranks make a grid of `ring` × `ulysses`.
fn check_grid_ranks(world: usize, ring: usize, ulysses: usize) -> Result<(), RingError> {
    if ulysses == 0 {
        return Err(RingError::Ulysses {
            ulysses,
            ranks: world,
            rule: "the Ulysses degree must be at least 1".into(),
        });
    }
    if world != ring * ulysses {
        return Err(RingError::WorldMismatch {
            world,
            layout: ring * ulysses,
        });
    }
    Ok(())
}

impl RingContext {
    /// This rank's context over `comm`; the transport's and the layout's rank counts must agree.
    pub fn new(comm: Comm, layout: Arc<Layout>, config: RingConfig) -> Result<Self, RingError> {
        Self::grid(comm, layout, config, 1)
    }

    /// This rank's context on a grid of `ring_layout.ranks() × ulysses` ranks (head × context
    /// parallelism): world rank `r` is member `r % ulysses` of Ulysses group `r / ulysses`, which
    /// holds ring shard `r / ulysses` of `ring_layout` in `ulysses` consecutive pieces
    /// ([`Layout::split_ranks`]); the ranks with the same member index form a ring over the shards.
    /// Each attention call turns the group's sequence pieces into head shards (an all-to-all), runs
    /// the ring on its heads, and turns the results back. `ulysses = 1` is the ring alone.
    pub fn grid(
        comm: Comm,
        ring_layout: Arc<Layout>,
        config: RingConfig,
        ulysses: usize,
    ) -> Result<Self, RingError> {
        let (rank, world) = (comm.rank(), comm.world());
        check_grid_ranks(world, ring_layout.ranks(), ulysses)?;
        let sequence = Arc::new(Sequence::unpadded(ring_layout.seq_len));
        let shared = Shared {
            config,
            comm: Arc::new(Mutex::new(comm)),
            ledger: Arc::default(),
            rank,
            world,
        };
        shared.build(ring_layout, ulysses, sequence, None)
    }

    /// The parts every context of this rank shares.
    fn shared(&self) -> Shared {
        Shared {
            config: self.config,
            comm: self.comm.clone(),
            ledger: self.ledger.clone(),
            rank: self.rank,
            world: self.group.size(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The bytes this rank's engine holds: live, and the peak since the last reset.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The Ulysses degree: how many ranks share each ring shard, by heads (1: the ring alone).
    pub fn ulysses(&self) -> usize {
        self.heads.as_ref().map_or(1, |h| h.group.size())
    }

    /// The ranks of each ring: all of them, divided by the Ulysses degree.
    pub fn ring_ranks(&self) -> usize {
        self.heads
            .as_ref()
            .map_or(self.layout.ranks(), |h| h.ring.layout.ranks())
    }

    /// Under head × context parallelism, this rank's Ulysses group and its ring.
    pub(crate) fn heads(&self) -> Option<&HeadParallel> {
        self.heads.as_ref()
    }

    /// A context over another layout sharing this one's communicator (its tags and traffic), ledger
    /// and Ulysses degree; `layout` is the ring's (over [`RingContext::ring_ranks`] ranks). Its
    /// positions hold one unpadded document ([`RingContext::with_sequence`] says otherwise).
    pub fn with_layout(&self, layout: Arc<Layout>) -> Result<Self, RingError> {
        let ulysses = self.ulysses();
        check_grid_ranks(self.world(), layout.ranks(), ulysses)?;
        // A new layout holds a new sequence: one document, no padding, until `with_sequence`.
        let sequence = Arc::new(Sequence::unpadded(layout.seq_len));
        self.shared().build(layout, ulysses, sequence, None)
    }

    /// The layout the ring runs on: this context's own, or, under head × context parallelism, the
    /// ring's over whole shards.
    fn ring_layout(&self) -> Arc<Layout> {
        self.heads
            .as_ref()
            .map_or_else(|| self.layout.clone(), |h| h.ring.layout.clone())
    }

    /// This context over a layout whose positions hold `sequence`: its documents mask attention
    /// between them, and positions at or past its length are padding that no real query sees.
    pub fn with_sequence(self, sequence: Sequence) -> Result<Self, RingError> {
        sequence.check(self.layout.seq_len)?;
        self.shared().build(
            self.ring_layout(),
            self.ulysses(),
            Arc::new(sequence),
            self.poisoned_step,
        )
    }

    /// Test hook ([`FaultKind::PoisonTile`](crate::ring::jobs::FaultKind::PoisonTile)): the forward
    /// tile of ring step `step` reads values that are all NaN.
    pub fn with_poisoned_tile(self, step: usize) -> Self {
        let rebuilt = self.shared().build(
            self.ring_layout(),
            self.ulysses(),
            self.sequence.clone(),
            Some(step),
        );
        rebuilt.expect("the same layout and sequence built this context")
    }

    /// Whether the forward tile of ring step `step` is poisoned (a test hook).
    pub(crate) fn poisons(&self, step: usize) -> bool {
        self.poisoned_step == Some(step)
    }

    /// What the positions hold.
    pub fn sequence(&self) -> &Sequence {
        &self.sequence
    }

    /// Every rank's query windows (`[rank][local query]`) under `mask`, made once per mask.
    pub fn windows(&self, mask: Mask) -> Windows {
        let mut made = lock(&self.windows);
        if let Some((_, windows)) = made.iter().find(|(m, _)| *m == mask) {
            return windows.clone();
        }
        let windows: Windows = Arc::new(all_windows(&self.layout, &self.sequence, mask));
        made.push((mask, windows.clone()));
        windows
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.layout.ranks()
    }

    /// The global positions `rank` owns, in local order.
    pub fn positions(&self, rank: usize) -> &[usize] {
        &self.layout.positions[rank]
    }

    /// The ranks of this ring.
    pub fn group(&self) -> &Group {
        &self.group
    }

    pub(crate) fn comm(&self) -> MutexGuard<'_, Comm> {
        lock(&self.comm)
    }

    /// What this rank has sent so far.
    pub fn traffic(&self) -> Traffic {
        self.comm().traffic().clone()
    }

    /// What this rank has sent, handing it over and starting afresh.
    pub fn take_traffic(&self) -> Traffic {
        self.comm().take_traffic()
    }

    /// Records a step's event, its tile having begun at `start` with its mask `mask` (`skipped`,
    /// `full`, `masked`: its trace event, when a trace records, spans the same `compute_seconds`).
    pub(crate) fn record(&self, event: StepEvent, (start, mask): (Instant, &'static str)) {
        if let Some((recorder, pid)) = &self.trace {
            let name = match event.phase {
                crate::transport::Phase::Forward => "tile fwd",
                crate::transport::Phase::Backward => "tile bwd",
                _ => "tile decode",
            };
            let args = json!({"step": event.step, "peer_block": event.peer_block, "mask": mask,
                "pairs": event.pairs, "flops": event.flops});
            let seconds = event.compute_seconds;
            recorder.complete(
                (*pid, Track::Compute),
                (name.into(), "compute"),
                start,
                seconds,
                args,
            );
        }
        lock(&self.events).push(event);
    }

    /// Records a span of this rank's compute track that began at `start` (a merge, a finish),
    /// when a trace records.
    pub(crate) fn traced(&self, name: &str, start: Instant) {
        if let Some((recorder, pid)) = &self.trace {
            let seconds = start.elapsed().as_secs_f64();
            let at = (*pid, Track::Compute);
            recorder.complete(at, (name.into(), "compute"), start, seconds, json!({}));
        }
    }

    /// This rank's step events, handing them over.
    pub fn take_events(&self) -> Vec<StepEvent> {
        if let Some(heads) = &self.heads {
            return heads.ring.take_events();
        }
        std::mem::take(&mut *lock(&self.events))
    }

    /// An autodiff backward cannot return an error; it parks it here for the caller of `backward()`.
    pub(crate) fn set_backward_error(&self, error: RingError) {
        lock(&self.backward_error).get_or_insert(error);
    }

    /// The error of the last backward pass, if it failed (its gradients are then zeros).
    pub fn take_backward_error(&self) -> Option<RingError> {
        let ring = self
            .heads
            .as_ref()
            .and_then(|h| h.ring.take_backward_error());
        lock(&self.backward_error).take().or(ring)
    }

    /// Runs a collective on this rank's communicator (gradient all-reduce, barrier).
    pub fn with_comm<T>(&self, f: impl FnOnce(&mut Comm) -> T) -> T {
        f(&mut self.comm())
    }

    /// This rank's rows of host values `global` laid out `[batch, len, width]` in global order:
    /// `[batch, t, width]` in this rank's local order; a position at or past `len` (padding) is a row
    /// of `T::default()`.
    pub fn shard_rows<T: Copy + Default>(
        &self,
        global: &[T],
        batch: usize,
        width: usize,
    ) -> Vec<T> {
        gather_rows(global, batch, width, self.positions(self.rank))
    }

    /// This rank's rows of `global` (`[batch, seq, ...]` in global order, the same tensor on every
    /// rank): `[batch, t, ...]` in this rank's local order, positions at or past `seq` (padding)
    /// zero rows. A gather on the tensor's device, differentiable: what a model's inputs and
    /// targets are on a rank.
    pub fn shard<B: Backend, const D: usize>(&self, global: Tensor<B, D>) -> Tensor<B, D> {
        let device = global.device();
        let seq = global.dims()[1];
        let positions = self.positions(self.rank);
        let padded = positions.iter().any(|&p| p >= seq);
        let global = if padded {
            let mut pad = global.dims();
            pad[1] = self.layout.seq_len.max(seq + 1) - seq;
            Tensor::cat(vec![global, Tensor::zeros(pad, &device)], 1)
        } else {
            global
        };
        let rows: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
        let index =
            Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [positions.len()]), &device);
        global.select(1, index)
    }

    /// Every rank's rows put back in global order: each rank gives its `[batch, t, ...]` shard (as
    /// [`RingContext::shard`] made it) and gets the whole `[batch, seq, ...]`, padding dropped. A
    /// collective (every rank calls it), on host copies: for outputs, not for gradients.
    pub fn unshard<B: HostRead, const D: usize>(
        &self,
        local: Tensor<B, D>,
        seq: usize,
    ) -> Result<Tensor<B, D>, RingError> {
        let device = local.device();
        let dims = local.dims();
        let (batch, width) = (dims[0], dims[2..].iter().product::<usize>());
        let mut global = vec![0.0f32; batch * seq * width];
        let mine = crate::host::read(local);
        for (b, rows) in mine.chunks(dims[1] * width).enumerate() {
            for (&p, row) in self.positions(self.rank).iter().zip(rows.chunks(width)) {
                if p < seq {
                    let at = (b * seq + p) * width;
                    global[at..at + width].copy_from_slice(row);
                }
            }
        }
        // Each position belongs to one rank: a sum of the scattered rows is their gather (adding
        // zeros is exact).
        self.with_comm(|c| c.all_reduce_sum(&mut global))?;
        let mut shape = dims;
        shape[1] = seq;
        Ok(crate::host::place(global, shape, &device))
    }
}

/// Runs `work` on one in-process rank holding all `len` positions in order, with ring options
/// `config`: a single device's attention through the same engine (prediction, evaluation).
pub fn on_one_rank<T>(
    len: usize,
    config: RingConfig,
    timeout: Duration,
    work: impl FnOnce(&Arc<RingContext>) -> Result<T, RingError> + Send,
) -> Result<T, RingError>
where
    T: Send,
{
    let layout = Arc::new(strategies::Contiguous.layout(len, 1)?);
    let work = std::sync::Mutex::new(Some(work));
    let mut results = run_ranks_with(1, timeout, None, |comm| {
        let ctx = Arc::new(RingContext::new(comm, layout.clone(), config)?);
        let work = work
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .expect("one rank runs the work once");
        work(&ctx)
    });
    results.remove(0)
}

/// Every rank's query windows, `[rank][local query]`.
pub type Windows = Arc<Vec<Vec<Window>>>;

/// Every rank's query windows of `layout` over `sequence` under `mask`.
pub(crate) fn all_windows(layout: &Layout, sequence: &Sequence, mask: Mask) -> Vec<Vec<Window>> {
    layout
        .positions
        .iter()
        .map(|p| windows(p, sequence.len, &sequence.doc_lens, mask))
        .collect()
}

/// A poisoned lock only means another holder panicked; the data (counters, logs) stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
