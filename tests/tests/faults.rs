//! A fault at every exchange (in-process ranks; `experiments/tests/mpi.rs` strikes the same
//! phases and schemes in processes, and kills one): a rank failing at any exchange of the forward
//! pass, of each backward scheme's pass, or of Ulysses' all-to-alls ends the job with the typed
//! error naming that rank, phase and exchange, long before the peers' timeout; one past a phase's
//! last exchange is refused before any rank starts. The exchange counts the faults are checked
//! against are the engine's own counts of a clean run.

use burn::backend::{Autodiff, Flex};
use ringbench_tests::{case_variant, job};
use std::time::{Duration, Instant};
use workbench::ring::jobs::{Fault, expected_exchanges, run_attention};
use workbench::transport::Phase;
use workbench::{BackwardScheme, Direction, RingConfig, RingError, TransportError};

type B = Autodiff<Flex>;

/// The peers' timeout: long, so that a job that ended by timing out is told apart by the clock.
const PEER_TIMEOUT: Duration = Duration::from_secs(600);

/// (label, strategy, ranks, Ulysses degree, backward scheme, sliding window) of each job struck.
type Site = (
    &'static str,
    &'static str,
    usize,
    usize,
    BackwardScheme,
    Option<usize>,
);

/// The ring on 4 zig-zag ranks with each backward scheme; a 2 × 2 grid (all-to-alls, and a 2-rank
/// ring); and 8 contiguous ranks with a causal window of one shard, whose passes stop after two
/// steps.
const SITES: [Site; 5] = [
    ("ring kv", "zigzag", 4, 1, BackwardScheme::Kv, None),
    (
        "ring kv-reverse",
        "zigzag",
        4,
        1,
        BackwardScheme::KvReverse,
        None,
    ),
    ("ring q", "zigzag", 4, 1, BackwardScheme::Q, None),
    ("2 x 2 grid q", "zigzag", 4, 2, BackwardScheme::Q, None),
    (
        "windowed kv",
        "contiguous",
        8,
        1,
        BackwardScheme::Kv,
        Some(6),
    ),
];

#[test]
fn every_exchange_of_every_phase_fails_the_job_naming_its_rank() {
    let mut struck = 0;
    for (label, strategy, ranks, ulysses, backward, window) in SITES {
        let variant = ringbench_tests::Variant {
            window,
            ..Default::default()
        };
        let c = case_variant(48, (4, 2), true, 0.25, &[], variant);
        let config = RingConfig {
            causal: true,
            forward: Direction::Cw,
            backward,
            ..Default::default()
        };
        let mut base = job(&c, strategy, ranks, config);
        base.ulysses = ulysses;
        base.timeout = PEER_TIMEOUT;
        // What the faults are checked against is what the engine counts on every rank.
        let expected = expected_exchanges(&base).unwrap();
        let clean = run_attention::<B>(&base, &Default::default()).unwrap();
        assert_eq!(clean.traffic.len(), ranks, "{label}");
        for (rank, traffic) in clean.traffic.iter().enumerate() {
            assert_eq!(traffic.exchanges, expected, "{label}: rank {rank}'s counts");
        }
        for phase in Phase::EXCHANGED {
            let exchanges = expected.of(phase);
            for step in 0..exchanges {
                let rank = (step + phase as usize) % ranks;
                let mut faulty = base.clone();
                faulty.fault = Some(Fault::fail(rank, phase, step));
                let started = Instant::now();
                let error = run_attention::<B>(&faulty, &Default::default())
                    .expect_err("an injected fault");
                assert!(
                    started.elapsed() < PEER_TIMEOUT / 2,
                    "{label}: the peers timed out"
                );
                assert_eq!(
                    error,
                    RingError::Transport(TransportError::Injected {
                        rank,
                        phase: phase.name(),
                        step,
                    }),
                    "{label}: {} exchange {step} of rank {rank}",
                    phase.name()
                );
                struck += 1;
            }
            // One past the last: refused before any rank starts, naming how many there are.
            let mut past = base.clone();
            past.fault = Some(Fault::fail(1, phase, exchanges));
            let error = run_attention::<B>(&past, &Default::default()).expect_err("refused");
            assert_eq!(
                error,
                RingError::FaultStep {
                    rank: 1,
                    phase: phase.name(),
                    step: exchanges,
                    exchanges,
                },
                "{label}"
            );
        }
    }
    // The counts themselves, as the passes' lengths give them: 4 ranks make 3 forward and 3 + 4
    // backward exchanges (cargo, then the accumulator's hops and its hop home); the grid's 2-rank
    // rings 1 and 3, and its all-to-alls (5 forward, 4 backward) 1 each; 8 ranks with a window of
    // one 6-token shard stop after 2 steps: 1 and 3.
    assert_eq!(struck, 3 * (3 + 7) + (1 + 3 + 9) + (1 + 3));
}

#[test]
fn a_fault_past_the_last_exchange_names_the_count() {
    let c = case_variant(48, (4, 2), true, 0.25, &[], Default::default());
    let mut forward_only = job(&c, "striped", 4, RingConfig::default());
    forward_only.d_out = None;
    forward_only.fault = Some(Fault::fail(2, Phase::Backward, 0));
    let error = run_attention::<B>(&forward_only, &Default::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "fault injected at backward exchange 0 of rank 2, but each rank makes 0 backward \
         exchange(s) in this job"
    );
    let mut ring = job(&c, "striped", 4, RingConfig::default());
    ring.fault = Some(Fault::fail(0, Phase::AllToAll, 0));
    let error = run_attention::<B>(&ring, &Default::default()).unwrap_err();
    assert!(
        error.to_string().contains("0 all-to-all exchange(s)"),
        "{error}"
    );
    ring.fault = Some(Fault::fail(3, Phase::Forward, 3));
    let error = run_attention::<B>(&ring, &Default::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "fault injected at forward exchange 3 of rank 3, but each rank makes 3 forward \
         exchange(s) in this job (0 to 2)"
    );
}
