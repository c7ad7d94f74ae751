//! Every CPU kernel against the reference interpreter (`rlx_ref::run`) on
//! one-op graphs: odd sizes, broadcasting, GQA, masks, NaN/inf.

use rlx_cpu::kernels::{run_op, In, Out};
use rlx_ir::{
    Activation, BinaryOp, DType, Graph, MaskKind, Op, ReduceOp, RopeStyle, Tensor, TensorData,
};
use std::collections::HashMap;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn t(&mut self, dims: &[usize]) -> Tensor {
        let n = dims.iter().product();
        Tensor::f32(dims, (0..n).map(|_| self.next() * 2.0).collect())
    }
}

fn as_in(t: &Tensor) -> In<'_> {
    match &*t.data {
        TensorData::F32(v) => In::F32(v),
        TensorData::I32(v) => In::I32(v),
        TensorData::I64(v) => In::I64(v),
        TensorData::U8(v) => In::U8(v),
    }
}

/// Run `op` on `inputs` with both the reference and `run_op`; compare.
#[track_caller]
fn check(op: Op, inputs: &[Tensor]) {
    let mut g = Graph::new("one-op");
    let mut ids = Vec::new();
    let mut bind = HashMap::new();
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("i{i}");
        ids.push(g.input(&name, t.shape.clone()));
        bind.insert(name, t.clone());
    }
    let out = g.push(op.clone(), ids).expect("shape inference");
    g.set_outputs(vec![out]);
    let want = rlx_ref::run(&g, &bind).expect("reference").remove(0);
    let shapes: Vec<_> = inputs.iter().map(|t| &t.shape).collect();
    let bufs: Vec<In> = inputs.iter().map(as_in).collect();
    let n = want.shape.numel();
    match &*want.data {
        TensorData::F32(w) => {
            let mut got = vec![f32::NAN; n];
            run_op(&op, &bufs, &shapes, Out::F32(&mut got), &want.shape)
                .unwrap_or_else(|e| panic!("{op:?}: {e}"));
            let scale = w
                .iter()
                .filter(|v| v.is_finite())
                .fold(0.0f32, |m, v| m.max(v.abs()));
            for (i, (&g, &w)) in got.iter().zip(w).enumerate() {
                if w.is_nan() || g.is_nan() {
                    assert!(w.is_nan() && g.is_nan(), "{op:?} [{i}]: got {g}, want {w}");
                    continue;
                }
                if w.is_infinite() {
                    assert_eq!(g, w, "{op:?} [{i}]");
                    continue;
                }
                let tol = 1e-5 * w.abs() + 1e-6 * scale + 1e-30;
                assert!(
                    (g - w).abs() <= tol,
                    "{op:?} [{i}]: got {g}, want {w}, tol {tol}"
                );
            }
        }
        TensorData::I32(w) => {
            let mut got = vec![0; n];
            run_op(&op, &bufs, &shapes, Out::I32(&mut got), &want.shape).unwrap();
            assert_eq!(&got, w, "{op:?}");
        }
        TensorData::I64(w) => {
            let mut got = vec![0; n];
            run_op(&op, &bufs, &shapes, Out::I64(&mut got), &want.shape).unwrap();
            assert_eq!(&got, w, "{op:?}");
        }
        TensorData::U8(w) => {
            let mut got = vec![0; n];
            run_op(&op, &bufs, &shapes, Out::U8(&mut got), &want.shape).unwrap();
            assert_eq!(&got, w, "{op:?}");
        }
    }
}

fn rng(seed: u64) -> Rng {
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

#[test]
fn matmul_family_vs_ref() {
    let mut r = rng(1);
    for (a, b) in [
        (vec![7, 13], vec![13, 33]),
        (vec![2, 1, 3, 5], vec![4, 5, 6]),
        (vec![2, 3, 9], vec![9, 7]),
        (vec![1, 1], vec![1, 1]),
    ] {
        let (ta, tb) = (r.t(&a), r.t(&b));
        check(Op::MatMul, &[ta.clone(), tb.clone()]);
        let n = *b.last().unwrap();
        for act in [None, Some(Activation::Gelu), Some(Activation::GeluTanh)] {
            check(
                Op::FusedMatMulBiasAct { activation: act },
                &[ta.clone(), tb.clone(), r.t(&[n])],
            );
        }
    }
}

#[test]
fn elementwise_vs_ref() {
    let mut r = rng(2);
    let mut x = r.t(&[3, 33]);
    if let Some(TensorData::F32(v)) = std::sync::Arc::get_mut(&mut x.data) {
        v[0] = f32::NAN;
        v[1] = 0.0;
        v[2] = 9.0;
        v[3] = -9.0;
    }
    for act in Activation::ALL {
        let inp = match act {
            Activation::Sqrt | Activation::Rsqrt => {
                let v: Vec<f32> = x.as_f32().unwrap().iter().map(|v| v.abs() + 0.1).collect();
                Tensor::f32(&[3, 33], v)
            }
            _ => x.clone(),
        };
        check(Op::Activation(act), &[inp]);
    }
    for (a, b) in [
        (vec![3, 1, 5], vec![4, 1]),
        (vec![13, 7], vec![7]),
        (vec![], vec![2, 3]),
        (vec![5, 1], vec![1, 33]),
    ] {
        for op in BinaryOp::ALL {
            let mut ta = r.t(&a);
            if op == BinaryOp::Pow {
                let v: Vec<f32> = ta.as_f32().unwrap().iter().map(|v| v.abs()).collect();
                ta = Tensor::f32(&a, v);
            }
            check(Op::Binary(op), &[ta, r.t(&b)]);
        }
    }
    check(Op::FusedSwiGLU { packed: true }, &[r.t(&[7, 26])]);
    check(
        Op::FusedSwiGLU { packed: false },
        &[r.t(&[7, 13]), r.t(&[7, 13])],
    );
}

#[test]
fn norms_softmax_reduce_vs_ref() {
    let mut r = rng(3);
    for d in [1usize, 7, 33] {
        let dims = [2, 3, d];
        check(
            Op::LayerNorm {
                axis: -1,
                eps: 1e-5,
            },
            &[r.t(&dims), r.t(&[d]), r.t(&[d])],
        );
        check(Op::RmsNorm { axis: 2, eps: 1e-6 }, &[r.t(&dims), r.t(&[d])]);
        check(
            Op::FusedResidualLN {
                has_bias: true,
                eps: 1e-5,
            },
            &[r.t(&dims), r.t(&dims), r.t(&[d]), r.t(&[d]), r.t(&[d])],
        );
        check(
            Op::FusedResidualRmsNorm {
                has_bias: false,
                eps: 1e-5,
            },
            &[r.t(&dims), r.t(&dims), r.t(&[d])],
        );
        for axis in 0..3 {
            check(Op::Softmax { axis }, &[r.t(&dims)]);
        }
    }
    for axes in [vec![0], vec![1, 2], vec![0, 2]] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            check(
                Op::Reduce {
                    op,
                    axes: axes.clone(),
                    keep_dims: true,
                },
                &[r.t(&[3, 4, 5])],
            );
        }
    }
}

#[test]
fn attention_vs_ref() {
    let mut r = rng(4);
    // (4, 9, ..) runs as whole 9-row blocks, (1, 1, ..) one task per head
    // (a decode step, when run in parallel) and (3, 1, ..) batched decode
    // rows, both through the one-query kernel; the last two take the
    // packed path (S_q >= 16), over several row blocks.
    for (b, sq, sk, hq, hkv, d) in [
        (2, 3, 7, 4, 2, 8),
        (4, 9, 11, 2, 1, 8),
        (1, 1, 70, 4, 2, 32),
        (3, 1, 41, 6, 2, 16),
        (1, 5, 5, 2, 2, 13),
        (2, 6, 4, 2, 1, 4),
        (1, 16, 16, 2, 2, 20),
        (2, 70, 90, 4, 2, 8),
    ] {
        for kind in [
            MaskKind::None,
            MaskKind::Causal,
            MaskKind::SlidingWindow(3),
            MaskKind::Custom,
            MaskKind::Bias,
        ] {
            for (scale, cap) in [(None, None), (Some(0.2), Some(3.0))] {
                let mut ins = vec![
                    r.t(&[b, sq, hq * d]),
                    r.t(&[b, sk, hkv * d]),
                    r.t(&[b, sk, hkv * d]),
                ];
                match kind {
                    MaskKind::Custom => ins.push(Tensor {
                        shape: rlx_ir::Shape::new(&[b, sk], DType::U8),
                        data: std::sync::Arc::new(TensorData::U8(
                            (0..b * sk).map(|i| (i % 3 != 1 && i >= sk) as u8).collect(),
                        )),
                    }),
                    MaskKind::Bias => ins.push(r.t(&[b, 1, sq, sk])),
                    _ => {}
                }
                check(
                    Op::Attention {
                        num_heads: hq,
                        head_dim: d,
                        mask_kind: kind,
                        score_scale: scale,
                        attn_logit_softcap: cap,
                    },
                    &ins,
                );
            }
        }
    }
}

#[test]
fn rope_and_movement_vs_ref() {
    let mut r = rng(5);
    for (hd, n_rot) in [(8, 8), (12, 4)] {
        for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
            check(
                Op::Rope {
                    head_dim: hd,
                    n_rot,
                    theta: 10000.0,
                    style,
                },
                &[
                    r.t(&[2, 3, 2 * hd]),
                    Tensor::i64(&[2, 3], vec![0, 1, 2, 7, 100, 4095]),
                ],
            );
        }
    }
    let x = r.t(&[2, 3, 4]);
    check(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        std::slice::from_ref(&x),
    );
    check(
        Op::Narrow {
            axis: 1,
            start: 1,
            len: 2,
        },
        std::slice::from_ref(&x),
    );
    check(Op::Concat { axis: 2 }, &[x.clone(), r.t(&[2, 3, 1])]);
    check(
        Op::Expand {
            shape: vec![2, 2, 3, 4],
        },
        std::slice::from_ref(&x),
    );
    check(Op::Reshape { shape: vec![6, 4] }, std::slice::from_ref(&x));
    check(
        Op::Gather { axis: 0 },
        &[r.t(&[5, 3]), Tensor::i32(&[2, 2], vec![4, 0, 2, 2])],
    );
    let c = Tensor::f32(&[5], vec![1.7, -2.5, f32::NAN, 1e20, 0.0]);
    for to in [DType::I32, DType::I64, DType::U8, DType::Bool, DType::F32] {
        check(Op::Cast { to }, std::slice::from_ref(&c));
    }
    check(
        Op::CacheWrite { axis: 1 },
        &[r.t(&[2, 6, 3]), r.t(&[2, 2, 3]), Tensor::i64(&[1], vec![4])],
    );
}
