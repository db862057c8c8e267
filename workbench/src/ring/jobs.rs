//! One attention job on N in-process ranks: shard global arrays, run the ring, gather the results.
//!
//! This is what `ringbench attn` and the exactness test table run.

use crate::error::{RingError, all_or_root_cause};
use crate::host;
use crate::kernels::Travelling;
use crate::ring::context::{RingConfig, RingContext, Sequence, StepEvent, all_windows};
use crate::ring::engine::{backward_route, pass_exchanges, steps_needed};
use crate::ring::op::{
    GRID_BACKWARD_ALL_TO_ALLS, GRID_FORWARD_ALL_TO_ALLS, RingBackend, ring_attention_with,
};
use crate::transport::{Comm, Exchanges, Link, Traffic, run_ranks_with};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use std::sync::Arc;
use std::time::Duration;
use strategies::{Layout, Partition};

use super::accounts::RankAccounts;
pub use super::fault::{Fault, FaultKind};
pub use super::host_tensor::HostTensor;
use super::host_tensor::{gather_rank, scatter_rank};

/// Inputs in the (batch, seq, heads, head_dim) layout NumPy and PyTorch users have.
#[derive(Debug, Clone)]
pub struct AttentionJob<'a> {
    /// Queries `[batch, seq, heads, head_dim]`.
    pub q: &'a HostTensor,
    /// Keys `[batch, seq, kv_heads, head_dim]`.
    pub k: &'a HostTensor,
    /// Values, shaped like the keys.
    pub v: &'a HostTensor,
    /// The output's gradient, shaped like the queries; `None`: forward only.
    pub d_out: Option<&'a HostTensor>,
    /// Ranks to run.
    pub ranks: usize,
    /// Head × context parallelism: groups of this many ranks split the heads (Ulysses) and the
    /// `ranks / ulysses` groups form the rings ([`RingContext::grid`]); 1: the ring alone.
    pub ulysses: usize,
    /// Which positions each rank owns (in a grid: each ring's shards).
    pub strategy: &'a dyn Partition,
    /// The ring's options.
    pub config: RingConfig,
    /// How long a rank waits for a silent peer.
    pub timeout: Duration,
    /// Fault injection for tests.
    pub fault: Option<Fault>,
    /// Rate-limits the in-process links (overlap experiments); `None`: channels at memory speed.
    pub link: Option<Link>,
    /// Packed documents: their lengths laid end to end, summing to the sequence length; a query
    /// attends only within its document. Empty: one document.
    pub doc_lens: &'a [usize],
    /// Attention sinks: one logit per query head, joining every row's softmax denominator.
    pub sinks: Option<&'a [f32]>,
}

/// Gradients with respect to q, k, v, in the inputs' layout.
#[derive(Debug, Clone)]
pub struct Grads {
    /// Queries' gradient.
    pub dq: HostTensor,
    /// Keys' gradient.
    pub dk: HostTensor,
    /// Values' gradient.
    pub dv: HostTensor,
    /// With sinks: their gradient `[heads]`.
    pub dsinks: Option<Vec<f32>>,
}

#[derive(Debug, Clone)]
/// What a job computed, in the inputs' layout, with what each rank sent and did.
pub struct AttentionResult {
    /// `[b, s, h, d]`.
    pub out: HostTensor,
    /// `[b, h, s]`, natural log.
    pub lse: HostTensor,
    /// With `d_out`: the gradients.
    pub grads: Option<Grads>,
    /// Per rank (under MPI too: every rank's, gathered).
    pub traffic: Vec<Traffic>,
    /// Per rank (under MPI too: every rank's, gathered).
    pub events: Vec<Vec<StepEvent>>,
    /// The ranks this process ran: all of them in thread mode, its own under MPI.
    pub ranks_here: Vec<usize>,
    /// The length the ranks split: the input's, or the next one the strategy accepts (padding).
    pub padded_len: usize,
    /// What computed the tiles (`cpu-fused`, `cubecl-fused`, `generic`:
    /// [`crate::kernels::implementation`]).
    pub kernel_impl: &'static str,
    /// Per rank, every byte the call moved between host and the rank's device: its inputs placed,
    /// its outputs and gradients read, and whatever the ring's steps moved (on the CPU backend,
    /// copies between host arrays and tensors). Under MPI too, every rank's, gathered.
    pub host_device_bytes: Vec<u64>,
}

/// One rank's results, head-major: out and grads `[b, h|hk, t, d]`, lse `[b, h, t]`.
struct RankOutput {
    out: Vec<f32>,
    lse: Vec<f32>,
    grads: Option<[Vec<f32>; 3]>,
    /// This rank's rows' part of the sinks' gradient.
    dsinks: Option<Vec<f32>>,
    traffic: Traffic,
    events: Vec<StepEvent>,
    /// Host↔device bytes of the whole call on this rank.
    host_device_bytes: u64,
}

fn check_job(job: &AttentionJob) -> Result<([usize; 4], usize), RingError> {
    let [b, s, h, d] = job.q.dims4("q [batch, seq, heads, head_dim]")?;
    let [_, _, hk, _] = job.k.dims4("k [batch, seq, kv_heads, head_dim]")?;
    if hk == 0 || !h.is_multiple_of(hk) {
        return Err(RingError::Heads {
            heads: h,
            kv_heads: hk,
        });
    }
    job.config.attend().check()?;
    strategies::check_ranks(job.ranks)?;
    crate::ring::ulysses::check_heads(job.ulysses, job.ranks, h, hk)?;
    if let Some(sinks) = job.sinks {
        if sinks.len() != h {
            return Err(RingError::Shape {
                what: "sinks [heads]",
                expected: vec![h],
                got: vec![sinks.len()],
            });
        }
        HostTensor::new(vec![h], sinks.to_vec()).check_finite("sinks")?;
    }
    if let Some(fault) = job.fault
        && fault.rank >= job.ranks
    {
        return Err(RingError::FaultRank {
            rank: fault.rank,
            ranks: job.ranks,
        });
    }
    for (what, t, expected) in [
        ("k [batch, seq, kv_heads, head_dim]", job.k, [b, s, hk, d]),
        ("v [batch, seq, kv_heads, head_dim]", job.v, [b, s, hk, d]),
    ]
    .into_iter()
    .chain(
        job.d_out
            .map(|t| ("dO [batch, seq, heads, head_dim]", t, [b, s, h, d])),
    ) {
        if t.shape != expected {
            return Err(RingError::Shape {
                what,
                expected: expected.to_vec(),
                got: t.shape.clone(),
            });
        }
    }
    // A NaN or infinity would not survive the online softmax as itself (a running max ignores NaN):
    // the output would be finite and wrong, so refuse it here.
    for (what, t) in [("q", job.q), ("k", job.k), ("v", job.v)]
        .into_iter()
        .chain(job.d_out.map(|t| ("dO", t)))
    {
        t.check_finite(what)?;
    }
    Ok(([b, s, h, d], hk))
}

/// The job's split: the layout (padded to a length the strategy accepts), what its positions hold,
/// and the dimensions every rank checks its shards against.
struct Plan {
    /// Every rank's positions (in a grid, its piece of its ring shard).
    layout: Arc<Layout>,
    /// The rings' layout: over `ranks / ulysses` ranks, the same as `layout` without a grid.
    ring_layout: Arc<Layout>,
    sequence: Sequence,
    /// `[batch, seq, heads, head_dim]`.
    dims: [usize; 4],
    kv_heads: usize,
}

fn plan_job(job: &AttentionJob) -> Result<Plan, RingError> {
    let (dims, kv_heads) = check_job(job)?;
    let sequence = Sequence {
        len: dims[1],
        doc_lens: job.doc_lens.to_vec(),
    };
    // A length the strategy cannot split is padded at the end: padded keys lie outside every real
    // query's window, padded queries' rows are dropped, and their dO rows are zero. In a grid, every
    // ring shard also splits into equal pieces.
    let ring_ranks = job.ranks / job.ulysses;
    let padded = strategies::padded_grid_len(job.strategy, dims[1], ring_ranks, job.ulysses)?;
    sequence.check(padded)?;
    // The job's documents and mask, for a strategy that balances them (`balanced`); the costs
    // of an unknown machine.
    let workload = strategies::Workload::single(
        job.doc_lens,
        job.config.attend().mask(),
        strategies::RingCosts::at_the_knee(padded / ring_ranks),
    );
    let ring_layout = Arc::new(job.strategy.layout_for(padded, ring_ranks, &workload)?);
    let layout = match job.ulysses {
        1 => ring_layout.clone(),
        u => Arc::new(ring_layout.split_ranks(u)?),
    };
    let plan = Plan {
        layout,
        ring_layout,
        sequence,
        dims,
        kv_heads,
    };
    if let Some(fault) = job.fault
        && fault.strike().is_some()
    {
        let exchanges = exchanges_of(job, &plan).of(fault.phase);
        if fault.step >= exchanges {
            return Err(RingError::FaultStep {
                rank: fault.rank,
                phase: fault.phase.name(),
                step: fault.step,
                exchanges,
            });
        }
    }
    Ok(plan)
}

/// The exchanges each rank of `job` makes, per phase (every rank makes as many): the forward pass's
/// cargo hops, the backward pass's cargo and accumulator hops (with dO), each pass as long as the
/// layout and mask need (a sliding window or short documents stop a pass early), and the Ulysses
/// all-to-alls, `U − 1` exchanges each. What a fault's exchange is checked against before any rank
/// starts; a run's traffic counts the same ([`Traffic::exchanges`]).
pub fn expected_exchanges(job: &AttentionJob) -> Result<Exchanges, RingError> {
    let mut unfaulted = job.clone();
    unfaulted.fault = None;
    let plan = plan_job(&unfaulted)?;
    Ok(exchanges_of(job, &plan))
}

fn exchanges_of(job: &AttentionJob, plan: &Plan) -> Exchanges {
    let config = job.config;
    let positions = &plan.ring_layout.positions;
    let windows = all_windows(&plan.ring_layout, &plan.sequence, config.attend().mask());
    let forward = steps_needed(positions, &windows, config.forward, Travelling::Keys);
    let backward = job.d_out.map_or(0, |_| {
        let (direction, travelling) = backward_route(config.backward, config.forward);
        pass_exchanges(
            steps_needed(positions, &windows, direction, travelling),
            true,
        )
    });
    let all_to_alls = match job.ulysses {
        1 => 0,
        _ => GRID_FORWARD_ALL_TO_ALLS + job.d_out.map_or(0, |_| GRID_BACKWARD_ALL_TO_ALLS),
    };
    Exchanges {
        forward: pass_exchanges(forward, false),
        backward,
        all_to_all: all_to_alls * (job.ulysses - 1),
        decode: 0,
    }
}

/// One rank's part of the job: forward, and with dO the backward, on this rank's shards.
fn attend_rank<B>(
    mut comm: Comm,
    job: &AttentionJob,
    plan: &Plan,
    device: &B::Device,
) -> Result<(RankOutput, Arc<RingContext>), RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    let [batch, seq, heads, head_dim] = plan.dims;
    let moved_before = host::moved_bytes();
    let rank = comm.rank();
    let fault = job.fault.filter(|f| f.rank == rank);
    if let Some(fault) = fault
        && let Some(strike) = fault.strike()
    {
        comm.inject_fault(fault.phase, fault.step, strike);
    }
    let mut ctx = RingContext::grid(comm, plan.ring_layout.clone(), job.config, job.ulysses)?
        .with_sequence(plan.sequence.clone())?;
    if let Some(Fault {
        step,
        kind: FaultKind::PoisonTile,
        ..
    }) = fault
    {
        ctx = ctx.with_poisoned_tile(step);
    }
    let ctx = Arc::new(ctx);
    let positions = ctx.positions(rank);
    let local = positions.len();
    let load = |t: &HostTensor, h: usize| {
        host::place::<B, 4>(
            gather_rank(&ctx, &t.data, [batch, seq, h, head_dim]),
            [batch, h, local, head_dim],
            device,
        )
    };
    let track = |t: Tensor<B, 4>| {
        if job.d_out.is_some() {
            t.require_grad()
        } else {
            t
        }
    };
    let q = track(load(job.q, heads));
    let k = track(load(job.k, plan.kv_heads));
    let v = track(load(job.v, plan.kv_heads));
    let sinks = job.sinks.map(|s| {
        let sinks = host::place::<B, 1>(s.to_vec(), [heads], device);
        if job.d_out.is_some() {
            sinks.require_grad()
        } else {
            sinks
        }
    });
    let (out, lse) = ring_attention_with(
        q.clone(),
        k.clone(),
        v.clone(),
        sinks.clone(),
        &ctx,
        job.config.attend(),
    )?;
    let grads = match job.d_out {
        None => None,
        Some(d_out) => {
            let loss = (out.clone() * load(d_out, heads)).sum();
            let mut grads = loss.backward();
            if let Some(error) = ctx.take_backward_error() {
                return Err(error);
            }
            let mut grad = |t: &Tensor<B, 4>| {
                t.grad_remove(&mut grads)
                    .map(host::read)
                    .unwrap_or_else(|| vec![0.0; t.shape().num_elements()])
            };
            let qkv = [grad(&q), grad(&k), grad(&v)];
            let dsinks = sinks.as_ref().map(|s| {
                s.grad_remove(&mut grads)
                    .map(host::read)
                    .unwrap_or_else(|| vec![0.0; heads])
            });
            Some((qkv, dsinks))
        }
    };
    let (grads, dsinks) = grads.map_or((None, None), |(qkv, dsinks)| (Some(qkv), dsinks));
    let (out, lse) = (host::read(out.inner()), host::read(lse.inner()));
    let output = RankOutput {
        out,
        lse,
        grads,
        dsinks,
        traffic: ctx.take_traffic(),
        events: ctx.take_events(),
        // The inputs placed, the ring's steps, the outputs and gradients read: the whole call.
        host_device_bytes: host::moved_bytes() - moved_before,
    };
    Ok((output, ctx))
}

/// Runs ring attention (and, with `d_out`, its backward) on `job.ranks` threads, all on `device`.
pub fn run_attention<B>(
    job: &AttentionJob,
    device: &B::Device,
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    run_attention_on_devices::<B>(job, std::slice::from_ref(device))
}

/// Runs ring attention on `job.ranks` threads, rank r on `devices[r % devices.len()]` (the backend's
/// default device when `devices` is empty).
pub fn run_attention_on_devices<B>(
    job: &AttentionJob,
    devices: &[B::Device],
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    let plan = plan_job(job)?;
    let default = B::Device::default();
    let device_of = |rank: usize| match devices.len() {
        0 => &default,
        n => &devices[rank % n],
    };
    let results = run_ranks_with(job.ranks, job.timeout, job.link, |comm| {
        let device = device_of(comm.rank());
        attend_rank::<B>(comm, job, &plan, device).map(|(output, _)| output)
    });
    let outputs = all_or_root_cause(results, RingError::echo_level)?;
    let kernel_impl = implementation_on::<B>(job, device_of(0))?;
    Ok(assemble(
        job,
        &plan,
        outputs,
        (0..job.ranks).collect(),
        kernel_impl,
    ))
}

/// Runs this process's rank of the job over `comm` (one process per rank, e.g. under `mpirun`), then
/// gathers every rank's results so that each process returns the whole job's outputs, traffic,
/// events and host↔device bytes, as [`run_attention_on_devices`] does (`ranks_here` names this
/// process's rank).
pub fn run_attention_on<B>(
    comm: Comm,
    job: &AttentionJob,
    device: &B::Device,
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    if comm.world() != job.ranks {
        return Err(RingError::WorldMismatch {
            world: comm.world(),
            layout: job.ranks,
        });
    }
    let plan = plan_job(job)?;
    let rank = comm.rank();
    // While a trace records, the processes share one time axis: each marks its zero right after
    // the same barrier.
    let mut comm = comm;
    let recorder = crate::trace::current();
    if let Some(recorder) = &recorder {
        comm.barrier()?;
        recorder.align_here();
    }
    let (mine, ctx) = attend_rank::<B>(comm, job, &plan, device)?;
    // Every output is gathered by a sum over rank-indexed slots (adding zeros is exact).
    let gather = |part: &[f32]| -> Result<Vec<Vec<f32>>, RingError> {
        let n = part.len();
        let mut slots = vec![0.0f32; n * job.ranks];
        slots[rank * n..(rank + 1) * n].copy_from_slice(part);
        ctx.with_comm(|c| c.all_reduce_sum(&mut slots))?;
        Ok(slots.chunks(n.max(1)).map(<[f32]>::to_vec).collect())
    };
    let outs = gather(&mine.out)?;
    let lses = gather(&mine.lse)?;
    let dsinks = mine.dsinks.as_deref().map(gather).transpose()?;
    let grads: Option<Vec<[Vec<f32>; 3]>> = match &mine.grads {
        None => None,
        Some([dq, dk, dv]) => {
            let (dq, dk, dv) = (gather(dq)?, gather(dk)?, gather(dv)?);
            Some(
                (0..job.ranks)
                    .map(|r| [dq[r].clone(), dk[r].clone(), dv[r].clone()])
                    .collect(),
            )
        }
    };
    let accounts = RankAccounts {
        traffic: mine.traffic.clone(),
        events: mine.events.clone(),
        host_device_bytes: mine.host_device_bytes,
    };
    let gathered = ctx.with_comm(|c| c.all_gather_words(&accounts.to_words()))?;
    // Every process's events to rank 0's trace, which writes the file.
    if let Some(recorder) = &recorder {
        let words = crate::trace::to_words(&recorder.events());
        let all = ctx.with_comm(|c| c.all_gather_words(&words))?;
        if rank == 0 {
            for (r, theirs) in all.iter().enumerate().filter(|(r, _)| *r != rank) {
                let events =
                    crate::trace::from_words(theirs).ok_or(RingError::Accounts { rank: r })?;
                recorder.absorb(events);
            }
        }
    }
    let outputs = (0..job.ranks)
        .map(|r| {
            let theirs = match r == rank {
                true => Some(accounts.clone()),
                false => RankAccounts::from_words(&gathered[r]),
            }
            .ok_or(RingError::Accounts { rank: r })?;
            Ok(RankOutput {
                out: outs[r].clone(),
                lse: lses[r].clone(),
                grads: grads.as_ref().map(|g| g[r].clone()),
                dsinks: dsinks.as_ref().map(|d| d[r].clone()),
                traffic: theirs.traffic,
                events: theirs.events,
                host_device_bytes: theirs.host_device_bytes,
            })
        })
        .collect::<Result<_, RingError>>()?;
    let kernel_impl = implementation_on::<B>(job, device)?;
    Ok(assemble(job, &plan, outputs, vec![rank], kernel_impl))
}

/// What computes the job's tiles on `device` (the engine runs them on the autodiff backend's inner
/// backend).
fn implementation_on<B>(job: &AttentionJob, device: &B::Device) -> Result<&'static str, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend>,
{
    let probe = Tensor::<B, 1>::zeros([1], device).inner();
    crate::kernels::implementation::<B::InnerBackend>(
        job.config.kernel,
        &probe.device(),
        job.config.precision,
    )
}

/// Puts the ranks' outputs back into the job's layout.
fn assemble(
    job: &AttentionJob,
    plan: &Plan,
    outputs: Vec<RankOutput>,
    ranks_here: Vec<usize>,
    kernel_impl: &'static str,
) -> AttentionResult {
    let [batch, seq, heads, head_dim] = plan.dims;
    let positions = &plan.layout.positions;
    // Each rank's head-major `[b, h, t, d]` into global `dims`, rank by rank.
    let global = |pick: &dyn Fn(&RankOutput) -> &[f32], dims: [usize; 4]| {
        let mut data = vec![0.0; dims.iter().product()];
        for (o, positions) in outputs.iter().zip(positions) {
            scatter_rank(&mut data, dims, positions, pick(o));
        }
        HostTensor::new(dims.to_vec(), data)
    };
    let out = global(&|o| &o.out, [batch, seq, heads, head_dim]);
    // lse `[b, h, t]` is `[b·h, t, 1, 1]` in the scatter's terms; the result is `[b, h, s]`.
    let lse = HostTensor::new(
        vec![batch, heads, seq],
        global(&|o| &o.lse, [batch * heads, seq, 1, 1]).data,
    );
    let grads = job.d_out.map(|_| {
        let g = |i: usize, h: usize| {
            global(
                &|o| &o.grads.as_ref().expect("backward ran on every rank")[i],
                [batch, seq, h, head_dim],
            )
        };
        // Every rank's rows hold the sinks: their gradient is the sum of the ranks' parts.
        let dsinks = job.sinks.map(|_| {
            let mut sum = vec![0.0f32; heads];
            for part in outputs.iter().flat_map(|o| &o.dsinks) {
                for (s, x) in sum.iter_mut().zip(part) {
                    *s += x;
                }
            }
            sum
        });
        Grads {
            dq: g(0, heads),
            dk: g(1, plan.kv_heads),
            dv: g(2, plan.kv_heads),
            dsinks,
        }
    });
    AttentionResult {
        out,
        lse,
        grads,
        traffic: outputs.iter().map(|o| o.traffic.clone()).collect(),
        host_device_bytes: outputs.iter().map(|o| o.host_device_bytes).collect(),
        events: outputs.into_iter().map(|o| o.events).collect(),
        ranks_here,
        padded_len: plan.layout.seq_len,
        kernel_impl,
    }
}
