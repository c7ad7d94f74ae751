//! CUDA backend parity (built only with `--features cuda`).
//!
//! (Every op, one small graph each, in f32, bf16 and f16 against the
//! reference interpreter: `tests/conformance.rs`.)
//! - random DAGs of random ops, thunks and hybrid (with a policy that
//!   splits after every second op), against the CPU backend;
//! - all-MiniLM-L6-v2 embeddings against the PyTorch reference
//!   (crates/rlx-models/tests/data/minilm_embeddings.json) within 1e-4.
//!
//! Where no CUDA driver or device is present every test prints
//! "skipped: no CUDA device" and passes (CI has no GPU).
#![cfg(feature = "cuda")]

mod common;
use common::{
    assert_close, cuda_or_skip, every_kth, minilm_dir, minilm_reference, random_bindings,
    random_graph, run_compiled, tref, Rng,
};
use rlx::ir::op::{Activation, MaskKind, RopeStyle};
use rlx::ir::{DType, Graph, NodeId, Op, Shape, Tensor};
use rlx::{Device, ExecMode, Session};
use std::collections::HashMap;
use std::sync::Arc;

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
    let b = random_bindings(g, &mut Rng::new(seed), 1.0);
    let want = run_on(&Session::new(Device::Cpu), g, &b);
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let got = run_on(&Session::new(Device::Cuda(0)).mode(mode), g, &b);
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            assert_close(x, y, rel, &format!("{} {mode:?} output {i}", g.name));
        }
    }
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
fn random_graphs_match_the_cpu_backend() {
    if !cuda_or_skip() {
        return;
    }
    let mut checked = 0;
    for seed in 0..60u64 {
        let g = random_graph(seed, 3 + (seed as usize % 12));
        let b = random_bindings(&g, &mut Rng::new(seed + 7), 1.0);
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

#[test]
fn minilm_embeddings_match_pytorch_on_cuda() {
    if !cuda_or_skip() {
        return;
    }
    let Some(dir) = minilm_dir() else {
        println!("skipped: model not fetched (set RLX_MODELS_DIR)");
        return;
    };
    use rlx::models::bert::{build_graph, BertOutputs};
    use rlx::models::{EmbedOptions, SentenceEmbedder};
    use rlx::runtime::Executable;
    let (texts, want) = minilm_reference();
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
    let b = random_bindings(&g, &mut Rng::new(5), 1.0);
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
