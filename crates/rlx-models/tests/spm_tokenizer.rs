//! GGUF SentencePiece tokenizer (`tokenizer.ggml.model = llama`, llama.cpp's
//! SPM): parity with transformers' tokenizer built from the real
//! Gemma-3-270M GGUF (`tests/data/gemma3_270m_tokens.json` and the prompt ids
//! of `tests/data/gemma3_270m_logits.json`, `scripts/gen_model_refs.py
//! gemma3-270m-tokens`), and score-ordered merges, tie-breaks, byte fallback,
//! the unknown token, special-token splitting and errors on hand-built
//! vocabularies. The Gemma tests print "skipped" when the model has not been
//! fetched (`python3 scripts/fetch_models.py gemma3`).

use std::path::PathBuf;

use rlx_formats::GgufFile;
use rlx_models::gguf_tokenizer::{parse_byte_token, GgufTokenizer, GgufTokenizerError};

fn gemma3() -> Option<GgufTokenizer> {
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let p = dir.join("gemma-3-270m/gemma-3-270m-q4_k_m.gguf");
    if !p.is_file() {
        println!(
            "skipped: model not fetched ({} missing; run python3 scripts/fetch_models.py gemma3)",
            p.display()
        );
        return None;
    }
    let gguf = GgufFile::open(&p).expect("open Gemma 3 GGUF");
    Some(GgufTokenizer::from_gguf(&gguf).expect("build tokenizer from GGUF"))
}

fn json(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

/// Decodes `ids` one token at a time through a [`StreamDecoder`].
fn stream(tok: &GgufTokenizer, ids: &[u32]) -> String {
    let mut dec = tok.stream_decoder();
    let mut s = String::new();
    for &id in ids {
        if let Some(p) = dec.push(id).unwrap() {
            s.push_str(&p);
        }
    }
    s.push_str(&dec.finish().unwrap_or_default());
    s
}

#[test]
fn gemma3_metadata() {
    let Some(tok) = gemma3() else { return };
    assert!(tok.is_sentencepiece());
    assert!(!tok.add_space_prefix());
    assert!(tok.add_bos_default());
    assert!(!tok.add_eos_default());
    assert_eq!(tok.vocab_size(), 262144);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()),
        (Some(2), Some(1), Some(3), Some(0))
    );
    assert_eq!(tok.token_text(105).unwrap(), "<start_of_turn>");
    assert_eq!(tok.token_id("<end_of_turn>"), Some(106));
    assert!(tok.is_end_of_generation(1));
    assert!(tok.is_end_of_generation(106));
    assert!(!tok.is_end_of_generation(818));
    // "▁The" decodes with a space; <0x0D> is a carriage return.
    assert_eq!(tok.decode(&[818]).unwrap(), "The");
    assert_eq!(tok.token_bytes(506).unwrap(), b" the");
    assert_eq!(tok.token_bytes(251).unwrap(), b"\r");
}

#[test]
fn gemma3_prompt_ids_match_transformers() {
    let Some(tok) = gemma3() else { return };
    let v = json("gemma3_270m_logits.json");
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for c in cases {
        let prompt = c["prompt"].as_str().unwrap();
        let want = ids(&c["prompt_ids"]);
        assert_eq!(
            tok.encode(prompt, tok.add_bos_default()).unwrap(),
            want,
            "{prompt:?}"
        );
    }
}

#[test]
fn gemma3_varied_texts_match_transformers() {
    let Some(tok) = gemma3() else { return };
    let v = json("gemma3_270m_tokens.json");
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let mut round_trips = 0;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["ids"]);
        let decoded = c["decoded"].as_str().unwrap();
        assert_eq!(tok.encode(text, false).unwrap(), want, "encode {text:?}");
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&c["ids_with_bos"]),
            "encode with BOS {text:?}"
        );
        assert_eq!(tok.decode(&want).unwrap(), decoded, "decode {text:?}");
        assert_eq!(stream(&tok, &want), decoded, "stream decode {text:?}");
        if decoded == text {
            let again = tok.encode(text, false).unwrap();
            assert_eq!(tok.decode(&again).unwrap(), text, "round trip {text:?}");
            round_trips += 1;
        }
    }
    assert!(round_trips >= 30, "{round_trips} texts round-trip");
}

#[test]
fn gemma3_stream_decoder_holds_split_characters() {
    let Some(tok) = gemma3() else { return };
    // U+00A0 is not in the vocabulary: byte tokens <0xC2> <0xA0>.
    let ids = tok.encode("\u{a0}", false).unwrap();
    assert_eq!(ids, vec![432, 398]);
    let mut dec = tok.stream_decoder();
    assert_eq!(dec.push(432).unwrap(), None);
    assert_eq!(dec.pending_bytes(), 1);
    assert_eq!(dec.push(398).unwrap().as_deref(), Some("\u{a0}"));
    assert_eq!(dec.finish(), None);
    // A lone continuation byte is invalid UTF-8.
    assert_eq!(tok.decode(&[398]).unwrap(), "\u{fffd}");
}

// ---------------------------------------------------------------- synthetic

/// Ids: 0 `<unk>` (unknown), 1 `<s>`, 2 `</s>` (control), 3..=258 byte
/// tokens `<0x00>`..`<0xFF>`, then the normal `pieces` (with scores).
fn toy_parts(pieces: &[(&str, f32)], bytes: bool) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0, 0.0, 0.0];
    let mut types = vec![2, 3, 3];
    if bytes {
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(6);
        }
    }
    for &(p, s) in pieces {
        tokens.push(p.to_string());
        scores.push(s);
        types.push(1);
    }
    (tokens, scores, types)
}

fn toy(
    pieces: &[(&str, f32)],
    bytes: bool,
    prefix: bool,
) -> Result<GgufTokenizer, GgufTokenizerError> {
    let (tokens, scores, types) = toy_parts(pieces, bytes);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    GgufTokenizer::from_spm_parts(&refs, &scores, Some(&types), prefix)
}

const PIECES: &[(&str, f32)] = &[
    ("▁", -1.0),  // 259
    ("a", -1.0),  // 260
    ("b", -1.0),  // 261
    ("c", -1.0),  // 262
    ("ab", 1.0),  // 263
    ("bc", 2.0),  // 264
    ("ba", 1.0),  // 265
    ("▁a", 3.0),  // 266
    ("abc", 0.5), // 267
    ("aa", 1.0),  // 268
];

fn id(text: &str) -> u32 {
    259 + PIECES.iter().position(|(p, _)| *p == text).unwrap() as u32
}

#[test]
fn higher_score_merges_first() {
    let tok = toy(PIECES, true, false).unwrap();
    // "bc" (2.0) beats "ab" (1.0); then "a"+"bc" = "abc" is a token.
    assert_eq!(tok.encode("abc", false).unwrap(), vec![id("abc")]);
    // "bcb": "bc" first, then "bcb" is not a token.
    assert_eq!(tok.encode("bcb", false).unwrap(), vec![id("bc"), id("b")]);
    // "abab": both "ab" (1.0) and "ba" (1.0): leftmost "ab", then the next
    // leftmost live pair "ab" again.
    assert_eq!(tok.encode("abab", false).unwrap(), vec![id("ab"), id("ab")]);
}

#[test]
fn equal_scores_merge_leftmost_first() {
    let tok = toy(PIECES, true, false).unwrap();
    assert_eq!(tok.encode("aba", false).unwrap(), vec![id("ab"), id("a")]);
    assert_eq!(tok.encode("bab", false).unwrap(), vec![id("ba"), id("b")]);
    assert_eq!(tok.encode("aaa", false).unwrap(), vec![id("aa"), id("a")]);
}

#[test]
fn spaces_become_u2581_and_the_prefix_is_optional() {
    let plain = toy(PIECES, true, false).unwrap();
    assert_eq!(
        plain.encode("a b", false).unwrap(),
        vec![id("a"), id("▁"), id("b")]
    );
    assert_eq!(plain.encode(" a", false).unwrap(), vec![id("▁a")]);
    assert_eq!(plain.encode("", false).unwrap(), Vec::<u32>::new());
    let prefixed = toy(PIECES, true, true).unwrap();
    assert!(prefixed.add_space_prefix());
    // "▁ab": "▁a" (3.0) beats "ab" (1.0).
    assert_eq!(
        prefixed.encode("ab", false).unwrap(),
        vec![id("▁a"), id("b")]
    );
    // decode drops the prefix space again; the stream decoder keeps it.
    assert_eq!(prefixed.decode(&[id("▁a"), id("b")]).unwrap(), "ab");
    assert_eq!(stream(&prefixed, &[id("▁a"), id("b")]), " ab");
    assert_eq!(plain.decode(&[id("▁a"), id("b")]).unwrap(), " ab");
    // Empty text has no fragment, so no prefix either (as llama.cpp).
    assert_eq!(prefixed.encode("", false).unwrap(), Vec::<u32>::new());
}

#[test]
fn special_tokens_are_split_out_first() {
    let plain = toy(PIECES, true, false).unwrap();
    assert_eq!(
        plain.encode("ab</s>ba<s>", false).unwrap(),
        vec![id("ab"), 2, id("ba"), 1]
    );
    // With the prefix, the text after a special token gets a space too.
    let prefixed = toy(PIECES, true, true).unwrap();
    assert_eq!(
        prefixed.encode("a<s>a", false).unwrap(),
        vec![id("▁a"), 1, id("▁a")]
    );
    assert_eq!(plain.decode(&[id("ab"), 2, id("ba")]).unwrap(), "ab</s>ba");
    assert!(plain.is_end_of_generation(2));
    assert!(!plain.is_end_of_generation(id("ab")));
}

#[test]
fn unknown_pieces_fall_back_to_bytes_then_unk() {
    let tok = toy(PIECES, true, false).unwrap();
    // "é" = C3 A9 and "x" are not pieces: one byte token per UTF-8 byte.
    assert_eq!(
        tok.encode("éx", false).unwrap(),
        vec![3 + 0xC3, 3 + 0xA9, 3 + b'x' as u32]
    );
    assert_eq!(tok.decode(&[3 + 0xC3, 3 + 0xA9, id("a")]).unwrap(), "éa");
    assert_eq!(tok.token_bytes(3 + 0x0A).unwrap(), b"\n");
    assert_eq!(tok.unk_id(), Some(0));
    // Without byte tokens every unknown character is one <unk> (pieces
    // start at id 3 here).
    let no_bytes = toy(PIECES, false, false).unwrap();
    let nb = |p: &str| id(p) - 256;
    assert_eq!(no_bytes.unk_id(), Some(0));
    assert_eq!(
        no_bytes.encode("aéxb", false).unwrap(),
        vec![nb("a"), 0, 0, nb("b")]
    );
    assert_eq!(no_bytes.decode(&[nb("a"), 0]).unwrap(), "a<unk>");
}

#[test]
fn bad_input_is_an_error() {
    // No byte tokens and no unknown token: the unencodable byte is named.
    let tokens = ["a", "b"];
    let tok = GgufTokenizer::from_spm_parts(&tokens, &[0.0, 0.0], None, false).unwrap();
    assert_eq!(tok.unk_id(), None);
    assert_eq!(tok.encode("ab", false).unwrap(), vec![0, 1]);
    match tok.encode("aé", false) {
        Err(GgufTokenizerError::Unencodable { piece, byte }) => {
            assert_eq!((piece.as_str(), byte), ("é", 0xC3))
        }
        other => panic!("expected Unencodable, got {other:?}"),
    }
    assert!(matches!(
        tok.encode("a", true),
        Err(GgufTokenizerError::NoBos { .. })
    ));
    assert!(matches!(
        tok.decode(&[2]),
        Err(GgufTokenizerError::UnknownTokenId {
            id: 2,
            vocab_size: 2
        })
    ));
    assert!(matches!(
        GgufTokenizer::from_spm_parts(&tokens, &[0.0], None, false),
        Err(GgufTokenizerError::ScoreCount {
            found: 1,
            expected: 2,
            ..
        })
    ));
    assert!(matches!(
        GgufTokenizer::from_spm_parts(&tokens, &[0.0, 0.0], Some(&[1]), false),
        Err(GgufTokenizerError::TokenTypeCount { .. })
    ));
    assert!(matches!(
        GgufTokenizer::from_spm_parts(&[], &[], None, false),
        Err(GgufTokenizerError::EmptyVocab { .. })
    ));
    match GgufTokenizer::from_spm_parts(&["a", "<0xZZ>"], &[0.0, 0.0], Some(&[1, 6]), false) {
        Err(GgufTokenizerError::BadByteToken { id, token }) => {
            assert_eq!((id, token.as_str()), (1, "<0xZZ>"))
        }
        other => panic!("expected BadByteToken, got {other:?}"),
    }
    assert_eq!(parse_byte_token("<0x0A>"), Some(10));
    assert_eq!(parse_byte_token("<0xfF>"), Some(255));
    assert_eq!(parse_byte_token("<0x100>"), None);
    assert_eq!(parse_byte_token("0x41"), None);
}
