//! The hybrid planner: the seed cases, the source system's failure cases at
//! real dimensions, poisoning, and hybrid == thunks == reference.

mod common;
use common::*;
use rlx::hybrid::{segment, Segment, SplitPolicy};
use rlx::ir::op::{Activation, BinaryOp, MaskKind};
use rlx::ir::{DType, Graph, NodeId, Op, Shape, Tensor};
use rlx::{Device, ExecMode, Session};
use std::collections::HashMap;

fn attn(heads: usize, dim: usize, mask: MaskKind) -> Op {
    Op::Attention {
        num_heads: heads,
        head_dim: dim,
        mask_kind: mask,
        score_scale: None,
        attn_logit_softcap: None,
    }
}

fn hybrid() -> Session {
    Session::new(Device::Cpu).mode(ExecMode::Hybrid)
}

fn thunks() -> Session {
    Session::new(Device::Cpu).mode(ExecMode::Thunks)
}

/// Hybrid equals thunks within `rel` and both equal the reference within `ref_rel`.
fn check_all(g: &Graph, b: &HashMap<String, Tensor>, rel: f32, ref_rel: f32) {
    let want = reference(g, b);
    let t = run_session(&thunks(), g, b);
    let h = run_session(&hybrid(), g, b);
    let hp = run_session(&hybrid().poison_freed(true), g, b);
    for i in 0..want.len() {
        assert_close(
            &t[i],
            &want[i],
            ref_rel,
            &format!("thunks vs reference, output {i}"),
        );
        assert_close(&h[i], &t[i], rel, &format!("hybrid vs thunks, output {i}"));
        assert_eq!(
            h[i], hp[i],
            "poisoned hybrid run differs: memory reused too early"
        );
    }
}

fn kinds(segs: &[Segment]) -> Vec<&'static str> {
    segs.iter()
        .map(|s| match s {
            Segment::Thunks { .. } => "thunks",
            Segment::Compiled(_) => "compiled",
        })
        .collect()
}

#[test]
fn pure_mlp_is_one_compiled_segment() {
    let mut g = Graph::new("mlp");
    let x = g.input("x", Shape::f32(&[8, 16]));
    let w1 = g.param("w1", Shape::f32(&[16, 32]));
    let b1 = g.param("b1", Shape::f32(&[32]));
    let w2 = g.param("w2", Shape::f32(&[32, 4]));
    let h = g.matmul(x, w1, Shape::f32(&[8, 32]));
    let h = g.add_node(Op::Binary(BinaryOp::Add), vec![h, b1], Shape::f32(&[8, 32]));
    let h = g.activation(Activation::Relu, h, Shape::f32(&[8, 32]));
    let y = g.matmul(h, w2, Shape::f32(&[8, 4]));
    g.set_outputs(vec![y]);
    let segs = segment(&g, &SplitPolicy::default());
    assert_eq!(kinds(&segs), ["compiled"]);
    let m = hybrid().compile(g.clone()).unwrap();
    let st = m.plan_stats();
    assert_eq!(
        (st.compiled_segments, st.thunk_ranges, st.dispatches),
        (1, 0, 1)
    );
    check_all(&g, &random_bindings(&g, &mut Rng::new(1), 1.0), 1e-5, 1e-5);
}

/// matmul -> 3 narrows -> attention -> matmul, with a Custom mask input.
fn qkv_attention(b: usize, s: usize, heads: usize, dim: usize, with_bias: bool) -> Graph {
    let h = heads * dim;
    let mut g = Graph::new("qkv_attention");
    let x = g.input("x", Shape::f32(&[b, s, h]));
    let mask = g.input("mask", Shape::f32(&[b, s]));
    let w = g.param("wqkv", Shape::f32(&[h, 3 * h]));
    let mut qkv = g.push(Op::MatMul, vec![x, w]).unwrap();
    if with_bias {
        let bias = g.param("bqkv", Shape::f32(&[3 * h]));
        qkv = g.push(Op::Binary(BinaryOp::Add), vec![qkv, bias]).unwrap();
    }
    let parts: Vec<NodeId> = (0..3)
        .map(|i| {
            g.push(
                Op::Narrow {
                    axis: 2,
                    start: i * h,
                    len: h,
                },
                vec![qkv],
            )
            .unwrap()
        })
        .collect();
    let a = g
        .push(
            attn(heads, dim, MaskKind::Custom),
            vec![parts[0], parts[1], parts[2], mask],
        )
        .unwrap();
    let wo = g.param("wo", Shape::f32(&[h, h]));
    let y = g.push(Op::MatMul, vec![a, wo]).unwrap();
    g.set_outputs(vec![y]);
    g
}

fn padding_mask(b: usize, s: usize, lens: &[usize]) -> Tensor {
    let mut m = vec![0f32; b * s];
    for (bi, &l) in lens.iter().enumerate() {
        m[bi * s..bi * s + l].fill(1.0);
    }
    Tensor::f32(&[b, s], m)
}

#[test]
fn attention_splits_compiled_thunks_compiled() {
    let g = qkv_attention(1, 8, 2, 4, false);
    let segs = segment(&g, &SplitPolicy::default());
    assert_eq!(kinds(&segs), ["compiled", "thunks", "compiled"]);
    let attn_id = g
        .nodes()
        .iter()
        .find(|n| matches!(n.op, Op::Attention { .. }))
        .unwrap()
        .id;
    let Segment::Compiled(first) = &segs[0] else {
        unreachable!()
    };
    assert_eq!(
        first.boundary_outputs.len(),
        3,
        "q, k, v leave the first segment"
    );
    let Segment::Compiled(after) = &segs[2] else {
        unreachable!()
    };
    assert!(after.boundary_inputs.contains(&attn_id));
    assert_eq!(
        segs[1],
        Segment::Thunks {
            start: attn_id.index(),
            end: attn_id.index() + 1
        }
    );
}

/// (a) QKV matmul+bias -> 3 narrows -> attention at hidden 384, 12 heads,
/// seq 128, batch 2, with a Custom padding mask that has padded rows.
#[test]
fn failure_case_a_qkv_narrows_attention_real_dims() {
    let g = qkv_attention(2, 128, 12, 32, true);
    let mut b = random_bindings(&g, &mut Rng::new(7), 0.5);
    b.insert("mask".into(), padding_mask(2, 128, &[128, 77]));
    let m = hybrid().compile(g.clone()).unwrap();
    assert_eq!(m.plan_stats().compiled_segments, 2);
    check_all(&g, &b, 1e-5, 1e-4);
}

/// (b) one segment produces q, k, v, g and beta; q, k, v feed one attention
/// and g, beta feed a second consumer after it.
#[test]
fn failure_case_b_five_boundary_outputs() {
    let (bsz, s, heads, dim) = (2, 64, 16, 8);
    let h = heads * dim;
    let mut g = Graph::new("five_outputs");
    let x = g.input("x", Shape::f32(&[bsz, s, h]));
    let w = g.param("w", Shape::f32(&[h, 3 * h + 2 * heads]));
    let p = g.push(Op::MatMul, vec![x, w]).unwrap();
    let q = g
        .push(
            Op::Narrow {
                axis: 2,
                start: 0,
                len: h,
            },
            vec![p],
        )
        .unwrap();
    let k = g
        .push(
            Op::Narrow {
                axis: 2,
                start: h,
                len: h,
            },
            vec![p],
        )
        .unwrap();
    let v = g
        .push(
            Op::Narrow {
                axis: 2,
                start: 2 * h,
                len: h,
            },
            vec![p],
        )
        .unwrap();
    let gg = g
        .push(
            Op::Narrow {
                axis: 2,
                start: 3 * h,
                len: heads,
            },
            vec![p],
        )
        .unwrap();
    let gg = g
        .push(Op::Activation(Activation::Softplus), vec![gg])
        .unwrap();
    let beta = g
        .push(
            Op::Narrow {
                axis: 2,
                start: 3 * h + heads,
                len: heads,
            },
            vec![p],
        )
        .unwrap();
    let beta = g
        .push(Op::Activation(Activation::Sigmoid), vec![beta])
        .unwrap();
    let a = g
        .push(attn(heads, dim, MaskKind::Causal), vec![q, k, v])
        .unwrap();
    let gb = g.push(Op::Binary(BinaryOp::Mul), vec![gg, beta]).unwrap();
    let gate = g
        .push(
            Op::Reduce {
                op: rlx::ir::op::ReduceOp::Sum,
                axes: vec![2],
                keep_dims: true,
            },
            vec![gb],
        )
        .unwrap();
    let y = g.push(Op::Binary(BinaryOp::Mul), vec![a, gate]).unwrap();
    g.set_outputs(vec![y]);
    let segs = segment(&g, &SplitPolicy::default());
    let Segment::Compiled(first) = &segs[0] else {
        panic!("first step compiled")
    };
    assert_eq!(first.boundary_outputs.len(), 5, "q, k, v, g, beta");
    check_all(&g, &random_bindings(&g, &mut Rng::new(3), 0.5), 1e-5, 1e-4);
}

/// (c) two attentions separated only by params form one thunk range.
#[test]
fn failure_case_c_attentions_separated_by_params() {
    let (b, s, heads, dim) = (1, 16, 4, 8);
    let h = heads * dim;
    let mut g = Graph::new("two_attn");
    let x = g.input("x", Shape::f32(&[b, s, h]));
    let w = g.param("w", Shape::f32(&[h, h]));
    let q = g.push(Op::MatMul, vec![x, w]).unwrap();
    let a1 = g
        .push(attn(heads, dim, MaskKind::None), vec![q, q, q])
        .unwrap();
    let kv = g.param("kv", Shape::f32(&[b, s, h]));
    let a2 = g
        .push(attn(heads, dim, MaskKind::Causal), vec![a1, kv, kv])
        .unwrap();
    let y = g.push(Op::Activation(Activation::Tanh), vec![a2]).unwrap();
    g.set_outputs(vec![y]);
    let segs = segment(&g, &SplitPolicy::default());
    assert_eq!(kinds(&segs), ["compiled", "thunks", "compiled"]);
    assert_eq!(
        segs[1],
        Segment::Thunks {
            start: a1.index(),
            end: a2.index() + 1
        }
    );
    check_all(&g, &random_bindings(&g, &mut Rng::new(4), 0.5), 1e-5, 1e-4);
}

/// (d) a graph output that is also a boundary output, and
/// (e) a boundary output read by two later segments.
#[test]
fn failure_cases_d_and_e_shared_boundary_outputs() {
    let (b, s, heads, dim) = (2, 32, 4, 16);
    let h = heads * dim;
    let mut g = Graph::new("shared");
    let x = g.input("x", Shape::f32(&[b, s, h]));
    let w = g.param("w", Shape::f32(&[h, h]));
    let gamma = g.param("gamma", Shape::f32(&[h]));
    let beta = g.param("beta", Shape::f32(&[h]));
    let x1 = g.push(Op::MatMul, vec![x, w]).unwrap();
    let x1 = g
        .push(
            Op::LayerNorm {
                axis: -1,
                eps: 1e-5,
            },
            vec![x1, gamma, beta],
        )
        .unwrap();
    let a1 = g
        .push(attn(heads, dim, MaskKind::Causal), vec![x1, x1, x1])
        .unwrap();
    let r1 = g.push(Op::Binary(BinaryOp::Add), vec![a1, x1]).unwrap();
    let a2 = g
        .push(
            attn(heads, dim, MaskKind::SlidingWindow(5)),
            vec![r1, r1, r1],
        )
        .unwrap();
    let r2 = g.push(Op::Binary(BinaryOp::Add), vec![a2, x1]).unwrap();
    g.set_outputs(vec![r2, x1]);
    let segs = segment(&g, &SplitPolicy::default());
    assert_eq!(
        kinds(&segs),
        ["compiled", "thunks", "compiled", "thunks", "compiled"]
    );
    let Segment::Compiled(s0) = &segs[0] else {
        unreachable!()
    };
    assert_eq!(
        s0.boundary_outputs,
        vec![x1],
        "x1 is both a graph output and a boundary output"
    );
    for i in [2, 4] {
        let Segment::Compiled(si) = &segs[i] else {
            unreachable!()
        };
        assert!(si.boundary_inputs.contains(&x1), "segment {i} reads x1");
    }
    check_all(&g, &random_bindings(&g, &mut Rng::new(5), 0.5), 1e-5, 1e-4);
}

#[test]
fn declined_ops_are_explained() {
    let g = qkv_attention(1, 8, 2, 4, true);
    let m = hybrid().compile(g).unwrap();
    let r = m.plan_report();
    assert_eq!(r.ranges.len(), 1);
    assert_eq!(r.ranges[0].ops[0].op, "Attention");
    assert!(
        r.ranges[0].ops[0].reason.starts_with("policy"),
        "{:?}",
        r.ranges[0]
    );
    assert_eq!(r.dispatches, 3);
    assert_eq!(r.dispatches_thunks_only, 7);
}

#[test]
fn all_thunks_policy_gives_no_hybrid() {
    let g = qkv_attention(1, 8, 2, 4, true);
    let m = Session::new(Device::Cpu)
        .mode(ExecMode::Hybrid)
        .policy(SplitPolicy::all_thunks())
        .compile(g.clone())
        .unwrap();
    assert_eq!(m.plan_stats().compiled_segments, 0);
    assert_eq!(m.plan_stats().dispatches, 7);
}

#[test]
fn memory_plan_never_overlaps_live_tensors() {
    let g = qkv_attention(2, 32, 4, 8, true);
    for hybrid in [false, true] {
        let m = rlx::cpu::CpuModel::compile(
            g.clone(),
            &rlx::cpu::CpuOptions {
                hybrid,
                ..Default::default()
            },
        )
        .unwrap();
        m.check_memory_plan().unwrap();
    }
}

#[test]
fn typed_constant_and_dtype_inputs_in_segments() {
    // A Gather-led segment with i64 ids, plus a constant, runs fused.
    let mut g = Graph::new("emb");
    let ids = g.input("ids", Shape::new(&[2, 5], DType::I64));
    let table = g.param("table", Shape::f32(&[11, 6]));
    let e = g.push(Op::Gather { axis: 0 }, vec![table, ids]).unwrap();
    let c = g.constant(Tensor::f32(&[6], (0..6).map(|i| i as f32 * 0.1).collect()));
    let y = g.push(Op::Binary(BinaryOp::Mul), vec![e, c]).unwrap();
    g.set_outputs(vec![y]);
    let m = hybrid().compile(g.clone()).unwrap();
    assert_eq!(m.plan_stats().compiled_segments, 1);
    check_all(&g, &random_bindings(&g, &mut Rng::new(9), 1.0), 0.0, 1e-6);
}

/// The CPU cost check: a lone matmul over many rows in chunks would stream
/// its weight once per chunk and save nothing, so it stays a thunk (with
/// the reason in the report); with an epilogue whose intermediate the
/// thunks would round-trip, the segment is kept. Both equal the thunks.
#[test]
fn cost_check_keeps_out_segments_that_would_lose() {
    let (rows, k, n) = (4096, 64, 64);
    let lone = {
        let mut g = Graph::new("lone_matmul");
        let x = g.input("x", Shape::f32(&[rows, k]));
        let w = g.param("w", Shape::f32(&[k, n]));
        let y = g.matmul(x, w, Shape::f32(&[rows, n]));
        g.set_outputs(vec![y]);
        g
    };
    let m = hybrid().threads(2).compile(lone.clone()).unwrap();
    let r = m.plan_report();
    assert_eq!(m.plan_stats().compiled_segments, 0, "{r:?}");
    assert!(
        r.declined
            .iter()
            .any(|(_, why)| why.contains("cost check") && why.contains("more memory than thunks")),
        "{:?}",
        r.declined
    );
    check_all(
        &lone,
        &random_bindings(&lone, &mut Rng::new(3), 1.0),
        0.0,
        1e-5,
    );

    let mut g = Graph::new("matmul_gelu_mul");
    let x = g.input("x", Shape::f32(&[rows, k]));
    let w = g.param("w", Shape::f32(&[k, n]));
    let h = g.matmul(x, w, Shape::f32(&[rows, n]));
    let a = g.activation(Activation::Gelu, h, Shape::f32(&[rows, n]));
    let y = g.add_node(
        Op::Binary(BinaryOp::Mul),
        vec![a, x],
        Shape::f32(&[rows, n]),
    );
    g.set_outputs(vec![y]);
    let m = hybrid().threads(2).compile(g.clone()).unwrap();
    assert_eq!(m.plan_stats().compiled_segments, 1, "{:?}", m.plan_report());
    check_all(&g, &random_bindings(&g, &mut Rng::new(4), 1.0), 1e-6, 1e-5);
}
