//! Exact attention and its gradients in float64, written out pair by pair: the full score matrix and
//! softmax, one (batch, head) at a time, with no blocking, no log-sum-exp merging and no code shared
//! with the engine; and a ring run's deviation from it.

use crate::compare::{Deviation, deviation, deviation_at_scale, worst};
use workbench::ring::jobs::AttentionResult;

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
