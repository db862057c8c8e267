//! Helpers shared by the command-line tests.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The peers' timeout (`--timeout`) in the fault tests: long, so that a job that ended by timing out
/// instead of hearing of the failure at once is told apart by the clock alone.
pub const PEER_TIMEOUT_S: u64 = 600;

/// A failing job must end well before its peers' timeout: the bound lies halfway between that timeout
/// and the seconds a job takes (a few, even on a loaded 2-core machine), so neither side is close.
pub const ENDS_BEFORE_TIMEOUT: Duration = Duration::from_secs(PEER_TIMEOUT_S / 2);

/// Greedy decoding on `ranks` ranks of `strategy` (the KV cache all-gathered), `max_new` tokens at
/// most, stopping at `stop`.
pub fn decoding<'a>(
    strategy: &str,
    ranks: usize,
    stop: &'a [u32],
    max_new: usize,
) -> workbench::train::Decoding<'a> {
    workbench::train::Decoding {
        max_new,
        stop,
        pad: 0,
        partition: strategies::by_name(strategy).unwrap(),
        ranks,
        timeout: Duration::from_secs(60),
        cache: Some(workbench::ring::decode::DecodeMerge::AllGather),
        batch: 0,
        on_batch: None,
        keep_logits: false,
        sampling: Default::default(),
        stop_reply: None,
    }
}

/// A file of the NumPy-written `attn` fixture.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/attn_gqa")
        .join(name)
}

/// A fresh, empty directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringbench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the `ringbench` binary of this build.
pub fn ringbench<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .args(args)
        .output()
        .expect("running ringbench")
}

/// `ringbench attn` on the fixture's q, k, v (and dO when `with_grad`), then `extra`.
pub fn attn_on_fixture(with_grad: bool, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["attn".to_string()];
    let inputs: &[&str] = if with_grad {
        &["q", "k", "v", "do"]
    } else {
        &["q", "k", "v"]
    };
    for name in inputs {
        args.push(format!("--{name}"));
        args.push(
            fixture(&format!("{name}.npy"))
                .to_string_lossy()
                .into_owned(),
        );
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A fault the command-line tests strike, on in-process ranks and on MPI processes alike: the
/// fixture with its dO on 4 ranks (not causal, so every pass is whole: 3 forward exchanges and
/// 3 + 4 backward ones a rank; on a 2 × 2 grid, 5 + 4 all-to-alls of 1 exchange each).
#[derive(Debug, Clone, Copy)]
pub struct Strike {
    /// The failing rank.
    pub rank: usize,
    /// `--fail-phase`.
    pub phase: &'static str,
    /// Its name in the error message.
    pub phase_name: &'static str,
    /// `--backward`.
    pub scheme: &'static str,
    /// `--ulysses`.
    pub ulysses: usize,
    /// `--fail-step`.
    pub step: usize,
}

/// Each phase and backward scheme, at its first, a middle or its last exchange, on every rank.
pub const STRIKES: [Strike; 7] = [
    Strike {
        rank: 0,
        phase: "fwd",
        phase_name: "forward",
        scheme: "kv",
        ulysses: 1,
        step: 0,
    },
    Strike {
        rank: 3,
        phase: "fwd",
        phase_name: "forward",
        scheme: "q",
        ulysses: 1,
        step: 2,
    },
    Strike {
        rank: 1,
        phase: "bwd",
        phase_name: "backward",
        scheme: "kv",
        ulysses: 1,
        step: 3,
    },
    Strike {
        rank: 2,
        phase: "bwd",
        phase_name: "backward",
        scheme: "kv-reverse",
        ulysses: 1,
        step: 6,
    },
    Strike {
        rank: 3,
        phase: "bwd",
        phase_name: "backward",
        scheme: "q",
        ulysses: 1,
        step: 0,
    },
    Strike {
        rank: 1,
        phase: "all-to-all",
        phase_name: "all-to-all",
        scheme: "kv",
        ulysses: 2,
        step: 8,
    },
    Strike {
        rank: 2,
        phase: "all-to-all",
        phase_name: "all-to-all",
        scheme: "q",
        ulysses: 2,
        step: 0,
    },
];

impl Strike {
    /// `ringbench attn` on the fixture with dO, 4 ranks, this fault, output to `out`.
    pub fn args(&self, out: &str) -> Vec<String> {
        attn_on_fixture(
            true,
            &[
                "--ranks",
                "4",
                "--ulysses",
                &self.ulysses.to_string(),
                "--backward",
                self.scheme,
                "--fail-rank",
                &self.rank.to_string(),
                "--fail-phase",
                self.phase,
                "--fail-step",
                &self.step.to_string(),
                "--timeout",
                &PEER_TIMEOUT_S.to_string(),
                "--out",
                out,
            ],
        )
    }

    /// What the failing rank says.
    pub fn says(&self) -> String {
        format!(
            "rank {} failed: injected fault at its {} exchange {}",
            self.rank, self.phase_name, self.step
        )
    }
}

/// One writer per directory, for a command that writes into `dir` (its `run()` makes a fresh
/// command each call, and `written` is a file it writes): while this test process holds `dir`'s lock
/// (the `flock` a run takes, with its pid in the file), the command is refused in one line naming
/// this process and writes nothing; once the lock is released, the command takes the file over
/// although the pid in it is still a live process (the lock is the truth, not the pid), says so,
/// runs, and removes its lock when it ends.
pub fn holds_one_writer(dir: &Path, run: impl Fn() -> Command, written: &Path) {
    use std::io::Write;
    std::fs::create_dir_all(dir).unwrap();
    let lock = dir.join(experiments::dir_lock::LOCK_FILE);
    let mut holder = std::fs::File::create(&lock).unwrap();
    holder.lock().unwrap();
    write!(holder, "{}", std::process::id()).unwrap();
    holder.flush().unwrap();
    let refused = run().output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another ringbench run (pid {})",
            std::process::id()
        )),
        "{stderr}"
    );
    assert!(!written.exists(), "nothing written");
    drop(holder);
    let taken = run().output().unwrap();
    let stderr = String::from_utf8_lossy(&taken.stderr);
    assert!(taken.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "taking over the lock file of pid {}, whose run no longer holds it",
            std::process::id()
        )),
        "{stderr}"
    );
    assert!(written.exists());
    assert!(!lock.exists(), "the run removed its lock when it ended");
}

/// A training spec small enough for a test (a 1-layer model of width 32 on 2 zig-zag ranks, `steps`
/// steps of 2 prompts of 2–3 lines, one resumable checkpoint every 3 steps) writing into `out`.
pub fn tiny_train_spec(out: &Path, steps: usize) -> String {
    format!(
        r#"
[model]
d_model = 32
layers = 1
heads = 2
kv_heads = 1
ffn_multiple_of = 16
rope_theta = 10000.0
ffn_chunk = 64

[ring]
ranks = 2
strategy = "zigzag"
forward = "cw"
backward = "kv"
kernel = "fused"

[train]
steps = {steps}
batch = 2
lr = 1e-3
warmup_steps = 2
min_lr_ratio = 0.1
weight_decay = 0.01
grad_clip = 1.0
seed = 7
lm_weight = 0.1
min_lines = 2
num_lines = 3
checksum_every = 4
out = "{}"
stop_loss = 0.0
max_minutes = 0.0
checkpoint_every = 3
"#,
        out.display()
    )
}
