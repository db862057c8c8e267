//! Per-rank timelines (`--trace`, `workbench::trace`): a trace's per-rank sums are the run's own
//! counters; the file is Chrome trace-event JSON whose tracks nest or follow; under mpirun both
//! processes' ranks lie on one time axis.

mod common;

use common::{attn_on_fixture, ringbench, temp_dir};
use serde_json::Value;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;
use workbench::RingConfig;
use workbench::ring::jobs::{AttentionJob, HostTensor, run_attention_on_devices};
use workbench::trace::{self, Recorder, Track};

type B = burn::backend::Autodiff<burn::backend::Flex>;

/// The recorder is process-wide: the tests of this binary take turns.
static TURN: Mutex<()> = Mutex::new(());

fn fixture(name: &str) -> HostTensor {
    experiments::npy::read(&common::fixture(name)).unwrap()
}

/// A 4-rank causal run of every strategy, forward and backward, traced: per rank, the tiles'
/// durations sum to the tiles' measured seconds (the same readings: the 1% the issue allows is
/// µs rounding here), the sends' bytes to the rank's bytes sent, their messages to its messages
/// (`messages_per_rank` counts a block a message), the waits to its waiting seconds.
#[test]
fn a_traces_per_rank_sums_are_the_runs_counters() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (q, k, v, d_out) = (
        fixture("q.npy"),
        fixture("k.npy"),
        fixture("v.npy"),
        fixture("do.npy"),
    );
    for strategy in strategies::names() {
        let job = AttentionJob {
            q: &q,
            k: &k,
            v: &v,
            d_out: Some(&d_out),
            ranks: 4,
            ulysses: 1,
            strategy: strategies::by_name(strategy).unwrap(),
            config: RingConfig {
                causal: true,
                ..Default::default()
            },
            timeout: Duration::from_secs(60),
            fault: None,
            link: None,
            doc_lens: &[],
            sinks: None,
        };
        let recorder = Recorder::new();
        trace::install(recorder.clone());
        let result = run_attention_on_devices::<B>(&job, &[]);
        trace::uninstall();
        let result = result.unwrap();
        let events = recorder.events();
        for rank in 0..4 {
            let mine = |track: Track, prefix: &'static str| {
                events.iter().filter(move |e| {
                    e.pid == rank && e.track == track && e.name.starts_with(prefix)
                })
            };
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
            let tiles: f64 = mine(Track::Compute, "tile").map(|e| e.dur).sum();
            let measured: f64 = result.events[rank].iter().map(|e| e.compute_seconds).sum();
            assert!(
                close(tiles, measured * 1e6),
                "{strategy} rank {rank}: tiles {tiles} µs, counters {measured} s"
            );
            assert_eq!(
                mine(Track::Compute, "tile").count(),
                result.events[rank].len()
            );
            let bytes: u64 = mine(Track::Ring, "send")
                .map(|e| e.args["bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(
                bytes,
                result.traffic[rank].total_bytes(),
                "{strategy} rank {rank}"
            );
            let messages: usize = mine(Track::Ring, "send")
                .map(|e| e.args["messages"].as_u64().unwrap() as usize)
                .sum();
            assert_eq!(
                messages,
                result.traffic[rank].sends.len(),
                "{strategy} rank {rank}"
            );
            let waited: f64 = mine(Track::Ring, "wait").map(|e| e.dur).sum();
            assert!(
                close(waited, result.traffic[rank].wait_seconds * 1e6),
                "{strategy} rank {rank}: waits {waited} µs"
            );
            // Every wait's block arrived: a receive each.
            assert_eq!(
                mine(Track::Ring, "wait").count(),
                mine(Track::Ring, "recv").count()
            );
        }
        // Nothing of another rank.
        assert!(events.iter().all(|e| e.pid < 4));
    }
}

/// Every event of `trace` has the fields a viewer needs and a duration of at least 0, and on each
/// track (pid, tid) events nest or follow, never overlap partly (1 ns of rounding allowed).
fn assert_valid(trace: &Value) -> Vec<Value> {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let complete: Vec<Value> = events.iter().filter(|e| e["ph"] == "X").cloned().collect();
    assert!(!complete.is_empty());
    for e in events {
        for field in ["ph", "ts", "pid", "tid", "name"] {
            assert!(!e[field].is_null(), "{field} missing: {e}");
        }
    }
    // (pid, tid) -> (start, end, name) of its events.
    type Spans = Vec<(f64, f64, String)>;
    let mut tracks: std::collections::BTreeMap<(u64, u64), Spans> = Default::default();
    for e in &complete {
        let dur = e["dur"].as_f64().expect("dur");
        assert!(dur >= 0.0, "{e}");
        let ts = e["ts"].as_f64().unwrap();
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        tracks
            .entry(key)
            .or_default()
            .push((ts, ts + dur, e["name"].to_string()));
    }
    const NS: f64 = 1e-3;
    for (track, mut spans) in tracks {
        // Outer first at one start.
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, f64, String)> = Vec::new();
        for span in spans {
            while open.last().is_some_and(|top| span.0 >= top.1 - NS) {
                open.pop();
            }
            if let Some(top) = open.last() {
                assert!(
                    span.1 <= top.1 + NS,
                    "track {track:?}: {} [{}, {}] overlaps {} [{}, {}] partly",
                    span.2,
                    span.0,
                    span.1,
                    top.2,
                    top.0,
                    top.1
                );
            }
            open.push(span);
        }
    }
    complete
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `attn --trace` and `train --trace` write Chrome trace-event JSON: valid, tracks nesting, each
/// rank named; training shows the model's parts (layers, feed-forward, optimizer) on the model
/// track.
#[test]
fn traces_are_chrome_json_whose_tracks_nest_or_follow() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("trace-json");
    let attn = dir.join("attn.json");
    let out = dir.join("out");
    let args = attn_on_fixture(
        true,
        &[
            "--ranks",
            "4",
            "--strategy",
            "striped",
            "--causal",
            "--out",
            out.to_str().unwrap(),
            "--trace",
            attn.to_str().unwrap(),
        ],
    );
    let o = ringbench(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let events = assert_valid(&read(&attn));
    let names: Vec<String> = events
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    for want in [
        "tile fwd",
        "tile bwd",
        "send forward",
        "wait backward",
        "recv forward",
        "merge finish",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let trace = read(&attn);
    let ranks: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .collect();
    assert_eq!(ranks.len(), 4);
    // Training: the model's spans.
    let spec = dir.join("train.toml");
    std::fs::write(&spec, common::tiny_train_spec(&dir.join("run"), 2)).unwrap();
    let train = dir.join("train.json");
    let o = ringbench(&[
        "train",
        "--config",
        spec.to_str().unwrap(),
        "--trace",
        train.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let events = assert_valid(&read(&train));
    for want in [
        "layer 0",
        "attention",
        "ffn",
        "norm",
        "forward",
        "backward",
        "optimizer step",
        "all-reduce",
    ] {
        assert!(events.iter().any(|e| e["name"] == want), "{want}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Under mpirun, rank 0 writes both processes' ranks on one time axis (each process's zero taken
/// after the same barrier): every block's receive ends after its send began.
#[cfg(feature = "mpi")]
#[test]
fn an_mpi_runs_trace_holds_both_processes_on_one_time_axis() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("trace-mpi");
    let path = dir.join("mpi.json");
    let out = dir.join("out");
    let mut args = vec![
        "--allow-run-as-root".to_owned(),
        "--oversubscribe".into(),
        "-n".into(),
        "2".into(),
        env!("CARGO_BIN_EXE_ringbench").into(),
    ];
    args.extend(attn_on_fixture(
        true,
        &[
            "--ranks",
            "2",
            "--causal",
            "--out",
            out.to_str().unwrap(),
            "--trace",
            path.to_str().unwrap(),
        ],
    ));
    let o = std::process::Command::new("mpirun")
        .args(&args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let events = assert_valid(&read(&path));
    let pids: std::collections::BTreeSet<u64> =
        events.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.into_iter().collect::<Vec<_>>(), [0, 1]);
    // Each send (rank a to b, phase, step) against b's receive from a of that phase and step.
    let mut matched = 0;
    for send in events
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("send"))
    {
        let (a, b) = (
            send["pid"].as_u64().unwrap(),
            send["args"]["to"].as_u64().unwrap(),
        );
        let recv = events.iter().find(|e| {
            e["name"].as_str().unwrap().starts_with("recv")
                && e["pid"].as_u64() == Some(b)
                && e["args"]["from"].as_u64() == Some(a)
                && e["args"]["phase"] == send["args"]["phase"]
                && e["args"]["step"] == send["args"]["step"]
        });
        let recv = recv.unwrap_or_else(|| panic!("no receive of {send}"));
        let sent_at = send["ts"].as_f64().unwrap();
        let arrived = recv["ts"].as_f64().unwrap() + recv["dur"].as_f64().unwrap();
        // The barrier aligns the processes to well within a millisecond.
        assert!(
            arrived >= sent_at - 1000.0,
            "received at {arrived} µs, sent at {sent_at} µs"
        );
        matched += 1;
    }
    assert!(matched >= 2);
    let _ = std::fs::remove_dir_all(dir);
}
