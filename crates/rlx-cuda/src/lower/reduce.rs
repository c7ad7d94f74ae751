//! Reductions, softmax and the fused masked mean pooling.

use super::cx::{wrong_op, Addr, Cx};
use crate::launch::{int, Arg, Launch};
use crate::opcodes::bin_code;
use crate::store::Dt;
use crate::views::bcast_strides;
use rlx_ir::op::ReduceOp;
use rlx_ir::{NodeId, Op};

/// The one launch of a fused GEMV group, at its root (`cx.node`).
/// A `Reduce`, optionally applying its input's `Binary` per element (the
/// binary's operands read through broadcast strides).
pub(super) fn reduce<A: Addr>(
    cx: &mut Cx<'_, A>,
    prologue: Option<&crate::fuse::reduce::ReducePrologue>,
) -> Result<Vec<Launch>, String> {
    let Op::Reduce { op, axes, .. } = &cx.node.op else {
        return Err(format!("node {} is not a Reduce", cx.node.id));
    };
    cx.f32_in(0)?;
    let src = cx.shape(0).clone();
    let n = cx.node.shape.numel();
    if n == 0 {
        return Ok(vec![]);
    }
    let (x, y, tx, ty, bop, sx, sy) = match prologue {
        None => {
            let st: Vec<i32> = src.strides().iter().map(|&s| s as i32).collect();
            let zero = vec![0; st.len()];
            (cx.input(0)?, 0, cx.dt_in(0), Dt::F32, 0, st, zero)
        }
        Some(f) => {
            let b = cx.graph.node(f.binary);
            let at = |id: NodeId| {
                cx.addr.addr(id).ok_or_else(|| {
                    format!("reduce prologue input (node {id}) has no device address")
                })
            };
            let (a, c) = (b.inputs[0], b.inputs[1]);
            let dims = |id: NodeId| cx.graph.node(id).shape.dims.clone();
            (
                at(a)?,
                at(c)?,
                cx.addr.store(a).dt,
                cx.addr.store(c).dt,
                bin_code(f.op),
                bcast_strides(&dims(a), &src.dims),
                bcast_strides(&dims(c), &src.dims),
            )
        }
    };
    let (mut kd, mut ks, mut ks2, mut rd, mut rs, mut rs2) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (i, &d) in src.dims.iter().enumerate() {
        if axes.contains(&i) {
            rd.push(int(d, "dim")?);
            rs.push(sx[i]);
            rs2.push(sy[i]);
        } else {
            kd.push(int(d, "dim")?);
            ks.push(sx[i]);
            ks2.push(sy[i]);
        }
    }
    let mut m = vec![kd.len() as i32];
    m.extend(&kd);
    m.extend(&ks);
    m.extend(&ks2);
    m.push(rd.len() as i32);
    m.extend(&rd);
    m.extend(&rs);
    m.extend(&rs2);
    let at = cx.push_meta(&m);
    let code = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
    };
    // One warp per output: the lanes share the reduced elements (a thread
    // per output serializes their loads). A few outputs over many elements
    // take a block each.
    let count = src.numel() / n;
    let last = src.rank().saturating_sub(1);
    let contiguous = !axes.contains(&last) && sx[last] == 1 && sy[last] <= 1;
    let (name, grid, block) = if n < 64 && count >= 256 {
        ("reduce_block_x", n as u32, 256)
    } else if contiguous && src.dims[last] >= 16 && n >= 2048 {
        // Consecutive outputs read consecutive elements: a warp per 32
        // outputs (coalesced), up to 8 warps splitting the reduced range.
        // Fewer outputs make too few blocks: at 384 outputs (MiniLM 1x128
        // pooling) the warp kernel took 5 us on the H200, this one 9.9.
        let warps = count.div_ceil(16).clamp(1, 8);
        ("reduce_cols_x", n.div_ceil(32) as u32, 32 * warps as u32)
    } else {
        ("reduce_warp_x", n.div_ceil(4) as u32, 128)
    };
    Ok(vec![Launch::Kernel {
        name,
        grid: [grid, 1, 1],
        block,
        smem: 0,
        args: vec![
            Arg::P(cx.out()?),
            Arg::P(x),
            Arg::P(y),
            Arg::L(n as i64),
            Arg::Meta(at),
            Arg::I(code),
            Arg::I(bop),
            Arg::I(cx.dt_out().code()),
            Arg::I(tx.code()),
            Arg::I(ty.code()),
        ],
    }])
}

/// A masked mean pooling with its optional L2 normalization (see
/// [`crate::fuse::pool`]): one `pool_mean_x` block per batch row, of
/// `groups` row groups of `cols` threads (a multiple of 32; at most 1024
/// threads in all). A thread sums every `groups`-th row of its columns
/// (4 per vector load where the width and alignment allow); the groups'
/// column sums meet in shared memory. One block reads the whole `S x H`
/// slice, so it is as wide as it can be: at 1 x 128 x 384 (bf16) one
/// column per thread over 64 rows each took 16.7 us on the H200.
pub(super) fn pool<A: Addr>(
    cx: &Cx<'_, A>,
    f: &crate::fuse::pool::Pool,
) -> Result<Vec<Launch>, String> {
    let at = |id: NodeId| {
        cx.addr
            .addr(id)
            .ok_or_else(|| format!("mean pooling input (node {id}) has no device address"))
    };
    let [b, s, h] = cx.graph.node(f.x).shape.dims[..] else {
        return Err(format!("mean pooling: node {} is not [B, S, H]", f.x));
    };
    let x = at(f.x)?;
    let v4 = h.is_multiple_of(4) && x.is_multiple_of(4 * cx.addr.store(f.x).dt.size() as u64);
    let items = if v4 { h / 4 } else { h };
    let cols = items.next_multiple_of(32).min(1024);
    let groups = (1024 / cols).clamp(1, s.max(1));
    let dt = |id: NodeId| cx.addr.store(id).dt.code();
    Ok(vec![Launch::Kernel {
        name: "pool_mean_x",
        grid: [int(b, "batch")? as u32, 1, 1],
        block: (cols * groups) as u32,
        smem: ((groups * h + 33) * 4) as u32,
        args: vec![
            Arg::P(cx.out()?),
            Arg::P(x),
            Arg::P(at(f.mask)?),
            Arg::P(at(f.count)?),
            Arg::I(int(s, "sequence")?),
            Arg::I(int(h, "width")?),
            Arg::F(f.tiny),
            Arg::F(f.eps.unwrap_or(0.0)),
            Arg::I(f.eps.is_some() as i32),
            Arg::I(int(groups, "groups")?),
            Arg::I(v4 as i32),
            Arg::I(cx.dt_out().code()),
            Arg::I(dt(f.x)),
            Arg::I(dt(f.mask)),
            Arg::I(dt(f.count)),
        ],
    }])
}

/// A `Softmax`.
pub(super) fn softmax<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Softmax { axis } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    cx.f32_in(0)?;
    let d = &out_shape.dims;
    if *axis >= d.len() {
        return Err(format!("axis {axis} out of range for {out_shape}"));
    }
    let outer: usize = d[..*axis].iter().product();
    let inner: usize = d[axis + 1..].iter().product();
    if n == 0 {
        return Ok(vec![]);
    }
    let threads = outer * inner;
    let mut args = vec![
        Arg::P(cx.out()?),
        Arg::P(cx.input(0)?),
        Arg::L(outer as i64),
        Arg::L(d[*axis] as i64),
        Arg::L(inner as i64),
    ];
    let name = if cx.half_any(1) {
        args.extend([Arg::I(cx.dt_out().code()), Arg::I(cx.dt_in(0).code())]);
        "softmax_x"
    } else {
        "softmax_f32"
    };
    Ok(vec![Launch::Kernel {
        name,
        grid: [threads.div_ceil(128) as u32, 1, 1],
        block: 128,
        smem: 0,
        args,
    }])
}
