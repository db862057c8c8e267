//! `ringbench run SPEC.toml`: a kind's sweep computed point by point into
//! `RESULTS/NAME/{results.csv, results.md, spec.toml, *.svg}`; points already in results.csv are
//! kept (resume), so a rerun computes nothing and changes no byte of it. Each row carries the hash
//! of the spec's settings and the ringbench version that computed it: rows of another spec's
//! settings are recomputed. One run at a time writes a directory (its lock file).

use crate::dir_lock::DirLock;
use crate::kinds::{self, Experiment, Point, PointContext};
use crate::results::{Record, SPEC_HASH, Table, VERSION, write_whole};
use crate::spec::SpecText;
use anyhow::{Context, Result, anyhow};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

/// `ringbench run`'s arguments.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Experiment spec, e.g. experiments/balance.toml.
    #[arg(required_unless_present_any = ["kinds", "strategies"])]
    pub spec: Option<PathBuf>,
    /// Recompute every point, discarding the rows of an earlier run.
    #[arg(long)]
    pub force: bool,
    /// Results go to DIR/NAME (NAME is the spec's file stem). Default: a fresh
    /// `runs/<UTC time>/`, so that the committed reference is never touched unless asked:
    /// `--results results` updates it (and resumes from its rows).
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// List the experiment kinds and their sweep keys, and exit.
    #[arg(long)]
    pub kinds: bool,
    /// List the registered partition strategies, one name a line, and exit.
    #[arg(long)]
    pub strategies: bool,
}

/// How a run goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Recompute every point, discarding the rows of an earlier run.
    pub force: bool,
    /// Print nothing (a caller that reports the run its own way): no per-point lines, no table.
    pub quiet: bool,
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
    if args.strategies {
        for name in strategies::names() {
            println!("{name}");
        }
        return Ok(());
    }
    let spec = args.spec.as_ref().ok_or_else(|| anyhow!("no spec given"))?;
    let results = args.results.clone().unwrap_or_else(crate::results::run_dir);
    run(spec, &results, args.force).map(|_| ())
}

/// What every row of a run carries besides its kind's columns.
struct Stamp {
    spec_hash: String,
    version: &'static str,
    /// The settings hash of the spec copy beside the table (`spec.toml`), if there is one: what a
    /// row written before rows carried their hash was computed under.
    legacy_hash: Option<String>,
}

impl Stamp {
    fn of(spec: &SpecText, dir: &Path) -> Stamp {
        let copy = dir.join("spec.toml");
        Stamp {
            spec_hash: spec.settings_hash(),
            version: env!("CARGO_PKG_VERSION"),
            legacy_hash: SpecText::load(&copy).ok().map(|s| s.settings_hash()),
        }
    }

    /// Whether `row` was computed under this spec's settings.
    fn stamped(&self, row: &Record) -> bool {
        let hash = match row.get(SPEC_HASH) {
            Some(hash) if !hash.is_empty() => Some(hash),
            _ => self.legacy_hash.as_deref(),
        };
        hash == Some(self.spec_hash.as_str())
    }

    fn put_on(&self, row: &mut Record) {
        row.0.retain(|(c, _)| c != SPEC_HASH && c != VERSION);
        row.0.push((SPEC_HASH.into(), self.spec_hash.clone()));
        row.0.push((VERSION.into(), self.version.into()));
    }
}

/// An error unless every point's key (and the keys of the rows it makes) uses only the kind's key
/// columns: the one identity resume, `reproduce`'s comparison and baselines all match rows by (a key
/// column a key leaves out reads as empty, an axis the sweep does not have).
fn check_keys(kind: &dyn Experiment, points: &[Point]) -> Result<()> {
    let card = kind.card();
    for key in points
        .iter()
        .flat_map(|p| std::iter::once(&p.key).chain(&p.rows))
    {
        if let Some((column, _)) = key
            .0
            .iter()
            .find(|(c, _)| !card.key_columns.contains(&c.as_str()))
        {
            return Err(anyhow!(
                "kind {}: its points are keyed by '{column}', which is not among its key columns {:?}",
                card.name,
                card.key_columns
            ));
        }
    }
    Ok(())
}

/// Runs the spec at `path` into `results/NAME`, printing progress, the table and a summary line.
pub fn run(path: &Path, results: &Path, force: bool) -> Result<RunSummary> {
    run_with(
        path,
        results,
        &RunOptions {
            force,
            quiet: false,
        },
    )
}

/// Runs the spec at `path` into `results/NAME` as `options` say.
pub fn run_with(path: &Path, results: &Path, options: &RunOptions) -> Result<RunSummary> {
    let force = options.force;
    let spec = SpecText::load(path)?;
    let kind = kinds::by_name(&spec.kind).map_err(|e| spec.error("", "kind", &e))?;
    let mut plan = kind.plan(&spec)?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{}: no file name", path.display()))?;
    let dir = results.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _lock = DirLock::take(&dir)?;
    let csv_path = dir.join("results.csv");
    let stamp = Stamp::of(&spec, &dir);
    let mut table = if force {
        Table::default()
    } else {
        Table::read(&csv_path)?
    };
    let stale = table.rows.iter().filter(|r| !stamp.stamped(r)).count();
    if stale > 0 {
        // Said even when quiet: rows are being thrown away.
        eprintln!(
            "{}: {stale} of {} rows were computed under other settings (their {SPEC_HASH} is not \
             this spec's {}): recomputing them",
            dir.display(),
            table.rows.len(),
            stamp.spec_hash,
        );
        table.rows.retain(|r| stamp.stamped(r));
    }
    if force {
        // A kind's side files (training curves) belong to the rows being discarded.
        for side in kind.side_files() {
            let _ = std::fs::remove_file(dir.join(side));
        }
    }
    if !table.rows.is_empty() {
        // Said even when quiet: these rows were computed by an earlier run, perhaps on another
        // machine or by another build (their `ringbench_version` column says which).
        eprintln!(
            "{}: kept {} rows from an earlier run (--force recomputes them)",
            csv_path.display(),
            table.rows.len()
        );
    }
    let points = plan.points();
    check_keys(kind, &points)?;
    let todo: Vec<usize> = (0..points.len())
        .filter(|&i| !table.has_all(&points[i].rows))
        .collect();
    let bar = ProgressBar::new(todo.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("progress template")?,
    );
    for &i in &todo {
        bar.set_message(points[i].label.clone());
        let mut rows = plan.compute(
            i,
            &PointContext {
                table: &table,
                dir: &dir,
                bar: &bar,
            },
        )?;
        for row in &mut rows {
            stamp.put_on(row);
        }
        table.replace(&points[i].key, rows);
        // Written whole after every point: a run that stops, even killed mid-write, resumes here.
        table.write_csv(&csv_path)?;
        bar.inc(1);
        if bar.is_hidden() && !options.quiet {
            println!("[{}/{}] {}", bar.position(), todo.len(), points[i].label);
        }
    }
    bar.finish_and_clear();
    if stale > 0 || !csv_path.exists() {
        table.write_csv(&csv_path)?;
    }
    let about = if spec.description.is_empty() {
        kind.card().about.to_owned()
    } else {
        spec.description.clone()
    };
    let md = format!(
        "# {name}\n\n{about}\n\nRegenerate: `ringbench run {} --results {}`\n\n{}",
        path.display(),
        results.display(),
        table.markdown()
    );
    write_whole(&dir.join("results.md"), md.as_bytes())?;
    write_whole(&dir.join("spec.toml"), spec.text.as_bytes())?;
    if !table.rows.is_empty() {
        kind.figure(&table, &dir)?;
    }
    let kept = points.len() - todo.len();
    if !options.quiet {
        println!("{md}");
        println!(
            "{}: {} points computed, {kept} kept from an earlier run",
            dir.display(),
            todo.len()
        );
    }
    Ok(RunSummary {
        dir,
        computed: todo.len(),
        kept,
    })
}
