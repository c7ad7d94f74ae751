//! Data movement: reshape (copy), expand, narrow, concat, transpose,
//! gather, cast. Generic over the element type where the op is.

use super::{bad_shape, exact_len, par_rows, In, KernelError, Out};
use rlx_ir::{broadcast_dims, DType, Shape};

/// Plain copy (Reshape): `out = a`.
pub fn copy<T: Copy>(a: &[T], out: &mut [T]) -> Result<(), KernelError> {
    exact_len("Reshape", "output", out.len(), a.len())?;
    out.copy_from_slice(a);
    Ok(())
}

/// `out[idx] = src[sum(idx[i] * strides[i])]` for every index of `dims`
/// (out contiguous), with dims coalesced and rows split over rayon.
/// The caller guarantees the strides stay inside `src`.
fn strided_copy<T: Copy + Send + Sync>(
    src: &[T],
    dims: &[usize],
    strides: &[usize],
    out: &mut [T],
) {
    let mut cd: Vec<(usize, usize)> = Vec::new();
    for (&n, &s) in dims.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        if let Some(last) = cd.last_mut() {
            if last.1 == s * n {
                *last = (last.0 * n, s);
                continue;
            }
        }
        cd.push((n, s));
    }
    let (inner, is) = cd.pop().unwrap_or((1, 1));
    if out.is_empty() {
        return;
    }
    par_rows(out, inner, inner, |r0, chunk| {
        for (ri, orow) in chunk.chunks_exact_mut(inner).enumerate() {
            let mut r = r0 + ri;
            let mut off = 0;
            for &(n, s) in cd.iter().rev() {
                off += (r % n) * s;
                r /= n;
            }
            match is {
                1 => orow.copy_from_slice(&src[off..off + inner]),
                0 => orow.fill(src[off]),
                _ => {
                    for (j, o) in orow.iter_mut().enumerate() {
                        *o = src[off + j * is];
                    }
                }
            }
        }
    });
}

/// Broadcast `a` (dims `a_dims`) to `out_dims` (numpy rules).
pub fn expand<T: Copy + Send + Sync>(
    a: &[T],
    a_dims: &[usize],
    out: &mut [T],
    out_dims: &[usize],
) -> Result<(), KernelError> {
    exact_len("Expand", "input", a.len(), a_dims.iter().product())?;
    exact_len("Expand", "output", out.len(), out_dims.iter().product())?;
    if broadcast_dims(a_dims, out_dims).as_deref() != Some(out_dims) {
        return Err(bad_shape(
            "Expand",
            format!("{a_dims:?} does not broadcast to {out_dims:?}"),
        ));
    }
    let r = out_dims.len();
    let mut full = vec![1; r - a_dims.len()];
    full.extend_from_slice(a_dims);
    let mut strides = vec![0; r];
    let mut acc = 1;
    for i in (0..r).rev() {
        strides[i] = if full[i] == 1 { 0 } else { acc };
        acc *= full[i];
    }
    strided_copy(a, out_dims, &strides, out);
    Ok(())
}

/// Keep indices `start..start+len` of `axis`.
pub fn narrow<T: Copy>(
    a: &[T],
    dims: &[usize],
    axis: usize,
    start: usize,
    len: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    if axis >= dims.len() || start + len > dims[axis] {
        return Err(bad_shape(
            "Narrow",
            format!("axis {axis}, start {start}, len {len} out of range for {dims:?}"),
        ));
    }
    exact_len("Narrow", "input", a.len(), dims.iter().product())?;
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let mid = dims[axis];
    exact_len("Narrow", "output", out.len(), outer * len * inner)?;
    let w = len * inner;
    if w == 0 {
        return Ok(());
    }
    for (o, orow) in out.chunks_exact_mut(w).enumerate() {
        let s = (o * mid + start) * inner;
        orow.copy_from_slice(&a[s..s + w]);
    }
    Ok(())
}

/// Concatenate `parts` (data, dims) along `axis` into `out`.
pub fn concat<T: Copy>(
    parts: &[(&[T], &[usize])],
    axis: usize,
    out: &mut [T],
) -> Result<(), KernelError> {
    let op = "Concat";
    let Some(&(_, first)) = parts.first() else {
        return Err(bad_shape(op, "no inputs"));
    };
    if axis >= first.len() {
        return Err(bad_shape(
            op,
            format!("axis {axis} out of range for {first:?}"),
        ));
    }
    let outer: usize = first[..axis].iter().product();
    let inner: usize = first[axis + 1..].iter().product();
    let mut total = 0;
    for (i, (data, d)) in parts.iter().enumerate() {
        let same = d.len() == first.len()
            && d.iter()
                .zip(first.iter())
                .enumerate()
                .all(|(j, (a, b))| j == axis || a == b);
        if !same {
            return Err(bad_shape(
                op,
                format!("input {i} dims {d:?} differ from {first:?} off axis {axis}"),
            ));
        }
        exact_len(op, &format!("input {i}"), data.len(), d.iter().product())?;
        total += d[axis];
    }
    exact_len(op, "output", out.len(), outer * total * inner)?;
    let row = total * inner;
    if row == 0 {
        return Ok(());
    }
    for (o, orow) in out.chunks_exact_mut(row).enumerate() {
        let mut at = 0;
        for (data, d) in parts {
            let w = d[axis] * inner;
            orow[at..at + w].copy_from_slice(&data[o * w..(o + 1) * w]);
            at += w;
        }
    }
    Ok(())
}

/// [`concat()`] over executor buffers of one element kind.
pub fn concat_any(
    inputs: &[In<'_>],
    shapes: &[&Shape],
    axis: usize,
    out: Out<'_>,
) -> Result<(), KernelError> {
    macro_rules! go {
        ($variant:ident, $o:expr) => {{
            let mut parts = Vec::with_capacity(inputs.len());
            for (i, (x, s)) in inputs.iter().zip(shapes).enumerate() {
                match x {
                    In::$variant(v) => parts.push((*v, s.dims.as_slice())),
                    other => {
                        return Err(KernelError::Unsupported {
                            op: "Concat",
                            what: format!(
                                "input {i} of kind {} with output {}",
                                other.kind(),
                                stringify!($variant)
                            ),
                        })
                    }
                }
            }
            concat(&parts, axis, $o)
        }};
    }
    if inputs.len() != shapes.len() {
        return Err(KernelError::Arity {
            op: "Concat",
            expected: shapes.len(),
            got: inputs.len(),
        });
    }
    match out {
        Out::F32(o) => go!(F32, o),
        Out::I32(o) => go!(I32, o),
        Out::I64(o) => go!(I64, o),
        Out::U8(o) => go!(U8, o),
    }
}

/// Permute axes: `out.dims[i] = dims[perm[i]]`.
pub fn transpose<T: Copy + Send + Sync>(
    a: &[T],
    dims: &[usize],
    perm: &[usize],
    out: &mut [T],
) -> Result<(), KernelError> {
    let r = dims.len();
    let mut seen = vec![false; r];
    if perm.len() != r
        || perm
            .iter()
            .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
    {
        return Err(bad_shape(
            "Transpose",
            format!("{perm:?} is not a permutation of {r} axes"),
        ));
    }
    exact_len("Transpose", "input", a.len(), dims.iter().product())?;
    exact_len("Transpose", "output", out.len(), dims.iter().product())?;
    let in_strides = rlx_ir::contiguous_strides(dims);
    let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let os: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    strided_copy(a, &od, &os, out);
    Ok(())
}

/// Row lookup: `out[i] = table[ids[i]]` for rows of `row` elements of a
/// `[vocab, row]` table. An id outside `0..vocab` is an error.
pub fn gather_rows<T: Copy + Send + Sync>(
    table: &[T],
    vocab: usize,
    row: usize,
    ids: &[i64],
    out: &mut [T],
) -> Result<(), KernelError> {
    exact_len("Gather", "table", table.len(), vocab * row)?;
    exact_len("Gather", "output", out.len(), ids.len() * row)?;
    if let Some(&bad) = ids.iter().find(|&&id| id < 0 || id as u64 >= vocab as u64) {
        return Err(KernelError::IndexOutOfRange {
            op: "Gather",
            index: bad,
            size: vocab,
        });
    }
    if row == 0 {
        return Ok(());
    }
    par_rows(out, row, row, |r0, chunk| {
        for (i, orow) in chunk.chunks_exact_mut(row).enumerate() {
            let id = ids[r0 + i] as usize;
            orow.copy_from_slice(&table[id * row..(id + 1) * row]);
        }
    });
    Ok(())
}

/// Convert element types. Float to integer truncates toward zero and
/// saturates (NaN -> 0, Rust `as`); anything to `Bool` is `x != 0`.
pub fn cast(input: &In<'_>, to: DType, out: Out<'_>) -> Result<(), KernelError> {
    exact_len("Cast", "output", out.len(), input.len())?;
    macro_rules! conv {
        ($src:expr, $dst:expr, |$x:ident| $e:expr) => {{
            for (o, &$x) in $dst.iter_mut().zip($src.iter()) {
                *o = $e;
            }
            Ok(())
        }};
    }
    if to == DType::Bool {
        let Out::U8(o) = out else {
            return Err(KernelError::Unsupported {
                op: "Cast",
                what: format!("a bool target in a {} buffer", out.kind()),
            });
        };
        return match input {
            In::F32(a) => conv!(a, o, |x| (x != 0.0) as u8),
            In::I32(a) => conv!(a, o, |x| (x != 0) as u8),
            In::I64(a) => conv!(a, o, |x| (x != 0) as u8),
            In::U8(a) => conv!(a, o, |x| (x != 0) as u8),
        };
    }
    match (input, out) {
        (In::F32(a), Out::F32(o)) => conv!(a, o, |x| x),
        (In::F32(a), Out::I32(o)) => conv!(a, o, |x| x as i32),
        (In::F32(a), Out::I64(o)) => conv!(a, o, |x| x as i64),
        (In::F32(a), Out::U8(o)) => conv!(a, o, |x| x as u8),
        (In::I32(a), Out::F32(o)) => conv!(a, o, |x| x as f32),
        (In::I32(a), Out::I32(o)) => conv!(a, o, |x| x),
        (In::I32(a), Out::I64(o)) => conv!(a, o, |x| x as i64),
        (In::I32(a), Out::U8(o)) => conv!(a, o, |x| x.clamp(0, 255) as u8),
        (In::I64(a), Out::F32(o)) => conv!(a, o, |x| x as f32),
        (In::I64(a), Out::I32(o)) => {
            conv!(a, o, |x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        }
        (In::I64(a), Out::I64(o)) => conv!(a, o, |x| x),
        (In::I64(a), Out::U8(o)) => conv!(a, o, |x| x.clamp(0, 255) as u8),
        (In::U8(a), Out::F32(o)) => conv!(a, o, |x| x as f32),
        (In::U8(a), Out::I32(o)) => conv!(a, o, |x| x as i32),
        (In::U8(a), Out::I64(o)) => conv!(a, o, |x| x as i64),
        (In::U8(a), Out::U8(o)) => conv!(a, o, |x| x),
    }
}

fn cache_geometry(
    cache_dims: &[usize],
    rows_dims: &[usize],
    pos: i64,
) -> Result<(usize, usize, usize, usize), KernelError> {
    let op = "CacheWrite";
    if cache_dims.len() != 3 || rows_dims.len() != 3 {
        return Err(bad_shape(
            op,
            format!("expected cache [B, ctx, D] and rows [B, n, D], got {cache_dims:?} and {rows_dims:?}"),
        ));
    }
    let (b, ctx, d) = (cache_dims[0], cache_dims[1], cache_dims[2]);
    let n = rows_dims[1];
    if rows_dims[0] != b || rows_dims[2] != d || n > ctx {
        return Err(bad_shape(
            op,
            format!("rows {rows_dims:?} do not fit cache {cache_dims:?}"),
        ));
    }
    if pos < 0 || pos as u64 + n as u64 > ctx as u64 {
        return Err(KernelError::IndexOutOfRange {
            op,
            index: pos,
            size: ctx - n + 1,
        });
    }
    Ok((b, ctx, d, n))
}

/// In-place KV-cache update: rows `pos..pos+n` along axis 1 of `cache
/// [B, ctx, D]` become `rows [B, n, D]`. Costs O(B * n * D). A position
/// with `pos + n > ctx` or `pos < 0` is an error.
pub fn cache_write_inplace(
    cache: &mut [f32],
    cache_dims: &[usize],
    rows: &[f32],
    rows_dims: &[usize],
    pos: i64,
) -> Result<(), KernelError> {
    let (b, ctx, d, n) = cache_geometry(cache_dims, rows_dims, pos)?;
    exact_len("CacheWrite", "cache", cache.len(), b * ctx * d)?;
    exact_len("CacheWrite", "rows", rows.len(), b * n * d)?;
    let p = pos as usize;
    if n * d == 0 {
        return Ok(());
    }
    for (bi, src) in rows.chunks_exact(n * d).enumerate() {
        let at = (bi * ctx + p) * d;
        cache[at..at + n * d].copy_from_slice(src);
    }
    Ok(())
}

/// Out-of-place `CacheWrite`: `out = cache` with rows `pos..pos+n` along
/// axis 1 replaced by `rows`.
pub fn cache_write(
    cache: &[f32],
    cache_dims: &[usize],
    rows: &[f32],
    rows_dims: &[usize],
    pos: i64,
    out: &mut [f32],
) -> Result<(), KernelError> {
    cache_geometry(cache_dims, rows_dims, pos)?;
    exact_len(
        "CacheWrite",
        "cache",
        cache.len(),
        cache_dims.iter().product(),
    )?;
    exact_len("CacheWrite", "output", out.len(), cache.len())?;
    out.copy_from_slice(cache);
    cache_write_inplace(out, cache_dims, rows, rows_dims, pos)
}
