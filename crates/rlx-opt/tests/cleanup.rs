//! DCE, CSE, constant folding, the pass manager and error reporting.

mod common;
use common::*;
use rlx_ir::{Activation, Graph, NodeId, Op, Shape, Tensor};
use rlx_opt::{optimize, Cse, Dce, OptError, OptOptions, Pass, Rewriter};

const TOL: f32 = 1e-5;

#[test]
fn dce_keeps_inputs_and_drops_dead_params_constants_and_compute() {
    let mut g = Graph::new("dce");
    let x = input(&mut g, "x", &[2, 3]);
    let _unused_in = input(&mut g, "unused", &[7]);
    let _dead_p = param(&mut g, "dead_p", &[3]);
    let dead_c = constant(&mut g, &[2, 3], 1);
    let _dead = add(&mut g, x, dead_c);
    let y = act(&mut g, Activation::Relu, x);
    g.set_outputs(vec![y]);
    let (h, r) = Dce.run(&g, &|_| true).unwrap();
    h.verify().unwrap();
    assert_eq!(r.get("removed"), Some(&3), "{h}");
    let names: Vec<String> = h.nodes().iter().map(|n| n.op.describe()).collect();
    assert_eq!(names, ["Input(x)", "Input(unused)", "Activation(Relu)"]);
    // A second run changes nothing.
    let (h2, r2) = Dce.run(&h, &|_| true).unwrap();
    assert!(r2.is_empty());
    assert_eq!(h2, h);
}

#[test]
fn side_effecting_cache_writes_survive_dce_and_cse() {
    let mut g = Graph::new("cache");
    let cache = param(&mut g, "k_cache", &[1, 8, 4]);
    let rows = input(&mut g, "rows", &[1, 2, 4]);
    let pos = g.input("pos", Shape::new(&[1], rlx_ir::DType::I64));
    let w1 = push(&mut g, Op::CacheWrite { axis: 1 }, &[cache, rows, pos]);
    let _w2 = push(&mut g, Op::CacheWrite { axis: 1 }, &[cache, rows, pos]);
    let _dead = act(&mut g, Activation::Neg, w1);
    let y = act(&mut g, Activation::Relu, rows);
    g.set_outputs(vec![y]);
    assert!(rlx_opt::has_side_effect(&Op::CacheWrite { axis: 1 }));
    let (h, r) = opt(&g);
    assert_eq!(r.count("dce", "removed"), 1, "only the Neg goes: {r}\n{h}");
    assert_eq!(r.total("cse"), 0);
    assert_eq!(count(&h, |o| matches!(o, Op::CacheWrite { .. })), 2);
    assert_eq!(count(&h, |o| matches!(o, Op::Param { .. })), 1);
}

#[test]
fn cse_merges_identical_nodes_but_not_distinct_leaves() {
    let mut g = Graph::new("cse");
    let x = input(&mut g, "x", &[4, 4]);
    let p = param(&mut g, "p", &[4]);
    let q = param(&mut g, "q", &[4]);
    let a1 = add(&mut g, x, p);
    let a2 = add(&mut g, x, p); // duplicate of a1
    let a3 = add(&mut g, x, q); // different param: not a duplicate
    let r1 = act(&mut g, Activation::Relu, a1);
    let r2 = act(&mut g, Activation::Relu, a2); // duplicate once a2 merges
    let s = add(&mut g, r1, r2);
    let t = add(&mut g, s, a3);
    g.set_outputs(vec![t, r2]);
    let (h, r) = Cse.run(&g, &|_| true).unwrap();
    h.verify().unwrap();
    assert_eq!(r.get("merged"), Some(&2), "{h}");
    assert_eq!(h.len(), g.len() - 2);
    assert_eq!(count(&h, |o| matches!(o, Op::Param { .. })), 2);
    assert_same(&g, &h, 1, 0.0);
}

#[test]
fn cse_merges_constants_bitwise_only() {
    let mut g = Graph::new("consts");
    let x = input(&mut g, "x", &[3]);
    let c0 = g.constant(Tensor::f32(&[3], vec![0.0, 1.0, 2.0]));
    let c1 = g.constant(Tensor::f32(&[3], vec![0.0, 1.0, 2.0]));
    let c2 = g.constant(Tensor::f32(&[3], vec![-0.0, 1.0, 2.0]));
    let a = add(&mut g, x, c0);
    let b = add(&mut g, x, c1);
    let c = push(&mut g, Op::Binary(rlx_ir::BinaryOp::Div), &[x, c2]);
    g.set_outputs(vec![a, b, c]);
    let (h, r) = opt_with(&g, &OptOptions::cleanup_only());
    // c1 merges into c0, then b into a; -0.0 stays apart.
    assert_eq!(r.count("cse", "merged"), 2, "{r}");
    assert_eq!(count(&h, |o| matches!(o, Op::Constant { .. })), 2);
    assert_eq!(h.outputs[0], h.outputs[1]);
    assert_same(&g, &h, 2, 0.0);
}

#[test]
fn constant_subgraphs_fold_to_one_constant() {
    let mut g = Graph::new("fold");
    let x = input(&mut g, "x", &[2, 4]);
    let c0 = constant(&mut g, &[4, 4], 3);
    let c1 = constant(&mut g, &[4], 4);
    let t = push(&mut g, Op::Transpose { perm: vec![1, 0] }, &[c0]);
    let e = act(&mut g, Activation::Exp, t);
    let s = add(&mut g, e, c1);
    let y = matmul(&mut g, x, s);
    g.set_outputs(vec![y]);
    let (h, r) = opt_with(&g, &OptOptions::cleanup_only());
    assert_eq!(r.count("const_fold", "folded"), 3, "{r}");
    assert_eq!(count(&h, |o| matches!(o, Op::Constant { .. })), 1, "{h}");
    assert_eq!(h.len(), 3, "x, the folded constant, the matmul: {h}");
    assert_same(&g, &h, 5, TOL);
}

#[test]
fn fold_respects_the_size_limit() {
    let mut g = Graph::new("big");
    let c = constant(&mut g, &[1], 6);
    let e = push(
        &mut g,
        Op::Expand {
            shape: vec![64, 64],
        },
        &[c],
    );
    let x = input(&mut g, "x", &[64, 64]);
    let y = add(&mut g, x, e);
    g.set_outputs(vec![y]);
    let o = OptOptions {
        fold_max_elements: 1000,
        ..OptOptions::cleanup_only()
    };
    let (h, r) = opt_with(&g, &o);
    assert_eq!(r.total("const_fold"), 0, "{r}");
    assert_eq!(count(&h, |o| matches!(o, Op::Expand { .. })), 1);
    let (h, r) = opt_with(&g, &OptOptions::cleanup_only());
    assert_eq!(r.count("const_fold", "folded"), 1);
    assert_same(&g, &h, 7, TOL);
}

#[test]
fn fold_limits_matmul_work_not_just_output_size() {
    let mut g = Graph::new("mm");
    let a = constant(&mut g, &[16, 64], 8);
    let b = constant(&mut g, &[64, 16], 9);
    let c = matmul(&mut g, a, b); // 256 outputs, 16384 multiply-adds
    let x = input(&mut g, "x", &[16, 16]);
    let y = add(&mut g, x, c);
    g.set_outputs(vec![y]);
    let o = OptOptions {
        fold_max_elements: 10_000,
        ..OptOptions::cleanup_only()
    };
    let (_, r) = opt_with(&g, &o);
    assert_eq!(r.total("const_fold"), 0, "{r}");
    let (h, r) = opt_with(&g, &OptOptions::cleanup_only());
    assert_eq!(r.count("const_fold", "folded"), 1, "{r}");
    assert_eq!(count(&h, |o| *o == Op::MatMul), 0);
    assert_same(&g, &h, 10, TOL);
}

#[test]
fn optimize_rejects_an_invalid_graph_with_a_typed_error() {
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", &[2, 3]);
    let w = param(&mut g, "w", &[4, 5]);
    let y = g.matmul(x, w, Shape::f32(&[2, 5]));
    g.set_outputs(vec![y]);
    let err = optimize(&g, &OptOptions::default()).unwrap_err();
    match &err {
        OptError::InvalidInput { graph, .. } => assert_eq!(graph, "bad"),
        e => panic!("unexpected error {e}"),
    }
    assert!(err.to_string().contains("K"), "{err}");
}

#[test]
fn rewriter_rejects_shape_changes_and_dangling_reads() {
    let mut g = Graph::new("rw");
    let x = input(&mut g, "x", &[2, 3]);
    let y = act(&mut g, Activation::Relu, x);
    let z = act(&mut g, Activation::Neg, y);
    g.set_outputs(vec![z]);

    // Mapping y onto a node of another shape is refused.
    let mut rw = Rewriter::new("test", &g);
    let nx = rw.copy(x).unwrap();
    let r = rw
        .emit(Op::Reshape { shape: vec![3, 2] }, vec![nx], y)
        .unwrap();
    let err = rw.set(y, r).unwrap_err();
    assert!(
        matches!(err, OptError::ShapeChanged { origin, .. } if origin == y),
        "{err}"
    );

    // Dropping y without a replacement makes z's copy fail, naming both.
    let mut rw = Rewriter::new("test", &g);
    rw.copy(x).unwrap();
    let err = rw.copy(z).unwrap_err();
    assert!(
        matches!(err, OptError::Dangling { input, .. } if input == y),
        "{err}"
    );
    assert!(err.to_string().contains("Activation"), "{err}");

    // Bad ids are errors, not panics.
    let rw = Rewriter::new("test", &g);
    assert!(matches!(rw.map(NodeId(99)), Err(OptError::BadId { .. })));
    // An unmapped output is reported at finish.
    let mut rw = Rewriter::new("test", &g);
    rw.copy(x).unwrap();
    assert!(matches!(rw.finish(), Err(OptError::Dangling { .. })));
}

#[test]
fn fixpoint_terminates_and_reports_every_pass() {
    let mut g = Graph::new("id");
    let x = input(&mut g, "x", &[2, 3]);
    let y = act(&mut g, Activation::Relu, x);
    g.set_outputs(vec![y]);
    let (h, r) = opt(&g);
    assert_eq!(h, g);
    assert_eq!(r.iterations, 1);
    for p in [
        "cse",
        "dce",
        "const_fold",
        "fuse_qkv",
        "fuse_matmul_bias_act",
        "fuse_residual_norm",
        "fuse_swiglu",
    ] {
        assert!(r.passes.contains_key(p), "{p} missing from {r}");
        assert_eq!(r.total(p), 0);
    }
    let (h, r) = opt_with(&g, &OptOptions::none());
    assert_eq!(h, g);
    assert!(r.passes.is_empty());
}

#[test]
fn passes_reject_unverified_graphs_without_panicking() {
    // A MatMul recorded with one input: every pass must refuse it.
    let mut g = Graph::new("broken");
    let x = input(&mut g, "x", &[2, 3]);
    let y = g.add_node(Op::MatMul, vec![x], Shape::f32(&[2, 3]));
    let z = g.add_node(
        Op::Binary(rlx_ir::BinaryOp::Add),
        vec![y, NodeId(77)],
        Shape::f32(&[2, 3]),
    );
    g.set_outputs(vec![z]);
    let passes: Vec<Box<dyn Pass>> = vec![
        Box::new(Dce),
        Box::new(Cse),
        Box::new(rlx_opt::ConstFold::default()),
        Box::new(rlx_opt::FuseQkv),
        Box::new(rlx_opt::FuseMatMulBiasAct),
        Box::new(rlx_opt::FuseResidualNorm),
        Box::new(rlx_opt::FuseSwiGlu),
    ];
    for p in passes {
        let err = p.run(&g, &|_| true).unwrap_err();
        assert!(
            matches!(err, OptError::PassInput { .. }),
            "{}: {err}",
            p.name()
        );
    }
}
