//! Results tables: typed rows become ordered (column, value) records; a table is resumed from its
//! results.csv and written as CSV and Markdown by the one writer every command uses, each file
//! whole or not at all (written beside its place, then renamed over it).

use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The column naming the hash of the spec's settings a row was computed under
/// ([`crate::spec::SpecText::settings_hash`]); the runner stamps every row with it.
pub const SPEC_HASH: &str = "spec_hash";
/// The column naming the ringbench version that computed a row.
pub const VERSION: &str = "ringbench_version";
/// The column naming what carried a row's ring between its ranks: `threads` (one process) or `mpi`
/// (a job of processes); the runner stamps it on the rows of kinds whose points run a ring.
pub const TRANSPORT: &str = "transport";

/// One row: cells in column order. Values are kept as written, so a table read back and written
/// again is byte-identical.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record(pub Vec<(String, String)>);

impl Record {
    /// A typed row (a serde struct of plain fields) as a record; `None` becomes an empty cell.
    pub fn of<T: Serialize>(row: &T) -> Result<Record> {
        let mut w = csv::WriterBuilder::new()
            .has_headers(true)
            .from_writer(Vec::new());
        w.serialize(row)?;
        let bytes = w.into_inner().map_err(|e| anyhow!("{e}"))?;
        let mut r = csv::Reader::from_reader(bytes.as_slice());
        let header = r.headers()?.clone();
        let values = r
            .records()
            .next()
            .ok_or_else(|| anyhow!("a row serialized to nothing"))??;
        Ok(Record(
            header
                .iter()
                .zip(values.iter())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ))
    }

    /// A record of the given cells (a sweep point's key).
    pub fn new<K: ToString, V: ToString>(cells: impl IntoIterator<Item = (K, V)>) -> Record {
        Record(
            cells
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The value of `column`, if the row has it.
    pub fn get(&self, column: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `column` as a number (NaN if absent or not a number).
    pub fn num(&self, column: &str) -> f64 {
        self.get(column)
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Whether every cell of `key` has the same value in this row, a column the row lacks reading
    /// as empty (as a sweep axis that was absent: a table written before a column was added).
    pub fn matches(&self, key: &Record) -> bool {
        key.0.iter().all(|(c, v)| self.get(c).unwrap_or("") == v)
    }

    /// The cells of `columns`, in that order, as `c=v,c=v` (a row's identity).
    pub fn id(&self, columns: &[&str]) -> String {
        columns
            .iter()
            .map(|c| format!("{c}={}", self.get(c).unwrap_or("")))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The rows of one results table, in the order they were computed.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Every row.
    pub rows: Vec<Record>,
}

impl Table {
    /// A table of `rows`.
    pub fn of(rows: Vec<Record>) -> Table {
        Table { rows }
    }

    /// The table in `csv_path`; empty if there is no such file, an error naming the file if it is
    /// not a CSV table.
    pub fn read(csv_path: &Path) -> Result<Table> {
        if !csv_path.exists() {
            return Ok(Table::default());
        }
        let mut reader = csv::Reader::from_path(csv_path)
            .with_context(|| format!("reading {}", csv_path.display()))?;
        let header = reader
            .headers()
            .with_context(|| format!("{}: no header line", csv_path.display()))?
            .clone();
        let rows = reader
            .records()
            .map(|r| {
                let r = r.with_context(|| format!("{}: not a CSV table", csv_path.display()))?;
                Ok(Record(
                    header
                        .iter()
                        .zip(r.iter())
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Table { rows })
    }

    /// Whether a row with each of these keys is present.
    pub fn has_all(&self, keys: &[Record]) -> bool {
        keys.iter().all(|k| self.rows.iter().any(|r| r.matches(k)))
    }

    /// The first row matching `key`.
    pub fn find(&self, key: &Record) -> Option<&Record> {
        self.rows.iter().find(|r| r.matches(key))
    }

    /// Drops the rows matching `key` and appends `rows` (a recomputed sweep point).
    pub fn replace(&mut self, key: &Record, rows: Vec<Record>) {
        self.rows.retain(|r| !r.matches(key));
        self.rows.extend(rows);
    }

    /// Every column, in the order of first appearance.
    pub fn columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = Vec::new();
        for row in &self.rows {
            for (c, _) in &row.0 {
                if !columns.contains(c) {
                    columns.push(c.clone());
                }
            }
        }
        columns
    }

    fn cells(&self, columns: &[String]) -> impl Iterator<Item = Vec<String>> {
        self.rows.iter().map(move |row| {
            columns
                .iter()
                .map(|c| row.get(c).unwrap_or("").to_owned())
                .collect()
        })
    }

    /// Writes the table as CSV (a row lacking a column has an empty cell there), whole or not at
    /// all: a run killed while it writes leaves the previous file.
    pub fn write_csv(&self, path: &Path) -> Result<()> {
        let columns = self.columns();
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(&columns)?;
        for row in self.cells(&columns) {
            w.write_record(row)?;
        }
        let bytes = w.into_inner().map_err(|e| anyhow!("{e}"))?;
        write_whole(path, &bytes)
    }

    /// The table in Markdown, numbers shown to four significant digits.
    pub fn markdown(&self) -> String {
        let columns = self.columns();
        let rows = self
            .cells(&columns)
            .map(|r| r.iter().map(|c| shown(c)).collect());
        crate::markdown::table(&columns, rows)
    }

    /// Writes `NAME.csv` and `NAME.md` (a title line, `about`, the table) under `dir`; returns the
    /// Markdown.
    pub fn write(&self, dir: &Path, name: &str, title: &str, about: &str) -> Result<String> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        self.write_csv(&dir.join(format!("{name}.csv")))?;
        let md = format!("# {title}\n\n{about}\n\n{}", self.markdown());
        write_whole(&dir.join(format!("{name}.md")), md.as_bytes())?;
        Ok(md)
    }
}

/// A CSV file written row by row as rows come (a training run's metrics), each row flushed: what a
/// run that stops leaves is every row written so far. The header is the first row's columns.
pub struct RowWriter {
    writer: csv::Writer<std::fs::File>,
    path: std::path::PathBuf,
}

impl RowWriter {
    /// A new file at `path` (replacing one there).
    pub fn create(path: &Path) -> Result<RowWriter> {
        Ok(RowWriter {
            writer: csv::Writer::from_path(path)
                .with_context(|| format!("writing {}", path.display()))?,
            path: path.to_path_buf(),
        })
    }

    /// Appends a typed row (a serde struct of plain fields) and flushes it.
    pub fn write<T: Serialize>(&mut self, row: &T) -> Result<()> {
        self.writer
            .serialize(row)
            .and_then(|()| self.writer.flush().map_err(csv::Error::from))
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Writes `bytes` to `path` whole or not at all: into a temporary file beside it, flushed to disk,
/// then renamed over it (a rename within a directory replaces the file in one step).
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file path", path.display()))?;
    let temporary = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// A cell as shown in Markdown: empty is `-`; a fractional number has four significant digits.
pub fn shown(cell: &str) -> String {
    if cell.is_empty() {
        return "-".into();
    }
    let fractional = cell.contains('.') || cell.contains('e') || cell.contains('E');
    match cell.parse::<f64>() {
        // A whole number written as a float (a mean of equal counts) is shown whole.
        Ok(x) if fractional && x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Ok(x) if fractional && x.is_finite() => significant(x, 4),
        _ => cell.to_owned(),
    }
}

/// `x` to `digits` significant digits (no exponent below 1e9).
pub fn significant(x: f64, digits: usize) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let magnitude = x.abs().log10().floor() as i64;
    if !(-5..9).contains(&magnitude) {
        return format!("{x:.prec$e}", prec = digits.saturating_sub(1));
    }
    let decimals = (digits as i64 - 1 - magnitude).max(0) as usize;
    format!("{x:.decimals$}")
}

/// `runs/YYYY-MM-DDTHH-MM-SSZ` for the present moment: where `run` and `reproduce` write unless told
/// otherwise, so that the committed `results/` is touched only when asked.
pub fn run_dir() -> PathBuf {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Row {
        strategy: &'static str,
        ranks: usize,
        speedup: f64,
        ratio: Option<f64>,
    }

    #[test]
    fn a_typed_row_becomes_cells_in_field_order() {
        let r = Record::of(&Row {
            strategy: "zigzag",
            ranks: 8,
            speedup: 1.875,
            ratio: None,
        })
        .unwrap();
        assert_eq!(r.id(&["strategy", "ranks"]), "strategy=zigzag,ranks=8");
        assert_eq!((r.num("speedup"), r.get("ratio")), (1.875, Some("")));
        assert!(r.matches(&Record::new([("ranks", 8)])));
    }

    #[test]
    fn a_table_written_and_read_back_is_byte_identical() {
        let dir = std::env::temp_dir().join(format!("ringbench-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        let mut t = Table::of(vec![
            Record::new([("a", "1"), ("b", "0.1234567")]),
            Record::new([("a", "2"), ("c", "x, y")]),
        ]);
        t.write_csv(&path).unwrap();
        let first = std::fs::read(&path).unwrap();
        Table::read(&path).unwrap().write_csv(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), first);
        t.replace(
            &Record::new([("a", "1")]),
            vec![Record::new([("a", "1"), ("b", "2")])],
        );
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[1].get("b"), Some("2"));
        assert!(t.markdown().contains("| 2 | x, y | - |\n| 1 | - | 2 |"));
        std::fs::write(&path, "a,b\n1,2,3\n").unwrap();
        assert!(
            Table::read(&path)
                .unwrap_err()
                .to_string()
                .contains("t.csv")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn numbers_are_shown_to_four_significant_digits() {
        assert_eq!(shown("0.123456"), "0.1235");
        assert_eq!(shown("1234.5678"), "1235");
        assert_eq!(shown("12"), "12");
        assert_eq!(shown("44.0"), "44");
        assert_eq!(shown("0.0000012345"), "1.234e-6");
        assert_eq!(shown("true"), "true");
        assert_eq!(shown(""), "-");
    }
}
