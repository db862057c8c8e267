//! `ringbench run SPEC --merge DIR... --results OUT`: the slices of a sharded sweep (`--shard I/N`,
//! one directory each) joined into one table in the order an unsharded run writes it, with the
//! kind's side files (the `train` kind's curves, `exorl`'s data) joined from every slice and its
//! figures drawn from the joined data. Rows of another spec's settings and points found in two
//! slices are refused; missing points are listed.

use super::{RunSummary, is_failed, write_tables};
use crate::dir_lock::DirLock;
use crate::kinds;
use crate::results::{Record, SPEC_HASH, Table};
use crate::spec::SpecText;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};

/// Joins the tables in `slices` into `results/NAME`.
pub fn merge(path: &Path, slices: &[PathBuf], results: &Path) -> Result<RunSummary> {
    let spec = SpecText::load(path)?;
    let kind = kinds::by_name(&spec.kind).map_err(|e| spec.error("", "kind", &e))?;
    let plan = kind.plan(&spec)?;
    let points = plan.points();
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{}: no file name", path.display()))?;
    let spec_hash = spec.settings_hash();
    let keys = kind.card().key_columns;
    // Every slice's rows, each with the slice it came from and the point it belongs to.
    let mut found: Vec<(Record, &Path, usize)> = Vec::new();
    for slice in slices {
        let csv = slice.join("results.csv");
        if !csv.exists() {
            bail!("{}: no results.csv (not a slice of a run)", slice.display());
        }
        for (n, row) in Table::read(&csv)?.rows.into_iter().enumerate() {
            let hash = row.get(SPEC_HASH).unwrap_or("");
            if hash != spec_hash {
                bail!(
                    "{}: row {} was computed from another spec (spec_hash {}, this spec's is {}): \
                     slices of another spec cannot be merged",
                    csv.display(),
                    n + 1,
                    if hash.is_empty() { "missing" } else { hash },
                    spec_hash
                );
            }
            let point = points
                .iter()
                .position(|p| p.rows.iter().any(|k| row.matches(k)))
                .ok_or_else(|| {
                    anyhow!(
                        "{}: row {} ({}) is not a point of {}",
                        csv.display(),
                        n + 1,
                        row.id(keys),
                        path.display()
                    )
                })?;
            if let Some((_, other, _)) = found.iter().find(|(r, _, _)| r.id(keys) == row.id(keys)) {
                bail!(
                    "{} is in two slices: {} and {}",
                    row.id(keys),
                    other.display(),
                    slice.display()
                );
            }
            found.push((row, slice, point));
        }
    }
    let mut table = Table::default();
    let mut missing = Vec::new();
    for (i, point) in points.iter().enumerate() {
        let rows: Vec<Record> = found
            .iter()
            .filter(|(_, _, p)| *p == i)
            .map(|(r, _, _)| r.clone())
            .collect();
        if !Table::of(rows.clone()).has_all(&point.rows) {
            missing.push(point.label.clone());
        }
        table.rows.extend(rows);
    }
    let dir = results.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _lock = DirLock::take(&dir)?;
    table.write_csv(&dir.join("results.csv"))?;
    join_side_files(kind.side_files(), slices, &dir)?;
    let listed: Vec<String> = slices.iter().map(|s| s.display().to_string()).collect();
    let command = format!(
        "ringbench run {} --merge {} --results {}",
        path.display(),
        listed.join(" "),
        results.display()
    );
    let md = write_tables(kind, &spec, name, &command, &table, &dir)?;
    println!("{md}");
    let failed = table.rows.iter().filter(|r| is_failed(r)).count();
    println!(
        "{}: {} rows from {} slices ({failed} failed); {} of {} points missing",
        dir.display(),
        table.rows.len(),
        slices.len(),
        missing.len(),
        points.len()
    );
    for label in &missing {
        eprintln!("missing: {label}");
    }
    Ok(RunSummary {
        dir,
        computed: 0,
        kept: points.len() - missing.len(),
        failed,
    })
}

/// The kind's side files in `dir`, from the slices: each CSV's rows from every slice that has it
/// (a row two slices both wrote, such as a task's shared data, once), in slice order. Whatever
/// `dir` held under those names before is removed first, so no earlier run's file stays beside the
/// merged rows; the figures among them are drawn again from the joined data.
fn join_side_files(sides: &[&str], slices: &[PathBuf], dir: &Path) -> Result<()> {
    for side in sides {
        let target = dir.join(side);
        match std::fs::remove_file(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", target.display()));
            }
            _ => {}
        }
        if !side.ends_with(".csv") {
            continue;
        }
        let mut joined = Table::default();
        for slice in slices {
            let path = slice.join(side);
            if !path.exists() {
                continue;
            }
            for row in Table::read(&path)?.rows {
                if !joined.rows.contains(&row) {
                    joined.rows.push(row);
                }
            }
        }
        if !joined.rows.is_empty() {
            joined.write_csv(&target)?;
        }
    }
    Ok(())
}
