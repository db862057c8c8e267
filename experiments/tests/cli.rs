//! `ringbench attn` end to end: NumPy-written float64 inputs, NumPy float64 reference, bad input.

mod common;

use common::{
    ENDS_BEFORE_TIMEOUT, STRIKES, attn_on_fixture, fixture, ringbench, temp_dir, tiny_train_spec,
};
use experiments::npy;
use std::path::Path;

use reference::compare::{deviation, rel_err};

/// Every output in `out` (out, lse, dq, dk, dv) has the shape of `expected(name)` and lies within
/// 1e-5 of it, relative to its largest magnitude.
fn assert_matches(out: &Path, expected: impl Fn(&str) -> std::path::PathBuf, label: &str) {
    for name in ["out", "lse", "dq", "dk", "dv"] {
        let got = npy::read(&out.join(format!("{name}.npy"))).unwrap();
        let want = npy::read(&expected(&format!("expected_{name}.npy"))).unwrap();
        assert_eq!(got.shape, want.shape, "{label} {name} shape");
        let d = deviation(&got.data, &want.data);
        assert!(d.within(1e-5), "{label} {name}: {d}");
    }
}

#[test]
fn attn_matches_numpy_reference_for_every_strategy() {
    // Every registered strategy (a new one joins by registering), each with one of these settings.
    let settings = [
        ("4", "cw", "kv"),
        ("3", "ccw", "q"),
        ("2", "cw", "kv-reverse"),
    ];
    for (i, strategy) in strategies::names().into_iter().enumerate() {
        let (ranks, fwd, bwd) = settings[(i + 2) % settings.len()];
        let out = temp_dir(strategy);
        let o = out.to_string_lossy();
        let status = ringbench(&attn_on_fixture(
            true,
            &[
                "--ranks",
                ranks,
                "--strategy",
                strategy,
                "--causal",
                "--forward",
                fwd,
                "--backward",
                bwd,
                "--out",
                &o,
            ],
        ));
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        assert_matches(&out, fixture, strategy);
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn bad_input_is_one_clear_line() {
    let f = |n: &str| fixture(n).to_string_lossy().into_owned();
    let out = temp_dir("bad");
    let o = out.to_string_lossy().into_owned();
    let cases: [(&[&str], &str); 8] = [
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--ranks",
                "0",
                "--out",
                &o,
            ],
            "ranks must be at least 1, got 0",
        ),
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--doc-lens",
                "5,x",
                "--out",
                &o,
            ],
            "--doc-lens: 'x' is not a length",
        ),
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--doc-lens",
                "0,24",
                "--out",
                &o,
            ],
            "document lengths [0, 24] must be positive and sum to the sequence length 24",
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
            "missing.npy: No such file or directory (os error 2)",
        ),
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--ranks",
                "2",
                "--fail-rank",
                "5",
                "--fail-phase",
                "fwd",
                "--fail-step",
                "0",
                "--out",
                &o,
            ],
            "fault injected at rank 5, but the job has ranks 0 to 1",
        ),
        (
            &[
                "--q",
                &f("q.npy"),
                "--k",
                &f("k.npy"),
                "--v",
                &f("v.npy"),
                "--ranks",
                "2",
                "--fail-rank",
                "1",
                "--fail-phase",
                "fwd",
                "--fail-step",
                "1",
                "--out",
                &o,
            ],
            "fault injected at forward exchange 1 of rank 1, but each rank makes 1 forward \
             exchange(s) in this job (0 to 0)",
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
        // The cause is said once, not repeated by the error's chain.
        let cause = stderr.trim().rsplit(": ").next().unwrap_or_default();
        assert_eq!(stderr.matches(cause).count(), 1, "said twice: {stderr}");
    }
    // A command line clap cannot parse (unknown flag, malformed value) is its usage message and
    // exit status 2; everything else that is wrong is one line and exit status 1.
    for args in [
        vec!["attn", "--bogus"],
        vec![
            "attn",
            "--q",
            "q.npy",
            "--k",
            "k.npy",
            "--v",
            "v.npy",
            "--out",
            &o,
            "--forward",
            "up",
        ],
    ] {
        let output = ringbench(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
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

/// A tiny training run end to end, then the failure modes of its checkpoint and spec.
#[test]
fn train_eval_and_checkpoint_errors() {
    let dir = temp_dir("train");
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("ckpt");
    // The tiny run on another ring: striped, counter-clockwise, the q backward.
    let spec = tiny_train_spec(&ckpt, 3).replace(
        "strategy = \"zigzag\"\nforward = \"cw\"\nbackward = \"kv\"",
        "strategy = \"striped\"\nforward = \"ccw\"\nbackward = \"q\"",
    );
    assert!(spec.contains("backward = \"q\""));
    let spec_path = dir.join("spec.toml");
    std::fs::write(&spec_path, &spec).unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let out = ringbench(&["train", "--config", &s(&spec_path)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read_to_string(ckpt.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), 4, "header and 3 steps: {metrics}");

    // A curriculum stage starts from that checkpoint; a missing one, or one of another shape, is one line.
    for (stage, init, message) in [
        ("stage2", s(&ckpt), None),
        (
            "stage3",
            s(&dir.join("nowhere")),
            Some("no such checkpoint directory"),
        ),
    ] {
        let staged = spec.replace(&s(&ckpt), &s(&dir.join(stage))).replace(
            "stop_loss = 0.0",
            &format!("init = \"{init}\"\nstop_loss = 0.0"),
        );
        let staged_path = dir.join("stage2.toml");
        std::fs::write(&staged_path, &staged).unwrap();
        let out = ringbench(&["train", "--config", &s(&staged_path)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match message {
            None => assert!(out.status.success(), "{stderr}"),
            Some(m) => assert!(!out.status.success() && stderr.contains(m), "{stderr}"),
        }
    }
    assert!(ckpt.join("loss.svg").exists());

    let cases = dir.join("cases.jsonl");
    let out = ringbench(&[
        "gen-lines",
        "--num-lines",
        "2,3",
        "--cases",
        "3",
        "--out",
        &s(&cases),
    ]);
    assert!(out.status.success());
    let csv = dir.join("acc.csv");
    // With the KV cache (each merge) and without it: the same replies, case by case.
    let mut replies = Vec::new();
    for (i, mode) in [
        ["--merge", "allgather"],
        ["--merge", "ring"],
        ["--no-cache", ""],
    ]
    .iter()
    .enumerate()
    {
        let written = dir.join(format!("replies{i}.jsonl"));
        let mut args = vec![
            "eval-lines",
            "--checkpoint",
            &s(&ckpt),
            "--cases",
            &s(&cases),
            "--ranks",
            "2",
            "--strategy",
            "striped",
            "--out",
            &s(&csv),
            "--replies",
            &s(&written),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(mode.iter().filter(|a| !a.is_empty()).map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ringbench(&args);
        assert!(
            out.status.success(),
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let table = std::fs::read_to_string(&csv).unwrap();
        assert!(
            table.starts_with(
                "num_lines,cases,correct,accuracy,prompt_tokens,prefill_seconds,decode_seconds,\
                 decode_bytes_per_token_per_rank\n2,3,"
            ),
            "{table}"
        );
        let text = std::fs::read_to_string(&written).unwrap();
        assert_eq!(text.lines().count(), 6, "{text}");
        assert!(text.starts_with("{\"num_lines\":2,\"expected\":"), "{text}");
        replies.push(text);
    }
    assert_eq!(replies[0], replies[1], "the two merges' replies");
    assert_eq!(
        replies[0], replies[2],
        "the cache's replies and the recompute's"
    );
    // A merge that is not one of the two: clap's usage message, exit 2, nothing written.
    std::fs::remove_file(&csv).unwrap();
    let out = ringbench(&[
        "eval-lines",
        "--checkpoint",
        &s(&ckpt),
        "--cases",
        &s(&cases),
        "--merge",
        "tree",
        "--out",
        &s(&csv),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("allgather, ring"), "{stderr}");
    assert!(!csv.exists());

    // Zero ranks: one typed error line, for evaluation and training alike (no rank ever starts, so
    // no transport waits: the exact text is the typed error, not a timeout).
    let out = ringbench(&[
        "eval-lines",
        "--checkpoint",
        &s(&ckpt),
        "--cases",
        &s(&cases),
        "--ranks",
        "0",
        "--out",
        &s(&csv),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim(), "error: ranks must be at least 1, got 0");
    let zero = dir.join("zero.toml");
    std::fs::write(&zero, spec.replace("ranks = 2", "ranks = 0")).unwrap();
    let out = ringbench(&["train", "--config", &s(&zero)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ranks must be at least 1, got 0"),
        "{stderr}"
    );

    // A checkpoint that does not match its config.
    let config = std::fs::read_to_string(ckpt.join("config.json")).unwrap();
    std::fs::write(
        ckpt.join("config.json"),
        config.replace("\"d_model\": 32", "\"d_model\": 64"),
    )
    .unwrap();
    let out = ringbench(&[
        "eval-lines",
        "--checkpoint",
        &s(&ckpt),
        "--cases",
        &s(&cases),
        "--out",
        &s(&csv),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not match config.json"), "{stderr}");

    // A JSONL case without expected_number: the error names the line.
    std::fs::write(&cases, "{\"prompt\": \"x\", \"expected_number\": 1, \"num_lines\": 1}\n{\"prompt\": \"y\", \"num_lines\": 1}\n").unwrap();
    std::fs::write(ckpt.join("config.json"), config).unwrap();
    let out = ringbench(&[
        "eval-lines",
        "--checkpoint",
        &s(&ckpt),
        "--cases",
        &s(&cases),
        "--out",
        &s(&csv),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cases.jsonl:2:") && stderr.contains("expected_number"),
        "{stderr}"
    );

    // An unknown key in the spec names the key and the line.
    std::fs::write(&spec_path, spec.replace("seed = 7", "seed = 7\nsead = 2")).unwrap();
    let out = ringbench(&["train", "--config", &s(&spec_path)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("sead") && stderr.contains("line"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A rank failing at an exchange of each phase and backward scheme (the covering rows of
/// [`STRIKES`]: the first, a middle and the last exchange, every rank) ends the job with one line
/// naming the rank, the phase and the exchange, long before the peers' timeout, and writes nothing.
#[test]
fn a_failing_rank_stops_the_job_naming_it_and_writes_nothing() {
    let dir = temp_dir("fault");
    for strike in STRIKES {
        let out = dir.join(format!(
            "{}-{}-{}",
            strike.phase, strike.scheme, strike.step
        ));
        let start = std::time::Instant::now();
        let output = ringbench(&strike.args(&out.to_string_lossy()));
        let elapsed = start.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{strike:?}: {stderr}");
        assert!(stderr.contains(&strike.says()), "{strike:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{strike:?}: {stderr}");
        // The failed rank tells its peers at once: they do not wait out their timeout.
        assert!(
            elapsed < ENDS_BEFORE_TIMEOUT,
            "{strike:?}: took {elapsed:?}"
        );
        assert!(!out.exists(), "{strike:?}: nothing written");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_non_finite_input_is_named_with_its_index() {
    let dir = temp_dir("nan");
    let mut q = npy::read(&fixture("q.npy")).unwrap();
    let (h, d) = (q.shape[2], q.shape[3]);
    q.data[5 * h * d] = f32::NAN; // q[0, 5, 0, 0] of [batch, seq, heads, head_dim]
    let path = dir.join("q_nan.npy");
    npy::write(&path, &q).unwrap();
    let mut k = npy::read(&fixture("k.npy")).unwrap();
    let last = k.data.len() - 1;
    k.data[last] = f32::INFINITY;
    let k_path = dir.join("k_inf.npy");
    npy::write(&k_path, &k).unwrap();
    let f = |n: &str| fixture(n).to_string_lossy().into_owned();
    let p = |p: &Path| p.to_string_lossy().into_owned();
    let o = p(&dir.join("out"));
    for (q, k, message) in [
        (
            p(&path),
            f("k.npy"),
            "q[0, 5, 0, 0] is NaN: inputs must be finite",
        ),
        (
            f("q.npy"),
            p(&k_path),
            "k[1, 23, 1, 7] is inf: inputs must be finite",
        ),
    ] {
        let output = ringbench(&[
            "attn",
            "--q",
            &q,
            "--k",
            &k,
            "--v",
            &f("v.npy"),
            "--ranks",
            "2",
            "--causal",
            "--out",
            &o,
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(message),
            "expected '{message}' in: {stderr}"
        );
        assert!(!dir.join("out").exists(), "nothing written");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Writes `data` as an .npy of `shape` in the given order and element type.
fn write_npy<T: npyz::AutoSerialize + Copy>(
    path: &Path,
    shape: &[u64],
    order: npyz::Order,
    data: &[T],
) {
    use npyz::WriterBuilder;
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .order(order)
        .writer(std::io::BufWriter::new(
            std::fs::File::create(path).unwrap(),
        ))
        .begin_nd()
        .unwrap();
    writer.extend(data.iter().copied()).unwrap();
    writer.finish().unwrap();
}

/// Bad files, one error line each that names the path, exit 1.
#[test]
fn bad_files_are_one_line_naming_the_path() {
    let dir = temp_dir("bad-files");
    let p = |p: &Path| p.to_string_lossy().into_owned();
    let f = |n: &str| p(&fixture(n));
    let q = npy::read(&fixture("q.npy")).unwrap();
    let shape: Vec<u64> = q.shape.iter().map(|&d| d as u64).collect();
    let int32 = dir.join("q_int32.npy");
    let ints: Vec<i32> = q.data.iter().map(|&x| x as i32).collect();
    write_npy(&int32, &shape, npyz::Order::C, &ints);
    let flat = dir.join("q_3d.npy");
    write_npy(
        &flat,
        &[shape[0], shape[1], shape[2] * shape[3]],
        npyz::Order::C,
        &q.data,
    );
    let spec = dir.join("broken.toml");
    std::fs::write(&spec, "[model\nd_model = 32\n").unwrap();
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let missing = dir.join("no-such-checkpoint");
    let o = p(&dir.join("out"));
    let attn_with_q = |q: &Path| -> Vec<String> {
        [
            "attn",
            "--q",
            &p(q),
            "--k",
            &f("k.npy"),
            "--v",
            &f("v.npy"),
            "--out",
            &o,
        ]
        .map(String::from)
        .to_vec()
    };
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            attn_with_q(&int32),
            format!(
                "{}: dtype '<i4' is not supported; expected float32 or float64",
                int32.display()
            ),
        ),
        (
            attn_with_q(&flat),
            format!(
                "{}: expected a 4-D array (batch, seq, heads, head_dim), got shape [2, 24, 32]",
                flat.display()
            ),
        ),
        (
            vec!["train".into(), "--config".into(), p(&spec)],
            format!("{}", spec.display()),
        ),
        (vec!["run".into(), p(&spec)], format!("{}", spec.display())),
        (
            vec![
                "eval-lines".into(),
                "--checkpoint".into(),
                p(&missing),
                "--cases".into(),
                p(&empty),
                "--out".into(),
                p(&dir.join("acc.csv")),
            ],
            format!("{}: no such checkpoint directory", missing.display()),
        ),
    ];
    for (args, message) in cases {
        let output = ringbench(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&message),
            "expected '{message}' in: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
    // The TOML error says where: line 1 of the file.
    let output = ringbench(&["train", "--config", &p(&spec)]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("line 1"));
    // An empty JSONL file of cases is an error naming it, not an accuracy table of nothing.
    let err = datasets::read_jsonl(&empty).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("{}: no cases (the file has no JSON lines)", empty.display())
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A Fortran-order array is read in its logical order: the same results as the C-order fixture.
#[test]
fn a_fortran_order_array_gives_the_same_results() {
    let dir = temp_dir("fortran");
    let q = npy::read(&fixture("q.npy")).unwrap();
    let [b, s, h, d] = <[usize; 4]>::try_from(q.shape.as_slice()).unwrap();
    // Element (i, j, k, l) sits at i + b·(j + s·(k + h·l)) in Fortran order.
    let mut fortran = vec![0.0f32; q.data.len()];
    for (c_index, &x) in q.data.iter().enumerate() {
        let (l, rest) = (c_index % d, c_index / d);
        let (k, rest) = (rest % h, rest / h);
        let (j, i) = (rest % s, rest / s);
        fortran[i + b * (j + s * (k + h * l))] = x;
    }
    let path = dir.join("q_fortran.npy");
    write_npy(
        &path,
        &[b as u64, s as u64, h as u64, d as u64],
        npyz::Order::Fortran,
        &fortran,
    );
    assert_eq!(npy::read(&path).unwrap(), q);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn documents_and_padding_from_the_command_line() {
    let run = |name: &str, extra: &[&str]| {
        let out = temp_dir(name);
        let o = out.to_string_lossy().to_string();
        let mut args = vec!["--causal", "--out", &o];
        args.extend_from_slice(extra);
        let status = ringbench(&attn_on_fixture(true, &args));
        (status, out)
    };
    let read = |dir: &Path, name: &str| npy::read(&dir.join(format!("{name}.npy"))).unwrap();
    let want = npy::read(&fixture("expected_out.npy")).unwrap();
    let [b, s, h, d]: [usize; 4] = want.shape.clone().try_into().unwrap();
    // Padding: 24 tokens do not split into zig-zag's 10 chunks on 5 ranks, so they run padded to 30,
    // and the summary line says so. One document of all 24 tokens is no document at all. The old
    // flag names are aliases of the spec's words.
    for (name, extra, padded) in [
        ("padded", vec!["--ranks", "5", "--strategy", "zigzag"], true),
        ("one-doc", vec!["--ranks", "3", "--doc-lens", "24"], false),
        (
            "aliases",
            vec![
                "--ranks",
                "2",
                "--fwd-dir",
                "ccw",
                "--bwd",
                "q",
                "--strategies",
                "striped",
            ],
            false,
        ),
    ] {
        let (status, dir) = run(name, &extra);
        assert!(
            status.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        let stdout = String::from_utf8_lossy(&status.stdout);
        assert_eq!(
            stdout.contains("cannot split 24 tokens over 5 ranks: padded to 30"),
            padded,
            "{name}: {stdout}"
        );
        assert_matches(&dir, fixture, name);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // Two documents of 10 and 14: the first document's queries see what they saw before (causal),
    // the second's no longer see the first document.
    let (status, dir) = run(
        "two-docs",
        &[
            "--ranks",
            "4",
            "--strategy",
            "striped",
            "--doc-lens",
            "10,14",
        ],
    );
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let got = read(&dir, "out");
    let row = |data: &[f32], bi: usize, t: usize| {
        data[((bi * s + t) * h) * d..((bi * s + t) * h + h) * d].to_vec()
    };
    for bi in 0..b {
        for t in 0..s {
            let (g, w) = (row(&got.data, bi, t), row(&want.data, bi, t));
            let same = rel_err(&g, &w) <= 1e-5;
            assert_eq!(same, t < 10, "batch {bi}, position {t}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let (status, dir) = run("bad-docs", &["--doc-lens", "10,10"]);
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "document lengths [10, 10] must be positive and sum to the sequence length 24"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn packed_documents_match_numpy() {
    // `make_attn_fixture.py`: documents 7/12/11, causal inside each, NumPy's float64 reference.
    let packed = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/attn_packed")
            .join(name)
    };
    for (strategy, ranks) in [("doc-zigzag", "3"), ("zigzag", "4"), ("striped", "2")] {
        let out = temp_dir(&format!("packed-{strategy}"));
        let mut args: Vec<String> = vec!["attn".into()];
        for name in ["q", "k", "v", "do"] {
            args.push(format!("--{name}"));
            args.push(
                packed(&format!("{name}.npy"))
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        for a in [
            "--doc-lens",
            "7,12,11",
            "--causal",
            "--strategy",
            strategy,
            "--ranks",
            ranks,
            "--out",
            &out.to_string_lossy(),
        ] {
            args.push(a.into());
        }
        let status = ringbench(&args);
        assert!(
            status.status.success(),
            "{strategy}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        assert_matches(&out, packed, strategy);
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// A sliding window, a logit cap and attention sinks (`make_attn_fixture.py`'s `attn_variants/`:
/// documents 9/15, causal, window 6, cap 2, one sink logit per head) match NumPy's float64 reference,
/// the sinks' gradient included, on several strategies and rank counts; and their bad values are one
/// line and exit 1.
#[test]
fn window_softcap_and_sinks_match_numpy() {
    let fixture = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/attn_variants")
            .join(name)
    };
    let inputs = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = vec!["attn".into()];
        for name in ["q", "k", "v", "do"] {
            args.push(format!("--{name}"));
            args.push(
                fixture(&format!("{name}.npy"))
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let sinks = fixture("sinks.npy").to_string_lossy().into_owned();
    let variant = [
        "--doc-lens",
        "9,15",
        "--causal",
        "--window",
        "6",
        "--softcap",
        "2",
    ];
    for (strategy, ranks, kernel) in [
        ("zigzag", "2", "fused"),
        ("striped", "3", "generic"),
        ("contiguous", "4", "fused"),
        ("doc-zigzag", "3", "generic"),
    ] {
        let out = temp_dir(&format!("variants-{strategy}"));
        let o = out.to_string_lossy().into_owned();
        let mut extra = variant.to_vec();
        extra.extend(["--sinks", &sinks, "--strategy", strategy, "--ranks", ranks]);
        extra.extend(["--kernel", kernel, "--out", &o]);
        let status = ringbench(&inputs(&extra));
        assert!(
            status.status.success(),
            "{strategy}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        assert_matches(&out, fixture, strategy);
        let got = npy::read(&out.join("dsinks.npy")).unwrap();
        let want = npy::read(&fixture("expected_dsinks.npy")).unwrap();
        assert_eq!(got.shape, [4]);
        let d = deviation(&got.data, &want.data);
        assert!(d.within(1e-5), "{strategy} dsinks: {d}");
        std::fs::remove_dir_all(&out).unwrap();
    }
    // Bad values: one line naming the value, exit 1.
    let dir = temp_dir("variants-bad");
    let short = dir.join("short.npy");
    write_npy(&short, &[3], npyz::Order::C, &[0.0f32, 1.0, 2.0]);
    let nan = dir.join("nan.npy");
    write_npy(&nan, &[4], npyz::Order::C, &[0.0f32, f32::NAN, 2.0, 3.0]);
    let o = dir.join("out").to_string_lossy().into_owned();
    for (extra, message) in [
        (vec!["--window", "0"], "window = 0: expected at least 1 key"),
        (
            vec!["--softcap", "0"],
            "softcap = 0: expected a finite number above 0",
        ),
        (
            vec!["--softcap", "-2"],
            "softcap = -2: expected a finite number above 0",
        ),
        (
            vec!["--softcap", "NaN"],
            "softcap = NaN: expected a finite number above 0",
        ),
        (
            vec!["--sinks", short.to_str().unwrap()],
            "sinks [heads]: expected shape [4], got [3]",
        ),
        (vec!["--sinks", nan.to_str().unwrap()], "sinks[1] is NaN"),
        (
            vec!["--sinks", fixture("q.npy").to_str().unwrap()],
            "expected a 1-D array of one logit per query head",
        ),
    ] {
        let mut args = extra.clone();
        args.extend(["--out", &o]);
        let output = ringbench(&inputs(&args));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(stderr.contains(message), "{extra:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--backend wgpu` (the generic kernel on the device) on the NumPy fixture, within 1e-5 of NumPy's
/// float64 reference; no ring step copies between host and device.
#[cfg(feature = "wgpu")]
#[test]
fn attn_on_wgpu_matches_numpy() {
    let out = temp_dir("wgpu");
    let o = out.to_string_lossy();
    let run = ringbench(&attn_on_fixture(
        true,
        &[
            "--ranks",
            "4",
            "--strategy",
            "zigzag",
            "--causal",
            "--bwd",
            "q",
            "--kernel",
            "generic",
            "--backend",
            "wgpu",
            "--out",
            &o,
        ],
    ));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("zigzag on wgpu, kernel generic;")
            && stdout.contains("bytes between host and device, 0 of them in ring steps"),
        "{stdout}"
    );
    assert_matches(&out, fixture, "wgpu");
    std::fs::remove_dir_all(&out).unwrap();
}

/// `--kernel fused` on wgpu is the CubeCL device kernel, never the CPU kernel on host copies: the
/// summary names `cubecl-fused`, no ring step copies between host and device, and the outputs match
/// NumPy's float64 reference within 1e-5. In bf16, which this device does not store (Mesa's software
/// Vulkan device), it is one line saying so, exit 1, and nothing is written.
#[cfg(feature = "wgpu")]
#[test]
fn the_cpu_kernel_never_runs_silently_on_a_device() {
    let out = temp_dir("wgpu-fused");
    let o = out.join("o").to_string_lossy().into_owned();
    let fused_on_wgpu = [
        "--ranks",
        "2",
        "--strategy",
        "zigzag",
        "--causal",
        "--kernel",
        "fused",
        "--backend",
        "wgpu",
        "--out",
        &o,
    ];
    let run = ringbench(&attn_on_fixture(true, &fused_on_wgpu));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("zigzag on wgpu, kernel cubecl-fused;")
            && stdout.contains("bytes between host and device, 0 of them in ring steps"),
        "{stdout}"
    );
    assert_matches(&out.join("o"), fixture, "wgpu fused");
    std::fs::remove_dir_all(&out).unwrap();

    let mut in_bf16 = fused_on_wgpu.to_vec();
    in_bf16.extend(["--dtype", "bf16"]);
    let run = ringbench(&attn_on_fixture(true, &in_bf16));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().count() == 1
            && stderr
                .contains("bf16 blocks on the device need a backend that stores and computes bf16")
            && stderr.contains("wgpu"),
        "{stderr}"
    );
    assert!(!out.join("o").join("out.npy").exists());
}

/// A backend this binary lacks, or an unknown one, is one line naming it.
#[test]
fn unavailable_backends_are_one_line() {
    let out = temp_dir("backend");
    let o = out.to_string_lossy();
    let mut cases = vec![(
        "metal",
        "unknown backend 'metal'; expected one of: flex, wgpu, cuda",
    )];
    if !cfg!(feature = "cuda") {
        cases.push(("cuda", "backend cuda: this ringbench was built without it"));
    }
    if !cfg!(feature = "wgpu") {
        cases.push(("wgpu", "backend wgpu: this ringbench was built without it"));
    }
    for (backend, message) in cases {
        let run = ringbench(&attn_on_fixture(
            false,
            &["--backend", backend, "--out", &o],
        ));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{backend}");
        assert!(stderr.contains(message), "{backend}: {stderr}");
        assert!(!stderr.contains("panicked"), "{backend}: {stderr}");
    }
}

/// `bench attn` with a length or a rank count of 0 is one line naming the flag and exit 2 (it used
/// to time nothing and print an empty table).
#[test]
fn bench_lengths_and_rank_counts_of_zero_are_refused() {
    for (flag, args) in [
        ("--seq", ["bench", "attn", "--seq", "0,64", "--ranks", "1"]),
        (
            "--ranks",
            ["bench", "attn", "--seq", "64", "--ranks", "1,0"],
        ),
        (
            "--prefill",
            ["bench", "model", "--prefill", "0", "--ranks", "1"],
        ),
        (
            "--ranks",
            ["bench", "model", "--prefill", "64", "--ranks", "0"],
        ),
    ] {
        let output = ringbench(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(
            stderr.starts_with(&format!("error: invalid value '0' for '{flag} "))
                && stderr
                    .lines()
                    .next()
                    .unwrap()
                    .ends_with("must be at least 1"),
            "{stderr}"
        );
    }
}

/// `bench model` writes one row per work and rank count, each with the model's sizes and parameter
/// count as the config gives them, a positive rate and the machine it ran on; an unknown strategy
/// is one line naming it.
#[test]
fn bench_model_writes_a_row_per_work_and_rank_count() {
    let out = temp_dir("bench-model");
    let mut args: Vec<std::ffi::OsString> = [
        "bench",
        "model",
        "--d-model",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--prefill",
        "32",
        "--decode",
        "2",
        "--decode-prompt",
        "16",
        "--train-seq",
        "16",
        "--train-batch",
        "2",
        "--ranks",
        "1,2",
        "--repeats",
        "1",
        "--out",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(out.clone().into());
    let output = ringbench(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = experiments::results::Table::read(&out.join("bench_model.csv")).unwrap();
    let works: Vec<(String, String)> = table
        .rows
        .iter()
        .map(|r| {
            (
                r.get("work").unwrap().to_owned(),
                r.get("ranks").unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = ["prefill", "decode", "train"]
        .iter()
        .flat_map(|w| ["1", "2"].map(|n| (w.to_string(), n.to_string())))
        .collect();
    assert_eq!(works, want);
    let params =
        workbench::model::LlamaConfig::new(datasets::Tokenizer::line_retrieval().vocab_size())
            .with_d_model(32)
            .with_layers(1)
            .with_heads(2)
            .with_kv_heads(1)
            .num_params();
    for row in &table.rows {
        assert_eq!(row.num("params"), params as f64);
        let rate = row.num("tokens_per_s");
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
        assert!(!row.get("cpu").unwrap().is_empty());
        assert!(row.num("threads") >= 1.0);
    }
    // The tokens each work processes: the prompt, the new tokens, the step's.
    let tokens: Vec<f64> = table.rows.iter().map(|r| r.num("tokens")).collect();
    assert_eq!(tokens, [32.0, 32.0, 2.0, 2.0, 32.0, 32.0]);
    let bad = ringbench(&["bench", "model", "--strategy", "nope", "--prefill", "16"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("nope") && !stderr.contains("panicked"),
        "{stderr}"
    );
    std::fs::remove_dir_all(out).unwrap();
}

/// `attn --nccl-id-file` and `train --nccl-id-file` refuse in one line, naming what is missing: the
/// launcher's variables, or (on a machine without an NVIDIA driver) CUDA itself (or NCCL, or a
/// device, where the libraries are installed without one). On a machine with the driver, one rank
/// of two would wait for its peer, so only the first case runs there.
#[cfg(feature = "nccl")]
#[test]
fn nccl_ranks_refuse_in_one_line_without_a_launcher_or_cuda() {
    let out = temp_dir("nccl-refusals");
    let id = out.join("nccl.id").to_string_lossy().into_owned();
    let o = out.join("o").to_string_lossy().into_owned();
    let attn = attn_on_fixture(
        true,
        &[
            "--ranks",
            "2",
            "--nccl-id-file",
            &id,
            "--backend",
            "flex",
            "--out",
            &o,
        ],
    );
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/line_retrieval.toml");
    let train: Vec<String> = ["train", "--config", spec, "--nccl-id-file", &id]
        .map(String::from)
        .to_vec();
    let run = |args: &[String], env: &[(&str, &str)]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"));
        command.args(args);
        for var in [
            "RANK",
            "WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
        ] {
            command.env_remove(var);
        }
        command.envs(env.iter().copied());
        let run = command.output().expect("running ringbench");
        (
            run.status.code(),
            String::from_utf8_lossy(&run.stderr).into_owned(),
        )
    };
    for args in [&attn, &train] {
        let (code, stderr) = run(args, &[]);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.lines().count() == 1 && stderr.contains("--nccl-id-file needs one of [\"RANK\""),
            "{args:?}: {stderr}"
        );
        let cuda = std::path::Path::new("/proc/driver/nvidia").exists();
        if !cuda {
            let (code, stderr) = run(args, &[("RANK", "0"), ("WORLD_SIZE", "2")]);
            assert_eq!(code, Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.lines().count() == 1
                    && stderr.contains("rank 0: ")
                    && stderr.contains(" is not available: "),
                "{args:?}: {stderr}"
            );
        }
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// The GPU check's comparison (`scripts/npy_close.py`, NumPy-free) passes `attn`'s outputs on the
/// fixture, and fails a NaN, a wrong value and a wrong fixture: it cannot pass what the tests fail.
#[test]
fn the_gpu_checks_npy_comparison_fails_what_the_tests_fail() {
    let out = temp_dir("npy-close");
    let o = out.to_string_lossy().into_owned();
    let run = ringbench(&attn_on_fixture(
        true,
        &["--ranks", "2", "--causal", "--out", &o],
    ));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let close = |fixture_dir: &Path| {
        let run = std::process::Command::new("python3")
            .arg(root.join("scripts/npy_close.py"))
            .arg(&out)
            .arg(fixture_dir)
            .arg("1e-5")
            .output()
            .expect("running python3");
        (
            run.status.code(),
            String::from_utf8_lossy(&run.stdout).into_owned(),
        )
    };
    let gqa = fixture("q.npy").parent().unwrap().to_path_buf();
    let (code, said) = close(&gqa);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(said.matches(": ok: ").count(), 5, "{said}");
    // Another fixture (other shapes) fails.
    let packed = gqa.parent().unwrap().join("attn_packed");
    assert_eq!(close(&packed).0, Some(1));
    // A value off by 1e-4 of the scale fails; so does a NaN.
    let path = out.join("dk.npy");
    let mut dk = npy::read(&path).unwrap();
    assert!(dk.data.iter().all(|x| x.is_finite()), "checked above");
    let scale = dk.data.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    dk.data[7] += 1e-4 * scale;
    npy::write(&path, &dk).unwrap();
    let (code, said) = close(&gqa);
    assert!(code == Some(1) && said.contains("dk: FAILED"), "{said}");
    dk.data[7] = f32::NAN;
    npy::write(&path, &dk).unwrap();
    let (code, said) = close(&gqa);
    assert!(code == Some(1) && said.contains("not finite"), "{said}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// `bench attn --generic-matmul` says in every row which matmul the generic kernel ran: on wgpu,
/// `generic` by default (CubeCL's f32 unit matmul) and `generic-autotuned` when asked; on flex,
/// whose matmul is its own, `generic` either way.
#[cfg(feature = "wgpu")]
#[test]
fn bench_says_which_matmul_the_generic_kernel_ran() {
    let cases = [
        ("wgpu", "f32", "generic"),
        ("wgpu", "autotuned", "generic-autotuned"),
        ("flex", "autotuned", "generic"),
    ];
    for (backend, mode, want) in cases {
        let out = temp_dir(&format!("bench-matmul-{backend}-{mode}"));
        let args = [
            "bench",
            "attn",
            "--backend",
            backend,
            "--kernels",
            "generic",
            "--strategies",
            "zigzag",
            "--seq",
            "64",
            "--ranks",
            "1",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--matmul",
            "64",
            "--generic-matmul",
            mode,
            "--out",
        ];
        let mut full: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        full.push(out.clone().into());
        let output = ringbench(&full);
        assert!(
            output.status.success(),
            "{backend} {mode}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut reader = csv::Reader::from_path(out.join("bench_attn.csv")).unwrap();
        let column = reader
            .headers()
            .unwrap()
            .iter()
            .position(|h| h == "kernel_impl")
            .unwrap();
        let impls: Vec<String> = reader
            .records()
            .map(|r| r.unwrap()[column].to_owned())
            .collect();
        assert!(!impls.is_empty(), "{backend} {mode}: no rows");
        assert!(
            impls.iter().all(|i| i == want),
            "{backend} {mode}: {impls:?}"
        );
    }
}

/// Every SIMD path this CPU has (`RINGBENCH_SIMD` forced, a process each) gives the same bits, the
/// backward's included; a path the CPU lacks and a misspelt one are refused in one line naming them.
#[test]
fn every_simd_path_gives_the_same_bits_and_a_missing_one_is_refused() {
    use workbench::simd::Level;
    let run = |level: &str, out: &Path| {
        let o = out.to_string_lossy();
        std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"))
            .env("RINGBENCH_SIMD", level)
            .args(attn_on_fixture(
                true,
                &["--ranks", "2", "--causal", "--out", &o],
            ))
            .output()
            .expect("running ringbench")
    };
    let mut outputs: Vec<(Level, Vec<Vec<u8>>)> = Vec::new();
    for level in Level::ALL {
        let out = temp_dir(&format!("simd-{level}"));
        let result = run(level.name(), &out);
        let stderr = String::from_utf8_lossy(&result.stderr);
        if level.available() {
            assert!(result.status.success(), "{level}: {stderr}");
            let files = ["out", "lse", "dq", "dk", "dv"]
                .map(|n| std::fs::read(out.join(format!("{n}.npy"))).unwrap());
            outputs.push((level, files.to_vec()));
        } else {
            assert!(!result.status.success(), "{level} ran on a CPU without it");
            assert!(
                stderr.contains(&format!("RINGBENCH_SIMD={level} needs"))
                    && stderr.lines().count() == 1,
                "{stderr}"
            );
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
    assert!(outputs.iter().any(|(l, _)| *l == Level::Portable));
    for pair in outputs.windows(2) {
        assert!(
            pair[0].1 == pair[1].1,
            "{} and {} differ",
            pair[0].0,
            pair[1].0
        );
    }
    let out = temp_dir("simd-unknown");
    let result = run("avx1024", &out);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        !result.status.success() && stderr.contains("\"avx1024\""),
        "{stderr}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}
