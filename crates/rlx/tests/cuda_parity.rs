//! CUDA backend parity (built only with `--features cuda`).
//!
//! - every op the backend runs, one small graph each, against the CPU
//!   backend, in Thunks and Hybrid (CUDA-graph) modes;
//! - random DAGs of random ops, thunks and hybrid (with a policy that
//!   splits after every second op), against the CPU backend;
//! - all-MiniLM-L6-v2 embeddings against the PyTorch reference
//!   (crates/rlx-models/tests/data/minilm_embeddings.json) within 1e-4.
//!
//! Where no CUDA driver or device is present every test prints
//! "skipped: no CUDA device" and passes (CI has no GPU).
#![cfg(feature = "cuda")]

mod common;
use common::{assert_close, run_compiled, tref, Rng};
use rlx::hybrid::SplitPolicy;
use rlx::ir::op::{Activation, BinaryOp, MaskKind, ReduceOp, RopeStyle};
use rlx::ir::{DType, Graph, NodeId, Op, Shape, Tensor};
use rlx::{Device, Error, ExecMode, Session};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Whether a CUDA device is usable; prints the skip line when not.
fn cuda_or_skip() -> bool {
    let mut g = Graph::new("probe");
    let x = g.input("x", Shape::f32(&[2]));
    let y = g.push(Op::Activation(Activation::Neg), vec![x]).unwrap();
    g.set_outputs(vec![y]);
    match Session::new(Device::Cuda(0)).compile(g) {
        Ok(_) => true,
        Err(Error::Device(why)) => {
            println!("skipped: no CUDA device ({why})");
            false
        }
        Err(e) => panic!("CUDA probe failed: {e}"),
    }
}

/// Bindings for every leaf: f32 uniform, index leaves in range of the
/// Gather table they feed (or 0..8), u8 leaves 0/1.
fn bindings(g: &Graph, rng: &mut Rng) -> HashMap<String, Tensor> {
    let mut b = HashMap::new();
    for n in g.nodes() {
        let name = match &n.op {
            Op::Input { name } | Op::Param { name } => name.clone(),
            _ => continue,
        };
        let numel = n.shape.numel();
        let limit = g
            .users(n.id)
            .iter()
            .find_map(|&u| match g.node(u).op {
                Op::Gather { .. } if g.node(u).inputs[1] == n.id => {
                    Some(g.node(g.node(u).inputs[0]).shape.dims[0])
                }
                _ => None,
            })
            .unwrap_or(8);
        let packed_for = g.users(n.id).iter().find_map(|&u| match g.node(u).op {
            Op::DequantMatMul { scheme, .. } if g.node(u).inputs[1] == n.id => Some(scheme),
            _ => None,
        });
        let t = match n.shape.dtype {
            DType::F32 if name.starts_with("keep") => keep_mask(&n.shape.dims),
            DType::U8 if packed_for.is_some() => {
                packed_blocks(packed_for.unwrap(), &n.shape.dims, rng)
            }
            DType::F32 => Tensor::f32(&n.shape.dims, rng.vec(numel, 1.0)),
            DType::I64 => Tensor::i64(
                &n.shape.dims,
                (0..numel).map(|_| rng.below(limit) as i64).collect(),
            ),
            DType::I32 => Tensor::i32(
                &n.shape.dims,
                (0..numel).map(|_| rng.below(limit) as i32).collect(),
            ),
            DType::U8 | DType::Bool => Tensor::u8(
                &n.shape.dims,
                (0..numel).map(|i| (i % 3 != 1) as u8).collect(),
            ),
            d => panic!("no generator for {d}"),
        };
        b.insert(name, t);
    }
    b
}

/// A `[B, S]` keep-mask with gaps and a different run of trailing zeros
/// per row (row b keeps nothing past `S - 3 - 2b`).
fn keep_mask(dims: &[usize]) -> Tensor {
    let s = *dims.last().unwrap();
    let v = (0..dims.iter().product::<usize>())
        .map(|i| {
            let (b, j) = (i / s, i % s);
            let last = s.saturating_sub(3 + 2 * b);
            (j <= last && j % 5 != 3) as u8 as f32
        })
        .collect();
    Tensor::f32(dims, v)
}

/// Random GGUF blocks of `scheme` for a `u8 [N, row_bytes]` weight, with
/// f16 scales (and Q4_1 minimums) of a few hundredths.
fn packed_blocks(scheme: rlx::ir::QuantScheme, dims: &[usize], rng: &mut Rng) -> Tensor {
    use rlx::ir::QuantScheme;
    // f16: 0.0100, 0.0500, -0.0188, 0.1000, -0.0300
    const SCALES: [u16; 5] = [0x211F, 0x2A66, 0xA4CD, 0x2E66, 0xA7AE];
    let mut bytes: Vec<u8> = (0..dims.iter().product::<usize>())
        .map(|_| rng.next_u64() as u8)
        .collect();
    let fields: &[usize] = match scheme {
        QuantScheme::Q4_1 | QuantScheme::Q5_1 => &[0, 2],
        _ => &[0],
    };
    for blk in bytes.chunks_exact_mut(scheme.block_bytes()) {
        for &f in fields {
            let h = SCALES[rng.below(SCALES.len())].to_le_bytes();
            blk[f..f + 2].copy_from_slice(&h);
        }
    }
    Tensor::u8(dims, bytes)
}

fn as_f32(t: &Tensor) -> Vec<f32> {
    t.data.to_f64().into_iter().map(|x| x as f32).collect()
}

/// Run on a session, returning every output as f32 values.
fn run_on(session: &Session, g: &Graph, b: &HashMap<String, Tensor>) -> Vec<Vec<f32>> {
    let mut m = session
        .compile(g.clone())
        .unwrap_or_else(|e| panic!("compile {}: {e}", g.name));
    let mut inputs = Vec::new();
    for n in g.nodes() {
        match &n.op {
            Op::Param { name } => m.set_param_typed(name, tref(&b[name])).expect("set_param"),
            Op::Input { name } => inputs.push((name.as_str(), tref(&b[name]))),
            _ => {}
        }
    }
    let outs = m
        .run_typed(&inputs)
        .unwrap_or_else(|e| panic!("run {}: {e}", g.name));
    // A second run must give the same values (graph replay, reused arena).
    let again = m.run_typed(&inputs).expect("second run");
    let outs: Vec<Vec<f32>> = outs.iter().map(as_f32).collect();
    for (x, y) in outs.iter().zip(again.iter().map(as_f32)) {
        let same = x
            .iter()
            .zip(&y)
            .all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan());
        assert!(same && x.len() == y.len(), "{}: second run differs", g.name);
    }
    outs
}

/// CPU thunks vs CUDA thunks and CUDA hybrid.
fn check(g: &Graph, seed: u64, rel: f32) {
    let b = bindings(g, &mut Rng::new(seed));
    let want = run_on(&Session::new(Device::Cpu), g, &b);
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let got = run_on(&Session::new(Device::Cuda(0)).mode(mode), g, &b);
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            assert_close(x, y, rel, &format!("{} {mode:?} output {i}", g.name));
        }
    }
}

fn one(name: &str, op: Op, inputs: &[(&str, Shape, bool)]) -> Graph {
    let mut g = Graph::new(name);
    let ids: Vec<NodeId> = inputs
        .iter()
        .map(|(n, s, param)| {
            if *param {
                g.param(n, s.clone())
            } else {
                g.input(n, s.clone())
            }
        })
        .collect();
    let y = g.push(op, ids).unwrap_or_else(|e| panic!("{name}: {e}"));
    g.set_outputs(vec![y]);
    g
}

/// `DequantMatMul` with f32 activations.
fn dequant_op(scheme: rlx::ir::QuantScheme) -> Op {
    Op::DequantMatMul {
        scheme,
        activations: rlx::ir::ActivationPrecision::F32,
    }
}

fn f(dims: &[usize]) -> Shape {
    Shape::f32(dims)
}

#[test]
fn every_op_matches_the_cpu_backend() {
    if !cuda_or_skip() {
        return;
    }
    let mut cases: Vec<Graph> = Vec::new();
    // MatMul: 2-D, batched, broadcast weights, broadcast lhs, mixed broadcast.
    for (a, b) in [
        (vec![5, 7], vec![7, 3]),
        (vec![2, 5, 7], vec![7, 3]),
        (vec![2, 5, 7], vec![2, 7, 3]),
        (vec![5, 7], vec![3, 7, 4]),
        (vec![2, 1, 5, 7], vec![1, 3, 7, 4]),
        (vec![3, 16, 64], vec![64, 48]),
    ] {
        cases.push(one(
            "matmul",
            Op::MatMul,
            &[("a", f(&a), false), ("b", f(&b), true)],
        ));
    }
    for act in [None]
        .into_iter()
        .chain(Activation::ALL.iter().map(|&a| Some(a)))
    {
        cases.push(one(
            &format!("fused_mm_{act:?}"),
            Op::FusedMatMulBiasAct { activation: act },
            &[
                ("a", f(&[2, 6, 8]), false),
                ("w", f(&[8, 5]), true),
                ("bias", f(&[5]), true),
            ],
        ));
    }
    for act in Activation::ALL {
        cases.push(one(
            &format!("act_{act:?}"),
            Op::Activation(act),
            &[("x", f(&[3, 33]), false)],
        ));
    }
    for op in BinaryOp::ALL {
        for (a, b) in [
            (vec![4, 6], vec![4, 6]),
            (vec![4, 6], vec![6]),
            (vec![1], vec![4, 6]),
            (vec![2, 4, 6], vec![2, 4, 1]),
            (vec![2, 1, 6], vec![1, 4, 1]),
        ] {
            cases.push(one(
                &format!("bin_{op:?}"),
                Op::Binary(op),
                &[("a", f(&a), false), ("b", f(&b), false)],
            ));
        }
    }
    let ln = Op::LayerNorm {
        axis: -1,
        eps: 1e-5,
    };
    cases.push(one(
        "layernorm",
        ln.clone(),
        &[
            ("x", f(&[3, 4, 300]), false),
            ("g", f(&[300]), true),
            ("b", f(&[300]), true),
        ],
    ));
    // Widths for the one-warp-per-row kernel (multiples of 4 up to 512 and
    // up to 1024; 1103 rows take 4 rows per block with a partial last
    // block) and for the block-per-row kernel (30: not a multiple of 4;
    // 1100: wider than 1024).
    for dims in [[1103, 384], [3, 600], [2, 1024], [4, 30], [2, 1100]] {
        let d = dims[1];
        cases.push(one(
            &format!("layernorm_{}x{d}", dims[0]),
            ln.clone(),
            &[
                ("x", f(&dims), false),
                ("g", f(&[d]), true),
                ("b", f(&[d]), true),
            ],
        ));
    }
    for d in [40, 576, 30] {
        cases.push(one(
            &format!("rmsnorm_{d}"),
            Op::RmsNorm {
                axis: -1,
                eps: 1e-6,
            },
            &[("x", f(&[5, d]), false), ("g", f(&[d]), true)],
        ));
    }
    for (has_bias, d) in [(false, 20), (true, 20), (true, 576), (true, 30)] {
        let mut ins = vec![("x", f(&[2, 3, d]), false), ("r", f(&[2, 3, d]), false)];
        if has_bias {
            ins.push(("bias", f(&[d]), true));
        }
        let mut rms_ins = ins.clone();
        rms_ins.push(("g", f(&[d]), true));
        ins.push(("g", f(&[d]), true));
        ins.push(("beta", f(&[d]), true));
        cases.push(one(
            "res_ln",
            Op::FusedResidualLN {
                has_bias,
                eps: 1e-12,
            },
            &ins,
        ));
        cases.push(one(
            "res_rms",
            Op::FusedResidualRmsNorm {
                has_bias,
                eps: 1e-6,
            },
            &rms_ins,
        ));
    }
    cases.push(one(
        "reshape",
        Op::Reshape { shape: vec![6, 4] },
        &[("x", f(&[2, 3, 4]), false)],
    ));
    cases.push(one(
        "reshape_param",
        Op::Reshape { shape: vec![6, 4] },
        &[("x", f(&[2, 3, 4]), true)],
    ));
    cases.push(one(
        "expand",
        Op::Expand {
            shape: vec![3, 4, 5],
        },
        &[("x", f(&[4, 1]), false)],
    ));
    cases.push(one(
        "cast_f_i32",
        Op::Cast { to: DType::I32 },
        &[("x", f(&[10]), false)],
    ));
    cases.push(one(
        "cast_i64_f",
        Op::Cast { to: DType::F32 },
        &[("x", Shape::new(&[10], DType::I64), false)],
    ));
    cases.push(one(
        "cast_f_bool",
        Op::Cast { to: DType::Bool },
        &[("x", f(&[10]), false)],
    ));
    for idx in [DType::I64, DType::I32] {
        cases.push(one(
            "gather",
            Op::Gather { axis: 0 },
            &[
                ("table", f(&[11, 6]), true),
                ("ids", Shape::new(&[2, 5], idx), false),
            ],
        ));
    }
    cases.push(one(
        "narrow_view",
        Op::Narrow {
            axis: 1,
            start: 2,
            len: 3,
        },
        &[("x", f(&[1, 6, 4]), false)],
    ));
    cases.push(one(
        "narrow_copy",
        Op::Narrow {
            axis: 2,
            start: 1,
            len: 2,
        },
        &[("x", f(&[2, 3, 5]), false)],
    ));
    cases.push(one(
        "narrow_bytes",
        Op::Narrow {
            axis: 1,
            start: 1,
            len: 3,
        },
        &[("x", Shape::new(&[2, 5], DType::U8), false)],
    ));
    for axis in 0..3 {
        let mut d2 = vec![2, 3, 4];
        d2[axis] = 5;
        cases.push(one(
            "concat",
            Op::Concat { axis },
            &[
                ("a", f(&[2, 3, 4]), false),
                ("b", f(&d2), true),
                ("c", f(&[2, 3, 4]), false),
            ],
        ));
    }
    cases.push(one(
        "swiglu_packed",
        Op::FusedSwiGLU { packed: true },
        &[("x", f(&[3, 16]), false)],
    ));
    cases.push(one(
        "swiglu",
        Op::FusedSwiGLU { packed: false },
        &[("g", f(&[3, 8]), false), ("u", f(&[3, 8]), false)],
    ));
    for (style, pos) in [(RopeStyle::NeoX, vec![5]), (RopeStyle::GptJ, vec![2, 5])] {
        cases.push(one(
            "rope",
            Op::Rope {
                head_dim: 8,
                n_rot: 6,
                theta: 10000.0,
                style,
            },
            &[
                ("x", f(&[2, 5, 16]), false),
                ("pos", Shape::new(&pos, DType::I64), false),
            ],
        ));
    }
    let attn = |mask_kind, softcap, hq: usize, hkv: usize, d: usize, sq: usize, sk: usize| {
        let op = Op::Attention {
            num_heads: hq,
            head_dim: d,
            mask_kind,
            score_scale: None,
            attn_logit_softcap: softcap,
        };
        let mut ins = vec![
            ("q", f(&[2, sq, hq * d]), false),
            ("k", f(&[2, sk, hkv * d]), false),
            ("v", f(&[2, sk, hkv * d]), false),
        ];
        match mask_kind {
            MaskKind::Custom => ins.push(("mask", f(&[2, sk]), false)),
            MaskKind::Bias => ins.push(("bias", f(&[2, 1, sq, sk]), false)),
            _ => {}
        }
        one(
            &format!("attn_{mask_kind:?}_{hq}_{hkv}_{d}_{sq}_{sk}"),
            op,
            &ins,
        )
    };
    for mk in [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow(3),
        MaskKind::Custom,
        MaskKind::Bias,
    ] {
        cases.push(attn(mk, None, 4, 2, 8, 7, 7));
        cases.push(attn(mk, None, 2, 2, 32, 40, 70));
    }
    cases.push(attn(MaskKind::Causal, Some(5.0), 4, 1, 16, 3, 9));
    cases.push(attn(MaskKind::None, None, 12, 12, 32, 128, 128));
    cases.push(attn(MaskKind::Causal, None, 3, 1, 128, 20, 33));
    let mut g = Graph::new("attn_u8_mask");
    let q = g.input("q", f(&[2, 5, 8]));
    let m = g.input("m", Shape::new(&[2, 5], DType::U8));
    let op = Op::Attention {
        num_heads: 2,
        head_dim: 4,
        mask_kind: MaskKind::Custom,
        score_scale: Some(0.3),
        attn_logit_softcap: None,
    };
    let y = g.push(op, vec![q, q, q, m]).unwrap();
    g.set_outputs(vec![y]);
    cases.push(g);
    // Few query rows (decode): one block per row, keys in chunks of 256, a
    // keep-mask's extent read from device memory.
    for mk in [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow(5),
        MaskKind::Custom,
        MaskKind::Bias,
    ] {
        cases.push(attn(mk, None, 9, 3, 64, 1, 300));
        cases.push(attn(mk, None, 4, 4, 8, 3, 7));
    }
    cases.push(attn(MaskKind::Custom, Some(4.0), 2, 1, 128, 2, 513));
    cases.push(attn(MaskKind::None, None, 3, 3, 24, 1, 1));
    for (d, sk) in [(64, 300), (32, 40)] {
        let mut g = Graph::new(format!("attn_decode_keep_{d}_{sk}"));
        let q = g.input("q", f(&[2, 1, 6 * d]));
        let k = g.input("k", f(&[2, sk, 2 * d]));
        let v = g.input("v", f(&[2, sk, 2 * d]));
        let m = g.input("keep", f(&[2, sk]));
        let op = Op::Attention {
            num_heads: 6,
            head_dim: d,
            mask_kind: MaskKind::Custom,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let y = g.push(op, vec![q, k, v, m]).unwrap();
        g.set_outputs(vec![y]);
        cases.push(g);
    }
    let mut g = Graph::new("attn_decode_u8_mask");
    let q = g.input("q", f(&[2, 1, 8]));
    let kv = g.input("kv", f(&[2, 5, 8]));
    let m = g.input("m", Shape::new(&[2, 5], DType::U8));
    let op = Op::Attention {
        num_heads: 2,
        head_dim: 4,
        mask_kind: MaskKind::Custom,
        score_scale: Some(0.3),
        attn_logit_softcap: None,
    };
    let y = g.push(op, vec![q, kv, kv, m]).unwrap();
    g.set_outputs(vec![y]);
    cases.push(g);
    // DequantMatMul on packed blocks: GEMV (one row) and tiles (prefill),
    // with N and M off the tile sizes.
    for scheme in [
        rlx::ir::QuantScheme::Q4_0,
        rlx::ir::QuantScheme::Q4_1,
        rlx::ir::QuantScheme::Q8_0,
    ] {
        for (x, n) in [
            (vec![1, 1, 576], 192),
            (vec![1, 64], 70),
            (vec![1, 11, 96], 130),
            (vec![2, 37, 64], 65),
            (vec![3, 32], 1),
        ] {
            let k = *x.last().unwrap();
            let rb = scheme.row_bytes(k).unwrap();
            let mut g = Graph::new(format!("dequant_{}_{:?}_{n}", scheme.name(), x));
            let xi = g.input("x", f(&x));
            let w = g.param("w", Shape::new(&[n, rb], DType::U8));
            let y = g
                .push(dequant_op(scheme), vec![xi, w])
                .unwrap_or_else(|e| panic!("dequant: {e}"));
            g.set_outputs(vec![y]);
            cases.push(g);
        }
    }
    // CacheWrite in place into a param, as output and as an attention input
    // (the decode pattern), with i64 and i32 positions.
    for (idx, at, rows) in [
        (DType::I64, 3usize, 1usize),
        (DType::I32, 0, 4),
        (DType::I64, 6, 2),
    ] {
        let mut g = Graph::new(format!("cache_write_{idx}_{at}_{rows}"));
        let cache = g.param("cache", f(&[1, 8, 12]));
        let r = g.input("rows", f(&[1, rows, 12]));
        let p = g.constant(match idx {
            DType::I64 => Tensor::i64(&[1], vec![at as i64]),
            _ => Tensor::i32(&[1], vec![at as i32]),
        });
        let c = g
            .push(Op::CacheWrite { axis: 1 }, vec![cache, r, p])
            .unwrap();
        g.set_outputs(vec![c]);
        cases.push(g);
    }
    {
        let mut g = Graph::new("cache_write_then_attend");
        let ck = g.param("cache.k", f(&[1, 16, 8]));
        let cv = g.param("cache.v", f(&[1, 16, 8]));
        let q = g.input("q", f(&[1, 1, 16]));
        let k = g.input("k", f(&[1, 1, 8]));
        let v = g.input("v", f(&[1, 1, 8]));
        let pos = g.input("pos", Shape::new(&[1], DType::I64));
        let keep = g.input("keep", f(&[1, 16]));
        let ck = g
            .push(Op::CacheWrite { axis: 1 }, vec![ck, k, pos])
            .unwrap();
        let cv = g
            .push(Op::CacheWrite { axis: 1 }, vec![cv, v, pos])
            .unwrap();
        let op = Op::Attention {
            num_heads: 2,
            head_dim: 8,
            mask_kind: MaskKind::Custom,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let a = g.push(op, vec![q, ck, cv, keep]).unwrap();
        g.set_outputs(vec![a, ck]);
        cases.push(g);
    }
    cases.push(one(
        "softmax_last",
        Op::Softmax { axis: 2 },
        &[("x", f(&[2, 3, 50]), false)],
    ));
    cases.push(one(
        "softmax_mid",
        Op::Softmax { axis: 1 },
        &[("x", f(&[2, 7, 3]), false)],
    ));
    cases.push(one(
        "transpose",
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[("x", f(&[2, 3, 4]), false)],
    ));
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for (axes, keep) in [(vec![1], false), (vec![0, 2], true), (vec![2], true)] {
            cases.push(one(
                "reduce",
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: keep,
                },
                &[("x", f(&[3, 5, 4]), false)],
            ));
        }
        // Few outputs over many elements: one block per output. Kept
        // contiguous last axes of >= 16 with >= 2048 outputs: the coalesced
        // column kernel (one and two reduced axes, reduced lengths split
        // over 1..8 warps); fewer outputs: the warp kernel.
        for (dims, axes) in [
            (vec![3, 700], vec![1]),
            (vec![2, 40, 9], vec![0, 1]),
            (vec![4, 100, 48], vec![1]),
            (vec![3, 5, 40], vec![0, 1]),
            (vec![2, 30, 1100], vec![1]),
            (vec![3, 5, 2048], vec![0, 1]),
            (vec![2, 300, 1024], vec![1]),
            (vec![2, 3, 2050], vec![1]),
        ] {
            cases.push(one(
                "reduce_block",
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: false,
                },
                &[("x", f(&dims), false)],
            ));
        }
    }
    // A Reduce reading a Binary (fused into one kernel in hybrid): masked
    // sums over the sequence (the mask broadcast), a sum of squares, a max
    // of differences, in the warp and the block kernels.
    for (op, rop, hd, md, axes) in [
        (
            BinaryOp::Mul,
            ReduceOp::Sum,
            vec![2, 9, 8],
            vec![2, 9, 1],
            vec![1],
        ),
        (
            BinaryOp::Mul,
            ReduceOp::Sum,
            vec![2, 37, 384],
            vec![2, 37, 1],
            vec![1],
        ),
        (
            BinaryOp::Mul,
            ReduceOp::Sum,
            vec![6, 37, 384],
            vec![6, 37, 1],
            vec![1],
        ),
        (
            BinaryOp::Mul,
            ReduceOp::Mean,
            vec![3, 300],
            vec![300],
            vec![1],
        ),
        (
            BinaryOp::Sub,
            ReduceOp::Max,
            vec![2, 5, 70],
            vec![5, 1],
            vec![0, 2],
        ),
        (
            BinaryOp::Add,
            ReduceOp::Min,
            vec![4, 6],
            vec![4, 6],
            vec![0],
        ),
    ] {
        let mut g = Graph::new(format!("reduce_of_{op:?}"));
        let h = g.input("h", f(&hd));
        let m = g.input("m", f(&md));
        let b = g.push(Op::Binary(op), vec![h, m]).unwrap();
        let r = Op::Reduce {
            op: rop,
            axes,
            keep_dims: false,
        };
        let y = g.push(r, vec![b]).unwrap();
        g.set_outputs(vec![y]);
        cases.push(g);
    }
    // Masked mean pooling with and without its L2 normalization (one
    // kernel in hybrid): odd widths, a width over 1024 (two column passes),
    // MiniLM's, and a count that can fall under the floor (random values).
    for (b, s, h, normalize, count) in [
        (3, 7, 50, true, "keep_mask"),
        (2, 128, 384, true, "keep_mask"),
        (2, 5, 1100, false, "keep_mask"),
        (3, 9, 96, true, "count"),
    ] {
        let mut g = Graph::new(format!("mean_pool_{b}x{s}x{h}_{normalize}_{count}"));
        let x = g.input("x", f(&[b, s, h]));
        let m = g.input(count, f(&[b, s]));
        let y = rlx::models::bert::mean_pool(&mut g, x, m, normalize).unwrap();
        g.set_outputs(vec![y]);
        cases.push(g);
    }
    let n = cases.len();
    for (i, g) in cases.iter().enumerate() {
        check(g, 1000 + i as u64, 2e-5);
    }
    println!("{n} single-op graphs match the CPU backend in thunks and hybrid");
}

/// A random DAG over `[b, s, d]` activations.
fn random_graph(seed: u64, n_ops: usize) -> Graph {
    let mut r = Rng::new(seed);
    let (b, s) = (1 + r.below(2), 1 + r.below(9));
    let d = [4usize, 6, 8, 12][r.below(4)];
    let mut g = Graph::new(format!("random{seed}"));
    let x = g.input("x", f(&[b, s, d]));
    let mut vals: Vec<NodeId> = vec![x];
    for i in 0..n_ops {
        let a = vals[r.below(vals.len())];
        let c = vals[r.below(vals.len())];
        let ad = g.node(a).shape.dims.clone();
        let w = *ad.last().unwrap();
        let out = match r.below(11) {
            0 => {
                let n = [4usize, 6, 8, 12][r.below(4)];
                let wp = g.param(&format!("w{i}"), f(&[w, n]));
                g.push(Op::MatMul, vec![a, wp])
            }
            1 => {
                let act = [
                    Activation::Gelu,
                    Activation::Tanh,
                    Activation::Silu,
                    Activation::Relu,
                ][r.below(4)];
                g.push(Op::Activation(act), vec![a])
            }
            2 if g.node(c).shape == g.node(a).shape => {
                let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max][r.below(4)];
                g.push(Op::Binary(op), vec![a, c])
            }
            3 => {
                let bias = g.param(&format!("b{i}"), f(&[w]));
                g.push(Op::Binary(BinaryOp::Add), vec![a, bias])
            }
            4 => {
                let gm = g.param(&format!("g{i}"), f(&[w]));
                let bt = g.param(&format!("be{i}"), f(&[w]));
                g.push(
                    Op::LayerNorm {
                        axis: -1,
                        eps: 1e-5,
                    },
                    vec![a, gm, bt],
                )
            }
            5 if w >= 2 => {
                let len = 1 + r.below(w - 1);
                g.push(
                    Op::Narrow {
                        axis: ad.len() - 1,
                        start: r.below(w - len + 1),
                        len,
                    },
                    vec![a],
                )
            }
            6 if w.is_multiple_of(2) && ad.len() == 3 => {
                let heads = if w.is_multiple_of(4) { 2 } else { 1 };
                let mk = [MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow(2)][r.below(3)];
                let op = Op::Attention {
                    num_heads: heads,
                    head_dim: w / heads,
                    mask_kind: mk,
                    score_scale: None,
                    attn_logit_softcap: None,
                };
                g.push(op, vec![a, a, a])
            }
            7 => g.push(Op::Softmax { axis: ad.len() - 1 }, vec![a]),
            8 => {
                let gm = g.param(&format!("r{i}"), f(&[w]));
                g.push(
                    Op::RmsNorm {
                        axis: -1,
                        eps: 1e-5,
                    },
                    vec![a, gm],
                )
            }
            9 if g.node(c).shape == g.node(a).shape && ad.len() == 3 => {
                g.push(Op::Concat { axis: 1 }, vec![a, c])
            }
            _ => {
                let rows: usize = ad[..ad.len() - 1].iter().product();
                g.push(
                    Op::Reshape {
                        shape: vec![rows, w],
                    },
                    vec![a],
                )
            }
        };
        if let Ok(id) = out {
            vals.push(id);
        }
    }
    let mut outs = vec![*vals.last().unwrap()];
    if vals.len() > 3 {
        outs.push(vals[vals.len() / 2]);
    }
    g.set_outputs(outs);
    g
}

/// "Split after every k-th op".
fn every_kth(k: usize) -> SplitPolicy {
    let n = Arc::new(AtomicUsize::new(0));
    SplitPolicy::new(move |_: &Op| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        !(i + 1).is_multiple_of(k)
    })
}

#[test]
fn random_graphs_match_the_cpu_backend() {
    if !cuda_or_skip() {
        return;
    }
    let mut checked = 0;
    for seed in 0..60u64 {
        let g = random_graph(seed, 3 + (seed as usize % 12));
        let b = bindings(&g, &mut Rng::new(seed + 7));
        let want = run_on(&Session::new(Device::Cpu), &g, &b);
        let sessions = [
            Session::new(Device::Cuda(0)),
            Session::new(Device::Cuda(0)).mode(ExecMode::Hybrid),
            Session::new(Device::Cuda(0))
                .mode(ExecMode::Hybrid)
                .policy(every_kth(2)),
        ];
        for (k, s) in sessions.iter().enumerate() {
            let got = run_on(s, &g, &b);
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert_close(x, y, 1e-4, &format!("seed {seed} session {k} output {i}"));
            }
        }
        checked += 1;
    }
    println!("{checked} random graphs match in thunks, hybrid and hybrid-every-2nd");
}

#[test]
fn hybrid_is_fewer_dispatches_and_errors_are_typed() {
    if !cuda_or_skip() {
        return;
    }
    // A 3-op chain: one CUDA graph in hybrid mode.
    let mut g = Graph::new("chain");
    let x = g.input("x", f(&[4, 8]));
    let w = g.param("w", f(&[8, 8]));
    let h = g.push(Op::MatMul, vec![x, w]).unwrap();
    let h = g.push(Op::Activation(Activation::Gelu), vec![h]).unwrap();
    let ids = g.input("ids", Shape::new(&[3], DType::I64));
    let t = g.push(Op::Gather { axis: 0 }, vec![h, ids]).unwrap();
    g.set_outputs(vec![t]);
    let m = Session::new(Device::Cuda(0))
        .mode(ExecMode::Hybrid)
        .compile(g.clone())
        .unwrap();
    assert_eq!(m.plan_stats().dispatches, 1);
    assert_eq!(m.plan_stats().compiled_segments, 1);
    let mut m = Session::new(Device::Cuda(0)).compile(g.clone()).unwrap();
    assert_eq!(m.plan_stats().dispatches, 3);
    // An out-of-range id is a typed error naming the Gather node.
    m.set_param("w", &[0.5; 64]).unwrap();
    let xs = vec![1.0f32; 32];
    let bad = [7i64, 0, 1];
    let err = m
        .run_typed(&[
            ("x", rlx::TensorRef::F32(&xs)),
            ("ids", rlx::TensorRef::I64(&bad)),
        ])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Gather") && err.contains("out of range"),
        "{err}"
    );
    // The model still runs after the error.
    let good = [3i64, 0, 1];
    let out = m
        .run_typed(&[
            ("x", rlx::TensorRef::F32(&xs)),
            ("ids", rlx::TensorRef::I64(&good)),
        ])
        .unwrap();
    assert_eq!(out[0].shape.dims, vec![3, 8]);
    // An op with no CUDA kernel is a typed error at compile time.
    let mut g = Graph::new("q5-free");
    let xq = g.input("x", f(&[1, 32]));
    let wq = g.param("w", Shape::new(&[4, 22], DType::U8));
    let y = g
        .push(dequant_op(rlx::ir::QuantScheme::Q5_0), vec![xq, wq])
        .unwrap();
    g.set_outputs(vec![y]);
    let err = Session::new(Device::Cuda(0))
        .compile(g)
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        err.contains("DequantMatMul") && err.contains("no CUDA kernel"),
        "{err}"
    );
}

fn model_dir() -> Option<PathBuf> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

fn reference_json() -> serde_json::Value {
    let rel = "crates/rlx-models/tests/data/minilm_embeddings.json";
    let here = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rlx-models/tests/data/minilm_embeddings.json"
    );
    let text = std::fs::read_to_string(here)
        .or_else(|_| std::fs::read_to_string(rel))
        .expect("reference embeddings file");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn minilm_embeddings_match_pytorch_on_cuda() {
    if !cuda_or_skip() {
        return;
    }
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched (set RLX_MODELS_DIR)");
        return;
    };
    use rlx::models::bert::{build_graph, BertOutputs};
    use rlx::models::{EmbedOptions, SentenceEmbedder};
    use rlx::runtime::Executable;
    let v = reference_json();
    let texts: Vec<String> = v["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let want: Vec<Vec<f32>> = v["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let opts = EmbedOptions {
        hybrid: false,
        threads: None,
        optimize: false,
        ..Default::default()
    };
    let mut emb = SentenceEmbedder::load_with(&dir, opts).unwrap();
    let cfg = emb.config().clone();
    let cpu = emb.model_for(1, 1, false).unwrap();
    let weights: Vec<(String, Tensor)> = cfg
        .params()
        .into_iter()
        .map(|(n, _, _)| {
            let t = cpu.take_param(&n).expect("weight");
            (n, t)
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
    let opt = rlx::opt::OptOptions {
        target: Arc::new(|_: &Op| true),
        ..Default::default()
    };
    let mut worst = 0f32;
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        // The whole batch padded, then each sentence alone.
        let mut groups: Vec<Vec<usize>> = vec![(0..texts.len()).collect()];
        groups.extend((0..texts.len()).map(|i| vec![i]));
        for group in groups {
            let batch_texts: Vec<&str> = group.iter().map(|&i| refs[i]).collect();
            let batch = emb.tokenizer().encode_batch(&batch_texts).unwrap();
            let g = build_graph(
                &cfg,
                batch.batch,
                batch.seq,
                BertOutputs {
                    pooled: true,
                    tokens: false,
                },
            )
            .unwrap();
            let (g, _) = rlx::opt::optimize(&g, &opt).unwrap();
            let mut m = Session::new(Device::Cuda(0)).mode(mode).compile(g).unwrap();
            for (n, t) in &weights {
                m.set_param(n, t.as_f32().unwrap()).unwrap();
            }
            let out = m
                .run_typed(&[
                    ("input_ids", rlx::TensorRef::I64(&batch.ids)),
                    ("token_type_ids", rlx::TensorRef::I64(&batch.token_type_ids)),
                    ("attention_mask", rlx::TensorRef::F32(&batch.attention_mask)),
                ])
                .unwrap();
            let pooled = out[0].as_f32().unwrap();
            let h = cfg.hidden_size;
            for (row, &i) in group.iter().enumerate() {
                let got = &pooled[row * h..(row + 1) * h];
                let max_abs = got
                    .iter()
                    .zip(&want[i])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let dot: f32 = got.iter().zip(&want[i]).map(|(a, b)| a * b).sum();
                let na = got.iter().map(|a| a * a).sum::<f32>().sqrt();
                let nb = want[i].iter().map(|a| a * a).sum::<f32>().sqrt();
                let cos = dot / (na * nb);
                assert!(
                    max_abs <= 1e-4,
                    "{mode:?} batch {} sentence {i}: max abs {max_abs:e}",
                    group.len()
                );
                assert!(
                    cos >= 0.99999,
                    "{mode:?} batch {} sentence {i}: cosine {cos}",
                    group.len()
                );
                worst = worst.max(max_abs);
            }
            if group.len() > 1 && mode == ExecMode::Hybrid {
                println!(
                    "hybrid MiniLM {}x{}: {:?}",
                    batch.batch,
                    batch.seq,
                    m.plan_stats()
                );
            }
        }
    }
    println!("MiniLM on CUDA: 12 sentences x (batched, single) x (thunks, hybrid) within {worst:e} of PyTorch");
}

#[test]
fn run_compiled_helper_works_on_cuda() {
    // Exercises the shared helper on the CUDA session (a param-only Concat
    // runs once on the host and is uploaded).
    if !cuda_or_skip() {
        return;
    }
    let mut g = Graph::new("qkv");
    let x = g.input("x", f(&[3, 4]));
    let wa = g.param("wa", f(&[4, 2]));
    let wb = g.param("wb", f(&[4, 3]));
    let w = g.push(Op::Concat { axis: 1 }, vec![wa, wb]).unwrap();
    let y = g.push(Op::MatMul, vec![x, w]).unwrap();
    g.set_outputs(vec![y, w]);
    let b = bindings(&g, &mut Rng::new(5));
    let want = common::run_session(&Session::new(Device::Cpu), &g, &b);
    let mut m = Session::new(Device::Cuda(0))
        .mode(ExecMode::Hybrid)
        .compile(g.clone())
        .unwrap();
    let got = run_compiled(&mut m, &g, &b);
    for (x, y) in got.iter().zip(&want) {
        assert_close(x, y, 1e-5, "qkv");
    }
}

/// A decode step's rope and cache writes (one launch in hybrid mode: the
/// Rope does both writes) match the CPU backend in thunks and hybrid; a
/// position past the cache is a typed error naming the CacheWrite in both
/// modes, and the model still runs afterwards.
#[test]
fn decode_rope_with_cache_writes_matches_and_reports_bad_positions() {
    let mut g = Graph::new("rope_cache");
    let qkv = g.input("qkv", f(&[1, 1, 32]));
    let pos = g.input("pos", Shape::new(&[1], DType::I64));
    let keep = g.input("keep", f(&[1, 8]));
    let narrow = |g: &mut Graph, x: NodeId, start: usize, len: usize| {
        g.push(
            Op::Narrow {
                axis: 2,
                start,
                len,
            },
            vec![x],
        )
        .unwrap()
    };
    let v = narrow(&mut g, qkv, 24, 8);
    let qk = narrow(&mut g, qkv, 0, 24);
    let rope = Op::Rope {
        head_dim: 8,
        n_rot: 8,
        theta: 10000.0,
        style: RopeStyle::GptJ,
    };
    let r = g.push(rope, vec![qk, pos]).unwrap();
    let q = narrow(&mut g, r, 0, 16);
    let k = narrow(&mut g, r, 16, 8);
    let ck = g.param("cache.k", f(&[1, 8, 8]));
    let cv = g.param("cache.v", f(&[1, 8, 8]));
    let wk = g
        .push(Op::CacheWrite { axis: 1 }, vec![ck, k, pos])
        .unwrap();
    let wv = g
        .push(Op::CacheWrite { axis: 1 }, vec![cv, v, pos])
        .unwrap();
    let op = Op::Attention {
        num_heads: 2,
        head_dim: 8,
        mask_kind: MaskKind::Custom,
        score_scale: None,
        attn_logit_softcap: None,
    };
    let a = g.push(op, vec![q, wk, wv, keep]).unwrap();
    g.set_outputs(vec![a, r]);
    g.verify().unwrap();
    // The plan needs no device.
    let opts = rlx::cuda::CudaOptions {
        hybrid: true,
        ..Default::default()
    };
    let plan = rlx::cuda::plan(g.clone(), &opts).unwrap();
    assert_eq!((plan.fused_ropes, plan.rope_writes), (1, 2), "{plan:?}");
    if !cuda_or_skip() {
        return;
    }
    check(&g, 77, 2e-5);
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let mut m = Session::new(Device::Cuda(0))
            .mode(mode)
            .compile(g.clone())
            .unwrap();
        m.set_param("cache.k", &[0.0; 64]).unwrap();
        m.set_param("cache.v", &[0.0; 64]).unwrap();
        let (x, mask) = (vec![0.5f32; 32], vec![1.0f32; 8]);
        let run = |m: &mut rlx::CompiledModel, p: i64| {
            m.run_typed(&[
                ("qkv", rlx::TensorRef::F32(&x)),
                ("pos", rlx::TensorRef::I64(&[p])),
                ("keep", rlx::TensorRef::F32(&mask)),
            ])
            .map_err(|e| e.to_string())
        };
        let err = run(&mut m, 8).unwrap_err();
        assert!(
            err.contains(&wk.to_string()) || err.contains(&wv.to_string()),
            "{mode:?}: {err}"
        );
        assert!(
            err.contains("CacheWrite") && err.contains("does not fit"),
            "{mode:?}: {err}"
        );
        assert!(run(&mut m, 7).is_ok(), "{mode:?}: runs after the error");
    }
}
