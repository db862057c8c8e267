//! A ring run checked against the independent float64 reference (`reference/src/attention.rs`): what the
//! `attn` kind reports as `max_rel_error` for every point.

use crate::backend::{BackendName, run_attention_on};
use anyhow::{Result, anyhow};
use std::time::Duration;
use strategies::Partition;
use workbench::RingConfig;
use workbench::dtype::Dtype;
use workbench::ring::jobs::{AttentionJob, HostTensor};

/// The attention shape of a check.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (dividing `heads`).
    pub kv_heads: usize,
    /// Dimension of a head.
    pub head_dim: usize,
}

/// What a check packs and attends with at the length it runs (its documents and sliding window
/// scale with it); the cap and whether there are sinks are the point's.
pub struct CheckVariant<'a> {
    /// The documents of a sequence of this length (empty: one).
    pub doc_lens: &'a dyn Fn(usize) -> Vec<usize>,
    /// The sliding window at this length, if any.
    pub window: &'a dyn Fn(usize) -> Option<usize>,
    /// Logit soft-capping.
    pub softcap: Option<f32>,
    /// Whether each query head has a sink logit (the check draws them).
    pub sinks: bool,
}

impl CheckVariant<'_> {
    /// One sequence, no window, cap or sinks.
    pub fn plain() -> CheckVariant<'static> {
        CheckVariant {
            doc_lens: &|_| Vec::new(),
            window: &|_| None,
            softcap: None,
            sinks: false,
        }
    }
}

/// A check's largest error of out, lse, dq, dk, dv (and the sinks' gradient), each relative to its
/// tensor's scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckErrors {
    /// Against the reference of the inputs rounded to the run's element type (f32: the inputs
    /// themselves): the algorithm's own error.
    pub own: f64,
    /// Against the reference of the original f32 inputs: the total error, the inputs' rounding
    /// included (the same as `own` in f32).
    pub total: f64,
}

/// `strategy` on `ranks` ranks (groups of `ulysses` of them splitting the heads: 1, the ring alone)
/// with `config`, at about `tokens_per_rank` tokens per rank (the shortest length from there that the
/// strategy accepts on the grid, packed and windowed as `variant` says for that length), against the
/// float64 references ([`CheckErrors`]). Runs on backend `backend`.
pub fn max_rel_error(
    backend: BackendName,
    strategy: &dyn Partition,
    (ranks, ulysses): (usize, usize),
    shape: Heads,
    config: RingConfig,
    tokens_per_rank: usize,
    variant: &CheckVariant,
) -> Result<CheckErrors> {
    against_reference(
        backend,
        strategy,
        (ranks, ulysses),
        shape,
        config,
        tokens_per_rank,
        variant,
        config.causal,
    )
}

/// The run with `config` against the reference with mask `causal` (they differ only in a test that
/// shows a wrong run is caught).
#[allow(clippy::too_many_arguments)]
fn against_reference(
    backend: BackendName,
    strategy: &dyn Partition,
    (ranks, ulysses): (usize, usize),
    shape: Heads,
    config: RingConfig,
    tokens_per_rank: usize,
    variant: &CheckVariant,
    causal: bool,
) -> Result<CheckErrors> {
    let start = tokens_per_rank.max(1) * ranks;
    let s = strategies::padded_grid_len(strategy, start, ranks / ulysses.max(1), ulysses.max(1))
        .map_err(|e| anyhow!("the float64 check: {e}"))?;
    let (b, h, hk, d) = (1, shape.heads, shape.kv_heads, shape.head_dim);
    let doc_lens = (variant.doc_lens)(s);
    let mut rng = reference::inputs::Rng::new(0x5EED ^ s as u64);
    let q = rng.vec(b * s * h * d, 1.0);
    let k = rng.vec(b * s * hk * d, 1.0);
    let v = rng.vec(b * s * hk * d, 1.0);
    let d_out = rng.vec(b * s * h * d, 1.0);
    let sinks = variant.sinks.then(|| rng.vec(h, 2.0));
    let tensor = |data: &[f32], heads: usize| HostTensor::new(vec![b, s, heads, d], data.to_vec());
    let (qt, kt, vt, dt) = (
        tensor(&q, h),
        tensor(&k, hk),
        tensor(&v, hk),
        tensor(&d_out, h),
    );
    let window = (variant.window)(s);
    let result = run_attention_on(
        backend,
        &AttentionJob {
            q: &qt,
            k: &kt,
            v: &vt,
            d_out: Some(&dt),
            ranks,
            ulysses,
            strategy,
            config: RingConfig {
                window,
                softcap: variant.softcap,
                ..config
            },
            timeout: Duration::from_secs(600),
            fault: None,
            link: None,
            doc_lens: &doc_lens,
            sinks: sinks.as_deref(),
        },
    )?;
    if result.grads.is_none() {
        return Err(anyhow!("the check asked for gradients"));
    }
    let scale = config.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let reference = reference::Variant {
        window,
        softcap: variant.softcap.map(f64::from),
        sinks,
    };
    // The largest error against the reference of the inputs rounded to `dtype`. A NaN or infinity
    // anywhere is an infinite error (the column reads `inf`), never a small one.
    let error_against = |dtype: Dtype| {
        let mut x = [q.clone(), k.clone(), v.clone(), d_out.clone()];
        for values in &mut x {
            dtype.round(values);
        }
        let inputs = reference::Inputs {
            q: &x[0],
            k: &x[1],
            v: &x[2],
            d_out: &x[3],
            dims: [b, s, h, d],
            kv_heads: hk,
        };
        let want = reference::reference_variant(inputs, causal, scale, &doc_lens, &reference);
        reference::compare::worst(
            reference::deviations(&result, &want)
                .into_iter()
                .map(|(_, d)| d.rel),
        )
    };
    let own = error_against(config.precision.dtype);
    let total = match config.precision.dtype {
        Dtype::F32 => own,
        _ => error_against(Dtype::F32),
    };
    Ok(CheckErrors { own, total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use workbench::{BackwardScheme, Direction};

    fn check(ranks: usize, heads: usize, kv_heads: usize, causal: bool, run_causal: bool) -> f64 {
        let config = RingConfig {
            causal: run_causal,
            forward: Direction::Ccw,
            backward: BackwardScheme::Q,
            ..Default::default()
        };
        let shape = Heads {
            heads,
            kv_heads,
            head_dim: 64,
        };
        against_reference(
            BackendName::Flex,
            &strategies::ZigZag,
            (ranks, 1),
            shape,
            config,
            16,
            &CheckVariant::plain(),
            causal,
        )
        .unwrap()
        .own
    }

    #[test]
    fn the_float64_check_passes_exact_runs_and_catches_a_wrong_one() {
        for (ranks, heads, kv_heads, causal) in [(1, 4, 4, true), (2, 4, 1, false), (4, 4, 2, true)]
        {
            let e = check(ranks, heads, kv_heads, causal, causal);
            assert!(
                e <= 1e-5,
                "N={ranks} h={heads} hk={kv_heads} causal={causal}: {e:e}"
            );
        }
        // A run that ignores the causal mask is not the point's attention.
        let e = check(2, 4, 4, true, false);
        assert!(e > 1e-2, "a non-causal run passed the causal check: {e:e}");
    }
}
