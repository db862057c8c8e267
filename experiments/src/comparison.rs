//! A rerun's table against its committed reference, column by column as its kind declares them:
//! deterministic columns must hold (equal, within a stated tolerance, or under their bound);
//! measurements are ratios, read against their column's median ratio, since another machine or
//! load moves every row of a column alike. A table holds only when it has exactly the reference's
//! rows and every measured cell is a number where the reference has one.

use crate::kinds::{Check, Experiment};
use crate::results::{Record, SPEC_HASH, TRANSPORT, Table, VERSION, significant};

/// A measured cell strays when its ratio to the reference is this far (either way) from its
/// column's median ratio.
pub const STRAY_FACTOR: f64 = 2.0;
/// Measured values below this fraction of their column's largest reference value are compared
/// absolutely (a ratio of two values near zero, 0.0015 / 0.000001, says nothing).
pub const NEAR_ZERO: f64 = 0.01;
/// Relative difference below which two numbers of an [`Check::Exact`] column are equal: the last
/// digit a transcendental function may round otherwise in another libm.
pub const EXACT: f64 = 1e-12;
/// Cells listed per table under "what moved".
const LISTED: usize = 8;

/// A cell as listed: as written when short, else to six significant digits (enough to show a
/// difference an exact check found, short enough to read).
fn cell(text: &str) -> String {
    match number(text) {
        Some(x) if text.len() > 10 && x.is_finite() => significant(x, 6),
        _ => text.to_owned(),
    }
}

/// One cell that moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    /// The row's key, `column=value,...`.
    pub row: String,
    /// The column.
    pub column: String,
    /// The reference's value.
    pub reference: String,
    /// This run's.
    pub run: String,
    /// How far, as the check measures it.
    pub how: String,
    /// How much: the sort key (larger is worse).
    pub severity: f64,
}

/// A measured column's median ratio to the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Median {
    /// The column.
    pub column: String,
    /// This run over the reference, the median over the rows with values away from zero.
    pub ratio: f64,
    /// Cells compared.
    pub cells: usize,
}

/// How a run's table compares with the reference.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableComparison {
    /// The table's name (its spec's file stem).
    pub name: String,
    /// Whether a reference table exists.
    pub has_reference: bool,
    /// Rows present in both.
    pub rows: usize,
    /// Rows of this run the reference lacks (their keys, as shown): a failed check.
    pub only_here: Vec<String>,
    /// Reference rows this run did not make (their keys, as shown): a failed check.
    pub only_there: Vec<String>,
    /// Deterministic cells compared.
    pub deterministic: usize,
    /// Deterministic cells that differ (or exceed their bound): a failed check.
    pub moved: Vec<Moved>,
    /// Measured cells compared.
    pub measured: usize,
    /// Each measured column's median ratio.
    pub medians: Vec<Median>,
    /// Measured cells whose ratio strays from their column's median by [`STRAY_FACTOR`].
    pub strayed: Vec<Moved>,
    /// Measured cells that are NaN, infinite or empty where the reference has a finite number: a
    /// failed check (a measurement that did not happen is not a ratio).
    pub broken: Vec<Moved>,
    /// Columns this run has that are neither keys nor declared by the kind: not compared.
    pub undeclared: Vec<String>,
    /// Keys held by more than one row, in the reference or in this run (`reference: key` or
    /// `this run: key`): a failed check, since rows are paired by key.
    pub duplicates: Vec<String>,
}

/// The keys (as `id` gives them) that more than one row of `table` has, each once, in order.
pub fn duplicate_keys(table: &Table, id: impl Fn(&Record) -> String) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut twice = Vec::new();
    for row in &table.rows {
        let key = id(row);
        if !seen.insert(key.clone()) && !twice.contains(&key) {
            twice.push(key);
        }
    }
    twice
}

fn number(cell: &str) -> Option<f64> {
    cell.trim().parse::<f64>().ok()
}

/// Whether `run` holds against `reference` under a deterministic check; `Err(how, severity)` if not.
fn holds(check: Check, reference: &str, run: &str) -> Result<(), (String, f64)> {
    match check {
        Check::Exact => agree(reference, run, EXACT, Distance::Relative),
        Check::Within(tolerance) => agree(reference, run, tolerance, Distance::Relative),
        Check::Absolute(allowance) => agree(reference, run, allowance, Distance::Absolute),
        Check::AtMost(bound) => match number(run) {
            Some(b) if b.is_finite() && b <= bound => Ok(()),
            Some(b) => Err((format!("above its bound {bound:e}"), b / bound)),
            // A row with no value (a skipped point) holds if the reference has none either.
            None if run.trim().is_empty() && reference.trim().is_empty() => Ok(()),
            None => Err(("not a number".into(), f64::INFINITY)),
        },
        Check::Measured | Check::Shown => Ok(()),
    }
}

/// How far apart two numbers are.
#[derive(Clone, Copy, PartialEq)]
enum Distance {
    /// |a − b| relative to the larger magnitude.
    Relative,
    /// |a − b|.
    Absolute,
}

impl Distance {
    fn of(self, a: f64, b: f64) -> f64 {
        let d = match self {
            Distance::Relative => (a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE),
            Distance::Absolute => (a - b).abs(),
        };
        if d.is_nan() { f64::INFINITY } else { d }
    }
}

/// The one rule of [`Check::Exact`], [`Check::Within`] and [`Check::Absolute`]: two numbers agree
/// when neither is NaN and they are equal (infinities too) or at most `tolerance` apart; two cells
/// that are not numbers (names, the empty cells of a skipped point) agree when their text is equal;
/// a number never agrees with a non-number.
fn agree(
    reference: &str,
    run: &str,
    tolerance: f64,
    distance: Distance,
) -> Result<(), (String, f64)> {
    match (number(reference), number(run)) {
        (Some(a), Some(b)) if a.is_nan() || b.is_nan() => {
            Err(("NaN is not a value".into(), f64::INFINITY))
        }
        (Some(a), Some(b)) if a == b => Ok(()),
        (Some(a), Some(b)) => {
            let d = distance.of(a, b);
            match distance {
                _ if d <= tolerance => Ok(()),
                Distance::Absolute => Err((format!("differs by {d}, over {tolerance}"), d)),
                Distance::Relative if tolerance == EXACT => {
                    Err((format!("differs by {d:.2e} relative"), d))
                }
                Distance::Relative => Err((
                    format!("differs by {d:.2e} relative, over {tolerance:e}"),
                    d,
                )),
            }
        }
        (None, None) if reference == run => Ok(()),
        _ => Err(("differs".into(), f64::INFINITY)),
    }
}

/// The median of `values` (not empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `ours` against `reference`, both tables of `kind`.
pub fn compare(
    kind: &dyn Experiment,
    name: &str,
    reference: &Table,
    ours: &Table,
) -> TableComparison {
    let card = kind.card();
    let keys = card.key_columns;
    let mut result = TableComparison {
        name: name.to_owned(),
        has_reference: !reference.rows.is_empty(),
        ..TableComparison::default()
    };
    let declared = |c: &str| card.columns.iter().any(|d| d.name == c);
    result.undeclared = ours
        .columns()
        .into_iter()
        .filter(|c| {
            !keys.contains(&c.as_str())
                && ![SPEC_HASH, VERSION, TRANSPORT].contains(&c.as_str())
                && !declared(c)
        })
        .collect();
    let id = |r: &Record| r.id(keys);
    for (table, whose) in [(reference, "reference"), (ours, "this run")] {
        result.duplicates.extend(
            duplicate_keys(table, id)
                .into_iter()
                .map(|key| format!("{whose}: {key}")),
        );
    }
    if !result.has_reference {
        return result;
    }
    // As shown: the key cells that have a value (an axis the sweep lacks is empty everywhere).
    let shown_id = |r: &Record| {
        keys.iter()
            .filter_map(|&c| {
                r.get(c)
                    .filter(|v| !v.is_empty())
                    .map(|v| format!("{c}={v}"))
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let pairs: Vec<(&Record, &Record)> = ours
        .rows
        .iter()
        .filter_map(|r| {
            reference
                .rows
                .iter()
                .find(|t| id(t) == id(r))
                .map(|t| (t, r))
        })
        .collect();
    result.rows = pairs.len();
    result.only_here = ours
        .rows
        .iter()
        .filter(|r| !reference.rows.iter().any(|t| id(t) == id(r)))
        .map(shown_id)
        .collect();
    result.only_there = reference
        .rows
        .iter()
        .filter(|t| !ours.rows.iter().any(|r| id(r) == id(t)))
        .map(shown_id)
        .collect();
    // Measured cells: (column, row, reference, run, ratio or None when near zero).
    let mut measured: Vec<(&str, &Record, &str, &str, Option<f64>)> = Vec::new();
    for column in card.columns {
        let scale = reference
            .rows
            .iter()
            .filter_map(|r| r.get(column.name).and_then(number))
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        for &(theirs, row) in &pairs {
            // A column the reference was written without is not compared.
            let Some(a) = theirs.get(column.name) else {
                continue;
            };
            let b = row.get(column.name).unwrap_or("");
            match kind.check(theirs, column) {
                Check::Shown => {}
                Check::Measured => {
                    let x = match number(a) {
                        Some(x) if x.is_finite() => x,
                        // A reference without a number here (a skipped point) compares nothing.
                        _ => continue,
                    };
                    let y = match number(b) {
                        Some(y) if y.is_finite() => y,
                        _ => {
                            result.broken.push(Moved {
                                row: shown_id(row),
                                column: column.name.into(),
                                reference: cell(a),
                                run: if b.trim().is_empty() {
                                    "(empty)".into()
                                } else {
                                    cell(b)
                                },
                                how: "not a finite number where the reference has one".into(),
                                severity: f64::INFINITY,
                            });
                            continue;
                        }
                    };
                    result.measured += 1;
                    let near = NEAR_ZERO * scale;
                    let ratio = (x.abs() > near || y.abs() > near).then_some(y / x);
                    measured.push((column.name, row, a, b, ratio));
                }
                check => {
                    result.deterministic += 1;
                    if let Err((how, severity)) = holds(check, a, b) {
                        result.moved.push(Moved {
                            row: shown_id(row),
                            column: column.name.into(),
                            reference: cell(a),
                            run: cell(b),
                            how,
                            severity,
                        });
                    }
                }
            }
        }
    }
    for column in card.columns.iter().map(|c| c.name) {
        let ratios: Vec<f64> = measured
            .iter()
            .filter(|m| m.0 == column)
            .filter_map(|m| m.4)
            .filter(|r| r.is_finite() && *r > 0.0)
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let typical = median(ratios.clone());
        result.medians.push(Median {
            column: column.into(),
            ratio: typical,
            cells: ratios.len(),
        });
        for &(_, row, a, b, ratio) in measured.iter().filter(|m| m.0 == column) {
            let Some(ratio) = ratio else { continue };
            let off = if ratio > 0.0 && ratio.is_finite() {
                (ratio / typical).max(typical / ratio)
            } else {
                f64::INFINITY
            };
            if off > STRAY_FACTOR {
                result.strayed.push(Moved {
                    row: shown_id(row),
                    column: column.into(),
                    reference: cell(a),
                    run: cell(b),
                    how: format!(
                        "ratio {} vs the column's {}",
                        significant(ratio, 3),
                        significant(typical, 3)
                    ),
                    severity: off,
                });
            }
        }
    }
    let worst_first = |a: &Moved, b: &Moved| b.severity.total_cmp(&a.severity);
    result.moved.sort_by(worst_first);
    result.strayed.sort_by(worst_first);
    result
}

impl TableComparison {
    /// Whether the table held: the reference's rows and no others, every deterministic cell equal
    /// (or under its bound), every measured cell a finite number where the reference has one.
    pub fn held(&self) -> bool {
        self.has_reference
            && self.duplicates.is_empty()
            && self.moved.is_empty()
            && self.broken.is_empty()
            && self.only_here.is_empty()
            && self.only_there.is_empty()
    }

    /// Every failed check of this table, one line each (`table: row ...: ...`), worst first: lost
    /// and unknown rows, deterministic cells that moved, measured cells that are not numbers.
    pub fn failures(&self) -> Vec<String> {
        let name = &self.name;
        let rows = |ids: &[String], what: &str| {
            ids.iter()
                .map(|id| format!("{name}: row {id}: {what}"))
                .collect::<Vec<_>>()
        };
        let cells = |cells: &[Moved]| {
            cells
                .iter()
                .map(|m| {
                    format!(
                        "{name}: row {}: column {}: reference {} -> this run {} ({})",
                        m.row, m.column, m.reference, m.run, m.how
                    )
                })
                .collect::<Vec<_>>()
        };
        let mut lines = if self.has_reference {
            Vec::new()
        } else {
            vec![format!("{name}: no committed reference")]
        };
        lines.extend(
            self.duplicates
                .iter()
                .map(|d| format!("{name}: duplicate key, more than one row has it in the {d}")),
        );
        lines.extend(rows(
            &self.only_there,
            "in the reference, missing from this run",
        ));
        lines.extend(rows(&self.only_here, "not in the reference"));
        lines.extend(cells(&self.broken));
        lines.extend(cells(&self.moved));
        lines
    }

    /// One line: held or what moved, with the worst.
    pub fn summary(&self) -> String {
        if !self.has_reference {
            return format!("- **{}**: FAILED: no committed reference", self.name);
        }
        let mut line = format!("- **{}**: ", self.name);
        if !self.duplicates.is_empty() {
            line += &format!(
                "FAILED: {} duplicate key(s) ({}); {} rows compared, {} deterministic cells, {} moved",
                self.duplicates.len(),
                self.duplicates.join("; "),
                self.rows,
                self.deterministic,
                self.moved.len()
            );
        } else if self.held() {
            line += &format!(
                "held: {} rows, {} deterministic cells equal",
                self.rows, self.deterministic
            );
        } else if self.moved.is_empty() {
            line += &format!(
                "FAILED: {} rows compared, {} deterministic cells equal",
                self.rows, self.deterministic
            );
        } else {
            let worst = &self.moved[0];
            let columns: std::collections::BTreeSet<&str> =
                self.moved.iter().map(|m| m.column.as_str()).collect();
            line += &format!(
                "MOVED: {} of {} deterministic cells in {} column(s) ({}); worst {} at {}: {} -> {}",
                self.moved.len(),
                self.deterministic,
                columns.len(),
                columns.into_iter().collect::<Vec<_>>().join(", "),
                worst.column,
                worst.row,
                worst.reference,
                worst.run
            );
        }
        if self.measured > 0 {
            let (lo, hi) = self
                .medians
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(lo, hi), m| {
                    (lo.min(m.ratio), hi.max(m.ratio))
                });
            line += &format!(
                "; {} measured cells, median ratio per column {}",
                self.measured,
                if self.medians.is_empty() {
                    "-".to_owned()
                } else if significant(lo, 2) == significant(hi, 2) {
                    significant(lo, 2)
                } else {
                    format!("{} to {}", significant(lo, 2), significant(hi, 2))
                }
            );
            if let Some(worst) = self.strayed.first() {
                line += &format!(
                    ", {} strayed over {STRAY_FACTOR}x from it (worst {} at {}: {} -> {})",
                    self.strayed.len(),
                    worst.column,
                    worst.row,
                    worst.reference,
                    worst.run
                );
            }
        }
        if !self.only_there.is_empty() {
            line += &format!(
                "; {} reference row(s) missing from this run",
                self.only_there.len()
            );
        }
        if !self.only_here.is_empty() {
            line += &format!("; {} row(s) the reference lacks", self.only_here.len());
        }
        if !self.broken.is_empty() {
            line += &format!(
                "; {} measured cell(s) not a number where the reference has one",
                self.broken.len()
            );
        }
        if !self.undeclared.is_empty() {
            line += &format!("; not compared: {}", self.undeclared.join(", "));
        }
        line
    }

    /// The cells that moved (deterministic) or strayed (measured), worst first, at most a few of
    /// each; empty when nothing did.
    pub fn details(&self) -> String {
        if self.duplicates.is_empty()
            && self.moved.is_empty()
            && self.strayed.is_empty()
            && self.broken.is_empty()
            && self.only_here.is_empty()
            && self.only_there.is_empty()
        {
            return String::new();
        }
        let mut md = format!("### {}\n\n", self.name);
        for (what, ids) in [
            ("Keys more than one row has", &self.duplicates),
            ("Reference rows missing from this run", &self.only_there),
            ("Rows of this run the reference lacks", &self.only_here),
        ] {
            if ids.is_empty() {
                continue;
            }
            md += &format!("{what} ({}):\n\n", ids.len());
            for id in ids.iter().take(LISTED) {
                md += &format!("- {id}\n");
            }
            if ids.len() > LISTED {
                md += &format!("- ... and {} more\n", ids.len() - LISTED);
            }
            md += "\n";
        }
        for (what, cells) in [
            (
                "Measured cells that are not a number where the reference has one",
                &self.broken,
            ),
            ("Deterministic cells that moved", &self.moved),
            (
                "Measured cells that strayed from their column's median ratio",
                &self.strayed,
            ),
        ] {
            if cells.is_empty() {
                continue;
            }
            md += &format!("{what} ({}):\n\n", cells.len());
            let rows = cells.iter().take(LISTED).map(|m| {
                vec![
                    m.row.clone(),
                    m.column.clone(),
                    m.reference.clone(),
                    m.run.clone(),
                    m.how.clone(),
                ]
            });
            md += &crate::markdown::table(&["row", "column", "reference", "this run", "how"], rows);
            if cells.len() > LISTED {
                md += &format!("\n... and {} more.\n", cells.len() - LISTED);
            }
            md += "\n";
        }
        if !self.medians.is_empty() && !self.strayed.is_empty() {
            let rows = self.medians.iter().map(|m| {
                vec![
                    m.column.clone(),
                    significant(m.ratio, 3),
                    m.cells.to_string(),
                ]
            });
            md += &crate::markdown::table(&["measured column", "median ratio", "cells"], rows);
            md += "\n";
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_checks_hold_or_say_how_far() {
        assert!(holds(Check::Exact, "1.5", "1.5").is_ok());
        assert!(holds(Check::Exact, "ok", "ok").is_ok());
        assert!(holds(Check::Exact, "1.0000000000001", "1").is_ok());
        assert!(holds(Check::Exact, "1", "2.641").is_err());
        assert!(holds(Check::Exact, "ok", "skipped: x").is_err());
        assert!(holds(Check::Within(1e-4), "1.6386", "1.63861").is_ok());
        assert!(holds(Check::Within(1e-4), "1.6386", "1.64").is_err());
        assert!(holds(Check::AtMost(1e-5), "2e-7", "9e-6").is_ok());
        assert!(holds(Check::AtMost(1e-5), "2e-7", "2e-5").is_err());
        assert!(holds(Check::AtMost(1e-5), "2e-7", "NaN").is_err());
        assert!(holds(Check::AtMost(1e-5), "2e-7", "inf").is_err());
        assert!(holds(Check::AtMost(1e-5), "", "").is_ok());
        assert!(holds(Check::Exact, "1", "NaN").is_err());
    }

    /// Exact and Within follow one rule: NaN never agrees (not even with NaN), equal numbers and
    /// equal infinities do, a number never agrees with text, equal text does.
    #[test]
    fn exact_and_within_hold_or_fail_alike() {
        for check in [Check::Exact, Check::Within(1e-4), Check::Absolute(2.0)] {
            assert!(holds(check, "NaN", "NaN").is_err(), "{check:?}");
            assert!(holds(check, "NaN", "1").is_err(), "{check:?}");
            assert!(holds(check, "inf", "inf").is_ok(), "{check:?}");
            assert!(holds(check, "inf", "-inf").is_err(), "{check:?}");
            assert!(holds(check, "ok", "ok").is_ok(), "{check:?}");
            assert!(holds(check, "", "").is_ok(), "{check:?}");
            assert!(holds(check, "1", "").is_err(), "{check:?}");
            assert!(holds(check, "zigzag", "striped").is_err(), "{check:?}");
        }
        // An absolute allowance is a count, not a share.
        assert!(holds(Check::Absolute(2.0), "40", "42").is_ok());
        assert!(holds(Check::Absolute(2.0), "40", "43").is_err());
        assert!(holds(Check::Absolute(0.02), "0.4", "0.42").is_ok());
        assert!(holds(Check::Absolute(0.02), "0.4", "0.43").is_err());
    }

    /// A key that two rows share, in the reference or in the run, fails the comparison by name.
    #[test]
    fn a_duplicate_key_on_either_side_fails() {
        let kind = crate::kinds::by_name("retrieval").unwrap();
        let row = |model: &str, correct: &str| {
            Record::new([
                ("model", model),
                ("num_lines", "6"),
                ("correct", correct),
                ("near_ties", "0"),
            ])
        };
        let once = Table::of(vec![row("a", "9"), row("b", "9")]);
        let twice = Table::of(vec![row("a", "9"), row("b", "9"), row("a", "1")]);
        assert!(compare(kind, "t", &once, &once).held());
        for (reference, run, whose) in [(&twice, &once, "reference"), (&once, &twice, "this run")] {
            let found = compare(kind, "t", reference, run);
            assert!(!found.held());
            assert_eq!(found.duplicates, [format!("{whose}: model=a,num_lines=6")]);
            let failures = found.failures().join("\n");
            assert!(failures.contains("duplicate key"), "{failures}");
            assert!(found.summary().contains("FAILED"), "{}", found.summary());
        }
    }

    /// A table without a reference compares nothing and so does not hold.
    #[test]
    fn no_reference_does_not_hold() {
        let kind = crate::kinds::by_name("retrieval").unwrap();
        let run = Table::of(vec![Record::new([("model", "a"), ("num_lines", "6")])]);
        let found = compare(kind, "t", &Table::default(), &run);
        assert!(!found.held());
        assert_eq!(found.failures(), ["t: no committed reference"]);
    }

    #[test]
    fn medians_ignore_order() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
