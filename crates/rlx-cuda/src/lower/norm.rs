//! LayerNorm / RmsNorm and their fused-residual forms (one warp or block per row), with the absorbed Add and gathers.

use super::cx::{wrong_op, Addr, Cx};
use crate::fuse::Fusion;
use crate::launch::{elementwise, int, Arg, Launch};
use crate::opcodes::bin_code;
use crate::store::Dt;
use rlx_ir::op::BinaryOp;
use rlx_ir::{DType, NodeId, Op};

#[allow(clippy::too_many_arguments)]
pub(super) fn norm<A: Addr>(
    cx: &Cx<'_, A>,
    nin: &NormIn,
    res: u64,
    bias: u64,
    gamma: u64,
    beta: u64,
    eps: f32,
    rms: bool,
    types: [Dt; 6],
) -> Result<Vec<Launch>, String> {
    let s = cx.shape(0);
    let d = s.last_dim();
    if s.numel() == 0 || d == 0 {
        return Ok(vec![]);
    }
    let rows = s.numel() / d;
    let warps = d.div_ceil(128).clamp(1, 32);
    let out = cx.out()?;
    let (x, add) = (nin.x, nin.add);
    let warp_kernel = norm_warp_kernel(d, [x, res, bias, gamma, beta, out], types).filter(|_| {
        add.is_none_or(|a| {
            a.numel.is_multiple_of(4) && a.ptr.is_multiple_of(4 * a.dt.size() as u64)
        })
    });
    let gathered = nin.gathers.iter().any(Option::is_some);
    // The variant that reads an absorbed Add or gathers (`_g`): the plain
    // one compiles without that code.
    let warp_kernel = warp_kernel.map(|name| match gathered || add.is_some() {
        false => Some(name),
        true => crate::mixed::KERNELS
            .iter()
            .copied()
            .find(|k| k.strip_suffix("_g") == Some(name)),
    });
    let warp_kernel = warp_kernel.flatten();
    if gathered && warp_kernel.is_none() {
        // fuse::norm only lets gathers feed norms this kernel runs; an
        // unaligned address is the one way here.
        return Err(format!(
            "rows of {d} values: a norm reading its gathers needs the one-warp kernel (4-element aligned operands)"
        ));
    }
    let mut launches = vec![];
    let x = match add {
        Some(a) if warp_kernel.is_none() => {
            // The absorbed Add first, into the output buffer; the norm then
            // runs in place (each value is read before it is written).
            let n = s.numel();
            launches.push(elementwise(
                "binary_mod_x",
                n,
                vec![
                    Arg::P(out),
                    Arg::P(x),
                    Arg::P(a.ptr),
                    Arg::L(n as i64),
                    Arg::L(n as i64),
                    Arg::L(a.numel as i64),
                    Arg::I(bin_code(BinaryOp::Add)),
                    Arg::I(types[1].code()),
                    Arg::I(types[1].code()),
                    Arg::I(a.dt.code()),
                ],
            ));
            out
        }
        _ => x,
    };
    let mut args = vec![
        Arg::P(out),
        Arg::P(x),
        Arg::P(res),
        Arg::P(bias),
        Arg::P(gamma),
        Arg::P(beta),
        Arg::I(int(rows, "rows")?),
        Arg::I(int(d, "width")?),
        Arg::F(eps),
        Arg::I(rms as i32),
    ];
    if let Some(name) = warp_kernel {
        let warps = if rows >= 1024 { 4 } else { 1 };
        args.push(Arg::P(add.map_or(0, |a| a.ptr)));
        args.push(Arg::L(add.map_or(1, |a| a.numel) as i64));
        args.push(Arg::I(add.map_or(0, |a| a.dt.code())));
        let [gx, gr] = nin.gathers;
        args.push(Arg::P(gx.map_or(0, |g| g.ids)));
        args.push(Arg::P(gr.map_or(0, |g| g.ids)));
        args.push(Arg::L(gx.map_or(0, |g| g.vocab) as i64));
        args.push(Arg::L(gr.map_or(0, |g| g.vocab) as i64));
        args.push(Arg::I(gx.is_some_and(|g| g.ids64) as i32));
        args.push(Arg::I(gr.is_some_and(|g| g.ids64) as i32));
        args.push(Arg::I(gx.map_or(0, |g| g.table_dt.code())));
        args.push(Arg::I(gr.map_or(0, |g| g.table_dt.code())));
        args.push(Arg::Status);
        args.push(Arg::I(gx.map_or(0, |g| g.node.0 as i32)));
        args.push(Arg::I(gr.map_or(0, |g| g.node.0 as i32)));
        return Ok(vec![Launch::Kernel {
            name,
            grid: [rows.div_ceil(warps) as u32, 1, 1],
            block: 32 * warps as u32,
            smem: 0,
            args,
        }]);
    }
    // The general kernel: one block per row, any mix of storage types.
    args.extend(types.iter().map(|t| Arg::I(t.code())));
    launches.push(Launch::Kernel {
        name: "norm_rows_x",
        grid: [int(rows, "rows")? as u32, 1, 1],
        block: 32 * warps as u32,
        smem: 0,
        args,
    });
    Ok(launches)
}

/// The second operand of an Add absorbed by a norm (see
/// [`crate::fuse::norm`]): its address, element count (it repeats as a
/// trailing block of the norm's input) and storage.
#[derive(Debug, Clone, Copy)]
pub(super) struct NormAdd {
    pub(super) ptr: u64,
    pub(super) numel: usize,
    pub(super) dt: Dt,
}

/// A Gather a norm reads in place (see [`crate::fuse::norm`]): the table's
/// address, rows and storage, the ids' address and width, and the
/// Gather's node (named by an out-of-range id).
#[derive(Debug, Clone, Copy)]
pub(super) struct NormGather {
    pub(super) table: u64,
    pub(super) vocab: usize,
    pub(super) table_dt: Dt,
    pub(super) ids: u64,
    pub(super) ids64: bool,
    pub(super) node: NodeId,
}

/// What a norm reads for its `x` (input 0): the address and storage of the
/// values, the Add it absorbed (its second operand), and the Gathers it
/// reads from their tables (for `x` or the Add's full operand, and for the
/// residual; a gathered operand's address is its table).
pub(super) struct NormIn {
    pub(super) x: u64,
    pub(super) tx: Dt,
    pub(super) add: Option<NormAdd>,
    pub(super) gathers: [Option<NormGather>; 2],
}

pub(super) fn norm_in<A: Addr>(cx: &Cx<'_, A>) -> Result<NormIn, String> {
    let Fusion::NormFeed(f) = cx.addr.fusion(cx.node.id) else {
        return Ok(NormIn {
            x: cx.input(0)?,
            tx: cx.dt_in(0),
            add: None,
            gathers: [None, None],
        });
    };
    let at = |id: NodeId| {
        cx.addr
            .addr(id)
            .ok_or_else(|| format!("norm input (node {id}) has no device address"))
    };
    let gather = |id: Option<NodeId>| -> Result<Option<NormGather>, String> {
        let Some(id) = id else { return Ok(None) };
        let n = cx.graph.node(id);
        let (table, ids) = (n.inputs[0], n.inputs[1]);
        Ok(Some(NormGather {
            table: at(table)?,
            vocab: cx.graph.node(table).shape.dims[0],
            table_dt: cx.addr.store(table).dt,
            ids: at(ids)?,
            ids64: cx.graph.node(ids).shape.dtype == DType::I64,
            node: cx.addr.graph_id(id),
        }))
    };
    let gathers = [gather(f.gathers[0])?, gather(f.gathers[1])?];
    let (full, add) = match f.add {
        Some(a) => {
            let add = NormAdd {
                ptr: at(a.other)?,
                numel: cx.graph.node(a.other).shape.numel(),
                dt: cx.addr.store(a.other).dt,
            };
            (a.full, Some(add))
        }
        None => (cx.node.inputs[0], None),
    };
    let x = match gathers[0] {
        Some(g) => g.table,
        None => at(full)?,
    };
    Ok(NormIn {
        x,
        tx: cx.addr.store(full).dt,
        add,
        gathers,
    })
}

/// The one-warp-per-row norm kernel for rows of `d` values, when x, the
/// residual and the output share a storage type T, bias / gamma / beta are
/// all f32 or all T, `d` is a multiple of 4 up to 1024, and every pointer
/// (`[x, res, bias, gamma, beta, out]`, 0 for absent) is aligned to 4
/// elements (the kernel moves 4 values per load). `types` is in the same
/// order as the general kernel's codes: out, x, res, bias, gamma, beta.
pub(super) fn norm_warp_kernel(d: usize, ptrs: [u64; 6], types: [Dt; 6]) -> Option<&'static str> {
    let [x, res, bias, gamma, beta, out] = ptrs;
    let [t_out, t, t_res, t_bias, t_gamma, t_beta] = types;
    let p = t_gamma;
    if !d.is_multiple_of(4) || d > 1024 || t_out != t || (res != 0 && t_res != t) {
        return None;
    }
    if !matches!(p, Dt::F32) && p != t || (bias != 0 && t_bias != p) || (beta != 0 && t_beta != p) {
        return None;
    }
    let aligned = |ptr: u64, dt: Dt| ptr.is_multiple_of(4 * dt.size() as u64);
    if ![(x, t), (res, t), (out, t), (bias, p), (gamma, p), (beta, p)]
        .iter()
        .all(|&(ptr, dt)| aligned(ptr, dt))
    {
        return None;
    }
    Some(match (t, p, d <= 512) {
        (Dt::F32, _, true) => "norm_warp_f32_f32_4",
        (Dt::F32, _, false) => "norm_warp_f32_f32_8",
        (Dt::Bf16, Dt::F32, true) => "norm_warp_bf16_f32_4",
        (Dt::Bf16, Dt::F32, false) => "norm_warp_bf16_f32_8",
        (Dt::Bf16, _, true) => "norm_warp_bf16_bf16_4",
        (Dt::Bf16, _, false) => "norm_warp_bf16_bf16_8",
        (Dt::F16, Dt::F32, true) => "norm_warp_f16_f32_4",
        (Dt::F16, Dt::F32, false) => "norm_warp_f16_f32_8",
        (Dt::F16, _, true) => "norm_warp_f16_f16_4",
        (Dt::F16, _, false) => "norm_warp_f16_f16_8",
    })
}

/// A `LayerNorm` or `RmsNorm` over the last axis.
pub(super) fn layer_norm<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let (Op::LayerNorm { axis, eps } | Op::RmsNorm { axis, eps }) = &node.op else {
        return Err(wrong_op(node));
    };
    let r = cx.shape(0).rank() as i32;
    if *axis != -1 && *axis != r - 1 {
        return Err(format!("axis {axis}: only the last axis is normalized"));
    }
    let rms = matches!(node.op, Op::RmsNorm { .. });
    let ins = node.inputs.len();
    for i in 0..ins {
        cx.f32_in(i)?;
    }
    let gamma = cx.input(1)?;
    let beta = if rms { 0 } else { cx.input(2)? };
    let nin = norm_in(cx)?;
    let types = [
        cx.dt_out(),
        nin.tx,
        Dt::F32,
        Dt::F32,
        cx.dt_in(1),
        if rms { Dt::F32 } else { cx.dt_in(2) },
    ];
    norm(cx, &nin, 0, 0, gamma, beta, *eps, rms, types)
}

/// A `FusedResidualLN` or `FusedResidualRmsNorm`.
pub(super) fn residual_norm<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let (Op::FusedResidualLN { has_bias, eps } | Op::FusedResidualRmsNorm { has_bias, eps }) =
        &node.op
    else {
        return Err(wrong_op(node));
    };
    let rms = matches!(node.op, Op::FusedResidualRmsNorm { .. });
    for i in 0..node.inputs.len() {
        cx.f32_in(i)?;
    }
    let mut i = 2;
    let bias = if *has_bias {
        i += 1;
        cx.input(2)?
    } else {
        0
    };
    let gamma = cx.input(i)?;
    let beta = if rms { 0 } else { cx.input(i + 1)? };
    if cx.shape(1).dims != cx.shape(0).dims {
        return Err(format!(
            "residual {} must match x {}",
            cx.shape(1),
            cx.shape(0)
        ));
    }
    let nin = norm_in(cx)?;
    let res = match nin.gathers[1] {
        Some(g) => g.table,
        None => cx.input(1)?,
    };
    let types = [
        cx.dt_out(),
        nin.tx,
        cx.dt_in(1),
        if *has_bias { cx.dt_in(2) } else { Dt::F32 },
        cx.dt_in(i),
        if rms { Dt::F32 } else { cx.dt_in(i + 1) },
    ];
    norm(cx, &nin, res, bias, gamma, beta, *eps, rms, types)
}
