//! Shared test helpers: graph building shorthands, deterministic data and
//! comparison against the reference interpreter.
#![allow(dead_code)]

use rlx_ir::{Activation, BinaryOp, DType, Graph, NodeId, Op, Shape, Tensor};
use rlx_opt::{optimize, OptOptions, OptReport};
use std::collections::HashMap;

/// Deterministic values in [-1, 1) from a seed (xorshift).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// An f32 constant with deterministic data.
pub fn constant(g: &mut Graph, dims: &[usize], seed: u64) -> NodeId {
    let n = dims.iter().product();
    g.constant(Tensor::f32(dims, data(n, seed)))
}

/// Append `op` with inferred shape; panics (test bug) if it does not infer.
pub fn push(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs.to_vec()).expect("test graph node")
}

/// `a + b`.
pub fn add(g: &mut Graph, a: NodeId, b: NodeId) -> NodeId {
    push(g, Op::Binary(BinaryOp::Add), &[a, b])
}

/// `a * b`.
pub fn mul(g: &mut Graph, a: NodeId, b: NodeId) -> NodeId {
    push(g, Op::Binary(BinaryOp::Mul), &[a, b])
}

/// `a x b`.
pub fn matmul(g: &mut Graph, a: NodeId, b: NodeId) -> NodeId {
    push(g, Op::MatMul, &[a, b])
}

/// `act(x)`.
pub fn act(g: &mut Graph, a: Activation, x: NodeId) -> NodeId {
    push(g, Op::Activation(a), &[x])
}

/// `LayerNorm(x, gamma, beta)` over the last axis.
pub fn layer_norm(g: &mut Graph, x: NodeId, gamma: NodeId, beta: NodeId) -> NodeId {
    push(
        g,
        Op::LayerNorm {
            axis: -1,
            eps: 1e-5,
        },
        &[x, gamma, beta],
    )
}

/// An f32 param.
pub fn param(g: &mut Graph, name: &str, dims: &[usize]) -> NodeId {
    g.param(name, Shape::f32(dims))
}

/// An f32 input.
pub fn input(g: &mut Graph, name: &str, dims: &[usize]) -> NodeId {
    g.input(name, Shape::f32(dims))
}

/// Deterministic values for every Input and Param of `g` (f32 only).
pub fn bindings(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    let mut m = HashMap::new();
    for n in g.nodes() {
        if let Op::Input { name } | Op::Param { name } = &n.op {
            assert_eq!(n.shape.dtype, DType::F32, "test binds f32 only");
            let s = seed ^ (n.id.0 as u64).wrapping_mul(7919);
            m.insert(
                name.clone(),
                Tensor::f32(&n.shape.dims, data(n.shape.numel(), s)),
            );
        }
    }
    m
}

/// Run both graphs under the reference interpreter with the same bindings
/// and assert every output agrees within `|a - b| <= tol * (1 + |b|)`.
pub fn assert_same(orig: &Graph, opt: &Graph, seed: u64, tol: f32) {
    let b = bindings(orig, seed);
    let want = rlx_ref::run(orig, &b).expect("reference run of the original graph");
    let got = rlx_ref::run(opt, &b).expect("reference run of the optimized graph");
    assert_eq!(want.len(), got.len(), "output count");
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.shape, o.shape, "output {i} shape");
        let (w, o) = (
            w.as_f32().expect("f32 output"),
            o.as_f32().expect("f32 output"),
        );
        for (j, (x, y)) in w.iter().zip(o).enumerate() {
            let ok = x == y || (x - y).abs() <= tol * (1.0 + x.abs()) || (x.is_nan() && y.is_nan());
            assert!(ok, "output {i} element {j}: original {x}, optimized {y}");
        }
    }
}

/// Optimize with default options, assert the result verifies, and return it.
pub fn opt(g: &Graph) -> (Graph, OptReport) {
    opt_with(g, &OptOptions::default())
}

/// Optimize with `o`, assert the result verifies, and return it.
pub fn opt_with(g: &Graph, o: &OptOptions) -> (Graph, OptReport) {
    g.verify().expect("test graph verifies");
    let (h, r) = optimize(g, o).expect("optimize");
    h.verify().expect("optimized graph verifies");
    (h, r)
}

/// How many nodes of `g` satisfy `f`.
pub fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| f(&n.op)).count()
}
