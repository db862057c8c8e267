//! `ringbench reproduce quick|full`: every table computed afresh into a run directory, then compared
//! with the committed reference in `results/`, key figures side by side (`comparison.md`).

use crate::kinds;
use crate::results::{Record, Table, significant};
use crate::runner;
use crate::spec::SpecText;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How much to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Size {
    /// Small sweeps: minutes on a laptop CPU.
    Quick,
    /// The committed tables' sweeps.
    Full,
}

/// `ringbench reproduce`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ReproduceArgs {
    /// Quick or full.
    pub size: Size,
    /// Where the run's tables go (default: `runs/<UTC time>/`).
    #[arg(long, conflicts_with = "into")]
    pub out: Option<PathBuf>,
    /// Write into this directory instead, resuming its tables (`--into results` updates the
    /// committed reference).
    #[arg(long)]
    pub into: Option<PathBuf>,
    /// The committed tables compared against.
    #[arg(long, default_value = "results")]
    pub reference: PathBuf,
    /// With --into: recompute its tables' rows.
    #[arg(long)]
    pub force: bool,
}

/// (quick spec, full spec) per table, under `experiments/`.
pub const TABLES: &[(&str, &str)] = &[
    ("balance_quick", "balance"),
    ("balance_measured_quick", "balance_measured"),
    ("balance_packed", "balance_packed"),
    ("overlap", "overlap"),
    ("knee_quick", "knee"),
    ("memory_quick", "memory"),
    ("mfu_quick", "mfu"),
    ("memory_model", "memory_model"),
    ("ablation_quick", "ablation"),
    ("train_quick", "train"),
];

/// `runs/YYYY-MM-DDTHH-MM-SSZ` for the present moment.
fn run_dir() -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian; Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    PathBuf::from("runs").join(format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    ))
}

/// `ringbench reproduce`.
pub fn run(args: &ReproduceArgs) -> Result<()> {
    let out = match (&args.into, &args.out) {
        (Some(into), _) => into.clone(),
        (None, Some(out)) => out.clone(),
        (None, None) => run_dir(),
    };
    let fresh = args.into.is_none();
    if fresh && finished(&out) {
        anyhow::bail!(
            "{} already holds a finished run; choose another --out",
            out.display()
        );
    }
    // The reference is read before anything is written (with --into it may be the same directory).
    let mut sections = Vec::new();
    for (quick, full) in TABLES {
        let name = if args.size == Size::Quick {
            quick
        } else {
            full
        };
        let spec = PathBuf::from(format!("experiments/{name}.toml"));
        let reference = Table::read(&args.reference.join(name).join("results.csv"))?;
        sections.push((name, spec, reference));
    }
    let start = Instant::now();
    let mut comparison = format!(
        "# ringbench reproduce {}: this run against {}\n\n",
        if args.size == Size::Quick {
            "quick"
        } else {
            "full"
        },
        args.reference.display()
    );
    for (name, spec, reference) in &sections {
        let table_start = Instant::now();
        let summary = runner::run(spec, &out, args.force && !fresh)?;
        let kind = kinds::by_name(&SpecText::load(spec)?.kind).map_err(anyhow::Error::msg)?;
        let ours = Table::read(&summary.dir.join("results.csv"))?;
        comparison += &format!(
            "## {name} ({}; {:.0} s, {} points computed)\n\n{}\n",
            kind.card().name,
            table_start.elapsed().as_secs_f64(),
            summary.computed,
            compare(
                reference,
                &ours,
                kind.card().key_columns,
                kind.card().headline_columns
            )
        );
    }
    comparison += &format!(
        "Total: {:.1} minutes. Ratios are this run over the reference; measured tables differ by \
         machine and load, simulated and analytic ones should be 1.\n",
        start.elapsed().as_secs_f64() / 60.0
    );
    std::fs::write(out.join("comparison.md"), &comparison)?;
    println!("{comparison}");
    println!("wrote {}", out.join("comparison.md").display());
    Ok(())
}

/// The headline columns of every row present in both tables, with their ratio, as Markdown.
pub fn compare(reference: &Table, ours: &Table, keys: &[&str], headline: &[&str]) -> String {
    if reference.rows.is_empty() {
        return "No committed reference for this table.\n".into();
    }
    let mut rows = Vec::new();
    for row in &ours.rows {
        let id = row.id(keys);
        let Some(theirs) = reference.rows.iter().find(|r| r.id(keys) == id) else {
            continue;
        };
        for &column in headline {
            let (a, b) = (theirs.num(column), row.num(column));
            if a.is_nan() && b.is_nan() {
                continue;
            }
            let shown = |x: f64| {
                if x.is_nan() {
                    "-".to_owned()
                } else {
                    significant(x, 4)
                }
            };
            let ratio = if a != 0.0 && a.is_finite() && b.is_finite() {
                significant(b / a, 3)
            } else {
                "-".into()
            };
            rows.push(Record::new([
                ("row", id.clone()),
                ("column", column.to_owned()),
                ("reference", shown(a)),
                ("this run", shown(b)),
                ("ratio", ratio),
            ]));
        }
    }
    if rows.is_empty() {
        return "No row of this run is in the committed reference (different sweep points).\n"
            .into();
    }
    Table::of(rows).markdown()
}

/// Whether `dir` holds a finished reproduce run.
pub fn finished(dir: &Path) -> bool {
    dir.join("comparison.md").exists()
}
