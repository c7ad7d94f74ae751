//! The embedder's CPU shape cache on real all-MiniLM-L6-v2: padding to a
//! sequence bucket leaves embeddings unchanged, shapes share one copy of the
//! packed weights, and the cache stays within its byte budget.

use rlx_models::{EmbedOptions, SentenceEmbedder};
use rlx_runtime::{Executable, TensorRef};
use std::path::PathBuf;
use std::sync::Arc;

fn model_dir() -> Option<PathBuf> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

fn texts() -> Vec<String> {
    [1usize, 2, 5, 9, 14, 15, 16, 17, 31, 40, 70]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| {
                    [
                        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs",
                    ][i % 8]
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

#[test]
fn bucketed_sequence_lengths_give_the_unpadded_embeddings() {
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py minilm)");
        return;
    };
    let texts = texts();
    for hybrid in [false, true] {
        let load = |seq_bucket| {
            SentenceEmbedder::load_with(
                &dir,
                EmbedOptions {
                    hybrid,
                    seq_bucket,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let (mut exact, mut padded, mut wide) = (load(1), load(16), load(64));
        for t in &texts {
            let one = [t.as_str()];
            let want = exact.embed(&one).unwrap();
            for m in [&mut padded, &mut wide] {
                let got = m.embed(&one).unwrap();
                let d = max_diff(&got, &want);
                assert!(d <= 1e-5, "hybrid={hybrid} {:?}: max diff {d:e}", t);
            }
        }
        // Every single-text shape was padded to a multiple of 16 (64).
        let seqs = |m: &SentenceEmbedder| -> Vec<usize> {
            m.cache_stats().shapes.iter().map(|s| s.1).collect()
        };
        assert!(
            seqs(&padded).iter().all(|s| s % 16 == 0),
            "{:?}",
            seqs(&padded)
        );
        assert!(seqs(&wide).iter().all(|s| s % 64 == 0), "{:?}", seqs(&wide));
        assert!(seqs(&exact).iter().any(|s| s % 16 != 0));
        assert!(padded.cache_stats().compiled < exact.cache_stats().compiled);
        // Batched, every row padded further.
        let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
        let d = max_diff(&padded.embed(&refs).unwrap(), &exact.embed(&refs).unwrap());
        assert!(d <= 1e-5, "hybrid={hybrid} batched: max diff {d:e}");
    }
}

/// Run `m` (batch 1) once on `seq` tokens.
fn run(m: &mut rlx_cpu::CpuModel, seq: usize) -> &mut rlx_cpu::CpuModel {
    let ids = vec![101i64; seq];
    let types = vec![0i64; seq];
    let mask = vec![1f32; seq];
    m.run(&[
        ("input_ids", TensorRef::I64(&ids)),
        ("token_type_ids", TensorRef::I64(&types)),
        ("attention_mask", TensorRef::F32(&mask)),
    ])
    .unwrap();
    m
}

#[test]
fn shapes_share_the_packed_weights_and_the_budget_holds() {
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched");
        return;
    };
    // A budget of exactly the (1, 64) and (1, 80) shapes' arenas and plans.
    let mut probe = SentenceEmbedder::load(&dir).unwrap();
    let mut bytes = |seq| probe.model_for(1, seq, false).unwrap().plan_bytes();
    let (b64, b80) = (bytes(64), bytes(80));
    assert!(b64 > 0 && b80 > b64);
    let mut m = SentenceEmbedder::load_with(
        &dir,
        EmbedOptions {
            cache_bytes: b64 + b80,
            ..Default::default()
        },
    )
    .unwrap();
    // Weights are packed on a shape's first run.
    let first = run(m.model_for(1, 16, false).unwrap(), 16).packed_weights();
    let packed_bytes = m.model_for(1, 16, false).unwrap().packed_bytes();
    // MiniLM's matmul weights: 6 layers of 4 x 384 x 384 + 2 x 384 x 1536
    // floats (10.6M, 42 MB).
    assert!(
        packed_bytes >= 6 * (4 * 384 * 384 + 2 * 384 * 1536) * 4,
        "{packed_bytes}"
    );
    assert!(!first.is_empty());
    for seq in [32, 48, 64, 80] {
        // Shared from the start and still after running (nothing re-packed).
        let other = m.model_for(1, seq, false).unwrap();
        assert!(Arc::ptr_eq(&other.packed_weights()[0], &first[0]));
        let other = run(other, seq);
        let p = other.packed_weights();
        assert_eq!(p.len(), first.len());
        assert!(
            p.iter().zip(&first).all(|(a, b)| Arc::ptr_eq(a, b)),
            "seq {seq}"
        );
        assert_eq!(other.packed_bytes(), packed_bytes);
    }
    let s = m.cache_stats();
    // 16, 32 and 48 were dropped, least recently used first, to fit.
    assert_eq!(s.shapes, vec![(1, 64, false), (1, 80, false)], "{s:?}");
    assert_eq!(s.plan_bytes, b64 + b80);
    assert_eq!((s.compiled, s.evicted), (5, 3));
    // Held by `first` and every cached shape: one copy.
    assert_eq!(Arc::strong_count(&first[0]), 1 + s.shapes.len());
    // An evicted shape comes back (compiled again) with the same weights.
    let again = m.model_for(1, 16, false).unwrap().packed_weights();
    assert!(Arc::ptr_eq(&again[0], &first[0]));
    assert_eq!(m.cache_stats().compiled, 6);
}
