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

// ---------------------------------------------------------------------------
// The planner against the seeds: declined segments split into compiled
// pieces, thunks first, mixed row counts, dead segments.

/// The CPU segment compiler, but declining any segment that holds a Tanh
/// (as a backend without that kernel would).
struct NoTanh;

impl rlx::hybrid::SegmentCompiler for NoTanh {
    type Lowered = rlx::cpu::FusedPlan;
    fn name(&self) -> &'static str {
        "no-tanh"
    }
    fn claims(&self, g: &Graph, n: &rlx::ir::Node) -> Result<(), rlx::hybrid::Decline> {
        rlx::cpu::FusedCompiler.claims(g, n)
    }
    fn try_lower(
        &self,
        sub: &rlx::hybrid::SubGraph,
    ) -> Result<Self::Lowered, rlx::hybrid::Decline> {
        if sub
            .graph
            .nodes()
            .iter()
            .any(|n| n.op == Op::Activation(Activation::Tanh))
        {
            return Err("no Tanh kernel".into());
        }
        rlx::cpu::FusedCompiler.try_lower(sub)
    }
}

/// Three eligible runs separated by softmaxes over axis 0 (which the CPU
/// compiler does not take); the middle run holds a Tanh.
fn three_runs() -> Graph {
    let mut g = Graph::new("three_runs");
    let x = g.input("x", Shape::f32(&[2, 3, 8]));
    let mut h = x;
    for (i, mid) in [Activation::Gelu, Activation::Tanh, Activation::Relu]
        .into_iter()
        .enumerate()
    {
        let w = g.param(&format!("w{i}"), Shape::f32(&[8, 8]));
        let m = g.push(Op::MatMul, vec![h, w]).unwrap();
        let a = g.push(Op::Activation(mid), vec![m]).unwrap();
        let y = g.push(Op::Binary(BinaryOp::Add), vec![a, m]).unwrap();
        h = g.push(Op::Softmax { axis: 0 }, vec![y]).unwrap();
    }
    g.set_outputs(vec![h]);
    g
}

#[test]
fn a_declined_middle_segment_is_split_and_later_segments_compile() {
    let g = three_runs();
    let plan = rlx::hybrid::build_plan(&g, &SplitPolicy::default(), &NoTanh);
    let r = &plan.report;
    // Run 1 whole; run 2 as [matmul] + thunk Tanh + [add]; run 3 whole.
    assert_eq!(r.compiled_segments, 4, "{r:#?}");
    assert_eq!(r.split.len(), 1, "{r:#?}");
    assert!(r.split[0].1.contains("no Tanh kernel"), "{r:#?}");
    let tanh: Vec<_> = r
        .ranges
        .iter()
        .flat_map(|x| &x.ops)
        .filter(|o| o.op == "Activation")
        .collect();
    assert_eq!(tanh.len(), 1, "{r:#?}");
    assert_eq!(
        tanh[0].reason, "declined: no-tanh segment: no Tanh kernel",
        "each declined node carries its own reason"
    );
    let last = r.segments.last().unwrap();
    assert!(
        last.last.index() > tanh[0].node.index(),
        "the segment after the declined one still compiles: {r:#?}"
    );
    // Values: the same plan shape through the session (declining every
    // 2nd segment) equals thunks and the reference.
    let b = random_bindings(&g, &mut Rng::new(21), 1.0);
    let want = reference(&g, &b);
    let t = run_session(&thunks(), &g, &b);
    let s = hybrid().policy(SplitPolicy::default().decline_every(2));
    let h = run_session(&s, &g, &b);
    assert_close(&t[0], &want[0], 1e-4, "thunks vs reference");
    assert_close(&h[0], &t[0], 1e-5, "declining hybrid vs thunks");
}

#[test]
fn nothing_compiles_and_every_op_keeps_its_reason() {
    let g = three_runs();
    let s = hybrid().policy(SplitPolicy::default().decline_every(1));
    let m = s.compile(g.clone()).unwrap();
    let r = m.plan_report();
    assert_eq!(r.compiled_segments, 0);
    let reasons: Vec<&str> = r
        .ranges
        .iter()
        .flat_map(|x| &x.ops)
        .map(|o| o.reason.as_str())
        .collect();
    assert!(reasons.iter().all(|r| *r != "mode: thunks"), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("capability: cpu-fused")),
        "the softmax over axis 0 keeps its capability reason: {reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("test hook")),
        "{reasons:?}"
    );
}

#[test]
fn a_thunk_range_at_the_start() {
    let mut g = Graph::new("thunks_first");
    let x = g.input("x", Shape::f32(&[4, 6]));
    let s = g.push(Op::Softmax { axis: 0 }, vec![x]).unwrap();
    let w = g.param("w", Shape::f32(&[6, 5]));
    let m = g.push(Op::MatMul, vec![s, w]).unwrap();
    let y = g.push(Op::Activation(Activation::Silu), vec![m]).unwrap();
    g.set_outputs(vec![y]);
    let model = hybrid().compile(g.clone()).unwrap();
    let r = model.plan_report();
    assert_eq!((r.thunk_ranges, r.compiled_segments), (1, 1), "{r:#?}");
    assert_eq!(r.ranges[0].start, s.index());
    assert!(r.segments[0].first.index() > r.ranges[0].start);
    check_all(&g, &random_bindings(&g, &mut Rng::new(22), 1.0), 1e-5, 1e-4);
}

#[test]
fn mixed_row_counts_compile_as_pieces() {
    // One eligible run: a [2, 6, 8] chain (12 rows) and a [2, 48] chain
    // (2 rows) read from a reshaped input. The CPU compiler takes one row
    // count per segment, so the whole is declined and split in two.
    let mut g = Graph::new("mixed_rows");
    let x = g.input("x", Shape::f32(&[2, 6, 8]));
    let w = g.param("w", Shape::f32(&[8, 8]));
    let h = g.push(Op::MatMul, vec![x, w]).unwrap();
    let h = g.push(Op::Activation(Activation::Silu), vec![h]).unwrap();
    let x2 = g.input("x2", Shape::f32(&[2, 6, 8]));
    let r2 = g
        .push(Op::Reshape { shape: vec![2, 48] }, vec![x2])
        .unwrap();
    let t = g.push(Op::Activation(Activation::Tanh), vec![r2]).unwrap();
    g.set_outputs(vec![h, t]);
    let m = hybrid().compile(g.clone()).unwrap();
    let r = m.plan_report();
    assert_eq!((r.compiled_segments, r.thunk_ranges), (2, 0), "{r:#?}");
    assert_eq!(r.split.len(), 1, "{r:#?}");
    assert!(r.split[0].1.contains("rows"), "{r:#?}");
    check_all(&g, &random_bindings(&g, &mut Rng::new(23), 1.0), 1e-5, 1e-4);
}

#[test]
fn a_dead_segment_is_compiled_with_its_last_node_as_output() {
    // matmul -> tanh is read by nothing; a softmax over axis 0 (thunk)
    // separates it from the output.
    let mut g = Graph::new("dead");
    let x = g.input("x", Shape::f32(&[3, 4]));
    let w = g.param("w", Shape::f32(&[4, 4]));
    let m = g.push(Op::MatMul, vec![x, w]).unwrap();
    let dead = g.push(Op::Activation(Activation::Tanh), vec![m]).unwrap();
    let y = g.push(Op::Softmax { axis: 0 }, vec![x]).unwrap();
    g.set_outputs(vec![y]);
    let model = hybrid().compile(g.clone()).unwrap();
    let r = model.plan_report();
    assert_eq!(r.compiled_segments, 1, "{r:#?}");
    assert_eq!(r.segments[0].boundary_outputs, vec![dead], "{r:#?}");
    assert!(r.declined.is_empty() && r.split.is_empty(), "{r:#?}");
    check_all(&g, &random_bindings(&g, &mut Rng::new(24), 1.0), 1e-5, 1e-4);
}

/// A GatedDeltaNet whose producer run mixes row counts: q, k, v, g and
/// beta per token (B*S rows) beside the carried state decayed per state
/// row (B*H*n rows). The run is declined whole and split, so compiled
/// segments stay on both sides of the GDN; values equal thunks and the
/// reference.
#[test]
fn gdn_with_a_mixed_row_producer_keeps_compiled_segments_on_both_sides() {
    let (b, s, d, h, n) = (2, 5, 16, 2, 4);
    let mut g = Graph::new("gdn_mixed_producer");
    let x = g.input("x", Shape::f32(&[b, s, d]));
    let ss = g.input("ssm_state", Shape::f32(&[b, h, n, n]));
    let wqkv = g.param("wqkv", Shape::f32(&[d, 3 * h * n]));
    let qkv = g.push(Op::MatMul, vec![x, wqkv]).unwrap();
    let part = |g: &mut Graph, i: usize| {
        g.push(
            Op::Narrow {
                axis: 2,
                start: i * h * n,
                len: h * n,
            },
            vec![qkv],
        )
        .unwrap()
    };
    let (q, k, v) = (part(&mut g, 0), part(&mut g, 1), part(&mut g, 2));
    let wg = g.param("wg", Shape::f32(&[d, h]));
    let gl = g.push(Op::MatMul, vec![x, wg]).unwrap();
    let gs = g
        .push(Op::Activation(Activation::Softplus), vec![gl])
        .unwrap();
    let gate = g.push(Op::Activation(Activation::Neg), vec![gs]).unwrap();
    let wb = g.param("wb", Shape::f32(&[d, h]));
    let bl = g.push(Op::MatMul, vec![x, wb]).unwrap();
    let beta = g
        .push(Op::Activation(Activation::Sigmoid), vec![bl])
        .unwrap();
    let sr = g
        .push(
            Op::Reshape {
                shape: vec![b * h * n, n],
            },
            vec![ss],
        )
        .unwrap();
    let decay = g.param("decay", Shape::f32(&[n]));
    let sd = g.push(Op::Binary(BinaryOp::Mul), vec![sr, decay]).unwrap();
    let s4 = g
        .push(
            Op::Reshape {
                shape: vec![b, h, n, n],
            },
            vec![sd],
        )
        .unwrap();
    let r4 = |g: &mut Graph, t: NodeId| {
        g.push(
            Op::Reshape {
                shape: vec![b, s, h, n],
            },
            vec![t],
        )
        .unwrap()
    };
    let (q4, k4, v4) = (r4(&mut g, q), r4(&mut g, k), r4(&mut g, v));
    let op = Op::GatedDeltaNet {
        state_size: n,
        carry_state: true,
    };
    let gdn = g.push(op, vec![q4, k4, v4, gate, beta, s4]).unwrap();
    let o = g
        .push(
            Op::Narrow {
                axis: 1,
                start: 0,
                len: s,
            },
            vec![gdn],
        )
        .unwrap();
    let o = g
        .push(
            Op::Reshape {
                shape: vec![b, s, h * n],
            },
            vec![o],
        )
        .unwrap();
    let wo = g.param("wo", Shape::f32(&[h * n, d]));
    let y = g.push(Op::MatMul, vec![o, wo]).unwrap();
    let gamma = g.param("gamma", Shape::f32(&[d]));
    let y = g
        .push(
            Op::RmsNorm {
                axis: -1,
                eps: 1e-6,
            },
            vec![y, gamma],
        )
        .unwrap();
    let y = g.push(Op::Binary(BinaryOp::Add), vec![y, x]).unwrap();
    g.set_outputs(vec![y]);
    let m = hybrid().compile(g.clone()).unwrap();
    let r = m.plan_report();
    assert!(!r.split.is_empty(), "the producer run is split: {r:#?}");
    let before = r.segments.iter().filter(|sg| sg.last < gdn).count();
    let after = r.segments.iter().filter(|sg| sg.first > gdn).count();
    assert!(
        before >= 2 && after >= 1,
        "{before} before, {after} after: {r:#?}"
    );
    for o in r.ranges.iter().flat_map(|x| &x.ops) {
        assert!(!o.reason.is_empty(), "{o:?} has no reason");
    }
    check_all(&g, &random_bindings(&g, &mut Rng::new(25), 0.5), 1e-5, 1e-4);
}

/// Rope (positions `[S]` and `[B, S]`) and last-axis Concat run inside a
/// CPU compiled segment, bit for bit equal to the thunks; Transpose,
/// Expand and dtype-changing Cast stay out with a reason naming why.
#[test]
fn rope_and_concat_are_fused_and_the_rest_say_why_not() {
    for pos_dims in [vec![5], vec![2, 5]] {
        let mut g = Graph::new("rope_concat");
        let x = g.input("x", Shape::f32(&[2, 5, 16]));
        let pos = g.input("pos", Shape::new(&pos_dims, DType::I64));
        let w = g.param("w", Shape::f32(&[16, 16]));
        let h = g.push(Op::MatMul, vec![x, w]).unwrap();
        let rope = Op::Rope {
            head_dim: 8,
            n_rot: 6,
            theta: 10000.0,
            style: rlx::ir::op::RopeStyle::NeoX,
        };
        let r = g.push(rope, vec![h, pos]).unwrap();
        let c = g.push(Op::Concat { axis: 2 }, vec![r, x]).unwrap();
        let y = g.push(Op::Activation(Activation::Silu), vec![c]).unwrap();
        g.set_outputs(vec![y]);
        let m = hybrid().compile(g.clone()).unwrap();
        let st = m.plan_stats();
        assert_eq!(
            (st.compiled_segments, st.thunk_ranges),
            (1, 0),
            "{:#?}",
            m.plan_report()
        );
        let mut b = random_bindings(&g, &mut Rng::new(26), 1.0);
        let n: usize = pos_dims.iter().product();
        b.insert(
            "pos".into(),
            Tensor::i64(&pos_dims, (0..n as i64).map(|i| i * 131 % 2048).collect()),
        );
        let t = run_session(&thunks(), &g, &b);
        let h = run_session(&hybrid(), &g, &b);
        assert_eq!(h, t, "hybrid == thunks bit for bit");
        assert_close(&t[0], &reference(&g, &b)[0], 1e-4, "thunks vs reference");
    }
    let mut g = Graph::new("not_fused");
    let x = g.input("x", Shape::f32(&[2, 3, 4]));
    let t = g
        .push(
            Op::Transpose {
                perm: vec![1, 0, 2],
            },
            vec![x],
        )
        .unwrap();
    let e = g
        .push(
            Op::Expand {
                shape: vec![2, 3, 2, 4],
            },
            vec![t],
        )
        .unwrap();
    let c = g.push(Op::Cast { to: DType::I32 }, vec![e]).unwrap();
    g.set_outputs(vec![c]);
    let m = hybrid().compile(g).unwrap();
    let reasons: Vec<String> = m
        .plan_report()
        .ranges
        .iter()
        .flat_map(|r| &r.ops)
        .map(|o| format!("{}: {}", o.op, o.reason))
        .collect();
    for want in [
        "Transpose reorders rows",
        "Expand materializes",
        "changes the dtype",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(want)),
            "{want}: {reasons:?}"
        );
    }
}

#[test]
fn a_large_segment_of_one_op_without_weights_runs_as_its_thunk() {
    // [128, 1024] rows: a lone Silu between two softmaxes over axis 0
    // (which the CPU compiler does not take) is declined; the same Silu
    // followed by an Add stays a segment. Values as the reference either way.
    let mut g = Graph::new("one_op");
    let x = g.input("x", Shape::f32(&[128, 1024]));
    let s = g.push(Op::Softmax { axis: 0 }, vec![x]).unwrap();
    let a = g.push(Op::Activation(Activation::Silu), vec![s]).unwrap();
    let s2 = g.push(Op::Softmax { axis: 0 }, vec![a]).unwrap();
    let b = g.push(Op::Activation(Activation::Silu), vec![s2]).unwrap();
    let y = g.push(Op::Binary(BinaryOp::Add), vec![b, s2]).unwrap();
    g.set_outputs(vec![y]);
    let m = hybrid().compile(g.clone()).unwrap();
    let r = m.plan_report();
    let lone = r
        .ranges
        .iter()
        .flat_map(|x| &x.ops)
        .find(|o| o.node == a)
        .unwrap_or_else(|| panic!("the lone Silu is not a thunk: {r:#?}"));
    assert!(lone.reason.contains("one op without weights"), "{r:#?}");
    assert_eq!(r.compiled_segments, 1, "{r:#?}");
    assert!(r.segments[0].first.index() > s2.index(), "{r:#?}");
    check_all(&g, &random_bindings(&g, &mut Rng::new(31), 1.0), 1e-5, 1e-4);
}
