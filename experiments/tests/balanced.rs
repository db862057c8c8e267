//! The `balanced` strategy's acceptance on the `balance` specs, solved afresh (the solver runs here;
//! the committed tables are `reproduce --check`'s to compare): on every row (ranks, length,
//! profile, documents, window) its simulated makespan is at most 1.01 × the best fixed strategy's,
//! and the tables show where it is strictly better.

use std::collections::BTreeMap;
use std::path::Path;

/// The balance specs with a `balanced` row on every point.
const TABLES: [&str; 4] = [
    "balance",
    "balance_windows",
    "balance_packed",
    "balance_masks",
];
/// Per point: balanced's makespan, and every fixed strategy's.
type Point = (Option<f64>, Vec<(String, f64)>);

/// Columns that name a point besides its strategy.
const KEYS: [&str; 5] = ["ranks", "block_size", "profile", "documents", "window"];

#[test]
fn balanced_is_never_more_than_one_percent_slower_than_the_best_fixed_layout() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!("ringbench-balanced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let (mut points, mut strictly_better) = (0, 0);
    for table in TABLES {
        // The spec solved now, every strategy's makespan simulated from its layout.
        let spec = workspace.join("experiments").join(format!("{table}.toml"));
        let options = experiments::runner::RunOptions {
            force: false,
            quiet: true,
            ..Default::default()
        };
        let summary = experiments::runner::run_with(&spec, &out, &options).unwrap();
        assert_eq!(summary.kept, 0, "{table}: every point computed here");
        let path = summary.dir.join("results.csv");
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let header = reader.headers().unwrap().clone();
        let column = |name: &str| header.iter().position(|h| h == name);
        let strategy = column("strategy").unwrap();
        let makespan = column("makespan_ms").unwrap();
        let keys: Vec<usize> = KEYS.iter().filter_map(|k| column(k)).collect();
        // Per point: balanced's makespan and the best fixed strategy's.
        let mut by_point: BTreeMap<Vec<String>, Point> = BTreeMap::new();
        for record in reader.records() {
            let record = record.unwrap();
            let key = keys.iter().map(|&i| record[i].to_string()).collect();
            let time: f64 = record[makespan].parse().unwrap();
            assert!(time.is_finite() && time > 0.0, "{table}: makespan {time}");
            let entry = by_point.entry(key).or_default();
            match &record[strategy] {
                "balanced" => entry.0 = Some(time),
                other => entry.1.push((other.to_string(), time)),
            }
        }
        for (key, (balanced, fixed)) in by_point {
            let balanced = balanced.unwrap_or_else(|| panic!("{table} {key:?}: no balanced row"));
            assert!(!fixed.is_empty(), "{table} {key:?}: no fixed strategy");
            let (name, best) = fixed
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(n, t)| (n.clone(), *t))
                .unwrap();
            assert!(
                balanced <= 1.01 * best,
                "{table} {key:?}: balanced {balanced} ms against {name} {best} ms"
            );
            points += 1;
            strictly_better += usize::from(balanced < 0.99 * best);
        }
    }
    println!("{points} points, balanced strictly better (by > 1%) on {strictly_better}");
    assert!(points >= 50, "{points} points");
    assert!(strictly_better > 0, "balanced is strictly better nowhere");
    std::fs::remove_dir_all(out).unwrap();
}
