//! Reductions (sum, mean, max, min) over any set of axes. Sums accumulate
//! in f64; max/min propagate NaN.

use super::{bad_shape, exact_len, KernelError};
use rlx_ir::ReduceOp;

/// Reduce `x` (dims `dims`) over `axes` (ascending, distinct) into `out`,
/// whose length is the product of the kept dims (`keep_dims` does not
/// change the layout).
pub fn reduce(
    op: ReduceOp,
    x: &[f32],
    dims: &[usize],
    axes: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let name = "Reduce";
    if axes.is_empty()
        || axes.windows(2).any(|w| w[0] >= w[1])
        || axes.iter().any(|&a| a >= dims.len())
    {
        return Err(bad_shape(
            name,
            format!(
                "axes {axes:?} must be ascending, distinct and < rank {}",
                dims.len()
            ),
        ));
    }
    exact_len(name, "x", x.len(), dims.iter().product())?;
    let kept: usize = dims
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .product();
    exact_len(name, "output", out.len(), kept)?;
    let count: usize = axes.iter().map(|&a| dims[a]).product();
    if count == 0 {
        let fill = match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Mean => f32::NAN,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        };
        out.fill(fill);
        return Ok(());
    }
    // Contiguous runs of reduced axes, reduced last run first.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &a in axes {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == a => r.1 = a,
            _ => runs.push((a, a)),
        }
    }
    let mut cur: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut cur_dims = dims.to_vec();
    for &(a0, a1) in runs.iter().rev() {
        let outer: usize = cur_dims[..a0].iter().product();
        let red: usize = cur_dims[a0..=a1].iter().product();
        let inner: usize = cur_dims[a1 + 1..].iter().product();
        let mut next = vec![0.0f64; outer * inner];
        for o in 0..outer {
            let dst = &mut next[o * inner..(o + 1) * inner];
            let src = &cur[o * red * inner..(o + 1) * red * inner];
            let mut rows = src.chunks_exact(inner);
            if let Some(first) = rows.next() {
                dst.copy_from_slice(first);
            }
            for row in rows {
                for (d, &v) in dst.iter_mut().zip(row) {
                    *d = match op {
                        ReduceOp::Sum | ReduceOp::Mean => *d + v,
                        ReduceOp::Max => {
                            if d.is_nan() || *d >= v {
                                *d
                            } else {
                                v
                            }
                        }
                        ReduceOp::Min => {
                            if d.is_nan() || *d <= v {
                                *d
                            } else {
                                v
                            }
                        }
                    };
                }
            }
        }
        cur = next;
        cur_dims.splice(a0..=a1, [1]);
    }
    let div = if op == ReduceOp::Mean {
        count as f64
    } else {
        1.0
    };
    for (o, &v) in out.iter_mut().zip(&cur) {
        *o = (v / div) as f32;
    }
    Ok(())
}
