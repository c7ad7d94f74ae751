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

// ---- Continuous batching on CUDA (`LlamaModel::decode_batch`) ----

use rlx::models::llama::{KvCache, LlamaError, MAX_DECODE_BATCH};

/// One sequence of a batched run: its prompt, the batched step it joins
/// at (prefilled just before) and how many steps it takes part in.
#[derive(Clone)]
struct Seq {
    prompt: Vec<u32>,
    join: usize,
    steps: usize,
}

/// `n` sequences with prompts of different lengths over a vocabulary of
/// `vocab`: sequence 0 leaves after 3 of the 8 steps, and one more joins
/// (prefilled) after 4.
fn schedule(n: usize, vocab: u32) -> Vec<Seq> {
    let prompt = |i: usize, len: usize| -> Vec<u32> {
        (0..len)
            .map(|j| ((i * 31 + j * 7 + 3) as u32) % vocab)
            .collect()
    };
    let mut seqs: Vec<Seq> = (0..n)
        .map(|i| Seq {
            prompt: prompt(i, 2 + (i * 3) % 7),
            join: 0,
            steps: if i == 0 { 3 } else { 8 },
        })
        .collect();
    seqs.push(Seq {
        prompt: prompt(n + 5, 5),
        join: 4,
        steps: 4,
    });
    seqs
}

/// Prefill `ids` into a fresh cache through `swap_cache`, returning it and
/// the prefill's logits.
fn prefill_cache(m: &mut LlamaModel, ids: &[u32]) -> (KvCache, Vec<f32>) {
    let parked = m.swap_cache(m.new_cache()).unwrap();
    let logits = m.prefill(ids).unwrap();
    let cache = m.swap_cache(parked).unwrap();
    (cache, logits)
}

/// Run `seqs` through `decode_batch` of `batch` and through one-sequence
/// decodes of `solo` (same device and options) with the same tokens; each
/// sequence's logits must agree within 1e-4 of max |logit| at every step
/// and its greedy ids must be equal. Returns the worst relative difference.
fn batch_matches_solo(
    batch: &mut LlamaModel,
    solo: &mut LlamaModel,
    seqs: &[Seq],
    what: &str,
) -> f32 {
    // The reference: each sequence alone, greedy.
    let want: Vec<(Vec<Vec<f32>>, Vec<u32>)> = seqs
        .iter()
        .map(|s| {
            let mut logits = vec![solo.prefill(&s.prompt).unwrap()];
            let mut ids = Vec::new();
            for _ in 0..s.steps {
                let id = argmax(logits.last().unwrap());
                ids.push(id);
                logits.push(solo.decode(id).unwrap());
            }
            (logits, ids)
        })
        .collect();
    let mut worst = 0.0f32;
    let mut check = |si: usize, step: usize, got: &[f32], w: &[f32]| {
        let (d, scale) = max_diff(got, w);
        assert!(
            d <= 1e-4 * scale.max(1.0),
            "{what}: sequence {si} step {step}: logits differ by {d} (max |logit| {scale})"
        );
        worst = worst.max(d / scale.max(1.0));
    };
    // (sequence, cache, logits of its last step, ids fed so far)
    let mut live: Vec<(usize, KvCache, Vec<f32>, Vec<u32>)> = Vec::new();
    let total = seqs.iter().map(|s| s.join + s.steps).max().unwrap();
    for step in 0..total {
        live.retain(|(si, _, _, fed)| fed.len() < seqs[*si].steps);
        for (si, s) in seqs.iter().enumerate() {
            if s.join == step {
                let (cache, logits) = prefill_cache(batch, &s.prompt);
                check(si, 0, &logits, &want[si].0[0]);
                live.push((si, cache, logits, Vec::new()));
            }
        }
        if live.is_empty() {
            continue;
        }
        let ids: Vec<u32> = live.iter().map(|(_, _, l, _)| argmax(l)).collect();
        let mut steps: Vec<(&mut KvCache, u32)> = live
            .iter_mut()
            .zip(&ids)
            .map(|((_, c, _, _), &id)| (c, id))
            .collect();
        let out = batch.decode_batch(&mut steps).unwrap();
        assert_eq!(out.len(), live.len());
        for ((si, cache, logits, fed), (got, &id)) in live.iter_mut().zip(out.into_iter().zip(&ids))
        {
            fed.push(id);
            let k = fed.len();
            assert_eq!(
                &fed[..],
                &want[*si].1[..k],
                "{what}: sequence {si}: greedy ids"
            );
            assert_eq!(cache.position(), seqs[*si].prompt.len() + k);
            check(*si, k, &got, &want[*si].0[k]);
            *logits = got;
        }
    }
    worst
}

/// A constructor of a test model for given `CudaOptions`.
type MakeModel = Box<dyn Fn(CudaOptions) -> LlamaModel>;

/// Every model the batched tests run: a label and a constructor.
fn batch_models() -> Vec<(String, MakeModel)> {
    use rlx::ir::QuantScheme;
    use rlx::models::llama::{LlamaConfig, LlamaWeights};
    let mut v: Vec<(String, MakeModel)> = Vec::new();
    let kq = gguf_writer::kquant_llama("kquant_batch.gguf");
    v.push((
        "K-quant tiny Llama".into(),
        Box::new(move |o| LlamaModel::load_on(&kq, 32, LlamaDevice::Cuda(o)).unwrap()),
    ));
    let gm = gguf_writer::gemma3_wide("gemma3_wide_batch.gguf", 4);
    v.push((
        "wide-head Gemma 3 (sliding window)".into(),
        Box::new(move |o| LlamaModel::load_on(&gm, 32, LlamaDevice::Cuda(o)).unwrap()),
    ));
    v.push((
        "SmolLM2 dims, 4 layers, Q4_0".into(),
        Box::new(|o| {
            let mut cfg = LlamaConfig::smollm2_135m();
            cfg.n_layers = 4;
            let w =
                LlamaWeights::synthetic(&cfg, QuantScheme::Q4_0, QuantScheme::Q8_0, 11).unwrap();
            LlamaModel::from_weights_on(w, 32, LlamaDevice::Cuda(o)).unwrap()
        }),
    ));
    if let Some(p) = model_path() {
        v.push((
            "SmolLM2-135M Q4_1".into(),
            Box::new(move |o| LlamaModel::load_on(&p, 32, LlamaDevice::Cuda(o)).unwrap()),
        ));
    }
    v
}

/// Continuous batching on CUDA: for each test model, in thunks and hybrid
/// mode (the batched step one CUDA graph per N), 1, 3 and 5 sequences with
/// prompts of different lengths are prefilled (swapped in and out), then
/// fed greedy ids by `decode_batch` for 8 steps while sequence 0 leaves
/// after 3 and a new one joins after 4; every sequence's logits match its
/// one-sequence CUDA decode within 1e-4 of max |logit|, and its greedy ids
/// are equal.
#[test]
fn decode_batch_on_cuda_matches_solo_decodes() {
    if !cuda_or_skip() {
        return;
    }
    for (name, make) in batch_models() {
        for hybrid in [false, true] {
            let opts = CudaOptions {
                hybrid,
                ..CudaOptions::default()
            };
            let mut batch = make(opts.clone());
            let mut solo = make(opts);
            let vocab = batch.config().vocab as u32;
            for n in [1usize, 3, 5] {
                let what = format!("{name}, hybrid {hybrid}, N = {n}");
                let worst = batch_matches_solo(&mut batch, &mut solo, &schedule(n, vocab), &what);
                println!("{what}: batched logits within {worst:.1e} of max |logit| of the solo decode, greedy ids equal");
            }
            if hybrid {
                for p in batch.compiled_plans() {
                    if p.name.starts_with("decode") {
                        assert_eq!(
                            p.report.dispatches, 1,
                            "{name}: {} is one CUDA graph",
                            p.name
                        );
                    }
                }
            }
        }
    }
}

/// Errors of `decode_batch` / `swap_cache` on CUDA, before anything runs:
/// no sequences, too many, a cache of another CUDA model, a host cache of
/// a CPU model; the good caches still work after.
#[test]
fn decode_batch_on_cuda_rejects_foreign_caches() {
    if !cuda_or_skip() {
        return;
    }
    let path = gguf_writer::kquant_llama("kquant_batch_err.gguf");
    let opts = CudaOptions {
        hybrid: true,
        ..CudaOptions::default()
    };
    let mut m = LlamaModel::load_on(&path, 32, LlamaDevice::Cuda(opts.clone())).unwrap();
    let err = m.decode_batch(&mut []).unwrap_err();
    assert!(
        matches!(err, LlamaError::BatchSize { batch: 0, .. }),
        "{err}"
    );
    let mut many: Vec<KvCache> = (0..=MAX_DECODE_BATCH).map(|_| m.new_cache()).collect();
    let mut steps: Vec<(&mut KvCache, u32)> = many.iter_mut().map(|c| (c, 1)).collect();
    let err = m.decode_batch(&mut steps).unwrap_err();
    assert!(matches!(err, LlamaError::BatchSize { .. }), "{err}");
    let (mut a, _) = prefill_cache(&mut m, &[1, 2, 3]);
    assert!(a.on_device());
    let mut other = LlamaModel::load_on(&path, 32, LlamaDevice::Cuda(opts)).unwrap();
    let (mut foreign, _) = prefill_cache(&mut other, &[4, 5]);
    let err = m
        .decode_batch(&mut [(&mut a, 7), (&mut foreign, 1)])
        .unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 1, source } if matches!(**source, LlamaError::ForeignCache { .. })),
        "{err}"
    );
    let mut cpu = LlamaModel::load_on(&path, 32, LlamaDevice::Cpu(CpuOptions::default())).unwrap();
    let (mut host, _) = prefill_cache(&mut cpu, &[4, 5]);
    assert!(!host.on_device());
    let err = m.decode_batch(&mut [(&mut host, 1)]).unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 0, source } if matches!(**source, LlamaError::ForeignCache { .. })),
        "{err}"
    );
    let err = m.swap_cache(host).unwrap_err();
    assert!(err.to_string().contains("host tensors"), "{err}");
    let err = cpu.swap_cache(foreign).unwrap_err();
    assert!(err.to_string().contains("device buffers"), "{err}");
    assert_eq!(a.position(), 3);
    let out = m.decode_batch(&mut [(&mut a, 7)]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(a.position(), 4);
    println!("decode_batch on CUDA: bad batches and foreign caches rejected");
}

/// The checks of `decode_batch` that need no GPU, in a build with the
/// `cuda` feature (the caches of CPU models): an empty batch and a cache of
/// another model are refused, nothing changes.
#[test]
fn decode_batch_errors_need_no_gpu() {
    let path = gguf_writer::kquant_llama("kquant_batch_cpu.gguf");
    let mut m = LlamaModel::load_on(&path, 32, LlamaDevice::Cpu(CpuOptions::default())).unwrap();
    let err = m.decode_batch(&mut []).unwrap_err();
    assert!(
        matches!(err, LlamaError::BatchSize { batch: 0, .. }),
        "{err}"
    );
    let mut other =
        LlamaModel::load_on(&path, 32, LlamaDevice::Cpu(CpuOptions::default())).unwrap();
    let (mut foreign, _) = prefill_cache(&mut other, &[4, 5]);
    let (mut a, _) = prefill_cache(&mut m, &[1, 2, 3]);
    let err = m
        .decode_batch(&mut [(&mut a, 7), (&mut foreign, 1)])
        .unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 1, source } if matches!(**source, LlamaError::ForeignCache { .. })),
        "{err}"
    );
    assert_eq!((a.position(), foreign.position()), (3, 2));
    assert!(!a.on_device());
    assert_eq!(m.decode_batch(&mut [(&mut a, 7)]).unwrap().len(), 1);
}

/// `CudaModel::take_param_buffer` / `set_param_buffer`: a cache written in
/// place by `CacheWrite` moves between two models without a host copy;
/// rebinding the same buffer keeps the resolved schedule (and its CUDA
/// graph), another buffer rebuilds it; a buffer of the wrong shape is
/// refused with the param's name.
#[test]
fn param_buffers_move_between_cuda_models() {
    use rlx::cuda::CudaModel;
    use rlx::ir::{DType, Graph, Op, Shape};
    use rlx::runtime::{Executable, TensorRef};
    if !cuda_or_skip() {
        return;
    }
    let graph = || {
        let mut g = Graph::new("cw");
        let x = g.input("x", Shape::f32(&[1, 1, 4]));
        let pos = g.input("pos", Shape::new(&[1], DType::I64));
        let c = g.param("cache", Shape::f32(&[1, 8, 4]));
        let w = g.push(Op::CacheWrite { axis: 1 }, vec![c, x, pos]).unwrap();
        g.set_outputs(vec![w]);
        g
    };
    for hybrid in [false, true] {
        let opts = CudaOptions {
            hybrid,
            ..CudaOptions::default()
        };
        let mut a = CudaModel::compile(graph(), &opts).unwrap();
        let mut b = CudaModel::compile(graph(), &opts).unwrap();
        let p = a.new_param_buffer("cache").unwrap();
        a.set_param_buffer("cache", p).unwrap();
        let run = |m: &mut CudaModel, v: f32, at: i64| {
            m.run(&[
                ("x", TensorRef::F32(&[v; 4])),
                ("pos", TensorRef::I64(&[at])),
            ])
            .unwrap()
        };
        run(&mut a, 1.0, 0);
        assert!(a.is_resolved());
        // Out and back in: the same address keeps the schedule.
        let p = a.take_param_buffer("cache").unwrap().unwrap();
        assert!(a.take_param_buffer("cache").unwrap().is_none());
        a.set_param_buffer("cache", p).unwrap();
        assert!(
            a.is_resolved(),
            "hybrid {hybrid}: same buffer, same schedule"
        );
        run(&mut a, 2.0, 1);
        // Into the other model, which writes row 2.
        let p = a.take_param_buffer("cache").unwrap().unwrap();
        b.set_param_buffer("cache", p).unwrap();
        let out = run(&mut b, 3.0, 2);
        let v = out[0].as_f32().unwrap();
        assert_eq!(
            &v[..12],
            &[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]
        );
        assert!(v[12..].iter().all(|&x| x == 0.0));
        // Another buffer: the schedule is resolved again.
        let fresh = b.new_param_buffer("cache").unwrap();
        let old = b.take_param_buffer("cache").unwrap().unwrap();
        b.set_param_buffer("cache", fresh).unwrap();
        assert!(!b.is_resolved());
        // The host copy of a device-only param is its device contents.
        a.set_param_buffer("cache", old).unwrap();
        let t = a.take_param("cache").unwrap();
        assert_eq!(t.as_f32().unwrap()[8], 3.0);
        // Wrong shape: refused, naming the param.
        let mut g = Graph::new("other");
        let x = g.input("x", Shape::f32(&[1, 1, 4]));
        let pos = g.input("pos", Shape::new(&[1], DType::I64));
        let c = g.param("cache", Shape::f32(&[1, 9, 4]));
        let w = g.push(Op::CacheWrite { axis: 1 }, vec![c, x, pos]).unwrap();
        g.set_outputs(vec![w]);
        let wide = CudaModel::compile(g, &opts).unwrap();
        let q = wide.new_param_buffer("cache").unwrap();
        let err = b.set_param_buffer("cache", q).unwrap_err();
        assert!(err.to_string().contains("'cache'"), "{err}");
        assert!(b
            .set_param_buffer("nope", b.new_param_buffer("cache").unwrap())
            .is_err());
        println!("param buffers, hybrid {hybrid}: moved without a copy, schedule kept on rebind");
    }
}

/// Every batched decode graph (1 to `MAX_DECODE_BATCH` sequences, with and
/// without sliding-window layers) plans on CUDA as one CUDA graph with no
/// op declined: what `decode_batch` captures in hybrid mode. Needs no GPU
/// (`rlx_cuda::plan` lowers with dummy addresses).
#[test]
fn decode_batch_graphs_plan_as_one_cuda_graph() {
    use rlx::ir::QuantScheme;
    use rlx::models::llama::{build_graph, LlamaConfig, LlamaWeights, Phase};
    let mut cfg = LlamaConfig::smollm2_135m();
    cfg.n_layers = 2;
    let smol = LlamaWeights::synthetic(&cfg, QuantScheme::Q4_1, QuantScheme::Q8_0, 3).unwrap();
    let gemma = {
        let path = gguf_writer::gemma3_wide("gemma3_wide_plan.gguf", 4);
        let f = rlx::formats::GgufFile::open(&path).unwrap();
        let c = LlamaConfig::from_gguf(&f).unwrap();
        LlamaWeights::load(&f, &c).unwrap()
    };
    let opts = CudaOptions {
        hybrid: true,
        ..CudaOptions::default()
    };
    for (name, w) in [("SmolLM2 dims", &smol), ("wide-head Gemma 3", &gemma)] {
        for n in [1, 2, 5, MAX_DECODE_BATCH] {
            let g = build_graph(w, Phase::DecodeBatch { batch: n }, 64).unwrap();
            let p = rlx::cuda::plan(g, &opts).unwrap();
            assert!(
                p.report.declined.is_empty(),
                "{name} N = {n}: declined {:?}",
                p.report.declined
            );
            assert_eq!(p.report.dispatches, 1, "{name} N = {n}: one CUDA graph");
        }
    }
}
