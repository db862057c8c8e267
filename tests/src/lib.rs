//! Shared helpers of the cross-crate test table: seeded inputs and an independent float64 reference.
//!
//! The reference builds the full score matrix and softmax in f64, one (batch, head) at a time, with no
//! blocking, no log-sum-exp merging and no shared code with the engine. Comparisons with it go through
//! [`compare`], the workspace's one NaN-aware comparison.

pub mod bf16;
pub mod compare;
pub mod covering;
pub mod device;
pub mod table;

pub use compare::{Deviation, deviation, deviation_at_scale, rel_err, rms_rel_err, worst};

use burn::tensor::backend::AutodiffBackend;
use std::time::Duration;
use workbench::ring::context::StepEvent;
use workbench::ring::jobs::{AttentionJob, AttentionResult, HostTensor, run_attention};
use workbench::transport::Phase;
use workbench::{Dtype, RingBackend, RingConfig, RingError};

/// float32's unit roundoff, 2⁻²⁴.
pub const F32_UNIT_ROUNDOFF: f64 = 5.960_464_477_539_063e-8;

/// How far f32 ring attention (out, lse, dq, dk, dv) may lie from the float64 reference, relative to
/// each tensor's largest magnitude: 1e-5.
///
/// A sum of n float32 terms is off by at most n·u of the sum of their magnitudes (u =
/// [`F32_UNIT_ROUNDOFF`]; Higham's γₙ). The longest chains of one value here: a score sums
/// head_dim = 16 products; the softmax's row sums, p·V, and dK/dV's sums over queries run over at most
/// 128 keys or queries in one chain (the fused kernel's sub-tile; the generic kernel's tiles hold at
/// most 96 here), then merge one partial per sub-tile and ring step (at most 8 + 8); dQ repeats the
/// score's 16 and the keys' 128. exp and log add a few u each. So ≈ (16 + 128 + 16 + 8)·u ≈ 1.0e-5 of
/// the terms' magnitudes, which for these inputs (uniform in [−2, 2]; p ≥ 0 summing to 1) is the
/// order of each tensor's largest value; the gradients' terms ds = p·(dp − δ) partly cancel, which
/// uniform inputs keep mild. Measured errors are ~20× below it. The derivation covers tiles of at
/// most 128 keys and 8 ring steps; a run with longer tiles is held to [`f32_attention_bound`].
pub const F32_ATTENTION: f64 = 1e-5;

/// The narrowest sub-tile of keys any kernel merges as one partial (the fused device kernel's 32).
const NARROWEST_SUB_TILE: usize = 32;

/// [`F32_ATTENTION`]'s derivation for a run whose tiles hold up to `tile_len` keys (or queries: a
/// shard's length) over `ring_steps` steps: a score's [`HEAD_DIM`] products, a chain of `tile_len`
/// terms (softmax sums, p·V, dK/dV), dP's [`HEAD_DIM`], and one merged partial per sub-tile and per
/// ring step, each term rounded by at most u ([`F32_UNIT_ROUNDOFF`]); never below the project's
/// standard 1e-5, which is what it gives for tiles of 128.
pub fn f32_attention_bound(tile_len: usize, ring_steps: usize) -> f64 {
    f32_attention_bound_at(HEAD_DIM, tile_len, ring_steps)
}

/// [`f32_attention_bound`] for heads `head_dim` wide (a score's and dP's chains are that long).
pub fn f32_attention_bound_at(head_dim: usize, tile_len: usize, ring_steps: usize) -> f64 {
    let merges = tile_len.div_ceil(NARROWEST_SUB_TILE) + ring_steps;
    let chain = 2 * head_dim + tile_len + merges;
    (chain as f64 * F32_UNIT_ROUNDOFF).max(F32_ATTENTION)
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

/// What a case attends with besides causality and documents: a sliding window, a logit cap, sinks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Variant {
    /// A query sees only keys less than `W` positions away.
    pub window: Option<usize>,
    /// Scores become `C · tanh(s / C)` before masking.
    pub softcap: Option<f64>,
    /// One logit per query head, joining every row's softmax denominator.
    pub sinks: Option<Vec<f32>>,
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

/// out, lse, dq, dk and dv of `result` against the reference (out and lse alone without gradients).
pub fn deviations(result: &AttentionResult, want: &Reference) -> Vec<(&'static str, Deviation)> {
    let mut found = vec![
        ("out", deviation(&result.out.data, &want.out)),
        ("lse", deviation(&result.lse.data, &want.lse)),
    ];
    if let Some(grads) = &result.grads {
        found.extend([
            (
                "dq",
                deviation_at_scale(&grads.dq.data, &want.dq, want.dq_terms),
            ),
            (
                "dk",
                deviation_at_scale(&grads.dk.data, &want.dk, want.dk_terms),
            ),
            ("dv", deviation(&grads.dv.data, &want.dv)),
        ]);
        match &grads.dsinks {
            Some(dsinks) => found.push(("dsinks", deviation(dsinks, &want.dsinks))),
            // A reference with sinks and a result without their gradient is a failure too.
            None if !want.dsinks.is_empty() => {
                found.push(("dsinks", deviation(&[] as &[f32], &want.dsinks)))
            }
            None => {}
        }
    }
    found
}

/// Seeded test inputs, uniform in [−1, 1) (the project's one generator, `datasets::SplitMix64`).
pub struct Rng(datasets::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(datasets::SplitMix64::new(seed))
    }

    pub fn next_f32(&mut self) -> f32 {
        (self.0.uniform() * 2.0 - 1.0) as f32
    }

    pub fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        (0..len).map(|_| self.next_f32() * amplitude).collect()
    }
}

/// Outputs of exact attention in the (batch, seq, heads, dim) layout; lse is (batch, heads, seq).
#[derive(Debug, Clone)]
pub struct Reference {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    /// With sinks, their gradient `[heads]`; empty without.
    pub dsinks: Vec<f64>,
    /// The largest sum of the magnitudes of the terms of one element of each tensor: out, Σ p·|v|;
    /// dv, Σ p·|dO|; dq and dk, scale · p · (Σ|dO|·|v| + Σ|dO|·|out|) · |k| (or |q|), the
    /// magnitudes dP and δ are summed from. The scale a tensor is computed at, which bounds it: a
    /// rounding of every term by u moves an element by at most u times its terms. A gradient that
    /// cancels to exactly zero (every query sees one key, so p = 1 and dP = δ) has no scale of its
    /// own, and its error is measured against this one ([`deviations`]).
    pub out_terms: f64,
    pub dv_terms: f64,
    pub dq_terms: f64,
    pub dk_terms: f64,
}

/// The inputs of a reference: q, d_out `[b, s, h, d]`; k, v `[b, s, hk, d]`.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub d_out: &'a [f32],
    /// `[b, s, h, d]`.
    pub dims: [usize; 4],
    /// Key/value heads: query head i reads kv head i / (h / hk).
    pub kv_heads: usize,
}

/// Exact attention and its gradients for loss = Σ out ∘ dO, in float64.
///
/// q, d_out: `[b, s, h, d]`; k, v: `[b, s, hk, d]`; query head i reads kv head i / (h / hk).
#[allow(clippy::too_many_arguments)]
pub fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_out: &[f32],
    dims: [usize; 4],
    hk: usize,
    causal: bool,
    scale: f64,
) -> Reference {
    reference_packed(q, k, v, d_out, dims, hk, causal, scale, &[])
}

/// [`reference()`] over packed documents of `doc_lens` laid end to end (empty: one document): query
/// i sees key j iff both lie in the same document and (not causal, or j ≤ i).
#[allow(clippy::too_many_arguments)]
pub fn reference_packed(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_out: &[f32],
    dims: [usize; 4],
    kv_heads: usize,
    causal: bool,
    scale: f64,
    doc_lens: &[usize],
) -> Reference {
    let inputs = Inputs {
        q,
        k,
        v,
        d_out,
        dims,
        kv_heads,
    };
    reference_variant(inputs, causal, scale, doc_lens, &Variant::default())
}

/// [`reference_packed`] with a variant, each rule written out pair by pair: query i sees key j iff
/// both lie in the same document, (not causal, or j ≤ i), and (no window, or |i − j| < W); a score
/// is `scale · q·k`, then `C · tanh(score / C)` with a cap; a sink logit joins each row's
/// denominator, `p_j = exp(s_j) / (Σ_k exp(s_k) + exp(sink))` and `lse = log(Σ_k exp(s_k) +
/// exp(sink))`, with gradient `dsink = −Σ_rows p_sink · δ`, `δ = Σ_j p_j (dO · v_j)`.
pub fn reference_variant(
    inputs: Inputs,
    causal: bool,
    scale: f64,
    doc_lens: &[usize],
    variant: &Variant,
) -> Reference {
    let Inputs {
        q,
        k,
        v,
        d_out,
        dims: [b, s, h, d],
        kv_heads: hk,
    } = inputs;
    // The document of every position, written out one by one.
    let doc: Vec<usize> = if doc_lens.is_empty() {
        vec![0; s]
    } else {
        doc_lens
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| std::iter::repeat_n(i, n))
            .collect()
    };
    assert_eq!(
        doc.len(),
        s,
        "document lengths {doc_lens:?} must sum to {s}"
    );
    let qi = |bi: usize, t: usize, hi: usize| ((bi * s + t) * h + hi) * d;
    let ki = |bi: usize, t: usize, hi: usize| ((bi * s + t) * hk + hi) * d;
    let mut r = Reference {
        out: vec![0.0; b * s * h * d],
        lse: vec![0.0; b * h * s],
        dq: vec![0.0; b * s * h * d],
        dk: vec![0.0; b * s * hk * d],
        dv: vec![0.0; b * s * hk * d],
        dsinks: vec![0.0; if variant.sinks.is_some() { h } else { 0 }],
        out_terms: 0.0,
        dv_terms: 0.0,
        dq_terms: 0.0,
        dk_terms: 0.0,
    };
    let (mut dq_terms, mut dk_terms) = (vec![0.0; b * s * h * d], vec![0.0; b * s * hk * d]);
    let (mut out_terms, mut dv_terms) = (vec![0.0; b * s * h * d], vec![0.0; b * s * hk * d]);
    let abs_dot = |x: &[f32], y: &[f32]| -> f64 {
        x.iter()
            .zip(y)
            .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
            .sum()
    };
    let dot = |x: &[f32], y: &[f32]| -> f64 {
        x.iter()
            .zip(y)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum()
    };
    let sees = |i: usize, j: usize| {
        doc[j] == doc[i] && (!causal || j <= i) && variant.window.is_none_or(|w| i.abs_diff(j) < w)
    };
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / (h / hk);
            let sink = variant.sinks.as_ref().map(|s| f64::from(s[hi]));
            for i in 0..s {
                let qv = &q[qi(bi, i, hi)..qi(bi, i, hi) + d];
                let visible: Vec<usize> = (0..s).filter(|&j| sees(i, j)).collect();
                let raw: Vec<f64> = visible
                    .iter()
                    .map(|&j| scale * dot(qv, &k[ki(bi, j, kh)..ki(bi, j, kh) + d]))
                    .collect();
                // With a cap, each score's tanh: its derivative is 1 − tanh².
                let tanh: Vec<f64> = match variant.softcap {
                    Some(cap) => raw.iter().map(|x| (x / cap).tanh()).collect(),
                    None => Vec::new(),
                };
                let scores: Vec<f64> = match variant.softcap {
                    Some(cap) => tanh.iter().map(|t| cap * t).collect(),
                    None => raw.clone(),
                };
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .map(|x| (x - max).exp())
                    .sum();
                r.lse[(bi * h + hi) * s + i] = max + sum.ln();
                let p: Vec<f64> = scores.iter().map(|x| (x - max).exp() / sum).collect();
                let dov = &d_out[qi(bi, i, hi)..qi(bi, i, hi) + d];
                let dp: Vec<f64> = visible
                    .iter()
                    .map(|&j| dot(dov, &v[ki(bi, j, kh)..ki(bi, j, kh) + d]))
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                // Σ|dO|·|out| over the row, out as the magnitudes of its terms bound it.
                let delta_abs: f64 = visible
                    .iter()
                    .zip(&p)
                    .map(|(&j, pj)| pj * abs_dot(dov, &v[ki(bi, j, kh)..ki(bi, j, kh) + d]))
                    .sum();
                if let Some(sink) = sink {
                    r.dsinks[hi] -= (sink - max).exp() / sum * delta;
                }
                for (n, &j) in visible.iter().enumerate() {
                    let ds = p[n] * (dp[n] - delta);
                    let dp_abs = abs_dot(dov, &v[ki(bi, j, kh)..ki(bi, j, kh) + d]);
                    let ds_terms = scale * p[n] * (dp_abs + delta_abs);
                    let ds = if tanh.is_empty() {
                        ds
                    } else {
                        ds * (1.0 - tanh[n] * tanh[n])
                    };
                    for e in 0..d {
                        let (kq, kk) = (qi(bi, i, hi) + e, ki(bi, j, kh) + e);
                        r.out[kq] += p[n] * f64::from(v[kk]);
                        r.dq[kq] += scale * ds * f64::from(k[kk]);
                        r.dk[kk] += scale * ds * f64::from(q[kq]);
                        r.dv[kk] += p[n] * f64::from(d_out[kq]);
                        dq_terms[kq] += ds_terms * f64::from(k[kk]).abs();
                        dk_terms[kk] += ds_terms * f64::from(q[kq]).abs();
                        out_terms[kq] += p[n] * f64::from(v[kk]).abs();
                        dv_terms[kk] += p[n] * f64::from(d_out[kq]).abs();
                    }
                }
            }
        }
    }
    r.out_terms = worst(out_terms);
    r.dv_terms = worst(dv_terms);
    r.dq_terms = worst(dq_terms);
    r.dk_terms = worst(dk_terms);
    r
}
