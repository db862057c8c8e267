//! `ringbench reproduce quick|full`: every table computed afresh into a run directory, then compared
//! with the committed reference in `results/` (`comparison.md`: one line per table, then what moved);
//! `--check` fails when a deterministic column moved, a row was lost or gained, or a measured cell is not a number.

use crate::comparison::{TableComparison, compare, duplicate_keys};
use crate::kinds;
use crate::results::{Table, write_whole};
use crate::runner::{self, RunOptions};
use crate::spec::SpecText;
use anyhow::{Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    /// Exit with status 1 when a table fails its comparison with the reference: a deterministic cell
    /// that differs, a reference row this run lost or a row it lacks, a measured cell that is NaN,
    /// infinite or empty where the reference has a number (each named: table, row, column).
    #[arg(long)]
    pub check: bool,
    /// Only these tables (names as in `results/`, comma-separated; default: every one).
    #[arg(long, value_delimiter = ',')]
    pub tables: Option<Vec<String>>,
}

/// (quick spec, full spec) per table, under `experiments/`; an empty quick spec: the table is in
/// the full run only (a real model's, which needs a download).
pub const TABLES: &[(&str, &str)] = &[
    ("balance_quick", "balance"),
    ("balance_measured_quick", "balance_measured"),
    ("balance_packed", "balance_packed"),
    ("balance_masks", "balance_masks"),
    ("published", "published"),
    ("overlap", "overlap"),
    ("knee_quick", "knee"),
    ("memory_quick", "memory"),
    ("mfu_quick", "mfu"),
    ("memory_model", "memory_model"),
    ("ablation_quick", "ablation"),
    ("precision_quick", "precision"),
    ("hybrid", "hybrid"),
    ("train_quick", "train"),
    ("decode_quick", "decode"),
    ("retrieval_quick", "retrieval"),
    ("ppl_quick", "ppl"),
    ("", "retrieval_real"),
    ("exorl_quick", "exorl"),
];

/// The spec names of the tables to run: every one of `size`, or those `only` names.
fn chosen(size: Size, only: Option<&[String]>) -> Result<Vec<&'static str>> {
    let names: Vec<&'static str> = TABLES
        .iter()
        .map(|&(quick, full)| if size == Size::Quick { quick } else { full })
        .filter(|name| !name.is_empty())
        .collect();
    let Some(only) = only else {
        return Ok(names);
    };
    only.iter()
        .map(|want| {
            names.iter().copied().find(|n| n == want).ok_or_else(|| {
                anyhow!(
                    "--tables: no table '{want}' in reproduce {}; known: {}",
                    if size == Size::Quick { "quick" } else { "full" },
                    names.join(", ")
                )
            })
        })
        .collect()
}

/// `ringbench reproduce`.
pub fn run(args: &ReproduceArgs) -> Result<()> {
    let out = match (&args.into, &args.out) {
        (Some(into), _) => into.clone(),
        (None, Some(out)) => out.clone(),
        (None, None) => crate::results::run_dir(),
    };
    let fresh = args.into.is_none();
    if fresh && finished(&out) {
        bail!(
            "{} already holds a finished run; choose another --out",
            out.display()
        );
    }
    let names = chosen(args.size, args.tables.as_deref())?;
    if !args.reference.is_dir() {
        bail!(
            "--reference {}: no such directory (the committed tables are in results/)",
            args.reference.display()
        );
    }
    // The reference is read before anything is written (with --into it may be the same directory),
    // and with --check a table it cannot hold against is refused before any table runs.
    let mut sections = Vec::new();
    let mut unreferenced = Vec::new();
    for name in names {
        let spec = PathBuf::from(format!("experiments/{name}.toml"));
        let csv = args.reference.join(name).join("results.csv");
        let reference = Table::read(&csv)?;
        if reference.rows.is_empty() {
            unreferenced.push(csv.display().to_string());
        }
        if args.check {
            let kind = kinds::by_name(&SpecText::load(&spec)?.kind).map_err(anyhow::Error::msg)?;
            let twice = duplicate_keys(&reference, |r| r.id(kind.card().key_columns));
            if let Some(key) = twice.first() {
                bail!(
                    "reproduce --check: {} has {} duplicate key(s), first {key}: rows are paired by key",
                    csv.display(),
                    twice.len()
                );
            }
        }
        sections.push((name, spec, reference));
    }
    if args.check && !unreferenced.is_empty() {
        bail!(
            "reproduce --check: no committed reference to check against: {} missing or empty (a new \
             table's reference is written first, with `ringbench run experiments/NAME.toml --results \
             {}`)",
            unreferenced.join(", "),
            args.reference.display()
        );
    }
    let start = Instant::now();
    let mut comparisons = Vec::new();
    for (i, (name, spec, reference)) in sections.iter().enumerate() {
        let table_start = Instant::now();
        let summary = runner::run_with(
            spec,
            &out,
            &RunOptions {
                force: args.force && !fresh,
                quiet: true,
                ..Default::default()
            },
        )?;
        let kind = kinds::by_name(&SpecText::load(spec)?.kind).map_err(anyhow::Error::msg)?;
        let ours = Table::read(&summary.dir.join("results.csv"))?;
        let found = compare(kind, name, reference, &ours);
        println!(
            "[{}/{}] {name}: {} points computed, {} kept from an earlier run, {:.1} s: {}",
            i + 1,
            sections.len(),
            summary.computed,
            summary.kept,
            table_start.elapsed().as_secs_f64(),
            match (found.has_reference, found.held()) {
                (false, _) => "FAILED: no committed reference",
                (true, true) => "held",
                (true, false) if found.moved.is_empty() => "FAILED",
                (true, false) => "MOVED",
            }
        );
        comparisons.push(found);
    }
    let size = if args.size == Size::Quick {
        "quick"
    } else {
        "full"
    };
    let mut md = format!(
        "# ringbench reproduce {size}: this run against {}\n\n\
         Deterministic columns (simulated, counted, errors under their bound) must hold; measured ones \
         (seconds, rates, allocator bytes) are ratios of this run to the reference, read against \
         their column's median ratio (another machine or load moves a whole column). Each kind's \
         columns and checks: `results/README.md`.\n\n",
        args.reference.display()
    );
    for c in &comparisons {
        md += &c.summary();
        md += "\n";
    }
    let details: String = comparisons.iter().map(TableComparison::details).collect();
    if !details.is_empty() {
        md += "\n## What moved, or failed\n\n";
        md += &details;
    }
    md += &format!(
        "\nTotal: {:.1} minutes.\n",
        start.elapsed().as_secs_f64() / 60.0
    );
    write_whole(&out.join("comparison.md"), md.as_bytes())?;
    println!("wrote {}", out.join("comparison.md").display());
    let failures: Vec<String> = comparisons
        .iter()
        .flat_map(TableComparison::failures)
        .collect();
    if args.check && !failures.is_empty() {
        for line in failures.iter().take(20) {
            eprintln!("{line}");
        }
        if failures.len() > 20 {
            eprintln!("... and {} more", failures.len() - 20);
        }
        bail!(
            "reproduce --check: {} check(s) failed against {}: duplicate keys, rows lost or unknown, \
             deterministic cells that differ, measured cells that are not numbers (listed above and \
             in {})",
            failures.len(),
            args.reference.display(),
            out.join("comparison.md").display()
        );
    }
    Ok(())
}

/// Whether `dir` holds a finished reproduce run.
pub fn finished(dir: &Path) -> bool {
    dir.join("comparison.md").exists()
}
