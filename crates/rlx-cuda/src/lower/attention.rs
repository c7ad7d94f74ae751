//! Attention (f32, mixed, tensor-core and few-row decode kernels) and `CacheWrite`.

use super::cx::{out_esz, wrong_op, Addr, Cx};
use super::layout::same_or_copy;
use crate::launch::{int, Arg, Launch};
use crate::store::Dt;
use crate::views::{bcast_strides, pad};
use rlx_ir::op::MaskKind;
use rlx_ir::{DType, Op};

/// The widest head the attention kernels take (`attention_rows_d256`,
/// `attention_d256`, `attention_x_d256*`).
pub(crate) const MAX_HEAD_DIM: usize = 256;

pub(super) fn attention<A: Addr>(
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
    if d > MAX_HEAD_DIM {
        return Err(format!(
            "head_dim {d} > {MAX_HEAD_DIM} is not supported by the CUDA attention kernels"
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
            name: if d <= 128 {
                "attention_rows"
            } else {
                "attention_rows_d256"
            },
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
        } else if d <= 128 {
            "attention_d128"
        } else {
            "attention_d256"
        },
        grid: [sq.div_ceil(8) as u32, hq as u32, b as u32],
        block: 128,
        smem: 0,
        args,
    }])
}

/// An `Attention`.
pub(super) fn attention_node<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Attention {
        num_heads,
        head_dim,
        mask_kind,
        score_scale,
        attn_logit_softcap,
    } = &node.op
    else {
        return Err(wrong_op(node));
    };
    attention(
        cx,
        *num_heads,
        *head_dim,
        *mask_kind,
        *score_scale,
        *attn_logit_softcap,
    )
}

/// A `CacheWrite` into a KV cache, in place.
pub(super) fn cache_write<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let graph = cx.graph;
    let out_shape = &node.shape;
    let n = out_shape.numel();
    let esz = out_esz(cx);
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
    v.extend(same_or_copy(cx, 0, n * esz)?);
    Ok(v)
}
