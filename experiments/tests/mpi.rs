//! Multi-process ranks under `mpirun` give the same results as in-process threads (feature `mpi`).
#![cfg(feature = "mpi")]

mod common;

use common::{ENDS_BEFORE_TIMEOUT, STRIKES, attn_on_fixture, ringbench, temp_dir};
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
            let d = reference::compare::deviation(&x.data, &y.data);
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

/// Four processes train the losses the threads train (within 1e-6: MPI sums the same f32 values in
/// the same rank order, but its processes' kernels may group them otherwise), and a run whose rank 0
/// dies in the middle of writing its checkpoint after step 6 (the job ends: mpirun takes down the
/// other ranks) resumes under mpirun from the checkpoint after step 3, every process loading it.
#[test]
fn training_over_four_processes_matches_threads_and_resumes() {
    let dir = temp_dir("train");
    let spec = |out: &Path| {
        format!(
            "[model]\nd_model = 32\nlayers = 1\nheads = 2\nkv_heads = 1\nffn_multiple_of = 16\nrope_theta = 10000.0\nffn_chunk = 64\n\n\
             [ring]\nranks = 4\nstrategy = \"zigzag\"\nforward = \"cw\"\nbackward = \"kv\"\nkernel = \"fused\"\n\n\
             [train]\nsteps = 10\nbatch = 2\nlr = 1e-3\nwarmup_steps = 2\nmin_lr_ratio = 0.1\nweight_decay = 0.01\ngrad_clip = 1.0\n\
             seed = 3\nlm_weight = 0.1\nmin_lines = 1\nnum_lines = 3\nchecksum_every = 5\nout = \"{}\"\nstop_loss = 0.0\nmax_minutes = 0.0\n\
             checkpoint_every = 3\n",
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
            let crashed = Command::new("mpirun")
                .args(["--allow-run-as-root", "--oversubscribe", "-n", "4"])
                .args(["-x", "RINGBENCH_TEST_CRASH_IN_SAVE=6"])
                .arg(env!("CARGO_BIN_EXE_ringbench"))
                .args(args)
                .output()
                .unwrap();
            assert!(!crashed.status.success(), "rank 0 was killed in its save");
            assert!(!out.join("finished.json").exists());
            let resumed = mpirun(4, &args);
            let stdout = String::from_utf8_lossy(&resumed.stdout);
            assert_eq!(
                stdout.matches("resuming from step 3 of 10").count(),
                4,
                "every process resumes from the same checkpoint: {stdout}"
            );
            resumed
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
    // Decoding the trained model over a KV cache sharded on 4 processes, by each merge: the
    // replies of the 4 in-process ranks, and rank 0 alone writes them.
    let cases = dir.join("cases.jsonl");
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let made = ringbench(&[
        "gen-lines",
        "--num-lines",
        "2,3",
        "--cases",
        "2",
        "--out",
        &s(&cases),
    ]);
    assert!(made.status.success());
    let checkpoint = s(&dir.join("threads"));
    let replies = |mpi: bool, merge: &str| -> String {
        let file = dir.join(format!("replies-{mpi}-{merge}.jsonl"));
        let args = [
            "eval-lines",
            "--checkpoint",
            &checkpoint,
            "--cases",
            &s(&cases),
            "--ranks",
            "4",
            "--merge",
            merge,
            "--out",
            &s(&dir.join("acc.csv")),
            "--replies",
            &s(&file),
        ];
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
        // One table printed: one process per rank, rank 0 writing (4 would mean 4 thread jobs).
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(stdout.matches("num_lines,").count(), 1, "{stdout}");
        std::fs::read_to_string(file).unwrap()
    };
    for merge in ["allgather", "ring"] {
        let threads = replies(false, merge);
        assert_eq!(threads.lines().count(), 4, "{threads}");
        assert_eq!(
            replies(true, merge),
            threads,
            "{merge}: MPI's replies and the threads'"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A process failing at an exchange of each phase and backward scheme (the covering rows of
/// [`STRIKES`], as the threads are struck in `cli.rs`) ends the whole job at once (its `MPI_Abort`)
/// with the line naming its rank, phase and exchange, and nothing is written.
#[test]
fn a_failing_process_ends_the_job_naming_its_rank_and_writes_nothing() {
    let dir = temp_dir("fault");
    for strike in STRIKES {
        let out = dir.join(format!(
            "{}-{}-{}",
            strike.phase, strike.scheme, strike.step
        ));
        let start = Instant::now();
        let output = mpirun(4, &strike.args(&out.to_string_lossy()));
        assert!(
            start.elapsed() < ENDS_BEFORE_TIMEOUT,
            "{strike:?}: the peers timed out"
        );
        assert!(!output.status.success(), "{strike:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("MPI rank {}: {}", strike.rank, strike.says())),
            "{strike:?}: {stderr}"
        );
        assert!(!out.exists(), "{strike:?}: nothing written");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A real crash: one of 4 processes dies by SIGKILL in the middle of the forward ring pass (no
/// error, no abort of its own). The job ends well within the peers' timeout + 5 s (mpirun sees the
/// process die and ends the others; failing that, a peer's wait times out naming the silent rank),
/// nothing is written, and the message names the rank that vanished.
#[test]
fn a_killed_process_ends_the_job_naming_it() {
    let dir = temp_dir("killed");
    let out = dir.join("out");
    let timeout_s = 20;
    let start = Instant::now();
    let output = mpirun(
        4,
        &attn_on_fixture(
            true,
            &[
                "--ranks",
                "4",
                "--fail-rank",
                "2",
                "--fail-phase",
                "fwd",
                "--fail-step",
                "1",
                "--fail-mode",
                "kill",
                "--timeout",
                &timeout_s.to_string(),
                "--out",
                &out.to_string_lossy(),
            ],
        ),
    );
    let elapsed = start.elapsed();
    assert!(
        elapsed < std::time::Duration::from_secs(timeout_s + 5),
        "the job took {elapsed:?}"
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let named =
        stderr.contains("rank 2") && (stderr.contains("signal 9") || stderr.contains("Killed"));
    let timed_out = stderr.contains("no message from rank 2");
    assert!(named || timed_out, "{stderr}");
    assert!(!out.exists(), "nothing written");
    std::fs::remove_dir_all(dir).unwrap();
}
