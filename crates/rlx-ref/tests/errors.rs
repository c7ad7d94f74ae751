//! Bad input yields typed errors, never panics.

#![allow(clippy::needless_range_loop, clippy::cloned_ref_to_slice_refs)]

mod common;
use common::*;
use rlx_ir::{DType, Graph, NodeId, Op, Shape, Tensor, TensorData};
use rlx_ref::RefError;
use std::collections::HashMap;
use std::sync::Arc;

fn relu_graph() -> Graph {
    let mut g = Graph::new("g");
    let x = g.input("x", Shape::f32(&[2, 3]));
    let w = g.param("w", Shape::f32(&[3]));
    let y = g
        .push(Op::Binary(rlx_ir::BinaryOp::Mul), vec![x, w])
        .unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn missing_binding_names_the_leaf() {
    let g = relu_graph();
    let bind = HashMap::from([("x".to_string(), t(&[2, 3], &[0.0; 6]))]);
    let err = rlx_ref::run(&g, &bind).unwrap_err();
    assert_eq!(
        err,
        RefError::MissingBinding {
            node: NodeId(1),
            kind: "param",
            name: "w".into(),
            expected: Shape::f32(&[3]),
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("'w'") && msg.contains("f32[3]"), "{msg}");
}

#[test]
fn wrong_shape_dtype_or_length_is_rejected() {
    let g = relu_graph();
    let good_w = t(&[3], &[1.0; 3]);
    let cases = [
        t(&[3, 2], &[0.0; 6]),              // wrong dims
        Tensor::i32(&[2, 3], vec![0; 6]),   // wrong dtype
        Tensor::f32(&[2, 3], vec![0.0; 5]), // data shorter than the shape
        Tensor {
            shape: Shape::f32(&[2, 3]),
            data: Arc::new(TensorData::I64(vec![0; 6])), // data of another dtype
        },
    ];
    for bad in cases {
        let bind = HashMap::from([
            ("x".to_string(), bad.clone()),
            ("w".to_string(), good_w.clone()),
        ]);
        match rlx_ref::run(&g, &bind) {
            Err(RefError::BadBinding {
                node,
                name,
                expected,
                got,
                ..
            }) => {
                assert_eq!(node, NodeId(0));
                assert_eq!(name, "x");
                assert_eq!(expected, Shape::f32(&[2, 3]));
                assert_eq!(got, bad.shape);
            }
            other => panic!("expected BadBinding, got {other:?}"),
        }
    }
}

#[test]
fn gather_out_of_range_is_an_error() {
    let table = t(&[3, 2], &[0.0; 6]);
    for (ids, bad_id, pos) in [
        (Tensor::i64(&[3], vec![0, 3, 1]), 3, 1),
        (Tensor::i32(&[2], vec![1, -1]), -1, 1),
        (Tensor::i64(&[1], vec![i64::MAX]), i64::MAX, 0),
    ] {
        let err = run_op(Op::Gather { axis: 0 }, &[table.clone(), ids]).unwrap_err();
        assert_eq!(
            err,
            RefError::IndexOutOfRange {
                node: NodeId(2),
                id: bad_id,
                position: pos,
                rows: 3,
            }
        );
        assert!(err.to_string().contains("3 rows"));
    }
}

#[test]
fn invalid_graphs_are_rejected_before_running() {
    // A recorded shape that disagrees with inference.
    let mut g = Graph::new("bad");
    let x = g.input("x", Shape::f32(&[2]));
    let y = g.add_node(
        Op::Activation(rlx_ir::Activation::Relu),
        vec![x],
        Shape::f32(&[3]),
    );
    g.set_outputs(vec![y]);
    let bind = HashMap::from([("x".to_string(), t(&[2], &[1.0, 2.0]))]);
    assert!(matches!(
        rlx_ref::run(&g, &bind),
        Err(RefError::InvalidGraph(_))
    ));
    assert!(matches!(
        rlx_ref::run_all(&g, &bind),
        Err(RefError::InvalidGraph(_))
    ));
    // No outputs.
    let mut g = Graph::new("empty");
    g.input("x", Shape::f32(&[2]));
    assert!(matches!(
        rlx_ref::run(&g, &bind),
        Err(RefError::InvalidGraph(_))
    ));
    // Lstm weights of the wrong packing.
    let err = run_op(
        Op::Lstm {
            hidden_size: 2,
            num_layers: 1,
            bidirectional: false,
            carry: false,
        },
        &[
            t(&[1, 1, 3], &[0.0; 3]),
            t(&[1, 8, 2], &[0.0; 16]),
            t(&[1, 8, 2], &[0.0; 16]),
            t(&[1, 8], &[0.0; 8]),
        ],
    )
    .unwrap_err();
    assert!(matches!(err, RefError::InvalidGraph(_)), "{err}");
    assert!(err.to_string().contains("w_ih"), "{err}");
}

#[test]
fn unsupported_dtypes_are_errors() {
    for to in [DType::F16, DType::BF16] {
        let err = run_op(Op::Cast { to }, &[t(&[1], &[1.0])]).unwrap_err();
        assert!(
            matches!(&err, RefError::Unsupported { node, op: "Cast", .. } if *node == NodeId(1)),
            "{err}"
        );
    }
}

#[test]
fn non_finite_inputs_do_not_panic() {
    let x = t(&[1, 4], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0]);
    for op in [
        Op::Softmax { axis: 1 },
        Op::Reduce {
            op: rlx_ir::ReduceOp::Mean,
            axes: vec![1],
            keep_dims: false,
        },
        Op::Cast { to: DType::I32 },
    ] {
        run_op(op, std::slice::from_ref(&x)).unwrap();
    }
    let y = run_f32(
        Op::Attention {
            num_heads: 1,
            head_dim: 4,
            mask_kind: rlx_ir::MaskKind::Causal,
            score_scale: None,
            attn_logit_softcap: None,
        },
        &[x.reshape1(), x.reshape1(), x.reshape1()],
    );
    assert_eq!(y.len(), 4);
}

trait Reshape1 {
    fn reshape1(&self) -> Tensor;
}

impl Reshape1 for Tensor {
    /// `[1, 4]` -> `[1, 1, 4]`.
    fn reshape1(&self) -> Tensor {
        Tensor {
            shape: Shape::f32(&[1, 1, 4]),
            data: self.data.clone(),
        }
    }
}
