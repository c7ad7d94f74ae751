//! Matrix multiplication through the `gemm` crate, batched with numpy
//! broadcasting of batch dims, and the bias + activation epilogue.

use super::elementwise::{apply_activation, binary_inplace};
use super::{bad_shape, exact_len, need_len, num_threads, KernelError, PAR_MIN_ELEMS};
use rayon::prelude::*;
use rlx_ir::{broadcast_dims, Activation, BinaryOp};

const OP: &str = "MatMul";

fn to_isize(v: usize, what: &str) -> Result<isize, KernelError> {
    isize::try_from(v).map_err(|_| bad_shape(OP, format!("{what} {v} does not fit in isize")))
}

/// Smallest slice length that holds every `(i, j)` with `i < rows`,
/// `j < cols` at `i * rs + j * cs` (rows, cols > 0).
fn span(rows: usize, rs: usize, cols: usize, cs: usize) -> Option<usize> {
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

/// `C[m, n] (+)= A[m, k] x B[k, n]` with arbitrary element strides for A
/// and B (`a[i * a_rs + p * a_cs]`, `b[p * b_rs + j * b_cs]`) and row-major
/// C with row stride `ldc`. With `accumulate` the product is added to C,
/// otherwise C is overwritten (its old contents, NaN included, are never
/// read). `parallel` lets gemm use the rayon pool.
///
/// Errors when a stride or slice length cannot hold the described matrix.
#[allow(clippy::too_many_arguments)]
pub fn gemm_strided(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    parallel: bool,
) -> Result<(), KernelError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if ldc < n {
        return Err(bad_shape(OP, format!("C row stride {ldc} < n {n}")));
    }
    let c_need = span(m, ldc, n, 1).ok_or_else(|| bad_shape(OP, "C extent overflows"))?;
    need_len(OP, "C", c.len(), c_need)?;
    if k == 0 {
        if !accumulate {
            for row in c.chunks_mut(ldc).take(m) {
                row[..n].fill(0.0);
            }
        }
        return Ok(());
    }
    let a_need = span(m, a_rs, k, a_cs).ok_or_else(|| bad_shape(OP, "A extent overflows"))?;
    let b_need = span(k, b_rs, n, b_cs).ok_or_else(|| bad_shape(OP, "B extent overflows"))?;
    need_len(OP, "A", a.len(), a_need)?;
    need_len(OP, "B", b.len(), b_need)?;
    let (a_rs, a_cs) = (
        to_isize(a_rs, "A row stride")?,
        to_isize(a_cs, "A col stride")?,
    );
    let (b_rs, b_cs) = (
        to_isize(b_rs, "B row stride")?,
        to_isize(b_cs, "B col stride")?,
    );
    let ldc_i = to_isize(ldc, "C row stride")?;
    let par = if parallel && num_threads() > 1 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: gemm reads A at `i * a_rs + p * a_cs` for i < m, p < k, whose
    // largest value is `a_need - 1 < a.len()` (checked above); likewise B at
    // `p * b_rs + j * b_cs <= b_need - 1 < b.len()`, and it writes C at
    // `i * ldc + j <= c_need - 1 < c.len()`. `ldc >= n` with column stride 1
    // means distinct (i, j) never alias, and C is a `&mut` slice that cannot
    // overlap the shared A and B borrows. All strides fit in isize and the
    // element type is f32, which gemm supports. C is only read when
    // `accumulate` is set (read_dst).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc_i,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// Row-major `C[m, n] (+)= A[m, k] x B[k, n]` with row strides `lda`,
/// `ldb`, `ldc` (each at least the row width). See [`gemm_strided`].
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    parallel: bool,
) -> Result<(), KernelError> {
    if lda < k || ldb < n {
        return Err(bad_shape(
            OP,
            format!("row strides lda {lda} / ldb {ldb} smaller than k {k} / n {n}"),
        ));
    }
    gemm_strided(m, n, k, a, lda, 1, b, ldb, 1, c, ldc, accumulate, parallel)
}

/// Row-major `C[m, n] (+)= A[m, k] x B^T` where `bt` is `[n, k]` with row
/// stride `ldbt` (e.g. `Q K^T` or a PyTorch-layout `[out, in]` weight).
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    bt: &[f32],
    ldbt: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    parallel: bool,
) -> Result<(), KernelError> {
    if lda < k || ldbt < k {
        return Err(bad_shape(
            OP,
            format!("row strides lda {lda} / ldbt {ldbt} smaller than k {k}"),
        ));
    }
    gemm_strided(
        m, n, k, a, lda, 1, bt, 1, ldbt, c, ldc, accumulate, parallel,
    )
}

/// Batched `[.., M, K] x [.., K, N] -> [.., M, N]` with broadcast batch
/// dims. A weight without batch dims folds every A batch into one big
/// gemm; many small batches run in parallel, one serial gemm each.
pub fn matmul(
    a: &[f32],
    a_dims: &[usize],
    b: &[f32],
    b_dims: &[usize],
    out: &mut [f32],
    out_dims: &[usize],
) -> Result<(), KernelError> {
    let (ra, rb) = (a_dims.len(), b_dims.len());
    if ra < 2 || rb < 2 {
        return Err(bad_shape(
            OP,
            format!("expected rank >= 2 operands, got {a_dims:?} x {b_dims:?}"),
        ));
    }
    let (m, k) = (a_dims[ra - 2], a_dims[ra - 1]);
    let (k2, n) = (b_dims[rb - 2], b_dims[rb - 1]);
    let batch = broadcast_dims(&a_dims[..ra - 2], &b_dims[..rb - 2]);
    let expected = batch.clone().map(|mut d| {
        d.extend([m, n]);
        d
    });
    if k != k2 || expected.as_deref() != Some(out_dims) {
        return Err(bad_shape(
            OP,
            format!("{a_dims:?} x {b_dims:?} does not give {out_dims:?}"),
        ));
    }
    let batch = batch.unwrap_or_default();
    exact_len(OP, "lhs", a.len(), a_dims.iter().product())?;
    exact_len(OP, "rhs", b.len(), b_dims.iter().product())?;
    exact_len(OP, "output", out.len(), out_dims.iter().product())?;
    let nb: usize = batch.iter().product();
    let b_batch: usize = b_dims[..rb - 2].iter().product();
    if nb == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    if b_batch == 1 {
        // Shared weight: fold all A batches into M.
        return gemm(nb * m, n, k, a, k, b, n, out, n, false, true);
    }
    // Broadcast strides (in matrices) of A and B over the output batch.
    let r = batch.len();
    let bstrides = |d: &[usize]| -> Vec<usize> {
        let mut full = vec![1; r - d.len()];
        full.extend_from_slice(d);
        let mut s = vec![0; r];
        let mut acc = 1;
        for i in (0..r).rev() {
            s[i] = if full[i] == 1 { 0 } else { acc };
            acc *= full[i];
        }
        s
    };
    let (sa, sb) = (bstrides(&a_dims[..ra - 2]), bstrides(&b_dims[..rb - 2]));
    let offsets = |bi: usize| -> (usize, usize) {
        let (mut rem, mut oa, mut ob) = (bi, 0, 0);
        for i in (0..r).rev() {
            let idx = rem % batch[i];
            rem /= batch[i];
            oa += idx * sa[i];
            ob += idx * sb[i];
        }
        (oa * m * k, ob * k * n)
    };
    let per = m.saturating_mul(n).saturating_mul(k);
    let threads = num_threads();
    let run_one = |bi: usize, c: &mut [f32], parallel: bool| -> Result<(), KernelError> {
        let (oa, ob) = offsets(bi);
        gemm(
            m,
            n,
            k,
            &a[oa..oa + m * k],
            k,
            &b[ob..ob + k * n],
            n,
            c,
            n,
            false,
            parallel,
        )
    };
    if threads > 1 && nb >= threads && per.saturating_mul(nb) >= PAR_MIN_ELEMS && per < (1 << 22) {
        out.par_chunks_mut(m * n)
            .enumerate()
            .try_for_each(|(bi, c)| run_one(bi, c, false))
    } else {
        for (bi, c) in out.chunks_mut(m * n).enumerate() {
            run_one(bi, c, per >= PAR_MIN_ELEMS)?;
        }
        Ok(())
    }
}

/// Epilogue on whole rows of width `bias.len()`: `row = act(row + bias)`.
/// A trailing partial row is left untouched (callers pass whole rows).
pub fn bias_act_rows(rows: &mut [f32], bias: &[f32], act: Option<Activation>) {
    let n = bias.len();
    if n == 0 {
        return;
    }
    for row in rows.chunks_exact_mut(n) {
        binary_inplace(BinaryOp::Add, row, bias);
        if let Some(act) = act {
            apply_activation(act, row);
        }
    }
}
