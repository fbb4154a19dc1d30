//! Host tensors: constants (weights, folded values) and the engine's input/output buffers.

use crate::error::{Error, Result};

/// Element types the engine understands. F16 and F64 initializers are widened to F32 at import.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DataType {
    /// 32-bit float (also holds F16/F64/BF16 data, widened at import).
    F32,
    /// 64-bit signed integer (shapes, indices).
    I64,
    /// 32-bit signed integer (e.g. quantized biases).
    I32,
    /// 8-bit signed integer (quantized weights and activations).
    I8,
    /// 8-bit unsigned integer (quantized activations, image bytes).
    U8,
    /// Boolean, one byte per element (0 or 1).
    Bool,
}

impl DataType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 => 4,
            DataType::I64 => 8,
            DataType::I8 | DataType::U8 | DataType::Bool => 1,
        }
    }

    /// Maps an ONNX `TensorProto.DataType` code; F16/F64/BF16 map to F32 (widened on import).
    pub fn from_onnx(code: i32) -> Result<Self> {
        Ok(match code {
            1 | 10 | 11 | 16 => DataType::F32,
            2 => DataType::U8,
            3 => DataType::I8,
            6 => DataType::I32,
            7 => DataType::I64,
            9 => DataType::Bool,
            other => return Err(Error::Unsupported(format!("ONNX data type code {other}"))),
        })
    }

    /// Name as used by the KServe v2 protocol (`FP32`, `INT64`, ...).
    pub fn kserve_name(self) -> &'static str {
        match self {
            DataType::F32 => "FP32",
            DataType::I64 => "INT64",
            DataType::I32 => "INT32",
            DataType::I8 => "INT8",
            DataType::U8 => "UINT8",
            DataType::Bool => "BOOL",
        }
    }
}

/// Typed element storage of a [`Tensor`]. Bool is stored as one byte per element (0 or 1).
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Elements of an [`DataType::F32`] tensor.
    F32(Vec<f32>),
    /// Elements of an [`DataType::I64`] tensor.
    I64(Vec<i64>),
    /// Elements of an [`DataType::I32`] tensor.
    I32(Vec<i32>),
    /// Elements of an [`DataType::I8`] tensor.
    I8(Vec<i8>),
    /// Elements of a [`DataType::U8`] tensor.
    U8(Vec<u8>),
    /// Elements of a [`DataType::Bool`] tensor, each 0 or 1.
    Bool(Vec<u8>),
}

/// A dense row-major host tensor with a static shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first (empty for a scalar).
    pub shape: Vec<usize>,
    /// Elements in row-major order.
    pub data: TensorData,
}

impl Tensor {
    /// Builds a tensor, checking that the element count matches the shape.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Self> {
        let t = Tensor { shape, data };
        if t.len() != t.shape.iter().product::<usize>() {
            return Err(Error::Shape(format!(
                "tensor data has {} elements but shape {:?} needs {}",
                t.len(),
                t.shape,
                t.shape.iter().product::<usize>()
            )));
        }
        Ok(t)
    }

    /// An f32 tensor; panics never, errors on a size mismatch.
    pub fn from_f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        Tensor::new(shape, TensorData::F32(data))
    }

    /// An i64 tensor (shapes, indices).
    pub fn from_i64(shape: Vec<usize>, data: Vec<i64>) -> Result<Self> {
        Tensor::new(shape, TensorData::I64(data))
    }

    /// A zero-filled tensor of the given type and shape.
    pub fn zeros(dtype: DataType, shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        let data = match dtype {
            DataType::F32 => TensorData::F32(vec![0.0; n]),
            DataType::I64 => TensorData::I64(vec![0; n]),
            DataType::I32 => TensorData::I32(vec![0; n]),
            DataType::I8 => TensorData::I8(vec![0; n]),
            DataType::U8 => TensorData::U8(vec![0; n]),
            DataType::Bool => TensorData::Bool(vec![0; n]),
        };
        Tensor { shape, data }
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        match &self.data {
            TensorData::F32(_) => DataType::F32,
            TensorData::I64(_) => DataType::I64,
            TensorData::I32(_) => DataType::I32,
            TensorData::I8(_) => DataType::I8,
            TensorData::U8(_) => DataType::U8,
            TensorData::Bool(_) => DataType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::F32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I8(v) => v.len(),
            TensorData::U8(v) | TensorData::Bool(v) => v.len(),
        }
    }

    /// True when the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The f32 elements, or an error naming the actual type.
    pub fn as_f32(&self) -> Result<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Ok(v),
            _ => Err(Error::Type(format!(
                "expected f32 tensor, got {:?}",
                self.dtype()
            ))),
        }
    }

    /// Mutable f32 elements.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32]> {
        let dt = self.dtype();
        match &mut self.data {
            TensorData::F32(v) => Ok(v),
            _ => Err(Error::Type(format!("expected f32 tensor, got {dt:?}"))),
        }
    }

    /// The elements converted to i64 (for shape-like inputs: Reshape shapes, Slice bounds, pads).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        Ok(match &self.data {
            TensorData::I64(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U8(v) | TensorData::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::F32(v) => v.iter().map(|&x| x as i64).collect(),
        })
    }

    /// The elements converted to f32 (for scalar attributes given as inputs: Clip bounds, Resize scales).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            TensorData::F32(v) => v.clone(),
            TensorData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U8(v) | TensorData::Bool(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// Raw little-endian bytes of the elements (for arena copies and the KServe binary extension).
    pub fn as_bytes(&self) -> &[u8] {
        fn bytes<T>(v: &[T]) -> &[u8] {
            // SAFETY: plain-old-data element types with no padding; length in bytes is exact.
            unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        }
        match &self.data {
            TensorData::F32(v) => bytes(v),
            TensorData::I64(v) => bytes(v),
            TensorData::I32(v) => bytes(v),
            TensorData::I8(v) => bytes(v),
            TensorData::U8(v) | TensorData::Bool(v) => v,
        }
    }

    /// Mutable raw bytes of the elements (for kernels writing into an owned tensor).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        fn bytes<T>(v: &mut [T]) -> &mut [u8] {
            let n = std::mem::size_of_val(v);
            // SAFETY: plain-old-data element types; every byte pattern is a valid value.
            unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n) }
        }
        match &mut self.data {
            TensorData::F32(v) => bytes(v),
            TensorData::I64(v) => bytes(v),
            TensorData::I32(v) => bytes(v),
            TensorData::I8(v) => bytes(v),
            TensorData::U8(v) | TensorData::Bool(v) => v,
        }
    }

    /// Builds a tensor from little-endian bytes; errors when the byte count does not fit the shape.
    pub fn from_bytes(dtype: DataType, shape: Vec<usize>, bytes: &[u8]) -> Result<Self> {
        let n: usize = shape.iter().product();
        if bytes.len() != n * dtype.size() {
            return Err(Error::Shape(format!(
                "{} bytes do not hold a {:?} tensor of shape {:?} ({} bytes)",
                bytes.len(),
                dtype,
                shape,
                n * dtype.size()
            )));
        }
        fn chunks<const N: usize, T>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
            b.chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect()
        }
        let data = match dtype {
            DataType::F32 => TensorData::F32(chunks(bytes, f32::from_le_bytes)),
            DataType::I64 => TensorData::I64(chunks(bytes, i64::from_le_bytes)),
            DataType::I32 => TensorData::I32(chunks(bytes, i32::from_le_bytes)),
            DataType::I8 => TensorData::I8(bytes.iter().map(|&b| b as i8).collect()),
            DataType::U8 => TensorData::U8(bytes.to_vec()),
            DataType::Bool => TensorData::Bool(bytes.iter().map(|&b| (b != 0) as u8).collect()),
        };
        Tensor::new(shape, data)
    }
}
