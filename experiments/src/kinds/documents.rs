//! The `documents` sweep axis of the balance and attn kinds: one sequence, or packed documents with
//! long-tailed lengths or lengths around a mean ([`datasets::packing`], seed 0).

use crate::spec::SpecText;
use anyhow::Result;

/// How a point's sequence is packed.
#[derive(Debug, Clone, Copy)]
pub enum Documents {
    /// One sequence.
    None,
    /// Long-tailed lengths up to this many tokens.
    LongTail(usize),
    /// Lengths around this mean.
    Random(usize),
}

impl Documents {
    /// The `[sweep] documents` axis: `[None]` when the spec has none (rows then have no documents
    /// column), else each name parsed.
    pub fn axis(spec: &SpecText, names: &Option<Vec<String>>) -> Result<Vec<Option<Documents>>> {
        match names {
            None => Ok(vec![None]),
            Some(names) => spec
                .list("sweep", "documents", &Some(names.clone()))?
                .iter()
                .map(|n| Documents::parse(spec, n).map(Some))
                .collect(),
        }
    }

    /// `"none"`, `"longtail:MAX"` or `"random:MEAN"` from the spec's `[sweep] documents`.
    pub fn parse(spec: &SpecText, name: &str) -> Result<Documents> {
        if name == "none" {
            return Ok(Documents::None);
        }
        let number = |prefix: &str| {
            name.strip_prefix(prefix)
                .and_then(|n| n.parse().ok())
                .filter(|&n: &usize| n > 0)
        };
        number("longtail:")
            .map(Documents::LongTail)
            .or_else(|| number("random:").map(Documents::Random))
            .ok_or_else(|| {
                spec.error(
                    "sweep",
                    "documents",
                    &format!("'{name}' is not \"none\", \"longtail:MAX\" or \"random:MEAN\""),
                )
            })
    }

    /// Its name in specs and tables.
    pub fn name(self) -> String {
        match self {
            Documents::None => "none".into(),
            Documents::LongTail(max) => format!("longtail:{max}"),
            Documents::Random(mean) => format!("random:{mean}"),
        }
    }

    /// The document lengths of a `len`-token sequence (empty: one document).
    pub fn lengths(self, len: usize) -> Vec<usize> {
        match self {
            Documents::None => Vec::new(),
            Documents::LongTail(max) => datasets::packing::long_tailed_lengths(len, max, 0),
            Documents::Random(mean) => datasets::packing::random_lengths(len, mean, 0),
        }
    }
}
