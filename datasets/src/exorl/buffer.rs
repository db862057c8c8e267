//! Episodes in ExoRL's on-disk layout: one compressed `.npz` per episode with `observation`,
//! `action`, `reward`, `discount` (T+1 rows; row 0 is the reset row) and `physics` (float64).
//! The reader accepts any dimensions and float32 or float64 arrays, so real ExoRL buffers load as
//! they are.

use npyz::npz::{NpzArchive, NpzWriter};
use npyz::{DType, TypeChar, WriterBuilder};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Why an episode, a buffer or a task could not be read.
#[derive(Debug, Error)]
pub enum ExorlError {
    /// The file could not be read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        cause: std::io::Error,
    },
    /// Not an npz archive, or an array in it is not a readable `.npy`.
    #[error("{path}: not a readable npz archive ({reason})")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the reader said.
        reason: String,
    },
    /// One of the five arrays of an episode is absent.
    #[error(
        "{path}: missing key `{key}` (an ExoRL episode has observation, action, reward, discount, physics)"
    )]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The missing array.
        key: &'static str,
    },
    /// An array is not float32 or float64.
    #[error("{path}: `{key}` has dtype {dtype}; expected float32 or float64")]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The array.
        key: &'static str,
        /// Its NumPy dtype.
        dtype: String,
    },
    /// An array has the wrong number of axes or columns.
    #[error("{path}: `{key}` has shape {shape:?}; expected {expected}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// The array.
        key: &'static str,
        /// Its shape.
        shape: Vec<u64>,
        /// The shape wanted, in words.
        expected: String,
    },
    /// Arrays of one episode disagree on the number of rows.
    #[error(
        "{path}: `{key}` has {rows} rows but `observation` has {expected}; every key needs T+1 rows"
    )]
    LengthMismatch {
        /// The file.
        path: PathBuf,
        /// The array.
        key: &'static str,
        /// Its rows.
        rows: usize,
        /// The observation's rows.
        expected: usize,
    },
    /// The step count in the file name disagrees with the arrays.
    #[error("{path}: the file name says {named} steps but the arrays hold {steps}")]
    NamedLength {
        /// The file.
        path: PathBuf,
        /// Steps in the name.
        named: usize,
        /// Steps in the arrays.
        steps: usize,
    },
    /// A directory holds no episodes.
    #[error("{path}: no .npz episodes found")]
    Empty {
        /// The directory.
        path: PathBuf,
    },
    /// A task name the environments do not know.
    #[error("unknown task `{task}`; known tasks: {known}")]
    UnknownTask {
        /// The name asked for.
        task: String,
        /// The known tasks, comma-separated.
        known: String,
    },
}

/// A row-major matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix<T> {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows × cols` values, row after row.
    pub data: Vec<T>,
}

impl<T> Matrix<T> {
    /// A matrix of `data`, which must hold `rows × cols` values.
    pub fn new(rows: usize, cols: usize, data: Vec<T>) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix data length");
        Self { rows, cols, data }
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> &[T] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// One episode of T steps: every field has T+1 rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// What the agent sees, one row per step.
    pub observation: Matrix<f32>,
    /// What it did (row 0, the reset row, is zeros).
    pub action: Matrix<f32>,
    /// The reward each step earned, in [0, 1].
    pub reward: Vec<f32>,
    /// 1 while the episode goes on.
    pub discount: Vec<f32>,
    /// The simulator's full state, float64.
    pub physics: Matrix<f64>,
}

impl Episode {
    /// Steps T (rows minus the reset row).
    pub fn steps(&self) -> usize {
        self.observation.rows.saturating_sub(1)
    }

    /// Sum of the rewards of rows 1..=T.
    pub fn total_return(&self) -> f64 {
        self.reward.iter().skip(1).map(|&r| f64::from(r)).sum()
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ExorlError + '_ {
    move |cause| ExorlError::Io {
        path: path.to_owned(),
        cause,
    }
}

/// Writes `episode` as ExoRL does (`np.savez_compressed`): deflated `.npy` members.
pub fn write_episode(path: &Path, episode: &Episode) -> Result<(), ExorlError> {
    fn put<T: npyz::Serialize + npyz::AutoSerialize + Copy>(
        npz: &mut NpzWriter<std::io::BufWriter<std::fs::File>>,
        name: &str,
        shape: [u64; 2],
        data: &[T],
    ) -> std::io::Result<()> {
        let options =
            zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        let mut writer = npz
            .array::<T>(name, options)?
            .default_dtype()
            .shape(&shape)
            .begin_nd()?;
        writer.extend(data.iter().copied())?;
        writer.finish()
    }
    let rows = episode.observation.rows as u64;
    let write = || -> std::io::Result<()> {
        let mut npz = NpzWriter::create(path)?;
        let o = &episode.observation;
        put(&mut npz, "observation", [rows, o.cols as u64], &o.data)?;
        let a = &episode.action;
        put(&mut npz, "action", [rows, a.cols as u64], &a.data)?;
        put(&mut npz, "reward", [rows, 1], &episode.reward)?;
        put(&mut npz, "discount", [rows, 1], &episode.discount)?;
        let p = &episode.physics;
        put(&mut npz, "physics", [rows, p.cols as u64], &p.data)?;
        npz.zip_writer().finish()?;
        Ok(())
    };
    write().map_err(io_error(path))
}

/// One array of an archive as `(shape, values)` in f64.
fn read_array(
    npz: &mut NpzArchive<std::io::BufReader<std::fs::File>>,
    path: &Path,
    key: &'static str,
) -> Result<(Vec<u64>, Vec<f64>), ExorlError> {
    let corrupt = |e: std::io::Error| ExorlError::Corrupt {
        path: path.to_owned(),
        reason: format!("`{key}`: {e}"),
    };
    let file = npz
        .by_name(key)
        .map_err(corrupt)?
        .ok_or_else(|| ExorlError::MissingKey {
            path: path.to_owned(),
            key,
        })?;
    let shape = file.shape().to_vec();
    let values = match file.dtype() {
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 4 => file
            .into_vec::<f32>()
            .map_err(corrupt)?
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 8 => {
            file.into_vec::<f64>().map_err(corrupt)?
        }
        other => {
            return Err(ExorlError::Dtype {
                path: path.to_owned(),
                key,
                dtype: other.descr(),
            });
        }
    };
    Ok((shape, values))
}

/// `(rows, cols)` of a 2-D array, or of a 1-D one read as one column (`reward` may be `(T+1,)`).
fn rows_cols(
    path: &Path,
    key: &'static str,
    shape: &[u64],
    column: bool,
) -> Result<(usize, usize), ExorlError> {
    match *shape {
        [r, c] if !column || c == 1 => Ok((r as usize, c as usize)),
        [r] if column => Ok((r as usize, 1)),
        _ => Err(ExorlError::Shape {
            path: path.to_owned(),
            key,
            shape: shape.to_vec(),
            expected: if column {
                "(T+1, 1) or (T+1,)".into()
            } else {
                "(T+1, dim)".into()
            },
        }),
    }
}

/// Reads one ExoRL episode file, checking keys, dtypes and that every key has the same T+1 rows.
pub fn read_episode(path: &Path) -> Result<Episode, ExorlError> {
    let mut npz = NpzArchive::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => ExorlError::Io {
            path: path.to_owned(),
            cause: e,
        },
        _ => ExorlError::Corrupt {
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })?;
    let mut matrix = |key: &'static str, column: bool| -> Result<Matrix<f64>, ExorlError> {
        let (shape, values) = read_array(&mut npz, path, key)?;
        let (rows, cols) = rows_cols(path, key, &shape, column)?;
        Ok(Matrix::new(rows, cols, values))
    };
    let observation = matrix("observation", false)?;
    let action = matrix("action", false)?;
    let reward = matrix("reward", true)?;
    let discount = matrix("discount", true)?;
    let physics = matrix("physics", false)?;
    let expected = observation.rows;
    if expected == 0 {
        return Err(ExorlError::Shape {
            path: path.to_owned(),
            key: "observation",
            shape: vec![0, observation.cols as u64],
            expected: "at least the reset row".into(),
        });
    }
    for (key, rows) in [
        ("action", action.rows),
        ("reward", reward.rows),
        ("discount", discount.rows),
        ("physics", physics.rows),
    ] {
        if rows != expected {
            return Err(ExorlError::LengthMismatch {
                path: path.to_owned(),
                key,
                rows,
                expected,
            });
        }
    }
    let to_f32 =
        |m: Matrix<f64>| Matrix::new(m.rows, m.cols, m.data.iter().map(|&x| x as f32).collect());
    let episode = Episode {
        observation: to_f32(observation),
        action: to_f32(action),
        reward: reward.data.iter().map(|&x| x as f32).collect(),
        discount: discount.data.iter().map(|&x| x as f32).collect(),
        physics,
    };
    if let Some(named) = named_length(path)
        && named != episode.steps()
    {
        return Err(ExorlError::NamedLength {
            path: path.to_owned(),
            named,
            steps: episode.steps(),
        });
    }
    Ok(episode)
}

/// The `<len>` of ExoRL's `<timestamp>_<idx>_<len>.npz` file names, where the name has that form.
fn named_length(path: &Path) -> Option<usize> {
    let stem = path.file_stem()?.to_str()?;
    let mut parts = stem.rsplitn(3, '_');
    let len = parts.next()?.parse().ok()?;
    let _idx: usize = parts.next()?.parse().ok()?;
    parts.next().map(|_| len)
}

/// Every `.npz` file under `dir` (recursively), sorted by path.
pub fn episode_files(dir: &Path) -> Result<Vec<PathBuf>, ExorlError> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ExorlError> {
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "npz") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    if dir.is_file() {
        files.push(dir.to_owned());
    } else {
        walk(dir, &mut files)?;
    }
    files.sort();
    if files.is_empty() {
        return Err(ExorlError::Empty {
            path: dir.to_owned(),
        });
    }
    Ok(files)
}
