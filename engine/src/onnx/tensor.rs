//! Conversion of ONNX `TensorProto`s (initializers, Constant values) into host tensors.

use super::proto::tensor_proto::DataLocation;
use super::proto::TensorProto;
use crate::error::{Error, Result};
use crate::ir::{DataType, Tensor, TensorData};

/// Largest element count (and dimension) accepted from a model file.
pub(crate) const MAX_ELEMENTS: usize = 1 << 31;

/// Validates ONNX dims (non-negative, element count at most [`MAX_ELEMENTS`]) into a shape.
pub(crate) fn dims_to_shape(dims: &[i64], what: &str) -> Result<Vec<usize>> {
    let mut n: usize = 1;
    let mut shape = Vec::with_capacity(dims.len().min(64));
    for &d in dims {
        if d < 0 || d as u64 > MAX_ELEMENTS as u64 {
            return Err(Error::InvalidModel(format!(
                "{what} has invalid dimension {d} in {dims:?}"
            )));
        }
        let d = d as usize;
        n = n
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                Error::InvalidModel(format!("{what} has too many elements (dims {dims:?})"))
            })?;
        shape.push(d);
    }
    Ok(shape)
}

fn chunks<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    b.chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect()
}

/// Bytes per element of an ONNX data type code as stored in `raw_data`.
fn raw_elem_size(code: i32) -> Option<usize> {
    Some(match code {
        1 | 6 => 4,
        7 | 11 => 8,
        10 | 16 => 2,
        2 | 3 | 9 => 1,
        _ => return None,
    })
}

fn from_raw(code: i32, n: usize, raw: &[u8], what: &str) -> Result<TensorData> {
    let size = raw_elem_size(code).ok_or_else(|| {
        Error::Unsupported(format!("{what} has unsupported data type code {code}"))
    })?;
    let want = n
        .checked_mul(size)
        .ok_or_else(|| Error::InvalidModel(format!("{what} is too large")))?;
    if raw.len() != want {
        return Err(Error::InvalidModel(format!(
            "{what} has {} bytes of raw data but its dims need {want}",
            raw.len()
        )));
    }
    Ok(match code {
        1 => TensorData::F32(chunks(raw, f32::from_le_bytes)),
        10 => TensorData::F32(chunks(raw, |b| {
            half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
        })),
        16 => TensorData::F32(chunks(raw, |b| {
            half::bf16::from_bits(u16::from_le_bytes(b)).to_f32()
        })),
        11 => TensorData::F32(chunks(raw, |b| f64::from_le_bytes(b) as f32)),
        2 => TensorData::U8(raw.to_vec()),
        3 => TensorData::I8(raw.iter().map(|&b| b as i8).collect()),
        9 => TensorData::Bool(raw.iter().map(|&b| (b != 0) as u8).collect()),
        6 => TensorData::I32(chunks(raw, i32::from_le_bytes)),
        _ => TensorData::I64(chunks(raw, i64::from_le_bytes)),
    })
}

fn check_len(got: usize, n: usize, field: &str, what: &str) -> Result<()> {
    if got != n {
        return Err(Error::InvalidModel(format!(
            "{what} has {got} values in {field} but its dims need {n}"
        )));
    }
    Ok(())
}

fn from_typed(code: i32, n: usize, t: &TensorProto, what: &str) -> Result<TensorData> {
    Ok(match code {
        1 => {
            check_len(t.float_data.len(), n, "float_data", what)?;
            TensorData::F32(t.float_data.clone())
        }
        11 => {
            check_len(t.double_data.len(), n, "double_data", what)?;
            TensorData::F32(t.double_data.iter().map(|&x| x as f32).collect())
        }
        7 => {
            check_len(t.int64_data.len(), n, "int64_data", what)?;
            TensorData::I64(t.int64_data.clone())
        }
        10 | 16 | 2 | 3 | 9 | 6 => {
            check_len(t.int32_data.len(), n, "int32_data", what)?;
            let v = &t.int32_data;
            match code {
                10 => TensorData::F32(
                    v.iter()
                        .map(|&x| half::f16::from_bits(x as u16).to_f32())
                        .collect(),
                ),
                16 => TensorData::F32(
                    v.iter()
                        .map(|&x| half::bf16::from_bits(x as u16).to_f32())
                        .collect(),
                ),
                2 => TensorData::U8(v.iter().map(|&x| x as u8).collect()),
                3 => TensorData::I8(v.iter().map(|&x| x as i8).collect()),
                9 => TensorData::Bool(v.iter().map(|&x| (x != 0) as u8).collect()),
                _ => TensorData::I32(v.clone()),
            }
        }
        other => {
            return Err(Error::Unsupported(format!(
                "{what} has unsupported data type code {other}"
            )));
        }
    })
}

/// Converts a `TensorProto` into a host tensor (F16/BF16/F64 widened or narrowed to F32).
pub(crate) fn tensor_from_proto(t: &TensorProto, what: &str) -> Result<Tensor> {
    if t.data_location == Some(DataLocation::External as i32) || !t.external_data.is_empty() {
        return Err(Error::Unsupported(format!(
            "{what} stores its data in an external file; external data is not supported (re-save the model with all tensors embedded)"
        )));
    }
    if t.segment.is_some() {
        return Err(Error::Unsupported(format!("{what} is a segmented tensor")));
    }
    let shape = dims_to_shape(&t.dims, what)?;
    let n: usize = shape.iter().product();
    let code = t.data_type.unwrap_or(0);
    DataType::from_onnx(code)
        .map_err(|_| Error::Unsupported(format!("{what} has unsupported data type code {code}")))?;
    let data = match &t.raw_data {
        Some(raw) if !raw.is_empty() || n == 0 => from_raw(code, n, raw, what)?,
        _ => from_typed(code, n, t, what)?,
    };
    Tensor::new(shape, data).map_err(|e| Error::InvalidModel(format!("{what}: {e}")))
}
