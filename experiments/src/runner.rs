//! `ringbench run SPEC.toml`: a kind's sweep computed point by point into
//! `RESULTS/NAME/{results.csv, results.md, spec.toml, *.svg}`; points already in results.csv are
//! kept (resume), so a rerun computes nothing and changes no byte of it.

use crate::kinds::{self, PointContext};
use crate::results::Table;
use crate::spec::SpecText;
use anyhow::{Context, Result, anyhow};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

/// `ringbench run`'s arguments.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Experiment spec, e.g. experiments/balance.toml.
    #[arg(required_unless_present = "kinds")]
    pub spec: Option<PathBuf>,
    /// Recompute every point, discarding the rows of an earlier run.
    #[arg(long)]
    pub force: bool,
    /// Results go to DIR/NAME (NAME is the spec's file stem).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// List the experiment kinds and their sweep keys, and exit.
    #[arg(long)]
    pub kinds: bool,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The results directory.
    pub dir: PathBuf,
    /// Points computed in this run.
    pub computed: usize,
    /// Points kept from an earlier run.
    pub kept: usize,
}

/// `ringbench run`.
pub fn run_command(args: &RunArgs) -> Result<()> {
    if args.kinds {
        print!("{}", kinds::listing());
        return Ok(());
    }
    let spec = args.spec.as_ref().ok_or_else(|| anyhow!("no spec given"))?;
    run(spec, &args.results, args.force).map(|_| ())
}

/// Runs the spec at `path` into `results/NAME`.
pub fn run(path: &Path, results: &Path, force: bool) -> Result<RunSummary> {
    let spec = SpecText::load(path)?;
    let kind = kinds::by_name(&spec.kind).map_err(|e| spec.error("", "kind", &e))?;
    let mut plan = kind.plan(&spec)?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{}: no file name", path.display()))?;
    let dir = results.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv_path = dir.join("results.csv");
    let mut table = if force {
        Table::default()
    } else {
        Table::read(&csv_path)?
    };
    if force {
        // A kind's side files (training curves) belong to the rows being discarded.
        for side in kind.side_files() {
            let _ = std::fs::remove_file(dir.join(side));
        }
    }
    let points = plan.points();
    let todo: Vec<usize> = (0..points.len())
        .filter(|&i| !table.has_all(&points[i].rows))
        .collect();
    let bar = ProgressBar::new(todo.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("progress template")?,
    );
    for &i in &todo {
        bar.set_message(points[i].label.clone());
        let rows = plan.compute(
            i,
            &PointContext {
                table: &table,
                dir: &dir,
                bar: &bar,
            },
        )?;
        table.replace(&points[i].key, rows);
        // Written after every point: a run that stops resumes from here.
        table.write_csv(&csv_path)?;
        bar.inc(1);
        if bar.is_hidden() {
            println!("[{}/{}] {}", bar.position(), todo.len(), points[i].label);
        }
    }
    bar.finish_and_clear();
    if !csv_path.exists() {
        table.write_csv(&csv_path)?;
    }
    let about = if spec.description.is_empty() {
        kind.card().about.to_owned()
    } else {
        spec.description.clone()
    };
    let md = format!(
        "# {name}\n\n{about}\n\nRegenerate: `ringbench run {}`\n\n{}",
        path.display(),
        table.markdown()
    );
    std::fs::write(dir.join("results.md"), &md)?;
    std::fs::write(dir.join("spec.toml"), &spec.text)?;
    if !table.rows.is_empty() {
        kind.figure(&table, &dir)?;
    }
    println!("{md}");
    let kept = points.len() - todo.len();
    println!(
        "{}: {} points computed, {kept} kept from an earlier run",
        dir.display(),
        todo.len()
    );
    Ok(RunSummary {
        dir,
        computed: todo.len(),
        kept,
    })
}
