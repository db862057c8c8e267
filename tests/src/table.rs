//! The exactness table's rows, shared by the table (`tests/exactness.rs`) and the test that
//! registers a new strategy and sees it run there: a pairwise covering design over strategy, kernel,
//! ranks and forward direction, every backward scheme in each row, against the float64 reference.

use crate::{
    Case, F32_ATTENTION, F32_UNIT_ROUNDOFF, assert_within, ran_every_pass, rel_err, run_case,
};
use burn::backend::{Autodiff, Flex};
use strategies::{by_name, names};
use workbench::ring::jobs::AttentionResult;
use workbench::{BackwardScheme, Direction, Kernel, RingConfig, RingError};

type B = Autodiff<Flex>;

/// Rank counts of the table.
pub const RANKS: [usize; 5] = [1, 2, 3, 4, 8];
/// Max-abs error relative to each tensor's max magnitude, in f32 (derived in [`F32_ATTENTION`]).
const TOLERANCE: f64 = F32_ATTENTION;
/// Gradients of different backward schemes, relative to each tensor's max magnitude: every scheme
/// computes the same tiles with the same arithmetic and differs only in the order in which a rank's
/// at most 8 per-step contributions are added (and, for kv, where the sum travels), so they differ by
/// at most 2·8·u ≈ 1e-6 of the sum's magnitude.
pub const SCHEME_AGREEMENT: f64 = 2.0 * 8.0 * F32_UNIT_ROUNDOFF;

/// Whether `strategy` splits `seq` tokens over `ranks` ranks without padding: the strategy's own
/// rule (its `validate`), so that the registry is the only list of strategies; the engine must pad
/// exactly when it says no.
pub fn accepts(strategy: &str, seq: usize, ranks: usize) -> bool {
    by_name(strategy)
        .expect("a registered strategy")
        .validate(seq, ranks)
        .is_ok()
}

/// `c` through the ring on `ranks` ranks of `strategy` (CPU autodiff backend).
pub fn run(
    c: &Case,
    strategy: &str,
    ranks: usize,
    config: RingConfig,
) -> Result<AttentionResult, RingError> {
    run_case::<B>(c, strategy, ranks, config, &Default::default())
}

/// The (strategy, kernel, ranks, forward direction) rows each case runs, every backward scheme in
/// each: a pairwise covering design over the four (every pair of values of every two runs at
/// least once), so that a strategy joining the registry adds rows, not a product.
pub fn design() -> Vec<Vec<usize>> {
    use crate::covering::{missing_pairs, pairwise};
    let levels = [
        names().len(),
        Kernel::ALL.len(),
        RANKS.len(),
        Direction::ALL.len(),
    ];
    let design = pairwise(&levels);
    assert!(missing_pairs(&levels, &design).is_empty());
    design
}

/// Every row of [`design`] on `c` with every backward scheme against its float64 reference, and
/// the schemes against each other; returns (runs, runs that were padded), as the engine reports
/// them: a run counts when every rank recorded a whole forward and backward pass, and a run is
/// padded when the engine split a longer length than the input's (cross-checked against `accepts`).
pub fn check_case(c: &Case, name: &str, causal: bool) -> (usize, usize) {
    let seq = c.q.shape[1];
    let (mut runs, mut padded) = (0, 0);
    let strategies = names();
    for row in design() {
        let [st, kn, rk, fw] = row[..] else {
            unreachable!("four axes")
        };
        let (strategy, kernel, ranks, forward) = (
            strategies[st],
            Kernel::ALL[kn],
            RANKS[rk],
            Direction::ALL[fw],
        );
        let mut grads_by_scheme = Vec::new();
        for backward in BackwardScheme::ALL {
            let label =
                format!("{name} {strategy} {kernel} N={ranks} fwd={forward} bwd={backward}");
            let config = RingConfig {
                causal,
                forward,
                backward,
                kernel,
                scale: None,
                window: None,
                softcap: None,
                lockstep: false,
                precision: Default::default(),
            };
            let result = run(c, strategy, ranks, config).unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_within(&result, &c.want, TOLERANCE, &label);
            let engine_padded = result.padded_len != seq;
            assert_eq!(
                engine_padded,
                !accepts(strategy, seq, ranks),
                "{label}: the engine split {} tokens",
                result.padded_len
            );
            runs += usize::from(ran_every_pass(&result, ranks));
            padded += usize::from(engine_padded);
            let grads = result.grads.expect("d_out was given");
            grads_by_scheme.push((backward, grads));
        }
        for (scheme, g) in grads_by_scheme.iter().skip(1) {
            let base = &grads_by_scheme[0].1;
            for (tensor, a, b) in [
                ("dq", &g.dq, &base.dq),
                ("dk", &g.dk, &base.dk),
                ("dv", &g.dv, &base.dv),
            ] {
                let diff = rel_err(&a.data, &b.data);
                assert!(
                    diff <= SCHEME_AGREEMENT,
                    "{name} {strategy} {kernel} N={ranks}: {tensor} {scheme} vs kv differ \
                             by {diff:.3e}"
                );
            }
        }
    }
    (runs, padded)
}
