//! The `balanced` strategy's acceptance on the `balance` specs, solved afresh (the solver runs here;
//! the committed tables are `reproduce --check`'s to compare): on every row (ranks, length,
//! profile, documents, window, model) its simulated makespan is at most 1.01 × the best fixed
//! strategy's, and the tables show where it is strictly better: on every mixed-mask row (1:1, 5:1)
//! whose windowed and full layers want different fixed layouts, by more than 1%.

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
const KEYS: [&str; 6] = [
    "ranks",
    "block_size",
    "profile",
    "documents",
    "window",
    "model",
];

#[test]
fn balanced_is_never_more_than_one_percent_slower_than_the_best_fixed_layout() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!("ringbench-balanced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let (mut points, mut strictly_better, mut mixed_rows) = (0, 0, 0);
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
        let model_key = KEYS
            .iter()
            .filter(|k| column(k).is_some())
            .position(|k| *k == "model");
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
        if let Some(at) = model_key {
            mixed_rows += strictly_better_where_layers_disagree(table, &by_point, at);
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
    println!(
        "{points} points, balanced strictly better (by > 1%) on {strictly_better}, {mixed_rows} of \
         them mixed-mask rows whose layers want different fixed layouts"
    );
    assert!(points >= 50, "{points} points");
    assert!(
        mixed_rows >= 4,
        "{mixed_rows} mixed-mask rows where the layers disagree"
    );
    assert!(strictly_better > 0, "balanced is strictly better nowhere");
    std::fs::remove_dir_all(out).unwrap();
}

/// The fixed strategies within 1% of the best fixed makespan of a point.
fn near_best(fixed: &[(String, f64)]) -> Vec<&str> {
    // (Every makespan was checked finite as it was read.)
    let best = fixed
        .iter()
        .map(|f| f.1)
        .min_by(f64::total_cmp)
        .expect("a fixed row");
    fixed
        .iter()
        .filter(|(_, t)| *t <= 1.01 * best)
        .map(|(n, _)| n.as_str())
        .collect()
}

/// On each 1:1 or 5:1 row whose all-window and all-full rows (same other keys) have no fixed
/// strategy near the best on both, balanced must beat the best fixed layout by more than 1%.
/// Returns how many such rows there were.
fn strictly_better_where_layers_disagree(
    table: &str,
    by_point: &BTreeMap<Vec<String>, Point>,
    at: usize,
) -> usize {
    let with_model = |key: &[String], model: &str| {
        let mut other = key.to_vec();
        other[at] = model.to_string();
        by_point.get(&other)
    };
    let mut rows = 0;
    for (key, (balanced, fixed)) in by_point {
        if !["1:1", "5:1"].contains(&key[at].as_str()) {
            continue;
        }
        let (window, full) = (with_model(key, "window"), with_model(key, "full"));
        let (Some(window), Some(full)) = (window, full) else {
            panic!("{table} {key:?}: no all-window or all-full row beside it");
        };
        let full_best = near_best(&full.1);
        if near_best(&window.1).iter().any(|s| full_best.contains(s)) {
            continue;
        }
        let balanced = balanced.expect("a balanced row");
        let best = fixed
            .iter()
            .map(|f| f.1)
            .min_by(f64::total_cmp)
            .expect("a fixed row");
        assert!(
            balanced < 0.99 * best,
            "{table} {key:?}: the layers disagree, yet balanced {balanced} ms is not 1% under the \
             best fixed {best} ms"
        );
        rows += 1;
    }
    rows
}
