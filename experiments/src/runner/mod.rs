//! `ringbench run SPEC.toml`: a kind's sweep computed point by point into
//! `RESULTS/NAME/{results.csv, results.md, spec.toml, *.svg}`; points already in results.csv are
//! kept (resume), so a rerun computes nothing and changes no byte of it. Each row carries the hash
//! of the spec's settings and the ringbench version that computed it: rows of another spec's
//! settings are recomputed. One run at a time writes a directory (its lock file).
//!
//! Points run in this process ([`launch`]: threads) or each as a job of processes (mpirun, srun),
//! whose failures become `failed` rows that a rerun retries; `--shard I/N` computes one slice of the
//! points ([`shard`]) and `--merge` joins slices ([`merge`]); a launched job's processes run
//! [`worker`].

pub mod launch;
pub mod merge;
pub mod shard;
pub mod worker;

use crate::dir_lock::DirLock;
use crate::kinds::{self, Experiment, Point, PointContext};
use crate::results::{Record, SPEC_HASH, TRANSPORT, Table, VERSION, write_whole};
use crate::spec::SpecText;
use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use launch::{Launcher, LauncherName, PointJob};
use shard::Shard;
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
    /// What starts each point's ranks: threads (in this process), mpirun or srun (each point one
    /// job of `ranks` processes; the spec's `[launcher]` table sets the command). Default: the
    /// spec's `[launcher] name`, else threads.
    #[arg(long)]
    pub launcher: Option<LauncherName>,
    /// Compute only the I-th of N disjoint slices of the points (1 <= I <= N), into
    /// RESULTS/NAME.shard-I-of-N (a job array's task).
    #[arg(long, conflicts_with = "merge")]
    pub shard: Option<Shard>,
    /// Join the tables of these slice directories into RESULTS/NAME instead of computing: refused
    /// for rows of another spec or a point in two slices; missing points are listed.
    #[arg(long, num_args = 1..)]
    pub merge: Vec<PathBuf>,
}

/// How a run goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Recompute every point, discarding the rows of an earlier run.
    pub force: bool,
    /// Print nothing (a caller that reports the run its own way): no per-point lines, no table.
    pub quiet: bool,
    /// The launcher the command line names (`None`: the spec's, else threads).
    pub launcher: Option<LauncherName>,
    /// Only this slice of the points.
    pub shard: Option<Shard>,
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
    /// Points whose launched job failed (each a `failed` row).
    pub failed: usize,
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
    if !args.merge.is_empty() {
        return merge::merge(spec, &args.merge, &results).map(|_| ());
    }
    let summary = run_with(
        spec,
        &results,
        &RunOptions {
            force: args.force,
            quiet: false,
            launcher: args.launcher,
            shard: args.shard,
        },
    )?;
    if summary.failed > 0 {
        bail!(
            "{} of the points failed (their rows say why; `ringbench run` again retries only them)",
            summary.failed
        );
    }
    Ok(())
}

/// The `status` of a point whose launched job failed begins with this.
pub const FAILED: &str = "failed: ";

/// Whether `row` records a failed job (a rerun computes its point again).
pub fn is_failed(row: &Record) -> bool {
    row.get("status").is_some_and(|s| s.starts_with(FAILED))
}

/// The rows of a point whose job failed: each of its row keys with the reason as `status`.
fn failed_rows(point: &Point, reason: &str) -> Vec<Record> {
    point
        .rows
        .iter()
        .map(|key| {
            let mut row = key.clone();
            row.0.push(("status".into(), format!("{FAILED}{reason}")));
            row
        })
        .collect()
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

    /// Stamps `row` with the hash and version, and, for a kind whose points run a ring of ranks,
    /// what carried it.
    fn put_on(&self, row: &mut Record, transport: Option<&str>) {
        row.0
            .retain(|(c, _)| c != SPEC_HASH && c != VERSION && c != TRANSPORT);
        if let Some(transport) = transport {
            row.0.push((TRANSPORT.into(), transport.into()));
        }
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
            ..RunOptions::default()
        },
    )
}

/// Runs the spec at `path` into `results/NAME` as `options` say.
pub fn run_with(path: &Path, results: &Path, options: &RunOptions) -> Result<RunSummary> {
    let force = options.force;
    let spec = SpecText::load(path)?;
    let kind = kinds::by_name(&spec.kind).map_err(|e| spec.error("", "kind", &e))?;
    let mut plan = kind.plan(&spec)?;
    let launcher = Launcher::of(&spec, options.launcher)?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{}: no file name", path.display()))?;
    let name = options.shard.map_or(stem.to_owned(), |s| s.dir_name(stem));
    let dir = results.join(&name);
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
    let retried = table.rows.iter().filter(|r| is_failed(r)).count();
    if retried > 0 {
        eprintln!(
            "{}: {retried} rows record a failed job: computing their points again",
            dir.display()
        );
        table.rows.retain(|r| !is_failed(r));
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
    let mine = match options.shard {
        Some(shard) => shard.members(plan.as_ref(), &points),
        None => vec![true; points.len()],
    };
    let todo: Vec<usize> = (0..points.len())
        .filter(|&i| mine[i] && !table.has_all(&points[i].rows))
        .collect();
    let bar = ProgressBar::new(todo.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("progress template")?,
    );
    let mut failed = 0;
    let mut said_in_process = false;
    // `[measure] trace = true`: each point computed here records its timeline.
    let traced = spec.traced()?;
    let (mut trace, mut launched_trace) = (None, None);
    for &i in &todo {
        bar.set_message(points[i].label.clone());
        let processes = plan.processes(i);
        let launched = !launcher.in_process() && processes.is_some();
        if !launcher.in_process() && processes.is_none() && !said_in_process {
            bar.suspend(|| {
                eprintln!(
                    "kind {} computes in one process: its points run here, not under {}",
                    spec.kind,
                    launcher.name.name()
                )
            });
            said_in_process = true;
        }
        let mut rows = match (launched, processes) {
            (true, Some(ranks)) => {
                let job = PointJob {
                    spec: path,
                    index: i,
                    ranks,
                    dir: &dir,
                    spec_hash: &stamp.spec_hash,
                };
                match launcher.launch(&job)? {
                    Ok(rows) => {
                        let written = Launcher::trace_of(&job);
                        if traced && written.exists() {
                            launched_trace = Some(written);
                        }
                        rows
                    }
                    Err(reason) => {
                        failed += 1;
                        bar.suspend(|| eprintln!("{}: failed: {reason}", points[i].label));
                        failed_rows(&points[i], &reason)
                    }
                }
            }
            _ => {
                let recorder = traced.then(workbench::trace::Recorder::new);
                if let Some(recorder) = &recorder {
                    workbench::trace::install(recorder.clone());
                }
                let computed = plan.compute(
                    i,
                    &PointContext {
                        table: &table,
                        dir: &dir,
                        bar: &bar,
                    },
                );
                if recorder.is_some() {
                    workbench::trace::uninstall();
                }
                trace = recorder;
                computed?
            }
        };
        let transport = processes.map(|_| match launched {
            true => launcher.transport(),
            false => "threads",
        });
        for row in &mut rows {
            stamp.put_on(row, transport);
        }
        table.replace(&points[i].key, rows);
        // Written whole after every point: a run that stops, even killed mid-write, resumes here.
        table.write_csv(&csv_path)?;
        // A traced point's timeline, named by the point's first row in results.csv.
        let row = table.rows.iter().position(|r| r.matches(&points[i].key));
        let path = dir
            .join(TRACES)
            .join(format!("point-{}.json", row.unwrap_or(0)));
        if let Some(recorder) = trace.take() {
            std::fs::create_dir_all(dir.join(TRACES))?;
            recorder
                .write(&path)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(written) = launched_trace.take() {
            std::fs::create_dir_all(dir.join(TRACES))?;
            std::fs::rename(&written, &path)
                .with_context(|| format!("moving {} to {}", written.display(), path.display()))?;
        }
        bar.inc(1);
        if bar.is_hidden() && !options.quiet {
            println!("[{}/{}] {}", bar.position(), todo.len(), points[i].label);
        }
    }
    bar.finish_and_clear();
    if stale > 0 || retried > 0 || !csv_path.exists() {
        table.write_csv(&csv_path)?;
    }
    let mut command = format!(
        "ringbench run {} --results {}",
        path.display(),
        results.display()
    );
    if !launcher.in_process() {
        command += &format!(" --launcher {}", launcher.name.name());
    }
    if let Some(shard) = options.shard {
        command += &format!(" --shard {}/{}", shard.index, shard.count);
    }
    let md = write_tables(kind, &spec, &name, &command, &table, &dir)?;
    let kept = mine.iter().filter(|&&m| m).count() - todo.len();
    if !options.quiet {
        println!("{md}");
        let failed = match failed {
            0 => String::new(),
            n => format!(" ({n} of them failed)"),
        };
        println!(
            "{}: {} points computed{failed}, {kept} kept from an earlier run",
            dir.display(),
            todo.len()
        );
    }
    Ok(RunSummary {
        dir,
        computed: todo.len(),
        kept,
        failed,
    })
}

/// The directory beside results.csv that a traced run's timelines go to, one per point.
pub const TRACES: &str = "traces";

/// Writes a run's results.md (its text returned), spec.toml copy and figure into `dir` (results.csv
/// is written as points finish).
fn write_tables(
    kind: &dyn Experiment,
    spec: &SpecText,
    name: &str,
    command: &str,
    table: &Table,
    dir: &Path,
) -> Result<String> {
    let about = if spec.description.is_empty() {
        kind.card().about.to_owned()
    } else {
        spec.description.clone()
    };
    let md = format!(
        "# {name}\n\n{about}\n\nRegenerate: `{command}`\n\n{}",
        table.markdown()
    );
    write_whole(&dir.join("results.md"), md.as_bytes())?;
    write_whole(&dir.join("spec.toml"), spec.text.as_bytes())?;
    if !table.rows.is_empty() {
        kind.figure(table, dir)?;
    }
    Ok(md)
}
