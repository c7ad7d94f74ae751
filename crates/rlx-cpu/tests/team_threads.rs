//! A decode step's parallel loops (quantized matmuls of one row, one-query
//! attention over a long cache) run on the spinning thread team of the
//! model's thread count: the outputs are the same bits on 1, 2, 3 and 5
//! threads, in thunks and hybrid mode, for f32 and int8 activations, and
//! two models sharing one team from two threads at once (one then runs on
//! the rayon pool) still give those bits.

use rlx_cpu::{CpuModel, CpuOptions};
use rlx_ir::{ActivationPrecision, DType, Graph, MaskKind, Op, QuantScheme, Shape};
use rlx_runtime::{Executable, TensorRef};

#[path = "../../rlx/tests/common/rng.rs"]
mod rng;
use rng::Rng;

const K: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const D: usize = 64;
/// Keys in the cache: several one-query chunks of 32.
const KEYS: usize = 300;

fn weights(scheme: QuantScheme, n: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = scheme.row_bytes(K).unwrap();
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

/// x [1, 1, K] -> q = x Wq^T [1, 1, H*D] -> attention over the cache
/// (k, v [1, KEYS, Hkv*D]) -> o = a Wo^T [1, 1, K].
fn step(scheme: QuantScheme, act: ActivationPrecision) -> Graph {
    let rb = scheme.row_bytes(K).unwrap();
    let mut g = Graph::new("decode_step");
    let x = g.input("x", Shape::f32(&[1, 1, K]));
    let k = g.input("k", Shape::f32(&[1, KEYS, KV_HEADS * D]));
    let v = g.input("v", Shape::f32(&[1, KEYS, KV_HEADS * D]));
    let wq = g.param("wq", Shape::new(&[HEADS * D, rb], DType::U8));
    let wo = g.param("wo", Shape::new(&[K, rb], DType::U8));
    let mm = Op::DequantMatMul {
        scheme,
        activations: act,
    };
    let q = g.add_node(mm.clone(), vec![x, wq], Shape::f32(&[1, 1, HEADS * D]));
    let attn = Op::Attention {
        num_heads: HEADS,
        head_dim: D,
        mask_kind: MaskKind::Causal,
        score_scale: None,
        attn_logit_softcap: None,
    };
    let a = g.add_node(attn, vec![q, k, v], Shape::f32(&[1, 1, HEADS * D]));
    let o = g.add_node(mm, vec![a, wo], Shape::f32(&[1, 1, K]));
    g.set_outputs(vec![q, a, o]);
    g
}

struct Case {
    wq: Vec<u8>,
    wo: Vec<u8>,
    x: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn run(model: &mut CpuModel, c: &Case) -> Vec<Vec<f32>> {
    let outs = model
        .run(&[
            ("x", TensorRef::F32(&c.x)),
            ("k", TensorRef::F32(&c.k)),
            ("v", TensorRef::F32(&c.v)),
        ])
        .unwrap();
    outs.iter().map(|t| t.as_f32().unwrap().to_vec()).collect()
}

fn model(g: Graph, c: &Case, threads: usize, hybrid: bool) -> CpuModel {
    let opts = CpuOptions {
        hybrid,
        threads: Some(threads),
        ..Default::default()
    };
    let mut m = CpuModel::compile(g, &opts).unwrap();
    m.set_param("wq", TensorRef::U8(&c.wq)).unwrap();
    m.set_param("wo", TensorRef::U8(&c.wo)).unwrap();
    m
}

#[test]
fn decode_loops_give_the_same_bits_on_every_thread_count() {
    let mut rng = Rng::new(7);
    for scheme in [QuantScheme::Q4_1, QuantScheme::Q8_0] {
        let case = Case {
            wq: weights(scheme, HEADS * D, &mut rng),
            wo: weights(scheme, K, &mut rng),
            x: (0..K).map(|_| rng.f32()).collect(),
            k: (0..KEYS * KV_HEADS * D).map(|_| rng.f32()).collect(),
            v: (0..KEYS * KV_HEADS * D).map(|_| rng.f32()).collect(),
        };
        for act in [ActivationPrecision::F32, ActivationPrecision::Int8] {
            let want = run(&mut model(step(scheme, act), &case, 1, false), &case);
            assert!(want.iter().flatten().all(|x| x.is_finite()));
            assert!(want[1].iter().any(|&x| x != 0.0), "attention gave zeros");
            for threads in [2, 3, 5] {
                for hybrid in [false, true] {
                    let mut m = model(step(scheme, act), &case, threads, hybrid);
                    for _ in 0..3 {
                        assert!(
                            run(&mut m, &case) == want,
                            "{scheme:?} {act:?}: {threads} threads (hybrid {hybrid}) differ from 1"
                        );
                    }
                }
            }
            // Two models on one team, run from two threads at once: one of
            // them finds the team busy and runs its loops on rayon.
            let mut a = model(step(scheme, act), &case, 3, true);
            let mut b = model(step(scheme, act), &case, 3, true);
            std::thread::scope(|s| {
                let ha = s.spawn(|| (0..20).map(|_| run(&mut a, &case)).collect::<Vec<_>>());
                let hb = s.spawn(|| (0..20).map(|_| run(&mut b, &case)).collect::<Vec<_>>());
                for got in ha.join().unwrap().into_iter().chain(hb.join().unwrap()) {
                    assert!(got == want, "{scheme:?} {act:?}: concurrent runs differ");
                }
            });
        }
    }
}
