//! What an experiment kind is to the runner: a spec parsed into sweep points, rows for one point, a
//! figure of the table.

use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::Result;
use indicatif::ProgressBar;
use std::path::Path;

/// The facts about a kind that are plain data.
#[derive(Debug)]
pub struct Card {
    /// The spec's `kind = "..."`.
    pub name: &'static str,
    /// One line: what a table of this kind shows.
    pub about: &'static str,
    /// The `[sweep]` keys it reads (for `ringbench run --kinds` and error messages).
    pub sweep_keys: &'static [&'static str],
    /// The columns that identify a row: every sweep axis of the kind. A row with the same values is
    /// the same measurement; resume, baselines and `reproduce`'s comparison all match rows by them.
    pub key_columns: &'static [&'static str],
    /// Every other column and how `ringbench reproduce` compares it with the committed reference.
    pub columns: &'static [Column],
}

/// A column of a kind's rows and how it is compared with a reference.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// Its name.
    pub name: &'static str,
    /// How it compares.
    pub check: Check,
}

impl Column {
    /// A column computed the same on every machine.
    pub const fn exact(name: &'static str) -> Column {
        Column {
            name,
            check: Check::Exact,
        }
    }

    /// A column shown for reading, not compared.
    pub const fn shown(name: &'static str) -> Column {
        Column {
            name,
            check: Check::Shown,
        }
    }

    /// A column measured on this machine.
    pub const fn measured(name: &'static str) -> Column {
        Column {
            name,
            check: Check::Measured,
        }
    }
}

/// How a column of a rerun compares with the committed reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// The same on every machine: simulated from FLOP counts, counted bytes, shapes, settings. Equal
    /// text, or numbers within 1e-12 relative (the last digit of a transcendental function that another
    /// libm rounds the other way).
    Exact,
    /// Deterministic up to float32 rounding whose order differs between CPUs' kernels (losses):
    /// within this relative tolerance.
    Within(f64),
    /// A count that may move by at most this much (absolutely): a tally of picks some of which the
    /// reference row records as near ties, each free to go the other way on another CPU.
    Absolute(f64),
    /// An error with a bound: this run's value must be finite and at most it.
    AtMost(f64),
    /// A measurement on this machine (seconds, rates, allocator bytes): compared as a ratio to the
    /// reference, against the table's median ratio (a slower machine moves every row alike).
    Measured,
    /// Shown for reading, not compared (a label, or what the row's settings were).
    Shown,
}

/// One experiment kind. It is registered once, in [`super::KINDS`]; the runner knows nothing else
/// about it.
pub trait Experiment: Sync {
    /// What the kind is: its name, sweep keys and columns.
    fn card(&self) -> &'static Card;

    /// The spec parsed and checked (every error names its key and line) into a plan of points.
    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>>;

    /// Files it writes beside results.csv that hold per-row data (removed by `--force`).
    fn side_files(&self) -> &'static [&'static str] {
        &[]
    }

    /// Draws the table into `dir` (one or more SVG files).
    fn figure(&self, table: &Table, dir: &Path) -> Result<()>;

    /// How `column` compares with a reference, decided by the reference's row (`reference`): its
    /// card's check, unless that row says otherwise (a simulation fed with measured tile costs is a
    /// measurement; an allowance the reference recorded). Never by the run's own row, which could
    /// grant itself any allowance.
    fn check(&self, _reference: &Record, column: &Column) -> Check {
        column.check
    }
}

/// One unit of computation of a sweep.
#[derive(Debug, Clone)]
pub struct Point {
    /// Its identity: rows matching it belong to it (and are replaced when it is recomputed).
    pub key: Record,
    /// The keys of the rows it produces: the point is done when all of them are in the table.
    pub rows: Vec<Record>,
    /// What the progress bar shows while it runs.
    pub label: String,
}

impl Point {
    /// A point that produces exactly one row, identified by `key`.
    pub fn single(key: Record) -> Point {
        let label = key
            .0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        Point {
            rows: vec![key.clone()],
            key,
            label,
        }
    }
}

/// What a point may look at while it computes.
pub struct PointContext<'a> {
    /// The table so far (rows kept from an earlier run and rows computed in this one): baselines
    /// such as the one-rank or contiguous row are read from here.
    pub table: &'a Table,
    /// The results directory (for a kind's side files, e.g. training curves).
    pub dir: &'a Path,
    /// The runner's progress bar (for messages inside long points).
    pub bar: &'a ProgressBar,
}

/// A parsed spec: its points, in the order they must run (baselines first).
pub trait Plan {
    /// Every point of the sweep.
    fn points(&self) -> Vec<Point>;

    /// The rows of `points()[index]`.
    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>>;

    /// The processes `points()[index]` runs as when a launcher starts it (its ranks), or `None`
    /// when the kind computes in one process only (simulations; kinds not yet ported). A kind that
    /// says `Some` runs its ring through [`crate::backend`], which takes this process's rank when
    /// launched.
    fn processes(&self, _index: usize) -> Option<usize> {
        None
    }

    /// What keeps points together when a sweep is split into shards: points of one group run in
    /// the same shard, in plan order. A point that reads another's row as its baseline (the
    /// one-rank row of `ring_over_single`) groups with it. Default: every point alone.
    fn shard_group(&self, point: &Point) -> Record {
        point.key.clone()
    }
}
