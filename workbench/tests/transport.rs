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

/// A device block's all-reduce over threads is staged: its values are read to the host once (this
/// rank's own counter grows by exactly its bytes) and the rank-order sum comes back as a host
/// block of the same kind and shape. One rank sums nothing: its block comes back on the device and
/// nothing crosses.
#[test]
fn a_device_blocks_all_reduce_is_staged_through_the_host_once() {
    use workbench::block::{Block, BlockKind};
    let results = run_ranks(3, TIMEOUT, |mut comm| -> Result<_, RingError> {
        let mut values = [1e8f32, 1.0, -1e8];
        values.rotate_left(comm.rank());
        let tensor = Tensor::<Flex, 2>::from_floats([values], &Default::default());
        let before = workbench::host::moved_bytes();
        let reduced = comm.all_reduce_block(Block::on_device(BlockKind::Reduce, tensor))?;
        let moved = workbench::host::moved_bytes() - before;
        Ok((reduced, moved))
    });
    // Rank r holds (1e8, 1, -1e8) rotated left by r: each column sums 1e8, 1 and -1e8 in another
    // order, and in f32 only the rank order gives these sums (0, 0, 1).
    let ordered = |a: f32, b: f32, c: f32| (a + b) + c;
    let want = vec![
        ordered(1e8, 1.0, -1e8),
        ordered(1.0, -1e8, 1e8),
        ordered(-1e8, 1e8, 1.0),
    ];
    for result in results {
        let (block, moved) = result.unwrap();
        assert_eq!(moved, 3 * 4);
        assert!(!block.is_on_device());
        assert_eq!(
            (block.kind, block.shape.clone()),
            (BlockKind::Reduce, vec![1, 3])
        );
        assert_eq!(block.host_values().to_vec(), want);
    }
    let one = run_ranks(1, TIMEOUT, |mut comm| -> Result<_, RingError> {
        let tensor = Tensor::<Flex, 1>::from_floats([2.5, -1.0], &Default::default());
        let before = workbench::host::moved_bytes();
        let block = comm.all_reduce_block(Block::on_device(BlockKind::Reduce, tensor))?;
        Ok((
            block.is_on_device(),
            workbench::host::moved_bytes() - before,
        ))
    });
    assert_eq!(one[0].as_ref().unwrap(), &(true, 0));
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

/// A transport that sizes receives by the receiver (as NCCL does): a layout whose shards differ in
/// length is refused when the context is built, naming the lengths, before anything is sent.
#[test]
fn a_transport_that_needs_equal_shards_refuses_unequal_ones() {
    use workbench::transport::{Comm, Payload, Pending, Transport, thread_ring};
    #[derive(Debug)]
    struct EqualShardsOnly(workbench::transport::ThreadTransport);
    impl Transport for EqualShardsOnly {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn world(&self) -> usize {
            self.0.world()
        }
        fn send_recv(
            &mut self,
            to: usize,
            from: usize,
            tag: u64,
            payload: Payload,
        ) -> Result<Pending, TransportError> {
            self.0.send_recv(to, from, tag, payload)
        }
        fn commit(&mut self) -> Result<(), TransportError> {
            self.0.commit()
        }
        fn wait(&mut self, pending: Pending) -> Result<Payload, TransportError> {
            self.0.wait(pending)
        }
        fn needs_equal_shards(&self) -> Option<&'static str> {
            Some("equal-shards-only")
        }
    }
    let unequal = Arc::new(strategies::Layout {
        strategy: "by-hand",
        seq_len: 5,
        positions: vec![vec![0, 1, 2], vec![3, 4]],
    });
    let equal = Arc::new(strategies::by_name("zigzag").unwrap().layout(8, 2).unwrap());
    let want = "equal-shards-only moves equal shards; by-hand gives shards of [3, 2] tokens for this sequence";
    for transport in thread_ring(2, TIMEOUT) {
        let comm = Comm::new(Box::new(EqualShardsOnly(transport)));
        // Equal shards are accepted; a later step's unequal layout is refused too.
        let ctx = RingContext::new(comm, equal.clone(), RingConfig::default()).unwrap();
        let err = ctx.with_layout(unequal.clone()).unwrap_err();
        assert!(matches!(err, RingError::UnequalShards { .. }), "{err}");
        assert_eq!(err.to_string(), want);
    }
    let transport = thread_ring(2, TIMEOUT).swap_remove(0);
    let comm = Comm::new(Box::new(EqualShardsOnly(transport)));
    let err = RingContext::new(comm, unequal, RingConfig::default()).unwrap_err();
    assert_eq!(err.to_string(), want);
}
