//! The experiment runner: the paper-analog tables' acceptance numbers, resuming, and malformed specs.

mod common;

use experiments::hardware::PROFILES;
use experiments::runner::run;
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
    let dir = run(&spec.clone(), &root, false).map(|s| s.dir).unwrap();
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
    run(&spec, &root, false).map(|s| s.dir).unwrap();
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
    let dir = run(&spec, &root, false).map(|s| s.dir).unwrap();
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
            ":4: sweep.ranks: is empty",
        ),
        (
            "kind = \"mfu\"\n[sweep]\nranks = [1, 0]\n",
            ":3: sweep.ranks: ranks must be at least 1, got 0",
        ),
        (
            "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v9\"]\nblock_sizes = [64]\n",
            ":3: sweep.profiles: unknown profile 'tpu-v9'",
        ),
        (
            "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v4\"]\nblock_sizes = [64]\nranks = [2]\n",
            ":5: sweep.ranks: unknown field `ranks`",
        ),
        (
            "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v4\"]\nblock_sizes = \"64\"\n",
            ":4: sweep.block_sizes: invalid type: string \"64\", expected a sequence",
        ),
        (
            "kind = \"spiral\"\n[sweep]\n",
            ":1: kind: unknown kind 'spiral'; known: attn, train",
        ),
        (
            "kind = \"attn\"\n[sweep]\nranks = [2]\nseq_lens = [64]\nbackward = [\"kv\", \"sideways\"]\n",
            ":5: sweep.backward: unknown backward scheme 'sideways'",
        ),
        (
            "kind = \"attn\"\n[sweep]\nranks = [2]\nseq_lens = [64]\nkv_heads = []\n",
            ":5: sweep.kv_heads: is empty",
        ),
        (
            "kind = \"memory\"\n[sweep]\nranks = [1]\nblock_sizes = [256]\ncheckpoints = [\"ffn\", \"layer\"]\n[measure]\nbudget_mib = 4.0\nmax_seq = 256\n",
            ":5: sweep.checkpoints: unknown checkpoint 'layer'; known: none, ffn, block",
        ),
        (
            "kind = \"memory\"\n[sweep]\nranks = [1]\nblock_sizes = [256]\ncheckpoints = [\"none\"]\n[measure]\nbudget_mib = 4.0\nmax_seq = 256\n",
            ":5: sweep.checkpoints: the blockwise methods rematerialize: ffn or block, not none",
        ),
        (
            "kind = \"train\"\n[sweep]\nranks = [1]\n[task]\nname = \"chess\"\nmin_lines = 1\nnum_lines = 2\n[model]\nd_model = 32\nlayers = 1\nheads = 2\nkv_heads = 1\nffn_multiple_of = 16\nrope_theta = 10000.0\nffn_chunk = 64\n[train]\nsteps = 1\nbatch = 1\nlr = 1e-3\n",
            ":5: task.name: unknown task 'chess'",
        ),
    ];
    for (i, (text, message)) in cases.iter().enumerate() {
        let spec = root.join(format!("bad{i}.toml"));
        std::fs::write(&spec, text).unwrap();
        let err = run(&spec, &root, false)
            .map(|s| s.dir)
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
fn ring_engine_ledger_per_rank_stays_flat_while_the_length_grows_with_the_ranks() {
    let root = temp("memory");
    let dir = run_binary(
        &root,
        "memory",
        "kind = \"memory\"\n[sweep]\nranks = [1, 2, 4, 8]\nblock_sizes = [128]\n[measure]\nbudget_mib = 7.5\nmax_seq = 2048\nmethods = [\"blockwise-attn+ffn\", \"ring\"]\n[model]\nd_model = 64\nlayers = 1\nheads = 2\nvocab = 64\n",
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

/// A strategy that exists only in this test: reversed contiguous shards (rank 0 holds the last).
#[derive(Debug)]
struct Reversed;

impl strategies::Partition for Reversed {
    fn name(&self) -> &'static str {
        "reversed"
    }
    fn validate(&self, seq_len: usize, ranks: usize) -> Result<(), strategies::PartitionError> {
        strategies::Contiguous.validate(seq_len, ranks)
    }
    fn owned_positions(&self, seq_len: usize, ranks: usize, rank: usize) -> Vec<usize> {
        strategies::Contiguous.owned_positions(seq_len, ranks, ranks - 1 - rank)
    }
}

#[test]
fn attn_sweep_measures_every_point_exactly_and_resumes() {
    strategies::register(&Reversed).unwrap();
    let root = temp("attn");
    let spec = root.join("ablation.toml");
    let text = "kind = \"attn\"\n[sweep]\nstrategies = [\"zigzag\", \"reversed\"]\nforward = [\"cw\", \"ccw\"]\nbackward = [\"kv\", \"q\"]\nranks = [1, 2]\nseq_lens = [48, 50]\ncausal = [true, false]\nkv_heads = [2, 3]\n[attention]\nheads = 2\nhead_dim = 8\n[measure]\nrepeats = 1\ncheck_tokens_per_rank = 6\n";
    std::fs::write(&spec, text).unwrap();
    let summary = run(&spec, &root, false).unwrap();
    let dir = summary.dir;
    // 2 strategies × 2 directions × 2 schemes × 2 rank counts × 2 lengths × 2 × 2.
    assert_eq!(summary.computed, 128);
    let all = rows(&dir);
    assert_eq!(all.len(), 128, "every point is a row, skipped or not");
    let (status, error, strategy, ranks, seq, kv, single) = (
        column(&dir, "status"),
        column(&dir, "max_rel_error"),
        column(&dir, "strategy"),
        column(&dir, "ranks"),
        column(&dir, "seq_len"),
        column(&dir, "kv_heads"),
        column(&dir, "ring_over_single"),
    );
    let mut ok = 0;
    for r in &all {
        let skip = &r[kv] == "3";
        if skip {
            assert!(r[status].starts_with("skipped: "), "{r:?}");
            assert_eq!(&r[error], "", "{r:?}");
            continue;
        }
        assert_eq!(&r[status], "ok", "{r:?}");
        let e: f64 = r[error].parse().unwrap();
        assert!(e <= 1e-5, "max_rel_error {e} in {r:?}");
        if &r[ranks] == "2" {
            assert!(r[single].parse::<f64>().unwrap() > 0.0, "{r:?}");
        }
        ok += 1;
    }
    // kv_heads = 3 does not divide 2 heads (64 rows); zig-zag splits 50 over 2 ranks padded to 52.
    assert_eq!(ok, 128 - 64);
    let padded = column(&dir, "padded_len");
    let zigzag_50 = all
        .iter()
        .find(|r| &r[seq] == "50" && &r[ranks] == "2" && &r[strategy] == "zigzag" && &r[kv] == "2")
        .unwrap();
    assert_eq!(&zigzag_50[padded], "52");
    assert!(
        all.iter()
            .any(|r| &r[strategy] == "reversed" && &r[status] == "ok")
    );
    let msg = all.iter().find(|r| &r[kv] == "3").unwrap()[status].to_string();
    assert!(msg.contains("kv_heads = 3"), "{msg}");

    // A rerun computes nothing and changes no byte; a grown sweep computes only its new points.
    let before = std::fs::read(dir.join("results.csv")).unwrap();
    assert_eq!(run(&spec, &root, false).unwrap().computed, 0);
    assert_eq!(std::fs::read(dir.join("results.csv")).unwrap(), before);
    std::fs::write(
        &spec,
        text.replace("seq_lens = [48, 50]", "seq_lens = [48, 50, 32]"),
    )
    .unwrap();
    assert_eq!(run(&spec, &root, false).unwrap().computed, 64);
    assert_eq!(rows(&dir).len(), 192);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn train_sweep_losses_agree_across_strategies_ranks_and_schemes() {
    let root = temp("train");
    let spec = root.join("train.toml");
    std::fs::write(&spec, include_str!("../train_quick.toml")).unwrap();
    let summary = run(&spec, &root, false).unwrap();
    let dir = summary.dir;
    let all = rows(&dir);
    // 3 strategies × N ∈ {1, 4} × 2 schemes.
    assert_eq!(all.len(), 12);
    let (diff, steps, loss) = (
        column(&dir, "max_rel_loss_diff"),
        column(&dir, "steps"),
        column(&dir, "final_loss"),
    );
    let first: f64 = all[0][loss].parse().unwrap();
    for r in &all {
        let d: f64 = r[diff].parse().unwrap();
        assert!(d <= 1e-4, "max_rel_loss_diff {d} in {r:?}");
        assert_eq!(&r[steps], "20");
        assert!(r[loss].parse::<f64>().unwrap() < first * 1.5);
    }
    let curves = csv::Reader::from_path(dir.join("curves.csv"))
        .unwrap()
        .records()
        .count();
    assert_eq!(curves, 12 * 20);
    assert!(dir.join("curves.svg").exists());
    assert_eq!(run(&spec, &root, false).unwrap().computed, 0);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn every_kind_resumes_without_recomputing() {
    // The cheap kinds here; attn and train resume in their own tests, the measured ones share the
    // runner's resume path (a point is done when its rows are in results.csv).
    let root = temp("resume");
    // A kind whose key holds a float (ppl's factor): the point's key is written as its row's is.
    let gqa = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    let ppl = format!(
        "kind = \"ppl\"\n[model]\nhf = \"{}\"\n[data]\ntokens = \"{}\"\n[sweep]\n\
         contexts = [12]\nscalings = [\"none\", \"linear\"]\nfactors = [2.0]\nranks = [1]\n",
        gqa.display(),
        gqa.join("tokens.npy").display()
    );
    for (name, text) in [
        ("p", ppl.as_str()),
        (
            "b",
            "kind = \"balance\"\n[sweep]\nstrategies = [\"striped\"]\nranks = [2, 4]\nblock_sizes = [64]\nprofiles = [\"tpu-v4\"]\n",
        ),
        (
            "o",
            "kind = \"overlap\"\n[sweep]\nprofiles = [\"tpu-v4\"]\nblock_sizes = [512]\n",
        ),
        ("m", "kind = \"memory-model\"\n"),
        (
            "k",
            "kind = \"knee\"\n[sweep]\nranks = [2]\nblock_sizes = [32, 64]\n[model]\nheads = 1\nhead_dim = 8\n[measure]\nset_knee_tokens = 64\nrepeats = 1\n",
        ),
        (
            "f",
            "kind = \"mfu\"\n[sweep]\nranks = [1, 2]\nblock_sizes = [16]\n[model]\nd_model = 16\nlayers = 1\nheads = 2\nvocab = 16\n[measure]\nsteps = 1\n",
        ),
        (
            "md",
            "kind = \"model\"\n[sweep]\nworks = [\"prefill\", \"decode\", \"train\"]\nseq_lens = [16]\nranks = [1, 2]\nweights = [\"f32\", \"bf16\"]\n[model]\nd_model = 16\nlayers = 1\nheads = 2\nkv_heads = 1\nvocab = 16\n[measure]\nrepeats = 1\ndecode_tokens = 2\n",
        ),
    ] {
        let spec = root.join(format!("{name}.toml"));
        std::fs::write(&spec, text).unwrap();
        let first = run(&spec, &root, false).unwrap();
        assert!(first.computed > 0, "{name}");
        let csv = std::fs::read(first.dir.join("results.csv")).unwrap();
        let again = run(&spec, &root, false).unwrap();
        assert_eq!((again.computed, again.kept), (0, first.computed), "{name}");
        assert_eq!(
            std::fs::read(first.dir.join("results.csv")).unwrap(),
            csv,
            "{name}"
        );
        let forced = run(&spec, &root, true).unwrap();
        assert_eq!(forced.computed, first.computed, "{name}");
    }
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn engine_ledger_falls_from_vanilla_to_blockwise_to_ring_and_table1_is_its_formula() {
    // The paper's Table 3 ordering at S = 1024, asserted on the engine's ledger (bytes counted from
    // shapes where they are made, so the same on every CPU): vanilla attention holds S × S score
    // tiles, blockwise attention (memory-efficient and BPT alike: their difference is the
    // feed-forward, which the ledger does not hold) only c × c ones, and a ring rank holds its shard.
    // The allocator's figures (per-rank peak, one layer's largest allocation beside Table 1) depend
    // on the CPU's kernels and the scheduler: they are printed and reported, never asserted.
    let root = temp("order");
    let dir = run_binary(
        &root,
        "order",
        "kind = \"memory\"\n[sweep]\nranks = [4]\nblock_sizes = [256]\n[measure]\nbudget_mib = 4.0\nmax_seq = 256\n[model]\nd_model = 64\nlayers = 1\nheads = 2\nvocab = 64\n",
    );
    let all = rows(&dir);
    let (kind, method) = (column(&dir, "row_type"), column(&dir, "method"));
    let peak_row = |m: &str| {
        all.iter()
            .find(|r| &r[kind] == "peak" && &r[method] == m)
            .unwrap_or_else(|| panic!("no {m} row"))
            .clone()
    };
    let get = |m: &str, name: &str| -> f64 { peak_row(m)[column(&dir, name)].parse().unwrap() };
    let methods = ["vanilla", "memory-efficient", "blockwise-attn+ffn", "ring"];
    let ledger = methods.map(|m| get(m, "engine_peak_bytes_per_rank"));
    assert!(
        ledger[0] > ledger[1] && ledger[1] == ledger[2] && ledger[2] > ledger[3] && ledger[3] > 0.0,
        "engine bytes per rank, {methods:?}: {ledger:?}"
    );
    // Table 1's column is its formula (2 bytes a value doubled for f32): vanilla's score matrix
    // 2·heads·S² at S = 1024, 2 heads; memory-efficient's feed-forward activation 2·S·F.
    assert_eq!(
        get("vanilla", "table1_mib") * 1024.0 * 1024.0,
        2.0 * 2.0 * (2 * 1024 * 1024) as f64
    );
    for m in methods {
        println!(
            "{m}: allocator peak {:.2} MiB per rank, largest layer allocation {:.2}x Table 1 \
             (reported, not asserted)",
            get(m, "peak_mib_per_rank"),
            get(m, "layer_largest_over_table1")
        );
    }
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn block_checkpointing_reports_what_a_layer_keeps_beside_table1() {
    // With `checkpoint = "block"` a layer keeps only its input until the backward: s·h f32 values,
    // the paper's Table 1 figure for blockwise attention + feed-forward. What a layer keeps in all
    // is an allocator figure (reported, not asserted: it depends on the CPU). The engine's ledger
    // shows the part it holds: with `ffn` both layers' ring forwards keep their q, k, v and lse for
    // the backward at once; with `block` a layer's are recomputed in its own backward, so one
    // layer's fewer are held at the peak.
    let root = temp("checkpoint");
    let dir = run_binary(
        &root,
        "checkpoint",
        "kind = \"memory\"\n[sweep]\nranks = [1]\nblock_sizes = [1024]\ncheckpoints = [\"ffn\", \"block\"]\n[measure]\nbudget_mib = 4.0\nmax_seq = 256\nmethods = [\"blockwise-attn+ffn\"]\n[model]\nd_model = 64\nlayers = 2\nheads = 2\nvocab = 64\n",
    );
    let (kind, checkpoint) = (column(&dir, "row_type"), column(&dir, "checkpoint"));
    let all = rows(&dir);
    let get = |c: &str, name: &str| -> f64 {
        let row = all
            .iter()
            .find(|r| &r[kind] == "peak" && &r[checkpoint] == c)
            .unwrap_or_else(|| panic!("no peak row with checkpoint {c}"));
        row[column(&dir, name)].parse().unwrap()
    };
    // S = 1024 tokens on one rank, 2 heads (and 2 kv heads) of 64 / 2 = 32, f32.
    let (s, h, d) = (1024.0, 2.0, 32.0);
    let one_layers_saved = 4.0 * (3.0 * s * h * d + s * h);
    assert_eq!(
        get("ffn", "engine_peak_bytes_per_rank") - get("block", "engine_peak_bytes_per_rank"),
        one_layers_saved
    );
    for c in ["ffn", "block"] {
        let (kept, ratio) = (get(c, "layer_kept_mib"), get(c, "layer_kept_over_table1"));
        assert!(kept.is_finite() && ratio.is_finite(), "{c}: not measured");
        println!("checkpoint {c}: a layer keeps {kept:.3} MiB, {ratio:.3}x Table 1 (reported)");
    }
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn doc_zigzag_balances_packed_batches() {
    // 32K tokens on 8 ranks, packed documents of 1 to 4096 tokens with a long tail.
    let root = temp("packed");
    let spec = root.join("packed.toml");
    std::fs::write(
        &spec,
        "kind = \"balance\"\n[sweep]\nstrategies = [\"contiguous\", \"striped\", \"zigzag\", \"doc-zigzag\"]\nranks = [8]\nblock_sizes = [4096]\nprofiles = [\"a100-nvlink\"]\ndocuments = [\"longtail:4096\"]\n",
    )
    .unwrap();
    let dir = run(&spec, &root, false).unwrap().dir;
    let (s, work) = (column(&dir, "strategy"), column(&dir, "work_max_over_mean"));
    let get = |name: &str| -> f64 {
        rows(&dir).iter().find(|r| &r[s] == name).unwrap()[work]
            .parse()
            .unwrap()
    };
    assert!(
        get("doc-zigzag") <= 1.05,
        "doc-zigzag {}",
        get("doc-zigzag")
    );
    // Zig-zag over the packed sequence as one balances nothing of the documents' own causality.
    assert!(
        get("zigzag") > 1.5 && get("contiguous") > 1.5,
        "{} {}",
        get("zigzag"),
        get("contiguous")
    );
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn attn_sweep_over_packed_documents_is_exact() {
    let root = temp("attn-packed");
    let spec = root.join("packed.toml");
    std::fs::write(
        &spec,
        "kind = \"attn\"\n[sweep]\nstrategies = [\"zigzag\", \"doc-zigzag\"]\nbackward = [\"kv\", \"q\"]\nranks = [1, 3]\nseq_lens = [48]\ndocuments = [\"none\", \"longtail:16\", \"random:6\"]\n[attention]\nheads = 2\nhead_dim = 8\n[measure]\nrepeats = 1\ncheck_tokens_per_rank = 8\n",
    )
    .unwrap();
    let summary = run(&spec, &root, false).unwrap();
    assert_eq!(summary.computed, 24);
    let dir = summary.dir;
    let (status, error, docs, count) = (
        column(&dir, "status"),
        column(&dir, "max_rel_error"),
        column(&dir, "documents"),
        column(&dir, "document_count"),
    );
    for r in rows(&dir) {
        assert_eq!(&r[status], "ok", "{r:?}");
        let e: f64 = r[error].parse().unwrap();
        assert!(e <= 1e-5, "{r:?}");
        let packed = &r[docs] != "none";
        assert_eq!(r[count].parse::<usize>().unwrap() > 1, packed, "{r:?}");
    }
    assert_eq!(run(&spec, &root, false).unwrap().computed, 0);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn measurements_beside_a_seeded_initialization_leave_its_weights_alone() {
    // Burn's generator is one per process, and a sweep's kinds (and these tests) run side by side:
    // the matmul baseline and the layer measurement drew from it outside `seeded`'s lock (the layer's
    // weights on first use), which moved the weights of a train point being initialized at the same
    // time (CI: one of 12 runs started from other weights, max_rel_loss_diff 0.106). Every draw now
    // holds `seeded`'s lock or is drawn on the host.
    use burn::backend::Flex;
    use experiments::measure::{baseline, layer, training};
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use workbench::model::{Checkpoint, LlamaConfig, lazy::seeded};

    let device = Default::default();
    let config = LlamaConfig::new(16).with_d_model(16).with_heads(2);
    let weights = || {
        let model = seeded::<Flex, _>(3, &device, || config.init::<Flex>(&device));
        workbench::train::flat_params(&model)
    };
    let small = training::SmallModel {
        d_model: 16,
        layers: 1,
        heads: 2,
        vocab: 16,
    };
    let ring = training::Variant {
        method: training::Method::Ring,
        remat: Checkpoint::Ffn,
    };
    /// Stops the measuring thread when dropped, also when an initialization panics.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let done = AtomicBool::new(false);
    let (first, rest) = std::thread::scope(|s| {
        let _stop = Stop(&done);
        s.spawn(|| {
            while !done.load(Relaxed) {
                baseline::matmul_gflops(8);
                layer::layer_forward(&small, ring, 2, 16, 8).unwrap();
            }
        });
        let first = weights();
        let rest: Vec<_> = (0..30).map(|_| weights()).collect();
        (first, rest)
    });
    for (i, w) in rest.iter().enumerate() {
        assert!(w == &first, "initialization {i} drew other weights");
    }
}

/// The workspace root: `reproduce` reads `experiments/*.toml` and `results/` from there.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The tables `reproduce quick` computes without measuring anything: simulated and analytic.
const DETERMINISTIC_TABLES: &str = "balance_quick,balance_packed,overlap,memory_model,hybrid";

fn reproduce(out: &Path, reference: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .current_dir(workspace())
        .args([
            "reproduce",
            "quick",
            "--check",
            "--tables",
            DETERMINISTIC_TABLES,
        ])
        .arg("--out")
        .arg(out)
        .arg("--reference")
        .arg(reference)
        .output()
        .unwrap()
}

#[test]
fn reproduce_check_holds_against_the_committed_tables_and_names_an_altered_value() {
    let root = temp("reproduce");
    let out = reproduce(&root.join("run"), &workspace().join("results"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One progress line per table, nothing else but where the comparison went.
    let tables = DETERMINISTIC_TABLES.split(',').count();
    assert_eq!(stdout.lines().count(), tables + 1, "{stdout}");
    let comparison = std::fs::read_to_string(root.join("run/comparison.md")).unwrap();
    assert!(comparison.lines().count() < 150, "{comparison}");
    for table in DETERMINISTIC_TABLES.split(',') {
        assert!(
            comparison.contains(&format!("- **{table}**: held")),
            "{table}: {comparison}"
        );
    }
    // A copy of the committed tables with one deterministic cell altered: zig-zag's busiest rank on
    // the long-tailed packed batch.
    let reference = root.join("reference");
    for table in DETERMINISTIC_TABLES.split(',') {
        std::fs::create_dir_all(reference.join(table)).unwrap();
        let csv = workspace().join("results").join(table).join("results.csv");
        std::fs::copy(csv, reference.join(table).join("results.csv")).unwrap();
    }
    let altered = reference.join("balance_packed/results.csv");
    let text = std::fs::read_to_string(&altered).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let work = header
        .iter()
        .position(|c| *c == "work_max_over_mean")
        .unwrap();
    let row = lines
        .iter()
        .position(|l| l.starts_with("zigzag,") && l.contains("longtail"))
        .expect("a long-tailed zig-zag row");
    let mut cells: Vec<String> = lines[row].split(',').map(String::from).collect();
    cells[work] = "1.5".into();
    lines[row] = cells.join(",");
    std::fs::write(&altered, lines.join("\n") + "\n").unwrap();
    let out = reproduce(&root.join("run2"), &reference);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("balance_packed: row strategy=zigzag,")
            && stderr.contains("documents=longtail")
            && stderr.contains("column work_max_over_mean: reference 1.5 -> this run"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("column ").count(),
        1,
        "only the altered cell moved: {stderr}"
    );
    // The same copy with the first row of `overlap` deleted instead: this run makes a row the
    // reference lacks, which fails the check by itself.
    std::fs::write(&altered, text).unwrap();
    let lost = reference.join("overlap/results.csv");
    let text = std::fs::read_to_string(&lost).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.remove(1);
    std::fs::write(&lost, lines.join("\n") + "\n").unwrap();
    let out = reproduce(&root.join("run3"), &reference);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("overlap: row "), "{stderr}");
    assert!(stderr.contains(": not in the reference"), "{stderr}");
    assert_eq!(stderr.matches("overlap: row ").count(), 1, "{stderr}");
    let comparison = std::fs::read_to_string(root.join("run3/comparison.md")).unwrap();
    assert!(
        comparison.contains("- **overlap**: FAILED")
            && comparison.contains("1 row(s) the reference lacks")
            && comparison.contains("Rows of this run the reference lacks (1)"),
        "{comparison}"
    );
    std::fs::remove_dir_all(root).unwrap();
}

/// `reproduce quick --check` of `tables` against `reference`: its status, stdout and stderr.
fn reproduce_only(out: &Path, reference: &Path, tables: &str) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .current_dir(workspace())
        .args(["reproduce", "quick", "--check", "--tables", tables])
        .arg("--out")
        .arg(out)
        .arg("--reference")
        .arg(reference)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--check` compares something or fails: a reference directory that does not exist, a table whose
/// reference is missing and a reference with a duplicate key are each refused with one line before
/// any table runs.
#[test]
fn reproduce_check_refuses_what_it_cannot_compare_before_any_table_runs() {
    let root = temp("refused");
    let tables = "overlap,hybrid";
    let refused = |reference: &Path, run: &str, says: &[&str]| {
        let (code, stdout, stderr) = reproduce_only(&root.join(run), reference, tables);
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        assert!(stdout.is_empty(), "a table ran: {stdout}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        for word in says {
            assert!(stderr.contains(word), "{word}: {stderr}");
        }
        assert!(!root.join(run).join("comparison.md").exists());
    };
    refused(
        &root.join("typo"),
        "run1",
        &["--reference", "typo", "no such directory"],
    );
    // A copy of the committed tables without hybrid's.
    let reference = root.join("reference");
    std::fs::create_dir_all(reference.join("overlap")).unwrap();
    let committed = |t: &str| workspace().join("results").join(t).join("results.csv");
    std::fs::copy(committed("overlap"), reference.join("overlap/results.csv")).unwrap();
    refused(
        &reference,
        "run2",
        &["no committed reference", "hybrid/results.csv", "--results"],
    );
    // An empty one is no reference either.
    std::fs::create_dir_all(reference.join("hybrid")).unwrap();
    let header = std::fs::read_to_string(committed("hybrid")).unwrap();
    let header = header.lines().next().unwrap().to_owned();
    std::fs::write(reference.join("hybrid/results.csv"), format!("{header}\n")).unwrap();
    refused(
        &reference,
        "run3",
        &["no committed reference", "hybrid/results.csv"],
    );
    // hybrid's reference whole, overlap's with its first row twice.
    std::fs::copy(committed("hybrid"), reference.join("hybrid/results.csv")).unwrap();
    let text = std::fs::read_to_string(committed("overlap")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let doubled = [&lines[..], &lines[1..2]].concat().join("\n") + "\n";
    std::fs::write(reference.join("overlap/results.csv"), doubled).unwrap();
    refused(
        &reference,
        "run4",
        &["overlap/results.csv", "1 duplicate key"],
    );
    // Whole again: it holds.
    std::fs::copy(committed("overlap"), reference.join("overlap/results.csv")).unwrap();
    let (code, stdout, stderr) = reproduce_only(&root.join("run5"), &reference, tables);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_eq!(stdout.matches(": held").count(), 2, "{stdout}");
    std::fs::remove_dir_all(root).unwrap();
}

/// The committed checkpoint `name` of results/line_retrieval/ copied into `dir`, its weights all
/// zero when `zeroed` (flat logits: every reply step a tie).
fn retrieval_checkpoint(name: &str, dir: &Path, zeroed: bool) {
    use burn::module::Module;
    use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
    let from = workspace()
        .join("results/line_retrieval")
        .join(name)
        .join("checkpoint");
    std::fs::create_dir_all(dir).unwrap();
    for file in ["config.json", "tokenizer.json", "train.toml", "model.mpk"] {
        std::fs::copy(from.join(file), dir.join(file)).unwrap();
    }
    if zeroed {
        let (model, _, _) = experiments::line_retrieval::load_checkpoint::<burn::backend::Flex>(
            &from,
            &Default::default(),
        )
        .unwrap();
        let zeros = vec![0.0; workbench::train::replicas::flat_params(&model).len()];
        let model = workbench::train::replicas::with_flat_params(model, &zeros);
        model
            .save_file(
                dir.join("model"),
                &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            )
            .unwrap();
    }
}

/// The retrieval check's allowance comes from the reference's near ties, never from the run's: a
/// checkpoint with zeroed weights (every step a tie, nothing right) fails the committed Figure 3
/// row that the real checkpoint holds.
#[test]
fn a_zeroed_checkpoint_fails_the_committed_retrieval_table() {
    let root = temp("zeroed");
    let committed =
        experiments::results::Table::read(&workspace().join("results/retrieval_quick/results.csv"))
            .unwrap();
    let kind = experiments::kinds::by_name("retrieval").unwrap();
    let mut runs = Vec::new();
    for zeroed in [false, true] {
        let checkpoint = root.join(format!("checkpoint-{zeroed}"));
        retrieval_checkpoint("long", &checkpoint, zeroed);
        // retrieval_quick's first row alone: the 50-line model at 20 lines.
        let spec_text =
            std::fs::read_to_string(workspace().join("experiments/retrieval_quick.toml")).unwrap();
        let head = &spec_text[..spec_text.find("[[model]]").unwrap()];
        let spec = root.join(format!("retrieval-{zeroed}.toml"));
        std::fs::write(
            &spec,
            head.replace("num_lines = [20, 100]", "num_lines = [20]")
                + &format!(
                    "[[model]]\nname = \"50-line\"\ncheckpoint = \"{}\"\n",
                    checkpoint.display()
                ),
        )
        .unwrap();
        let summary = experiments::runner::run_with(
            &spec,
            &root.join(format!("out-{zeroed}")),
            &experiments::runner::RunOptions {
                force: false,
                quiet: true,
                ..Default::default()
            },
        )
        .unwrap();
        let ours = experiments::results::Table::read(&summary.dir.join("results.csv")).unwrap();
        assert_eq!(ours.rows.len(), 1);
        let key = experiments::results::Record::new([("model", "50-line"), ("num_lines", "20")]);
        let reference =
            experiments::results::Table::of(vec![committed.find(&key).unwrap().clone()]);
        runs.push((
            ours.rows[0].clone(),
            experiments::comparison::compare(kind, "retrieval_quick", &reference, &ours),
        ));
    }
    let (real, held) = &runs[0];
    assert!(held.held(), "{}", held.failures().join("\n"));
    assert_eq!(real.num("correct"), 8.0);
    let (zero, failed) = &runs[1];
    // Every case of the zeroed model ties and none is right: a share of its own ties would allow
    // anything.
    assert_eq!((zero.num("near_ties"), zero.num("correct")), (8.0, 0.0));
    assert!(!failed.held());
    let moved: Vec<&str> = failed.moved.iter().map(|m| m.column.as_str()).collect();
    assert!(
        moved.contains(&"correct") && moved.contains(&"accuracy"),
        "{moved:?}"
    );
    std::fs::remove_dir_all(root).unwrap();
}

/// A spec of cheap simulated points, enough of them that a run writes results.csv many times.
const MANY_POINTS: &str = "kind = \"balance\"\n[sweep]\nstrategies = [\"contiguous\", \"striped\", \"zigzag\"]\nranks = [2, 3, 4, 5, 6, 7, 8]\nblock_sizes = [64, 128, 256, 512]\nprofiles = [\"tpu-v4\", \"a100-nvlink\"]\n";

fn run_command(spec: &Path, results: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"));
    command
        .arg("run")
        .arg(spec)
        .arg("--results")
        .arg(results)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    command
}

#[test]
fn a_run_killed_while_it_writes_resumes_to_the_same_table() {
    let root = temp("killed");
    let spec = root.join("many.toml");
    std::fs::write(&spec, MANY_POINTS).unwrap();
    let whole = run(&spec, &root.join("whole"), false).unwrap();
    let want = std::fs::read_to_string(whole.dir.join("results.csv")).unwrap();
    let killed = root.join("killed");
    let csv = killed.join("many/results.csv");
    // SIGKILL at several moments of the run (each run resumes the last one's table), then a run to
    // the end. Whenever it was killed, results.csv reads back as whole rows of the final table.
    for delay_ms in [40, 90, 160, 250, 400, 700] {
        let mut child = run_command(&spec, &killed).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        if let Ok(text) = std::fs::read_to_string(&csv) {
            let kept: Vec<&str> = text.lines().skip(1).collect();
            for line in &kept {
                assert!(
                    want.contains(line),
                    "a row the whole run does not have: {line}"
                );
            }
        }
    }
    let rest = run(&spec, &killed, false).unwrap();
    assert_eq!(rest.computed + rest.kept, whole.computed);
    // The same rows; resumed runs append points in the order they computed them.
    let mut got: Vec<String> = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let mut expected: Vec<String> = want.lines().map(String::from).collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    std::fs::remove_dir_all(root).unwrap();
}

/// A directory whose lock a live process holds (a `sleep` the test starts, so that it is still
/// running when `ringbench run` looks) is refused in one line naming that process; once the holder
/// is gone, the next run takes the stale lock over, says so, and computes.
#[test]
fn a_second_run_into_the_same_directory_is_refused_with_one_line() {
    let root = temp("concurrent");
    let spec = root.join("many.toml");
    std::fs::write(&spec, MANY_POINTS).unwrap();
    let written = root.join("many/results.csv");
    common::holds_one_writer(&root.join("many"), || run_command(&spec, &root), &written);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn rows_of_another_spec_are_recomputed_and_a_grown_sweep_keeps_its_rows() {
    let root = temp("stale");
    let spec = root.join("s.toml");
    let text = "kind = \"balance\"\n[sweep]\nstrategies = [\"striped\"]\nranks = [2, 4]\nblock_sizes = [64]\nprofiles = [\"tpu-v4\"]\n";
    std::fs::write(&spec, text).unwrap();
    let first = run(&spec, &root, false).unwrap();
    assert_eq!(first.computed, 2);
    // Another rank count: the two rows stay, one is added.
    std::fs::write(&spec, text.replace("[2, 4]", "[2, 4, 8]")).unwrap();
    let grown = run(&spec, &root, false).unwrap();
    assert_eq!((grown.computed, grown.kept), (1, 2));
    // Another setting outside the sweep: every row was computed by another spec.
    std::fs::write(
        &spec,
        text.replace("[2, 4]", "[2, 4, 8]") + "[model]\nheads = 8\n",
    )
    .unwrap();
    let changed = run(&spec, &root, false).unwrap();
    assert_eq!((changed.computed, changed.kept), (3, 0));
    let hashes: std::collections::BTreeSet<String> = rows(&first.dir)
        .iter()
        .map(|r| r[column(&first.dir, "spec_hash")].to_owned())
        .collect();
    assert_eq!(hashes.len(), 1, "{hashes:?}");
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn every_column_of_the_committed_quick_tables_is_a_key_or_declared() {
    use experiments::comparison::compare;
    use experiments::reproduce::TABLES;
    for (quick, _) in TABLES.iter().filter(|(quick, _)| !quick.is_empty()) {
        let spec = experiments::spec::SpecText::load(
            &workspace().join(format!("experiments/{quick}.toml")),
        )
        .unwrap();
        let kind = experiments::kinds::by_name(&spec.kind).unwrap();
        let table = experiments::results::Table::read(
            &workspace().join("results").join(quick).join("results.csv"),
        )
        .unwrap();
        assert!(!table.rows.is_empty(), "{quick}: no committed table");
        let found = compare(kind, quick, &table, &table);
        assert!(
            found.undeclared.is_empty(),
            "{quick}: columns neither keys nor declared by kind {}: {:?}",
            kind.card().name,
            found.undeclared
        );
        assert!(found.held(), "{quick} against itself: {}", found.summary());
    }
}

/// A committed table with measured columns (`ablation_quick`: seconds and rates) against itself
/// altered three ways, without computing anything: a measured cell that is NaN, infinite or empty
/// where the reference has a number fails the check (a ratio of it says nothing), and so does a
/// reference row the run lost and a row the reference lacks; each is named.
#[test]
fn a_lost_row_a_gained_row_and_a_measured_cell_that_is_not_a_number_fail_the_check() {
    use experiments::comparison::compare;
    use experiments::results::Table;
    let name = "ablation_quick";
    let spec =
        experiments::spec::SpecText::load(&workspace().join(format!("experiments/{name}.toml")))
            .unwrap();
    let kind = experiments::kinds::by_name(&spec.kind).unwrap();
    let reference =
        Table::read(&workspace().join("results").join(name).join("results.csv")).unwrap();
    assert!(compare(kind, name, &reference, &reference).held());
    let measured = "fwd_seconds";
    assert!(
        kind.card()
            .columns
            .iter()
            .any(|c| c.name == measured && c.check == experiments::kinds::Check::Measured),
        "{measured} is a measured column of {name}"
    );
    for bad in ["NaN", "inf", ""] {
        let mut ours = reference.clone();
        let row = &mut ours.rows[2].0;
        row.iter_mut().find(|(c, _)| c == measured).unwrap().1 = bad.into();
        let found = compare(kind, name, &reference, &ours);
        assert!(!found.held(), "{bad:?}: {}", found.summary());
        assert_eq!(found.broken.len(), 1, "{bad:?}");
        let failures = found.failures();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains(&format!("column {measured}"))
                && failures[0].contains("not a finite number"),
            "{failures:?}"
        );
        assert!(found.summary().contains("FAILED"), "{}", found.summary());
    }
    let mut lost = reference.clone();
    lost.rows.remove(0);
    let found = compare(kind, name, &reference, &lost);
    assert!(!found.held());
    assert_eq!(found.only_there.len(), 1);
    assert!(found.failures()[0].contains("missing from this run"));
    let found = compare(kind, name, &lost, &reference);
    assert!(!found.held());
    assert_eq!(found.only_here.len(), 1);
    assert!(found.failures()[0].contains("not in the reference"));
}

/// `ringbench run SPEC` without `--results` writes into `runs/<UTC time>/NAME/` under the working
/// directory and nowhere else (never the committed `results/`), and computes its points; a second
/// run with `--results` at that directory keeps its rows and says so in one line.
#[test]
fn run_without_results_writes_a_fresh_runs_directory_only() {
    let root = temp("default-out");
    let spec = root.join("balance_quick.toml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("balance_quick.toml"),
        &spec,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .current_dir(&root)
        .args(["run", "balance_quick.toml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut sorted = entries.clone();
    sorted.sort();
    assert_eq!(sorted, ["balance_quick.toml", "runs"], "{entries:?}");
    let runs: Vec<PathBuf> = std::fs::read_dir(root.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let stamp = runs[0].file_name().unwrap().to_string_lossy().into_owned();
    // YYYY-MM-DDTHH-MM-SSZ
    assert_eq!(stamp.len(), 20, "{stamp}");
    assert!(
        stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
        "{stamp}"
    );
    let table = runs[0].join("balance_quick");
    assert_eq!(rows(&table).len(), 12);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("12 points computed, 0 kept"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "Regenerate: `ringbench run balance_quick.toml --results {}`",
            Path::new("runs").join(&stamp).display()
        )),
        "{stdout}"
    );
    // Into that directory again: nothing computed, the kept rows said in one line.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"))
        .current_dir(&root)
        .args(["run", "balance_quick.toml", "--results"])
        .arg(&runs[0])
        .output()
        .unwrap();
    assert!(again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("kept 12 rows from an earlier run (--force recomputes them)"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&again.stdout).contains("0 points computed, 12 kept"));
}
