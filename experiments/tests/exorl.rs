//! `ringbench exorl`: stats of NumPy-written ExoRL episodes, clear errors on bad files, and a tiny
//! end-to-end table run (collect → load → train with ring attention → roll out; the table command
//! itself fails if a rollout of the same model and seed does not return the same value twice).

mod common;

use common::{ringbench, temp_dir};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/tests/fixtures/exorl")
}

#[test]
fn stats_of_numpy_written_episodes_match_numpy() {
    let good = fixtures().join("good");
    let out = ringbench(&["exorl".as_ref(), "stats".as_ref(), good.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();
    let want = std::fs::read_to_string(fixtures().join("expected_stats.csv")).unwrap();
    let got: Vec<&str> = got.lines().collect();
    let want: Vec<&str> = want.lines().collect();
    assert_eq!(got[0], "file,steps,return,obs_dim,act_dim");
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want).skip(1) {
        let (g, w): (Vec<&str>, Vec<&str>) = (g.split(',').collect(), w.split(',').collect());
        assert_eq!(format!("good/{}", g[0]), w[0]);
        assert_eq!((g[1], g[3], g[4]), (w[1], w[3], w[4]));
        let (gr, wr): (f64, f64) = (g[2].parse().unwrap(), w[2].parse().unwrap());
        assert!((gr - wr).abs() < 1e-5, "{gr} vs {wr}");
    }
}

#[test]
fn stats_of_a_bad_file_names_it() {
    for (dir, says) in [
        ("missing_key", "missing key `physics`"),
        ("mismatch", "`reward` has 5 rows"),
        ("truncated", "not a readable npz"),
    ] {
        let path = fixtures().join("bad").join(dir);
        let out = ringbench(&["exorl".as_ref(), "stats".as_ref(), path.as_os_str()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains("20220101T000000_0_5.npz") && stderr.contains(says),
            "{stderr}"
        );
    }
}

#[test]
fn a_tiny_table_runs_end_to_end() {
    let dir = temp_dir("exorl-table");
    let spec = format!(
        r#"
out = "{out}"
data_root = "{data}"
seeds = [0, 1]
eval_episodes = 1
memory_budget_mib = 64.0
[data]
episodes_per_policy = 2
seed = 0
[model]
d_model = 16
layers = 1
heads = 2
kv_heads = 1
[train]
steps = 2
trajectories_per_step = 2
lr = 1e-3
ranks = 2
strategy = "zigzag"
[[task]]
name = "point_mass_reach"
interval = 50
[[config]]
name = "bc"
k = 1
return_conditioned = false
[[config]]
name = "at_k2"
k = 2
return_conditioned = true
"#,
        out = dir.join("out").display(),
        data = dir.join("data").display()
    );
    let spec_path = dir.join("spec.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let run = || {
        let out = ringbench(&[
            "exorl".as_ref(),
            "table".as_ref(),
            "--spec".as_ref(),
            spec_path.as_os_str(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(dir.join("out/returns.csv")).unwrap()
    };
    let first = run();
    let rows: Vec<&str> = first.lines().collect();
    assert_eq!(rows.len(), 3, "{first}");
    assert!(
        rows[1].starts_with("point_mass_reach,bc,1,false,80,2,"),
        "{first}"
    );
    assert!(
        rows[2].starts_with("point_mass_reach,at_k2,2,true,160,2,"),
        "{first}"
    );
    let buffer = dir.join("data/datasets/point_mass_reach/scripted/buffer");
    let files: Vec<_> = std::fs::read_dir(&buffer).unwrap().collect();
    assert_eq!(files.len(), 2);
    // Same spec, same data, same seeds: the same returns (time columns aside).
    let returns = |csv: &str| -> Vec<String> {
        csv.lines()
            .map(|l| l.split(',').take(9).collect::<Vec<_>>().join(","))
            .collect()
    };
    assert_eq!(returns(&run()), returns(&first));

    // The same file with `kind = "exorl"` is a runner spec: `ringbench run` computes the same rows.
    let kind_spec = dir.join("table.toml");
    let text = std::fs::read_to_string(&spec_path).unwrap();
    std::fs::write(&kind_spec, format!("kind = \"exorl\"\n{text}")).unwrap();
    let out = ringbench(&[
        "run".as_ref(),
        kind_spec.as_os_str(),
        "--results".as_ref(),
        dir.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(dir.join("table/results.csv")).unwrap();
    assert_eq!(returns(&table), returns(&first));
    assert!(dir.join("table/data.csv").exists() && dir.join("table/returns.svg").exists());
}
