//! Reading and writing `.npy` arrays (C or Fortran order, f32 or f64 in; C-order f32 out).

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
