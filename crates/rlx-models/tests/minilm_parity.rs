//! all-MiniLM-L6-v2 embeddings against the PyTorch reference
//! (tests/data/minilm_embeddings.json, see tests/data/README.md): token ids
//! exactly equal; every embedding within 1e-4 max-abs and cosine >= 0.99999;
//! thunks and hybrid; batched and one sentence at a time.

use rlx_models::{EmbedOptions, SentenceEmbedder};
use std::path::PathBuf;

fn model_dir() -> Option<PathBuf> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

#[path = "support/reference.rs"]
mod reference;

use reference::MinilmCase as Case;

fn cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/minilm_embeddings.json"
    );
    reference::parse_minilm_embeddings(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn check(got: &[f32], want: &[f32], what: &str) {
    let max_abs = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let dot: f32 = got.iter().zip(want).map(|(a, b)| a * b).sum();
    let na = got.iter().map(|a| a * a).sum::<f32>().sqrt();
    let nb = want.iter().map(|a| a * a).sum::<f32>().sqrt();
    let cos = dot / (na * nb);
    assert!(max_abs <= 1e-4, "{what}: max abs error {max_abs:e}");
    assert!(cos >= 0.99999, "{what}: cosine {cos}");
}

#[test]
fn minilm_matches_pytorch_in_every_mode() {
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py minilm)");
        return;
    };
    let cases = cases();
    assert_eq!(cases.len(), 12);
    for hybrid in [false, true] {
        let mut m = SentenceEmbedder::load_with(
            &dir,
            EmbedOptions {
                hybrid,
                ..Default::default()
            },
        )
        .unwrap();
        for c in &cases {
            let batch = m.tokenizer().encode_batch(&[c.text.as_str()]).unwrap();
            assert_eq!(
                batch.row_ids(0).unwrap(),
                &c.ids[..],
                "token ids of {:?}",
                c.text
            );
        }
        let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
        let batched = m.embed(&texts).unwrap();
        for (c, got) in cases.iter().zip(&batched) {
            check(
                got,
                &c.emb,
                &format!("hybrid={hybrid} batched {:?}", c.text),
            );
        }
        for c in &cases {
            let one = m.embed(&[c.text.as_str()]).unwrap();
            check(
                &one[0],
                &c.emb,
                &format!("hybrid={hybrid} single {:?}", c.text),
            );
        }
    }
}

/// Opt-in f16 weight storage (`EmbedOptions::f16_weights`): the issue's
/// bound is 1e-3 max-abs against the PyTorch reference; the embeddings must
/// also really differ from the f32 ones (the f16 path is taken).
#[test]
fn minilm_with_f16_weights_stays_within_1e_3() {
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py minilm)");
        return;
    };
    let cases = cases();
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let f32_emb = SentenceEmbedder::load(&dir).unwrap().embed(&texts).unwrap();
    for hybrid in [false, true] {
        let opts = EmbedOptions {
            hybrid,
            f16_weights: true,
            ..Default::default()
        };
        let got = SentenceEmbedder::load_with(&dir, opts)
            .unwrap()
            .embed(&texts)
            .unwrap();
        let mut worst = 0f32;
        let mut moved = 0f32;
        for ((c, g), f) in cases.iter().zip(&got).zip(&f32_emb) {
            for ((a, b), x) in g.iter().zip(&c.emb).zip(f) {
                worst = worst.max((a - b).abs());
                moved = moved.max((a - x).abs());
            }
            let cos: f32 = g.iter().zip(&c.emb).map(|(a, b)| a * b).sum();
            assert!(cos >= 0.9999, "hybrid={hybrid} {:?}: cosine {cos}", c.text);
        }
        assert!(worst <= 1e-3, "hybrid={hybrid}: max abs error {worst:e}");
        assert!(moved > 1e-6, "hybrid={hybrid}: f16 weights changed nothing");
        println!("hybrid={hybrid}: max abs error {worst:e} (f32 vs f16 weights {moved:e})");
    }
}

/// Opt-in bf16 matmuls (`EmbedOptions::bf16`: weights and the activations
/// they multiply rounded to bf16, f32 accumulation; AVX512-BF16 where the
/// CPU has it, the portable kernel in the same order elsewhere): every
/// sentence keeps a cosine >= 0.9999 to the PyTorch reference, in thunks
/// and hybrid mode, and the embeddings really move (the bf16 path is taken).
#[test]
fn minilm_in_bf16_keeps_cosine_0_9999() {
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py minilm)");
        return;
    };
    let cases = cases();
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let f32_emb = SentenceEmbedder::load(&dir).unwrap().embed(&texts).unwrap();
    for hybrid in [false, true] {
        let opts = EmbedOptions {
            hybrid,
            bf16: true,
            ..Default::default()
        };
        let got = SentenceEmbedder::load_with(&dir, opts)
            .unwrap()
            .embed(&texts)
            .unwrap();
        let mut worst = 1f32;
        let mut moved = 0f32;
        for ((c, g), f) in cases.iter().zip(&got).zip(&f32_emb) {
            let cos: f32 = g.iter().zip(&c.emb).map(|(a, b)| a * b).sum();
            worst = worst.min(cos);
            assert!(cos >= 0.9999, "hybrid={hybrid} {:?}: cosine {cos}", c.text);
            for (a, x) in g.iter().zip(f) {
                moved = moved.max((a - x).abs());
            }
        }
        assert!(moved > 1e-5, "hybrid={hybrid}: bf16 changed nothing");
        println!("hybrid={hybrid}: worst cosine {worst} (f32 vs bf16 max abs {moved:e})");
    }
}

#[test]
fn bad_model_directories_are_clear_errors() {
    let tmp = std::env::temp_dir().join(format!("rlx-bad-model-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let err = SentenceEmbedder::load(&tmp)
        .err()
        .expect("empty dir must fail")
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::write(tmp.join("config.json"), r#"{"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 16, "model_type": "gpt2", "architectures": ["GPT2Model"]}"#).unwrap();
    let err = SentenceEmbedder::load(&tmp)
        .err()
        .expect("gpt2 must fail")
        .to_string();
    assert!(err.contains("unsupported architecture"), "{err}");
    std::fs::write(tmp.join("config.json"), "{not json").unwrap();
    let err = SentenceEmbedder::load(&tmp)
        .err()
        .expect("bad json must fail")
        .to_string();
    assert!(err.contains("invalid JSON"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}
