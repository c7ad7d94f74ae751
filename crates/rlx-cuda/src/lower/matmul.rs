//! Matmuls: cuBLASLt gemms with epilogues, the small-matmul kernel, the fused quantized GEMV group, the matmul + norm fusion, and `DequantMatMul`.

use super::cx::{wrong_op, Addr, Cx};
use super::norm::norm;
use super::norm::NormIn;
use crate::fuse::gemv::GemvFusion;
use crate::launch::{activation_launch, elementwise, int, Arg, Epi, Gemm, Launch};
use crate::opcodes::act_code;
use crate::quant::{GemvExtra, Prologue};
use crate::store::Dt;
use crate::views::bcast_strides;
use rlx_ir::op::Activation;
use rlx_ir::{DType, NodeId, Op, Shape};

pub(super) fn gemv_group<A: Addr>(cx: &Cx<'_, A>, f: &GemvFusion) -> Result<Vec<Launch>, String> {
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

/// A 16-bit matmul (with its bias and activation) of at most
/// [`crate::fuse::norm::MAX_ROWS`] rows against an `[out, in]` weight as one
/// `gemm_pf` launch: 16-row tiles over the whole K, the weight rows loaded
/// before the kernel waits for the previous one (see
/// [`crate::mixed::gemm_pf_kernel`]). `None` where the shapes, storage or
/// alignment do not fit (cuBLASLt takes those).
pub(super) fn small_gemm<A: Addr>(
    cx: &Cx<'_, A>,
    a: &Shape,
    b: &Shape,
) -> Result<Option<Launch>, String> {
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
pub(super) fn gemm_norm<A: Addr>(
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
pub(super) fn matmul<A: Addr>(
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

/// A `MatMul` or `FusedMatMulBiasAct`: a cuBLASLt gemm (or the small-matmul kernel) with its bias and activation.
pub(super) fn matmul_node<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let out_shape = &node.shape;
    let n = out_shape.numel();
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
        if let Some(l) = small_gemm(cx, &a, &b)? {
            return Ok(vec![l]);
        }
    }
    let mut v = Vec::new();
    if n > 0 {
        v.extend(matmul(cx, &a, &b, ob, m, k, nn)?);
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

/// A `DequantMatMul` on packed GGUF blocks.
pub(super) fn dequant_matmul<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::DequantMatMul {
        scheme,
        activations,
    } = &node.op
    else {
        return Err(wrong_op(node));
    };
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
