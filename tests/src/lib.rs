//! Shared helpers of the cross-crate test table: seeded cases with their float64 reference, jobs
//! and what a run must have done.
//!
//! The reference, the comparison and the f32 bounds are the product's own (the `reference` crate:
//! the `attn` kind checks every point against the same reference); they are re-exported here so
//! that a test names one crate.

pub mod covering;
pub mod device;
pub mod skips;
pub mod table;

pub use reference::bounds::{F32_ATTENTION, F32_UNIT_ROUNDOFF, f32_attention_bound_at};
pub use reference::compare::{
    self, Deviation, deviation, deviation_at_scale, rel_err, rms_rel_err, worst,
};
pub use reference::inputs::Rng;
pub use reference::{
    Inputs, Reference, Variant, bf16, deviations, reference, reference_packed, reference_variant,
};

use burn::tensor::backend::AutodiffBackend;
use std::time::Duration;
use workbench::ring::context::StepEvent;
use workbench::ring::jobs::{AttentionJob, AttentionResult, HostTensor, run_attention};
use workbench::transport::Phase;
use workbench::{Dtype, RingBackend, RingConfig, RingError};

/// [`F32_ATTENTION`]'s derivation for a run whose tiles hold up to `tile_len` keys (or queries: a
/// shard's length) over `ring_steps` steps: a score's [`HEAD_DIM`] products, a chain of `tile_len`
/// terms (softmax sums, p·V, dK/dV), dP's [`HEAD_DIM`], and one merged partial per sub-tile and per
/// ring step, each term rounded by at most u ([`F32_UNIT_ROUNDOFF`]); never below the project's
/// standard 1e-5, which is what it gives for tiles of 128.
pub fn f32_attention_bound(tile_len: usize, ring_steps: usize) -> f64 {
    f32_attention_bound_at(HEAD_DIM, tile_len, ring_steps)
}

/// Sequences per batch of every case.
pub const BATCH: usize = 2;
/// Width of a head in every case.
pub const HEAD_DIM: usize = 16;

/// Seeded inputs of one exactness case and their float64 reference.
pub struct Case {
    /// Queries `[batch, seq, heads, head_dim]`.
    pub q: HostTensor,
    /// Keys `[batch, seq, kv_heads, head_dim]`.
    pub k: HostTensor,
    /// Values, shaped like the keys.
    pub v: HostTensor,
    /// The output's gradient, shaped like the queries.
    pub d_out: HostTensor,
    /// Packed documents (empty: one).
    pub doc_lens: Vec<usize>,
    /// The window, cap and sinks the reference was computed with (the job runs with them too).
    pub variant: Variant,
    /// The float64 reference.
    pub want: Reference,
}

/// A seeded case of `seq` tokens, `heads` (query, kv) heads, [`BATCH`] sequences of [`HEAD_DIM`]-wide
/// heads, with its float64 reference at `scale` over documents `doc_lens`.
pub fn case_with(
    seq: usize,
    heads: (usize, usize),
    causal: bool,
    scale: f64,
    doc_lens: &[usize],
) -> Case {
    case_variant(seq, heads, causal, scale, doc_lens, Variant::default())
}

/// [`case_with`] attending with `variant`'s window, cap and sinks.
pub fn case_variant(
    seq: usize,
    heads: (usize, usize),
    causal: bool,
    scale: f64,
    doc_lens: &[usize],
    variant: Variant,
) -> Case {
    case_in(Dtype::F32, seq, heads, causal, scale, doc_lens, variant)
}

/// [`case_variant`] with q, k, v and dO rounded to `dtype` before anything else: its reference is
/// that of the rounded inputs, which a ring in `dtype` then keeps exactly (the algorithm's own
/// error, apart from the inputs' rounding).
pub fn case_in(
    dtype: Dtype,
    seq: usize,
    (heads, kv_heads): (usize, usize),
    causal: bool,
    scale: f64,
    doc_lens: &[usize],
    variant: Variant,
) -> Case {
    case_wide(
        dtype,
        seq,
        (heads, kv_heads),
        HEAD_DIM,
        causal,
        scale,
        doc_lens,
        variant,
    )
}

/// [`case_in`] with heads `head_dim` wide instead of [`HEAD_DIM`].
#[allow(clippy::too_many_arguments)]
pub fn case_wide(
    dtype: Dtype,
    seq: usize,
    (heads, kv_heads): (usize, usize),
    head_dim: usize,
    causal: bool,
    scale: f64,
    doc_lens: &[usize],
    variant: Variant,
) -> Case {
    // The seed of the 16-wide cases is kept, so that their inputs (and measured errors) stay.
    let wide = if head_dim == HEAD_DIM {
        0
    } else {
        head_dim * 1009
    };
    let mut rng = Rng::new((seq * 131 + heads * 7 + usize::from(causal) + wide) as u64);
    let q_shape = vec![BATCH, seq, heads, head_dim];
    let kv_shape = vec![BATCH, seq, kv_heads, head_dim];
    let mut q = rng.vec(q_shape.iter().product(), 2.0);
    let mut k = rng.vec(kv_shape.iter().product(), 2.0);
    let mut v = rng.vec(kv_shape.iter().product(), 1.0);
    let mut d_out = rng.vec(q_shape.iter().product(), 1.0);
    for x in [&mut q, &mut k, &mut v, &mut d_out] {
        dtype.round(x);
    }
    let want = reference_variant(
        Inputs {
            q: &q,
            k: &k,
            v: &v,
            d_out: &d_out,
            dims: [BATCH, seq, heads, head_dim],
            kv_heads,
        },
        causal,
        scale,
        doc_lens,
        &variant,
    );
    Case {
        q: HostTensor::new(q_shape.clone(), q),
        k: HostTensor::new(kv_shape.clone(), k),
        v: HostTensor::new(kv_shape, v),
        d_out: HostTensor::new(q_shape, d_out),
        doc_lens: doc_lens.to_vec(),
        variant,
        want,
    }
}

/// The job of `c` with its gradient on `ranks` in-process ranks of `strategy`.
pub fn job<'a>(c: &'a Case, strategy: &str, ranks: usize, config: RingConfig) -> AttentionJob<'a> {
    AttentionJob {
        q: &c.q,
        k: &c.k,
        v: &c.v,
        d_out: Some(&c.d_out),
        ranks,
        ulysses: 1,
        strategy: strategies::by_name(strategy).expect("a registered strategy"),
        // The case's window and cap: its reference was computed with them.
        config: RingConfig {
            window: c.variant.window,
            softcap: c.variant.softcap.map(|cap| cap as f32),
            ..config
        },
        // How long a rank waits for a silent peer: a guard against a hang, not a time limit. On
        // Mesa's software device a peer's first call of a new shape compiles its kernels first,
        // which took over 30 s on a loaded 2-core machine (a generic-kernel case timed out there).
        timeout: Duration::from_secs(300),
        fault: None,
        link: None,
        doc_lens: &c.doc_lens,
        sinks: c.variant.sinks.as_deref(),
    }
}

/// Runs `c` with its gradient on `ranks` in-process ranks of `strategy`, all on `device`.
pub fn run_case<B>(
    c: &Case,
    strategy: &str,
    ranks: usize,
    config: RingConfig,
    device: &B::Device,
) -> Result<AttentionResult, RingError>
where
    B: AutodiffBackend<InnerBackend: RingBackend> + RingBackend,
{
    run_attention::<B>(&job(c, strategy, ranks, config), device)
}

/// Whether the engine reports a forward and a backward pass on each of `ranks` ranks: every rank
/// recorded one tile event (computed or skipped) per ring step of each phase, the steps `0..n` of
/// one pass the same on every rank (`n` ≤ `ranks`: a pass stops once no rank can see further).
pub fn ran_every_pass(result: &AttentionResult, ranks: usize) -> bool {
    let steps = |events: &[StepEvent], phase: Phase| -> Vec<usize> {
        events
            .iter()
            .filter(|e| e.phase == phase)
            .map(|e| e.step)
            .collect()
    };
    let pass = |phase| {
        let first = steps(&result.events[0], phase);
        let counted = !first.is_empty() && first.len() <= ranks;
        counted
            && first.iter().copied().eq(0..first.len())
            && result.events.iter().all(|e| steps(e, phase) == first)
    };
    result.events.len() == ranks && pass(Phase::Forward) && pass(Phase::Backward)
}

/// Asserts that out, lse, dq, dk and dv of `result` each lie within `tolerance` of the reference,
/// relative to the reference tensor's largest magnitude (a NaN or infinity anywhere fails).
pub fn assert_within(result: &AttentionResult, want: &Reference, tolerance: f64, label: &str) {
    for (name, d) in deviations(result, want) {
        assert!(d.within(tolerance), "{label}: {name} {d}");
    }
}
