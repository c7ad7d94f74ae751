//! `DequantMatMul` through `run_op` against the reference interpreter
//! (`rlx_ref::run`, which dequantizes every row with `rlx_formats` and
//! multiplies in f64), for every block format, GEMV (m = 1) and tiled
//! (m > 1) paths, rank 2 and rank 3 activations. Tolerance: 1e-5 relative
//! to `Σ_k |x_k w_jk|` (the scale of the f32 rounding of a dot product).

use rlx_cpu::kernels::{run_op, In, Out};
use rlx_formats::{quant::dequantize, GgmlType};
use rlx_ir::{ActivationPrecision, DType, Graph, Op, QuantScheme, Shape, Tensor, TensorData};
use std::collections::HashMap;

#[path = "../../rlx/tests/common/rng.rs"]
mod rng;
use rng::Rng;

/// Random packed rows with finite, varied f16 scales (and mins).
fn packed(scheme: QuantScheme, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = scheme.row_bytes(k).unwrap();
    let mut w: Vec<u8> = (0..n * rb).map(|_| rng.next_u64() as u8).collect();
    let fields: &[usize] = match scheme {
        QuantScheme::Q4_0 | QuantScheme::Q5_0 | QuantScheme::Q8_0 => &[0],
        QuantScheme::Q4_1 | QuantScheme::Q5_1 | QuantScheme::Q4K | QuantScheme::Q5K => &[0, 2],
        QuantScheme::Q2K => &[80, 82],
        QuantScheme::Q3K => &[108],
        QuantScheme::Q6K => &[208],
        QuantScheme::Q8K => &[],
    };
    for blk in w.chunks_exact_mut(scheme.block_bytes()) {
        for (i, &o) in fields.iter().enumerate() {
            let mut v = 0.002 + (rng.next_u64() % 1000) as f32 * 5e-5;
            if i == 1 && matches!(scheme, QuantScheme::Q4_1 | QuantScheme::Q5_1) {
                v = -v * 8.0;
            }
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
        }
        if scheme == QuantScheme::Q8K {
            blk[..4].copy_from_slice(&0.003f32.to_le_bytes());
        }
    }
    w
}

fn check(scheme: QuantScheme, x_dims: &[usize], n: usize, seed: u64) {
    check_act(scheme, ActivationPrecision::F32, x_dims, n, seed)
}

fn check_act(
    scheme: QuantScheme,
    activations: ActivationPrecision,
    x_dims: &[usize],
    n: usize,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let k = *x_dims.last().unwrap();
    let rb = scheme.row_bytes(k).unwrap();
    let m: usize = x_dims[..x_dims.len() - 1].iter().product();
    let x = Tensor::f32(x_dims, (0..m * k).map(|_| rng.f32()).collect());
    let w = Tensor::u8(&[n, rb], packed(scheme, n, k, &mut rng));
    let op = Op::DequantMatMul {
        scheme,
        activations,
    };

    let mut g = Graph::new("dqmm");
    let xi = g.input("x", x.shape.clone());
    let wi = g.param("w", w.shape.clone());
    let y = g.push(op.clone(), vec![xi, wi]).unwrap();
    g.set_outputs(vec![y]);
    let bind: HashMap<String, Tensor> =
        [("x".to_string(), x.clone()), ("w".to_string(), w.clone())].into();
    let want = rlx_ref::run(&g, &bind).unwrap().remove(0);
    let want = want.as_f32().unwrap();

    let (TensorData::F32(xv), TensorData::U8(wv)) = (&*x.data, &*w.data) else {
        unreachable!()
    };
    let out_shape = g.node(y).shape.clone();
    let mut got = vec![f32::NAN; out_shape.numel()];
    run_op(
        &op,
        &[In::F32(xv), In::U8(wv)],
        &[&x.shape, &w.shape],
        Out::F32(&mut got),
        &out_shape,
    )
    .unwrap();

    let mut wf = vec![0.0f32; k];
    for j in 0..n {
        dequantize(
            GgmlType::from(scheme),
            &wv[j * rb..(j + 1) * rb],
            k,
            &mut wf,
        )
        .unwrap();
        for i in 0..m {
            let mag: f64 = xv[i * k..(i + 1) * k]
                .iter()
                .zip(&wf)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let (g, w) = (got[i * n + j], want[i * n + j]);
            // Int8: Σ|x̂ w| is within 1% of Σ|x w|.
            let tol = match activations {
                ActivationPrecision::F32 => 1e-5,
                ActivationPrecision::Int8 => 2e-5,
            };
            assert!(
                ((g - w) as f64).abs() <= tol * mag + 1e-30,
                "{scheme:?} {activations:?} x{x_dims:?} n={n} [{i},{j}]: got {g}, reference {w} (Σ|xw| {mag})"
            );
        }
    }
}

/// Int8 activations: the reference rounds x to Q8 blocks on its own and
/// multiplies exactly; the integer kernels (Q4_0, Q4_1, Q8_0) and the
/// rounded-f32 fallback (other schemes) must agree within f32 rounding.
#[test]
fn int8_activations_match_reference() {
    let act = ActivationPrecision::Int8;
    for (s, scheme) in QuantScheme::ALL.into_iter().enumerate() {
        let k = scheme.block_elems() * 2;
        check_act(scheme, act, &[1, k], 19, s as u64 + 1000);
        check_act(scheme, act, &[1, 6, k], 45, s as u64 + 1200);
        check_act(scheme, act, &[3, k], 130, s as u64 + 1300);
    }
    check_act(QuantScheme::Q4_1, act, &[1, 1, 576], 960, 7);
    check_act(QuantScheme::Q4_1, act, &[1, 11, 1536], 576, 8);
    check_act(QuantScheme::Q8_0, act, &[1, 1, 576], 4096, 9);
}

#[test]
fn every_scheme_matches_reference() {
    for (s, scheme) in QuantScheme::ALL.into_iter().enumerate() {
        let k = scheme.block_elems() * 2;
        check(scheme, &[1, k], 19, s as u64);
        check(scheme, &[1, 1, k], 70, s as u64 + 100);
        check(scheme, &[1, 6, k], 45, s as u64 + 200);
        check(scheme, &[3, k], 130, s as u64 + 300);
    }
}

#[test]
fn smollm2_shapes_match_reference() {
    // The formats and shapes SmolLM2-135M uses: Q4_1 projections, Q8_0 head.
    check(QuantScheme::Q4_1, &[1, 1, 576], 960, 1);
    check(QuantScheme::Q4_1, &[1, 1, 1536], 576, 2);
    check(QuantScheme::Q4_1, &[1, 11, 576], 3072, 3);
    check(QuantScheme::Q8_0, &[1, 1, 576], 4096, 4);
}

#[test]
fn wrong_buffers_are_errors() {
    let op = Op::DequantMatMul {
        scheme: QuantScheme::Q8_0,
        activations: ActivationPrecision::F32,
    };
    let xs = Shape::f32(&[1, 32]);
    let ws = Shape::new(&[2, 34], DType::U8);
    let os = Shape::f32(&[1, 2]);
    let x = vec![0.0f32; 32];
    let mut out = vec![0.0f32; 2];
    // Weights passed as f32.
    let wf = vec![0.0f32; 68];
    let err = run_op(
        &op,
        &[In::F32(&x), In::F32(&wf)],
        &[&xs, &ws],
        Out::F32(&mut out),
        &os,
    )
    .unwrap_err();
    assert!(err.to_string().contains("DequantMatMul"), "{err}");
    // Too few weight bytes.
    let wb = vec![0u8; 60];
    assert!(run_op(
        &op,
        &[In::F32(&x), In::U8(&wb)],
        &[&xs, &ws],
        Out::F32(&mut out),
        &os
    )
    .is_err());
    // Row bytes that do not match K.
    let ws_bad = Shape::new(&[2, 30], DType::U8);
    let wb = vec![0u8; 60];
    assert!(run_op(
        &op,
        &[In::F32(&x), In::U8(&wb)],
        &[&xs, &ws_bad],
        Out::F32(&mut out),
        &os
    )
    .is_err());
}
