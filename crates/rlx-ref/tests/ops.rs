//! Dense, elementwise, normalization and layout ops against hand-computed values.

#![allow(clippy::needless_range_loop, clippy::cloned_ref_to_slice_refs)]

mod common;
use common::*;
use rlx_ir::{Activation, BinaryOp, DType, Graph, Op, ReduceOp, Shape, Tensor, TensorData};
use std::collections::HashMap;

#[test]
fn matmul_2x3_by_3x2() {
    let a = t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = t(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    // [1 2 3; 4 5 6] x [7 8; 9 10; 11 12] = [58 64; 139 154]
    let got = run_f32(Op::MatMul, &[a, b]);
    assert_close(&got, &[58.0, 64.0, 139.0, 154.0], 0.0);
}

#[test]
fn matmul_broadcasts_batch_dims() {
    // a [2,1,2,2] x b [3,2,2] -> [2,3,2,2]; out[i][j] = a[i] x b[j].
    let av = rand_vec(8, 1);
    let bv = rand_vec(12, 2);
    let got = run_f32(Op::MatMul, &[t(&[2, 1, 2, 2], &av), t(&[3, 2, 2], &bv)]);
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            let a = &av[i * 4..i * 4 + 4];
            let b = &bv[j * 4..j * 4 + 4];
            for r in 0..2 {
                for c in 0..2 {
                    want.push(
                        f64::from(a[r * 2]) * f64::from(b[c])
                            + f64::from(a[r * 2 + 1]) * f64::from(b[2 + c]),
                    );
                }
            }
        }
    }
    assert_close(&got, &want, 1e-6);
}

#[test]
fn fused_matmul_bias_act() {
    let a = t(&[1, 2], &[1.0, -1.0]);
    let b = t(&[2, 2], &[1.0, 2.0, 3.0, 1.0]);
    let bias = t(&[2], &[0.5, 0.0]);
    // a x b = [-2, 1]; + bias = [-1.5, 1]
    let none = run_f32(
        Op::FusedMatMulBiasAct { activation: None },
        &[a.clone(), b.clone(), bias.clone()],
    );
    assert_close(&none, &[-1.5, 1.0], 0.0);
    let relu = run_f32(
        Op::FusedMatMulBiasAct {
            activation: Some(Activation::Relu),
        },
        &[a, b, bias],
    );
    assert_close(&relu, &[0.0, 1.0], 0.0);
}

#[test]
fn binary_broadcasting() {
    let a = t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let row = t(&[3], &[10.0, 20.0, 30.0]);
    let got = run_f32(Op::Binary(BinaryOp::Add), &[a.clone(), row]);
    assert_close(&got, &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0], 0.0);
    // Outer product via [2,1] * [1,3].
    let col = t(&[2, 1], &[1.0, 2.0]);
    let r = t(&[1, 3], &[3.0, 4.0, 5.0]);
    let got = run_f32(Op::Binary(BinaryOp::Mul), &[col, r]);
    assert_close(&got, &[3.0, 4.0, 5.0, 6.0, 8.0, 10.0], 0.0);
    let got = run_f32(Op::Binary(BinaryOp::Sub), &[a.clone(), t(&[1], &[1.0])]);
    assert_close(&got, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 0.0);
    let got = run_f32(
        Op::Binary(BinaryOp::Div),
        &[a.clone(), t(&[2, 1], &[2.0, 4.0])],
    );
    assert_close(&got, &[0.5, 1.0, 1.5, 1.0, 1.25, 1.5], 0.0);
    let got = run_f32(Op::Binary(BinaryOp::Pow), &[a, t(&[1], &[2.0])]);
    assert_close(&got, &[1.0, 4.0, 9.0, 16.0, 25.0, 36.0], 0.0);
}

#[test]
fn max_min_propagate_nan() {
    let a = t(&[3], &[1.0, f32::NAN, 5.0]);
    let b = t(&[3], &[2.0, 0.0, f32::NAN]);
    let mx = run_f32(Op::Binary(BinaryOp::Max), &[a.clone(), b.clone()]);
    assert_eq!(mx[0], 2.0);
    assert!(mx[1].is_nan() && mx[2].is_nan());
    let mn = run_f32(Op::Binary(BinaryOp::Min), &[a, b]);
    assert_eq!(mn[0], 1.0);
    assert!(mn[1].is_nan() && mn[2].is_nan());
}

#[test]
fn layer_norm_normalizes() {
    let x = rand_vec(4 * 16, 3)
        .iter()
        .map(|v| v * 5.0 + 2.0)
        .collect::<Vec<_>>();
    let ones = t(&[16], &[1.0; 16]);
    let zeros = t(&[16], &[0.0; 16]);
    let got = run_f32(
        Op::LayerNorm { axis: -1, eps: 0.0 },
        &[t(&[4, 16], &x), ones, zeros],
    );
    for row in got.chunks(16) {
        let m: f64 = f64s(row).iter().sum::<f64>() / 16.0;
        let v: f64 = f64s(row).iter().map(|x| (x - m) * (x - m)).sum::<f64>() / 16.0;
        assert!(m.abs() < 1e-6, "mean {m}");
        assert!((v - 1.0).abs() < 1e-5, "var {v}");
    }
    // Hand values: x = [1, 2, 3], mean 2, biased var 2/3.
    let eps = 1e-5f32;
    let got = run_f32(
        Op::LayerNorm { axis: 1, eps },
        &[
            t(&[1, 3], &[1.0, 2.0, 3.0]),
            t(&[3], &[1.0, 2.0, 3.0]),
            t(&[3], &[0.5, 0.5, 0.5]),
        ],
    );
    let inv = 1.0 / (2.0 / 3.0 + f64::from(eps)).sqrt();
    assert_close(&got, &[-inv + 0.5, 0.5, 3.0 * inv + 0.5], 1e-6);
}

#[test]
fn rms_norm_hand_values() {
    // x = [3, 4]: mean square 12.5.
    let got = run_f32(
        Op::RmsNorm { axis: -1, eps: 0.0 },
        &[t(&[1, 2], &[3.0, 4.0]), t(&[2], &[1.0, 2.0])],
    );
    let r = 12.5f64.sqrt();
    assert_close(&got, &[3.0 / r, 8.0 / r], 1e-7);
}

#[test]
fn fused_residual_norms_equal_norm_of_sum() {
    let x = rand_vec(12, 4);
    let r = rand_vec(12, 5);
    let bias = rand_vec(4, 6);
    let g = rand_vec(4, 7);
    let b = rand_vec(4, 8);
    let sum: Vec<f32> = (0..12).map(|i| x[i] + r[i] + bias[i % 4]).collect();
    let eps = 1e-5;
    let fused = run_f32(
        Op::FusedResidualLN {
            has_bias: true,
            eps,
        },
        &[
            t(&[3, 4], &x),
            t(&[3, 4], &r),
            t(&[4], &bias),
            t(&[4], &g),
            t(&[4], &b),
        ],
    );
    let plain = run_f32(
        Op::LayerNorm { axis: -1, eps },
        &[t(&[3, 4], &sum), t(&[4], &g), t(&[4], &b)],
    );
    assert_close(&fused, &f64s(&plain), 1e-5);
    let sum2: Vec<f32> = (0..12).map(|i| x[i] + r[i]).collect();
    let fused = run_f32(
        Op::FusedResidualRmsNorm {
            has_bias: false,
            eps,
        },
        &[t(&[3, 4], &x), t(&[3, 4], &r), t(&[4], &g)],
    );
    let plain = run_f32(
        Op::RmsNorm { axis: -1, eps },
        &[t(&[3, 4], &sum2), t(&[4], &g)],
    );
    assert_close(&fused, &f64s(&plain), 1e-5);
}

#[test]
fn reshape_expand_narrow_transpose() {
    let x = t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = run_op(Op::Reshape { shape: vec![3, 2] }, &[x.clone()]).unwrap();
    assert_eq!(r.shape.dims, [3, 2]);
    assert_eq!(r.as_f32().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let e = run_f32(
        Op::Expand { shape: vec![2, 3] },
        &[t(&[3], &[1.0, 2.0, 3.0])],
    );
    assert_close(&e, &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0], 0.0);
    let e = run_f32(
        Op::Expand {
            shape: vec![2, 2, 3],
        },
        &[t(&[2, 1], &[1.0, 2.0])],
    );
    assert_close(
        &e,
        &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0],
        0.0,
    );
    let n = run_f32(
        Op::Narrow {
            axis: 1,
            start: 1,
            len: 2,
        },
        &[x.clone()],
    );
    assert_close(&n, &[2.0, 3.0, 5.0, 6.0], 0.0);
    let tr = run_op(Op::Transpose { perm: vec![1, 0] }, &[x]).unwrap();
    assert_eq!(tr.shape.dims, [3, 2]);
    assert_eq!(tr.as_f32().unwrap(), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // 3-D permutation: out[k][i][j] = x[i][j][k].
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let tr = run_f32(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[t(&[2, 3, 4], &v)],
    );
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(tr[k * 6 + i * 3 + j], v[i * 12 + j * 4 + k]);
            }
        }
    }
}

#[test]
fn cast_semantics() {
    let x = t(&[5], &[-1.7, 2.9, 1e10, f32::NAN, 300.0]);
    let i = run_op(Op::Cast { to: DType::I32 }, &[x.clone()]).unwrap();
    assert_eq!(*i.data, TensorData::I32(vec![-1, 2, i32::MAX, 0, 300]));
    let u = run_op(Op::Cast { to: DType::U8 }, &[x.clone()]).unwrap();
    assert_eq!(*u.data, TensorData::U8(vec![0, 2, 255, 0, 255]));
    let b = run_op(Op::Cast { to: DType::Bool }, &[t(&[3], &[0.0, -0.5, 2.0])]).unwrap();
    assert_eq!(b.shape.dtype, DType::Bool);
    assert_eq!(*b.data, TensorData::U8(vec![0, 1, 1]));
    let l = run_op(Op::Cast { to: DType::I64 }, &[x]).unwrap();
    assert_eq!(
        *l.data,
        TensorData::I64(vec![-1, 2, 10_000_000_000, 0, 300])
    );
    // Integer to integer wraps like Rust `as`; big i64 stay exact.
    let big = Tensor::i64(&[3], vec![(1 << 32) + 5, -1, i64::MAX]);
    let w = run_op(Op::Cast { to: DType::I32 }, &[big.clone()]).unwrap();
    assert_eq!(*w.data, TensorData::I32(vec![5, -1, -1]));
    let same = run_op(Op::Cast { to: DType::I64 }, &[big]).unwrap();
    assert_eq!(
        *same.data,
        TensorData::I64(vec![(1 << 32) + 5, -1, i64::MAX])
    );
    let f = run_f32(
        Op::Cast { to: DType::F32 },
        &[Tensor::i32(&[2], vec![-3, 7])],
    );
    assert_eq!(f, [-3.0, 7.0]);
    let f = run_f32(
        Op::Cast { to: DType::F32 },
        &[Tensor::u8(&[2], vec![0, 255])],
    );
    assert_eq!(f, [0.0, 255.0]);
}

#[test]
fn gather_rows() {
    let table = t(&[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let ids = Tensor::i64(&[2, 2], vec![2, 0, 1, 1]);
    let g = run_op(Op::Gather { axis: 0 }, &[table.clone(), ids]).unwrap();
    assert_eq!(g.shape.dims, [2, 2, 2]);
    assert_eq!(
        g.as_f32().unwrap(),
        [20.0, 21.0, 0.0, 1.0, 10.0, 11.0, 10.0, 11.0]
    );
    let g = run_f32(Op::Gather { axis: 0 }, &[table, Tensor::i32(&[1], vec![1])]);
    assert_eq!(g, [10.0, 11.0]);
    // Integer tables stay integer.
    let itab = Tensor::i64(&[3], vec![7, 8, 9]);
    let g = run_op(
        Op::Gather { axis: 0 },
        &[itab, Tensor::i32(&[2], vec![2, 0])],
    )
    .unwrap();
    assert_eq!(*g.data, TensorData::I64(vec![9, 7]));
}

#[test]
fn swiglu_packed_and_unpacked() {
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let gate = [1.0f32, -2.0, 0.5];
    let up = [2.0f32, 3.0, -1.0];
    let want: Vec<f64> = (0..3)
        .map(|i| silu(f64::from(gate[i])) * f64::from(up[i]))
        .collect();
    let got = run_f32(
        Op::FusedSwiGLU { packed: false },
        &[t(&[1, 3], &gate), t(&[1, 3], &up)],
    );
    assert_close(&got, &want, 1e-7);
    let packed: Vec<f32> = gate.iter().chain(&up).copied().collect();
    let got = run_f32(Op::FusedSwiGLU { packed: true }, &[t(&[1, 6], &packed)]);
    assert_close(&got, &want, 1e-7);
}

#[test]
fn concat_axes() {
    let a = t(&[2, 1], &[1.0, 2.0]);
    let b = t(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let got = run_f32(Op::Concat { axis: 1 }, &[a.clone(), b]);
    assert_close(&got, &[1.0, 3.0, 4.0, 2.0, 5.0, 6.0], 0.0);
    let got = run_f32(Op::Concat { axis: 0 }, &[a.clone(), a.clone(), a]);
    assert_close(&got, &[1.0, 2.0, 1.0, 2.0, 1.0, 2.0], 0.0);
    let got = run_op(
        Op::Concat { axis: 0 },
        &[Tensor::i64(&[1], vec![5]), Tensor::i64(&[2], vec![6, 7])],
    )
    .unwrap();
    assert_eq!(*got.data, TensorData::I64(vec![5, 6, 7]));
}

#[test]
fn softmax_rows() {
    let ln2 = std::f32::consts::LN_2;
    let got = run_f32(Op::Softmax { axis: 1 }, &[t(&[1, 2], &[0.0, ln2])]);
    assert_close(&got, &[1.0 / 3.0, 2.0 / 3.0], 1e-7);
    let x = rand_vec(3 * 5, 9)
        .iter()
        .map(|v| v * 30.0)
        .collect::<Vec<_>>();
    let got = run_f32(Op::Softmax { axis: 1 }, &[t(&[3, 5], &x)]);
    for row in got.chunks(5) {
        let s: f64 = f64s(row).iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!(row.iter().all(|&p| (0.0..=1.0).contains(&p)));
    }
    // Along axis 0: columns sum to 1; large inputs do not overflow.
    let got = run_f32(
        Op::Softmax { axis: 0 },
        &[t(&[2, 2], &[1000.0, 0.0, 1000.0, 0.0])],
    );
    assert_close(&got, &[0.5, 0.5, 0.5, 0.5], 1e-7);
}

#[test]
fn reductions() {
    let x = t(&[2, 3], &[1.0, 5.0, 3.0, -4.0, 2.0, 0.5]);
    let r = |op, axes: Vec<usize>, keep_dims| {
        run_op(
            Op::Reduce {
                op,
                axes,
                keep_dims,
            },
            &[x.clone()],
        )
        .unwrap()
    };
    let s = r(ReduceOp::Sum, vec![1], false);
    assert_eq!(s.shape.dims, [2]);
    assert_eq!(s.as_f32().unwrap(), [9.0, -1.5]);
    let m = r(ReduceOp::Mean, vec![0], true);
    assert_eq!(m.shape.dims, [1, 3]);
    assert_eq!(m.as_f32().unwrap(), [-1.5, 3.5, 1.75]);
    let mx = r(ReduceOp::Max, vec![0, 1], false);
    assert_eq!(mx.shape.dims, Vec::<usize>::new());
    assert_eq!(mx.as_f32().unwrap(), [5.0]);
    let mn = r(ReduceOp::Min, vec![1], true);
    assert_eq!(mn.shape.dims, [2, 1]);
    assert_eq!(mn.as_f32().unwrap(), [1.0, -4.0]);
    // Middle axis of a 3-D tensor.
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let got = run_f32(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keep_dims: false,
        },
        &[t(&[2, 3, 4], &v)],
    );
    let want: Vec<f64> = (0..8)
        .map(|o| {
            let (i, k) = (o / 4, o % 4);
            (0..3).map(|j| (i * 12 + j * 4 + k) as f64).sum()
        })
        .collect();
    assert_close(&got, &want, 0.0);
    let nan = run_f32(
        Op::Reduce {
            op: ReduceOp::Max,
            axes: vec![0],
            keep_dims: false,
        },
        &[t(&[3], &[1.0, f32::NAN, 2.0])],
    );
    assert!(nan[0].is_nan());
}

#[test]
fn constants_and_multi_output_graphs() {
    let mut g = Graph::new("c");
    let c = g.constant(t(&[2], &[1.5, -2.0]));
    let x = g.input("x", Shape::f32(&[2]));
    let y = g.push(Op::Binary(BinaryOp::Mul), vec![c, x]).unwrap();
    let z = g.push(Op::Activation(Activation::Neg), vec![y]).unwrap();
    g.set_outputs(vec![z, c]);
    let bind = HashMap::from([("x".to_string(), t(&[2], &[2.0, 3.0]))]);
    let out = rlx_ref::run(&g, &bind).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].as_f32().unwrap(), [-3.0, 6.0]);
    assert_eq!(out[1].as_f32().unwrap(), [1.5, -2.0]);
    let all = rlx_ref::run_all(&g, &bind).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all[2].as_f32().unwrap(), [3.0, -6.0]);
    assert_eq!(all[1].as_f32().unwrap(), [2.0, 3.0]);
}

#[test]
fn bool_inputs_accept_u8_data() {
    let mut g = Graph::new("b");
    let m = g.input("m", Shape::new(&[3], DType::Bool));
    let f = g.push(Op::Cast { to: DType::F32 }, vec![m]).unwrap();
    g.set_outputs(vec![f]);
    let bind = HashMap::from([("m".to_string(), Tensor::u8(&[3], vec![0, 1, 1]))]);
    let out = rlx_ref::run(&g, &bind).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), [0.0, 1.0, 1.0]);
}
