//! Shared helpers: build one-op graphs, run them, compare values.
#![allow(dead_code)]

use rlx_ir::{Graph, Op, Shape, Tensor};
use rlx_ref::RefError;
use std::collections::HashMap;

/// Build a graph whose inputs are `in0, in1, ..` (shaped like `inputs`),
/// apply `op` to them, and run it through the reference interpreter.
pub fn run_op(op: Op, inputs: &[Tensor]) -> Result<Tensor, RefError> {
    let mut g = Graph::new("test");
    let mut ids = Vec::new();
    let mut bind = HashMap::new();
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("in{i}");
        ids.push(g.input(&name, t.shape.clone()));
        bind.insert(name, t.clone());
    }
    let out = g.push(op, ids)?;
    g.set_outputs(vec![out]);
    let mut outs = rlx_ref::run(&g, &bind)?;
    Ok(outs.remove(0))
}

/// `run_op` that must succeed; returns the f32 elements.
pub fn run_f32(op: Op, inputs: &[Tensor]) -> Vec<f32> {
    let t = run_op(op, inputs).expect("reference run failed");
    t.as_f32().expect("f32 output").to_vec()
}

/// An f32 tensor.
pub fn t(dims: &[usize], data: &[f32]) -> Tensor {
    assert_eq!(dims.iter().product::<usize>(), data.len());
    Tensor::f32(dims, data.to_vec())
}

/// A shape-only f32 placeholder.
pub fn sh(dims: &[usize]) -> Shape {
    Shape::f32(dims)
}

/// Assert `got` equals `want` elementwise within `tol` (absolute + relative).
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g);
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || g == w || (g.is_nan() && w.is_nan());
        assert!(
            ok,
            "element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// A deterministic pseudo-random f32 vector in [-1, 1).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// Widen to f64.
pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}
