//! Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M, architecture `qwen2`: q/k/v
//! biases, NeoX rope, θ 1e6, `qwen2` pre-tokenizer) against llama.cpp
//! (`tests/data/qwen2_llamacpp.json`, written by
//! `scripts/gen_qwen2_reference.py`): token ids exactly, the top-1 next
//! token, and the top-10 logits within 0.5 (llama.cpp rounds activations to
//! 8 bits; rlx here runs f32 activations). Skipped (with a message) unless
//! the model was fetched with `python3 scripts/fetch_models.py qwen2` (it
//! is not part of `all`: 469 MiB). Run it with `--release`: K-quant
//! matmuls take the generic dequantize-a-row path.

use rlx_formats::GgufFile;
use rlx_ir::RopeStyle;
use rlx_models::gguf_tokenizer::GgufTokenizer;
use rlx_models::llama::{argmax, bias_name, LlamaConfig, LlamaModel, LlamaWeights};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    top10_next: Vec<(u32, f32)>,
    greedy_ids: Vec<u32>,
}

fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let p = dir.join("qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        println!(
            "skipped: model not fetched ({} missing; run scripts/fetch_models.py qwen2)",
            p.display()
        );
        None
    }
}

fn reference() -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/qwen2_llamacpp.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn qwen2_matches_llamacpp() {
    let Some(path) = model_path() else { return };
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(cfg.arch, "qwen2");
    assert_eq!(cfg.rope_style, RopeStyle::NeoX);
    assert_eq!(
        (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads),
        (24, 896, 14, 2)
    );
    assert_eq!(cfg.rope_theta, 1e6);
    let w = LlamaWeights::load(&f, &cfg).unwrap();
    // Every layer's q/k/v projections carry a bias (merged or not).
    for l in 0..cfg.n_layers {
        let merged = bias_name(&format!("blk.{l}.attn_qkv.weight"));
        let parts =
            ["attn_q", "attn_k", "attn_v"].map(|p| bias_name(&format!("blk.{l}.{p}.weight")));
        assert!(
            w.tensors.contains_key(&merged) || parts.iter().all(|p| w.tensors.contains_key(p)),
            "layer {l}: no q/k/v bias"
        );
    }
    let tok = GgufTokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.pre_tokenizer(), "qwen2");
    let mut m = LlamaModel::from_weights(w, 64, Default::default()).unwrap();
    for case in &reference().cases {
        let ids = tok.encode(&case.prompt, false).unwrap();
        assert_eq!(ids, case.prompt_ids, "{:?}: token ids", case.prompt);
        let logits = m.prefill(&ids).unwrap();
        let mut worst = 0.0f32;
        for &(id, want) in &case.top10_next {
            let got = logits[id as usize];
            worst = worst.max((got - want).abs());
            assert!(
                (got - want).abs() <= 0.5,
                "{:?}: logit of {id} is {got}, llama.cpp {want}",
                case.prompt
            );
        }
        assert_eq!(
            argmax(&logits),
            case.top10_next[0].0,
            "{:?}: top-1",
            case.prompt
        );
        let greedy = m
            .generate_greedy(&ids, case.greedy_ids.len(), None)
            .unwrap();
        let same = greedy
            .iter()
            .zip(&case.greedy_ids)
            .take_while(|(a, b)| a == b)
            .count();
        println!(
            "{:?}: top-10 max |diff| {worst:.3}, greedy agrees with llama.cpp for {same}/{} tokens: {:?}",
            case.prompt,
            greedy.len(),
            tok.decode(&greedy).unwrap_or_default()
        );
    }
}
