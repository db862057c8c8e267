//! The in-process transport: collectives, and failures that must become errors rather than hangs.

use burn::backend::Flex;
use burn::tensor::Tensor;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workbench::transport::run_ranks;
use workbench::{RingConfig, RingContext, RingError, TransportError, ring_attention};

const TIMEOUT: Duration = Duration::from_secs(20);

/// In f32, (1e8 + 1) − 1e8 = 0 but (1e8 − 1e8) + 1 = 1: every rank must get the rank-order sum (0),
/// whatever order the messages arrived in.
#[test]
fn all_reduce_sums_in_rank_order() {
    let results = run_ranks(3, TIMEOUT, |mut comm| -> Result<f32, RingError> {
        let mut data = [[1e8f32, 1.0, -1e8][comm.rank()]];
        comm.all_reduce_sum(&mut data)?;
        Ok(data[0])
    });
    let want = (1e8f32 + 1.0) + -1e8;
    for r in results {
        assert_eq!(r.unwrap().to_bits(), want.to_bits());
    }
}

#[test]
fn all_reduce_of_different_lengths_is_a_typed_error() {
    let results = run_ranks(2, TIMEOUT, |mut comm| -> Result<(), RingError> {
        let mut data = vec![1.0f32; 2 + comm.rank()];
        comm.all_reduce_sum(&mut data)?;
        Ok(())
    });
    assert!(matches!(
        results[0],
        Err(RingError::Transport(TransportError::LengthMismatch {
            rank: 0,
            peer: 1,
            expected: 2,
            got: 3
        }))
    ));
}

#[test]
fn all_reduce_sums_and_every_rank_gets_identical_bits() {
    let results = run_ranks(5, TIMEOUT, |mut comm| -> Result<Vec<f32>, RingError> {
        let r = comm.rank() as f32;
        let mut data = vec![r * 0.1, 1.0 / (r + 3.0), 1e-8 * r];
        comm.all_reduce_sum(&mut data)?;
        comm.barrier()?;
        Ok(data)
    });
    let sums: Vec<Vec<f32>> = results.into_iter().map(Result::unwrap).collect();
    let expected_first: f32 = (0..5).map(|r| r as f32 * 0.1).sum();
    assert!((sums[0][0] - expected_first).abs() < 1e-6);
    for s in &sums {
        assert_eq!(
            s.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            sums[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

/// Runs ring attention on 4 ranks where `failing` returns early instead of joining the ring.
fn ring_with_failure(failing: usize, panic: bool, timeout: Duration) -> Vec<Result<(), RingError>> {
    let layout = Arc::new(
        strategies::by_name("zigzag")
            .unwrap()
            .layout(32, 4)
            .unwrap(),
    );
    run_ranks(4, timeout, |comm| -> Result<(), RingError> {
        let rank = comm.rank();
        let ctx = Arc::new(RingContext::new(
            comm,
            layout.clone(),
            RingConfig::default(),
        )?);
        if rank == failing {
            if panic {
                panic!("injected fault on rank {rank}");
            }
            // A live rank that never sends: its peers must time out.
            std::thread::sleep(timeout * 3);
            return Ok(());
        }
        let q = Tensor::<Flex, 4>::ones([1, 2, 8, 4], &Default::default());
        ring_attention(q.clone(), q.clone(), q, &ctx)?;
        Ok(())
    })
}

#[test]
fn a_rank_that_dies_stops_its_peers_with_an_error() {
    let start = Instant::now();
    let results = ring_with_failure(2, true, TIMEOUT);
    assert!(start.elapsed() < Duration::from_secs(10), "no hang");
    match &results[2] {
        Err(RingError::Transport(TransportError::RankFailed { rank: 2, message })) => {
            assert!(message.contains("injected fault"))
        }
        other => panic!("rank 2 should be reported failed, got {other:?}"),
    }
    for (rank, r) in results.iter().enumerate().filter(|(r, _)| *r != 2) {
        assert!(
            matches!(
                r,
                Err(RingError::Transport(TransportError::PeerGone { .. }))
            ),
            "rank {rank}: {r:?}"
        );
    }
}

#[test]
fn a_silent_rank_is_a_timeout_naming_it() {
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let results = ring_with_failure(1, false, timeout);
    assert!(start.elapsed() < Duration::from_secs(10), "no hang");
    // Rank 2 receives from rank 1 in the clockwise forward ring.
    match &results[2] {
        Err(RingError::Transport(TransportError::Timeout {
            rank: 2, peer: 1, ..
        })) => {}
        other => panic!("rank 2 should time out waiting for rank 1, got {other:?}"),
    }
    assert!(
        results
            .iter()
            .enumerate()
            .all(|(r, x)| r == 1 || x.is_err())
    );
}

#[test]
fn bad_shapes_are_typed_errors() {
    let layout = Arc::new(
        strategies::by_name("striped")
            .unwrap()
            .layout(16, 2)
            .unwrap(),
    );
    let results = run_ranks(2, TIMEOUT, |comm| -> Result<(), RingError> {
        let ctx = Arc::new(RingContext::new(
            comm,
            layout.clone(),
            RingConfig::default(),
        )?);
        let device = Default::default();
        let q = Tensor::<Flex, 4>::ones([1, 6, 8, 4], &device);
        let kv = Tensor::<Flex, 4>::ones([1, 4, 8, 4], &device);
        ring_attention(q, kv.clone(), kv, &ctx).map(|_| ())
    });
    for r in results {
        assert_eq!(
            r,
            Err(RingError::Heads {
                heads: 6,
                kv_heads: 4
            })
        );
    }
    let results = run_ranks(2, TIMEOUT, |comm| -> Result<(), RingError> {
        let ctx = Arc::new(RingContext::new(
            comm,
            layout.clone(),
            RingConfig::default(),
        )?);
        let q = Tensor::<Flex, 4>::ones([1, 2, 7, 4], &Default::default());
        ring_attention(q.clone(), q.clone(), q, &ctx).map(|_| ())
    });
    for r in results {
        assert!(
            matches!(r, Err(RingError::Shape { ref got, .. }) if got == &vec![1, 2, 7, 4]),
            "{r:?}"
        );
    }
    let wrong_world = run_ranks(3, TIMEOUT, |comm| {
        RingContext::new(comm, layout.clone(), RingConfig::default()).map(|_| ())
    });
    assert_eq!(
        wrong_world[0],
        Err(RingError::WorldMismatch {
            world: 3,
            layout: 2
        })
    );
}

#[test]
fn a_rate_limited_link_delays_delivery_but_not_the_sender() {
    use workbench::block::{Block, BlockKind};
    use workbench::transport::{Link, Phase, run_ranks_with};
    // 1 MB at 4 MB/s: 0.25 s on the wire, plus 50 ms latency.
    let link = Link {
        bytes_per_s: 4e6,
        latency: Duration::from_millis(50),
    };
    let transfer = 0.25 + 0.05;
    // One clock for both ranks: a block leaves when its *sender* posts it, which may be before or
    // after the receiver starts its own exchange.
    let clock = Instant::now();
    let results = run_ranks_with(
        2,
        TIMEOUT,
        Some(link),
        |mut comm| -> Result<[f64; 4], RingError> {
            let (rank, peer) = (comm.rank(), 1 - comm.rank());
            comm.barrier()?;
            let block = Arc::new(Block::host(
                BlockKind::K,
                vec![250_000],
                vec![rank as f32; 250_000],
            ));
            let before_send = clock.elapsed().as_secs_f64();
            let pending = comm.exchange(Phase::Forward, 0, peer, peer, vec![block])?;
            let posted = clock.elapsed().as_secs_f64();
            let got = comm.wait(pending)?;
            let arrived = clock.elapsed().as_secs_f64();
            assert_eq!(got[0].host_values()[0], peer as f32);
            Ok([
                before_send,
                posted,
                arrived,
                comm.take_traffic().wait_seconds,
            ])
        },
    );
    let times: Vec<[f64; 4]> = results.into_iter().map(Result::unwrap).collect();
    // Orderings that hold by construction, however slow the machine: a sender's exchange returns
    // before its block can have crossed the link (its own peer's block arrives later still), no
    // block arrives before its sender posted it plus the link's transfer time (the receiver sleeps
    // until then), and the wait the transport counted lies inside the test's own wait.
    for rank in 0..2 {
        let [before_send, posted, arrived, waited] = times[rank];
        let sent_by_peer = times[1 - rank][0];
        assert!(
            posted < arrived && posted < times[1 - rank][2],
            "rank {rank}: the exchange returned at {posted} s, after a block had arrived: the \
             sender blocked on the link"
        );
        assert!(
            arrived - sent_by_peer >= transfer,
            "rank {rank}: arrived {} s after its sender posted it: faster than the link's {transfer} s",
            arrived - sent_by_peer
        );
        assert!(
            waited <= arrived - posted,
            "rank {rank}: the transport counted {waited} s of waiting in a {} s wait",
            arrived - posted
        );
        // The counter saw the link: posting takes microseconds of the 0.3 s transfer, so the rest
        // was waited for (half of it is a bound no machine's scheduling comes near).
        let left = sent_by_peer + transfer - posted;
        assert!(
            waited >= 0.5 * left && before_send <= posted,
            "rank {rank}: the transport counted {waited} s of waiting; the transfer had {left} s left"
        );
    }
}
