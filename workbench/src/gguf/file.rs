//! A GGUF file memory-mapped: its header (magic, version 2 or 3, counts), its metadata (typed
//! key-value pairs, arrays included), its tensor directory (name, dims innermost first, ggml type,
//! offset) and, on request, one tensor's values as f32. Every length is checked against the file
//! before it is read: a truncated file is an error naming what was being read, never a panic.

use super::error::GgufError;
use super::quants::{GgmlType, KNOWN};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type (u8, u16, u32, u64).
    Uint(u64),
    /// Any signed integer type.
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// UTF-8 text.
    Text(String),
    /// An array of values (of one type).
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::Uint(v) => Some(v),
            GgufValue::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Float(v) => Some(v),
            GgufValue::Uint(v) => Some(v as f64),
            GgufValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as text, if it is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Text(s) => Some(s),
            _ => None,
        }
    }
}

impl std::fmt::Display for GgufValue {
    /// The value as the file holds it: a number, quoted text, or an array's length and first items.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GgufValue::Uint(v) => write!(f, "{v}"),
            GgufValue::Int(v) => write!(f, "{v}"),
            GgufValue::Float(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::Text(v) => write!(f, "{v:?}"),
            GgufValue::Array(items) => {
                let shown: Vec<String> = items.iter().take(3).map(ToString::to_string).collect();
                let more = if items.len() > 3 { ", ..." } else { "" };
                write!(f, "[{}{more}] ({} items)", shown.join(", "), items.len())
            }
        }
    }
}

/// One tensor's directory entry.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its dimensions as GGUF lists them, innermost (contiguous) first: a `[rows, columns]` matrix
    /// is `[columns, rows]`.
    pub dims: Vec<u64>,
    /// Its ggml type id.
    pub type_id: u32,
    /// Its data's offset from the start of the data section.
    pub offset: u64,
}

impl GgufTensor {
    /// Elements; `None` when the dimensions' product overflows 64 bits (a corrupt entry).
    pub fn elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }
}

/// A GGUF file, mapped.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    /// Where the tensors' data starts.
    data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// The data section's alignment when the file does not set `general.alignment`.
const DEFAULT_ALIGNMENT: u64 = 32;

/// How deep metadata arrays may nest (an array of arrays is depth 2): GGUF's writers nest at most
/// once, and a bound keeps a corrupt file from recursing until the stack runs out.
pub const MAX_ARRAY_DEPTH: usize = 4;

/// A cursor over the mapped bytes that refuses to read past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let end = (self.at as u64)
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len() as u64);
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                needed: (self.at as u64).saturating_add(n),
                len: self.bytes.len() as u64,
            });
        };
        let out = &self.bytes[self.at..end as usize];
        self.at = end as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("N bytes taken"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn text(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadValue {
            path: self.path.to_path_buf(),
            key: what(),
            what: "text that is not UTF-8".into(),
        })
    }

    /// A value of metadata type id `type_id`, inside `depth` arrays.
    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<GgufValue, GgufError> {
        let what = || format!("metadata {key}");
        Ok(match type_id {
            0 => GgufValue::Uint(u64::from(self.array::<1>(&what)?[0])),
            1 => GgufValue::Int(i64::from(self.array::<1>(&what)?[0] as i8)),
            2 => GgufValue::Uint(u64::from(u16::from_le_bytes(self.array(&what)?))),
            3 => GgufValue::Int(i64::from(i16::from_le_bytes(self.array(&what)?))),
            4 => GgufValue::Uint(u64::from(self.u32(&what)?)),
            5 => GgufValue::Int(i64::from(i32::from_le_bytes(self.array(&what)?))),
            6 => GgufValue::Float(f64::from(f32::from_le_bytes(self.array(&what)?))),
            7 => GgufValue::Bool(self.array::<1>(&what)?[0] != 0),
            8 => GgufValue::Text(self.text(&what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::BadValue {
                        path: self.path.to_path_buf(),
                        key: key.to_owned(),
                        what: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let item_type = self.u32(&what)?;
                let len = self.u64(&what)?;
                // Each item takes at least a byte: a count beyond the file is a truncation, found
                // before anything is allocated for it.
                let left = (self.bytes.len() - self.at) as u64;
                if len > left {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("metadata {key} (an array of {len})"),
                        needed: self.at as u64 + len,
                        len: self.bytes.len() as u64,
                    });
                }
                let items = (0..len)
                    .map(|_| self.value(item_type, key, depth + 1))
                    .collect::<Result<_, _>>()?;
                GgufValue::Array(items)
            }
            10 => GgufValue::Uint(self.u64(&what)?),
            11 => GgufValue::Int(i64::from_le_bytes(self.array(&what)?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.array(&what)?)),
            other => {
                return Err(GgufError::BadValue {
                    path: self.path.to_path_buf(),
                    key: key.to_owned(),
                    what: format!("value type id {other} (the format defines 0 to 12)"),
                });
            }
        })
    }
}

impl GgufFile {
    /// Opens and maps `path`, reading its header, metadata and tensor directory.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |cause| GgufError::Io {
            path: path.to_path_buf(),
            cause,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as this value; a file changed underneath
        // it by another process is outside what the reader guards against (as for safetensors).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let mut c = Cursor {
            bytes: &map,
            at: 0,
            path,
        };
        let header = || "the header".to_owned();
        let magic = c.array::<4>(&header)?;
        if &magic != b"GGUF" {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                what: format!("its first bytes are {magic:?}, not \"GGUF\""),
            });
        }
        let version = c.u32(&header)?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                what: format!("GGUF version {version}; ringbench reads versions 2 and 3"),
            });
        }
        let tensor_count = c.u64(&header)?;
        let kv_count = c.u64(&header)?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = c.text(&|| format!("metadata key {i} of {kv_count}"))?;
            let type_id = c.u32(&|| format!("metadata {key}"))?;
            let value = c.value(type_id, &key, 0)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::new();
        for i in 0..tensor_count {
            let name = c.text(&|| format!("tensor {i} of {tensor_count}"))?;
            let what = || format!("tensor {name}'s entry");
            let n_dims = c.u32(&what)?;
            if n_dims > 8 {
                return Err(GgufError::BadTensor {
                    path: path.to_path_buf(),
                    tensor: name,
                    what: format!("{n_dims} dimensions (ggml has at most 4)"),
                });
            }
            let dims = (0..n_dims)
                .map(|_| c.u64(&what))
                .collect::<Result<_, _>>()?;
            let type_id = c.u32(&what)?;
            let offset = c.u64(&what)?;
            tensors.push(GgufTensor {
                name,
                dims,
                type_id,
                offset,
            });
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(GgufValue::as_u64)
            .filter(|&a| a > 0)
            .unwrap_or(DEFAULT_ALIGNMENT);
        let data_start = (c.at as u64).div_ceil(alignment) * alignment;
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            data_start,
            map,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata pair, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The value of `key`, if the file has it.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor directory, in the file's order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The entry of tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<&GgufTensor, GgufError> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::BadTensor {
                path: self.path.clone(),
                tensor: name.to_owned(),
                what: "no such tensor in the file".into(),
            })
    }

    /// Tensor `name`'s values as f32, in the file's order (innermost dimension fastest).
    pub fn values(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let tensor = self.tensor(name)?;
        let bad = |what: String| GgufError::BadTensor {
            path: self.path.clone(),
            tensor: name.to_owned(),
            what,
        };
        let Some(kind) = GgmlType::of_id(tensor.type_id) else {
            return Err(GgufError::UnknownType {
                path: self.path.clone(),
                tensor: name.to_owned(),
                id: tensor.type_id,
                type_name: GgmlType::name_of_id(tensor.type_id).to_owned(),
                known: KNOWN.to_owned(),
            });
        };
        let Some(elements) = tensor.elements() else {
            return Err(bad(format!(
                "dimensions {:?} hold more than 2^64 values",
                tensor.dims
            )));
        };
        let per_block = kind.block_values() as u64;
        if !elements.is_multiple_of(per_block) {
            return Err(bad(format!(
                "{elements} values do not fill whole blocks of {per_block} ({kind:?})"
            )));
        }
        let Some(bytes) = (elements / per_block).checked_mul(kind.block_bytes() as u64) else {
            return Err(bad(format!(
                "{elements} values of {kind:?} take more than 2^64 bytes"
            )));
        };
        let start = self.data_start.checked_add(tensor.offset);
        let end = start.and_then(|s| s.checked_add(bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.map.len() as u64 => {
                Ok(kind.dequantize(&self.map[start as usize..end as usize]))
            }
            _ => Err(GgufError::Truncated {
                path: self.path.clone(),
                what: format!("tensor {name}'s {bytes} bytes of data"),
                needed: end.unwrap_or(u64::MAX),
                len: self.map.len() as u64,
            }),
        }
    }
}
