//! `metrics.csv`: one row a training step, written as the steps come (each row flushed), kept in
//! every resumable checkpoint and restored from it when a run resumes, so that a resumed run's file
//! holds the same rows as an uninterrupted run's.

use crate::results::RowWriter;
use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The file's name inside a run's `out` (and inside each checkpoint).
pub const METRICS_FILE: &str = "metrics.csv";

/// One row of `metrics.csv`. Floats are written in their shortest form that reads back to the same
/// bits, so a restored row is written again byte for byte.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// The step, from 0.
    pub step: usize,
    /// Its global loss.
    pub loss: f64,
    /// The learning rate applied.
    pub lr: f64,
    /// Tokens a second of this step.
    pub tokens_per_second: f64,
    /// Seconds since the run started, over every sitting.
    pub elapsed_seconds: f64,
}

/// The rows of the metrics file at `path`, in order; an error names the file.
pub fn read_rows(path: &Path) -> Result<Vec<MetricsRow>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    reader
        .deserialize()
        .map(|row| row.map_err(|e| anyhow!("{}: {e}", path.display())))
        .collect()
}

/// The rows as the CSV text of a metrics file.
pub fn csv_bytes(rows: &[MetricsRow]) -> Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for row in rows {
        w.serialize(row)?;
    }
    if rows.is_empty() {
        // A header alone, as the file of a run with no step yet.
        return Ok(b"step,loss,lr,tokens_per_second,elapsed_seconds\n".to_vec());
    }
    w.into_inner().map_err(|e| anyhow!("{e}"))
}

/// A new metrics file at `path` holding `rows` (a resumed run's steps so far), to which the run
/// appends a row a step.
pub fn start_file(path: &Path, rows: &[MetricsRow]) -> Result<RowWriter> {
    let mut writer = RowWriter::create(path)?;
    for row in rows {
        writer.write(row)?;
    }
    Ok(writer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_to_the_same_bits_and_bytes() {
        let rows = vec![
            MetricsRow {
                step: 0,
                loss: std::f64::consts::LN_10 + 1e-9,
                lr: 1e-3 / 3.0,
                tokens_per_second: 1234.5,
                elapsed_seconds: 0.1 + 0.2,
            },
            MetricsRow {
                step: 1,
                loss: f64::from(1.1f32),
                lr: 5e-324,
                tokens_per_second: 0.0,
                elapsed_seconds: 1e300,
            },
        ];
        let dir = std::env::temp_dir().join(format!("ringbench-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(METRICS_FILE);
        std::fs::write(&path, csv_bytes(&rows).unwrap()).unwrap();
        let back = read_rows(&path).unwrap();
        assert_eq!(back, rows);
        for (a, b) in back.iter().zip(&rows) {
            assert_eq!(a.loss.to_bits(), b.loss.to_bits());
        }
        drop(start_file(&path, &back).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), csv_bytes(&rows).unwrap());
        std::fs::write(&path, "step,loss\n0,x\n").unwrap();
        let error = read_rows(&path).unwrap_err().to_string();
        assert!(error.contains(METRICS_FILE), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
