//! The pieces `rlx serve` builds on, on the real models (skipped when they
//! are not fetched): `SentenceEmbedder::embed_ids` against `embed`, and
//! `LlamaModel::swap_cache` interleaving two sequences in one model against
//! running each alone.

use rlx_cpu::CpuOptions;
use rlx_models::llama::{argmax, LlamaModel};
use rlx_models::SentenceEmbedder;
use std::path::PathBuf;

fn models() -> PathBuf {
    std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))
        .unwrap_or_default()
}

#[test]
fn embed_ids_of_the_tokenized_texts_equal_embed_bit_for_bit() {
    let dir = models().join("all-minilm-l6-v2");
    if !dir.join("model.safetensors").exists() {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py minilm)");
        return;
    }
    let mut e = SentenceEmbedder::load(&dir).unwrap();
    let texts = ["a short one", "the quick brown fox jumps over the lazy dog"];
    let want = e.embed(&texts).unwrap();
    let rows: Vec<Vec<i64>> = texts
        .iter()
        .map(|t| e.tokenizer().encode(t).unwrap())
        .collect();
    assert_eq!(rows[0][0], 101, "[CLS] first");
    let got = e.embed_ids(&rows).unwrap();
    assert_eq!(got, want);
    // Bad rows are refused with the row named, not run.
    let err = e.embed_ids(&[vec![101, 102], vec![]]).unwrap_err();
    assert!(err.to_string().contains("row 1"), "{err}");
    let err = e.embed_ids(&[vec![101, 40_000_000]]).unwrap_err();
    assert!(err.to_string().contains("40000000"), "{err}");
    let err = e.embed_ids(&[vec![101; 10_000]]).unwrap_err();
    assert!(err.to_string().contains("maximum length"), "{err}");
}

fn greedy(m: &mut LlamaModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = vec![argmax(&m.prefill(prompt).unwrap())];
    while out.len() < n {
        out.push(argmax(&m.decode(*out.last().unwrap()).unwrap()));
    }
    out
}

#[test]
fn swapped_caches_interleave_two_sequences_as_if_each_ran_alone() {
    let path = models().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py smollm2)");
        return;
    }
    let opts = CpuOptions {
        hybrid: true,
        ..Default::default()
    };
    let mut m = LlamaModel::load_with(&path, 64, opts).unwrap();
    let (a, b): (Vec<u32>, Vec<u32>) = (vec![1, 504, 3458, 282], vec![1, 8493, 28, 2636, 314, 260]);
    let want_a = greedy(&mut m, &a, 8);
    let want_b = greedy(&mut m, &b, 8);
    assert_ne!(want_a, want_b);
    // Interleave: A's prefill, B's prefill, then alternate decode steps.
    let mut cache_b = m.new_cache();
    let mut got_a = vec![argmax(&m.prefill(&a).unwrap())];
    let mut cache_a = m.swap_cache(cache_b).unwrap();
    let mut got_b = vec![argmax(&m.prefill(&b).unwrap())];
    assert_eq!(cache_a.position(), a.len());
    for _ in 1..8 {
        cache_b = m.swap_cache(cache_a).unwrap();
        got_a.push(argmax(&m.decode(*got_a.last().unwrap()).unwrap()));
        cache_a = m.swap_cache(cache_b).unwrap();
        got_b.push(argmax(&m.decode(*got_b.last().unwrap()).unwrap()));
    }
    assert_eq!(got_a, want_a);
    assert_eq!(got_b, want_b);
    assert_eq!(m.position(), b.len() + 7);
    // A cache of another model's shape is refused and nothing changes.
    let mut small = LlamaModel::load_with(&path, 16, CpuOptions::default()).unwrap();
    let err = small.swap_cache(cache_a).unwrap_err();
    assert!(err.to_string().contains("[1, 16,"), "{err}");
    assert_eq!(small.position(), 0);
}
