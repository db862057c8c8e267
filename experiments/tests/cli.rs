//! `ringbench attn` end to end: NumPy-written float64 inputs, NumPy float64 reference, bad input.

use experiments::npy;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/attn_gqa")
        .join(name)
}

fn ringbench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .args(args)
        .output()
        .expect("running ringbench")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringbench-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// max |got − want| / max |want|.
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    let err = got.iter().zip(want).fold(0.0f64, |m, (&g, &w)| {
        m.max((f64::from(g) - f64::from(w)).abs())
    });
    err / scale
}

#[test]
fn attn_matches_numpy_reference_for_every_strategy() {
    let f = |n: &str| fixture(n).to_string_lossy().into_owned();
    for (strategy, ranks, fwd, bwd) in [
        ("zigzag", "4", "cw", "kv"),
        ("striped", "3", "ccw", "q"),
        ("contiguous", "2", "cw", "kv-reverse"),
    ] {
        let out = temp_dir(strategy);
        let status = ringbench(&[
            "attn",
            "--q",
            &f("q.npy"),
            "--k",
            &f("k.npy"),
            "--v",
            &f("v.npy"),
            "--do",
            &f("do.npy"),
            "--ranks",
            ranks,
            "--strategy",
            strategy,
            "--causal",
            "--fwd-dir",
            fwd,
            "--bwd",
            bwd,
            "--out",
            &out.to_string_lossy(),
        ]);
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        for name in ["out", "lse", "dq", "dk", "dv"] {
            let got = npy::read(&out.join(format!("{name}.npy"))).unwrap();
            let want = npy::read(&fixture(&format!("expected_{name}.npy"))).unwrap();
            assert_eq!(got.shape, want.shape, "{strategy} {name} shape");
            let err = rel_err(&got.data, &want.data);
            assert!(err <= 1e-5, "{strategy} {name}: rel err {err:.3e}");
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn bad_input_is_one_clear_line() {
    let f = |n: &str| fixture(n).to_string_lossy().into_owned();
    let out = temp_dir("bad");
    let o = out.to_string_lossy().into_owned();
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--ranks",
                "5",
                "--out",
                &o,
            ],
            "sequence length 24 is not divisible by 10 (2 * ranks) required by zigzag",
        ),
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("q.npy"),
                "--v",
                &f("v.npy"),
                "--out",
                &o,
            ],
            "v [batch, seq, kv_heads, head_dim]: expected shape [2, 24, 4, 8], got [2, 24, 2, 8]",
        ),
        (
            &[
                "--q",
                &f("missing.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--out",
                &o,
            ],
            "missing.npy",
        ),
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--strategy",
                "spiral",
                "--out",
                &o,
            ],
            "unknown strategy 'spiral'",
        ),
    ];
    for (args, message) in cases {
        let mut full = vec!["attn"];
        full.extend_from_slice(args);
        let output = ringbench(&full);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(message),
            "expected '{message}' in: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
    let corrupt =
        std::env::temp_dir().join(format!("ringbench-corrupt-{}.npy", std::process::id()));
    std::fs::write(&corrupt, b"\x93NUMPY garbage").unwrap();
    let output = ringbench(&[
        "attn",
        "--q",
        &corrupt.to_string_lossy(),
        "--k",
        &f("k.npy"),
        "--v",
        &f("v.npy"),
        "--out",
        &o,
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("ringbench-corrupt"));
    let _ = std::fs::remove_file(corrupt);
}
