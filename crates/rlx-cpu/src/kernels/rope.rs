//! Rotary position embedding on `[B, S, H*head_dim]`.
//!
//! For pair `i < n_rot/2` the angle is `pos * theta^(-2i/n_rot)`; NeoX
//! rotates `(x[i], x[i + n_rot/2])`, GPT-J `(x[2i], x[2i+1])`, as
//! `(a, b) -> (a cos - b sin, a sin + b cos)`. Dims `n_rot..head_dim` pass
//! through. Angles and their sin/cos are computed in f64 (positions can be
//! large), then rounded to f32.

use super::simd::simd_dispatch;
use super::{bad_shape, exact_len, par_rows, KernelError};
use rlx_ir::RopeStyle;
use std::cell::RefCell;
use std::sync::Arc;

const OP: &str = "Rope";

/// Rope attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Dims per head.
    pub head_dim: usize,
    /// Rotated dims per head (even, <= head_dim).
    pub n_rot: usize,
    /// Frequency base θ.
    pub theta: f32,
    /// Pairing style.
    pub style: RopeStyle,
    /// Per-pair frequency divisors (`n_rot / 2` of them; Llama 3 rope
    /// scaling): pair `i`'s angle is divided by `freqs[i]`.
    pub freqs: Option<Arc<[f32]>>,
}

impl RopeSpec {
    fn check(&self) -> Result<(), KernelError> {
        if let Some(f) = &self.freqs {
            if f.len() != self.n_rot / 2 {
                return Err(bad_shape(
                    OP,
                    format!(
                        "{} frequency divisors, expected n_rot / 2 = {}",
                        f.len(),
                        self.n_rot / 2
                    ),
                ));
            }
        }
        if self.head_dim == 0 || self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            return Err(bad_shape(
                OP,
                format!(
                    "expected even n_rot ({}) <= head_dim ({}) > 0",
                    self.n_rot, self.head_dim
                ),
            ));
        }
        Ok(())
    }
}

/// cos/sin tables `[positions.len(), n_rot/2]` for the given positions.
pub fn rope_tables(spec: &RopeSpec, positions: &[i64]) -> (Vec<f32>, Vec<f32>) {
    let half = spec.n_rot / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| {
            let div = spec
                .freqs
                .as_ref()
                .and_then(|f| f.get(i))
                .map_or(1.0, |&d| f64::from(d));
            (spec.theta as f64).powf(-2.0 * i as f64 / spec.n_rot as f64) / div
        })
        .collect();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for &f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

/// The last tables this thread made, with what they were made from.
struct CachedTables {
    theta: u32,
    freqs: Option<Arc<[f32]>>,
    n_rot: usize,
    positions: Vec<i64>,
    tables: Arc<(Vec<f32>, Vec<f32>)>,
}

thread_local! {
    static LAST_TABLES: RefCell<Option<CachedTables>> = const { RefCell::new(None) };
}

/// [`rope_tables`], reusing this thread's last tables when they were made
/// for the same θ, `n_rot` and positions: a model's Rope ops (q and k of
/// every layer) share one set per run instead of each computing
/// `positions x n_rot/2` f64 sines and cosines (~100 µs for 128 positions
/// at SmolLM2's 32 pairs, per op).
pub fn rope_tables_cached(spec: &RopeSpec, positions: &[i64]) -> Arc<(Vec<f32>, Vec<f32>)> {
    LAST_TABLES.with(|cell| {
        let mut last = cell.borrow_mut();
        if let Some(c) = last.as_ref() {
            if c.theta == spec.theta.to_bits()
                && c.n_rot == spec.n_rot
                && c.freqs == spec.freqs
                && c.positions == positions
            {
                return c.tables.clone();
            }
        }
        let tables = Arc::new(rope_tables(spec, positions));
        *last = Some(CachedTables {
            theta: spec.theta.to_bits(),
            freqs: spec.freqs.clone(),
            n_rot: spec.n_rot,
            positions: positions.to_vec(),
            tables: tables.clone(),
        });
        tables
    })
}

simd_dispatch! {
    fn rotate_row(x: &mut [f32], cos: &[f32], sin: &[f32], head_dim: usize, n_rot: usize, neox: bool) {
        let half = n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            if neox {
                let (a, b) = head[..n_rot].split_at_mut(half);
                for (((a, b), &c), &s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * c - x1 * s;
                    *b = x0 * s + x1 * c;
                }
            } else {
                for ((pair, &c), &s) in head[..n_rot].chunks_exact_mut(2).zip(cos).zip(sin) {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * c - x1 * s;
                    pair[1] = x0 * s + x1 * c;
                }
            }
        }
    }
}

/// Rotate rows in place (serial). `x` holds whole rows of `H*head_dim`
/// (`row_len`); row `r` uses table row `table_row(r)` of the `[.., n_rot/2]`
/// cos/sin tables. For the fused compiler: call on any row range.
pub fn rope_rows_inplace(
    spec: &RopeSpec,
    x: &mut [f32],
    row_len: usize,
    cos: &[f32],
    sin: &[f32],
    table_row: impl Fn(usize) -> usize,
) -> Result<(), KernelError> {
    spec.check()?;
    if !row_len.is_multiple_of(spec.head_dim) || row_len == 0 {
        return Err(bad_shape(
            OP,
            format!(
                "row length {row_len} is not a multiple of head_dim {}",
                spec.head_dim
            ),
        ));
    }
    exact_len(OP, "x", x.len(), x.len() / row_len * row_len)?;
    exact_len(OP, "sin table", sin.len(), cos.len())?;
    let half = spec.n_rot / 2;
    if half == 0 {
        return Ok(());
    }
    let trows = cos.len() / half;
    for (r, row) in x.chunks_exact_mut(row_len).enumerate() {
        let t = table_row(r);
        if t >= trows {
            return Err(KernelError::IndexOutOfRange {
                op: OP,
                index: t as i64,
                size: trows,
            });
        }
        rotate_row(
            row,
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
            spec.head_dim,
            spec.n_rot,
            spec.style == RopeStyle::NeoX,
        );
    }
    Ok(())
}

/// Rope on `x [batch, seq, H*head_dim]` into `out`; `positions` is `[seq]`
/// (shared by every batch) or `[batch, seq]`. Parallel over rows.
pub fn rope(
    spec: &RopeSpec,
    x: &[f32],
    batch: usize,
    seq: usize,
    positions: &[i64],
    out: &mut [f32],
) -> Result<(), KernelError> {
    spec.check()?;
    exact_len(OP, "output", out.len(), x.len())?;
    let rows = batch * seq;
    if rows == 0 {
        return Ok(());
    }
    let row_len = x.len() / rows;
    exact_len(OP, "x", x.len(), rows * row_len)?;
    if row_len == 0 || !row_len.is_multiple_of(spec.head_dim) {
        return Err(bad_shape(
            OP,
            format!(
                "row length {row_len} is not a multiple of head_dim {}",
                spec.head_dim
            ),
        ));
    }
    let per_batch = if positions.len() == seq {
        false
    } else if positions.len() == rows {
        true
    } else {
        return Err(bad_shape(
            OP,
            format!(
                "positions hold {} values, expected [{seq}] or [{batch}, {seq}]",
                positions.len()
            ),
        ));
    };
    let tables = rope_tables_cached(spec, positions);
    let (cos, sin) = (&tables.0, &tables.1);
    out.copy_from_slice(x);
    let first_err = std::sync::Mutex::new(None);
    par_rows(out, row_len, row_len * 2, |r0, chunk| {
        let map = |r: usize| {
            let g = r0 + r;
            if per_batch {
                g
            } else {
                g % seq
            }
        };
        if let Err(e) = rope_rows_inplace(spec, chunk, row_len, cos, sin, map) {
            if let Ok(mut slot) = first_err.lock() {
                *slot = Some(e);
            }
        }
    });
    match first_err.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache hands back tables equal to fresh ones, and makes new ones
    /// whenever θ, `n_rot` or the positions change.
    #[test]
    fn cached_tables_follow_their_inputs() {
        let spec = |theta: f32, n_rot: usize| RopeSpec {
            head_dim: 8,
            n_rot,
            theta,
            style: RopeStyle::NeoX,
            freqs: None,
        };
        let cases: [(RopeSpec, Vec<i64>); 5] = [
            (spec(10000.0, 8), vec![0, 1, 2]),
            (spec(10000.0, 8), vec![0, 1, 3]),
            (spec(10000.0, 8), vec![0, 1, 2]),
            (spec(500.0, 8), vec![0, 1, 2]),
            (spec(500.0, 4), vec![0, 1, 2]),
        ];
        for (s, pos) in cases.iter().chain(cases.iter().rev()) {
            let got = rope_tables_cached(s, pos);
            let want = rope_tables(s, pos);
            assert_eq!((&got.0, &got.1), (&want.0, &want.1), "{s:?} {pos:?}");
        }
        let a = rope_tables_cached(&cases[0].0, &cases[0].1);
        let b = rope_tables_cached(&cases[0].0, &cases[0].1);
        assert!(Arc::ptr_eq(&a, &b), "the same inputs reuse one set");
    }
}
