//! The `models` sweep axis of the balance kind: which of a model's layers attend through the sliding
//! window and which attend fully, as the model families mix them (gpt-oss and Gemma 2 alternate 1:1,
//! Gemma 3 runs 5 local layers to 1 global one, Mistral windows every layer).

use crate::spec::SpecText;
use anyhow::Result;
use strategies::{Mask, MaskedLayers};

/// A model's mix of windowed and full causal layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerMix {
    /// Every layer attends its whole document (the point's window is unused).
    Full,
    /// Every layer attends through the window (Mistral).
    Window,
    /// This many windowed layers to one full one (`"1:1"`: gpt-oss, Gemma 2; `"5:1"`: Gemma 3).
    PerFull(usize),
}

impl LayerMix {
    /// The `[sweep] models` axis: `[None]` when the spec has none (rows then have no model column),
    /// else each name parsed.
    pub fn axis(spec: &SpecText, names: &Option<Vec<String>>) -> Result<Vec<Option<LayerMix>>> {
        match names {
            None => Ok(vec![None]),
            Some(names) => spec
                .list("sweep", "models", &Some(names.clone()))?
                .iter()
                .map(|n| LayerMix::parse(spec, n).map(Some))
                .collect(),
        }
    }

    /// `"full"`, `"window"` or `"K:1"` (K at least 1).
    pub fn parse(spec: &SpecText, name: &str) -> Result<LayerMix> {
        let per_full = name
            .strip_suffix(":1")
            .and_then(|k| k.parse::<usize>().ok())
            .filter(|&k| k > 0);
        match (name, per_full) {
            ("full", _) => Ok(LayerMix::Full),
            ("window", _) => Ok(LayerMix::Window),
            (_, Some(k)) => Ok(LayerMix::PerFull(k)),
            _ => Err(spec.error(
                "sweep",
                "models",
                &format!(
                    "'{name}' is not \"full\", \"window\" or \"K:1\" (K windowed layers to one full \
                     one, K at least 1)"
                ),
            )),
        }
    }

    /// Its name in specs and tables.
    pub fn name(self) -> String {
        match self {
            LayerMix::Full => "full".into(),
            LayerMix::Window => "window".into(),
            LayerMix::PerFull(k) => format!("{k}:1"),
        }
    }

    /// The masks of one period of the model's layers: `windowed` on its windowed layers, causal
    /// without a window on the full ones.
    pub fn masks(self, windowed: Mask) -> Vec<MaskedLayers> {
        let full = Mask {
            window: None,
            ..windowed
        };
        let layers = match self {
            LayerMix::Full => vec![full],
            LayerMix::Window => vec![windowed],
            LayerMix::PerFull(k) => {
                let mut layers = vec![windowed; k];
                layers.push(full);
                layers
            }
        };
        MaskedLayers::group(layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn mixes_parse_name_themselves_and_count_their_layers() {
        let spec = SpecText::from_text(Path::new("m.toml"), "kind = \"balance\"\n".into()).unwrap();
        let windowed = Mask {
            causal: true,
            window: Some(128),
        };
        for (name, layers) in [
            ("full", vec![(None, 1)]),
            ("window", vec![(Some(128), 1)]),
            ("5:1", vec![(Some(128), 5), (None, 1)]),
        ] {
            let mix = LayerMix::parse(&spec, name).unwrap();
            assert_eq!(mix.name(), name);
            let got: Vec<_> = mix
                .masks(windowed)
                .iter()
                .map(|m| (m.mask.window, m.layers))
                .collect();
            assert_eq!(got, layers);
        }
        for bad in ["0:1", "1:2", ":1", "gemma"] {
            let e = LayerMix::parse(&spec, bad).unwrap_err().to_string();
            assert!(e.contains("models") && e.contains(bad), "{e}");
        }
    }
}
