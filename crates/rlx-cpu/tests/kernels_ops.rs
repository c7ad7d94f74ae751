//! Every CPU kernel against naive f64 loops, through `run_op`.
#![allow(clippy::needless_range_loop)]

use rlx_cpu::kernels::{run_op, In, KernelError, Out};
use rlx_ir::{Activation, BinaryOp, DType, MaskKind, Op, ReduceOp, RopeStyle, Shape};

// ---------------------------------------------------------------- helpers

#[path = "../../rlx/tests/common/rng.rs"]
mod rng;
use rng::Rng;

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// Run an f32-only op.
fn run_f32(op: &Op, ins: &[(&[f32], &[usize])], out_dims: &[usize]) -> Vec<f32> {
    let shapes: Vec<Shape> = ins.iter().map(|(_, d)| Shape::f32(d)).collect();
    let refs: Vec<&Shape> = shapes.iter().collect();
    let bufs: Vec<In> = ins.iter().map(|(v, _)| In::F32(v)).collect();
    // Garbage (NaN) in the output must never leak through.
    let mut out = vec![f32::NAN; numel(out_dims)];
    run_op(op, &bufs, &refs, Out::F32(&mut out), &Shape::f32(out_dims))
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    out
}

#[track_caller]
fn assert_close(got: &[f32], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "length");
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, w| m.max(w.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        if w.is_nan() {
            assert!(g.is_nan(), "[{i}] got {g}, want NaN");
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g, w, "[{i}]");
            continue;
        }
        let tol = rtol * w.abs() + rtol * 0.1 * scale + 1e-30;
        assert!(
            (g - w).abs() <= tol,
            "[{i}] got {g}, want {w} (diff {}, tol {tol})",
            (g - w).abs()
        );
    }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn strides(d: &[usize]) -> Vec<usize> {
    rlx_ir::contiguous_strides(d)
}

/// Index of `idx` (in `out_dims`) inside a tensor of `dims` broadcast to it.
fn bcast_index(idx: &[usize], dims: &[usize]) -> usize {
    let off = idx.len() - dims.len();
    let st = strides(dims);
    dims.iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { idx[off + i] * st[i] })
        .sum()
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = i % dims[a];
        i /= dims[a];
    }
    idx
}

// ---------------------------------------------------------------- matmul

fn naive_matmul(a: &[f32], ad: &[usize], b: &[f32], bd: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let (ra, rb) = (ad.len(), bd.len());
    let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
    let batch = rlx_ir::broadcast_dims(&ad[..ra - 2], &bd[..rb - 2]).unwrap();
    let nb = numel(&batch);
    let mut out = vec![0.0; nb * m * n];
    for bi in 0..nb {
        let idx = unravel(bi, &batch);
        let oa = bcast_index(&idx, &ad[..ra - 2]) * m * k;
        let ob = bcast_index(&idx, &bd[..rb - 2]) * k * n;
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[oa + i * k + p] as f64 * b[ob + p * n + j] as f64;
                }
                out[bi * m * n + i * n + j] = s;
            }
        }
    }
    let mut od = batch;
    od.extend([m, n]);
    (out, od)
}

#[test]
fn matmul_shapes_and_broadcast() {
    let mut rng = Rng::new(1);
    let cases: &[(&[usize], &[usize])] = &[
        (&[1, 1], &[1, 1]),
        (&[7, 13], &[13, 33]),
        (&[2, 3, 5], &[5, 7]),
        (&[2, 1, 3, 5], &[4, 5, 6]),
        (&[3, 9], &[2, 9, 4]),
        (&[64, 128], &[128, 96]),
        (&[16, 32, 24], &[16, 24, 20]),
        (&[3, 0, 4], &[4, 5]),
        (&[3, 4, 0], &[0, 5]),
    ];
    for (ad, bd) in cases {
        let a = rng.vec(numel(ad), 1.0);
        let b = rng.vec(numel(bd), 1.0);
        let (want, od) = naive_matmul(&a, ad, &b, bd);
        let got = run_f32(&Op::MatMul, &[(&a, ad), (&b, bd)], &od);
        assert_close(&got, &want, 1e-5);
    }
}

#[test]
fn matmul_propagates_nan_and_inf() {
    let (m, k, n) = (5, 13, 7);
    let mut rng = Rng::new(2);
    let mut a = rng.vec(m * k, 1.0);
    let b = rng.vec(k * n, 1.0);
    a[k + 3] = f32::NAN; // row 1
    a[3 * k] = f32::INFINITY; // row 3
    let got = run_f32(&Op::MatMul, &[(&a, &[m, k]), (&b, &[k, n])], &[m, n]);
    for j in 0..n {
        assert!(got[n + j].is_nan(), "row 1 col {j} = {}", got[n + j]);
        let want = if b[j] > 0.0 {
            f32::INFINITY
        } else {
            f32::NEG_INFINITY
        };
        assert_eq!(got[3 * n + j], want);
        assert!(got[j].is_finite());
    }
}

#[test]
fn fused_matmul_bias_act() {
    let mut rng = Rng::new(3);
    let (m, k, n) = (9, 33, 13);
    let a = rng.vec(m * k, 1.0);
    let b = rng.vec(k * n, 1.0);
    let bias = rng.vec(n, 1.0);
    let (mm, _) = naive_matmul(&a, &[m, k], &b, &[k, n]);
    for act in [
        None,
        Some(Activation::Gelu),
        Some(Activation::Relu),
        Some(Activation::Silu),
    ] {
        let want: Vec<f64> = mm
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let x = v + bias[i % n] as f64;
                act.map_or(x, |a| act64(a, x))
            })
            .collect();
        let got = run_f32(
            &Op::FusedMatMulBiasAct { activation: act },
            &[(&a, &[m, k]), (&b, &[k, n]), (&bias, &[n])],
            &[m, n],
        );
        assert_close(&got, &want, 1e-5);
    }
}

#[test]
fn gemm_building_blocks_strides_accumulate_and_errors() {
    use rlx_cpu::kernels::matmul::{gemm, gemm_bt};
    let mut rng = Rng::new(4);
    let (m, n, k) = (5, 6, 7);
    let (lda, ldb, ldc) = (10, 8, 9);
    let a = rng.vec(m * lda, 1.0);
    let b = rng.vec(k * ldb, 1.0);
    let mut c = vec![1.0f32; m * ldc];
    gemm(m, n, k, &a, lda, &b, ldb, &mut c, ldc, true, false).unwrap();
    for i in 0..m {
        for j in 0..ldc {
            let want = if j < n {
                1.0 + (0..k)
                    .map(|p| a[i * lda + p] as f64 * b[p * ldb + j] as f64)
                    .sum::<f64>()
            } else {
                1.0
            };
            assert!((c[i * ldc + j] as f64 - want).abs() < 1e-5, "({i},{j})");
        }
    }
    // B^T layout.
    let bt = rng.vec(n * k, 1.0);
    let mut c2 = vec![f32::NAN; m * n];
    gemm_bt(m, n, k, &a, lda, &bt, k, &mut c2, n, false, true).unwrap();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| a[i * lda + p] as f64 * bt[j * k + p] as f64)
                .sum();
            assert!((c2[i * n + j] as f64 - want).abs() < 1e-5);
        }
    }
    // Too-short slices and bad strides are errors, not panics.
    let mut small = vec![0.0f32; m * n - 1];
    assert!(matches!(
        gemm(m, n, k, &a, lda, &b, ldb, &mut small, n, false, false),
        Err(KernelError::BadBuffer { .. })
    ));
    let mut c3 = vec![0.0f32; m * n];
    assert!(gemm(
        m,
        n,
        k,
        &a[..lda * (m - 1)],
        lda,
        &b,
        ldb,
        &mut c3,
        n,
        false,
        false
    )
    .is_err());
    assert!(gemm(m, n, k, &a, k - 1, &b, ldb, &mut c3, n, false, false).is_err());
    // k == 0 zero-fills.
    let mut z = vec![f32::NAN; m * n];
    gemm(m, n, 0, &[], 0, &[], n, &mut z, n, false, false).unwrap();
    assert!(z.iter().all(|&v| v == 0.0));
}

// ---------------------------------------------------------------- elementwise

fn erf64(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; use the series / continued fraction.
    fn erfc_pos(z: f64) -> f64 {
        if z < 2.0 {
            let (mut term, mut s, mut n) = (z, z, 0.0);
            loop {
                n += 1.0;
                term *= -z * z / n;
                let add = term / (2.0 * n + 1.0);
                s += add;
                if add.abs() < 1e-18 {
                    break;
                }
            }
            1.0 - s * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let (mut f, mut c, mut d) = (z, z, 0.0f64);
            for i in 1..300 {
                let a = i as f64 / 2.0;
                d = 1.0 / (z + a * d);
                c = z + a / c;
                let delta = c * d;
                f *= delta;
                if (delta - 1.0).abs() < 1e-16 {
                    break;
                }
            }
            (-z * z).exp() / std::f64::consts::PI.sqrt() / f
        }
    }
    if x >= 0.0 {
        1.0 - erfc_pos(x)
    } else {
        erfc_pos(-x) - 1.0
    }
}

/// The f64 activations `fused_matmul_bias_act` uses. Every activation
/// against the reference interpreter, at widths that take the parallel and
/// SIMD paths, is in the conformance suite (`crates/rlx/tests/conformance.rs`).
fn act64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Relu => x.max(0.0),
        Activation::Gelu => x * 0.5 * (1.0 + erf64(x / std::f64::consts::SQRT_2)),
        Activation::Silu => x / (1.0 + (-x).exp()),
        other => panic!("act64 has no formula for {other:?}"),
    }
}

#[test]
fn activations_at_infinities() {
    let x = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    let get = |a| run_f32(&Op::Activation(a), &[(&x, &[3])], &[3]);
    assert_eq!(get(Activation::Relu)[..2], [f32::INFINITY, 0.0]);
    assert_eq!(get(Activation::Sigmoid)[..2], [1.0, 0.0]);
    assert_eq!(get(Activation::Tanh)[..2], [1.0, -1.0]);
    assert_eq!(get(Activation::Exp)[..2], [f32::INFINITY, 0.0]);
    assert_eq!(get(Activation::Gelu)[0], f32::INFINITY);
    assert_eq!(get(Activation::Silu)[0], f32::INFINITY);
    for a in Activation::ALL {
        assert!(get(a)[2].is_nan(), "{a:?}(NaN) must be NaN");
    }
}

fn bin64(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Pow => a.powf(b),
    }
}

#[test]
fn binary_broadcasting() {
    let mut rng = Rng::new(6);
    let cases: &[(&[usize], &[usize])] = &[
        (&[7], &[7]),
        (&[3, 1, 5], &[4, 1]),
        (&[13, 7], &[7]),
        (&[], &[2, 3]),
        (&[2, 3], &[1]),
        (&[5, 1], &[1, 33]),
        (&[2, 1, 3, 1], &[1, 4, 1, 5]),
        (&[40_000], &[40_000]),
        (&[300, 70], &[70]),
        (&[300, 1], &[300, 70]),
    ];
    for (ad, bd) in cases {
        let out = rlx_ir::broadcast_dims(ad, bd).unwrap();
        let mut a = rng.vec(numel(ad), 1.0);
        let b: Vec<f32> = rng.vec(numel(bd), 1.0).iter().map(|v| v + 2.5).collect();
        if a.len() > 3 {
            a[2] = f32::NAN;
            a[3] = f32::INFINITY;
        }
        for op in BinaryOp::ALL {
            let a_in: Vec<f32> = if op == BinaryOp::Pow {
                a.iter().map(|v| v.abs()).collect()
            } else {
                a.clone()
            };
            let want: Vec<f64> = (0..numel(&out))
                .map(|i| {
                    let idx = unravel(i, &out);
                    bin64(
                        op,
                        a_in[bcast_index(&idx, ad)] as f64,
                        b[bcast_index(&idx, bd)] as f64,
                    )
                })
                .collect();
            let got = run_f32(&Op::Binary(op), &[(&a_in, ad), (&b, bd)], &out);
            assert_close(&got, &want, 1e-5);
        }
    }
    // NaN on the right also propagates through Max/Min.
    let a = [1.0f32, f32::NAN];
    let b = [f32::NAN, 1.0f32];
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let got = run_f32(&Op::Binary(op), &[(&a, &[2]), (&b, &[2])], &[2]);
        assert!(got.iter().all(|v| v.is_nan()), "{op:?}: {got:?}");
    }
}

#[test]
fn swiglu_packed_and_split() {
    let mut rng = Rng::new(7);
    let (rows, n) = (13, 33);
    let x = rng.vec(rows * 2 * n, 1.0);
    let want: Vec<f64> = (0..rows * n)
        .map(|i| {
            let (r, j) = (i / n, i % n);
            let g = x[r * 2 * n + j] as f64;
            let u = x[r * 2 * n + n + j] as f64;
            g / (1.0 + (-g).exp()) * u
        })
        .collect();
    let got = run_f32(
        &Op::FusedSwiGLU { packed: true },
        &[(&x, &[rows, 2 * n])],
        &[rows, n],
    );
    assert_close(&got, &want, 1e-5);
    let g = rng.vec(5000, 1.0);
    let u = rng.vec(5000, 1.0);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64)
        .collect();
    let got = run_f32(
        &Op::FusedSwiGLU { packed: false },
        &[(&g, &[5000]), (&u, &[5000])],
        &[5000],
    );
    assert_close(&got, &want, 1e-5);
}

// ---------------------------------------------------------------- norms

fn ln64(x: &[f64], g: &[f32], b: Option<&[f32]>, eps: f32, rms: bool) -> Vec<f64> {
    let d = g.len();
    let mut out = Vec::new();
    for row in x.chunks(d) {
        let mean = if rms {
            0.0
        } else {
            row.iter().sum::<f64>() / d as f64
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        let r = 1.0 / (var + eps as f64).sqrt();
        for j in 0..d {
            out.push((row[j] - mean) * r * g[j] as f64 + b.map_or(0.0, |b| b[j] as f64));
        }
    }
    out
}

#[test]
fn norms_match_f64() {
    let mut rng = Rng::new(8);
    for &(rows, d) in &[(1usize, 1usize), (13, 7), (5, 33), (100, 384)] {
        let x: Vec<f32> = rng
            .vec(rows * d, 1.0)
            .iter()
            .map(|v| v * 3.0 + 0.5)
            .collect();
        let r = rng.vec(rows * d, 1.0);
        let bias = rng.vec(d, 1.0);
        let g = rng.vec(d, 1.0);
        let b = rng.vec(d, 1.0);
        let eps = 1e-5;
        let dims = [rows, d];
        let x64 = f64s(&x);
        let got = run_f32(
            &Op::LayerNorm { axis: -1, eps },
            &[(&x, &dims), (&g, &[d]), (&b, &[d])],
            &dims,
        );
        assert_close(&got, &ln64(&x64, &g, Some(&b), eps, false), 1e-5);
        let got = run_f32(
            &Op::RmsNorm { axis: 1, eps },
            &[(&x, &dims), (&g, &[d])],
            &dims,
        );
        assert_close(&got, &ln64(&x64, &g, None, eps, true), 1e-5);

        let sum: Vec<f64> = (0..rows * d)
            .map(|i| x[i] as f64 + r[i] as f64 + bias[i % d] as f64)
            .collect();
        let sum_nb: Vec<f64> = (0..rows * d).map(|i| x[i] as f64 + r[i] as f64).collect();
        let got = run_f32(
            &Op::FusedResidualLN {
                has_bias: true,
                eps,
            },
            &[
                (&x, &dims),
                (&r, &dims),
                (&bias, &[d]),
                (&g, &[d]),
                (&b, &[d]),
            ],
            &dims,
        );
        assert_close(&got, &ln64(&sum, &g, Some(&b), eps, false), 1e-5);
        let got = run_f32(
            &Op::FusedResidualLN {
                has_bias: false,
                eps,
            },
            &[(&x, &dims), (&r, &dims), (&g, &[d]), (&b, &[d])],
            &dims,
        );
        assert_close(&got, &ln64(&sum_nb, &g, Some(&b), eps, false), 1e-5);
        let got = run_f32(
            &Op::FusedResidualRmsNorm {
                has_bias: true,
                eps,
            },
            &[(&x, &dims), (&r, &dims), (&bias, &[d]), (&g, &[d])],
            &dims,
        );
        assert_close(&got, &ln64(&sum, &g, None, eps, true), 1e-5);
        let got = run_f32(
            &Op::FusedResidualRmsNorm {
                has_bias: false,
                eps,
            },
            &[(&x, &dims), (&r, &dims), (&g, &[d])],
            &dims,
        );
        assert_close(&got, &ln64(&sum_nb, &g, None, eps, true), 1e-5);
    }
}

// ---------------------------------------------------------------- softmax / reduce

#[test]
fn softmax_any_axis() {
    let mut rng = Rng::new(9);
    let cases: &[(&[usize], usize)] = &[
        (&[3, 7], 1),
        (&[1, 1], 1),
        (&[2, 5, 3], 1),
        (&[4, 3, 2], 0),
        (&[64, 1000], 1),
        (&[33], 0),
    ];
    for (dims, axis) in cases {
        let mut x: Vec<f32> = rng.vec(numel(dims), 1.0).iter().map(|v| v * 10.0).collect();
        if x.len() > 5 {
            x[4] = f32::NEG_INFINITY;
        }
        let n = dims[*axis];
        let inner = numel(&dims[axis + 1..]);
        let mut want = vec![0.0f64; x.len()];
        for o in 0..numel(&dims[..*axis]) {
            for i in 0..inner {
                let at = |j: usize| (o * n + j) * inner + i;
                let m = (0..n)
                    .map(|j| x[at(j)] as f64)
                    .fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = (0..n).map(|j| (x[at(j)] as f64 - m).exp()).sum();
                for j in 0..n {
                    want[at(j)] = (x[at(j)] as f64 - m).exp() / s;
                }
            }
        }
        let got = run_f32(&Op::Softmax { axis: *axis }, &[(&x, dims)], dims);
        assert_close(&got, &want, 1e-5);
    }
}

#[test]
fn softmax_row_building_blocks_agree() {
    use rlx_cpu::kernels::softmax::{softmax_rows, softmax_rows_inplace};
    let mut rng = Rng::new(15);
    for d in [1usize, 7, 33, 128] {
        let x: Vec<f32> = rng.vec(5 * d, 1.0).iter().map(|v| v * 8.0).collect();
        let mut a = vec![f32::NAN; x.len()];
        softmax_rows(&x, &mut a, d).unwrap();
        let mut b = x.clone();
        softmax_rows_inplace(&mut b, d);
        let want: Vec<f64> = x
            .chunks(d)
            .flat_map(|r| {
                let m = r.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
                let s: f64 = r.iter().map(|&v| (v as f64 - m).exp()).sum();
                r.iter().map(move |&v| (v as f64 - m).exp() / s)
            })
            .collect();
        assert_close(&a, &want, 1e-5);
        assert_close(&b, &want, 1e-5);
    }
}

#[test]
fn reduce_axes() {
    let mut rng = Rng::new(10);
    let dims = [3usize, 4, 5];
    let x = rng.vec(60, 1.0);
    let cases: &[&[usize]] = &[&[2], &[1], &[0, 2], &[0, 1, 2], &[0, 1]];
    for axes in cases {
        for keep in [false, true] {
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
                let out_dims: Vec<usize> = dims
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &d)| {
                        if axes.contains(&i) {
                            keep.then_some(1)
                        } else {
                            Some(d)
                        }
                    })
                    .collect();
                let kept: Vec<usize> = (0..3).filter(|i| !axes.contains(i)).collect();
                let kdims: Vec<usize> = kept.iter().map(|&i| dims[i]).collect();
                let mut acc: Vec<Vec<f64>> = vec![Vec::new(); numel(&kdims)];
                for i in 0..60 {
                    let idx = unravel(i, &dims);
                    let kidx: Vec<usize> = kept.iter().map(|&a| idx[a]).collect();
                    let o = if kdims.is_empty() {
                        0
                    } else {
                        kidx.iter().zip(strides(&kdims)).map(|(a, s)| a * s).sum()
                    };
                    acc[o].push(x[i] as f64);
                }
                let want: Vec<f64> = acc
                    .iter()
                    .map(|v| match op {
                        ReduceOp::Sum => v.iter().sum(),
                        ReduceOp::Mean => v.iter().sum::<f64>() / v.len() as f64,
                        ReduceOp::Max => v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                        ReduceOp::Min => v.iter().cloned().fold(f64::INFINITY, f64::min),
                    })
                    .collect();
                let op = Op::Reduce {
                    op,
                    axes: axes.to_vec(),
                    keep_dims: keep,
                };
                let got = run_f32(&op, &[(&x, &dims)], &out_dims);
                assert_close(&got, &want, 1e-5);
            }
        }
    }
    // Max/Min propagate NaN.
    let x = [1.0f32, f32::NAN, 3.0, 2.0];
    for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum] {
        let op = Op::Reduce {
            op,
            axes: vec![1],
            keep_dims: false,
        };
        let got = run_f32(&op, &[(&x, &[2, 2])], &[2]);
        assert!(got[0].is_nan());
        assert!(!got[1].is_nan());
    }
}

// ---------------------------------------------------------------- attention

struct AttnCase {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    kind: MaskKind,
    scale: Option<f32>,
    softcap: Option<f32>,
}

#[allow(clippy::too_many_arguments)]
fn naive_attention(
    c: &AttnCase,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keep: Option<&[f32]>,
    bias: Option<(&[f32], &[usize])>,
) -> Vec<f64> {
    let (d, sq, sk) = (c.d, c.sq, c.sk);
    let scale = c.scale.unwrap_or(1.0 / (d as f32).sqrt()) as f64;
    let mut out = vec![0.0; c.b * sq * c.hq * d];
    for b in 0..c.b {
        for h in 0..c.hq {
            let hk = h / (c.hq / c.hkv);
            for i in 0..sq {
                let last = i as i64 + sk as i64 - sq as i64;
                let mut s = vec![f64::NEG_INFINITY; sk];
                for (j, sj) in s.iter_mut().enumerate() {
                    let ji = j as i64;
                    let visible = match c.kind {
                        MaskKind::Causal => ji <= last,
                        MaskKind::SlidingWindow(w) => ji <= last && ji > last - w as i64,
                        MaskKind::Custom => keep.unwrap()[b * sk + j] != 0.0,
                        _ => true,
                    };
                    if !visible {
                        continue;
                    }
                    let mut dotp = 0.0;
                    for e in 0..d {
                        dotp += q[((b * sq + i) * c.hq + h) * d + e] as f64
                            * k[((b * sk + j) * c.hkv + hk) * d + e] as f64;
                    }
                    let mut val = dotp * scale;
                    if let Some(cap) = c.softcap {
                        val = cap as f64 * (val / cap as f64).tanh();
                    }
                    if let Some((bv, bd)) = bias {
                        val += bv[bcast_index(&[b, h, i, j], bd)] as f64;
                    }
                    *sj = val;
                }
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let tot: f64 = w.iter().sum();
                for e in 0..d {
                    let mut acc = 0.0;
                    for j in 0..sk {
                        acc += w[j] * v[((b * sk + j) * c.hkv + hk) * d + e] as f64;
                    }
                    out[((b * sq + i) * c.hq + h) * d + e] = acc / tot;
                }
            }
        }
    }
    out
}

#[test]
fn attention_all_masks_gqa_offsets() {
    let mut rng = Rng::new(11);
    let kinds = [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow(2),
        MaskKind::Custom,
        MaskKind::Bias,
    ];
    let shapes = [
        (2, 3, 7, 4, 2, 8),  // S_k > S_q, GQA
        (1, 5, 5, 3, 3, 13), // MHA, odd head dim
        (2, 6, 4, 2, 1, 4),  // S_k < S_q: early causal rows fully masked
        (1, 1, 1, 1, 1, 1),
        (4, 9, 11, 2, 1, 8),   // 9-row blocks of the row-block path
        (1, 1, 70, 4, 2, 32),  // a decode step: keys split in chunks
        (1, 1, 200, 9, 3, 64), // SmolLM2's heads, seven key chunks
        (2, 40, 40, 4, 2, 33), // parallel path
    ];
    for &(b, sq, sk, hq, hkv, d) in &shapes {
        for kind in kinds {
            for (scale, softcap) in [(None, None), (Some(0.3), Some(2.0))] {
                let c = AttnCase {
                    b,
                    sq,
                    sk,
                    hq,
                    hkv,
                    d,
                    kind,
                    scale,
                    softcap,
                };
                let q: Vec<f32> = rng
                    .vec(b * sq * hq * d, 1.0)
                    .iter()
                    .map(|v| v * 2.0)
                    .collect();
                let k: Vec<f32> = rng
                    .vec(b * sk * hkv * d, 1.0)
                    .iter()
                    .map(|v| v * 2.0)
                    .collect();
                let v = rng.vec(b * sk * hkv * d, 1.0);
                // Keep-mask: batch 0 keeps a pattern, batch 1 keeps nothing.
                let keep: Vec<f32> = (0..b * sk)
                    .map(|i| {
                        if i / sk == 0 {
                            ((i % 3) != 1) as u8 as f32
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let bias_dims = [b, 1, 1, sk];
                let bias: Vec<f32> = (0..b * sk)
                    .map(|i| {
                        if i % 4 == 2 {
                            f32::NEG_INFINITY
                        } else {
                            rng.f32()
                        }
                    })
                    .collect();
                let op = Op::Attention {
                    num_heads: hq,
                    head_dim: d,
                    mask_kind: kind,
                    score_scale: scale,
                    attn_logit_softcap: softcap,
                };
                let qd = [b, sq, hq * d];
                let kd = [b, sk, hkv * d];
                let (want, got) = match kind {
                    MaskKind::Custom => {
                        let want = naive_attention(&c, &q, &k, &v, Some(&keep), None);
                        let got = run_f32(
                            &op,
                            &[(&q, &qd), (&k, &kd), (&v, &kd), (&keep, &[b, sk])],
                            &qd,
                        );
                        // The u8 mask must agree.
                        let keep_u8: Vec<u8> = keep.iter().map(|&x| x as u8).collect();
                        let shapes = [
                            Shape::f32(&qd),
                            Shape::f32(&kd),
                            Shape::f32(&kd),
                            Shape::new(&[b, sk], DType::Bool),
                        ];
                        let refs: Vec<&Shape> = shapes.iter().collect();
                        let mut out = vec![f32::NAN; q.len()];
                        run_op(
                            &op,
                            &[In::F32(&q), In::F32(&k), In::F32(&v), In::U8(&keep_u8)],
                            &refs,
                            Out::F32(&mut out),
                            &Shape::f32(&qd),
                        )
                        .unwrap();
                        assert_eq!(out, got);
                        (want, got)
                    }
                    MaskKind::Bias => {
                        let want = naive_attention(&c, &q, &k, &v, None, Some((&bias, &bias_dims)));
                        let got = run_f32(
                            &op,
                            &[(&q, &qd), (&k, &kd), (&v, &kd), (&bias, &bias_dims)],
                            &qd,
                        );
                        (want, got)
                    }
                    _ => (
                        naive_attention(&c, &q, &k, &v, None, None),
                        run_f32(&op, &[(&q, &qd), (&k, &kd), (&v, &kd)], &qd),
                    ),
                };
                assert_close(&got, &want, 1e-5);
            }
        }
    }
    // A full [B, H, S_q, S_k] bias.
    let (b, sq, sk, hq, d) = (2, 3, 5, 2, 4);
    let c = AttnCase {
        b,
        sq,
        sk,
        hq,
        hkv: hq,
        d,
        kind: MaskKind::Bias,
        scale: None,
        softcap: None,
    };
    let q = rng.vec(b * sq * hq * d, 1.0);
    let k = rng.vec(b * sk * hq * d, 1.0);
    let v = rng.vec(b * sk * hq * d, 1.0);
    let bd = [b, hq, sq, sk];
    let bias = rng.vec(numel(&bd), 1.0);
    let op = Op::Attention {
        num_heads: hq,
        head_dim: d,
        mask_kind: MaskKind::Bias,
        score_scale: None,
        attn_logit_softcap: None,
    };
    let qd = [b, sq, hq * d];
    let kd = [b, sk, hq * d];
    let got = run_f32(&op, &[(&q, &qd), (&k, &kd), (&v, &kd), (&bias, &bd)], &qd);
    assert_close(
        &got,
        &naive_attention(&c, &q, &k, &v, None, Some((&bias, &bd))),
        1e-5,
    );
}

/// A decode step (one query row) splits the visible keys into chunks
/// whose partial softmaxes are combined: a chunk with every key masked,
/// the trailing masked keys of a preallocated cache, a NaN key and any
/// thread count give what the definition says, the last bit for bit.
#[test]
fn decode_attention_chunks_combine_exactly_on_any_thread_count() {
    use rlx_cpu::kernels::attention::{attention, AttentionParams, AttnMask};
    let mut rng = Rng::new(21);
    let (sk, hq, hkv, d) = (300, 9, 3, 64);
    let c = AttnCase {
        b: 1,
        sq: 1,
        sk,
        hq,
        hkv,
        d,
        kind: MaskKind::Custom,
        scale: None,
        softcap: None,
    };
    let q = rng.vec(hq * d, 1.0);
    let k = rng.vec(sk * hkv * d, 1.0);
    let mut v = rng.vec(sk * hkv * d, 1.0);
    // Keys 0..70 masked (two whole chunks and part of a third), 70..250
    // kept but 100, and 250.. the unused tail of the cache.
    let keep: Vec<f32> = (0..sk)
        .map(|j| ((70..250).contains(&j) && j != 100) as u8 as f32)
        .collect();
    let p = AttentionParams {
        batch: 1,
        seq_q: 1,
        seq_k: sk,
        num_heads: hq,
        num_kv_heads: hkv,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: None,
        mask_kind: MaskKind::Custom,
        q_row_stride: hq * d,
        k_row_stride: hkv * d,
        v_row_stride: hkv * d,
        out_row_stride: hq * d,
        bf16: false,
    };
    let want = naive_attention(&c, &q, &k, &v, Some(&keep), None);
    let run = |threads: usize, v: &[f32], parallel: bool| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut out = vec![f32::NAN; hq * d];
        pool.install(|| attention(&p, &q, &k, v, AttnMask::KeepF32(&keep), &mut out, parallel))
            .unwrap();
        out
    };
    let one = run(1, &v, false);
    assert_close(&one, &want, 1e-5);
    for threads in [2, 3, 8] {
        let got = run(threads, &v, true);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{threads} threads"
        );
    }
    // Every key masked: zeros.
    let none = vec![0f32; sk];
    let mut out = vec![f32::NAN; hq * d];
    attention(&p, &q, &k, &v, AttnMask::KeepF32(&none), &mut out, true).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
    // A NaN in a kept value row reaches every head of its KV head, and
    // only those; a NaN in a masked row reaches none.
    v[(120 * hkv + 1) * d + 5] = f32::NAN;
    v[(100 * hkv) * d] = f32::NAN;
    let got = run(2, &v, true);
    for h in 0..hq {
        let nan = got[h * d + 5].is_nan();
        assert_eq!(nan, h / 3 == 1, "head {h}");
        assert!(!got[h * d].is_nan(), "head {h}");
    }
}

/// Prefill-sized attention with fewer (batch, head) pairs than threads:
/// each head's query rows split into parts of whole 64-row blocks, one
/// task each. Causal and sliding-window masks, and keep-masks with one
/// masked key and with none, give the definition's values on one thread
/// and the same bits on 2, 5 and 16 threads.
#[test]
fn packed_attention_split_into_query_parts_keeps_the_bits() {
    use rlx_cpu::kernels::attention::{attention, AttentionParams, AttnMask};
    let mut rng = Rng::new(33);
    let (b, s, hq, hkv, d) = (1, 200, 2, 1, 32);
    let q = rng.vec(b * s * hq * d, 1.0);
    let k = rng.vec(b * s * hkv * d, 1.0);
    let v = rng.vec(b * s * hkv * d, 1.0);
    let gap: Vec<f32> = (0..s).map(|j| (j != 150) as u8 as f32).collect();
    let ones = vec![1f32; s];
    let cases = [
        (MaskKind::Causal, None),
        (MaskKind::SlidingWindow(70), None),
        (MaskKind::Custom, Some(&gap)),
        (MaskKind::Custom, Some(&ones)),
    ];
    for (kind, keep) in cases {
        {
            let c = AttnCase {
                b,
                sq: s,
                sk: s,
                hq,
                hkv,
                d,
                kind,
                scale: None,
                softcap: None,
            };
            let p = AttentionParams {
                batch: b,
                seq_q: s,
                seq_k: s,
                num_heads: hq,
                num_kv_heads: hkv,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                softcap: None,
                mask_kind: kind,
                q_row_stride: hq * d,
                k_row_stride: hkv * d,
                v_row_stride: hkv * d,
                out_row_stride: hq * d,
                bf16: false,
            };
            let run = |threads: usize, parallel: bool| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut out = vec![f32::NAN; b * s * hq * d];
                let mask = keep.map_or(AttnMask::None, |m| AttnMask::KeepF32(m));
                pool.install(|| attention(&p, &q, &k, &v, mask, &mut out, parallel))
                    .unwrap();
                out
            };
            let one = run(1, false);
            let want = naive_attention(&c, &q, &k, &v, keep.map(|m| &m[..]), None);
            assert_close(&one, &want, 1e-5);
            for threads in [2, 5, 16] {
                let got = run(threads, true);
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{kind:?}, {threads} threads"
                );
            }
        }
    }
}

#[test]
fn attention_reads_packed_qkv() {
    use rlx_cpu::kernels::attention::{attention, AttentionParams, AttnMask};
    let mut rng = Rng::new(12);
    let (b, s, h, d) = (2, 9, 3, 8);
    let w = h * d;
    let qkv = rng.vec(b * s * 3 * w, 1.0);
    let split = |part: usize| -> Vec<f32> {
        (0..b * s)
            .flat_map(|r| qkv[r * 3 * w + part * w..r * 3 * w + (part + 1) * w].to_vec())
            .collect()
    };
    let (q, k, v) = (split(0), split(1), split(2));
    let c = AttnCase {
        b,
        sq: s,
        sk: s,
        hq: h,
        hkv: h,
        d,
        kind: MaskKind::Causal,
        scale: None,
        softcap: None,
    };
    let want = naive_attention(&c, &q, &k, &v, None, None);
    let p = AttentionParams {
        batch: b,
        seq_q: s,
        seq_k: s,
        num_heads: h,
        num_kv_heads: h,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: None,
        mask_kind: MaskKind::Causal,
        q_row_stride: 3 * w,
        k_row_stride: 3 * w,
        v_row_stride: 3 * w,
        out_row_stride: w,
        bf16: false,
    };
    let mut out = vec![f32::NAN; b * s * w];
    attention(
        &p,
        &qkv,
        &qkv[w..],
        &qkv[2 * w..],
        AttnMask::None,
        &mut out,
        false,
    )
    .unwrap();
    assert_close(&out, &want, 1e-5);
    // A stride that overruns the buffer is an error.
    let mut bad = p.clone();
    bad.q_row_stride = 4 * w;
    assert!(attention(
        &bad,
        &qkv,
        &qkv[w..],
        &qkv[2 * w..],
        AttnMask::None,
        &mut out,
        true
    )
    .is_err());
}

/// `AttentionParams::bf16` (the opt-in bf16 precision): the packed path's
/// two products take bf16 operands, so the output equals exact attention
/// over bf16-rounded q, k and v up to the probabilities' own rounding to
/// bf16 (relative 2^-9 each, so at most ~2^-9 max|v| on an output), for
/// padded keep-masks, causal and sliding-window masks and GQA; and it
/// really differs from the f32 path.
#[test]
fn attention_in_bf16_matches_exact_attention_over_rounded_operands() {
    use rlx_cpu::kernels::attention::{attention, AttentionParams, AttnMask};
    use rlx_cpu::kernels::packed_gemm::bf16_bits;
    let round = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&v| f32::from_bits(u32::from(bf16_bits(v)) << 16))
            .collect()
    };
    let mut rng = Rng::new(41);
    for (b, s, hq, hkv, d, kind) in [
        (3, 40, 4, 4, 32, MaskKind::Custom),
        (2, 37, 6, 2, 64, MaskKind::Causal),
        (1, 70, 2, 1, 16, MaskKind::SlidingWindow(20)),
    ] {
        let (q, k, v) = (
            rng.vec(b * s * hq * d, 2.0),
            rng.vec(b * s * hkv * d, 2.0),
            rng.vec(b * s * hkv * d, 1.0),
        );
        // Batch row 1 pads its last 9 keys.
        let keep: Vec<f32> = (0..b * s)
            .map(|i| (i / s != 1 || i % s < s - 9) as u8 as f32)
            .collect();
        let mask = || match kind {
            MaskKind::Custom => AttnMask::KeepF32(&keep),
            _ => AttnMask::None,
        };
        let c = AttnCase {
            b,
            sq: s,
            sk: s,
            hq,
            hkv,
            d,
            kind,
            scale: None,
            softcap: None,
        };
        let keep_arg = matches!(kind, MaskKind::Custom).then_some(&keep[..]);
        let want = naive_attention(&c, &round(&q), &round(&k), &round(&v), keep_arg, None);
        let mut p = AttentionParams {
            batch: b,
            seq_q: s,
            seq_k: s,
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: None,
            mask_kind: kind,
            q_row_stride: hq * d,
            k_row_stride: hkv * d,
            v_row_stride: hkv * d,
            out_row_stride: hq * d,
            bf16: true,
        };
        let mut got = vec![f32::NAN; b * s * hq * d];
        attention(&p, &q, &k, &v, mask(), &mut got, true).unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 4e-3, "{kind:?} d{d}: max abs error {worst:e}");
        p.bf16 = false;
        let mut exact = vec![f32::NAN; b * s * hq * d];
        attention(&p, &q, &k, &v, mask(), &mut exact, true).unwrap();
        let moved = got
            .iter()
            .zip(&exact)
            .map(|(&g, &e)| (g - e).abs())
            .fold(0.0, f32::max);
        assert!(moved > 1e-4, "{kind:?}: bf16 changed nothing ({moved:e})");
    }
}

// ---------------------------------------------------------------- rope

#[test]
fn rope_both_styles_partial_rotary() {
    let mut rng = Rng::new(13);
    let (b, s, h) = (2, 5, 3);
    for (hd, n_rot) in [(8usize, 8usize), (12, 4), (6, 0), (16, 10)] {
        for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
            for per_batch in [false, true] {
                let theta = 10000.0f32;
                let x = rng.vec(b * s * h * hd, 1.0);
                let pos: Vec<i64> = if per_batch {
                    (0..b * s).map(|i| (i * 37 % 1000) as i64).collect()
                } else {
                    (0..s).map(|i| i as i64 + 3).collect()
                };
                let mut want = f64s(&x);
                for bi in 0..b {
                    for si in 0..s {
                        let p = if per_batch { pos[bi * s + si] } else { pos[si] } as f64;
                        for hh in 0..h {
                            let base = ((bi * s + si) * h + hh) * hd;
                            for i in 0..n_rot / 2 {
                                let ang = p * (theta as f64).powf(-2.0 * i as f64 / n_rot as f64);
                                let (i0, i1) = match style {
                                    RopeStyle::NeoX => (i, i + n_rot / 2),
                                    RopeStyle::GptJ => (2 * i, 2 * i + 1),
                                };
                                let (a, bb) = (x[base + i0] as f64, x[base + i1] as f64);
                                want[base + i0] = a * ang.cos() - bb * ang.sin();
                                want[base + i1] = a * ang.sin() + bb * ang.cos();
                            }
                        }
                    }
                }
                let op = Op::Rope {
                    head_dim: hd,
                    n_rot,
                    theta,
                    style,
                };
                let xd = [b, s, h * hd];
                let (pos_shape, pos_buf_i32): (Shape, Vec<i32>) = if per_batch {
                    (
                        Shape::new(&[b, s], DType::I32),
                        pos.iter().map(|&p| p as i32).collect(),
                    )
                } else {
                    (
                        Shape::new(&[s], DType::I32),
                        pos.iter().map(|&p| p as i32).collect(),
                    )
                };
                let shapes = [Shape::f32(&xd), pos_shape.clone()];
                let refs: Vec<&Shape> = shapes.iter().collect();
                let mut out = vec![f32::NAN; x.len()];
                run_op(
                    &op,
                    &[In::F32(&x), In::I32(&pos_buf_i32)],
                    &refs,
                    Out::F32(&mut out),
                    &Shape::f32(&xd),
                )
                .unwrap();
                assert_close(&out, &want, 1e-5);
                // i64 positions give the same result.
                let shapes = [Shape::f32(&xd), pos_shape.with_dtype(DType::I64)];
                let refs: Vec<&Shape> = shapes.iter().collect();
                let mut out2 = vec![f32::NAN; x.len()];
                run_op(
                    &op,
                    &[In::F32(&x), In::I64(&pos)],
                    &refs,
                    Out::F32(&mut out2),
                    &Shape::f32(&xd),
                )
                .unwrap();
                assert_eq!(out, out2);
            }
        }
    }
}

// ---------------------------------------------------------------- movement

#[test]
fn movement_ops() {
    let mut rng = Rng::new(14);
    let x = rng.vec(2 * 3 * 4, 1.0);
    let dims = [2usize, 3, 4];
    // Reshape.
    assert_eq!(
        run_f32(&Op::Reshape { shape: vec![4, 6] }, &[(&x, &dims)], &[4, 6]),
        x
    );
    // Expand.
    let e = rng.vec(3, 1.0);
    let got = run_f32(
        &Op::Expand {
            shape: vec![2, 4, 3],
        },
        &[(&e, &[1, 3])],
        &[2, 4, 3],
    );
    for i in 0..24 {
        assert_eq!(got[i], e[i % 3]);
    }
    let got = run_f32(&Op::Expand { shape: vec![3, 5] }, &[(&e, &[3, 1])], &[3, 5]);
    for i in 0..15 {
        assert_eq!(got[i], e[i / 5]);
    }
    // Narrow on each axis.
    for (axis, start, len) in [(0usize, 1usize, 1usize), (1, 1, 2), (2, 3, 1)] {
        let mut od = dims;
        od[axis] = len;
        let got = run_f32(&Op::Narrow { axis, start, len }, &[(&x, &dims)], &od);
        let want: Vec<f64> = (0..numel(&od))
            .map(|i| {
                let mut idx = unravel(i, &od);
                idx[axis] += start;
                x[idx
                    .iter()
                    .zip(strides(&dims))
                    .map(|(a, s)| a * s)
                    .sum::<usize>()] as f64
            })
            .collect();
        assert_close(&got, &want, 0.0);
    }
    // Transpose.
    for perm in [
        vec![2usize, 0, 1],
        vec![0, 2, 1],
        vec![1, 0, 2],
        vec![0, 1, 2],
    ] {
        let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let got = run_f32(&Op::Transpose { perm: perm.clone() }, &[(&x, &dims)], &od);
        let want: Vec<f64> = (0..24)
            .map(|i| {
                let oi = unravel(i, &od);
                let mut ii = [0; 3];
                for (a, &p) in perm.iter().enumerate() {
                    ii[p] = oi[a];
                }
                x[ii[0] * 12 + ii[1] * 4 + ii[2]] as f64
            })
            .collect();
        assert_close(&got, &want, 0.0);
    }
    // Concat of three i64 tensors on axis 1.
    let a: Vec<i64> = (0..6).collect();
    let b: Vec<i64> = (100..104).collect();
    let c: Vec<i64> = (200..202).collect();
    let shapes = [
        Shape::new(&[2, 3], DType::I64),
        Shape::new(&[2, 2], DType::I64),
        Shape::new(&[2, 1], DType::I64),
    ];
    let refs: Vec<&Shape> = shapes.iter().collect();
    let mut out = vec![0i64; 12];
    run_op(
        &Op::Concat { axis: 1 },
        &[In::I64(&a), In::I64(&b), In::I64(&c)],
        &refs,
        Out::I64(&mut out),
        &Shape::new(&[2, 6], DType::I64),
    )
    .unwrap();
    assert_eq!(out, [0, 1, 2, 100, 101, 200, 3, 4, 5, 102, 103, 201]);
}

#[test]
fn gather_rows_and_range_errors() {
    let table: Vec<f32> = (0..5 * 3).map(|v| v as f32).collect();
    let ids = [4i64, 0, 2, 2];
    let shapes = [Shape::f32(&[5, 3]), Shape::new(&[2, 2], DType::I64)];
    let refs: Vec<&Shape> = shapes.iter().collect();
    let mut out = vec![f32::NAN; 12];
    let op = Op::Gather { axis: 0 };
    run_op(
        &op,
        &[In::F32(&table), In::I64(&ids)],
        &refs,
        Out::F32(&mut out),
        &Shape::f32(&[2, 2, 3]),
    )
    .unwrap();
    assert_eq!(out, [12., 13., 14., 0., 1., 2., 6., 7., 8., 6., 7., 8.]);
    for bad in [5i32, -1] {
        let ids32 = [0i32, bad];
        let shapes = [Shape::f32(&[5, 3]), Shape::new(&[2], DType::I32)];
        let refs: Vec<&Shape> = shapes.iter().collect();
        let mut out = vec![0.0f32; 6];
        let err = run_op(
            &op,
            &[In::F32(&table), In::I32(&ids32)],
            &refs,
            Out::F32(&mut out),
            &Shape::f32(&[2, 3]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            KernelError::IndexOutOfRange {
                op: "Gather",
                index: bad as i64,
                size: 5
            }
        );
    }
    // Integer tables gather too.
    let itab: Vec<i32> = (0..10).collect();
    let shapes = [
        Shape::new(&[5, 2], DType::I32),
        Shape::new(&[1], DType::I32),
    ];
    let refs: Vec<&Shape> = shapes.iter().collect();
    let mut out = vec![0i32; 2];
    run_op(
        &op,
        &[In::I32(&itab), In::I32(&[3])],
        &refs,
        Out::I32(&mut out),
        &Shape::new(&[1, 2], DType::I32),
    )
    .unwrap();
    assert_eq!(out, [6, 7]);
}

#[test]
fn cast_semantics() {
    let x = [1.7f32, -2.9, f32::NAN, 1e20, -1e20, 0.0, 300.0, -0.0];
    let shapes = [Shape::f32(&[8])];
    let refs: Vec<&Shape> = shapes.iter().collect();
    let mut i32s = vec![0i32; 8];
    run_op(
        &Op::Cast { to: DType::I32 },
        &[In::F32(&x)],
        &refs,
        Out::I32(&mut i32s),
        &Shape::new(&[8], DType::I32),
    )
    .unwrap();
    assert_eq!(i32s, [1, -2, 0, i32::MAX, i32::MIN, 0, 300, 0]);
    let mut i64s = vec![0i64; 8];
    run_op(
        &Op::Cast { to: DType::I64 },
        &[In::F32(&x)],
        &refs,
        Out::I64(&mut i64s),
        &Shape::new(&[8], DType::I64),
    )
    .unwrap();
    assert_eq!(i64s[..3], [1, -2, 0]);
    let mut u8s = vec![9u8; 8];
    run_op(
        &Op::Cast { to: DType::U8 },
        &[In::F32(&x)],
        &refs,
        Out::U8(&mut u8s),
        &Shape::new(&[8], DType::U8),
    )
    .unwrap();
    assert_eq!(u8s, [1, 0, 0, 255, 0, 0, 255, 0]);
    let mut bools = vec![9u8; 8];
    run_op(
        &Op::Cast { to: DType::Bool },
        &[In::F32(&x)],
        &refs,
        Out::U8(&mut bools),
        &Shape::new(&[8], DType::Bool),
    )
    .unwrap();
    assert_eq!(bools, [1, 1, 1, 1, 1, 0, 1, 0]);
    // i64 -> f32 and bool -> f32.
    let ids = [3i64, -4];
    let shapes = [Shape::new(&[2], DType::I64)];
    let refs: Vec<&Shape> = shapes.iter().collect();
    let mut f = vec![0.0f32; 2];
    run_op(
        &Op::Cast { to: DType::F32 },
        &[In::I64(&ids)],
        &refs,
        Out::F32(&mut f),
        &Shape::f32(&[2]),
    )
    .unwrap();
    assert_eq!(f, [3.0, -4.0]);
    let shapes = [Shape::new(&[2], DType::Bool)];
    let refs: Vec<&Shape> = shapes.iter().collect();
    run_op(
        &Op::Cast { to: DType::F32 },
        &[In::U8(&[1, 0])],
        &refs,
        Out::F32(&mut f),
        &Shape::f32(&[2]),
    )
    .unwrap();
    assert_eq!(f, [1.0, 0.0]);
}

// ---------------------------------------------------------------- errors

#[test]
fn bad_inputs_are_errors() {
    let x = vec![1.0f32; 6];
    let s = Shape::f32(&[2, 3]);
    let relu = Op::Activation(Activation::Relu);
    // Wrong input length.
    let mut out = vec![0.0f32; 6];
    let err = run_op(&relu, &[In::F32(&x[..5])], &[&s], Out::F32(&mut out), &s).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::BadBuffer {
                expected_len: 6,
                got: 5,
                ..
            }
        ),
        "{err}"
    );
    // Wrong output length.
    let mut short = vec![0.0f32; 5];
    let err = run_op(&relu, &[In::F32(&x)], &[&s], Out::F32(&mut short), &s).unwrap_err();
    assert!(matches!(err, KernelError::BadBuffer { .. }), "{err}");
    // Wrong dtype of buffer.
    let xi = [1i32; 6];
    let err = run_op(&relu, &[In::I32(&xi)], &[&s], Out::F32(&mut out), &s).unwrap_err();
    assert!(matches!(err, KernelError::BadDtype { .. }), "{err}");
    // Output shape that inference disagrees with.
    let err = run_op(
        &relu,
        &[In::F32(&x)],
        &[&s],
        Out::F32(&mut out),
        &Shape::f32(&[3, 2]),
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::BadShape { .. }), "{err}");
    // Arity.
    let err = run_op(
        &relu,
        &[In::F32(&x), In::F32(&x)],
        &[&s],
        Out::F32(&mut out),
        &s,
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Arity { .. }), "{err}");
    // Leaves.
    let err = run_op(
        &Op::Input { name: "x".into() },
        &[],
        &[],
        Out::F32(&mut out),
        &s,
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Leaf { .. }), "{err}");
    // A recurrent op without its inputs fails the shape rule.
    let op = Op::GatedDeltaNet {
        state_size: 2,
        carry_state: false,
    };
    let err = run_op(&op, &[], &[], Out::F32(&mut out), &s).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::BadShape { .. } | KernelError::BadBuffer { .. }
        ),
        "{err}"
    );
    // Mismatched matmul K.
    let err = run_op(
        &Op::MatMul,
        &[In::F32(&x), In::F32(&x)],
        &[&s, &s],
        Out::F32(&mut [0.0; 4]),
        &Shape::f32(&[2, 2]),
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::BadShape { .. }), "{err}");
    // Error messages name the op.
    assert!(err.to_string().starts_with("MatMul"), "{err}");
}

#[test]
fn cache_write_replaces_rows_and_checks_range() {
    let (b, ctx, d, n) = (2usize, 5usize, 3usize, 2usize);
    let cache: Vec<f32> = (0..b * ctx * d).map(|v| v as f32).collect();
    let rows: Vec<f32> = (0..b * n * d).map(|v| -(v as f32) - 1.0).collect();
    let shapes = [
        Shape::f32(&[b, ctx, d]),
        Shape::f32(&[b, n, d]),
        Shape::new(&[1], DType::I64),
    ];
    let refs: Vec<&Shape> = shapes.iter().collect();
    let op = Op::CacheWrite { axis: 1 };
    let mut out = vec![f32::NAN; cache.len()];
    run_op(
        &op,
        &[In::F32(&cache), In::F32(&rows), In::I64(&[3])],
        &refs,
        Out::F32(&mut out),
        &Shape::f32(&[b, ctx, d]),
    )
    .unwrap();
    for bi in 0..b {
        for t in 0..ctx {
            for e in 0..d {
                let got = out[(bi * ctx + t) * d + e];
                let want = if (3..5).contains(&t) {
                    rows[(bi * n + t - 3) * d + e]
                } else {
                    cache[(bi * ctx + t) * d + e]
                };
                assert_eq!(got, want);
            }
        }
    }
    for bad in [4i64, -1] {
        let err = run_op(
            &op,
            &[In::F32(&cache), In::F32(&rows), In::I64(&[bad])],
            &refs,
            Out::F32(&mut out),
            &Shape::f32(&[b, ctx, d]),
        )
        .unwrap_err();
        assert!(matches!(err, KernelError::IndexOutOfRange { .. }), "{err}");
    }
    // In place.
    let mut c2 = cache.clone();
    rlx_cpu::kernels::movement::cache_write_inplace(&mut c2, &[b, ctx, d], &rows, &[b, n, d], 3)
        .unwrap();
    assert_eq!(c2, out);
}
