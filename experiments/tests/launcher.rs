//! Sweeps past one process: every point of a spec as a job of processes under mpirun (feature
//! `mpi`), failed jobs as failed rows a rerun retries, and sharded runs merged into the unsharded
//! table.

mod common;

use common::{ringbench, temp_dir};
use experiments::kinds::{self, Check};
use experiments::results::{Record, Table};
use std::path::{Path, PathBuf};
use std::process::Output;
#[cfg(feature = "mpi")]
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

/// The rows of `dir/NAME/results.csv`.
fn rows(dir: &Path, name: &str) -> Vec<Record> {
    Table::read(&dir.join(name).join("results.csv"))
        .unwrap()
        .rows
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ringbench"));
    // Specs name checkpoints relative to the repository root, as the README's commands run.
    command.current_dir(workspace()).arg("run").args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("running ringbench")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The two tables have the same keys in the same order and equal values in every column the attn
/// kind calls exact; each of `ours` rows has `transport`.
fn same_exact_columns(theirs: &[Record], ours: &[Record], transport: &str) {
    let card = kinds::by_name("attn").unwrap().card();
    assert_eq!(theirs.len(), ours.len());
    for (a, b) in theirs.iter().zip(ours) {
        assert_eq!(a.id(card.key_columns), b.id(card.key_columns));
        for column in card.columns.iter().filter(|c| c.check == Check::Exact) {
            assert_eq!(
                a.get(column.name),
                b.get(column.name),
                "{}: {}",
                column.name,
                b.id(card.key_columns)
            );
        }
        assert_eq!(b.get("transport"), Some(transport), "{b:?}");
        assert_eq!(b.get("status"), Some("ok"), "{b:?}");
        // The exactness table's bound holds on the processes' own float64 check too.
        let error = b.num("max_rel_error");
        assert!(error <= 1e-5, "max_rel_error {error}: {b:?}");
    }
}

/// The committed spec `experiments/NAME.toml` run on threads, then with every point under
/// mpirun, into `dir/threads` and `dir/mpi`: both tables, each run having exited 0.
#[cfg(feature = "mpi")]
fn threads_then_mpirun(dir: &Path, name: &str) -> (Vec<Record>, Vec<Record>) {
    let spec = workspace().join(format!("experiments/{name}.toml"));
    let (spec, out) = (spec.to_str().unwrap(), dir.to_str().unwrap());
    for (sub, launcher) in [("threads", "threads"), ("mpi", "mpirun")] {
        let results = format!("{out}/{sub}");
        let o = run(&[spec, "--results", &results, "--launcher", launcher], &[]);
        assert!(o.status.success(), "{launcher}: {}", text(&o));
    }
    (
        rows(&dir.join("threads"), name),
        rows(&dir.join("mpi"), name),
    )
}

/// A small spec: 2 strategies × 1 and 4 ranks (the 4-rank points are indices 2 and 3).
fn small_spec(dir: &Path, deadline_seconds: u32) -> PathBuf {
    let spec = dir.join("small.toml");
    std::fs::write(
        &spec,
        format!(
            "kind = \"attn\"\n[sweep]\nstrategies = [\"striped\", \"zigzag\"]\nranks = [1, 4]\n\
             seq_lens = [128]\n[measure]\nrepeats = 1\n[launcher]\ndeadline_seconds = {deadline_seconds}\n"
        ),
    )
    .unwrap();
    spec
}

/// The acceptance run: the ablation spec with every point a job of 1 or 4 processes (mpirun,
/// oversubscribed on 2 cores) writes the thread run's exact columns (bytes and messages per rank
/// from the processes' own counters, gathered to rank 0), `transport = mpi` on every row.
#[cfg(feature = "mpi")]
#[test]
fn ablation_under_mpirun_has_the_thread_runs_exact_columns() {
    let dir = temp_dir("launch-ablation");
    let (theirs, ours) = threads_then_mpirun(&dir, "ablation_quick");
    assert_eq!(theirs.len(), 72);
    assert!(theirs.iter().all(|r| r.get("transport") == Some("threads")));
    same_exact_columns(&theirs, &ours, "mpi");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A rank SIGKILLed in the middle of the sweep: its point becomes a failed row naming the rank, the
/// other points are computed, the run ends with an error; the rerun computes that point only.
#[cfg(feature = "mpi")]
#[test]
fn a_killed_rank_fails_its_point_and_the_rerun_computes_only_it() {
    let dir = temp_dir("launch-killed");
    let deadline = 120;
    let spec = small_spec(&dir, deadline);
    let (spec, out) = (spec.to_str().unwrap(), dir.to_str().unwrap());
    let start = Instant::now();
    let first = run(
        &[spec, "--results", out, "--launcher", "mpirun"],
        &[("RINGBENCH_KILL_POINT", "2:3")],
    );
    assert!(
        start.elapsed() < Duration::from_secs(deadline.into()),
        "the killed job ended only at the deadline"
    );
    assert!(!first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("1 of the points failed"),
        "{}",
        text(&first)
    );
    let table = rows(&dir, "small");
    assert_eq!(table.len(), 4);
    let failed = &table[2];
    let status = failed.get("status").unwrap();
    assert!(
        status.starts_with("failed: rank 3 died on signal 9"),
        "{status}"
    );
    assert_eq!(failed.get("fwd_bwd_seconds"), Some(""), "nothing partial");
    for (i, row) in table.iter().enumerate().filter(|(i, _)| *i != 2) {
        assert_eq!(row.get("status"), Some("ok"), "point {i}");
    }
    let second = run(&[spec, "--results", out, "--launcher", "mpirun"], &[]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        text(&second).contains("1 points computed, 3 kept from an earlier run"),
        "{}",
        text(&second)
    );
    let table = rows(&dir, "small");
    assert!(table.iter().all(|r| r.get("status") == Some("ok")));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A rank that hangs: its peers stop waiting for it before the spec's deadline (their wait is
/// capped at 3/4 of it), naming it, and the point is recorded as failed.
#[cfg(feature = "mpi")]
#[test]
fn a_hung_rank_is_named_by_its_peers_before_the_deadline() {
    let dir = temp_dir("launch-hung");
    let deadline = 10;
    let spec = small_spec(&dir, deadline);
    let (spec, out) = (spec.to_str().unwrap(), dir.to_str().unwrap());
    let start = Instant::now();
    let run = run(
        &[spec, "--results", out, "--launcher", "mpirun"],
        &[("RINGBENCH_HANG_POINT", "3:1")],
    );
    // The other three points plus the deadline, and the 5 s a stopped job gets before SIGKILL.
    assert!(start.elapsed() < Duration::from_secs(deadline as u64 + 5 + 60));
    assert!(!run.status.success());
    let table = rows(&dir, "small");
    let status = table[3].get("status").unwrap();
    // Whichever peer's wait ends first says it.
    assert!(
        status.starts_with("failed: rank ")
            && status.contains(": no message from rank 1 within 7.5 s"),
        "{status}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--shard 1/3, 2/3, 3/3` then `--merge`: the unsharded table, row for row; each point's one-rank
/// baseline in its shard (ring_over_single filled as unsharded). A slice of another spec is refused
/// naming its hash; a slice given twice is refused naming the point.
#[test]
fn shards_merge_into_the_unsharded_table() {
    let dir = temp_dir("launch-shards");
    let spec = small_spec(&dir, 60);
    let (spec, out) = (spec.to_str().unwrap(), dir.to_str().unwrap());
    let whole = run(&[spec, "--results", &format!("{out}/whole")], &[]);
    assert!(whole.status.success(), "{}", text(&whole));
    let mut slices = Vec::new();
    let mut counted = 0;
    for i in 1..=3 {
        let shard = format!("{i}/3");
        let o = run(&[spec, "--results", out, "--shard", &shard], &[]);
        assert!(o.status.success(), "{}", text(&o));
        let slice = dir.join(format!("small.shard-{i}-of-3"));
        counted += rows(&dir, &format!("small.shard-{i}-of-3")).len();
        slices.push(slice.to_str().unwrap().to_owned());
    }
    assert_eq!(counted, 4, "disjoint slices cover the points");
    let mut args = vec![spec, "--results", out, "--merge"];
    args.extend(slices.iter().map(String::as_str));
    let merged = run(&args, &[]);
    assert!(merged.status.success(), "{}", text(&merged));
    let theirs = rows(&dir.join("whole"), "small");
    let ours = rows(&dir, "small");
    same_exact_columns(&theirs, &ours, "threads");
    for (a, b) in theirs.iter().zip(&ours) {
        assert_eq!(
            a.get("ring_over_single").is_some_and(|v| v.is_empty()),
            b.get("ring_over_single").is_some_and(|v| v.is_empty()),
        );
    }
    // Another spec (another repeat count: another settings hash).
    let other = dir.join("other.toml");
    let text_of = std::fs::read_to_string(spec).unwrap();
    std::fs::write(&other, text_of.replace("repeats = 1", "repeats = 2")).unwrap();
    let mut refused = vec![other.to_str().unwrap(), "--results", out, "--merge"];
    refused.extend(slices.iter().map(String::as_str));
    let o = run(&refused, &[]);
    assert!(!o.status.success());
    let said = text(&o);
    let hash = rows(&dir, "small")[0].get("spec_hash").unwrap().to_owned();
    assert!(
        said.contains(&format!("spec_hash {hash}")) && said.contains("another spec"),
        "{said}"
    );
    let twice = run(
        &[spec, "--results", out, "--merge", &slices[0], &slices[0]],
        &[],
    );
    assert!(!twice.status.success());
    assert!(
        text(&twice).contains("is in two slices"),
        "{}",
        text(&twice)
    );
    // Slices missing: the points are listed.
    let part = run(&[spec, "--results", out, "--merge", &slices[0]], &[]);
    assert!(part.status.success());
    assert!(text(&part).contains("missing: "), "{}", text(&part));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A kind with side files (the `train` kind's curves) sharded by seed and merged: the merged
/// curves.csv holds every slice's curves, an earlier run's curves.csv and curves.svg in the output
/// are replaced, and the figure is drawn from the merged curves.
#[test]
fn merged_side_files_join_every_slice_and_replace_an_earlier_runs() {
    let dir = temp_dir("launch-side-files");
    let quick = std::fs::read_to_string(workspace().join("experiments/train_quick.toml")).unwrap();
    let sweep = "[sweep]\nstrategies = [\"zigzag\"]\nbackward = [\"kv\"]\nranks = [1, 2]\n\
                 seeds = [0, 1]\n";
    let start = quick.find("[sweep]").unwrap();
    let end = quick.find("[task]").unwrap();
    let spec_text =
        format!("{}{sweep}\n{}", &quick[..start], &quick[end..]).replace("steps = 20", "steps = 3");
    let spec = dir.join("tiny.toml");
    std::fs::write(&spec, spec_text).unwrap();
    let (spec, out) = (spec.to_str().unwrap(), dir.to_str().unwrap());
    let mut slices = Vec::new();
    for i in 1..=2 {
        let o = run(&[spec, "--results", out, "--shard", &format!("{i}/2")], &[]);
        assert!(o.status.success(), "{}", text(&o));
        slices.push(dir.join(format!("tiny.shard-{i}-of-2")));
    }
    // An earlier run's files where the merge writes.
    let merged = dir.join("tiny");
    std::fs::create_dir_all(&merged).unwrap();
    std::fs::write(merged.join("curves.csv"), "strategy,step,loss\nstale,0,9\n").unwrap();
    std::fs::write(merged.join("curves.svg"), "<svg>stale</svg>").unwrap();
    let mut args = vec![spec, "--results", out, "--merge"];
    let listed: Vec<String> = slices.iter().map(|s| s.display().to_string()).collect();
    args.extend(listed.iter().map(String::as_str));
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let curves = |d: &Path| Table::read(&d.join("curves.csv")).unwrap().rows;
    let want: Vec<Record> = slices.iter().flat_map(|s| curves(s)).collect();
    // 2 seeds × 2 rank counts × 3 steps, each slice holding one seed's.
    assert_eq!(want.len(), 12);
    assert_eq!(curves(&merged), want);
    let svg = std::fs::read_to_string(merged.join("curves.svg")).unwrap();
    assert!(
        !svg.contains("stale") && svg.matches("<polyline").count() >= 4,
        "{svg}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Bad input: a shard outside 1..=N and an unknown placeholder are refused naming the value.
#[test]
fn bad_shards_and_launcher_commands_are_refused() {
    let dir = temp_dir("launch-bad");
    let spec = small_spec(&dir, 60);
    for shard in ["0/3", "4/3", "1/0", "x"] {
        let o = ringbench(&["run", spec.to_str().unwrap(), "--shard", shard]);
        assert!(!o.status.success());
        assert!(text(&o).contains(&format!("'{shard}'")), "{}", text(&o));
    }
    let bad = dir.join("bad.toml");
    let mut t = std::fs::read_to_string(&spec).unwrap();
    t += "mpirun = [\"mpirun\", \"-n\", \"{rank}\"]\n";
    std::fs::write(&bad, t).unwrap();
    let o = ringbench(&["run", bad.to_str().unwrap(), "--launcher", "mpirun"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("launcher.mpirun: '{rank}': unknown placeholder"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Where points run is not what they compute: a `[launcher]` table leaves the settings hash (and so
/// the rows a rerun keeps) as it was, and kinds read the spec as if it were not there.
#[test]
fn the_launcher_table_is_not_part_of_the_settings_hash() {
    use experiments::spec::SpecText;
    let base = "kind = \"attn\"\n[sweep]\nranks = [1]\nseq_lens = [64]\n";
    let with = format!(
        "{base}[launcher]\nname = \"mpirun\"\nmpirun = [\"mpirun\", \"-n\", \"{{ranks}}\"]\n\
         deadline_seconds = 10\n[measure]\nrepeats = 1\n"
    );
    let without = format!("{base}[measure]\nrepeats = 1\n");
    let hash = |text: &str| {
        SpecText::from_text(Path::new("t.toml"), text.to_owned())
            .unwrap()
            .settings_hash()
    };
    assert_eq!(hash(&with), hash(&without));
    let spec = SpecText::from_text(Path::new("t.toml"), with).unwrap();
    assert!(kinds::by_name("attn").unwrap().plan(&spec).is_ok());
}

/// Training points launched as processes (a rank a process, the gradients all-reduced over MPI)
/// give the thread run's losses bit for bit, and its memory column.
#[cfg(feature = "mpi")]
#[test]
fn training_points_under_mpirun_give_the_thread_runs_losses() {
    let dir = temp_dir("launch-train");
    let (theirs, ours) = threads_then_mpirun(&dir, "train_quick");
    assert_eq!(theirs.len(), 12);
    assert_eq!(theirs.len(), ours.len());
    let keys = kinds::by_name("train").unwrap().card().key_columns;
    for (a, b) in theirs.iter().zip(&ours) {
        assert_eq!(a.id(keys), b.id(keys));
        for column in [
            "first_loss",
            "final_loss",
            "max_rel_loss_diff",
            "engine_peak_mib_per_rank",
        ] {
            assert_eq!(a.get(column), b.get(column), "{column}: {}", b.id(keys));
        }
        assert_eq!(b.get("transport"), Some("mpi"));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Without the `mpi` feature, a launcher is refused before any point runs, naming the feature.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_launcher_needs_the_mpi_feature() {
    let dir = temp_dir("launch-no-mpi");
    let spec = small_spec(&dir, 60);
    let o = ringbench(&["run", spec.to_str().unwrap(), "--launcher", "srun"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("`mpi` feature"), "{}", text(&o));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Decoding points launched as processes (the KV cache sharded over processes, merged over MPI)
/// count the thread run's bytes and cache, and stay within the decode bound of the recompute's
/// logits; retrieval points give the thread run's replies, scored alike; perplexity points score
/// every window as the threads do, bit for bit (each rank's arithmetic is the same, and the NLLs
/// travel as their bits).
#[cfg(feature = "mpi")]
#[test]
fn decoding_and_retrieval_points_under_mpirun_match_the_thread_runs() {
    let dir = temp_dir("launch-decode");
    for (name, columns) in [
        (
            "decode_quick",
            &[
                "bytes_per_token_per_rank",
                "cache_bytes_per_rank",
                "cache_keys_max_over_mean",
            ][..],
        ),
        (
            "retrieval_quick",
            &["cases", "correct", "accuracy", "near_ties", "prompt_tokens"][..],
        ),
        (
            "ppl_quick",
            &["windows", "tokens", "mean_nll", "bucket_nll"][..],
        ),
    ] {
        let (theirs, ours) = threads_then_mpirun(&dir.join(name), name);
        assert!(!theirs.is_empty());
        assert_eq!(theirs.len(), ours.len());
        let kind = name.strip_suffix("_quick").expect("a quick spec");
        let keys = kinds::by_name(kind).unwrap().card().key_columns;
        for (a, b) in theirs.iter().zip(&ours) {
            assert_eq!(a.id(keys), b.id(keys));
            for column in columns {
                assert_eq!(
                    a.get(column),
                    b.get(column),
                    "{name} {column}: {}",
                    b.id(keys)
                );
            }
            assert_eq!(b.get("transport"), Some("mpi"));
            if name == "decode_quick" {
                // The decode suite's bound on the cached logits against the recompute.
                let error = b.num("max_rel_error");
                assert!(
                    error <= reference::bounds::F32_ATTENTION,
                    "{error}: {}",
                    b.id(keys)
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}
