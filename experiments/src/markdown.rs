//! Markdown tables from CSV text (simple CSV: no quoted commas).

pub fn from_csv(csv: &str) -> String {
    let mut lines = csv.lines().filter(|l| !l.is_empty());
    let Some(header) = lines.next() else {
        return String::new();
    };
    let row = |l: &str| format!("| {} |\n", l.split(',').collect::<Vec<_>>().join(" | "));
    let columns = header.split(',').count();
    let mut md = row(header);
    md += &format!("|{}|\n", vec!["---"; columns].join("|"));
    lines.for_each(|l| md += &row(l));
    md
}
