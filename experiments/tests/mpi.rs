//! Multi-process ranks under `mpirun` give the same results as in-process threads (feature `mpi`).
#![cfg(feature = "mpi")]

mod common;

use common::{
    ENDS_BEFORE_TIMEOUT, PEER_TIMEOUT_S, attn_on_fixture, backward_fault_args, ringbench, temp_dir,
};
use experiments::npy;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

fn mpirun<S: AsRef<std::ffi::OsStr>>(ranks: usize, args: &[S]) -> Output {
    Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            &ranks.to_string(),
            env!("CARGO_BIN_EXE_ringbench"),
        ])
        .args(args)
        .output()
        .expect("running mpirun (apt-get install openmpi-bin)")
}

/// Also in bf16 (operands, blocks and merge): its process sends exactly half the bytes of the f32
/// run's, as the threads do (`tests/tests/precision.rs`). And on Ulysses × ring grids: 2 × 2 (the
/// fixture's 2 kv heads split) and 4 × 1 (pure Ulysses, kv heads replicated), whose all-to-alls
/// cross processes.
#[test]
fn attention_over_four_processes_matches_threads() {
    let dir = temp_dir("attn");
    let mut rank0_bytes = Vec::new();
    for (strategy, bwd, dtype, ulysses) in [
        ("zigzag", "kv", "f32", "1"),
        ("striped", "q", "f32", "1"),
        ("zigzag", "kv", "bf16", "1"),
        ("zigzag", "q", "f32", "2"),
        ("striped", "kv-reverse", "f32", "4"),
    ] {
        let run = |out: &Path, mpi: bool| {
            let o = out.to_string_lossy();
            let args = attn_on_fixture(
                true,
                &[
                    "--ranks",
                    "4",
                    "--strategy",
                    strategy,
                    "--bwd",
                    bwd,
                    "--causal",
                    "--dtype",
                    dtype,
                    "--merge",
                    dtype,
                    "--ulysses",
                    ulysses,
                    "--out",
                    &o,
                ],
            );
            let output = if mpi {
                mpirun(4, &args)
            } else {
                ringbench(&args)
            };
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let (a, b) = (
            dir.join(format!("{strategy}-{dtype}-u{ulysses}-threads")),
            dir.join(format!("{strategy}-{dtype}-u{ulysses}-mpi")),
        );
        let (threads, mpi) = (run(&a, false), run(&b, true));
        // Had rank detection failed, each of the 4 processes would have run all 4 ranks as threads
        // and written the files: one "wrote" line, from a process that ran one rank, must appear,
        // and its bytes must be one rank's share of the threads' total (equal shards).
        let sent = |stdout: &str, ran: &str| -> u64 {
            let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("wrote ")).collect();
            assert_eq!(lines.len(), 1, "one writer: {stdout}");
            let tail = lines[0]
                .split_once(&format!("this process ran {ran} of them, which sent "))
                .unwrap_or_else(|| panic!("expected {ran} rank(s) in this process: {}", lines[0]))
                .1;
            tail.trim_end_matches(" bytes)").parse().unwrap()
        };
        let (all, one) = (sent(&threads, "4"), sent(&mpi, "1"));
        assert!(
            one > 0 && 4 * one == all,
            "{strategy}: rank 0 sent {one} of {all} bytes"
        );
        rank0_bytes.push(one);
        for name in ["out.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"] {
            let (x, y) = (
                npy::read(&a.join(name)).unwrap(),
                npy::read(&b.join(name)).unwrap(),
            );
            let d = ringbench_tests::deviation(&x.data, &y.data);
            assert!(
                d.wrong.is_none() && d.abs <= 1e-6,
                "{strategy} {dtype} ulysses={ulysses} {name}: threads vs MPI: {d}"
            );
        }
    }
    assert_eq!(
        2 * rank0_bytes[2],
        rank0_bytes[0],
        "bf16 sends half of f32's bytes"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn training_over_four_processes_matches_threads() {
    let dir = temp_dir("train");
    let spec = |out: &Path| {
        format!(
            "[model]\nd_model = 32\nlayers = 1\nheads = 2\nkv_heads = 1\nffn_multiple_of = 16\nrope_theta = 10000.0\nffn_chunk = 64\n\n\
             [ring]\nranks = 4\nstrategy = \"zigzag\"\nforward = \"cw\"\nbackward = \"kv\"\nkernel = \"fused\"\n\n\
             [train]\nsteps = 10\nbatch = 2\nlr = 1e-3\nwarmup_steps = 2\nmin_lr_ratio = 0.1\nweight_decay = 0.01\ngrad_clip = 1.0\n\
             seed = 3\nlm_weight = 0.1\nmin_lines = 1\nnum_lines = 3\nchecksum_every = 5\nout = \"{}\"\nstop_loss = 0.0\nmax_minutes = 0.0\n",
            out.display()
        )
    };
    let losses = |mpi: bool| -> Vec<f64> {
        let out = dir.join(if mpi { "mpi" } else { "threads" });
        let path = dir.join(if mpi { "mpi.toml" } else { "threads.toml" });
        std::fs::write(&path, spec(&out)).unwrap();
        let p = path.to_string_lossy();
        let args = ["train", "--config", &p];
        let output = if mpi {
            mpirun(4, &args)
        } else {
            ringbench(&args)
        };
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut reader = csv::Reader::from_path(out.join("metrics.csv")).unwrap();
        reader
            .records()
            .map(|r| r.unwrap()[1].parse().unwrap())
            .collect()
    };
    let (a, b) = (losses(false), losses(true));
    assert_eq!(a.len(), 10);
    assert_eq!(b.len(), 10);
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-6, "step {step}: threads {x} vs MPI {y}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_failing_process_ends_the_job_naming_its_rank() {
    let dir = temp_dir("fault");
    let o = dir.to_string_lossy();
    let start = Instant::now();
    let output = mpirun(
        4,
        &attn_on_fixture(
            false,
            &[
                "--ranks",
                "4",
                "--fail-rank",
                "2",
                "--fail-step",
                "1",
                "--timeout",
                &PEER_TIMEOUT_S.to_string(),
                "--out",
                &o,
            ],
        ),
    );
    assert!(start.elapsed() < ENDS_BEFORE_TIMEOUT, "the peers timed out");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("MPI rank 2: rank 2 failed: injected fault"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_process_failing_in_the_backward_ends_the_job_and_writes_nothing() {
    let dir = temp_dir("fault-backward");
    let out = dir.join("out");
    let o = out.to_string_lossy();
    let start = Instant::now();
    let output = mpirun(4, &backward_fault_args(&o));
    assert!(start.elapsed() < ENDS_BEFORE_TIMEOUT, "the peers timed out");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("MPI rank 1: rank 1 failed: injected fault at its ring exchange 4"),
        "{stderr}"
    );
    assert!(!out.join("dq.npy").exists(), "no gradient file");
    assert!(!out.join("out.npy").exists(), "no output file");
    std::fs::remove_dir_all(dir).unwrap();
}
