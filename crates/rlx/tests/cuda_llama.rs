//! SmolLM2-135M-Instruct (Q4_1 GGUF) on a CUDA GPU against the PyTorch
//! reference (crates/rlx-models/tests/data/smollm2_logits.json): next-token
//! top-10 logits within 0.02 and all 24 greedy ids, in thunks and hybrid
//! mode (where the whole decode step is one CUDA graph); decode logits
//! against the CPU backend.
//!
//! Skips with a message when no CUDA device is present or the model has
//! not been fetched (`RLX_MODELS_DIR` or `~/.cache/rlx/models`).
#![cfg(feature = "cuda")]

use rlx::cpu::CpuOptions;
use rlx::cuda::CudaOptions;
use rlx::models::llama::{argmax, LlamaDevice, LlamaModel};
use std::path::PathBuf;

mod common;
use common::cuda_or_skip;

#[path = "../../rlx-models/tests/support/gguf_writer.rs"]
mod gguf_writer;

fn model_path() -> Option<PathBuf> {
    if !cuda_or_skip() {
        return None;
    }
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let p = dir.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        println!("skipped: model not fetched ({} missing)", p.display());
        None
    }
}

struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    top10: Vec<(u32, f32)>,
    greedy: Vec<u32>,
}

fn reference() -> Vec<Case> {
    let rel = "crates/rlx-models/tests/data/smollm2_logits.json";
    let here = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rlx-models/tests/data/smollm2_logits.json"
    );
    let text = std::fs::read_to_string(here)
        .or_else(|_| std::fs::read_to_string(rel))
        .expect("reference logits file");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap().to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            top10: c["top10_next"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                .collect(),
            greedy: ids(&c["greedy_ids"]),
        })
        .collect()
}

fn run_mode(path: &PathBuf, hybrid: bool) {
    let what = if hybrid { "cuda hybrid" } else { "cuda thunks" };
    let opts = CudaOptions {
        hybrid,
        ..CudaOptions::default()
    };
    let mut m = LlamaModel::load_on(path, 64, LlamaDevice::Cuda(opts)).unwrap();
    for case in reference() {
        let logits = m.prefill(&case.prompt_ids).unwrap();
        let mut worst = 0.0f32;
        for &(id, want) in &case.top10 {
            let got = logits[id as usize];
            worst = worst.max((got - want).abs());
            assert!(
                (got - want).abs() <= 0.02,
                "{what} '{}': logit of {id} is {got}, reference {want}",
                case.prompt
            );
        }
        assert_eq!(argmax(&logits), case.top10[0].0, "{what}: top-1");
        let ids = m
            .generate_greedy(&case.prompt_ids, case.greedy.len(), None)
            .unwrap();
        assert_eq!(ids, case.greedy, "{what} '{}': greedy ids", case.prompt);
        println!(
            "{what} '{}': top-10 max |diff| {worst:.5}, {} greedy ids equal",
            case.prompt,
            ids.len()
        );
    }
    let dispatches = m.decode_model().report().dispatches;
    let ops = m.decode_device_ops().expect("device ops after decoding");
    println!("{what}: {dispatches} dispatches, {ops} device ops per decode step");
    if hybrid {
        assert_eq!(dispatches, 1, "the decode step is one CUDA graph");
    }
}

#[test]
fn smollm2_greedy_ids_match_reference_on_cuda() {
    let Some(path) = model_path() else { return };
    run_mode(&path, false);
    run_mode(&path, true);
}

#[test]
fn smollm2_decode_logits_match_the_cpu_backend() {
    let Some(path) = model_path() else { return };
    let case = &reference()[0];
    let mut gpu = LlamaModel::load_on(
        &path,
        48,
        LlamaDevice::Cuda(CudaOptions {
            hybrid: true,
            ..CudaOptions::default()
        }),
    )
    .unwrap();
    let mut cpu = LlamaModel::load_on(&path, 48, LlamaDevice::Cpu(CpuOptions::default())).unwrap();
    let mut a = gpu.prefill(&case.prompt_ids).unwrap();
    let mut b = cpu.prefill(&case.prompt_ids).unwrap();
    let mut worst = 0.0f32;
    for step in 0..12 {
        let d = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        worst = worst.max(d);
        assert!(d <= 2e-3, "step {step}: logits differ by {d}");
        let id = argmax(&b);
        a = gpu.decode(id).unwrap();
        b = cpu.decode(id).unwrap();
    }
    // A second prompt reuses the caches from position 0.
    let a = gpu.prefill(&case.prompt_ids[..4]).unwrap();
    let b = cpu.prefill(&case.prompt_ids[..4]).unwrap();
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(d <= 2e-3, "second prefill: logits differ by {d}");
    println!("decode logits vs CPU over 12 steps: max |diff| {worst:.2e}");
}

/// Largest `|a - b|` over two logit vectors, and the largest `|b|`.
fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    (d, b.iter().map(|y| y.abs()).fold(0.0, f32::max))
}

/// SmolLM2's dimensions (4 of its 30 layers) with random weights in each
/// packed scheme, no model file needed. In hybrid mode the decode step's
/// GEMVs absorb the RmsNorms, the SwiGLU and the residual Adds, and each
/// layer's Rope does both cache writes; its logits must match CUDA thunks
/// (one kernel per op) and the CPU backend at every step, for a prompt of
/// 5 tokens (whose 5-row GEMVs fuse too) and 16 decode steps.
#[test]
fn fused_decode_steps_match_thunks_and_the_cpu_at_smollm2_dims() {
    use rlx::ir::QuantScheme;
    use rlx::models::llama::{LlamaConfig, LlamaWeights};
    if !cuda_or_skip() {
        return;
    }
    let mut cfg = LlamaConfig::smollm2_135m();
    cfg.n_layers = 4;
    for scheme in [
        QuantScheme::Q4_0,
        QuantScheme::Q4_1,
        QuantScheme::Q5_0,
        QuantScheme::Q5_1,
        QuantScheme::Q8_0,
    ] {
        let weights = || LlamaWeights::synthetic(&cfg, scheme, QuantScheme::Q8_0, 11).unwrap();
        let cuda = |hybrid| {
            let opts = CudaOptions {
                hybrid,
                ..CudaOptions::default()
            };
            LlamaModel::from_weights_on(weights(), 40, LlamaDevice::Cuda(opts)).unwrap()
        };
        let (mut hy, mut th) = (cuda(true), cuda(false));
        let mut cpu = LlamaModel::from_weights(weights(), 40, CpuOptions::default()).unwrap();
        let prompt = [1u32, 17, 300, 5, 42];
        let mut a = hy.prefill(&prompt).unwrap();
        let mut b = th.prefill(&prompt).unwrap();
        let mut c = cpu.prefill(&prompt).unwrap();
        let (mut worst_th, mut worst_cpu) = (0.0f32, 0.0f32);
        for step in 0..=16 {
            let (d_th, scale) = max_diff(&a, &b);
            let (d_cpu, _) = max_diff(&a, &c);
            let tol = 1e-4 * scale.max(1.0);
            assert!(
                d_th <= tol && d_cpu <= 2.0 * tol,
                "{} step {step}: hybrid vs thunks {d_th}, vs cpu {d_cpu} (logits up to {scale})",
                scheme.name()
            );
            worst_th = worst_th.max(d_th / scale.max(1.0));
            worst_cpu = worst_cpu.max(d_cpu / scale.max(1.0));
            if step == 16 {
                break;
            }
            let id = argmax(&c);
            a = hy.decode(id).unwrap();
            b = th.decode(id).unwrap();
            c = cpu.decode(id).unwrap();
        }
        let ops = hy.decode_device_ops().expect("device ops after decoding");
        let ops_th = th.decode_device_ops().expect("device ops after decoding");
        println!(
            "{}: hybrid vs thunks max rel {worst_th:.1e}, vs cpu {worst_cpu:.1e}; \
             decode step {ops} device ops in one graph (thunks {ops_th})",
            scheme.name()
        );
        // Embedding gather, per layer 6 (norm+qkv, rope+writes, attention,
        // o+residual, norm+gate_up, swiglu+down+residual), norm+head.
        assert_eq!(ops, 1 + 6 * cfg.n_layers + 1, "fused decode step");
        assert_eq!(ops_th, 1 + 13 * cfg.n_layers + 2, "one kernel per op");
    }
}

/// A tiny random Llama in the formats of a `Q4_K_M` file (Q4_K, Q5_K,
/// Q6_K, Q5_0 projections; see `gguf_writer::kquant_llama`) on CUDA, in
/// thunks and hybrid mode, against the CPU backend: logits of a prefill and
/// of eight decode steps within 1e-4 of the largest |logit|. Needs no
/// downloaded model.
#[test]
fn kquant_llama_matches_the_cpu_backend() {
    if !cuda_or_skip() {
        return;
    }
    let path = gguf_writer::kquant_llama("kquant.gguf");
    let prompt = [3u32, 17, 5, 39, 0, 22, 8, 11, 30];
    let mut cpu = LlamaModel::load_on(&path, 32, LlamaDevice::Cpu(CpuOptions::default())).unwrap();
    let mut want = vec![cpu.prefill(&prompt).unwrap()];
    for _ in 0..8 {
        let id = argmax(want.last().unwrap());
        want.push(cpu.decode(id).unwrap());
    }
    for hybrid in [false, true] {
        let opts = CudaOptions {
            hybrid,
            ..CudaOptions::default()
        };
        let mut gpu = LlamaModel::load_on(&path, 32, LlamaDevice::Cuda(opts)).unwrap();
        let mut got = gpu.prefill(&prompt).unwrap();
        for (step, w) in want.iter().enumerate() {
            let (d, scale) = max_diff(&got, w);
            assert!(
                d <= 1e-4 * scale,
                "hybrid {hybrid} step {step}: logits differ by {d} (max |logit| {scale})"
            );
            if step + 1 < want.len() {
                got = gpu.decode(argmax(w)).unwrap();
            }
        }
        println!(
            "K-quant tiny Llama, hybrid {hybrid}: logits within 1e-4 of max |logit| over 9 steps"
        );
    }
}

/// Gemma-3-270M's attention shape (head_dim 256, 4 query heads over 1 KV
/// head, q/k norms, 5 sliding-window layers of 4 positions and one global
/// layer; `gguf_writer::gemma3_wide`, random K-quant weights) on CUDA, in
/// thunks and hybrid mode, against the CPU backend: logits within 1e-4 of
/// the largest |logit| for prompts of 9 tokens (the mixed `attention_x_d256_r2`
/// kernel) with 8 decode steps (`attention_rows_d256`), 6 tokens (the f32
/// `attention_d256`) and 40 tokens (several key tiles), each from position 0
/// of the same caches. Needs no downloaded model.
#[test]
fn wide_head_gemma3_matches_the_cpu_backend() {
    if !cuda_or_skip() {
        return;
    }
    let path = gguf_writer::gemma3_wide("gemma3_wide.gguf", 4);
    let long: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 40).collect();
    let prompts: [(&[u32], usize); 3] = [
        (&[3, 17, 5, 39, 0, 22, 8, 11, 30], 8),
        (&[9, 1, 33, 4, 27, 12], 2),
        (&long, 2),
    ];
    let steps = |m: &mut LlamaModel, want: Option<&[Vec<Vec<f32>>]>| -> Vec<Vec<Vec<f32>>> {
        let mut all = Vec::new();
        for (pi, &(prompt, n)) in prompts.iter().enumerate() {
            let mut out = vec![m.prefill(prompt).unwrap()];
            for s in 0..n {
                // The CPU's greedy ids drive both backends.
                let id = match want {
                    Some(w) => argmax(&w[pi][s]),
                    None => argmax(out.last().unwrap()),
                };
                out.push(m.decode(id).unwrap());
            }
            all.push(out);
        }
        all
    };
    let mut cpu = LlamaModel::load_on(&path, 64, LlamaDevice::Cpu(CpuOptions::default())).unwrap();
    let want = steps(&mut cpu, None);
    for hybrid in [false, true] {
        let opts = CudaOptions {
            hybrid,
            ..CudaOptions::default()
        };
        let mut gpu = LlamaModel::load_on(&path, 64, LlamaDevice::Cuda(opts)).unwrap();
        let got = steps(&mut gpu, Some(&want));
        let mut worst = 0.0f32;
        for (pi, (g, w)) in got.iter().zip(&want).enumerate() {
            for (step, (g, w)) in g.iter().zip(w).enumerate() {
                let (d, scale) = max_diff(g, w);
                assert!(
                    d <= 1e-4 * scale,
                    "hybrid {hybrid} prompt {pi} step {step}: logits differ by {d} (max |logit| {scale})"
                );
                worst = worst.max(d / scale);
            }
        }
        println!(
            "wide-head Gemma 3, hybrid {hybrid}: logits within {worst:.1e} of max |logit| \
             over 3 prompts (9, 6, 40 tokens) and 12 decode steps"
        );
    }
}
