//! The model families of `crates/rlx-models/tests/data/families/` on a CUDA
//! GPU, against the same transformers / sentence-transformers references
//! as the CPU tests (`rlx-models/tests/families.rs` and `llm_families.rs`),
//! in CUDA thunks and hybrid mode:
//!
//! - sentence embedders (BERT with every pooling mode, GTE-like, XLM-R,
//!   MPNet with relative position buckets, ModernBERT with rotary and
//!   windowed local layers): every case's token ids and
//!   embedding (cos >= 0.99999, max abs <= 1e-4), batched per prompt group;
//! - GGUF decoders (Llama 3 with `rope_freqs`, Qwen3, Gemma 3): the last
//!   position's logits within 1e-4 of max |logit| and the 24 greedy ids.
//!
//! Skips with a message when no CUDA device is present
//! (`RLX_REQUIRE_CUDA=1` turns that into a failure).
#![cfg(feature = "cuda")]

use rlx::cuda::CudaOptions;
use rlx::models::llama::{LlamaDevice, LlamaModel};
use rlx::models::{EmbedDevice, EmbedOptions, SentenceEmbedder};
use serde_json::Value;
use std::path::PathBuf;

mod common;
use common::cuda_or_skip;

/// A family's directory: beside this crate when the test runs where it was
/// built, else relative to the repository root (the GPU machine runs the
/// test binaries from a copy of the working tree).
fn family(name: &str) -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rlx-models/tests/data/families")
        .join(name);
    if built.exists() {
        built
    } else {
        PathBuf::from("crates/rlx-models/tests/data/families").join(name)
    }
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(family(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn opts(hybrid: bool) -> CudaOptions {
    CudaOptions {
        hybrid,
        ..CudaOptions::default()
    }
}

/// Every case of an embedding family, batched per prompt group.
fn check_embedder(name: &str) {
    let r = reference(name);
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 10, "{name}: {} cases", cases.len());
    let mut groups: Vec<(Option<String>, Vec<&Value>)> = Vec::new();
    for c in cases {
        let pn = c["prompt_name"].as_str().map(str::to_string);
        match groups.iter_mut().find(|(p, _)| *p == pn) {
            Some((_, v)) => v.push(c),
            None => groups.push((pn, vec![c])),
        }
    }
    for hybrid in [false, true] {
        let mut m = SentenceEmbedder::load_on(
            family(name),
            EmbedOptions::default(),
            EmbedDevice::Cuda(opts(hybrid)),
        )
        .unwrap();
        let (mut worst_cos, mut worst_abs) = (1f64, 0f32);
        for (pn, cs) in &groups {
            let prompt = m.st_config().prompt(pn.as_deref()).unwrap().to_string();
            let texts: Vec<&str> = cs.iter().map(|c| c["text"].as_str().unwrap()).collect();
            for (c, t) in cs.iter().zip(&texts) {
                let got: Vec<u64> = m
                    .tokenizer()
                    .encode(&format!("{prompt}{t}"))
                    .unwrap()
                    .into_iter()
                    .map(|i| i as u64)
                    .collect();
                assert_eq!(got, ids(&c["ids"]), "{name}: ids of {t:?}");
            }
            let got = m.embed_with_prompt(&texts, pn.as_deref()).unwrap();
            for ((c, t), got) in cs.iter().zip(&texts).zip(&got) {
                let want = floats(&c["embedding"]);
                assert_eq!(got.len(), want.len(), "{name}: dim");
                let abs = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let dot: f64 = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                let na: f64 = got.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
                let nb: f64 = want.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
                let cos = dot / (na * nb);
                worst_cos = worst_cos.min(cos);
                worst_abs = worst_abs.max(abs);
                assert!(
                    cos >= 0.99999 && abs <= 1e-4,
                    "{name} cuda hybrid={hybrid} {t:?} prompt {pn:?}: cosine {cos}, max abs {abs:e}"
                );
            }
        }
        println!(
            "{name} cuda hybrid={hybrid}: worst cosine {worst_cos}, worst max abs {worst_abs:e}"
        );
    }
}

/// The last-position logits and the greedy ids of each prompt.
fn check_decoder(name: &str) {
    let r = reference(name);
    for hybrid in [false, true] {
        let what = format!("{name} cuda {}", if hybrid { "hybrid" } else { "thunks" });
        let mut m = LlamaModel::load_on(
            family(name).join("model.gguf"),
            64,
            LlamaDevice::Cuda(opts(hybrid)),
        )
        .unwrap();
        for c in r["cases"].as_array().unwrap() {
            let prompt: Vec<u32> = ids(&c["prompt_ids"]).iter().map(|&i| i as u32).collect();
            let last = floats(&c["last_logits"]);
            let logits = m.prefill(&prompt).unwrap();
            assert_eq!(logits.len(), last.len(), "{what}: vocabulary");
            let scale = last.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let worst = logits
                .iter()
                .zip(&last)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-4 * scale,
                "{what} {prompt:?}: max |logit diff| {worst} > 1e-4 * {scale}"
            );
            let want: Vec<u32> = ids(&c["greedy_ids"]).iter().map(|&i| i as u32).collect();
            let got = m.generate_greedy(&prompt, want.len(), None).unwrap();
            assert_eq!(got, want, "{what} {prompt:?}: greedy ids");
            println!(
                "{what} prompt of {}: last logits max |diff| {worst:.2e} (max |logit| {scale:.3}), {} greedy ids equal",
                prompt.len(),
                got.len()
            );
        }
    }
}

#[test]
fn embedding_families_match_sentence_transformers_on_cuda() {
    if !cuda_or_skip() {
        return;
    }
    for name in [
        "bert_cls",
        "bert_mean",
        "bert_max",
        "bert_last",
        "gte",
        "xlmr",
        "mpnet",
        "modernbert",
        "modernbert_bias",
    ] {
        check_embedder(name);
    }
}

#[test]
fn llama3_matches_transformers_on_cuda() {
    if cuda_or_skip() {
        check_decoder("llama3");
    }
}

#[test]
fn qwen3_matches_transformers_on_cuda() {
    if cuda_or_skip() {
        check_decoder("qwen3");
    }
}

#[test]
fn gemma3_matches_transformers_on_cuda() {
    if cuda_or_skip() {
        check_decoder("gemma3");
    }
}
