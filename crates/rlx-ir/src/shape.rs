//! Static shapes.

use crate::DType;
use std::fmt;

/// A static shape: dimensions plus an element type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

impl Shape {
    /// A shape with the given dims and dtype.
    pub fn new(dims: &[usize], dtype: DType) -> Self {
        Shape {
            dims: dims.to_vec(),
            dtype,
        }
    }

    /// An f32 shape; shorthand used throughout tests and builders.
    pub fn f32(dims: &[usize]) -> Self {
        Shape::new(dims, DType::F32)
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements (1 for a scalar).
    ///
    /// Infallible for internal use on verified graphs: [`Graph::verify`]
    /// (run by every compile) rejects any node whose byte size overflows
    /// (see [`Shape::checked_size_bytes`]). On an unverified shape whose
    /// product overflows this saturates at `usize::MAX` instead of wrapping,
    /// so a wrapped (small) size can never be allocated by mistake.
    ///
    /// [`Graph::verify`]: crate::Graph::verify
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` when the product of the dims overflows
    /// `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Size in bytes, or `None` when it overflows or exceeds `isize::MAX`
    /// (the most one allocation can hold).
    pub fn checked_size_bytes(&self) -> Option<usize> {
        self.checked_numel()?
            .checked_mul(self.dtype.size_bytes())
            .filter(|&b| b <= isize::MAX as usize)
    }

    /// Size in bytes (saturating like [`Shape::numel`]; exact on verified
    /// graphs).
    pub fn size_bytes(&self) -> usize {
        self.checked_size_bytes().unwrap_or(usize::MAX)
    }

    /// The last dimension, or 1 for a scalar.
    pub fn last_dim(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// The same dims with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        Shape {
            dims: self.dims.clone(),
            dtype,
        }
    }

    /// The same dtype with other dims.
    pub fn with_dims(&self, dims: &[usize]) -> Self {
        Shape::new(dims, self.dtype)
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        contiguous_strides(&self.dims)
    }
}

/// Row-major strides (in elements) of a contiguous tensor with `dims`.
pub fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Numpy-style broadcast of two dim lists, or `None` when incompatible.
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return None;
        };
    }
    Some(out)
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
