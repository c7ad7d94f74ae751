//! Lowering one node to device work: kernel launches, cuBLAS gemms and copies.
//!
//! Lowering is pure: it reads shapes and device addresses and produces a
//! list of [`Launch`]es. The same function checks capability (with dummy
//! addresses) and builds the real schedule. [`lower`] dispatches a node to
//! its family: [`matmul`], [`elementwise`], [`norm`], [`layout`] (copies,
//! gathers, concat), [`reduce`] (reductions, softmax, pooling), [`rope`],
//! [`attention`] (and the KV cache). The layer above the kernels and
//! fusions: nothing below imports it.

mod attention;
mod cx;
mod elementwise;
mod layout;
mod matmul;
mod norm;
mod reduce;
mod rope;

pub(crate) use cx::{Addr, Env, WithStore};

use crate::fuse::Fusion;
use crate::launch::Launch;
use cx::{Cx, MAX_RANK};
use rlx_ir::{Graph, Node, Op};

/// Lower `node` of `graph`. `addr` gives device addresses; `meta` collects
/// metadata ints referenced by [`Arg::Meta`](crate::launch::Arg::Meta).
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
    if node.shape.rank() > MAX_RANK {
        return Err(format!("rank {} > {MAX_RANK}", node.shape.rank()));
    }
    match cx.addr.fusion(node.id) {
        Fusion::None => {}
        Fusion::Interior | Fusion::Done => return Ok(vec![]),
        Fusion::Gemv(f) => return matmul::gemv_group(&cx, &f),
        Fusion::RopeCache(f) => return rope::rope_cache(&cx, &f),
        Fusion::Reduce(f) => return reduce::reduce(&mut cx, Some(&f)),
        Fusion::Pool(f) => return reduce::pool(&cx, &f),
        Fusion::GemmNorm(f) => return matmul::gemm_norm(&mut cx, &f),
        // The norm's own lowering reads its absorbed Add and gathers (`norm_in`).
        Fusion::NormFeed(_) => {}
        Fusion::Root(c) => return elementwise::chain(&cx, &c),
    }
    by_op(&mut cx)
}

/// The unfused lowering of `cx.node`, by op.
fn by_op<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    match &cx.node.op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => Ok(vec![]),
        Op::MatMul | Op::FusedMatMulBiasAct { .. } => matmul::matmul_node(cx),
        Op::Activation(_) => elementwise::activation(cx),
        Op::Binary(_) => elementwise::binary(cx),
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => norm::layer_norm(cx),
        Op::FusedResidualLN { .. } | Op::FusedResidualRmsNorm { .. } => norm::residual_norm(cx),
        Op::Reshape { .. } => layout::reshape(cx),
        Op::Cast { .. } => elementwise::cast(cx),
        Op::Expand { .. } => layout::expand(cx),
        Op::Transpose { .. } => layout::transpose(cx),
        Op::Gather { .. } => layout::gather(cx),
        Op::Narrow { .. } => layout::narrow(cx),
        Op::Concat { .. } => layout::concat(cx),
        Op::FusedSwiGLU { .. } => elementwise::swiglu(cx),
        Op::Rope { .. } => rope::rope(cx),
        Op::Attention { .. } => attention::attention_node(cx),
        Op::Softmax { .. } => reduce::softmax(cx),
        Op::Reduce { .. } => reduce::reduce(cx, None),
        Op::DequantMatMul { .. } => matmul::dequant_matmul(cx),
        Op::CacheWrite { .. } => attention::cache_write(cx),
        Op::GatedDeltaNet { .. } | Op::Lstm { .. } => {
            Err(format!("no CUDA kernel for {}", cx.node.op.name()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{bcast_strides, is_suffix, view_of};
    use rlx_ir::op::{Activation, MaskKind};
    use rlx_ir::{DType, NodeId, Shape};

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
        let q = g.input("q", Shape::f32(&[1, 2, 320]));
        let op = Op::Attention {
            num_heads: 1,
            head_dim: 320,
            mask_kind: MaskKind::None,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let a = g.push(op, vec![q, q, q]).unwrap();
        let e = lower(&g, g.node(a), &addr, &mut Vec::new()).unwrap_err();
        assert!(e.contains("head_dim 320 > 256"), "{e}");
    }

    /// Every head width up to 256 gets a kernel on each path: few query
    /// rows (decode), a few more than that (the f32 tiled kernel), and
    /// many (the mixed kernel; more rows per warp once the grid is big).
    #[test]
    fn attention_kernels_cover_heads_up_to_256() {
        let name = |d: usize, hq: usize, sq: usize| -> &'static str {
            let mut g = Graph::new("attn");
            let q = g.input("q", Shape::f32(&[1, sq, hq * d]));
            let kv = g.input("kv", Shape::f32(&[1, 600, d]));
            let op = Op::Attention {
                num_heads: hq,
                head_dim: d,
                mask_kind: MaskKind::Causal,
                score_scale: None,
                attn_logit_softcap: None,
            };
            let a = g.push(op, vec![q, kv, kv]).unwrap();
            let ls = lower(&g, g.node(a), &addr, &mut Vec::new()).unwrap();
            let [Launch::Kernel { name, smem: 0, .. }] = ls.as_slice() else {
                panic!("d {d} sq {sq}: expected one kernel, got {ls:?}");
            };
            name
        };
        for (d, rows, tiled, mixed) in [
            (64, "attention_rows", "attention_d64", "attention_x_d64_r2"),
            (
                128,
                "attention_rows",
                "attention_d128",
                "attention_x_d128_r2",
            ),
            (
                129,
                "attention_rows_d256",
                "attention_d256",
                "attention_x_d256_r2",
            ),
            (
                256,
                "attention_rows_d256",
                "attention_d256",
                "attention_x_d256_r2",
            ),
        ] {
            assert_eq!(name(d, 4, 1), rows, "d {d}");
            assert_eq!(name(d, 4, 4), rows, "d {d}");
            assert_eq!(name(d, 4, 6), tiled, "d {d}");
            assert_eq!(name(d, 4, 200), mixed, "d {d}");
        }
        // 64 heads x 64 blocks of 16 rows: 4 rows per warp.
        assert_eq!(name(256, 64, 1024), "attention_x_d256");
    }
}
