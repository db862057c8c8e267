//! Reading and writing `.npy` arrays (C or Fortran order, f32 or f64 in; C-order f32 out), and token
//! ids (int32 or int64 in, C order; int64 out).

use npyz::{DType, NpyFile, TypeChar, WriteOptions, WriterBuilder};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use thiserror::Error;
use workbench::ring::jobs::HostTensor;

/// Why an `.npy` file could not be read.
#[derive(Debug, Error)]
pub enum NpyError {
    /// The file could not be opened or read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// Token ids of another dtype or rank than int32/int64 `[batch, seq]`, or out of range.
    #[error("{path}: {what}")]
    Ids {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A dtype other than float32 or float64.
    #[error("{path}: dtype {dtype} is not supported; expected float32 or float64")]
    Dtype {
        /// The file.
        path: PathBuf,
        /// Its dtype descriptor.
        dtype: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NpyError + '_ {
    move |cause| NpyError::Io {
        path: path.to_owned(),
        cause,
    }
}

/// Reads a float32 or float64 array as f32 in C order (a Fortran-order file is reordered).
pub fn read(path: &Path) -> Result<HostTensor, NpyError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let file = NpyFile::new(&bytes[..]).map_err(io(path))?;
    let fortran = file.order() == npyz::Order::Fortran;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let data = match file.dtype() {
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 4 => {
            file.into_vec::<f32>().map_err(io(path))?
        }
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 8 => file
            .into_vec::<f64>()
            .map_err(io(path))?
            .into_iter()
            .map(|x| x as f32)
            .collect(),
        other => {
            return Err(NpyError::Dtype {
                path: path.to_owned(),
                dtype: other.descr(),
            });
        }
    };
    let data = if fortran {
        to_c_order(&data, &shape)
    } else {
        data
    };
    Ok(HostTensor::new(shape, data))
}

/// Fortran order (first index fastest) to C order (last index fastest).
fn to_c_order(fortran: &[f32], shape: &[usize]) -> Vec<f32> {
    // The Fortran stride of each axis.
    let mut strides = vec![1; shape.len()];
    for axis in 1..shape.len() {
        strides[axis] = strides[axis - 1] * shape[axis - 1];
    }
    let mut index = vec![0; shape.len()];
    let mut c = Vec::with_capacity(fortran.len());
    for _ in 0..fortran.len() {
        c.push(
            fortran[index
                .iter()
                .zip(&strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        // The next C-order index: increment the last axis, carrying leftwards.
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    c
}

/// Writes an f32 array in C order.
pub fn write(path: &Path, tensor: &HostTensor) -> Result<(), NpyError> {
    let file = File::create(path).map_err(io(path))?;
    let shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
    let mut writer = WriteOptions::new()
        .default_dtype()
        .shape(&shape)
        .writer(BufWriter::new(file))
        .begin_nd()
        .map_err(io(path))?;
    writer
        .extend(tensor.data.iter().copied())
        .map_err(io(path))?;
    writer.finish().map_err(io(path))
}

/// Token ids `[batch, seq]` of an int32 or int64 array in C order: the rows, each checked to be a
/// token id (0 to 2³² − 1).
pub fn read_ids(path: &Path) -> Result<Vec<Vec<u32>>, NpyError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let file = NpyFile::new(&bytes[..]).map_err(io(path))?;
    let bad = |what: String| NpyError::Ids {
        path: path.to_owned(),
        what,
    };
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let [batch, seq] = shape[..] else {
        return Err(bad(format!(
            "token ids must be [batch, seq]; got shape {shape:?}"
        )));
    };
    if file.order() == npyz::Order::Fortran && batch > 1 && seq > 1 {
        return Err(bad("token ids must be in C order".into()));
    }
    let values: Vec<i64> = match file.dtype() {
        DType::Plain(t) if t.type_char() == TypeChar::Int && t.size_field() == 8 => {
            file.into_vec::<i64>().map_err(io(path))?
        }
        DType::Plain(t) if t.type_char() == TypeChar::Int && t.size_field() == 4 => file
            .into_vec::<i32>()
            .map_err(io(path))?
            .into_iter()
            .map(i64::from)
            .collect(),
        other => {
            return Err(bad(format!(
                "dtype {} is not token ids; expected int32 or int64",
                other.descr()
            )));
        }
    };
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| u32::try_from(**v).is_err())
    {
        return Err(bad(format!(
            "ids[{}, {}] = {v} is not a token id",
            i / seq.max(1),
            i % seq.max(1)
        )));
    }
    Ok(values
        .chunks(seq.max(1))
        .take(batch)
        .map(|row| row.iter().map(|&v| v as u32).collect())
        .collect())
}

/// Writes token ids `[batch, seq]` as int64 in C order (rows of equal length).
pub fn write_ids(path: &Path, rows: &[Vec<u32>]) -> Result<(), NpyError> {
    let seq = rows.first().map_or(0, Vec::len);
    if let Some(row) = rows.iter().position(|r| r.len() != seq) {
        return Err(NpyError::Ids {
            path: path.to_owned(),
            what: format!("row {row} has {} ids, row 0 has {seq}", rows[row].len()),
        });
    }
    let file = File::create(path).map_err(io(path))?;
    let shape = [rows.len() as u64, seq as u64];
    let mut writer = WriteOptions::<i64>::new()
        .default_dtype()
        .shape(&shape)
        .writer(BufWriter::new(file))
        .begin_nd()
        .map_err(io(path))?;
    writer
        .extend(rows.iter().flatten().map(|&t| i64::from(t)))
        .map_err(io(path))?;
    writer.finish().map_err(io(path))
}
