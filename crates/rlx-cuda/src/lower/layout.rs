//! Data movement: copies, strided copies (transpose, expand), gathers, narrow and concat.

use super::cx::{out_esz, wrong_op, Addr, Cx};
use crate::launch::{elementwise, int, Arg, Launch};
use crate::views::bcast_strides;
use rlx_ir::{DType, Op};

pub(super) fn same_or_copy<A: Addr>(
    cx: &Cx<'_, A>,
    input: usize,
    bytes: usize,
) -> Result<Vec<Launch>, String> {
    let (po, pi) = (cx.out()?, cx.input(input)?);
    if po == pi || bytes == 0 {
        return Ok(vec![]);
    }
    Ok(vec![Launch::Copy {
        dst: po,
        src: pi,
        bytes,
    }])
}

pub(super) fn strided<A: Addr>(
    cx: &mut Cx<'_, A>,
    m: Vec<i32>,
    n: usize,
    esz: usize,
) -> Result<Vec<Launch>, String> {
    if n == 0 {
        return Ok(vec![]);
    }
    let name = match esz {
        1 => "strided_copy1",
        2 => "strided_copy2",
        4 => "strided_copy4",
        8 => "strided_copy8",
        _ => return Err(format!("{esz}-byte elements have no strided copy kernel")),
    };
    let (po, pi) = (cx.out()?, cx.input(0)?);
    let at = cx.push_meta(&m);
    Ok(vec![elementwise(
        name,
        n,
        vec![Arg::P(po), Arg::P(pi), Arg::L(n as i64), Arg::Meta(at)],
    )])
}

/// Copy `rows` rows of `cols` bytes with pitches in bytes.
pub(super) fn copy_rows(
    dst: u64,
    src: u64,
    rows: usize,
    cols: usize,
    dpitch: usize,
    spitch: usize,
) -> Vec<Launch> {
    if rows == 0 || cols == 0 {
        return vec![];
    }
    if rows == 1 || (cols == dpitch && cols == spitch) {
        return vec![Launch::Copy {
            dst,
            src,
            bytes: rows * cols,
        }];
    }
    let words = [dst, src, cols as u64, dpitch as u64, spitch as u64]
        .iter()
        .all(|x| x % 4 == 0);
    let (name, unit) = if words {
        ("copy_rows4", 4)
    } else {
        ("copy_rows1", 1)
    };
    vec![elementwise(
        name,
        rows * cols / unit,
        vec![
            Arg::P(dst),
            Arg::P(src),
            Arg::L(rows as i64),
            Arg::L((cols / unit) as i64),
            Arg::L((dpitch / unit) as i64),
            Arg::L((spitch / unit) as i64),
        ],
    )]
}

/// A `Reshape` that is not a view: a copy.
pub(super) fn reshape<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let out_shape = &node.shape;
    let n = out_shape.numel();
    let esz = out_esz(cx);
    same_or_copy(cx, 0, n * esz)
}

/// An `Expand` (broadcast copy).
pub(super) fn expand<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Expand { shape } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    let esz = out_esz(cx);
    let src = cx.shape(0).clone();
    if *shape == src.dims {
        return same_or_copy(cx, 0, n * esz);
    }
    let mut m = vec![shape.len() as i32];
    for &d in shape {
        m.push(int(d, "dim")?);
    }
    m.extend(bcast_strides(&src.dims, shape));
    strided(cx, m, n, esz)
}

/// A `Transpose` (strided copy).
pub(super) fn transpose<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Transpose { perm } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    let esz = out_esz(cx);
    let src = cx.shape(0).clone();
    let st = src.strides();
    let mut m = vec![perm.len() as i32];
    for &d in &out_shape.dims {
        m.push(int(d, "dim")?);
    }
    for &p in perm {
        m.push(int(*st.get(p).ok_or("bad permutation")?, "stride")?);
    }
    strided(cx, m, n, esz)
}

/// A `Gather` (embedding lookup and friends).
pub(super) fn gather<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Gather { axis } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    if *axis != 0 {
        return Err(format!("axis {axis}: only axis 0 is defined"));
    }
    let table = cx.shape(0).clone();
    let ids = cx.shape(1).clone();
    if table.dtype == DType::F32 && cx.half_any(1) {
        if !ids.dtype.is_index() {
            return Err(format!("ids {ids}: expected i32 or i64"));
        }
        let vocab = table.dims.first().copied().unwrap_or(0);
        let row = table.numel().checked_div(vocab).unwrap_or(0);
        if n == 0 {
            return Ok(vec![]);
        }
        let (out, tab) = (cx.out()?, cx.input(0)?);
        let (to, tt) = (cx.dt_out(), cx.dt_in(0));
        let args = vec![
            Arg::P(out),
            Arg::P(tab),
            Arg::P(cx.input(1)?),
            Arg::L(ids.numel() as i64),
            Arg::I(int(row, "row")?),
            Arg::L(vocab as i64),
            Arg::I((ids.dtype == DType::I64) as i32),
            Arg::Status,
            Arg::I(cx.addr.graph_id(node.id).0 as i32),
            Arg::I(to.code()),
            Arg::I(tt.code()),
        ];
        // Rows of multiples of 4, aligned: a warp per row with
        // vector loads.
        if row.is_multiple_of(4)
            && out.is_multiple_of(4 * to.size() as u64)
            && tab.is_multiple_of(4 * tt.size() as u64)
        {
            return Ok(vec![Launch::Kernel {
                name: "gather_rows_x",
                grid: [ids.numel().div_ceil(4) as u32, 1, 1],
                block: 128,
                smem: 0,
                args,
            }]);
        }
        return Ok(vec![elementwise("gather_x", n, args)]);
    }
    if table.dtype.size_bytes() != 4 {
        return Err(format!(
            "table {table}: the CUDA gather takes 4-byte elements"
        ));
    }
    if !ids.dtype.is_index() {
        return Err(format!("ids {ids}: expected i32 or i64"));
    }
    let vocab = table.dims.first().copied().unwrap_or(0);
    let row = table.numel().checked_div(vocab).unwrap_or(0);
    if n == 0 {
        return Ok(vec![]);
    }
    Ok(vec![elementwise(
        "gather4",
        n,
        vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::P(cx.input(1)?),
            Arg::L(ids.numel() as i64),
            Arg::I(int(row, "row")?),
            Arg::L(vocab as i64),
            Arg::I((ids.dtype == DType::I64) as i32),
            Arg::Status,
            Arg::I(cx.addr.graph_id(node.id).0 as i32),
        ],
    )])
}

/// A `Narrow` that is not a view.
pub(super) fn narrow<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Narrow { axis, start, len } = &node.op else {
        return Err(wrong_op(node));
    };
    let _out_shape = &node.shape;
    let esz = out_esz(cx);
    if cx.addr.store(node.id).folded {
        // Attention reads the source in place (see `foldable_narrow`).
        return Ok(vec![]);
    }
    let src = cx.shape(0).clone();
    let outer: usize = src.dims[..*axis].iter().product();
    let inner: usize = src.dims[axis + 1..].iter().product::<usize>() * esz;
    let (po, pi) = (cx.out()?, cx.input(0)?);
    let off = (start * inner) as u64;
    if outer == 1 && po == pi + off {
        return Ok(vec![]);
    }
    Ok(copy_rows(
        po,
        pi + off,
        outer,
        len * inner,
        len * inner,
        src.dims[*axis] * inner,
    ))
}

/// A `Concat`.
pub(super) fn concat<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Concat { axis } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let esz = out_esz(cx);
    let outer: usize = out_shape.dims[..*axis].iter().product();
    let inner: usize = out_shape.dims[axis + 1..].iter().product::<usize>() * esz;
    let total = out_shape.dims[*axis] * inner;
    let po = cx.out()?;
    let mut v = Vec::new();
    let mut at = 0usize;
    for i in 0..node.inputs.len() {
        let w = cx.shape(i).dims[*axis] * inner;
        v.extend(copy_rows(po + at as u64, cx.input(i)?, outer, w, total, w));
        at += w;
    }
    Ok(v)
}
