//! The `windows` sweep axis of the balance and attn kinds: no sliding window, a window of a fixed
//! number of tokens, or a fraction of the sequence (`"S/16"`), resolved against each point's length.

use crate::spec::SpecText;
use anyhow::Result;

/// A point's sliding window, as the spec names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    /// Every key of the query's document.
    None,
    /// This many tokens.
    Tokens(usize),
    /// The sequence's length over this.
    Fraction(usize),
}

impl WindowSpec {
    /// The `[sweep] windows` axis: `[None]` when the spec has none (rows then have no window
    /// column), else each name parsed.
    pub fn axis(spec: &SpecText, names: &Option<Vec<String>>) -> Result<Vec<Option<WindowSpec>>> {
        match names {
            None => Ok(vec![None]),
            Some(names) => spec
                .list("sweep", "windows", &Some(names.clone()))?
                .iter()
                .map(|n| WindowSpec::parse(spec, n).map(Some))
                .collect(),
        }
    }

    /// `"none"`, a number of tokens (at least 1) or `"S/n"` (n at least 1).
    pub fn parse(spec: &SpecText, name: &str) -> Result<WindowSpec> {
        let positive = |text: &str| text.parse::<usize>().ok().filter(|&n| n > 0);
        match name {
            "none" => Ok(WindowSpec::None),
            _ => name
                .strip_prefix("S/")
                .and_then(positive)
                .map(WindowSpec::Fraction)
                .or_else(|| positive(name).map(WindowSpec::Tokens))
                .ok_or_else(|| {
                    spec.error(
                        "sweep",
                        "windows",
                        &format!(
                            "'{name}' is not \"none\", a number of tokens (at least 1) or \"S/n\""
                        ),
                    )
                }),
        }
    }

    /// Its name in specs and tables.
    pub fn name(self) -> String {
        match self {
            WindowSpec::None => "none".into(),
            WindowSpec::Tokens(n) => n.to_string(),
            WindowSpec::Fraction(n) => format!("S/{n}"),
        }
    }

    /// The window in tokens for a sequence of `len` (at least 1); `None`: no window.
    pub fn tokens(self, len: usize) -> Option<usize> {
        match self {
            WindowSpec::None => None,
            WindowSpec::Tokens(n) => Some(n),
            WindowSpec::Fraction(n) => Some((len / n).max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn windows_parse_resolve_and_name_themselves() {
        let spec = SpecText::from_text(Path::new("w.toml"), "kind = \"attn\"\n".into()).unwrap();
        for (name, len, tokens) in [
            ("none", 64, None),
            ("48", 64, Some(48)),
            ("S/16", 4096, Some(256)),
        ] {
            let w = WindowSpec::parse(&spec, name).unwrap();
            assert_eq!((w.name().as_str(), w.tokens(len)), (name, tokens));
        }
        assert_eq!(WindowSpec::Fraction(16).tokens(8), Some(1));
        for bad in ["0", "S/0", "S/", "-3", "half"] {
            let e = WindowSpec::parse(&spec, bad).unwrap_err().to_string();
            assert!(e.contains("windows") && e.contains(bad), "{e}");
        }
    }
}
