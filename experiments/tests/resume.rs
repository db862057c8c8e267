//! `ringbench train` loses nothing: a run killed at any moment (SIGKILL from outside at random
//! moments, or from inside in the middle of writing a checkpoint) resumes from its newest good
//! checkpoint, and its per-step
//! losses equal an uninterrupted run's bit for bit; a finished run does nothing again; another
//! spec's checkpoint and a corrupt one are refused naming the key or the file; one writer at a time.

mod common;

use common::{holds_one_writer, ringbench, temp_dir, tiny_train_spec};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The run every test here trains: 16 steps, a checkpoint every 3 (and at the last).
fn spec(out: &Path) -> String {
    tiny_train_spec(out, 16)
}

fn train(spec: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringbench"));
    command
        .args(["train", "--config"])
        .arg(spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Every step's `(step, loss, lr)` cells of a run's metrics.csv, as written (the shortest text that
/// reads back to the same bits: equal text is equal bits).
fn losses(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("metrics.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| line.split(',').take(3).collect::<Vec<_>>().join(","))
        .collect()
}

fn write_spec(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_run_killed_at_any_moment_resumes_to_the_same_losses() {
    let dir = temp_dir("resume");
    let whole = dir.join("whole");
    let whole_spec = write_spec(&dir, "whole.toml", &spec(&whole));
    let started = Instant::now();
    let out = train(&whole_spec).output().unwrap();
    let one_run = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = losses(&whole);
    assert_eq!(want.len(), 16);

    let killed = dir.join("killed");
    let killed_spec = write_spec(&dir, "killed.toml", &spec(&killed));
    // In the middle of writing the checkpoint after step 6: its model file written, its optimizer
    // file not, no manifest, not renamed into place. The process dies by SIGKILL (no cleanup, its
    // lock left behind).
    let out = train(&killed_spec)
        .env("RINGBENCH_TEST_CRASH_IN_SAVE", "6")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the run crashed");
    assert!(!killed.join("finished.json").exists());
    let saved: Vec<String> = std::fs::read_dir(killed.join("resume"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(saved.contains(&"step-0000003".to_owned()), "{saved:?}");
    assert!(!saved.contains(&"step-0000006".to_owned()), "{saved:?}");
    // SIGKILL from outside at three random moments within a run's length (each run resumes the
    // last); whatever the moments, the end is the same. The seed is printed to replay them.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mut rng = datasets::SplitMix64::new(u64::from(seed));
    println!("kill moments from seed {seed}");
    for _ in 0..3 {
        let fraction = rng.uniform();
        let mut child = train(&killed_spec).spawn().unwrap();
        std::thread::sleep(one_run.mul_f64(fraction));
        child.kill().unwrap();
        child.wait().unwrap();
        println!("killed at {:.0}% of a run", 100.0 * fraction);
    }
    // Once more in the middle of a save, later in the run: unless the kills above came after their
    // run finished (or past step 15), it crashes there and the next run resumes from step 12.
    let crashed = !train(&killed_spec)
        .env("RINGBENCH_TEST_CRASH_IN_SAVE", "15")
        .output()
        .unwrap()
        .status
        .success();
    let out = train(&killed_spec).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let said = if crashed {
        "resuming from step 12 of 16"
    } else {
        "finished (16 of 16 steps)"
    };
    assert!(stdout.contains(said), "{stdout}");
    assert!(
        stdout.matches("resuming from step").count() <= 1,
        "one line: {stdout}"
    );
    assert_eq!(losses(&killed), want, "the resumed run's steps");
    assert!(killed.join("model.mpk").exists() && killed.join("finished.json").exists());
    let leftovers: Vec<String> = std::fs::read_dir(killed.join("resume"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        leftovers.iter().all(|n| n.starts_with("step-")) && leftovers.len() <= 2,
        "the newest two checkpoints and no unfinished save: {leftovers:?}"
    );

    // Finished: a rerun says so and changes nothing.
    let metrics = std::fs::read(killed.join("metrics.csv")).unwrap();
    let out = train(&killed_spec).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("finished (16 of 16 steps); nothing to do"),
        "{stdout}"
    );
    assert_eq!(std::fs::read(killed.join("metrics.csv")).unwrap(), metrics);

    // A corrupt newest checkpoint is refused naming its file; the run resumes from the one before.
    std::fs::remove_file(killed.join("finished.json")).unwrap();
    let optimizer = killed.join("resume/step-0000016/optimizer.mpk");
    let bytes = std::fs::read(&optimizer).unwrap();
    std::fs::write(&optimizer, &bytes[..bytes.len() / 2]).unwrap();
    let out = train(&killed_spec).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("step-0000016/optimizer.mpk") && stderr.contains("truncated"),
        "{stderr}"
    );
    assert!(stdout.contains("resuming from step 15 of 16"), "{stdout}");
    assert_eq!(losses(&killed), want);

    // Another spec's run is refused in one line naming the key; --force starts afresh.
    std::fs::remove_file(killed.join("finished.json")).unwrap();
    let other = write_spec(
        &dir,
        "other.toml",
        &spec(&killed).replace("d_model = 32", "d_model = 64"),
    );
    let out = train(&other).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("model.d_model = 32, but this spec says 64"),
        "{stderr}"
    );
    let out = ringbench(&[
        "train".as_ref(),
        "--config".as_ref(),
        killed_spec.as_os_str(),
        "--force".as_ref(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!stdout.contains("resuming"), "{stdout}");
    assert_eq!(losses(&killed), want);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A second training into the same `out` while a live process holds its lock is refused in one line
/// naming that process; once the holder is gone, its stale lock is taken over, saying so.
#[test]
fn a_second_training_into_the_same_directory_is_refused() {
    let dir = temp_dir("train-lock");
    let out = dir.join("out");
    let spec_path = write_spec(&dir, "s.toml", &tiny_train_spec(&out, 2));
    holds_one_writer(&out, || train(&spec_path), &out.join("metrics.csv"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--ranks`, `--steps` and `--out` override the spec (the saved spec says so), the last line
/// reports the peak memory per rank, a step-0 loss on 1 rank equals the spec's 2 ranks' to float
/// rounding, and `--steps 0` is refused before anything is written.
#[test]
fn command_line_overrides_train_another_ring_length_and_place_and_report_memory() {
    let dir = temp_dir("train-overrides");
    let spec_path = write_spec(&dir, "s.toml", &tiny_train_spec(&dir.join("spec_out"), 16));
    let run = |extra: &[&str]| {
        let output = train(&spec_path).args(extra).output().unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let peak_mib = |stdout: &str| -> f64 {
        let last = stdout.lines().last().unwrap_or("");
        let at = last.find("peak memory ").expect(last) + "peak memory ".len();
        last[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let one = dir.join("one");
    let (ok, stdout, stderr) = run(&[
        "--ranks",
        "1",
        "--steps",
        "3",
        "--out",
        one.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(losses(&one).len(), 3, "--steps 3");
    let saved = std::fs::read_to_string(one.join("train.toml")).unwrap();
    assert!(
        saved.contains("ranks = 1") && saved.contains("steps = 3"),
        "{saved}"
    );
    assert!(
        !dir.join("spec_out").exists(),
        "--out must replace the spec's out"
    );
    let peak_one = peak_mib(&stdout);
    assert!(peak_one > 0.0, "{stdout}");
    let two = dir.join("two");
    let (ok, stdout, stderr) = run(&["--steps", "3", "--out", two.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("over this process's 2 rank(s)"), "{stdout}");
    let first_loss =
        |out: &Path| -> f64 { losses(out)[0].split(',').nth(1).unwrap().parse().unwrap() };
    let (a, b) = (first_loss(&one), first_loss(&two));
    assert!(
        (a - b).abs() <= 1e-5 * a.abs(),
        "step 0 loss: 1 rank {a}, 2 ranks {b}"
    );
    let none = dir.join("none");
    let (ok, _, stderr) = run(&["--steps", "0", "--out", none.to_str().unwrap()]);
    assert!(!ok && stderr.contains("--steps 0"), "{stderr}");
    assert!(!none.exists(), "a refused run wrote {}", none.display());
    std::fs::remove_dir_all(dir).unwrap();
}
