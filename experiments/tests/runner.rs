//! The experiment runner: the paper-analog tables' acceptance numbers, resuming, and malformed specs.

use experiments::hardware::PROFILES;
use experiments::runner::{RunArgs, run};
use std::path::{Path, PathBuf};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringbench-runner-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rows(dir: &Path) -> Vec<csv::StringRecord> {
    csv::Reader::from_path(dir.join("results.csv"))
        .unwrap()
        .records()
        .map(Result::unwrap)
        .collect()
}

fn column(dir: &Path, name: &str) -> usize {
    let mut r = csv::Reader::from_path(dir.join("results.csv")).unwrap();
    r.headers().unwrap().iter().position(|h| h == name).unwrap()
}

#[test]
fn balance_table_meets_the_paper_level_speedups() {
    let root = temp("balance");
    let spec = root.join("balance.toml");
    std::fs::write(
        &spec,
        "kind = \"balance\"\n[sweep]\nstrategies = [\"contiguous\", \"striped\", \"zigzag\"]\nranks = [8]\nblock_sizes = [8192]\nprofiles = [\"a100-nvlink\"]\n",
    )
    .unwrap();
    let dir = run(&RunArgs {
        spec: spec.clone(),
        force: false,
        results: root.clone(),
    })
    .unwrap();
    let (s, speed, theory) = (
        column(&dir, "strategy"),
        column(&dir, "speedup_over_contiguous"),
        column(&dir, "theoretical_speedup"),
    );
    let get = |name: &str, col: usize| -> f64 {
        rows(&dir).iter().find(|r| &r[s] == name).unwrap()[col]
            .parse()
            .unwrap()
    };
    assert!(
        get("zigzag", speed) >= 0.95 * 1.875,
        "zigzag {}",
        get("zigzag", speed)
    );
    assert!(get("striped", speed) >= 0.9 * get("striped", theory));
    assert!((get("contiguous", speed) - 1.0).abs() < 1e-9);
    assert!(
        dir.join("results.md").exists()
            && dir.join("speedup.svg").exists()
            && dir.join("spec.toml").exists()
    );

    // Resume: a second run keeps every row and computes none.
    let before = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    run(&RunArgs {
        spec,
        force: false,
        results: root.clone(),
    })
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("results.csv")).unwrap(),
        before
    );
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn overlap_table_matches_the_paper_within_five_percent() {
    let mut checked = 0;
    for p in PROFILES {
        if let Some(paper) = p.paper_c_min {
            let ratio = p.c_min() / paper;
            assert!(
                (ratio - 1.0).abs() <= 0.05,
                "{}: c_min {:.0} vs paper {paper}",
                p.name,
                p.c_min()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 5, "A100 NVLink, A100 InfiniBand, TPU v3, v4, v5e");
}

#[test]
fn exposed_communication_has_its_knee_at_c_min() {
    let root = temp("overlap");
    let spec = root.join("overlap.toml");
    std::fs::write(&spec, "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v4\"]\nblock_sizes = [512, 820, 1230, 2048]\n").unwrap();
    let dir = run(&RunArgs {
        spec,
        force: false,
        results: root.clone(),
    })
    .unwrap();
    let exposed: Vec<f64> = rows(&dir)
        .iter()
        .map(|r| r[column(&dir, "exposed_comm_fraction")].parse().unwrap())
        .collect();
    // c_min(v4) ≈ 1026: exposed below it (0.8 c_min), none above it (1.2 c_min).
    assert!(exposed[0] > 0.3 && exposed[1] > 0.0, "{exposed:?}");
    assert_eq!(exposed[2], 0.0);
    assert_eq!(exposed[3], 0.0);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn malformed_specs_name_the_key_and_line() {
    let root = temp("bad");
    let cases = [
        (
            "kind = \"balance\"\n[sweep]\nstrategies = [\"zigzag\"]\nranks = [2]\nblock_sizes = [64]\nprofiles = [\"a100-nvlink\"]\nseeds = [1]\n",
            "seeds",
        ),
        (
            "kind = \"balance\"\n[sweep]\nstrategies = [\"spiral\"]\nranks = [2]\nblock_sizes = [64]\nprofiles = [\"a100-nvlink\"]\n",
            ":3: sweep.strategies: unknown strategy 'spiral'",
        ),
        (
            "kind = \"balance\"\n[sweep]\nstrategies = [\"zigzag\"]\nranks = []\nblock_sizes = [64]\nprofiles = [\"a100-nvlink\"]\n",
            ":4: sweep.ranks is empty",
        ),
        (
            "kind = \"mfu\"\n[sweep]\nranks = [1, 0]\n",
            ":3: sweep.ranks: ranks must be at least 1, got 0",
        ),
        (
            "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v9\"]\nblock_sizes = [64]\n",
            ":3: unknown profile 'tpu-v9'",
        ),
        (
            "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v4\"]\nblock_sizes = [64]\nranks = [2]\n",
            ":5: sweep.ranks is not used",
        ),
    ];
    for (i, (text, message)) in cases.iter().enumerate() {
        let spec = root.join(format!("bad{i}.toml"));
        std::fs::write(&spec, text).unwrap();
        let err = run(&RunArgs {
            spec,
            force: false,
            results: root.clone(),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains(message), "expected '{message}' in: {err}");
        if i == 0 {
            assert!(
                err.contains("line 7") || err.contains(":7"),
                "the line of the unknown key: {err}"
            );
        }
    }
    std::fs::remove_dir_all(root).unwrap();
}

/// Runs the `ringbench` binary (whose counting allocator the memory kind needs) on `spec`.
fn run_binary(root: &Path, name: &str, spec: &str) -> PathBuf {
    let path = root.join(format!("{name}.toml"));
    std::fs::write(&path, spec).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .arg("run")
        .arg(&path)
        .arg("--results")
        .arg(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(name)
}

#[test]
fn ring_engine_memory_per_rank_is_flat_so_max_context_grows_with_ranks() {
    let root = temp("memory");
    let dir = run_binary(
        &root,
        "memory",
        "kind = \"memory\"\n[sweep]\nranks = [1, 2, 4, 8]\nblock_sizes = [128]\n[measure]\nbudget_mib = 7.5\nmax_seq = 2048\nd_model = 64\nlayers = 1\nheads = 2\nvocab = 64\nmethods = [\"blockwise-attn+ffn\", \"ring\"]\n",
    );
    let (kind, method, ranks, seq, allocator, engine) = (
        column(&dir, "row_type"),
        column(&dir, "method"),
        column(&dir, "ranks"),
        column(&dir, "seq_len"),
        column(&dir, "peak_mib_per_rank"),
        column(&dir, "engine_peak_bytes_per_rank"),
    );
    let all = rows(&dir);
    let find = |t: &str, m: &str, n: &str, s: &str| {
        all.iter()
            .find(|r| &r[kind] == t && &r[method] == m && &r[ranks] == n && &r[seq] == s)
            .unwrap_or_else(|| panic!("no row {t} {m} {n} {s}"))
            .clone()
    };
    // The engine's ledger counts shapes, not allocations, so these hold exactly on any CPU. At 128
    // tokens per rank, N = 4 and N = 8 hold the same bytes although the total length doubles. Fewer
    // ranks hold less at their peak: N = 1 exchanges nothing, and N = 2 posts no second cargo
    // exchange while its travelling gradients are in flight (its last step sends none).
    let ring: Vec<u64> = [("1", "128"), ("2", "256"), ("4", "512"), ("8", "1024")]
        .iter()
        .map(|(n, s)| find("peak", "ring", n, s)[engine].parse().unwrap())
        .collect();
    assert!(
        0 < ring[0] && ring[0] < ring[1] && ring[1] < ring[2],
        "ring engine bytes per rank at N = 1, 2, 4, 8: {ring:?}"
    );
    assert_eq!(
        ring[2], ring[3],
        "ring engine bytes per rank at N = 4 and 8 (512 and 1024 tokens) must be equal"
    );
    // One rank holding the whole sequence grows with it: K/V blocks linearly (8× from 128 to 1024).
    let single: Vec<u64> = ["128", "256", "512", "1024"]
        .iter()
        .map(|s| {
            find("peak", "blockwise-attn+ffn", "1", s)[engine]
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        single.windows(2).all(|w| w[1] > w[0]) && single[3] >= 4 * single[0],
        "blockwise engine bytes do not grow with the length: {single:?}"
    );
    // At 1024 tokens one rank holds every K/V block; each of 8 ring ranks holds 128 tokens' blocks,
    // twice over while the next arrives, and its gradients in flight: 3.49× less (shapes only).
    assert!(
        single[3] > 3 * ring[3],
        "N = 8 at 1024 tokens: {} vs {}",
        ring[3],
        single[3]
    );
    // The allocator's peaks depend on the machine: reported, checked only for being measured.
    for r in all.iter().filter(|r| &r[kind] == "peak") {
        let mib: f64 = r[allocator].parse().unwrap();
        assert!(mib > 0.0, "allocator peak not measured: {r:?}");
    }
}
