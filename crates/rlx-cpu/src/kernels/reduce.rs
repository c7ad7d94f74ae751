//! Reductions (sum, mean, max, min) over any set of axes. Sums accumulate
//! in f64; max/min propagate NaN.

use super::{bad_shape, exact_len, KernelError, PAR_MIN_ELEMS};
use rayon::prelude::*;
use rlx_ir::ReduceOp;

/// Columns per task of a one-run reduction.
const COL_BLOCK: usize = 64;

/// Fold `v` into the running value `d` (f64, NaN-propagating max/min).
#[inline(always)]
fn fold(op: ReduceOp, d: f64, v: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => d + v,
        ReduceOp::Max => {
            if d.is_nan() || d >= v {
                d
            } else {
                v
            }
        }
        ReduceOp::Min => {
            if d.is_nan() || d <= v {
                d
            } else {
                v
            }
        }
    }
}

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
    let div = if op == ReduceOp::Mean {
        count as f64
    } else {
        1.0
    };
    if out.is_empty() {
        return Ok(());
    }
    if let [(a0, a1)] = runs[..] {
        // One run of reduced axes (e.g. a sum over the sequence): read x in
        // place, in parallel over (outer, column block), the same f64
        // additions in the same order as the general path below.
        let red: usize = dims[a0..=a1].iter().product();
        let inner: usize = dims[a1 + 1..].iter().product();
        let task = |t: usize, dst: &mut [f32]| {
            let blocks = inner.div_ceil(COL_BLOCK);
            let (o, c0) = (t / blocks, t % blocks * COL_BLOCK);
            let mut acc = [0f64; COL_BLOCK];
            let acc = &mut acc[..dst.len()];
            let base = o * red * inner + c0;
            for (a, &v) in acc.iter_mut().zip(&x[base..base + dst.len()]) {
                *a = v as f64;
            }
            for r in 1..red {
                let row = &x[base + r * inner..base + r * inner + dst.len()];
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a = fold(op, *a, v as f64);
                }
            }
            for (d, a) in dst.iter_mut().zip(acc.iter()) {
                *d = (a / div) as f32;
            }
        };
        let chunks = out
            .chunks_mut(inner)
            .flat_map(|row| row.chunks_mut(COL_BLOCK));
        if x.len() >= PAR_MIN_ELEMS {
            chunks
                .enumerate()
                .collect::<Vec<_>>()
                .into_par_iter()
                .for_each(|(t, dst)| task(t, dst));
        } else {
            chunks.enumerate().for_each(|(t, dst)| task(t, dst));
        }
        return Ok(());
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
                    *d = fold(op, *d, v);
                }
            }
        }
        cur = next;
        cur_dims.splice(a0..=a1, [1]);
    }
    for (o, &v) in out.iter_mut().zip(&cur) {
        *o = (v / div) as f32;
    }
    Ok(())
}
