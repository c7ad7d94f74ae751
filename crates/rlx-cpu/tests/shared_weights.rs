//! `CpuModel::compile_sharing`: models of one graph family at different
//! batch shapes hold one copy of the params, param-only results and packed
//! weights, and stay independent under `set_param`.

use rlx_cpu::{CpuModel, CpuOptions};
use rlx_ir::{Graph, Op, Shape};
use rlx_runtime::{Executable, TensorRef};
use std::sync::Arc;

const K: usize = 24;
const N: usize = 20;

/// `x [b, K] @ concat(w1, w2) [K, 2N]`: the concat is param-only (a prep
/// output), and the matmul packs it.
fn graph(b: usize) -> Graph {
    let f = |d: &[usize]| Shape::new(d, rlx_ir::DType::F32);
    let mut g = Graph::new("family");
    let x = g.input("x", f(&[b, K]));
    let w1 = g.param("w1", f(&[K, N]));
    let w2 = g.param("w2", f(&[K, N]));
    let w = g.add_node(Op::Concat { axis: 1 }, vec![w1, w2], f(&[K, 2 * N]));
    let y = g.matmul(x, w, f(&[b, 2 * N]));
    g.set_outputs(vec![y]);
    g
}

fn vals(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
}

fn run(m: &mut CpuModel, b: usize) -> Vec<f32> {
    let x = vals(b * K, 0.5);
    m.run(&[("x", TensorRef::F32(&x))]).unwrap()[0]
        .as_f32()
        .unwrap()
        .to_vec()
}

fn fresh(b: usize, w1: &[f32], w2: &[f32], hybrid: bool) -> CpuModel {
    let mut m = CpuModel::compile(
        graph(b),
        &CpuOptions {
            hybrid,
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    m.set_param("w1", TensorRef::F32(w1)).unwrap();
    m.set_param("w2", TensorRef::F32(w2)).unwrap();
    m
}

#[test]
fn shapes_share_packed_weights_and_stay_exact() {
    let (w1, w2) = (vals(K * N, 1.0), vals(K * N, 2.0));
    for hybrid in [false, true] {
        let mut a = fresh(2, &w1, &w2, hybrid);
        let ya = run(&mut a, 2);
        let mut b = a.compile_sharing(graph(5)).unwrap();
        let yb = run(&mut b, 5);
        // Same values as a model compiled on its own.
        assert_eq!(yb, run(&mut fresh(5, &w1, &w2, hybrid), 5));
        assert_eq!(ya, run(&mut a, 2));
        // One packed copy (of the concatenated weight), held by both.
        let (pa, pb) = (a.packed_weights(), b.packed_weights());
        assert_eq!(pa.len(), 1, "hybrid={hybrid}");
        assert_eq!(pb.len(), 1);
        assert!(Arc::ptr_eq(&pa[0], &pb[0]), "hybrid={hybrid}");
        // a, b and the two handles here.
        assert_eq!(Arc::strong_count(&pa[0]), 4);
        assert_eq!(a.packed_bytes(), b.packed_bytes());
        assert!(a.packed_bytes() >= K * 2 * N * 4);
        // The arena is per shape.
        assert!(b.plan_bytes() > a.plan_bytes());
        drop((pa, pb));

        // A new value on b is b's alone: a keeps its weights.
        let w1b = vals(K * N, 3.0);
        b.set_param("w1", TensorRef::F32(&w1b)).unwrap();
        assert_eq!(run(&mut b, 5), run(&mut fresh(5, &w1b, &w2, hybrid), 5));
        assert_eq!(run(&mut a, 2), ya);
        assert!(!Arc::ptr_eq(&a.packed_weights()[0], &b.packed_weights()[0]));

        // Sharing applies a's own pending change first.
        a.set_param("w2", TensorRef::F32(&w1b)).unwrap();
        let mut c = a.compile_sharing(graph(3)).unwrap();
        assert_eq!(run(&mut c, 3), run(&mut fresh(3, &w1, &w1b, hybrid), 3));
        assert!(Arc::ptr_eq(&a.packed_weights()[0], &c.packed_weights()[0]));
    }
}

#[test]
fn a_param_of_another_shape_is_not_shared() {
    let (w1, w2) = (vals(K * N, 1.0), vals(K * N, 2.0));
    let mut a = fresh(2, &w1, &w2, true);
    run(&mut a, 2);
    // Same names, other shapes: nothing carries over, so running without
    // setting them is an error naming the param.
    let f = |d: &[usize]| Shape::new(d, rlx_ir::DType::F32);
    let mut g = Graph::new("other");
    let x = g.input("x", f(&[2, K + 1]));
    let w1 = g.param("w1", f(&[K + 1, N]));
    let y = g.matmul(x, w1, f(&[2, N]));
    g.set_outputs(vec![y]);
    let mut b = a.compile_sharing(g).unwrap();
    let x = vals(2 * (K + 1), 0.0);
    let err = b.run(&[("x", TensorRef::F32(&x))]).unwrap_err().to_string();
    assert!(err.contains("w1"), "{err}");
    assert!(b.packed_weights().is_empty());
}

#[test]
fn a_model_missing_params_shares_what_it_has() {
    let (w1, w2) = (vals(K * N, 1.0), vals(K * N, 2.0));
    let mut a = fresh(2, &w1, &w2, true);
    let ya = run(&mut a, 2);
    // w2 gone: the concat and its packed copy in `a` are out of date and
    // must not be handed on; w1 is.
    assert!(a.take_param("w2").is_some());
    let mut b = a.compile_sharing(graph(2)).unwrap();
    assert!(b.packed_weights().is_empty());
    let x = vals(2 * K, 0.5);
    let err = b.run(&[("x", TensorRef::F32(&x))]).unwrap_err().to_string();
    assert!(err.contains("w2"), "{err}");
    b.set_param("w2", TensorRef::F32(&w2)).unwrap();
    assert_eq!(run(&mut b, 2), ya);
}

/// `x [b, K] @ concat(w1, w2) + rows 0..b of a table`: two param-only
/// results, one the same at every batch size and one that is not.
fn graph_with_rows(b: usize) -> Graph {
    let f = |d: &[usize]| Shape::new(d, rlx_ir::DType::F32);
    let mut g = Graph::new("family_rows");
    let x = g.input("x", f(&[b, K]));
    let w1 = g.param("w1", f(&[K, N]));
    let w2 = g.param("w2", f(&[K, N]));
    let table = g.param("table", f(&[8, 2 * N]));
    let w = g.add_node(Op::Concat { axis: 1 }, vec![w1, w2], f(&[K, 2 * N]));
    let rows = g.add_node(
        Op::Narrow {
            axis: 0,
            start: 0,
            len: b,
        },
        vec![table],
        f(&[b, 2 * N]),
    );
    let y = g.matmul(x, w, f(&[b, 2 * N]));
    let z = g.add_node(
        Op::Binary(rlx_ir::BinaryOp::Add),
        vec![y, rows],
        f(&[b, 2 * N]),
    );
    g.set_outputs(vec![z]);
    g
}

/// A new shape takes the param-only results it shares (the concatenated
/// weight and its packed copy) and computes only its own (its table rows):
/// the values equal a model compiled alone, at each shape in turn.
#[test]
fn a_new_shape_computes_only_the_param_only_results_it_does_not_share() {
    let (w1, w2, table) = (vals(K * N, 1.0), vals(K * N, 2.0), vals(8 * 2 * N, 3.0));
    let alone = |b: usize, hybrid: bool| {
        let mut m = CpuModel::compile(
            graph_with_rows(b),
            &CpuOptions {
                hybrid,
                threads: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        m.set_param("w1", TensorRef::F32(&w1)).unwrap();
        m.set_param("w2", TensorRef::F32(&w2)).unwrap();
        m.set_param("table", TensorRef::F32(&table)).unwrap();
        m
    };
    for hybrid in [false, true] {
        let mut a = alone(2, hybrid);
        let ya = run(&mut a, 2);
        assert_eq!(ya, run(&mut alone(2, hybrid), 2));
        let mut donor = a;
        for b in [5, 3, 8, 1] {
            let mut next = donor.compile_sharing(graph_with_rows(b)).unwrap();
            let got = run(&mut next, b);
            assert_eq!(got, run(&mut alone(b, hybrid), b), "b={b} hybrid={hybrid}");
            assert!(Arc::ptr_eq(
                &donor.packed_weights()[0],
                &next.packed_weights()[0]
            ));
            // A later change of a shared param recomputes every result.
            if b == 8 {
                let t2 = vals(8 * 2 * N, 4.0);
                next.set_param("table", TensorRef::F32(&t2)).unwrap();
                let mut fresh8 = alone(8, hybrid);
                fresh8.set_param("table", TensorRef::F32(&t2)).unwrap();
                assert_eq!(run(&mut next, 8), run(&mut fresh8, 8));
                next.set_param("table", TensorRef::F32(&table)).unwrap();
            }
            donor = next;
        }
    }
}
