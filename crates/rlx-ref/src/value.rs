//! Values held by the interpreter: f64 for floats, i64 for integers, plus
//! index helpers (strided and broadcast offsets) shared by the ops.

use rlx_ir::{contiguous_strides, DType, Shape, Tensor, TensorData};
use std::borrow::Cow;
use std::sync::Arc;

/// Element storage. Float dtypes live in `F`, integer dtypes (I32, I64, U8,
/// Bool) in `I`, so integers stay exact through data-movement ops.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Data {
    /// Float elements, computed in f64.
    F(Vec<f64>),
    /// Integer elements (I32, I64, U8 and Bool as 0/1).
    I(Vec<i64>),
}

/// One node's value: dims, the node's dtype and the elements.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Value {
    pub dims: Vec<usize>,
    pub dtype: DType,
    pub data: Data,
}

impl Value {
    /// An F32-typed value from f64 elements.
    pub fn float(dims: &[usize], data: Vec<f64>) -> Value {
        Value {
            dims: dims.to_vec(),
            dtype: DType::F32,
            data: Data::F(data),
        }
    }

    /// Number of elements stored.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }

    /// The elements as f64 (borrowed for float values, converted otherwise).
    pub fn floats(&self) -> Cow<'_, [f64]> {
        match &self.data {
            Data::F(v) => Cow::Borrowed(v),
            Data::I(v) => Cow::Owned(v.iter().map(|&x| x as f64).collect()),
        }
    }

    /// The elements as i64 (borrowed for integer values, truncated otherwise).
    pub fn ints(&self) -> Cow<'_, [i64]> {
        match &self.data {
            Data::I(v) => Cow::Borrowed(v),
            Data::F(v) => Cow::Owned(v.iter().map(|&x| x as i64).collect()),
        }
    }

    /// A value from a host tensor; the tensor's data must fit its shape
    /// (the caller checks with `TensorData::fits`).
    pub fn from_tensor(t: &Tensor) -> Value {
        let data = match &*t.data {
            TensorData::F32(v) => Data::F(v.iter().map(|&x| f64::from(x)).collect()),
            TensorData::I32(v) => Data::I(v.iter().map(|&x| i64::from(x)).collect()),
            TensorData::I64(v) => Data::I(v.clone()),
            TensorData::U8(v) => Data::I(v.iter().map(|&x| i64::from(x)).collect()),
        };
        Value {
            dims: t.shape.dims.clone(),
            dtype: t.shape.dtype,
            data,
        }
    }

    /// Convert to a host tensor of `dtype`, or `None` for a dtype that
    /// `TensorData` cannot hold (F16, BF16).
    pub fn to_tensor(&self, dtype: DType) -> Option<Tensor> {
        let data = match dtype {
            DType::F32 => TensorData::F32(self.floats().iter().map(|&x| x as f32).collect()),
            DType::I32 => TensorData::I32(self.ints().iter().map(|&x| x as i32).collect()),
            DType::I64 => TensorData::I64(self.ints().into_owned()),
            DType::U8 | DType::Bool => {
                TensorData::U8(self.ints().iter().map(|&x| x as u8).collect())
            }
            DType::F16 | DType::BF16 => return None,
        };
        Some(Tensor {
            shape: Shape::new(&self.dims, dtype),
            data: Arc::new(data),
        })
    }

    /// A new value of the same dtype with `dims`, whose element `i` is
    /// `self[picks[i]]`.
    pub fn pick(&self, dims: &[usize], picks: &[usize]) -> Value {
        let data = match &self.data {
            Data::F(v) => Data::F(picks.iter().map(|&p| v[p]).collect()),
            Data::I(v) => Data::I(picks.iter().map(|&p| v[p]).collect()),
        };
        Value {
            dims: dims.to_vec(),
            dtype: self.dtype,
            data,
        }
    }
}

/// Element `i` of the result is `srcs[picks[i].0][picks[i].1]`. All sources
/// share one dtype (the first one's); the result has `dims`.
pub(crate) fn pick_multi(srcs: &[&Value], dims: &[usize], picks: &[(usize, usize)]) -> Value {
    let dtype = srcs.first().map_or(DType::F32, |v| v.dtype);
    let data = if srcs.iter().all(|v| matches!(v.data, Data::I(_))) {
        let parts: Vec<Cow<'_, [i64]>> = srcs.iter().map(|v| v.ints()).collect();
        Data::I(picks.iter().map(|&(s, p)| parts[s][p]).collect())
    } else {
        let parts: Vec<Cow<'_, [f64]>> = srcs.iter().map(|v| v.floats()).collect();
        Data::F(picks.iter().map(|&(s, p)| parts[s][p]).collect())
    };
    Value {
        dims: dims.to_vec(),
        dtype,
        data,
    }
}

/// For every element of a row-major tensor with `dims` (in order), the
/// offset `base + sum(idx[a] * strides[a])`.
pub(crate) fn strided_offsets(dims: &[usize], strides: &[usize], base: usize) -> Vec<usize> {
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut idx = vec![0usize; dims.len()];
    let mut off = base;
    for _ in 0..n {
        out.push(off);
        // Advance the multi-index like an odometer, last axis fastest.
        for ax in (0..dims.len()).rev() {
            idx[ax] += 1;
            off += strides[ax];
            if idx[ax] < dims[ax] {
                break;
            }
            off -= strides[ax] * dims[ax];
            idx[ax] = 0;
        }
    }
    out
}

/// For every element of `out_dims`, the offset of the element of a
/// contiguous `in_dims` tensor that numpy broadcasting maps to it.
/// `in_dims` must be broadcastable to `out_dims` (checked by shape inference).
pub(crate) fn broadcast_offsets(out_dims: &[usize], in_dims: &[usize]) -> Vec<usize> {
    let r = out_dims.len();
    let lead = r.saturating_sub(in_dims.len());
    let in_strides = contiguous_strides(in_dims);
    let mut eff = vec![0usize; r];
    for (i, (&d, &s)) in in_dims.iter().zip(&in_strides).enumerate() {
        if d != 1 && i + lead < r {
            eff[i + lead] = s;
        }
    }
    strided_offsets(out_dims, &eff, 0)
}

/// Product of a dim list (1 for none).
pub(crate) fn prod(dims: &[usize]) -> usize {
    dims.iter().product()
}
