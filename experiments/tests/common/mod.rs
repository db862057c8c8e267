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

/// `ringbench attn` on the fixture with dO, 4 ranks, rank 1 failing at ring exchange 4 and output to
/// `out`. 4 ranks make 3 forward exchanges (0–2), so exchange 4 is inside the backward.
pub fn backward_fault_args(out: &str) -> Vec<String> {
    attn_on_fixture(
        true,
        &[
            "--ranks",
            "4",
            "--fail-rank",
            "1",
            "--fail-step",
            "4",
            "--timeout",
            &PEER_TIMEOUT_S.to_string(),
            "--out",
            out,
        ],
    )
}
