//! `SentenceEmbedder::embed_many` / `embed_ids_many` on real
//! all-MiniLM-L6-v2: texts of many lengths, batched by padded length and
//! split into runs, give each text's embedding alone bit for bit (the
//! server's dynamic batches and the Python `encode` run this way).

use rlx_models::{plan_runs, EmbedOptions, SentenceEmbedder};
use std::path::PathBuf;

fn model_dir() -> Option<PathBuf> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

/// Texts of 1 to 60 words (3 to ~70 tokens), some lengths repeated, in no
/// particular order.
fn texts() -> Vec<String> {
    let words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dogs",
        "while",
        "compilers",
        "schedule",
        "kernels",
    ];
    [
        7usize, 1, 13, 2, 7, 30, 5, 13, 3, 60, 9, 9, 9, 4, 22, 1, 16, 11, 7,
    ]
    .iter()
    .enumerate()
    .map(|(k, &n)| {
        (0..n)
            .map(|i| words[(i * 5 + k) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    })
    .collect()
}

#[test]
fn many_texts_in_few_runs_equal_each_text_alone_bit_for_bit() {
    let Some(dir) = model_dir() else {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py minilm)");
        return;
    };
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for hybrid in [true, false] {
        for seq_bucket in [4, 16] {
            let opts = EmbedOptions {
                hybrid,
                seq_bucket,
                ..Default::default()
            };
            let mut alone = SentenceEmbedder::load_with(&dir, opts).unwrap();
            let mut m = SentenceEmbedder::load_with(&dir, opts).unwrap();
            let want: Vec<Vec<f32>> = refs
                .iter()
                .map(|t| alone.embed(&[t]).unwrap().remove(0))
                .collect();
            // All in one call, and with runs of at most 2 (groups split).
            for max_rows in [1024, 2] {
                let got = m.embed_many(&refs, max_rows).unwrap();
                assert_eq!(got.len(), refs.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g, w,
                        "hybrid={hybrid} bucket={seq_bucket} max_rows={max_rows} text {i}"
                    );
                }
            }
            // Token states too (the Python encode(normalize=False) path).
            let (e, t) = m.embed_many_with_tokens(&refs, 3).unwrap();
            for (i, text) in refs.iter().enumerate() {
                let (e1, t1) = alone.embed_with_tokens(&[text]).unwrap();
                assert_eq!(e[i], e1[0], "tokens path, text {i}");
                assert_eq!(t[i], t1[0], "token states, text {i}");
            }
            // Rows of ids: as embed_ids of each row alone.
            let rows: Vec<Vec<i64>> = refs
                .iter()
                .map(|t| alone.tokenizer().encode(t).unwrap())
                .collect();
            let got = m.embed_ids_many(&rows, 4).unwrap();
            for (i, r) in rows.iter().enumerate() {
                assert_eq!(got[i], alone.embed_ids(std::slice::from_ref(r)).unwrap()[0]);
                assert_eq!(got[i], want[i], "ids row {i} vs its text");
            }
        }
    }
}

#[test]
fn the_plan_groups_by_padded_length_and_keeps_every_row_once() {
    let lengths = [9usize, 3, 12, 4, 13, 9, 200, 5, 8, 16];
    let runs = plan_runs(&lengths, 4, 128, 2, usize::MAX);
    let mut seen: Vec<usize> = runs.iter().flatten().copied().collect();
    seen.sort();
    assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
    let pad = |l: usize| rlx_models::padded_len(l, 4, 128);
    for r in &runs {
        assert!(!r.is_empty() && r.len() <= 2, "{runs:?}");
        assert!(
            r.iter().all(|&i| pad(lengths[i]) == pad(lengths[r[0]])),
            "{runs:?}"
        );
    }
    // Shortest first (3, 4, 5 and 8 tokens all pad to 8, the least); a
    // length past the model's maximum keeps its own.
    assert_eq!(pad(lengths[runs[0][0]]), 8);
    assert_eq!(runs[0].len() + runs[1].len(), 4);
    assert_eq!(pad(200), 200);
}
