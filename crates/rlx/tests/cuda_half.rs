//! CUDA precisions and shape buckets (built only with `--features cuda`).
//!
//! - all-MiniLM-L6-v2 embeddings in bf16, f16 and tf32 against the PyTorch
//!   reference (crates/rlx-models/tests/data/minilm_embeddings.json): a
//!   cosine of at least 0.999 for every sentence, thunks and hybrid; the
//!   max-abs error is printed;
//! - a shape-bucket change: one CUDA model run at 1x128, re-targeted to
//!   2x64 and back to 1x128 (graphs captured again each time), every run
//!   against the CPU backend;
//! - `SentenceEmbedder` on CUDA (f32 and bf16): three batches of other
//!   shapes in a row, against the PyTorch reference;
//! - tensor-core attention on 16-bit q/k/v (views of one packed tensor,
//!   as after a fused QKV matmul) at lengths below, at and across its
//!   staged key chunk, with GQA and keep-masks, against the CPU backend;
//! - LayerNorm / RMSNorm (with residual and bias) on 16-bit rows of widths
//!   for the one-warp-per-row kernel and for the general one, against the
//!   CPU backend;
//! - 16-bit embedding gathers (a warp per row, and the general kernel for
//!   rows not a multiple of 4) against the CPU, and an out-of-range id as
//!   a typed error naming the Gather;
//! - the sentence-embedding tail (masked mean pooling, L2 normalization)
//!   as one kernel in MiniLM's plan, and its values in every precision
//!   against the CPU backend (a row of one token, a row of none);
//! - small 16-bit matmuls (biases, activations, few and odd row counts)
//!   against the CPU backend, on cuBLASLt and on rlx's opt-in `gemm_pf`
//!   (`small_matmul_kernel`);
//! - a small 16-bit matmul fused with the LayerNorm reading it (opt-in
//!   `fuse_matmul_norm`: one `gemm_ln` kernel in hybrid segments; off,
//!   the plan has no such fusion): row counts on and off the
//!   16-row tile, several widths, the matmul as the norm's x or residual,
//!   with and without biases, against the CPU backend and CUDA thunks.
//!
//! Where no CUDA driver or device is present every test prints
//! "skipped: no CUDA device" and passes (CI has no GPU).
#![cfg(feature = "cuda")]

mod common;
use common::{assert_close, cuda_or_skip, minilm_dir, minilm_reference};
use rlx::cuda::{CudaModel, CudaOptions};
use rlx::ir::{Graph, Op, Tensor};
use rlx::models::bert::{build_graph, synthetic_params, BertConfig, BertOutputs};
use rlx::runtime::{Executable, TensorRef};
use rlx::{Device, ExecMode, Precision, Session};
use std::sync::Arc;

fn optimized(g: &Graph) -> Graph {
    let opt = rlx::opt::OptOptions {
        target: Arc::new(|_: &Op| true),
        ..Default::default()
    };
    rlx::opt::optimize(g, &opt).unwrap().0
}

/// The largest elementwise |a - b|.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

#[test]
fn minilm_half_precisions_match_pytorch_on_cuda() {
    if !cuda_or_skip() {
        return;
    }
    let Some(dir) = minilm_dir() else {
        println!("skipped: model not fetched (set RLX_MODELS_DIR)");
        return;
    };
    use rlx::models::{EmbedOptions, SentenceEmbedder};
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
    let mut summary = Vec::new();
    for precision in [Precision::Bf16, Precision::F16, Precision::Tf32] {
        for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
            let (mut worst_abs, mut worst_cos) = (0f32, 1f32);
            // The whole batch padded, then two sentences alone.
            let groups: Vec<Vec<usize>> = vec![(0..texts.len()).collect(), vec![0], vec![5]];
            for group in groups {
                let batch_texts: Vec<&str> = group.iter().map(|&i| refs[i]).collect();
                let batch = emb.tokenizer().encode_batch(&batch_texts).unwrap();
                let outs = BertOutputs {
                    pooled: true,
                    tokens: false,
                };
                let g = optimized(&build_graph(&cfg, batch.batch, batch.seq, outs).unwrap());
                let mut m = Session::new(Device::Cuda(0))
                    .mode(mode)
                    .precision(precision)
                    .compile(g)
                    .unwrap();
                for (n, t) in &weights {
                    m.set_param(n, t.as_f32().unwrap()).unwrap();
                }
                let out = m
                    .run_typed(&[
                        ("input_ids", TensorRef::I64(&batch.ids)),
                        ("token_type_ids", TensorRef::I64(&batch.token_type_ids)),
                        ("attention_mask", TensorRef::F32(&batch.attention_mask)),
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
                    let cos = cosine(got, &want[i]);
                    assert!(
                        cos >= 0.999,
                        "{precision} {mode:?} batch {} sentence {i}: cosine {cos} (max abs {max_abs:e})",
                        group.len()
                    );
                    worst_abs = worst_abs.max(max_abs);
                    worst_cos = worst_cos.min(cos);
                }
                if group.len() > 1 && mode == ExecMode::Hybrid {
                    assert_eq!(m.plan_stats().dispatches, 1, "{precision}: one CUDA graph");
                }
            }
            summary.push(format!(
                "{precision} {mode:?}: min cosine {worst_cos:.6}, max abs {worst_abs:.3e}"
            ));
        }
    }
    for line in &summary {
        println!("MiniLM on CUDA vs PyTorch fp32, 12 sentences batched + 2 alone: {line}");
    }
}

/// Token ids, token types and a keep-mask for a `b x s` BERT batch (row
/// `r` keeps its first `s - 5 r` tokens).
fn bert_inputs(b: usize, s: usize, seed: u64) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    let mut state = seed | 1;
    let ids = (0..b * s)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 30000) as i64
        })
        .collect();
    let tt = (0..b * s).map(|i| ((i % s) >= s / 2) as i64).collect();
    let mask = (0..b * s)
        .map(|i| ((i % s) < s - 5 * (i / s)) as u8 as f32)
        .collect();
    (ids, tt, mask)
}

#[test]
fn shape_bucket_change_recaptures_and_matches_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    let cfg = BertConfig::minilm_l6();
    let params = synthetic_params(&cfg, 7);
    let outs = BertOutputs {
        pooled: true,
        tokens: true,
    };
    let graph = |b: usize, s: usize| optimized(&build_graph(&cfg, b, s, outs).unwrap());
    for (precision, tol) in [(Precision::F32, 1e-4f32), (Precision::Bf16, 0.0)] {
        let opts = CudaOptions {
            hybrid: true,
            precision,
            ..CudaOptions::default()
        };
        let mut gpu = CudaModel::compile(graph(1, 128), &opts).unwrap();
        for (name, v) in &params {
            gpu.set_param(name, TensorRef::F32(v)).unwrap();
        }
        let mut first: Option<Vec<f32>> = None;
        for (step, (b, s)) in [(1usize, 128usize), (2, 64), (1, 128)]
            .into_iter()
            .enumerate()
        {
            if step > 0 {
                gpu.set_graph(graph(b, s)).unwrap();
            }
            let (ids, tt, mask) = bert_inputs(b, s, 11);
            let inputs = [
                ("input_ids", TensorRef::I64(&ids)),
                ("token_type_ids", TensorRef::I64(&tt)),
                ("attention_mask", TensorRef::F32(&mask)),
            ];
            let got = gpu.run(&inputs).unwrap();
            let mut cpu = Session::new(Device::Cpu).compile(graph(b, s)).unwrap();
            for (name, v) in &params {
                cpu.set_param(name, v).unwrap();
            }
            let want = cpu.run_typed(&inputs).unwrap();
            assert_eq!(got[0].shape.dims, vec![b, cfg.hidden_size]);
            assert_eq!(got[1].shape.dims, vec![b, s, cfg.hidden_size]);
            let what = format!("{precision} bucket {b}x{s} (step {step})");
            let pooled = got[0].as_f32().unwrap();
            let pooled_cpu = want[0].as_f32().unwrap();
            if precision == Precision::F32 {
                assert_close(pooled, pooled_cpu, tol, &what);
                assert_close(
                    got[1].as_f32().unwrap(),
                    want[1].as_f32().unwrap(),
                    tol,
                    &format!("{what} tokens"),
                );
            } else {
                let h = cfg.hidden_size;
                for r in 0..b {
                    let c = cosine(&pooled[r * h..(r + 1) * h], &pooled_cpu[r * h..(r + 1) * h]);
                    assert!(c >= 0.999, "{what} row {r}: cosine {c}");
                }
            }
            // Back at the first bucket: the same values (gemm algorithms are
            // timed at each capture, so the bits may differ).
            if b == 1 {
                match &first {
                    None => first = Some(pooled.to_vec()),
                    Some(f) if precision == Precision::F32 => {
                        assert_close(pooled, f, 1e-5, &format!("{what} vs step 0"))
                    }
                    Some(f) => {
                        let c = cosine(pooled, f);
                        assert!(c >= 0.9999, "{what}: cosine {c} to step 0");
                    }
                }
            }
            println!(
                "{what}: matches the CPU backend, {:?}",
                gpu.report().dispatches
            );
        }
    }
}

#[test]
fn sentence_embedder_on_cuda_changes_buckets_and_matches_pytorch() {
    if !cuda_or_skip() {
        return;
    }
    let Some(dir) = minilm_dir() else {
        println!("skipped: model not fetched (set RLX_MODELS_DIR)");
        return;
    };
    use rlx::models::{EmbedDevice, EmbedOptions, SentenceEmbedder};
    let (texts, want) = minilm_reference();
    for (precision, min_cos, max_abs) in [
        (Precision::F32, 0.99999f32, 1e-4f32),
        (Precision::Bf16, 0.999, 1.0),
    ] {
        let device = EmbedDevice::Cuda(CudaOptions {
            hybrid: true,
            precision,
            ..CudaOptions::default()
        });
        let mut emb = SentenceEmbedder::load_on(&dir, EmbedOptions::default(), device).unwrap();
        // Chunks of 5, 5 and 2 sentences: three shape buckets in a row.
        let mut got = Vec::new();
        for chunk in texts.chunks(5) {
            let refs: Vec<&str> = chunk.iter().map(|s| s.as_str()).collect();
            got.extend(emb.embed(&refs).unwrap());
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let abs = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let c = cosine(g, w);
            assert!(
                c >= min_cos && abs <= max_abs,
                "{precision} sentence {i}: cosine {c}, max abs {abs}"
            );
        }
        println!("SentenceEmbedder on CUDA {precision}: 12 sentences in 3 buckets match PyTorch");
    }
}

#[test]
fn elementwise_chains_in_a_segment_run_as_one_generated_kernel() {
    if !cuda_or_skip() {
        return;
    }
    use rlx::ir::op::{Activation, BinaryOp};
    use rlx::ir::Shape;
    // y = x / max(sqrt(sum(x * x)), eps), plus exp(y): the Sqrt -> Max ->
    // Div chain (a [1, 1] value broadcast into [1, 96]) is one kernel inside
    // the CUDA graph, and the sum reads x * x without materializing it.
    let mut g = Graph::new("l2norm");
    let x = g.input("x", Shape::f32(&[1, 96]));
    let eps = g.input("eps", Shape::f32(&[1]));
    let sq = g.push(Op::Binary(BinaryOp::Mul), vec![x, x]).unwrap();
    let s = g
        .push(
            Op::Reduce {
                op: rlx::ir::op::ReduceOp::Sum,
                axes: vec![1],
                keep_dims: true,
            },
            vec![sq],
        )
        .unwrap();
    let r = g.push(Op::Activation(Activation::Sqrt), vec![s]).unwrap();
    let m = g.push(Op::Binary(BinaryOp::Max), vec![r, eps]).unwrap();
    let d = g.push(Op::Binary(BinaryOp::Div), vec![x, m]).unwrap();
    let e = g.push(Op::Activation(Activation::Exp), vec![d]).unwrap();
    g.set_outputs(vec![e, d]);
    let xs: Vec<f32> = (0..96)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let inputs = [("x", TensorRef::F32(&xs)), ("eps", TensorRef::F32(&[1e-6]))];
    let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
    let want = cpu.run_typed(&inputs).unwrap();
    let opts = CudaOptions {
        hybrid: true,
        ..CudaOptions::default()
    };
    let plan = rlx::cuda::plan(g.clone(), &opts).unwrap();
    assert_eq!((plan.fused_chains, plan.fused_nodes), (1, 3), "{plan:?}");
    assert_eq!(plan.fused_reduces, 1, "{plan:?}");
    let mut m = CudaModel::compile(g, &opts).unwrap();
    let got = m.run(&inputs).unwrap();
    // The Reduce with its Mul, the fused chain, Exp: 3 kernels for 6 ops.
    assert_eq!(m.device_ops(), Some(3));
    for (a, b) in got.iter().zip(&want) {
        assert_close(
            a.as_f32().unwrap(),
            b.as_f32().unwrap(),
            1e-5,
            "fused chain",
        );
    }
}

#[test]
fn the_pooling_tail_is_one_kernel_and_matches_the_cpu() {
    // The plan needs no device: MiniLM's optimized graph at 1x128 and
    // 32x128 pools in one kernel (no reduction or chain left over).
    let cfg = BertConfig::minilm_l6();
    for b in [1, 32] {
        let outs = BertOutputs {
            pooled: true,
            tokens: false,
        };
        let g = optimized(&build_graph(&cfg, b, 128, outs).unwrap());
        for precision in [Precision::F32, Precision::Bf16] {
            let opts = CudaOptions {
                hybrid: true,
                precision,
                ..CudaOptions::default()
            };
            let plan = rlx::cuda::plan(g.clone(), &opts).unwrap();
            let fused = (plan.fused_pools, plan.fused_reduces, plan.fused_chains);
            assert_eq!(fused, (1, 0, 0), "{b}x128 {precision}: {plan:?}");
        }
    }
    if !cuda_or_skip() {
        return;
    }
    use rlx::ir::Shape;
    // The tail alone over token states of MiniLM's width, a row with one
    // kept token and a row with none (the count floor), in every precision.
    let (b, s, h) = (3, 40, 384);
    let mut g = Graph::new("pool");
    let x = g.input("x", Shape::f32(&[b, s, h]));
    let mask = g.input("mask", Shape::f32(&[b, s]));
    let y = rlx::models::bert::mean_pool(&mut g, x, mask, true).unwrap();
    g.set_outputs(vec![y]);
    let xs: Vec<f32> = (0..b * s * h)
        .map(|i| ((i * 7919) % 211) as f32 / 100.0 - 1.0)
        .collect();
    let ms: Vec<f32> = (0..b * s)
        .map(|i| match i / s {
            0 => (i % 7 != 3) as u8 as f32,
            1 => (i % s == 5) as u8 as f32,
            _ => 0.0,
        })
        .collect();
    let inputs = [("x", TensorRef::F32(&xs)), ("mask", TensorRef::F32(&ms))];
    let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
    let want = cpu.run_typed(&inputs).unwrap();
    let want = want[0].as_f32().unwrap();
    assert!(
        want[2 * h..].iter().all(|&v| v == 0.0),
        "an empty row pools to 0"
    );
    for (precision, tol) in [
        (Precision::F32, 1e-5f32),
        (Precision::Bf16, 1e-2),
        (Precision::F16, 2e-3),
    ] {
        let opts = CudaOptions {
            hybrid: true,
            precision,
            ..CudaOptions::default()
        };
        let mut m = CudaModel::compile(g.clone(), &opts).unwrap();
        let got = m.run(&inputs).unwrap();
        assert_eq!(m.device_ops(), Some(1), "{precision}: one kernel");
        let got = got[0].as_f32().unwrap();
        assert_close(got, want, tol, &format!("pooling {precision}"));
    }
}

/// Self-attention over q, k and v narrowed from one packed `[b, s, w]`
/// tensor (stored in 16 bits because an `Add` makes it), optionally with a
/// keep-mask input `m` of `mask_dt`.
fn packed_attention(
    b: usize,
    s: usize,
    heads: (usize, usize),
    d: usize,
    pad: usize,
    mask_dt: Option<rlx::ir::DType>,
) -> Graph {
    use rlx::ir::op::{BinaryOp, MaskKind};
    use rlx::ir::Shape;
    let (hq, hkv) = heads;
    let w = (hq + 2 * hkv) * d + pad;
    let mut g = Graph::new(format!("attn_tc_{b}_{s}_{hq}_{hkv}_{d}_{pad}_{mask_dt:?}"));
    let x = g.input("x", Shape::f32(&[b, s, w]));
    let x2 = g.push(Op::Binary(BinaryOp::Add), vec![x, x]).unwrap();
    let narrow = |g: &mut Graph, start: usize, len: usize| {
        g.push(
            Op::Narrow {
                axis: 2,
                start,
                len,
            },
            vec![x2],
        )
        .unwrap()
    };
    let q = narrow(&mut g, 0, hq * d);
    let k = narrow(&mut g, hq * d, hkv * d);
    let v = narrow(&mut g, (hq + hkv) * d, hkv * d);
    let mut ins = vec![q, k, v];
    if let Some(dt) = mask_dt {
        ins.push(g.input("m", Shape::new(&[b, s], dt)));
    }
    let op = Op::Attention {
        num_heads: hq,
        head_dim: d,
        mask_kind: if mask_dt.is_some() {
            MaskKind::Custom
        } else {
            MaskKind::None
        },
        score_scale: None,
        attn_logit_softcap: None,
    };
    let y = g.push(op, ins).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn half_attention_on_tensor_cores_matches_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    use rlx::ir::DType;
    // Keys are staged 128 (d 32) or 64 (d 64) at a time: lengths below, at
    // and across a chunk, not multiples of 16. pad 2 makes rows that are
    // not 16-byte aligned (the 4-byte staging path).
    let mut cases = vec![];
    for d in [32, 64] {
        for s in [17, 64, 128, 130, 300] {
            cases.push((2, s, (4, 4), d, 0, None));
        }
        cases.push((2, 77, (4, 2), d, 0, Some(DType::F32)));
        cases.push((3, 200, (2, 1), d, 2, Some(DType::U8)));
        cases.push((1, 150, (6, 6), d, 2, None));
    }
    for (b, s, heads, d, pad, mask_dt) in cases {
        let g = packed_attention(b, s, heads, d, pad, mask_dt);
        let w = (heads.0 + 2 * heads.1) * d + pad;
        // Values on a 1/32 grid: exact in bf16 and f16, so the only
        // differences are the rounding of the probabilities and the output.
        let xs: Vec<f32> = (0..b * s * w)
            .map(|i| ((i * 7919 + 13) % 33) as f32 / 32.0 - 0.5)
            .collect();
        // Keep-mask: row r keeps its first s - 3 - 5r keys, except every 7th.
        let keep: Vec<f32> = (0..b * s)
            .map(|i| {
                let (r, j) = (i / s, i % s);
                (j + 3 + 5 * r < s && j % 7 != 6) as u8 as f32
            })
            .collect();
        let keep_u8: Vec<u8> = keep.iter().map(|&k| k as u8).collect();
        let mut inputs = vec![("x", TensorRef::F32(&xs))];
        match mask_dt {
            Some(DType::U8) => inputs.push(("m", TensorRef::U8(&keep_u8))),
            Some(_) => inputs.push(("m", TensorRef::F32(&keep))),
            None => {}
        }
        let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
        let want = cpu.run_typed(&inputs).unwrap();
        let want = want[0].as_f32().unwrap();
        for (precision, tol) in [(Precision::Bf16, 2e-2f32), (Precision::F16, 4e-3)] {
            for hybrid in [false, true] {
                let opts = CudaOptions {
                    hybrid,
                    precision,
                    ..CudaOptions::default()
                };
                let mut m = CudaModel::compile(g.clone(), &opts).unwrap();
                let got = m.run(&inputs).unwrap();
                let got = got[0].as_f32().unwrap();
                let worst = max_abs_diff(got, want);
                assert!(
                    worst <= tol && got.iter().all(|v| v.is_finite()),
                    "{} {precision} hybrid={hybrid}: max abs error {worst} > {tol}",
                    g.name
                );
            }
        }
    }
    println!("tensor-core attention matches the CPU backend in bf16 and f16");
}

/// `FusedResidualLN(x + x, r + r, bias, g, beta)`, `RmsNorm(x + x, g)`
/// and `LayerNorm((e + e) + (p + p), g, beta)` on `[rows, d]` with `p`
/// `[d]` (the sums make the rows 16-bit under bf16 / f16; the last Add
/// is absorbed by its norm in hybrid segments, `p` repeating per row).
fn norm_graph(rows: usize, d: usize) -> Graph {
    use rlx::ir::op::BinaryOp;
    use rlx::ir::Shape;
    let mut g = Graph::new(format!("norms_{rows}x{d}"));
    let x = g.input("x", Shape::f32(&[rows, d]));
    let r = g.input("r", Shape::f32(&[rows, d]));
    let e = g.input("e", Shape::f32(&[rows, d]));
    let p = g.input("p", Shape::f32(&[d]));
    let bias = g.param("bias", Shape::f32(&[d]));
    let gamma = g.param("g", Shape::f32(&[d]));
    let beta = g.param("beta", Shape::f32(&[d]));
    let add = |g: &mut Graph, a, b| g.push(Op::Binary(BinaryOp::Add), vec![a, b]).unwrap();
    let x2 = add(&mut g, x, x);
    let r2 = add(&mut g, r, r);
    let op = Op::FusedResidualLN {
        has_bias: true,
        eps: 1e-5,
    };
    let ln = g.push(op, vec![x2, r2, bias, gamma, beta]).unwrap();
    let op = Op::RmsNorm {
        axis: -1,
        eps: 1e-6,
    };
    let rms = g.push(op, vec![x2, gamma]).unwrap();
    let (e2, p2) = (add(&mut g, e, e), add(&mut g, p, p));
    let ep = add(&mut g, e2, p2);
    let op = Op::LayerNorm {
        axis: -1,
        eps: 1e-5,
    };
    let ln2 = g.push(op, vec![ep, gamma, beta]).unwrap();
    g.set_outputs(vec![ln, rms, ln2]);
    g
}

#[test]
fn norms_match_the_cpu_in_every_precision() {
    if !cuda_or_skip() {
        return;
    }
    // 384 / 576 / 1024: one warp per row (4 or 8 chunks of 4 per lane;
    // 1030 rows: 4 rows per block, the last block partial); 30 and 1100:
    // the block-per-row kernel (with the absorbed Add run before it).
    for (rows, d) in [
        (7, 384),
        (1030, 384),
        (5, 576),
        (3, 1024),
        (6, 30),
        (2, 1100),
    ] {
        let g = norm_graph(rows, d);
        // Values on a 1/32 grid (exact in bf16 and f16, also doubled).
        let grid = |n: usize, k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * k + 5) % 41) as f32 / 32.0 - 0.6)
                .collect()
        };
        let (xs, rs, es) = (
            grid(rows * d, 7919),
            grid(rows * d, 104_729),
            grid(rows * d, 31),
        );
        let ps = grid(d, 53);
        let (bias, gamma, beta) = (grid(d, 31), grid(d, 17), grid(d, 13));
        let inputs = [
            ("x", TensorRef::F32(&xs)),
            ("r", TensorRef::F32(&rs)),
            ("e", TensorRef::F32(&es)),
            ("p", TensorRef::F32(&ps)),
        ];
        let params = [("bias", &bias), ("g", &gamma), ("beta", &beta)];
        let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
        for (name, v) in params {
            cpu.set_param(name, v).unwrap();
        }
        let want = cpu.run_typed(&inputs).unwrap();
        let plan = rlx::cuda::plan(
            g.clone(),
            &CudaOptions {
                hybrid: true,
                precision: Precision::Bf16,
                ..CudaOptions::default()
            },
        )
        .unwrap();
        assert_eq!(plan.fused_norm_adds, 1, "{}: {plan:?}", g.name);
        let precisions = [
            (Precision::F32, 1e-4f32),
            (Precision::Bf16, 3e-2),
            (Precision::F16, 4e-3),
        ];
        for (precision, tol) in precisions {
            for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
                let session = Session::new(Device::Cuda(0))
                    .mode(mode)
                    .precision(precision);
                let mut m = session.compile(g.clone()).unwrap();
                for (name, v) in params {
                    m.set_param(name, v).unwrap();
                }
                let got = m.run_typed(&inputs).unwrap();
                for (o, (x, y)) in got.iter().zip(&want).enumerate() {
                    let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
                    let worst = max_abs_diff(x, y);
                    assert!(
                        worst <= tol && x.iter().all(|v| v.is_finite()),
                        "{} output {o} {precision} {mode:?}: max abs error {worst} > {tol}",
                        g.name
                    );
                }
            }
        }
    }
    println!("norms (and norms absorbing an Add) match the CPU backend in f32, bf16 and f16");
}

/// `FusedResidualLN` over a matmul `(a + a) [rows, k] x [k, n]` (with or
/// without its bias) and a residual `r + r`: the matmul is the norm's
/// input `pos`; the output is the norm's negation. (The sums make the
/// operands 16-bit under bf16 / f16: graph inputs and outputs stay f32,
/// and a matmul on one would stay f32 too.)
fn matmul_norm_graph(
    rows: usize,
    k: usize,
    n: usize,
    mm_bias: bool,
    ln_bias: bool,
    pos: usize,
) -> Graph {
    use rlx::ir::Shape;
    let mut g = Graph::new(format!("mm_ln_{rows}x{k}x{n}_{mm_bias}_{ln_bias}_{pos}"));
    let a = g.input("a", Shape::f32(&[rows, k]));
    let r = g.input("r", Shape::f32(&[rows, n]));
    let w = g.param("w", Shape::f32(&[k, n]));
    let add = rlx::ir::op::BinaryOp::Add;
    let a = g.push(Op::Binary(add), vec![a, a]).unwrap();
    let r = g.push(Op::Binary(add), vec![r, r]).unwrap();
    let mm = if mm_bias {
        let b = g.param("b", Shape::f32(&[n]));
        let op = Op::FusedMatMulBiasAct { activation: None };
        g.push(op, vec![a, w, b]).unwrap()
    } else {
        g.push(Op::MatMul, vec![a, w]).unwrap()
    };
    let mut ins = if pos == 0 { vec![mm, r] } else { vec![r, mm] };
    if ln_bias {
        ins.push(g.param("lnb", Shape::f32(&[n])));
    }
    ins.push(g.param("g", Shape::f32(&[n])));
    ins.push(g.param("beta", Shape::f32(&[n])));
    let op = Op::FusedResidualLN {
        has_bias: ln_bias,
        eps: 1e-5,
    };
    let y = g.push(op, ins).unwrap();
    // -y: the norm is not a graph output, so it is stored in 16 bits too.
    let neg = rlx::ir::op::Activation::Neg;
    let y = g.push(Op::Activation(neg), vec![y]).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn small_matmul_with_its_layernorm_is_one_kernel_and_matches_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    // (rows, k, n, matmul bias, norm bias, matmul position): MiniLM's output
    // projection and second FFN matmul at 1x128, row counts off the 16-row
    // tile, the widest and narrowest norms, the matmul as the residual.
    let cases = [
        (128, 384, 384, true, false, 0),
        (128, 1536, 384, true, false, 0),
        (7, 128, 64, true, true, 0),
        (37, 256, 1024, false, false, 1),
        (256, 64, 192, true, true, 1),
        (1, 384, 384, true, false, 0),
    ];
    for (rows, k, n, mm_bias, ln_bias, pos) in cases {
        let g = matmul_norm_graph(rows, k, n, mm_bias, ln_bias, pos);
        // Values on a 1/64 grid (exact in bf16 and f16); weights scaled so
        // the products stay O(1).
        let grid = |len: usize, mul: usize, scale: f32| -> Vec<f32> {
            (0..len)
                .map(|i| (((i * mul + 3) % 65) as f32 / 64.0 - 0.5) * scale)
                .collect()
        };
        let a = grid(rows * k, 7919, 0.5);
        let r = grid(rows * n, 104_729, 1.0);
        let w = grid(k * n, 31_337, 4.0 / (k as f32).sqrt());
        let (b, lnb, gm, beta) = (
            grid(n, 17, 1.0),
            grid(n, 23, 0.5),
            grid(n, 29, 2.0),
            grid(n, 37, 1.0),
        );
        let inputs = [("a", TensorRef::F32(&a)), ("r", TensorRef::F32(&r))];
        let mut params = vec![("w", &w), ("g", &gm), ("beta", &beta)];
        if mm_bias {
            params.push(("b", &b));
        }
        if ln_bias {
            params.push(("lnb", &lnb));
        }
        let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
        for (name, v) in &params {
            cpu.set_param(name, v).unwrap();
        }
        let want = cpu.run_typed(&inputs).unwrap();
        let want = want[0].as_f32().unwrap();
        for (precision, tol) in [(Precision::Bf16, 6e-2f32), (Precision::F16, 1e-2)] {
            // Opt-in: the default plan keeps cuBLASLt and the norm kernel.
            let default = CudaOptions {
                hybrid: true,
                precision,
                ..CudaOptions::default()
            };
            let plan = rlx::cuda::plan(g.clone(), &default).unwrap();
            assert_eq!(plan.fused_gemm_norms, 0, "{}: {plan:?}", g.name);
            let mut outs = vec![];
            for hybrid in [false, true] {
                let opts = CudaOptions {
                    hybrid,
                    precision,
                    fuse_matmul_norm: true,
                    ..CudaOptions::default()
                };
                let plan = rlx::cuda::plan(g.clone(), &opts).unwrap();
                assert!(plan.half_tensors >= 4, "{}: {plan:?}", g.name);
                assert_eq!(
                    plan.fused_gemm_norms, hybrid as usize,
                    "{}: {plan:?}",
                    g.name
                );
                let mut m = CudaModel::compile(g.clone(), &opts).unwrap();
                for (name, v) in &params {
                    m.set_param(name, TensorRef::F32(v)).unwrap();
                }
                let got = m.run(&inputs).unwrap();
                // Replays reuse the row-tile counters: a second run must
                // give the same values.
                let again = m.run(&inputs).unwrap();
                let (got, again) = (
                    got[0].as_f32().unwrap().to_vec(),
                    again[0].as_f32().unwrap(),
                );
                assert_eq!(
                    got, again,
                    "{} {precision} hybrid={hybrid}: second run differs",
                    g.name
                );
                if hybrid {
                    // The two Adds, the matmul with its norm, the Neg.
                    assert_eq!(m.device_ops(), Some(4), "{}", g.name);
                }
                let worst = max_abs_diff(&got, want);
                assert!(
                    worst <= tol && got.iter().all(|v| v.is_finite()),
                    "{} {precision} hybrid={hybrid}: max abs error {worst} > {tol}",
                    g.name
                );
                outs.push(got);
            }
            // Thunks (cuBLASLt, then the norm kernel) and the fused kernel
            // round the matmul output the same way: only the order of the
            // f32 sums differs.
            let gap = max_abs_diff(&outs[0], &outs[1]);
            assert!(gap <= tol, "{} {precision}: thunks vs hybrid {gap}", g.name);
        }
    }
    println!("small matmuls with their LayerNorm match the CPU backend in bf16 and f16");
}

#[test]
fn small_half_matmuls_match_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    use rlx::ir::op::Activation;
    use rlx::ir::Shape;
    // (rows, k, n, activation; None for a plain MatMul): MiniLM's four
    // matmuls at 1x128 (rlx's gemm_pf with 64-, 32- and 16-column tiles),
    // one row, odd row counts, a K too long for the kernel (cuBLASLt).
    let cases = [
        (128, 384, 1152, Some(None)),
        (128, 384, 1536, Some(Some(Activation::Gelu))),
        (128, 384, 384, Some(None)),
        (128, 1536, 384, Some(None)),
        (1, 1536, 384, Some(Some(Activation::Gelu))),
        (200, 2048, 64, None),
        (1, 64, 64, Some(Some(Activation::Relu))),
        (23, 128, 192, None),
        (256, 192, 128, Some(Some(Activation::Silu))),
        (257, 128, 64, Some(None)),
    ];
    for (rows, k, n, fused) in cases {
        let mut g = Graph::new(format!("mm_{rows}x{k}x{n}_{fused:?}"));
        let a = g.input("a", Shape::f32(&[rows, k]));
        let w = g.param("w", Shape::f32(&[k, n]));
        // a + a: a 16-bit operand (a matmul on a graph input stays f32).
        let a = g
            .push(Op::Binary(rlx::ir::op::BinaryOp::Add), vec![a, a])
            .unwrap();
        let y = match fused {
            Some(act) => {
                let b = g.param("b", Shape::f32(&[n]));
                let op = Op::FusedMatMulBiasAct { activation: act };
                g.push(op, vec![a, w, b]).unwrap()
            }
            None => g.push(Op::MatMul, vec![a, w]).unwrap(),
        };
        // -y as the output: y itself is stored in 16 bits.
        let y = g.push(Op::Activation(Activation::Neg), vec![y]).unwrap();
        g.set_outputs(vec![y]);
        let grid = |len: usize, mul: usize, scale: f32| -> Vec<f32> {
            (0..len)
                .map(|i| (((i * mul + 3) % 65) as f32 / 64.0 - 0.5) * scale)
                .collect()
        };
        let av = grid(rows * k, 7919, 0.5);
        let wv = grid(k * n, 31_337, 4.0 / (k as f32).sqrt());
        let bv = grid(n, 17, 1.0);
        let inputs = [("a", TensorRef::F32(&av))];
        let mut params = vec![("w", &wv)];
        if fused.is_some() {
            params.push(("b", &bv));
        }
        let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
        for (name, v) in &params {
            cpu.set_param(name, v).unwrap();
        }
        let want = cpu.run_typed(&inputs).unwrap();
        let want = want[0].as_f32().unwrap();
        let peak = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The output is rounded to 16 bits: relative to the largest value.
        for (precision, rel) in [(Precision::Bf16, 1e-2f32), (Precision::F16, 2e-3)] {
            // cuBLASLt, and rlx's own small-matmul kernel (gemm_pf).
            for (hybrid, own) in [(false, false), (true, false), (false, true), (true, true)] {
                let opts = CudaOptions {
                    hybrid,
                    precision,
                    small_matmul_kernel: own,
                    ..CudaOptions::default()
                };
                let plan = rlx::cuda::plan(g.clone(), &opts).unwrap();
                assert!(plan.half_tensors >= 3, "{}: {plan:?}", g.name);
                let mut m = CudaModel::compile(g.clone(), &opts).unwrap();
                for (name, v) in &params {
                    m.set_param(name, TensorRef::F32(v)).unwrap();
                }
                let got = m.run(&inputs).unwrap();
                let got = got[0].as_f32().unwrap();
                let worst = max_abs_diff(got, want);
                assert!(
                    worst <= rel * peak && got.iter().all(|v| v.is_finite()),
                    "{} {precision} hybrid={hybrid} own={own}: max abs error {worst} > {rel} x {peak}",
                    g.name
                );
            }
        }
    }
    println!("small 16-bit matmuls (cuBLASLt and gemm_pf) match the CPU backend in bf16 and f16");
}

#[test]
fn half_gathers_match_the_cpu_and_reject_bad_ids() {
    if !cuda_or_skip() {
        return;
    }
    use rlx::ir::op::Activation;
    use rlx::ir::{DType, Shape};
    for (vocab, d) in [(50, 64), (50, 384), (40, 30)] {
        // -table[ids]: the gathered rows are stored in 16 bits.
        let mut g = Graph::new(format!("gather_{vocab}x{d}"));
        let table = g.param("t", Shape::f32(&[vocab, d]));
        let ids = g.input("ids", Shape::new(&[2, 5], DType::I64));
        let rows = g.push(Op::Gather { axis: 0 }, vec![table, ids]).unwrap();
        let y = g.push(Op::Activation(Activation::Neg), vec![rows]).unwrap();
        g.set_outputs(vec![y]);
        let tv: Vec<f32> = (0..vocab * d)
            .map(|i| ((i * 37 + 11) % 97) as f32 / 32.0 - 1.5)
            .collect();
        let good = [3i64, 0, 49 % vocab as i64, 7, 7, 1, 2, 39, 5, 0];
        let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
        cpu.set_param("t", &tv).unwrap();
        let want = cpu.run_typed(&[("ids", TensorRef::I64(&good))]).unwrap();
        for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
            let session = Session::new(Device::Cuda(0))
                .mode(mode)
                .precision(Precision::Bf16);
            let mut m = session.compile(g.clone()).unwrap();
            m.set_param("t", &tv).unwrap();
            let got = m.run_typed(&[("ids", TensorRef::I64(&good))]).unwrap();
            // Table values on a 1/32 grid below 2 in magnitude: exact in bf16.
            assert_eq!(
                got[0].as_f32().unwrap(),
                want[0].as_f32().unwrap(),
                "{} {mode:?}",
                g.name
            );
            let bad = [3i64, 0, vocab as i64, 7, 7, 1, 2, 39, 5, 0];
            let err = m
                .run_typed(&[("ids", TensorRef::I64(&bad))])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("Gather") && err.contains("out of range"),
                "{} {mode:?}: {err}",
                g.name
            );
            let again = m.run_typed(&[("ids", TensorRef::I64(&good))]).unwrap();
            assert_eq!(again[0].as_f32().unwrap(), want[0].as_f32().unwrap());
        }
    }
    println!("16-bit gathers match the CPU backend and reject out-of-range ids");
}

#[test]
fn an_embedding_norm_reads_its_gathers_and_rejects_bad_ids() {
    use rlx::ir::{DType, Shape};
    // -LayerNorm(word[ids] + pos, residual type[tt]): in hybrid the norm
    // reads both tables itself (i64 and i32 ids); a width that is not a
    // multiple of 4 keeps its gathers.
    let graph = |vocab: usize, d: usize| {
        let mut g = Graph::new(format!("embedding_{vocab}x{d}"));
        let word = g.param("word", Shape::f32(&[vocab, d]));
        let types = g.param("types", Shape::f32(&[2, d]));
        let pos = g.param("pos", Shape::f32(&[5, d]));
        let gamma = g.param("g", Shape::f32(&[d]));
        let beta = g.param("b", Shape::f32(&[d]));
        let ids = g.input("ids", Shape::new(&[2, 5], DType::I64));
        let tt = g.input("tt", Shape::new(&[2, 5], DType::I32));
        let w = g.push(Op::Gather { axis: 0 }, vec![word, ids]).unwrap();
        let t = g.push(Op::Gather { axis: 0 }, vec![types, tt]).unwrap();
        let add = rlx::ir::op::BinaryOp::Add;
        let e = g.push(Op::Binary(add), vec![w, pos]).unwrap();
        let op = Op::FusedResidualLN {
            has_bias: false,
            eps: 1e-12,
        };
        let y = g.push(op, vec![e, t, gamma, beta]).unwrap();
        // An op after the norm keeps its output inside the segment (16-bit
        // in a half precision, as in a model).
        let neg = Op::Activation(rlx::ir::op::Activation::Neg);
        let y = g.push(neg, vec![y]).unwrap();
        g.set_outputs(vec![y]);
        g
    };
    for (vocab, d, fused) in [(50, 384, 2), (50, 768, 2), (40, 30, 0)] {
        let g = graph(vocab, d);
        for precision in [Precision::F32, Precision::Bf16] {
            let opts = CudaOptions {
                hybrid: true,
                precision,
                ..CudaOptions::default()
            };
            let plan = rlx::cuda::plan(g.clone(), &opts).unwrap();
            let got = (plan.fused_norm_gathers, plan.fused_norm_adds);
            assert_eq!(got, (fused, 1), "{} {precision}: {plan:?}", g.name);
        }
    }
    if !cuda_or_skip() {
        return;
    }
    fn inputs<'a>(ids: &'a [i64], tt: &'a [i32]) -> [(&'static str, TensorRef<'a>); 2] {
        [("ids", TensorRef::I64(ids)), ("tt", TensorRef::I32(tt))]
    }
    for (vocab, d) in [(50, 384), (50, 768), (40, 30)] {
        let g = graph(vocab, d);
        let grid = |n: usize, k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * k + 3) % 61) as f32 / 40.0 - 0.7)
                .collect()
        };
        let params = [
            ("word", grid(vocab * d, 37)),
            ("types", grid(2 * d, 11)),
            ("pos", grid(5 * d, 7)),
            ("g", grid(d, 5)),
            ("b", grid(d, 3)),
        ];
        let ids = [3i64, 0, vocab as i64 - 1, 7, 7, 1, 2, 39, 5, 0];
        let tt = [0i32, 1, 1, 0, 0, 1, 0, 1, 1, 0];
        let mut cpu = Session::new(Device::Cpu).compile(g.clone()).unwrap();
        for (name, v) in &params {
            cpu.set_param(name, v).unwrap();
        }
        let want = cpu.run_typed(&inputs(&ids, &tt)).unwrap();
        let want = want[0].as_f32().unwrap();
        for (precision, tol) in [
            (Precision::F32, 1e-5f32),
            (Precision::Bf16, 3e-2),
            (Precision::F16, 4e-3),
        ] {
            for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
                let what = format!("{} {precision} {mode:?}", g.name);
                let session = Session::new(Device::Cuda(0))
                    .mode(mode)
                    .precision(precision);
                let mut m = session.compile(g.clone()).unwrap();
                for (name, v) in &params {
                    m.set_param(name, v).unwrap();
                }
                let got = m.run_typed(&inputs(&ids, &tt)).unwrap();
                assert_close(got[0].as_f32().unwrap(), want, tol, &what);
                let mut bad_ids = ids;
                bad_ids[4] = vocab as i64;
                let mut bad_tt = tt;
                bad_tt[9] = -1;
                for (ids, tt) in [(&bad_ids, &tt), (&ids, &bad_tt)] {
                    let err = m.run_typed(&inputs(ids, tt)).unwrap_err().to_string();
                    assert!(
                        err.contains("Gather") && err.contains("out of range"),
                        "{what}: {err}"
                    );
                }
                let again = m.run_typed(&inputs(&ids, &tt)).unwrap();
                assert_eq!(
                    again[0].as_f32().unwrap(),
                    got[0].as_f32().unwrap(),
                    "{what}"
                );
            }
        }
    }
    println!("embedding norms read their gathers, match the CPU backend and reject bad ids");
}
