//! Tokenizer parity against the sentence-transformers reference ids in
//! `tests/data/minilm_embeddings.json`, plus error handling for bad files.

use std::path::PathBuf;

use rlx_models::tokenizer::{BertTokenizer, TokenizerError, DEFAULT_MAX_SEQ_LEN};

/// Directory of the fetched all-MiniLM-L6-v2 model (`scripts/fetch_models.py`).
fn model_dir() -> PathBuf {
    let root = match std::env::var_os("RLX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/rlx/models")
        }
    };
    root.join("all-minilm-l6-v2")
}

/// The fetched model dir, or `None` (after printing why) when it is absent.
fn fetched_model() -> Option<PathBuf> {
    let dir = model_dir();
    if dir.join("tokenizer.json").is_file() {
        Some(dir)
    } else {
        println!(
            "skipped: model not fetched ({} missing; run python3 scripts/fetch_models.py minilm)",
            dir.join("tokenizer.json").display()
        );
        None
    }
}

struct Reference {
    sentences: Vec<String>,
    token_ids: Vec<Vec<i64>>,
}

fn reference() -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/minilm_embeddings.json"
    );
    let text = std::fs::read_to_string(path).expect("reference data is checked in");
    let v: serde_json::Value = serde_json::from_str(&text).expect("reference data is valid JSON");
    let sentences = v["sentences"]
        .as_array()
        .expect("sentences array")
        .iter()
        .map(|s| s.as_str().expect("sentence string").to_string())
        .collect();
    let token_ids = v["token_ids"]
        .as_array()
        .expect("token_ids array")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("token_ids row")
                .iter()
                .map(|x| x.as_i64().expect("integer id"))
                .collect()
        })
        .collect();
    Reference {
        sentences,
        token_ids,
    }
}

#[test]
fn ids_match_reference_one_by_one() {
    let Some(dir) = fetched_model() else { return };
    let tok = BertTokenizer::from_dir(&dir, None).expect("load tokenizer");
    assert_eq!(tok.max_seq_len(), DEFAULT_MAX_SEQ_LEN);
    let r = reference();
    assert_eq!(r.sentences.len(), 12);
    for (s, want) in r.sentences.iter().zip(&r.token_ids) {
        let got = tok.encode(s).expect("encode");
        assert_eq!(&got, want, "token ids differ for sentence {s:?}");
    }
}

#[test]
fn batch_is_padded_masked_and_matches_reference() {
    let Some(dir) = fetched_model() else { return };
    let tok = BertTokenizer::from_dir(&dir, None).expect("load tokenizer");
    let r = reference();
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let b = tok.encode_batch(&texts).expect("encode batch");
    assert_eq!(b.batch, texts.len());
    let longest = r.token_ids.iter().map(Vec::len).max().unwrap();
    assert_eq!(longest, 256, "the reference truncates one sentence to 256");
    assert_eq!(b.seq, longest);
    assert_eq!(b.ids.len(), b.batch * b.seq);
    assert_eq!(b.attention_mask.len(), b.batch * b.seq);
    assert_eq!(b.token_type_ids.len(), b.batch * b.seq);
    let pad = i64::from(tok.pad_id());
    assert_eq!(pad, 0, "[PAD] is id 0 in the MiniLM vocab");
    for (i, want) in r.token_ids.iter().enumerate() {
        assert_eq!(b.lengths[i], want.len());
        assert_eq!(b.row_ids(i).unwrap(), want.as_slice(), "row {i}");
        let row = i * b.seq..(i + 1) * b.seq;
        for (j, k) in row.enumerate() {
            let real = j < want.len();
            assert_eq!(
                b.attention_mask[k],
                if real { 1.0 } else { 0.0 },
                "mask {i},{j}"
            );
            assert_eq!(b.token_type_ids[k], 0);
            if !real {
                assert_eq!(b.ids[k], pad, "pad id at {i},{j}");
            }
        }
    }
}

#[test]
fn short_batch_pads_to_its_own_longest() {
    let Some(dir) = fetched_model() else { return };
    let tok = BertTokenizer::from_dir(&dir, None).expect("load tokenizer");
    let b = tok.encode_batch(&["Hello world", ""]).expect("encode");
    assert_eq!((b.batch, b.seq), (2, 4));
    assert_eq!(b.ids, vec![101, 7592, 2088, 102, 101, 102, 0, 0]);
    assert_eq!(b.attention_mask, vec![1., 1., 1., 1., 1., 1., 0., 0.]);
    assert_eq!(b.lengths, vec![4, 2]);
}

#[test]
fn explicit_max_seq_len_truncates_keeping_cls_and_sep() {
    let Some(dir) = fetched_model() else { return };
    let tok = BertTokenizer::from_dir(&dir, Some(5)).expect("load tokenizer");
    let ids = tok
        .encode("The quick brown fox jumps over the lazy dog.")
        .unwrap();
    assert_eq!(ids, vec![101, 1996, 4248, 2829, 102]);
    assert!(matches!(
        BertTokenizer::from_dir(&dir, Some(1)),
        Err(TokenizerError::InvalidMaxSeqLen { got: 1, min: 2 })
    ));
}

#[test]
fn empty_batch_is_an_error() {
    let Some(dir) = fetched_model() else { return };
    let tok = BertTokenizer::from_dir(&dir, None).expect("load tokenizer");
    assert!(matches!(
        tok.encode_batch(&[]),
        Err(TokenizerError::EmptyBatch)
    ));
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-tok-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn missing_tokenizer_json_names_the_file() {
    let d = scratch_dir("missing");
    let err = BertTokenizer::from_dir(&d, None).unwrap_err();
    match &err {
        TokenizerError::Io { path, .. } => assert_eq!(path, &d.join("tokenizer.json")),
        other => panic!("expected Io error, got {other:?}"),
    }
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn corrupt_tokenizer_json_is_a_parse_error() {
    let d = scratch_dir("corrupt");
    let path = d.join("tokenizer.json");
    for bad in ["{ this is not json", "{\"version\": \"1.0\"}", ""] {
        std::fs::write(&path, bad).unwrap();
        let err = BertTokenizer::from_dir(&d, Some(16)).unwrap_err();
        match &err {
            TokenizerError::Parse { path: p, .. } => assert_eq!(p, &path),
            other => panic!("expected Parse error for {bad:?}, got {other:?}"),
        }
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn truncated_real_tokenizer_json_is_a_parse_error() {
    let Some(dir) = fetched_model() else { return };
    let bytes = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let d = scratch_dir("truncated");
    std::fs::write(d.join("tokenizer.json"), &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(
        BertTokenizer::from_dir(&d, None),
        Err(TokenizerError::Parse { .. })
    ));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn corrupt_sentence_bert_config_is_a_config_error() {
    let Some(dir) = fetched_model() else { return };
    let d = scratch_dir("badcfg");
    std::fs::copy(dir.join("tokenizer.json"), d.join("tokenizer.json")).unwrap();
    std::fs::write(
        d.join("sentence_bert_config.json"),
        "{\"max_seq_length\": \"long\"}",
    )
    .unwrap();
    let err = BertTokenizer::from_dir(&d, None).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Config { path, .. } if path.ends_with("sentence_bert_config.json")),
        "{err:?}"
    );
    // A missing config falls back to the default length; an explicit one wins.
    std::fs::remove_file(d.join("sentence_bert_config.json")).unwrap();
    let tok = BertTokenizer::from_dir(&d, None).unwrap();
    assert_eq!(tok.max_seq_len(), DEFAULT_MAX_SEQ_LEN);
    std::fs::write(
        d.join("sentence_bert_config.json"),
        "{\"max_seq_length\": 64}",
    )
    .unwrap();
    assert_eq!(BertTokenizer::from_dir(&d, None).unwrap().max_seq_len(), 64);
    std::fs::remove_dir_all(&d).ok();
}
