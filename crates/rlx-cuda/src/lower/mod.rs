//! Lowering one node to device work: kernel launches, cuBLAS gemms and copies.
//!
//! Lowering is pure: it reads shapes and device addresses and produces a
//! list of [`Launch`]es. The same function checks capability (with dummy
//! addresses) and builds the real schedule.

use crate::fuse::cache::RopeCache;
use crate::fuse::gemv::GemvFusion;
use crate::fuse::Fusion;
use crate::launch::{activation_launch, elementwise, grid1, int, Arg, Epi, Gemm, Launch};
use crate::opcodes::{act_code, bin_code, dtype_code};
use crate::quant::{GemvExtra, Prologue};
use crate::store::{Dt, Store};
use crate::views::{bcast_strides, is_suffix, pad};
use rlx_ir::op::{Activation, BinaryOp, MaskKind, ReduceOp, RopeStyle};
use rlx_ir::{DType, Graph, Node, NodeId, Op, Shape};

/// Ranks above this need more metadata than the kernels read.
const MAX_RANK: usize = 8;

/// Where each node's data lives.
pub(crate) trait Addr {
    /// The device address of `id`'s data, if it has one.
    fn addr(&self, id: NodeId) -> Option<u64>;
    /// How `id` is stored (f32 and untransposed unless a plan says otherwise).
    fn store(&self, _id: NodeId) -> Store {
        Store::default()
    }
    /// Whether `id` belongs to a fused elementwise chain.
    fn fusion(&self, _id: NodeId) -> Fusion {
        Fusion::None
    }
    /// The id that device-side errors report for `id`: its id in the
    /// compiled graph (a segment's sub-graph numbers its nodes anew).
    fn graph_id(&self, id: NodeId) -> NodeId {
        id
    }
}

/// Addresses, a storage plan, the fusions and the parent ids of a
/// segment's nodes.
pub(crate) struct Env<F, S, C, P>(pub F, pub S, pub C, pub P);

impl<F, S, C, P> Addr for Env<F, S, C, P>
where
    F: Fn(NodeId) -> Option<u64>,
    S: Fn(NodeId) -> Store,
    C: Fn(NodeId) -> Fusion,
    P: Fn(NodeId) -> NodeId,
{
    fn graph_id(&self, id: NodeId) -> NodeId {
        (self.3)(id)
    }
    fn addr(&self, id: NodeId) -> Option<u64> {
        (self.0)(id)
    }
    fn store(&self, id: NodeId) -> Store {
        (self.1)(id)
    }
    fn fusion(&self, id: NodeId) -> Fusion {
        (self.2)(id)
    }
}

/// Addresses and a storage plan together.
pub(crate) struct WithStore<F, S>(pub F, pub S);

impl<F: Fn(NodeId) -> Option<u64>, S: Fn(NodeId) -> Store> Addr for WithStore<F, S> {
    fn addr(&self, id: NodeId) -> Option<u64> {
        (self.0)(id)
    }
    fn store(&self, id: NodeId) -> Store {
        (self.1)(id)
    }
}

impl<F: Fn(NodeId) -> Option<u64>> Addr for F {
    fn addr(&self, id: NodeId) -> Option<u64> {
        self(id)
    }
}

struct Cx<'a, A: Addr> {
    graph: &'a Graph,
    node: &'a Node,
    addr: &'a A,
    meta: &'a mut Vec<i32>,
}

impl<A: Addr> Cx<'_, A> {
    fn shape(&self, i: usize) -> &Shape {
        &self.graph.node(self.node.inputs[i]).shape
    }
    fn input(&self, i: usize) -> Result<u64, String> {
        let id = *self
            .node
            .inputs
            .get(i)
            .ok_or_else(|| format!("missing input {i}"))?;
        self.addr
            .addr(id)
            .ok_or_else(|| format!("input {i} (node {id}) has no device address"))
    }
    fn out(&self) -> Result<u64, String> {
        self.addr
            .addr(self.node.id)
            .ok_or_else(|| "output has no device address".to_string())
    }
    fn f32_in(&self, i: usize) -> Result<(), String> {
        let s = self.shape(i);
        if s.dtype != DType::F32 {
            return Err(format!("input {i} is {s}; the CUDA kernel takes f32"));
        }
        Ok(())
    }
    fn push_meta(&mut self, v: &[i32]) -> usize {
        let at = self.meta.len();
        self.meta.extend_from_slice(v);
        at
    }
    /// Storage element type of input `i`.
    fn dt_in(&self, i: usize) -> Dt {
        self.node
            .inputs
            .get(i)
            .map(|&id| self.addr.store(id).dt)
            .unwrap_or_default()
    }
    /// Storage element type of the output.
    fn dt_out(&self) -> Dt {
        self.addr.store(self.node.id).dt
    }
    /// Whether the output or any of the first `k` inputs is stored in 16 bits.
    fn half_any(&self, k: usize) -> bool {
        self.dt_out() != Dt::F32
            || (0..k.min(self.node.inputs.len())).any(|i| self.dt_in(i) != Dt::F32)
    }
}

/// Lower `node` of `graph`. `addr` gives device addresses; `meta` collects
/// metadata ints referenced by [`Arg::Meta`].
pub(crate) fn lower(
    graph: &Graph,
    node: &Node,
    addr: &impl Addr,
    meta: &mut Vec<i32>,
) -> Result<Vec<Launch>, String> {
    let mut cx = Cx {
        graph,
        node,
        addr,
        meta,
    };
    let out_shape = &node.shape;
    if node.shape.rank() > MAX_RANK {
        return Err(format!("rank {} > {MAX_RANK}", node.shape.rank()));
    }
    match cx.addr.fusion(node.id) {
        Fusion::None => {}
        Fusion::Interior => return Ok(vec![]),
        Fusion::Gemv(f) => return gemv_group(&cx, &f),
        Fusion::RopeCache(f) => return rope_cache(&cx, &f),
        Fusion::Reduce(f) => return reduce(&mut cx, Some(&f)),
        Fusion::Pool(f) => return pool(&cx, &f),
        Fusion::GemmNorm(f) => return gemm_norm(&mut cx, &f),
        // The norm's own lowering reads its absorbed Add and gathers (`norm_in`).
        Fusion::NormFeed(_) => {}
        Fusion::Done => return Ok(vec![]),
        Fusion::Root(c) => {
            let n = out_shape.numel();
            let mut args = vec![
                Arg::P(cx.out()?),
                Arg::L(n as i64),
                Arg::I(cx.dt_out().code()),
            ];
            for &l in &c.leaves {
                let a = cx
                    .addr
                    .addr(l)
                    .ok_or_else(|| format!("chain input (node {l}) has no device address"))?;
                let dt = cx.addr.store(l).dt;
                args.extend([
                    Arg::P(a),
                    Arg::L(graph.node(l).shape.numel().max(1) as i64),
                    Arg::I(dt.code()),
                ]);
            }
            return Ok(vec![Launch::Dyn {
                name: c.name.clone(),
                source: c.source.clone(),
                grid: grid1(n),
                block: 256,
                args,
            }]);
        }
    }
    let n = out_shape.numel();
    let esz = if out_shape.dtype == DType::F32 {
        cx.dt_out().size()
    } else {
        out_shape.dtype.size_bytes()
    };
    match &node.op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Ok(vec![]),
        Op::MatMul | Op::FusedMatMulBiasAct { .. } => {
            for i in 0..2 {
                cx.f32_in(i)?;
            }
            let (a, b) = (cx.shape(0).clone(), cx.shape(1).clone());
            if a.rank() < 2 || b.rank() < 2 {
                return Err(format!("operands {a} x {b}: rank >= 2 needed"));
            }
            let (m, k) = (a.dims[a.rank() - 2], a.dims[a.rank() - 1]);
            let nn = b.dims[b.rank() - 1];
            if b.dims[b.rank() - 2] != k {
                return Err(format!("operands {a} x {b}: inner dims differ"));
            }
            let ob = &out_shape.dims[..out_shape.rank() - 2];
            if n > 0 {
                if let Some(l) = small_gemm(&cx, &a, &b)? {
                    return Ok(vec![l]);
                }
            }
            let mut v = Vec::new();
            if n > 0 {
                v.extend(matmul(&cx, &a, &b, ob, m, k, nn)?);
            }
            if let Op::FusedMatMulBiasAct { activation } = &node.op {
                cx.f32_in(2)?;
                if cx.shape(2).numel() != nn {
                    return Err(format!("bias {} does not have {nn} elements", cx.shape(2)));
                }
                if n > 0 {
                    let (to, tb) = (cx.dt_out(), cx.dt_in(2));
                    let bias = cx.input(2)?;
                    // cuBLASLt applies the bias (and ReLU, or GELU in tanh
                    // form, which only the 16-bit modes accept for erf GELU)
                    // in the gemm kernel.
                    let (epi, rest) = match activation {
                        None => (Epi::Bias, None),
                        Some(Activation::Relu) => (Epi::ReluBias, None),
                        Some(Activation::GeluTanh) => (Epi::GeluBias, None),
                        Some(Activation::Gelu) if to != Dt::F32 => (Epi::GeluBias, None),
                        Some(a) => (Epi::Bias, Some(*a)),
                    };
                    let mut fused = false;
                    if let [Launch::Gemm(g)] = v.as_mut_slice() {
                        if tb == to {
                            g.epi = epi;
                            g.bias = bias;
                            g.bias_dt = tb;
                            g.act = act_code(if epi == Epi::Bias { None } else { *activation });
                            fused = true;
                        }
                    }
                    if fused {
                        if let Some(a) = rest {
                            v.push(activation_launch(cx.out()?, cx.out()?, n, a, to, to));
                        }
                    } else {
                        let mut args = vec![
                            Arg::P(cx.out()?),
                            Arg::P(bias),
                            Arg::L(n as i64),
                            Arg::I(int(nn, "N")?),
                            Arg::I(act_code(*activation)),
                        ];
                        let name = if to == Dt::F32 && tb == Dt::F32 {
                            "bias_act"
                        } else {
                            args.extend([Arg::I(to.code()), Arg::I(tb.code())]);
                            "bias_act_x"
                        };
                        v.push(elementwise(name, n, args));
                    }
                }
            }
            Ok(v)
        }
        Op::Activation(act) => {
            cx.f32_in(0)?;
            if n == 0 {
                return Ok(vec![]);
            }
            if cx.half_any(1) {
                return Ok(vec![activation_launch(
                    cx.out()?,
                    cx.input(0)?,
                    n,
                    *act,
                    cx.dt_out(),
                    cx.dt_in(0),
                )]);
            }
            Ok(vec![elementwise(
                "activation",
                n,
                vec![
                    Arg::P(cx.out()?),
                    Arg::P(cx.input(0)?),
                    Arg::L(n as i64),
                    Arg::I(act_code(Some(*act))),
                ],
            )])
        }
        Op::Binary(op) => {
            cx.f32_in(0)?;
            cx.f32_in(1)?;
            if n == 0 {
                return Ok(vec![]);
            }
            let (da, db) = (cx.shape(0).dims.clone(), cx.shape(1).dims.clone());
            let od = out_shape.dims.clone();
            if da.len() > od.len() || db.len() > od.len() {
                return Err("operand rank above output rank".into());
            }
            let (pa, pb, po) = (cx.input(0)?, cx.input(1)?, cx.out()?);
            let mixed = cx.half_any(2);
            let types = [
                Arg::I(cx.dt_out().code()),
                Arg::I(cx.dt_in(0).code()),
                Arg::I(cx.dt_in(1).code()),
            ];
            if is_suffix(&da, &od) && is_suffix(&db, &od) {
                let na: usize = da.iter().product();
                let nb: usize = db.iter().product();
                let mut args = vec![
                    Arg::P(po),
                    Arg::P(pa),
                    Arg::P(pb),
                    Arg::L(n as i64),
                    Arg::L(na.max(1) as i64),
                    Arg::L(nb.max(1) as i64),
                    Arg::I(bin_code(*op)),
                ];
                if mixed {
                    args.extend(types);
                    return Ok(vec![elementwise("binary_mod_x", n, args)]);
                }
                return Ok(vec![elementwise("binary_mod", n, args)]);
            }
            let mut m = vec![od.len() as i32];
            for &d in &od {
                m.push(int(d, "dim")?);
            }
            m.extend(bcast_strides(&da, &od));
            m.extend(bcast_strides(&db, &od));
            let at = cx.push_meta(&m);
            let mut args = vec![
                Arg::P(po),
                Arg::P(pa),
                Arg::P(pb),
                Arg::L(n as i64),
                Arg::Meta(at),
                Arg::I(bin_code(*op)),
            ];
            if mixed {
                args.extend(types);
                return Ok(vec![elementwise("binary_bcast_x", n, args)]);
            }
            Ok(vec![elementwise("binary_bcast", n, args)])
        }
        Op::LayerNorm { axis, eps } | Op::RmsNorm { axis, eps } => {
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
            let nin = norm_in(&cx)?;
            let types = [
                cx.dt_out(),
                nin.tx,
                Dt::F32,
                Dt::F32,
                cx.dt_in(1),
                if rms { Dt::F32 } else { cx.dt_in(2) },
            ];
            norm(&cx, &nin, 0, 0, gamma, beta, *eps, rms, types)
        }
        Op::FusedResidualLN { has_bias, eps } | Op::FusedResidualRmsNorm { has_bias, eps } => {
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
            let nin = norm_in(&cx)?;
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
            norm(&cx, &nin, res, bias, gamma, beta, *eps, rms, types)
        }
        Op::Reshape { .. } => same_or_copy(&cx, 0, n * esz),
        Op::Cast { to } => {
            let from = cx.shape(0).dtype;
            if *to == from {
                return same_or_copy(&cx, 0, n * esz);
            }
            let (Some(f), Some(t)) = (dtype_code(from), dtype_code(*to)) else {
                return Err(format!("cast {from} -> {to} has no CUDA kernel"));
            };
            if n == 0 {
                return Ok(vec![]);
            }
            Ok(vec![elementwise(
                "cast_kernel",
                n,
                vec![
                    Arg::P(cx.out()?),
                    Arg::P(cx.input(0)?),
                    Arg::L(n as i64),
                    Arg::I(f),
                    Arg::I(t),
                ],
            )])
        }
        Op::Expand { shape } => {
            let src = cx.shape(0).clone();
            if *shape == src.dims {
                return same_or_copy(&cx, 0, n * esz);
            }
            let mut m = vec![shape.len() as i32];
            for &d in shape {
                m.push(int(d, "dim")?);
            }
            m.extend(bcast_strides(&src.dims, shape));
            strided(&mut cx, m, n, esz)
        }
        Op::Transpose { perm } => {
            let src = cx.shape(0).clone();
            let st = src.strides();
            let mut m = vec![perm.len() as i32];
            for &d in &out_shape.dims {
                m.push(int(d, "dim")?);
            }
            for &p in perm {
                m.push(int(*st.get(p).ok_or("bad permutation")?, "stride")?);
            }
            strided(&mut cx, m, n, esz)
        }
        Op::Gather { axis } => {
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
        Op::Narrow { axis, start, len } => {
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
        Op::Concat { axis } => {
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
        Op::FusedSwiGLU { packed } => {
            for i in 0..node.inputs.len() {
                cx.f32_in(i)?;
            }
            let cols = out_shape.last_dim();
            let rows = n.checked_div(cols).unwrap_or(0);
            if n == 0 {
                return Ok(vec![]);
            }
            let up = if *packed { 0 } else { cx.input(1)? };
            Ok(vec![elementwise(
                "swiglu",
                n,
                vec![
                    Arg::P(cx.out()?),
                    Arg::P(cx.input(0)?),
                    Arg::P(up),
                    Arg::L(rows as i64),
                    Arg::L(cols as i64),
                    Arg::I(*packed as i32),
                ],
            )])
        }
        Op::Rope {
            head_dim,
            n_rot,
            theta,
            style,
        } => {
            cx.f32_in(0)?;
            let x = cx.shape(0).clone();
            let pos = cx.shape(1).clone();
            if x.rank() != 3 || *head_dim == 0 || !x.dims[2].is_multiple_of(*head_dim) {
                return Err(format!("x {x}: expected [B, S, H*{head_dim}]"));
            }
            if *n_rot > *head_dim || n_rot % 2 != 0 {
                return Err(format!(
                    "n_rot {n_rot} must be even and <= head_dim {head_dim}"
                ));
            }
            if !pos.dtype.is_index() {
                return Err(format!("positions {pos}: expected i32 or i64"));
            }
            let (b, s) = (x.dims[0], x.dims[1]);
            let pos_b = if pos.dims == [s] {
                0
            } else if pos.dims == [b, s] {
                1
            } else {
                return Err(format!("positions {pos}: expected [{s}] or [{b}, {s}]"));
            };
            if n == 0 {
                return Ok(vec![]);
            }
            Ok(vec![elementwise(
                "rope_f32",
                n,
                vec![
                    Arg::P(cx.out()?),
                    Arg::P(cx.input(0)?),
                    Arg::P(cx.input(1)?),
                    Arg::I(int(b, "batch")?),
                    Arg::I(int(s, "seq")?),
                    Arg::I(int(x.dims[2] / head_dim, "heads")?),
                    Arg::I(int(*head_dim, "head_dim")?),
                    Arg::I(int(*n_rot, "n_rot")?),
                    Arg::F(*theta),
                    Arg::I((*style == RopeStyle::GptJ) as i32),
                    Arg::I((pos.dtype == DType::I64) as i32),
                    Arg::I(pos_b),
                ],
            )])
        }
        Op::Attention {
            num_heads,
            head_dim,
            mask_kind,
            score_scale,
            attn_logit_softcap,
        } => attention(
            &cx,
            *num_heads,
            *head_dim,
            *mask_kind,
            *score_scale,
            *attn_logit_softcap,
        ),
        Op::Softmax { axis } => {
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
        Op::Reduce { .. } => reduce(&mut cx, None),
        Op::DequantMatMul {
            scheme,
            activations,
        } => {
            if *activations != rlx_ir::ActivationPrecision::F32 {
                return Err(format!(
                    "no CUDA kernel for DequantMatMul with {} activations (f32 only)",
                    activations.name()
                ));
            }
            cx.f32_in(0)?;
            let (x, w) = (cx.shape(0).clone(), cx.shape(1).clone());
            let k = x.last_dim();
            if w.dtype != DType::U8 || w.rank() != 2 || scheme.row_bytes(k) != Some(w.dims[1]) {
                return Err(format!(
                    "weights {w}: expected packed {} u8[N, row bytes] for K = {k}",
                    scheme.name()
                ));
            }
            let m = x.numel().checked_div(k).unwrap_or(0);
            crate::quant::dequant_matmul(
                *scheme,
                cx.out()?,
                cx.input(0)?,
                cx.input(1)?,
                m,
                w.dims[0],
                k,
                GemvExtra::default(),
            )
        }
        Op::CacheWrite { .. } => {
            cx.f32_in(0)?;
            cx.f32_in(1)?;
            if !matches!(graph.node(node.inputs[0]).op, Op::Param { .. }) {
                return Err("the cache (input 0) must be a Param: it is written in place".into());
            }
            let (c, r, p) = (
                cx.shape(0).clone(),
                cx.shape(1).clone(),
                cx.shape(2).clone(),
            );
            if c.rank() != 3 || r.rank() != 3 || !p.dtype.is_index() || p.numel() != 1 {
                return Err(format!(
                    "cache {c}, rows {r}, position {p}: expected [B, ctx, D], [B, n, D], [1]"
                ));
            }
            let cache = cx.input(0)?;
            let mut v = crate::kv::cache_write(&crate::kv::CacheWrite {
                cache,
                rows: cx.input(1)?,
                pos: cx.input(2)?,
                pos64: p.dtype == DType::I64,
                b: c.dims[0],
                ctx: c.dims[1],
                n: r.dims[1],
                d: c.dims[2],
                node: cx.addr.graph_id(node.id).0,
            })?;
            // In place, the output is the cache itself (the executor's
            // addresses); otherwise it also gets a copy of the updated cache.
            v.extend(same_or_copy(&cx, 0, n * esz)?);
            Ok(v)
        }
        Op::GatedDeltaNet { .. } | Op::Lstm { .. } => {
            Err(format!("no CUDA kernel for {}", node.op.name()))
        }
    }
}

fn same_or_copy<A: Addr>(
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

fn strided<A: Addr>(
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
fn copy_rows(
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

/// The one launch of a fused GEMV group, at its root (`cx.node`).
/// A `Reduce`, optionally applying its input's `Binary` per element (the
/// binary's operands read through broadcast strides).
fn reduce<A: Addr>(
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
fn pool<A: Addr>(cx: &Cx<'_, A>, f: &crate::fuse::pool::Pool) -> Result<Vec<Launch>, String> {
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

fn gemv_group<A: Addr>(cx: &Cx<'_, A>, f: &GemvFusion) -> Result<Vec<Launch>, String> {
    let g = cx.graph;
    let mm = g.node(f.matmul);
    let Op::DequantMatMul { scheme, .. } = mm.op else {
        return Err(format!(
            "fused GEMV group: node {} is not a DequantMatMul",
            mm.id
        ));
    };
    let at = |id: NodeId| {
        cx.addr
            .addr(id)
            .ok_or_else(|| format!("fused GEMV input (node {id}) has no device address"))
    };
    let xs = &g.node(mm.inputs[0]).shape;
    let k = xs.last_dim();
    let m = xs.numel().checked_div(k).unwrap_or(0);
    let (x, pro) = match f.prologue.map(|p| g.node(p)) {
        None => (at(mm.inputs[0])?, Prologue::None),
        Some(p) => match p.op {
            Op::RmsNorm { eps, .. } => (
                at(p.inputs[0])?,
                Prologue::RmsNorm {
                    gamma: at(p.inputs[1])?,
                    eps,
                },
            ),
            _ => (at(p.inputs[0])?, Prologue::SwiGlu),
        },
    };
    let (add, add_n) = match f.add {
        Some((_, o)) => (at(o)?, g.node(o).shape.numel()),
        None => (0, 0),
    };
    let extra = GemvExtra { pro, add, add_n };
    let n = mm.shape.last_dim();
    crate::quant::dequant_matmul(scheme, cx.out()?, x, at(mm.inputs[1])?, m, n, k, extra)
}

/// The one launch of a decode step's `Rope` (`cx.node`) with its cache
/// writes.
fn rope_cache<A: Addr>(cx: &Cx<'_, A>, f: &RopeCache) -> Result<Vec<Launch>, String> {
    let Op::Rope {
        head_dim,
        n_rot,
        theta,
        style,
    } = &cx.node.op
    else {
        return Err("a rope-and-cache launch on a node that is not a Rope".into());
    };
    let w = cx.shape(0).last_dim();
    if *head_dim == 0 || !w.is_multiple_of(*head_dim) || *n_rot > *head_dim || n_rot % 2 != 0 {
        return Err(format!(
            "x {}: expected heads of {head_dim} and an even n_rot <= head_dim (n_rot {n_rot})",
            cx.shape(0)
        ));
    }
    let g = cx.graph;
    let at = |id: NodeId| {
        cx.addr
            .addr(id)
            .ok_or_else(|| format!("cache write input (node {id}) has no device address"))
    };
    // (cache address, [1, ctx, d] dims, node id) of a write.
    let cache = |id: NodeId| -> Result<(u64, usize, usize, i32), String> {
        let c = g.node(g.node(id).inputs[0]);
        let node = int(cx.addr.graph_id(id).index(), "node")?;
        Ok((at(c.id)?, c.shape.dims[1], c.shape.dims[2], node))
    };
    let (k, col) = f.k;
    let (c0, ctx0, d0, node0) = cache(k)?;
    if col + d0 > w {
        return Err(format!(
            "cache rows {col}..{} outside the roped row of {w}",
            col + d0
        ));
    }
    let (c1, s1, ctx1, d1, node1) = match f.v {
        Some(v) => {
            let (c, ctx, d, node) = cache(v)?;
            (c, at(g.node(v).inputs[1])?, ctx, d, node)
        }
        None => (0, 0, 0, 0, 0),
    };
    let pos = g.node(cx.node.inputs[1]);
    if !pos.shape.dtype.is_index() {
        return Err(format!("positions {}: expected i32 or i64", pos.shape));
    }
    let threads = w.max(d1);
    Ok(vec![Launch::Kernel {
        name: "rope_cache_row",
        grid: [threads.div_ceil(128) as u32, 1, 1],
        block: 128,
        smem: 0,
        args: vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::P(cx.input(1)?),
            Arg::I((pos.shape.dtype == DType::I64) as i32),
            Arg::I(int(w, "row")?),
            Arg::I(int(*head_dim, "head_dim")?),
            Arg::I(int(*n_rot, "n_rot")?),
            Arg::F(*theta),
            Arg::I((*style == RopeStyle::GptJ) as i32),
            Arg::P(c0),
            Arg::I(int(col, "column")?),
            Arg::I(int(d0, "width")?),
            Arg::I(int(ctx0, "ctx")?),
            Arg::I(node0),
            Arg::P(c1),
            Arg::P(s1),
            Arg::I(int(d1, "width")?),
            Arg::I(int(ctx1, "ctx")?),
            Arg::I(node1),
            Arg::Status,
        ],
    }])
}

/// A 16-bit matmul (with its bias and activation) of at most
/// [`crate::fuse::norm::MAX_ROWS`] rows against an `[out, in]` weight as one
/// `gemm_pf` launch: 16-row tiles over the whole K, the weight rows loaded
/// before the kernel waits for the previous one (see
/// [`crate::mixed::gemm_pf_kernel`]). `None` where the shapes, storage or
/// alignment do not fit (cuBLASLt takes those).
fn small_gemm<A: Addr>(cx: &Cx<'_, A>, a: &Shape, b: &Shape) -> Result<Option<Launch>, String> {
    let (k, n) = (a.last_dim(), b.last_dim());
    let t = cx.dt_out();
    let rows = a.numel() / k.max(1);
    // A transposed store is an uploaded weight: no kernel writes it, which
    // is what lets the kernel read it before waiting on the previous grids.
    let fits = cx.addr.store(cx.node.id).own_gemm
        && t != Dt::F32
        && b.rank() == 2
        && cx.addr.store(cx.node.inputs[1]).transposed
        && !cx.addr.store(cx.node.inputs[0]).folded
        && cx.dt_in(0) == t
        && cx.dt_in(1) == t
        && (1..=crate::fuse::norm::MAX_ROWS).contains(&rows)
        && k > 0
        && k.is_multiple_of(64);
    if !fits {
        return Ok(None);
    }
    let Some((name, bn)) = crate::mixed::gemm_pf_kernel(t, rows, k, n) else {
        return Ok(None);
    };
    let (pa, pw, out) = (cx.input(0)?, cx.input(1)?, cx.out()?);
    if ![pa, pw, out].iter().all(|p| p.is_multiple_of(16)) {
        return Ok(None);
    }
    let (bias, tb, act) = match &cx.node.op {
        Op::FusedMatMulBiasAct { activation } => {
            if cx.shape(2).numel() != n {
                return Err(format!("bias {} does not have {n} elements", cx.shape(2)));
            }
            (cx.input(2)?, cx.dt_in(2), act_code(*activation))
        }
        _ => (0, Dt::F32, act_code(None)),
    };
    Ok(Some(Launch::Kernel {
        name,
        grid: [(n / bn) as u32, rows.div_ceil(16) as u32, 1],
        block: 128,
        smem: crate::mixed::gemm_pf_smem(bn, k) as u32,
        args: vec![
            Arg::P(out),
            Arg::P(pa),
            Arg::P(pw),
            Arg::P(bias),
            Arg::I(int(rows, "M")?),
            Arg::I(int(n, "N")?),
            Arg::I(int(k, "K")?),
            Arg::I(int(k, "K")?),
            Arg::I(act),
            Arg::I(tb.code()),
        ],
    }))
}

/// A matmul and the `FusedResidualLN` reading it (`cx` is the norm's) as
/// one `gemm_ln` launch; where an operand is not aligned for the kernel's
/// vector loads, the matmul writes the norm's output buffer and the norm
/// runs in place after it.
fn gemm_norm<A: Addr>(
    cx: &mut Cx<'_, A>,
    f: &crate::fuse::norm::GemmNorm,
) -> Result<Vec<Launch>, String> {
    let Op::FusedResidualLN { has_bias, eps } = cx.node.op else {
        return Err(format!("node {} is not a FusedResidualLN", cx.node.id));
    };
    let graph = cx.graph;
    let mm = graph.node(f.matmul);
    let at = |id: NodeId| {
        cx.addr
            .addr(id)
            .ok_or_else(|| format!("matmul-norm input (node {id}) has no device address"))
    };
    let (a, w, r) = (mm.inputs[0], mm.inputs[1], cx.node.inputs[1 - f.pos]);
    let k = graph.node(a).shape.last_dim();
    let n = cx.node.shape.last_dim();
    let m = graph.node(a).shape.numel() / k;
    let bias = mm.inputs.get(2).copied();
    let ln_bias = has_bias.then(|| cx.node.inputs[2]);
    let gi = 2 + has_bias as usize;
    let (gamma, beta) = (cx.node.inputs[gi], cx.node.inputs[gi + 1]);
    let opt = |id: Option<NodeId>| id.map_or(Ok(0), at);
    let code = |id: Option<NodeId>| id.map_or(0, |i| cx.addr.store(i).dt.code());
    let t = cx.dt_out();
    let out = cx.out()?;
    let (pa, pw, pr) = (at(a)?, at(w)?, at(r)?);
    if pa.is_multiple_of(16)
        && pw.is_multiple_of(16)
        && pr.is_multiple_of(8)
        && out.is_multiple_of(8)
    {
        let name = match t {
            Dt::Bf16 => "gemm_ln_bf16",
            Dt::F16 => "gemm_ln_f16",
            Dt::F32 => return Err("gemm_ln needs 16-bit storage".into()),
        };
        let (tiles, blocks) = (m.div_ceil(16), n / 32);
        let stats = cx.push_meta(&vec![0; tiles * blocks * 32]);
        let counters = cx.push_meta(&vec![0; tiles]);
        let args = vec![
            Arg::P(out),
            Arg::P(pa),
            Arg::P(pw),
            Arg::P(opt(bias)?),
            Arg::P(pr),
            Arg::P(opt(ln_bias)?),
            Arg::P(at(gamma)?),
            Arg::P(at(beta)?),
            Arg::I(int(m, "M")?),
            Arg::I(int(n, "N")?),
            Arg::I(int(k, "K")?),
            Arg::I(int(k, "K")?),
            Arg::F(eps),
            Arg::I(code(bias)),
            Arg::I(code(ln_bias)),
            Arg::I(code(Some(gamma))),
            Arg::I(code(Some(beta))),
            Arg::Meta(stats),
            Arg::Meta(counters),
        ];
        return Ok(vec![Launch::Kernel {
            name,
            grid: [blocks as u32, tiles as u32, 1],
            block: 128,
            smem: 0,
            args,
        }]);
    }
    let (ki, ni, mi) = (int(k, "K")?, int(n, "N")?, int(m, "M")?);
    let mut v = vec![Launch::Gemm(Gemm {
        m: ni,
        n: mi,
        k: ki,
        a: pw,
        lda: ki,
        sa: 0,
        b: pa,
        ldb: ki,
        sb: 0,
        c: out,
        ldc: ni,
        sc: 0,
        batch: 1,
        ta: true,
        dt: [t, t, t],
        tf32: false,
        epi: if bias.is_some() { Epi::Bias } else { Epi::None },
        bias: opt(bias)?,
        bias_dt: t,
        act: act_code(None),
    })];
    let types = [t, t, t, cx.dt_in(2), cx.dt_in(gi), cx.dt_in(gi + 1)];
    let x_in = NormIn {
        x: out,
        tx: t,
        add: None,
        gathers: [None, None],
    };
    v.extend(norm(
        cx,
        &x_in,
        pr,
        opt(ln_bias)?,
        at(gamma)?,
        at(beta)?,
        eps,
        false,
        types,
    )?);
    Ok(v)
}

#[allow(clippy::too_many_arguments)]
fn norm<A: Addr>(
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
        // fuse_norm only lets gathers feed norms this kernel runs; an
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
struct NormAdd {
    ptr: u64,
    numel: usize,
    dt: Dt,
}

/// A Gather a norm reads in place (see [`crate::fuse::norm`]): the table's
/// address, rows and storage, the ids' address and width, and the
/// Gather's node (named by an out-of-range id).
#[derive(Debug, Clone, Copy)]
struct NormGather {
    table: u64,
    vocab: usize,
    table_dt: Dt,
    ids: u64,
    ids64: bool,
    node: NodeId,
}

/// What a norm reads for its `x` (input 0): the address and storage of the
/// values, the Add it absorbed (its second operand), and the Gathers it
/// reads from their tables (for `x` or the Add's full operand, and for the
/// residual; a gathered operand's address is its table).
struct NormIn {
    x: u64,
    tx: Dt,
    add: Option<NormAdd>,
    gathers: [Option<NormGather>; 2],
}

fn norm_in<A: Addr>(cx: &Cx<'_, A>) -> Result<NormIn, String> {
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
fn norm_warp_kernel(d: usize, ptrs: [u64; 6], types: [Dt; 6]) -> Option<&'static str> {
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

#[allow(clippy::too_many_arguments)]
fn matmul<A: Addr>(
    cx: &Cx<'_, A>,
    a: &Shape,
    b: &Shape,
    ob: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<Launch>, String> {
    let (pa, pb, pc) = (cx.input(0)?, cx.input(1)?, cx.out()?);
    let ab = &a.dims[..a.rank() - 2];
    let bb = &b.dims[..b.rank() - 2];
    let (an, bn, on): (usize, usize, usize) = (
        ab.iter().product(),
        bb.iter().product(),
        ob.iter().product(),
    );
    let (ki, ni) = (int(k, "K")?, int(n, "N")?);
    int(m, "M")?;
    let dt = [cx.dt_in(1), cx.dt_in(0), cx.dt_out()];
    let [sz_b, sz_a, sz_c] = dt.map(|d| d.size());
    if k == 0 {
        return Ok(vec![Launch::Zero {
            dst: pc,
            bytes: on * m * n * sz_c,
        }]);
    }
    // A weight stored `[out, in]` is column-major `K x N`: op(A) = A^T.
    let ta = cx.addr.store(cx.node.inputs[1]).transposed;
    if ta && !(bn == 1 && an == on) {
        return Err(format!("transposed weight {b} with batched operand {a}"));
    }
    // Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T.
    let g = |rows: usize,
             a_off: u64,
             b_off: u64,
             c_off: u64,
             sa: i64,
             sb: i64,
             batch: usize|
     -> Result<Launch, String> {
        Ok(Launch::Gemm(Gemm {
            m: ni,
            n: int(rows, "M")?,
            k: ki,
            a: pb + b_off,
            lda: if ta { ki } else { ni },
            sa: sb,
            b: pa + a_off,
            ldb: ki,
            sb: sa,
            c: pc + c_off,
            ldc: ni,
            sc: (m * n) as i64,
            batch: int(batch, "batch")?,
            ta,
            dt,
            tf32: false,
            epi: Epi::None,
            bias: 0,
            bias_dt: Dt::F32,
            act: act_code(None),
        }))
    };
    if bn == 1 && an == on {
        return Ok(vec![g(on * m, 0, 0, 0, 0, 0, 1)?]);
    }
    if an == on && bn == on {
        return Ok(vec![g(m, 0, 0, 0, (m * k) as i64, (k * n) as i64, on)?]);
    }
    if an == 1 && bn == on {
        return Ok(vec![g(m, 0, 0, 0, 0, (k * n) as i64, on)?]);
    }
    if on > 4096 {
        return Err(format!("{on} broadcast batches: too many separate gemms"));
    }
    let sa_ = bcast_strides(ab, ob);
    let sb_ = bcast_strides(bb, ob);
    let mut v = Vec::with_capacity(on);
    for idx in 0..on {
        let (mut r, mut ia, mut ib) = (idx, 0usize, 0usize);
        for d in (0..ob.len()).rev() {
            let c = r % ob[d];
            r /= ob[d];
            ia += c * sa_[d] as usize;
            ib += c * sb_[d] as usize;
        }
        v.push(g(
            m,
            (ia * m * k * sz_a) as u64,
            (ib * k * n * sz_b) as u64,
            (idx * m * n * sz_c) as u64,
            0,
            0,
            1,
        )?);
    }
    Ok(v)
}

fn attention<A: Addr>(
    cx: &Cx<'_, A>,
    hq: usize,
    d: usize,
    kind: MaskKind,
    scale: Option<f32>,
    softcap: Option<f32>,
) -> Result<Vec<Launch>, String> {
    for i in 0..3 {
        cx.f32_in(i)?;
    }
    let (q, k) = (cx.shape(0).clone(), cx.shape(1).clone());
    if q.rank() != 3 || k.rank() != 3 || d == 0 || hq == 0 {
        return Err(format!("q {q}, k {k}: expected [B, S, H*D]"));
    }
    if d > 128 {
        return Err(format!(
            "head_dim {d} > 128 is not supported by the CUDA attention kernel"
        ));
    }
    let (b, sq, sk) = (q.dims[0], q.dims[1], k.dims[1]);
    let hkv = k.dims[2] / d;
    if q.dims[2] != hq * d || hkv == 0 || k.dims[2] != hkv * d || !hq.is_multiple_of(hkv) {
        return Err(format!(
            "q {q}, k {k}: heads {hq} x {d} do not divide into kv heads"
        ));
    }
    let (mut mk, mut window, mut mask, mut bs) = (0, 0usize, 0u64, [0i32; 4]);
    match kind {
        MaskKind::None => {}
        MaskKind::Causal => mk = 1,
        MaskKind::SlidingWindow(w) => {
            if w == 0 {
                return Err("sliding window of 0 keys".into());
            }
            mk = 2;
            window = w;
        }
        MaskKind::Custom => {
            let ms = cx.shape(3).clone();
            if ms.numel() != b * sk {
                return Err(format!("keep-mask {ms}: expected [{b}, {sk}]"));
            }
            mk = match ms.dtype {
                DType::F32 => 3,
                DType::U8 | DType::Bool => 4,
                _ => return Err(format!("keep-mask {ms}: expected f32 or u8/bool")),
            };
            mask = cx.input(3)?;
        }
        MaskKind::Bias => {
            cx.f32_in(3)?;
            let ms = cx.shape(3).clone();
            if ms.rank() > 4 {
                return Err(format!("bias {ms}: rank above 4"));
            }
            let full = [b, hq, sq, sk];
            let p = pad(&ms.dims, 4);
            if p.iter().zip(&full).any(|(&x, &f)| x != 1 && x != f) {
                return Err(format!(
                    "bias dims {:?} do not broadcast to {full:?}",
                    ms.dims
                ));
            }
            let st = bcast_strides(&p, &full);
            bs.copy_from_slice(&st);
            mk = 5;
            mask = cx.input(3)?;
        }
    }
    if sq == 0 || b == 0 {
        return Ok(vec![]);
    }
    if hq > 65535 || b > 65535 {
        return Err(format!("grid of {hq} heads x {b} batches is too large"));
    }
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let (qw, kw) = (hq * d, hkv * d);
    // A folded Narrow is read in place: its rows are its source's rows.
    let row = |i: usize, w: usize| -> usize {
        let id = cx.node.inputs[i];
        if cx.addr.store(id).folded {
            cx.graph.node(cx.graph.node(id).inputs[0]).shape.dims[2]
        } else {
            w
        }
    };
    let (qs, ks, vs) = (row(0, qw), row(1, kw), row(2, kw));
    let mut args = vec![
        Arg::P(cx.input(0)?),
        Arg::P(cx.input(1)?),
        Arg::P(cx.input(2)?),
        Arg::P(cx.out()?),
        Arg::I(int(qs, "q row stride")?),
        Arg::I(int(ks, "k row stride")?),
        Arg::I(int(vs, "v row stride")?),
        Arg::I(int(qw, "out width")?),
        Arg::I(int(sq, "S_q")?),
        Arg::I(int(sk, "S_k")?),
        Arg::I(hq as i32),
        Arg::I(hkv as i32),
        Arg::I(d as i32),
        Arg::F(scale),
        Arg::F(softcap.unwrap_or(0.0)),
        Arg::I(mk),
        Arg::I(int(window.min(i32::MAX as usize), "window")?),
        Arg::P(mask),
        Arg::I(bs[0]),
        Arg::I(bs[1]),
        Arg::I(bs[2]),
        Arg::I(bs[3]),
    ];
    let dts = [cx.dt_in(0), cx.dt_in(1), cx.dt_in(2)];
    if sq > crate::kv::ROWS_MAX_SQ && dts[0] != Dt::F32 && dts.iter().all(|&t| t == dts[0]) {
        let capped = softcap.is_some_and(|c| c > 0.0);
        if let Some(name) = crate::mixed::attention_tc_kernel(dts[0], d, mk, capped, [qs, ks, vs]) {
            args.extend([dts[0], dts[1], dts[2], cx.dt_out()].map(|t| Arg::I(t.code())));
            let warps = crate::mixed::attention_tc_warps(b * hq, sq);
            return Ok(vec![Launch::Kernel {
                name,
                grid: [(sq.div_ceil(16 * warps)) as u32, hq as u32, b as u32],
                block: 32 * warps as u32,
                smem: 0,
                args,
            }]);
        }
    }
    let (kernel, r) = crate::mixed::attention_kernel(d, b * hq, sq);
    let rows = 4 * r;
    if cx.half_any(3) || (sq > crate::kv::ROWS_MAX_SQ && sq >= rows) {
        // Many query rows, or 16-bit operands: the mixed kernel (several
        // rows per warp share each K/V tile; f32 accumulation).
        args.extend([cx.dt_in(0), cx.dt_in(1), cx.dt_in(2), cx.dt_out()].map(|t| Arg::I(t.code())));
        return Ok(vec![Launch::Kernel {
            name: kernel,
            grid: [sq.div_ceil(rows) as u32, hq as u32, b as u32],
            block: 128,
            smem: 0,
            args,
        }]);
    }
    if sq <= crate::kv::ROWS_MAX_SQ {
        // Few query rows (decode): one block per row. The kernel bounds the
        // keys by the keep-mask's last kept key on the device, so the launch
        // does not depend on the valid length (no explicit kv_len here).
        args.push(Arg::P(0));
        return Ok(vec![Launch::Kernel {
            name: "attention_rows",
            grid: [sq as u32, hq as u32, b as u32],
            block: 256,
            smem: 0,
            args,
        }]);
    }
    Ok(vec![Launch::Kernel {
        name: if d <= 32 {
            "attention_d32"
        } else if d <= 64 {
            "attention_d64"
        } else {
            "attention_d128"
        },
        grid: [sq.div_ceil(8) as u32, hq as u32, b as u32],
        block: 128,
        smem: 0,
        args,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::view_of;

    fn addr(id: NodeId) -> Option<u64> {
        Some(0x10_0000 * (id.0 as u64 + 1))
    }

    #[test]
    fn suffix_and_broadcast_strides() {
        assert!(is_suffix(&[6], &[4, 6]));
        assert!(is_suffix(&[1], &[4, 6]));
        assert!(is_suffix(&[1, 4, 6], &[2, 4, 6]));
        assert!(!is_suffix(&[4, 1], &[4, 6]));
        assert!(!is_suffix(&[2, 1, 6], &[2, 4, 6]));
        assert_eq!(bcast_strides(&[4, 1], &[3, 4, 5]), vec![0, 1, 0]);
        assert_eq!(bcast_strides(&[3, 4, 5], &[3, 4, 5]), vec![20, 5, 1]);
    }

    #[test]
    fn row_major_matmul_becomes_one_column_major_gemm() {
        let mut g = Graph::new("mm");
        let a = g.input("a", Shape::f32(&[2, 5, 7]));
        let b = g.param("b", Shape::f32(&[7, 3]));
        let y = g.push(Op::MatMul, vec![a, b]).unwrap();
        let ls = lower(&g, g.node(y), &addr, &mut Vec::new()).unwrap();
        let [Launch::Gemm(gm)] = ls.as_slice() else {
            panic!("expected one gemm, got {ls:?}");
        };
        // C^T[3, 10] = B^T[3, 7] A^T[7, 10]: batch dims fold into M.
        assert_eq!((gm.m, gm.n, gm.k, gm.batch), (3, 10, 7, 1));
        assert_eq!(
            (gm.a, gm.b, gm.c),
            (addr(b).unwrap(), addr(a).unwrap(), addr(y).unwrap())
        );
        assert_eq!((gm.lda, gm.ldb, gm.ldc), (3, 7, 3));
    }

    #[test]
    fn broadcast_batches_and_views() {
        let mut g = Graph::new("mm");
        let a = g.input("a", Shape::f32(&[5, 7]));
        let b = g.input("b", Shape::f32(&[4, 7, 3]));
        let y = g.push(Op::MatMul, vec![a, b]).unwrap();
        let ls = lower(&g, g.node(y), &addr, &mut Vec::new()).unwrap();
        let [Launch::Gemm(gm)] = ls.as_slice() else {
            panic!("expected one batched gemm, got {ls:?}");
        };
        assert_eq!((gm.batch, gm.sa, gm.sb, gm.sc), (4, 21, 0, 15));
        // A narrow of a leading-ones tensor is a view: no work when the
        // output address is the input's plus the offset.
        let x = g.input("x", Shape::f32(&[1, 6, 4]));
        let n = g
            .push(
                Op::Narrow {
                    axis: 1,
                    start: 2,
                    len: 3,
                },
                vec![x],
            )
            .unwrap();
        assert_eq!(view_of(&g, g.node(n)), Some((x, 2 * 4 * 4)));
        let same = |id: NodeId| {
            if id == n {
                Some(0x1000 + 32)
            } else {
                Some(0x1000)
            }
        };
        assert!(lower(&g, g.node(n), &same, &mut Vec::new())
            .unwrap()
            .is_empty());
        let ls = lower(&g, g.node(n), &addr, &mut Vec::new()).unwrap();
        assert!(
            matches!(ls.as_slice(), [Launch::Copy { bytes: 48, .. }]),
            "{ls:?}"
        );
    }

    #[test]
    fn unsupported_ops_and_dtypes_are_reported() {
        let mut g = Graph::new("bad");
        let x = g.input("x", Shape::new(&[4], DType::I32));
        let y = g.push(Op::Activation(Activation::Exp), vec![x]);
        if let Ok(y) = y {
            let e = lower(&g, g.node(y), &addr, &mut Vec::new()).unwrap_err();
            assert!(e.contains("f32"), "{e}");
        }
        let q = g.input("q", Shape::f32(&[1, 2, 256]));
        let op = Op::Attention {
            num_heads: 1,
            head_dim: 256,
            mask_kind: MaskKind::None,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let a = g.push(op, vec![q, q, q]).unwrap();
        let e = lower(&g, g.node(a), &addr, &mut Vec::new()).unwrap_err();
        assert!(e.contains("head_dim 256"), "{e}");
    }
}
