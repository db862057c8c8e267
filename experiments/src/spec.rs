//! An experiment spec (TOML) as read from disk: its kind, and errors that name the key and its line.
//!
//! Every kind parses the same text into its own typed spec (unknown keys and wrong types are TOML
//! errors, which carry their line); the checks TOML cannot make (an empty sweep list, an unknown
//! strategy name, ranks = 0) go through [`SpecText::error`] so that they name the key and line too.

use anyhow::{Context, Result, anyhow};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The table that says where a spec's points run (`runner::launch`), beside every kind's own.
const LAUNCHER: &str = "launcher";

/// The text of a spec file, its `kind` and `description`.
#[derive(Debug, Clone)]
pub struct SpecText {
    /// Where it was read from.
    pub path: PathBuf,
    /// The whole file.
    pub text: String,
    /// `kind = "..."`.
    pub kind: String,
    /// `description = "..."` (empty if absent).
    pub description: String,
}

impl SpecText {
    /// Reads `path` and its top-level `kind` and `description`.
    pub fn load(path: &Path) -> Result<SpecText> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_text(path, text)
    }

    /// A spec from its text (`path` names it in errors).
    pub fn from_text(path: &Path, text: String) -> Result<SpecText> {
        let mut spec = SpecText {
            path: path.to_path_buf(),
            text,
            kind: String::new(),
            description: String::new(),
        };
        let table: toml::Table = spec.parse_text(&spec.text)?;
        spec.kind = match table.get("kind") {
            Some(toml::Value::String(kind)) => kind.clone(),
            Some(other) => {
                return Err(spec.error("", "kind", &format!("must be a string, got {other}")));
            }
            None => return Err(anyhow!("{}: no `kind = \"...\"` line", path.display())),
        };
        spec.description = match table.get("description") {
            Some(toml::Value::String(d)) => d.trim().to_owned(),
            Some(other) => {
                return Err(spec.error(
                    "",
                    "description",
                    &format!("must be a string, got {other}"),
                ));
            }
            None => String::new(),
        };
        Ok(spec)
    }

    /// A hash of what the spec sets besides its sweep lists (its kind and every other section:
    /// shapes, measurement settings, model), 16 hex digits. Rows computed under another hash were
    /// computed by another spec: a grown sweep keeps its rows, a changed setting recomputes them.
    /// Comments, the description and the order of keys do not count.
    pub fn settings_hash(&self) -> String {
        let mut table: toml::Table = toml::from_str(&self.text).unwrap_or_default();
        table.remove("sweep");
        table.remove("description");
        // Where points run does not change what they compute, nor whether they are traced.
        table.remove(LAUNCHER);
        if let Some(toml::Value::Table(measure)) = table.get_mut(MEASURE) {
            measure.remove(TRACE);
            if measure.is_empty() {
                table.remove(MEASURE);
            }
        }
        let mut canonical = String::new();
        canonical_toml(&toml::Value::Table(table), &mut canonical);
        // FNV-1a (64 bits): stable across Rust versions and machines, unlike `DefaultHasher`.
        let hash = canonical.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{hash:016x}")
    }

    /// The spec as `T`, read without its top-level `kind` and `description` and its `[launcher]`
    /// table (every kind's spec may have them; `T` declares only its own sections). A TOML error
    /// becomes one line: `path:line: section.key: message`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        let text = blank_table(&self.without_header(), LAUNCHER);
        self.parse_text(&blank_trace(&text))
    }

    /// `[measure] trace = true`: the runner records each point's timeline (`traces/point-I.json`
    /// beside the table). The runner's, not the kind's: it is taken out before the kind reads its
    /// `[measure]`, and it changes no setting (not in [`SpecText::settings_hash`]).
    pub fn traced(&self) -> Result<bool> {
        let table: toml::Table = self.parse_text(&self.text)?;
        match table.get(MEASURE).and_then(|m| m.get(TRACE)) {
            None => Ok(false),
            Some(toml::Value::Boolean(on)) => Ok(*on),
            Some(other) => {
                Err(self.error(MEASURE, TRACE, &format!("{other} is not true or false")))
            }
        }
    }

    /// The `[launcher]` table as `T` (the runner's: where points run), if the spec has one.
    pub fn launcher_section<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        #[derive(serde::Deserialize)]
        struct Only<T> {
            launcher: Option<T>,
            #[serde(flatten)]
            _rest: toml::Table,
        }
        Ok(self.parse_text::<Only<T>>(&self.text)?.launcher)
    }

    /// `text` (this spec's, lines in place) as `T`, errors as one line naming line and key.
    fn parse_text<T: DeserializeOwned>(&self, text: &str) -> Result<T> {
        toml::from_str(text).map_err(|e| {
            let message = e.message().trim().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let line = self.text[..span.start].matches('\n').count() + 1;
                    let key = self.key_at(line);
                    let key = if key.is_empty() {
                        key
                    } else {
                        format!(" {key}:")
                    };
                    anyhow!("{}:{line}:{key} {message}", self.path.display())
                }
                None => anyhow!("{}: {message}", self.path.display()),
            }
        })
    }

    /// The text with the `kind` and `description` entries blanked out, lines kept where they are.
    fn without_header(&self) -> String {
        #[derive(serde::Deserialize)]
        struct Header {
            kind: Option<toml::Spanned<toml::Value>>,
            description: Option<toml::Spanned<toml::Value>>,
        }
        let Ok(header) = toml::from_str::<Header>(&self.text) else {
            return self.text.clone(); // the full parse reports the error
        };
        let mut bytes = self.text.clone().into_bytes();
        for value in [header.kind, header.description].into_iter().flatten() {
            let span = value.span();
            let start = self.text[..span.start].rfind('\n').map_or(0, |i| i + 1);
            for b in &mut bytes[start..span.end] {
                if *b != b'\n' {
                    *b = b' ';
                }
            }
        }
        String::from_utf8(bytes).unwrap_or_else(|_| self.text.clone())
    }

    /// The dotted key defined on `line` (1-based), or the table a header line opens.
    fn key_at(&self, line: usize) -> String {
        let mut section = String::new();
        for (i, text) in self.text.lines().enumerate() {
            let text = text.trim();
            if let Some(header) = text.strip_prefix('[') {
                section = header
                    .trim_matches(|c| c == '[' || c == ']')
                    .trim()
                    .to_owned();
                if i + 1 == line {
                    return format!("[{section}]");
                }
            } else if i + 1 == line {
                let key = text
                    .split('=')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches('"');
                return match (section.is_empty(), key.is_empty() || !text.contains('=')) {
                    (_, true) => String::new(),
                    (true, false) => key.to_owned(),
                    (false, false) => format!("{section}.{key}"),
                };
            }
        }
        String::new()
    }

    /// The line of `key = ...` inside `[section]` (`""`: the top level), or 0 if it is not there.
    pub fn line(&self, section: &str, key: &str) -> usize {
        let mut current = String::new();
        for (i, line) in self.text.lines().enumerate() {
            let line = line.trim();
            if let Some(header) = line.strip_prefix('[') {
                current = header
                    .trim_matches(|c| c == '[' || c == ']')
                    .trim()
                    .to_owned();
                continue;
            }
            let is_key = line
                .split('=')
                .next()
                .is_some_and(|k| k.trim().trim_matches('"') == key);
            if current == section && is_key && line.contains('=') {
                return i + 1;
            }
        }
        0
    }

    /// `path:line: section.key: message`.
    pub fn error(&self, section: &str, key: &str, message: &str) -> anyhow::Error {
        let dotted = if section.is_empty() {
            key.to_owned()
        } else {
            format!("{section}.{key}")
        };
        anyhow!(
            "{}:{}: {dotted}: {message}",
            self.path.display(),
            self.line(section, key)
        )
    }

    /// A sweep list that must be present and not empty.
    pub fn list<'a, T>(
        &self,
        section: &str,
        key: &str,
        value: &'a Option<Vec<T>>,
    ) -> Result<&'a [T]> {
        match value {
            None => Err(anyhow!(
                "{}: kind {} needs {section}.{key}",
                self.path.display(),
                self.kind
            )),
            Some(v) if v.is_empty() => Err(self.error(section, key, "is empty")),
            Some(v) => Ok(v),
        }
    }

    /// A sweep list with a default: `default` if absent, an error if present but empty.
    pub fn list_or<T: Clone>(
        &self,
        section: &str,
        key: &str,
        value: &Option<Vec<T>>,
        default: Vec<T>,
    ) -> Result<Vec<T>> {
        match value {
            None => Ok(default),
            Some(v) => self.list(section, key, &Some(v.clone())).map(<[T]>::to_vec),
        }
    }

    /// Each name of a list parsed as `T` (a direction, a scheme, a kernel ...); the first that does
    /// not parse is an error naming the key and line.
    pub fn parsed<T>(&self, section: &str, key: &str, names: &[String]) -> Result<Vec<T>>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        names
            .iter()
            .map(|n| {
                n.parse::<T>()
                    .map_err(|e| self.error(section, key, &e.to_string()))
            })
            .collect()
    }

    /// Strategies by name ([`strategies::by_name`]: built-in and registered ones).
    pub fn strategies(
        &self,
        section: &str,
        key: &str,
        names: &[String],
    ) -> Result<Vec<&'static dyn strategies::Partition>> {
        names
            .iter()
            .map(|n| strategies::by_name(n).map_err(|e| self.error(section, key, &e.to_string())))
            .collect()
    }

    /// Rank counts, each checked by the one rank-count rule ([`strategies::check_ranks`]).
    pub fn ranks<'a>(&self, section: &str, value: &'a Option<Vec<usize>>) -> Result<&'a [usize]> {
        let ranks = self.list(section, "ranks", value)?;
        for &n in ranks {
            strategies::check_ranks(n).map_err(|e| self.error(section, "ranks", &e.to_string()))?;
        }
        Ok(ranks)
    }
}

/// `value` written with every table's keys sorted, whatever order the parser kept.
fn canonical_toml(value: &toml::Value, out: &mut String) {
    match value {
        toml::Value::Table(table) => {
            let mut keys: Vec<&String> = table.keys().collect();
            keys.sort();
            out.push('{');
            for key in keys {
                out.push_str(&format!("{key:?}="));
                canonical_toml(&table[key], out);
                out.push(',');
            }
            out.push('}');
        }
        toml::Value::Array(items) => {
            out.push('[');
            for item in items {
                canonical_toml(item, out);
                out.push(',');
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `text` with the `[name]` table's lines blanked (kept as empty lines, so that line numbers hold):
/// from its header to the next header.
/// The runner's trace switch: `[measure] trace`.
const MEASURE: &str = "measure";
const TRACE: &str = "trace";

/// `text` without the `trace` key of its `[measure]` table, lines in place, and without the table's
/// header too when nothing else is in it (a kind without a `[measure]` of its own refuses one).
fn blank_trace(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<&str> = lines.clone();
    let mut header: Option<usize> = None;
    let mut others = false;
    let close = |header: Option<usize>, others: bool, out: &mut Vec<&str>| {
        if let (Some(h), false) = (header, others) {
            out[h] = "";
        }
    };
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            close(header, others, &mut out);
            let name = trimmed
                .trim_start_matches('[')
                .split(']')
                .next()
                .map(str::trim);
            header = (name == Some(MEASURE)).then_some(i);
            others = false;
            continue;
        }
        if header.is_none() || trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let key = trimmed.split('=').next().map(str::trim);
        if key == Some(TRACE) {
            out[i] = "";
        } else {
            others = true;
        }
    }
    close(header, others, &mut out);
    out.join("\n")
}

fn blank_table(text: &str, name: &str) -> String {
    let mut inside = false;
    text.lines()
        .map(|line| {
            let trimmed = line.trim();
            if trimmed.starts_with('[') {
                inside = trimmed
                    .trim_start_matches('[')
                    .split(']')
                    .next()
                    .is_some_and(|h| h.trim() == name);
            }
            if inside { "" } else { line }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_hash_ignores_the_sweep_comments_and_key_order() {
        let base = spec("kind = \"x\"\n[sweep]\nranks = [1]\n[a]\nn = 1\nm = 2\n").settings_hash();
        let same = spec(
            "# a comment\nkind = \"x\"\ndescription = \"d\"\n[a]\nm = 2\nn = 1\n[sweep]\nranks = [1, 2]\n",
        );
        assert_eq!(same.settings_hash(), base);
        assert_eq!(base.len(), 16);
        for other in [
            "kind = \"x\"\n[sweep]\nranks = [1]\n[a]\nn = 1\nm = 3\n",
            "kind = \"y\"\n[sweep]\nranks = [1]\n[a]\nn = 1\nm = 2\n",
            "kind = \"x\"\n[sweep]\nranks = [1]\n[a]\nn = 1\n",
        ] {
            assert_ne!(spec(other).settings_hash(), base, "{other}");
        }
    }

    fn spec(text: &str) -> SpecText {
        SpecText::from_text(Path::new("s.toml"), text.into()).unwrap()
    }

    #[test]
    fn a_key_is_found_in_its_own_section() {
        let s = spec("kind = \"x\"\n[a]\nheads = 1\n[b]\nheads = 2\n");
        assert_eq!(
            (
                s.line("a", "heads"),
                s.line("b", "heads"),
                s.line("", "kind")
            ),
            (3, 5, 1)
        );
        assert_eq!(s.line("c", "heads"), 0);
        let e = s.error("b", "heads", "too few").to_string();
        assert_eq!(e, "s.toml:5: b.heads: too few");
    }

    #[test]
    fn a_toml_error_is_one_line_with_the_line_number() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Only {
            n: usize,
        }
        let e = spec("kind = \"x\"\nn = 1\nm = 2\n")
            .parse::<Only>()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml:3: m: unknown field `m`"), "{e}");
        assert!(!e.contains('\n'));
        let e = spec("kind = \"x\"\nn = \"one\"\n")
            .parse::<Only>()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("s.toml:2: n: invalid type") && e.contains("usize"),
            "{e}"
        );
        assert!(SpecText::from_text(Path::new("s.toml"), "n = 1\n".into()).is_err());
        // kind and description are the runner's: a kind's spec never sees them, lines stay put.
        let s = spec("kind = \"x\"\ndescription = \"\"\"\ntwo\nlines\"\"\"\nn = 1\nm = 2\n");
        assert_eq!(s.description, "two\nlines");
        let e = s.parse::<Only>().unwrap_err().to_string();
        assert!(e.starts_with("s.toml:6: m: unknown field `m`"), "{e}");
    }
}
