//! GGUF byte-level BPE tokenizer: parity with the HuggingFace reference ids
//! in `tests/data/smollm2_logits.json` (real SmolLM2 GGUF), round trips,
//! streaming, and error handling on hand-built vocabularies.

use std::path::PathBuf;

use rlx_formats::GgufFile;
use rlx_models::gguf_tokenizer::{
    byte_level_char, GgufTokenizer, GgufTokenizerError, PreTokenizerKind, TokenType,
};

/// The fetched SmolLM2 GGUF (`scripts/fetch_models.py smollm2`).
fn model_path() -> PathBuf {
    let root = match std::env::var_os("RLX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/rlx/models")
        }
    };
    root.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The real tokenizer, or `None` (after printing why) when the model is absent.
fn smollm2() -> Option<GgufTokenizer> {
    let path = model_path();
    if !path.is_file() {
        println!(
            "skipped: model not fetched ({} missing; run python3 scripts/fetch_models.py smollm2)",
            path.display()
        );
        return None;
    }
    let gguf = GgufFile::open(&path).expect("open SmolLM2 GGUF");
    Some(GgufTokenizer::from_gguf(&gguf).expect("build tokenizer from GGUF"))
}

struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_text: String,
}

fn reference() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/smollm2_logits.json"
    );
    let text = std::fs::read_to_string(path).expect("read smollm2_logits.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("parse smollm2_logits.json");
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .expect("id array")
            .iter()
            .map(|i| i.as_u64().expect("id") as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().expect("prompt").to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            greedy_ids: ids(&c["greedy_ids"]),
            greedy_text: c["greedy_text"].as_str().expect("greedy_text").to_string(),
        })
        .collect()
}

const ROUND_TRIP: &[&str] = &[
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\nend",
    "digits 0123456789 and 3.14159, -42, 1e10, 2024-01-22",
    "emoji: 😀🎉👩‍👩‍👧‍👦 🇫🇷 🦀",
    "unicode: naïve café, Zürich, Ελληνικά, Русский, 日本語のテキスト, 한국어, עברית, العربية",
    "combining: e\u{301} a\u{308} and zero-width\u{200b}joiner",
    "code: fn main() { println!(\"{}\", x[0] >= 1 && y != 'c'); }",
    "I'm sure they'll've done it, we're told; it's JOHN'S",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "\u{0}\u{1}\u{7f} control bytes",
];

#[test]
fn reference_prompts_encode_to_hf_ids() {
    let Some(tok) = smollm2() else { return };
    for case in reference() {
        let ids = tok.encode(&case.prompt, false).expect("encode");
        assert_eq!(ids, case.prompt_ids, "prompt {:?}", case.prompt);
        assert_eq!(tok.decode(&ids).expect("decode"), case.prompt);
    }
}

#[test]
fn greedy_ids_decode_to_reference_text() {
    let Some(tok) = smollm2() else { return };
    for case in reference() {
        let text = tok.decode(&case.greedy_ids).expect("decode");
        assert_eq!(text, case.greedy_text);
        // Streaming yields the same text.
        let mut dec = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &case.greedy_ids {
            if let Some(piece) = dec.push(id).expect("push") {
                streamed.push_str(&piece);
            }
        }
        assert_eq!(dec.finish(), None);
        assert_eq!(streamed, case.greedy_text);
    }
}

#[test]
fn metadata_and_special_ids() {
    let Some(tok) = smollm2() else { return };
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.pre_tokenizer(), "smollm");
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.pad_id(), Some(2));
    assert_eq!(tok.unk_id(), Some(0));
    assert!(!tok.add_bos_default());
    assert_eq!(tok.token_text(1).unwrap(), "<|im_start|>");
    assert_eq!(tok.token_text(2).unwrap(), "<|im_end|>");
    assert_eq!(tok.token_type(2).unwrap(), TokenType::Control);
    assert_eq!(tok.token_type(761).unwrap(), TokenType::Normal);
    assert_eq!(tok.token_text(761).unwrap(), "Ġhad");
    assert_eq!(tok.token_bytes(761).unwrap(), b" had");
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert!(tok.is_end_of_generation(2));
    assert!(tok.is_end_of_generation(0));
    assert!(!tok.is_end_of_generation(761));
    // BOS on request.
    let ids = tok.encode("The capital of France is", true).unwrap();
    assert_eq!(ids, vec![1, 504, 3575, 282, 4649, 314]);
}

#[test]
fn digits_are_split_individually() {
    let Some(tok) = smollm2() else { return };
    // " 2018" from the reference greedy output: a lone space, then one token per digit.
    let ids = tok.encode(" 2018", false).unwrap();
    assert_eq!(ids, vec![216, 34, 32, 33, 40]);
    let ids = tok.encode("1234567890", false).unwrap();
    assert_eq!(ids.len(), 10);
    for (id, d) in ids.iter().zip("1234567890".chars()) {
        assert_eq!(tok.decode(&[*id]).unwrap(), d.to_string());
    }
}

#[test]
fn special_tokens_in_text_are_single_ids() {
    let Some(tok) = smollm2() else { return };
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(ids.iter().filter(|&&i| i <= 16).count(), 2);
}

#[test]
fn round_trips() {
    let Some(tok) = smollm2() else { return };
    for &s in ROUND_TRIP {
        let ids = tok.encode(s, false).unwrap();
        assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
        assert_eq!(
            tok.decode(&ids).unwrap(),
            s,
            "round trip of {s:?} via {ids:?}"
        );
    }
    let long: String = ROUND_TRIP.concat().repeat(20);
    let ids = tok.encode(&long, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), long);
}

#[test]
fn streaming_matches_decode_and_never_splits_characters() {
    let Some(tok) = smollm2() else { return };
    let mut held_back = 0;
    for &s in ROUND_TRIP {
        let ids = tok.encode(s, false).unwrap();
        let mut dec = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            match dec.push(id).unwrap() {
                Some(piece) => {
                    assert!(!piece.contains('\u{FFFD}'), "{s:?}: piece {piece:?}");
                    out.push_str(&piece);
                }
                None => held_back += 1,
            }
        }
        assert_eq!(dec.pending_bytes(), 0);
        assert_eq!(dec.finish(), None);
        assert_eq!(out, tok.decode(&ids).unwrap());
        assert_eq!(out, s);
    }
    // Multi-byte characters split across tokens were exercised.
    assert!(held_back > 0, "no token ended inside a UTF-8 character");
}

#[test]
fn streaming_invalid_utf8_matches_lossy_decode() {
    let Some(tok) = smollm2() else { return };
    // Tokens that are single raw bytes: 0xF0 (4-byte lead), 0x9F, 0x80 (continuations), 'a'.
    let byte_id = |b: u8| {
        tok.token_id(&byte_level_char(b).to_string())
            .unwrap_or_else(|| panic!("no single-byte token for {b:#x}"))
    };
    let seqs: Vec<Vec<u32>> = vec![
        vec![byte_id(0x80), byte_id(b'a')],
        vec![byte_id(0xF0), byte_id(0x9F), byte_id(b'a')],
        vec![byte_id(0xF0), byte_id(0x9F)],
        vec![byte_id(b'a'), byte_id(0xF0), byte_id(0x9F), byte_id(0x80)],
    ];
    for ids in seqs {
        let mut dec = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            if let Some(p) = dec.push(id).unwrap() {
                out.push_str(&p);
            }
        }
        if let Some(p) = dec.finish() {
            out.push_str(&p);
        }
        let whole = tok.decode(&ids).unwrap();
        assert!(whole.contains('\u{FFFD}'));
        assert_eq!(out, whole, "ids {ids:?}");
    }
}

#[test]
fn unknown_id_is_a_typed_error() {
    let Some(tok) = smollm2() else { return };
    let err = tok.decode(&[5, 49152]).unwrap_err();
    match &err {
        GgufTokenizerError::UnknownTokenId { id, vocab_size } => {
            assert_eq!((*id, *vocab_size), (49152, 49152));
        }
        other => panic!("expected UnknownTokenId, got {other:?}"),
    }
    assert!(err.to_string().contains("49152"));
    let mut dec = tok.stream_decoder();
    assert!(matches!(
        dec.push(u32::MAX),
        Err(GgufTokenizerError::UnknownTokenId { id: u32::MAX, .. })
    ));
}

// ---- hand-built vocabularies (no model file needed) ----

/// All 256 byte-level characters, then `extra` merged tokens.
fn toy_tokens(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = (0..=255u8)
        .map(|b| byte_level_char(b).to_string())
        .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn toy(extra: &[&str], merges: &[&str], pre: &str) -> Result<GgufTokenizer, GgufTokenizerError> {
    let tokens = toy_tokens(extra);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    GgufTokenizer::from_parts(&refs, None, merges, pre)
}

#[test]
fn byte_level_alphabet() {
    assert_eq!(byte_level_char(b' '), 'Ġ');
    assert_eq!(byte_level_char(b'\n'), 'Ċ');
    assert_eq!(byte_level_char(b'a'), 'a');
    assert_eq!(byte_level_char(0), '\u{100}');
    let mut all: Vec<char> = (0..=255u8).map(byte_level_char).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 256, "byte-level alphabet must be a bijection");
}

#[test]
fn toy_merges_follow_rank_order() {
    // ids: 256 "ab", 257 "abc", 258 "Ġa", 259 "bc"
    let tok = toy(
        &["ab", "abc", "Ġa", "bc"],
        &["a b", "ab c", "Ġ a", "b c"],
        "smollm",
    )
    .unwrap();
    assert_eq!(tok.vocab_size(), 260);
    // "abc": "a b" outranks "b c", then "ab c".
    assert_eq!(tok.encode("abc", false).unwrap(), vec![257]);
    // " abd": "a b" (rank 0) outranks "Ġ a" (rank 2), so the space stays alone.
    assert_eq!(
        tok.encode(" abd", false).unwrap(),
        vec![byte_id_in_toy(b' '), 256, byte_id_in_toy(b'd')]
    );
    // " ac": only "Ġ a" applies.
    assert_eq!(
        tok.encode(" ac", false).unwrap(),
        vec![258, byte_id_in_toy(b'c')]
    );
    assert_eq!(
        tok.decode(&tok.encode(" abd abc", false).unwrap()).unwrap(),
        " abd abc"
    );
    // No BOS defined.
    assert!(matches!(
        tok.encode("a", true),
        Err(GgufTokenizerError::NoBos { .. })
    ));
}

/// Id of byte `b` in [`toy_tokens`] (tokens are in byte order).
fn byte_id_in_toy(b: u8) -> u32 {
    b as u32
}

#[test]
fn digit_splitting_depends_on_pre_type() {
    let merges = ["1 2", "12 3"];
    let extra = ["12", "123"];
    let smollm = toy(&extra, &merges, "smollm").unwrap();
    let gpt2 = toy(&extra, &merges, "gpt2").unwrap();
    assert_eq!(
        smollm.encode("123", false).unwrap(),
        vec![
            byte_id_in_toy(b'1'),
            byte_id_in_toy(b'2'),
            byte_id_in_toy(b'3')
        ]
    );
    assert_eq!(gpt2.encode("123", false).unwrap(), vec![257]);
    assert_eq!(
        PreTokenizerKind::from_pre("smollm"),
        Some(PreTokenizerKind::DigitsThenGpt2)
    );
    assert_eq!(
        PreTokenizerKind::from_pre("gpt2"),
        Some(PreTokenizerKind::Gpt2)
    );
    assert_eq!(PreTokenizerKind::from_pre("llama-bpe"), None);
}

#[test]
fn construction_errors_are_typed() {
    assert!(matches!(
        toy(&[], &[], "llama-bpe"),
        Err(GgufTokenizerError::UnsupportedPreTokenizer { ref pre, .. }) if pre == "llama-bpe"
    ));
    assert!(matches!(
        toy(&["ab"], &["a b c"], "smollm"),
        Err(GgufTokenizerError::BadMerge { index: 0, .. })
    ));
    assert!(matches!(
        toy(&["ab"], &["ab"], "smollm"),
        Err(GgufTokenizerError::BadMerge { index: 0, .. })
    ));
    // Merge result missing from the vocabulary.
    assert!(matches!(
        toy(&[], &["a b"], "smollm"),
        Err(GgufTokenizerError::Backend { stage: "build", .. })
    ));
    // A normal token outside the byte-level alphabet (a literal space).
    let err = toy(&["a b"], &[], "smollm").unwrap_err();
    assert!(matches!(
        err,
        GgufTokenizerError::NotByteLevel {
            id: 256,
            ch: ' ',
            ..
        }
    ));
    let tokens = toy_tokens(&[]);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    assert!(matches!(
        GgufTokenizer::from_parts(&refs, Some(&[1, 1]), &[], "smollm"),
        Err(GgufTokenizerError::TokenTypeCount {
            found: 2,
            expected: 256,
            ..
        })
    ));
    assert!(matches!(
        GgufTokenizer::from_parts(&[], None, &[], "smollm"),
        Err(GgufTokenizerError::EmptyVocab { .. })
    ));
}

#[test]
fn control_tokens_decode_verbatim_and_encode_whole() {
    let mut tokens = toy_tokens(&[]);
    tokens.push("<|end|>".to_string());
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![1; 256];
    types.push(3);
    let tok = GgufTokenizer::from_parts(&refs, Some(&types), &[], "gpt2").unwrap();
    assert_eq!(
        tok.encode("a<|end|>", false).unwrap(),
        vec![b'a' as u32, 256]
    );
    assert_eq!(tok.decode(&[256]).unwrap(), "<|end|>");
    assert!(tok.is_end_of_generation(256));
}

/// Token ids from llama.cpp's own tokenizer for the same GGUF
/// (llama-cpp-python 0.3.16, `Llama(vocab_only=True).tokenize(text, add_bos=False,
/// special=True)`), an implementation independent of HF `tokenizers`.
const LLAMA_CPP_IDS: &[(&str, &[u32])] = &[
    (
        "Hello, world!",
        &[19556, 28, 905, 17],
    ),
    (
        "  leading and trailing spaces  ",
        &[216, 2899, 284, 35079, 5600, 256],
    ),
    (
        "tabs\tand\nnewlines\r\n\n\nend",
        &[100, 7366, 197, 397, 198, 2241, 5110, 201, 1116, 198, 486],
    ),
    (
        "digits 0123456789 and 3.14159, -42, 1e10, 2024-01-22",
        &[37307, 216, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 284, 216, 35, 30, 33, 36, 33, 37, 41, 28, 731, 36, 34, 28, 216, 33, 85, 33, 32, 28, 216, 34, 32, 34, 36, 29, 32, 33, 29, 34, 34],
    ),
    (
        "emoji: \u{1f600}\u{1f389}\u{1f469}\u{200d}\u{1f469}\u{200d}\u{1f467}\u{200d}\u{1f466} \u{1f1eb}\u{1f1f7} \u{1f980}",
        &[391, 33777, 42, 40303, 218, 10813, 232, 227, 10813, 235, 119, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235, 116, 15107, 225, 121, 10813, 225, 132, 15107, 116, 218],
    ),
    (
        "unicode: naïve café, Zürich, Ελληνικά, Русский, 日本語のテキスト, 한국어, עברית, العربية",
        &[35852, 42, 15486, 46494, 37366, 28, 1777, 7170, 5130, 28, 5664, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 28, 5470, 250, 14714, 9382, 39511, 7872, 24958, 28, 17097, 241, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 28, 216, 33085, 246, 181, 130, 251, 183, 240, 129, 28, 12960, 112, 37657, 30825, 28532, 120, 28, 27819, 34966, 20602, 31462, 23339, 43463],
    ),
    (
        "combining: e\u{301} a\u{308} and zero-width\u{200b}joiner",
        &[14558, 1294, 42, 297, 151, 219, 253, 151, 226, 284, 6708, 29, 6930, 321, 229, 4849, 259],
    ),
    (
        "code: fn main() { println!(\"{}\", x[0] >= 1 && y != 'c'); }",
        &[4635, 42, 24526, 1085, 1000, 1662, 1628, 34115, 17, 43331, 1002, 1792, 75, 32, 77, 10888, 216, 33, 1456, 22, 329, 6541, 637, 83, 48375, 4029],
    ),
    (
        "I'm sure they'll've done it, we're told; it's JOHN'S",
        &[57, 5248, 2090, 502, 3060, 3543, 2294, 357, 28, 392, 2316, 3783, 43, 357, 506, 530, 18692, 62, 23, 67],
    ),
    (
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        &[1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198],
    ),
    (
        "\u{0}\u{1}\u{7f} control bytes",
        &[190, 191, 217, 1533, 15590],
    ),
];

#[test]
fn matches_llama_cpp_tokenizer() {
    let Some(tok) = smollm2() else { return };
    for &(text, ids) in LLAMA_CPP_IDS {
        assert_eq!(tok.encode(text, false).unwrap(), ids, "text {text:?}");
    }
}
