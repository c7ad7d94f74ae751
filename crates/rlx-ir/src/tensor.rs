//! Host tensor data: constants, reference-interpreter values and run I/O.

use crate::{DType, Shape};
use std::sync::Arc;

/// Owned element data of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// f32 elements.
    F32(Vec<f32>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
    /// Raw bytes: U8, Bool, or packed quantized blocks.
    U8(Vec<u8>),
}

impl TensorData {
    /// The dtype this data is stored as (U8 also stands for Bool).
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
            TensorData::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::U8(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `shape` can hold this data: same element count and a compatible dtype.
    pub fn fits(&self, shape: &Shape) -> bool {
        let dt_ok = matches!(
            (self, shape.dtype),
            (TensorData::F32(_), DType::F32)
                | (TensorData::I32(_), DType::I32)
                | (TensorData::I64(_), DType::I64)
                | (TensorData::U8(_), DType::U8 | DType::Bool)
        );
        dt_ok && self.len() == shape.numel()
    }

    /// The elements converted to f64 (for the reference interpreter).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
}

/// A host tensor: a shape and its data, shared cheaply.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Shape and dtype.
    pub shape: Shape,
    /// Elements in row-major order.
    pub data: Arc<TensorData>,
}

impl Tensor {
    /// An f32 tensor. The caller guarantees `data.len() == numel(dims)`.
    pub fn f32(dims: &[usize], data: Vec<f32>) -> Self {
        Tensor {
            shape: Shape::new(dims, DType::F32),
            data: Arc::new(TensorData::F32(data)),
        }
    }

    /// An i64 tensor.
    pub fn i64(dims: &[usize], data: Vec<i64>) -> Self {
        Tensor {
            shape: Shape::new(dims, DType::I64),
            data: Arc::new(TensorData::I64(data)),
        }
    }

    /// An i32 tensor.
    pub fn i32(dims: &[usize], data: Vec<i32>) -> Self {
        Tensor {
            shape: Shape::new(dims, DType::I32),
            data: Arc::new(TensorData::I32(data)),
        }
    }

    /// A u8 tensor.
    pub fn u8(dims: &[usize], data: Vec<u8>) -> Self {
        Tensor {
            shape: Shape::new(dims, DType::U8),
            data: Arc::new(TensorData::U8(data)),
        }
    }

    /// The f32 elements, if this is an f32 tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &*self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }
}
