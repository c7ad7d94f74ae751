//! `DequantMatMul`s (`Int8` and `F32` activations) on weights repacked
//! into 16-row panels, through the executor: the model makes the panels from
//! the param (and remakes them when it changes), shares them with
//! `compile_sharing`, and gives the numbers of the GGUF-layout kernels
//! within f32 rounding.
//!
//! `RLX_CPU_QUANT_PANELS=1` forces panels on CPUs without AVX2 (there
//! the portable panel kernel runs), so this runs everywhere; the
//! variable is set before any model is compiled (one test in this binary).

use rlx_cpu::kernels::{run_op, In, Out};
use rlx_cpu::{CpuModel, CpuOptions};
use rlx_formats::{quant::dequantize, GgmlType};
use rlx_ir::{ActivationPrecision, DType, Graph, Op, QuantScheme, Shape};
use rlx_runtime::{Executable, TensorRef};

#[path = "../../rlx/tests/common/rng.rs"]
mod rng;
use rng::Rng;

fn packed(scheme: QuantScheme, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = scheme.row_bytes(k).unwrap();
    let mut w: Vec<u8> = (0..n * rb).map(|_| rng.next_u64() as u8).collect();
    for blk in w.chunks_exact_mut(scheme.block_bytes()) {
        let v = 0.002 + (rng.next_u64() % 1000) as f32 * 5e-5;
        blk[..2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
        if scheme == QuantScheme::Q4_1 {
            blk[2..4].copy_from_slice(&half::f16::from_f32(-8.0 * v).to_bits().to_le_bytes());
        }
    }
    w
}

const K: usize = 576;
const N: usize = 200;

fn graph(scheme: QuantScheme, act: ActivationPrecision, m: usize) -> Graph {
    let rb = scheme.row_bytes(K).unwrap();
    let mut g = Graph::new("int8");
    let x = g.input("x", Shape::new(&[1, m, K], DType::F32));
    let w = g.param("w", Shape::new(&[N, rb], DType::U8));
    let op = Op::DequantMatMul {
        scheme,
        activations: act,
    };
    let y = g.add_node(op, vec![x, w], Shape::new(&[1, m, N], DType::F32));
    g.set_outputs(vec![y]);
    g
}

/// The GGUF-layout integer kernels through `run_op`.
fn direct(
    scheme: QuantScheme,
    act: ActivationPrecision,
    x: &[f32],
    m: usize,
    w: &[u8],
) -> Vec<f32> {
    let rb = scheme.row_bytes(K).unwrap();
    let op = Op::DequantMatMul {
        scheme,
        activations: act,
    };
    let mut out = vec![0.0f32; m * N];
    run_op(
        &op,
        &[In::F32(x), In::U8(w)],
        &[
            &Shape::new(&[1, m, K], DType::F32),
            &Shape::new(&[N, rb], DType::U8),
        ],
        Out::F32(&mut out),
        &Shape::new(&[1, m, N], DType::F32),
    )
    .unwrap();
    out
}

/// Within f32 rounding: 1e-6 of `Σ_k |x_ik w_jk|` per output (both sides
/// round ~K products and sums; the outputs themselves may cancel).
fn close(a: &[f32], b: &[f32], x: &[f32], scheme: QuantScheme, w: &[u8], what: &str) {
    let rb = scheme.row_bytes(K).unwrap();
    let mut wf = vec![0.0f32; K];
    let m = x.len() / K;
    for j in 0..N {
        dequantize(GgmlType::from(scheme), &w[j * rb..(j + 1) * rb], K, &mut wf).unwrap();
        for i in 0..m {
            let mag: f32 = (0..K).map(|e| (x[i * K + e] * wf[e]).abs()).sum();
            let (u, v) = (a[i * N + j], b[i * N + j]);
            assert!(
                (u - v).abs() <= 1e-6 * mag + 1e-30,
                "{what} [{i},{j}]: {u} vs {v} (Σ|xw| {mag})"
            );
        }
    }
}

#[test]
fn models_run_int8_matmuls_on_panels() {
    // SAFETY (of the test): set before any model in this binary compiles.
    std::env::set_var("RLX_CPU_QUANT_PANELS", "1");
    let mut rng = Rng::new(42);
    let schemes = [QuantScheme::Q4_0, QuantScheme::Q4_1, QuantScheme::Q8_0];
    let acts = [ActivationPrecision::Int8, ActivationPrecision::F32];
    for (scheme, act) in schemes.into_iter().flat_map(|s| acts.map(|a| (s, a))) {
        let w = packed(scheme, N, K, &mut rng);
        for hybrid in [false, true] {
            let opts = CpuOptions {
                hybrid,
                threads: Some(2),
                ..Default::default()
            };
            let mut a = CpuModel::compile(graph(scheme, act, 1), &opts).unwrap();
            a.set_param("w", TensorRef::U8(&w)).unwrap();
            let x1: Vec<f32> = (0..K).map(|_| rng.f32()).collect();
            let y1 = a.run(&[("x", TensorRef::F32(&x1))]).unwrap()[0]
                .as_f32()
                .unwrap()
                .to_vec();
            close(
                &y1,
                &direct(scheme, act, &x1, 1, &w),
                &x1,
                scheme,
                &w,
                &format!("{scheme:?} {act:?} m=1"),
            );
            let rb = scheme.row_bytes(K).unwrap();
            assert!(
                a.packed_bytes() >= N * rb,
                "{scheme:?}: no panels were made"
            );

            // Another shape shares the panels; 37 rows run 8/4/1-row tiles.
            let mut b = a.compile_sharing(graph(scheme, act, 37)).unwrap();
            assert_eq!(a.packed_bytes(), b.packed_bytes());
            let x37: Vec<f32> = (0..37 * K).map(|_| rng.f32()).collect();
            let y37 = b.run(&[("x", TensorRef::F32(&x37))]).unwrap()[0]
                .as_f32()
                .unwrap()
                .to_vec();
            close(
                &y37,
                &direct(scheme, act, &x37, 37, &w),
                &x37,
                scheme,
                &w,
                &format!("{scheme:?} {act:?} m=37"),
            );

            // A new weight value is repacked before the next run.
            let w2 = packed(scheme, N, K, &mut rng);
            b.set_param("w", TensorRef::U8(&w2)).unwrap();
            let y = b.run(&[("x", TensorRef::F32(&x37))]).unwrap()[0]
                .as_f32()
                .unwrap()
                .to_vec();
            close(
                &y,
                &direct(scheme, act, &x37, 37, &w2),
                &x37,
                scheme,
                &w2,
                &format!("{scheme:?} {act:?} new w"),
            );
            // ... and a keeps its own.
            let y = a.run(&[("x", TensorRef::F32(&x1))]).unwrap()[0]
                .as_f32()
                .unwrap()
                .to_vec();
            assert_eq!(y, y1);
        }
    }
}
