//! Markdown tables: the one writer every results table goes through.

/// A Markdown table of `header` and `rows` (each row's cells in header order).
pub fn table<S: AsRef<str>>(header: &[S], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        format!("| {} |\n", cells.collect::<Vec<_>>().join(" | "))
    };
    let mut md = line(&mut header.iter().map(AsRef::as_ref));
    md += &format!("|{}|\n", vec!["---"; header.len()].join("|"));
    for row in rows {
        md += &line(&mut row.iter().map(String::as_str));
    }
    md
}

/// A Markdown table from CSV text (simple CSV: no quoted commas).
pub fn from_csv(csv: &str) -> String {
    let mut lines = csv.lines().filter(|l| !l.is_empty());
    let Some(header) = lines.next() else {
        return String::new();
    };
    let cells = |l: &str| l.split(',').map(String::from).collect::<Vec<_>>();
    table(&cells(header), lines.map(cells))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_table_has_a_header_a_rule_and_a_line_per_row() {
        assert_eq!(
            super::from_csv("a,b\n1,2\n3,4\n"),
            "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n"
        );
    }
}
