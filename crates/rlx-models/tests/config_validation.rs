//! Untrusted BERT configs and weights: every bad hyper-parameter in a copy
//! of the MiniLM directory (`config.json` or `sentence_bert_config.json`
//! edited, the 90 MB safetensors symlinked) is an error naming the key, its
//! value and what was expected, returned before anything sized by it is
//! allocated; and a NaN or Inf weight in a tiny crafted BERT is an error
//! (naming the first node producing it with `RLX_CHECK_FINITE=1`), never
//! `null` embeddings.

use rlx_models::bert::{synthetic_params, BertConfig};
use rlx_models::{ConfigError, EmbedOptions, ModelError, SentenceEmbedder};
use rlx_runtime::RuntimeError;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Serializes the tests that run models against the one that sets
/// `RLX_CHECK_FINITE` (read when a model compiles).
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn minilm() -> Option<PathBuf> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-cfg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A copy of `src` (files symlinked) with `file`'s JSON key `key` set to
/// `value`.
fn mutated(src: &Path, name: &str, file: &str, key: &str, value: Value) -> PathBuf {
    let d = tmp(name);
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_name() != file {
            std::os::unix::fs::symlink(e.path(), d.join(e.file_name())).unwrap();
        }
    }
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join(file)).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(d.join(file), v.to_string()).unwrap();
    d
}

#[test]
fn bad_config_values_name_key_value_and_expectation() {
    let Some(m) = minilm() else {
        eprintln!("skipped: MiniLM not fetched");
        return;
    };
    let cases: Vec<(&str, &str, Value, Vec<&str>)> = vec![
        (
            "config.json",
            "num_attention_heads",
            json!(0),
            vec![
                "num_attention_heads = 0",
                "expected a positive divisor of hidden_size 384",
            ],
        ),
        (
            "config.json",
            "num_attention_heads",
            json!(5),
            vec!["num_attention_heads = 5", "hidden_size 384"],
        ),
        (
            "config.json",
            "num_attention_heads",
            json!(-1),
            vec!["num_attention_heads = -1", "a positive integer"],
        ),
        (
            "config.json",
            "num_hidden_layers",
            json!(10_000_000),
            vec!["num_hidden_layers = 10000000", "1..=4096"],
        ),
        (
            "config.json",
            "num_hidden_layers",
            json!(7),
            vec![
                "num_hidden_layers = 7",
                "encoder layers in model.safetensors (6)",
            ],
        ),
        (
            "config.json",
            "num_hidden_layers",
            json!(5),
            vec!["num_hidden_layers = 5", "(6)"],
        ),
        (
            "config.json",
            "layer_norm_eps",
            json!(-1),
            vec!["layer_norm_eps = -1", "a positive finite number"],
        ),
        (
            "config.json",
            "layer_norm_eps",
            json!("tiny"),
            vec!["layer_norm_eps = \"tiny\"", "a positive finite number"],
        ),
        (
            "config.json",
            "hidden_size",
            json!(0),
            vec!["hidden_size = 0", "a positive integer"],
        ),
        (
            "config.json",
            "hidden_size",
            json!(768),
            vec![
                "hidden_size = 768",
                "embeddings.word_embeddings.weight [30522, 384]",
            ],
        ),
        (
            "config.json",
            "vocab_size",
            json!(100),
            vec![
                "vocab_size = 100",
                "rows of embeddings.word_embeddings.weight",
                "(30522)",
            ],
        ),
        (
            "config.json",
            "max_position_embeddings",
            json!(100000),
            vec!["max_position_embeddings = 100000", "(512)"],
        ),
        (
            "config.json",
            "type_vocab_size",
            json!(7),
            vec!["type_vocab_size = 7", "(2)"],
        ),
        (
            "config.json",
            "intermediate_size",
            json!(10),
            vec!["intermediate_size = 10", "(1536)"],
        ),
        (
            "config.json",
            "intermediate_size",
            json!(null),
            vec!["intermediate_size = (missing)", "a positive integer"],
        ),
        (
            "sentence_bert_config.json",
            "max_seq_length",
            json!("abc"),
            vec![
                "max_seq_length = \"abc\"",
                "positive integer <= max_position_embeddings 512",
            ],
        ),
        (
            "sentence_bert_config.json",
            "max_seq_length",
            json!(-5),
            vec!["max_seq_length = -5", "max_position_embeddings 512"],
        ),
        (
            "sentence_bert_config.json",
            "max_seq_length",
            json!(0),
            vec!["max_seq_length = 0"],
        ),
        (
            "sentence_bert_config.json",
            "max_seq_length",
            json!(1000),
            vec!["max_seq_length = 1000", "max_position_embeddings 512"],
        ),
    ];
    for (i, (file, key, value, wants)) in cases.into_iter().enumerate() {
        let dir = mutated(&m, &format!("c{i}"), file, key, value.clone());
        let t = std::time::Instant::now();
        let err = SentenceEmbedder::load(&dir)
            .err()
            .unwrap_or_else(|| panic!("{file}: {key} = {value} was accepted"));
        assert!(
            t.elapsed().as_secs() < 20,
            "{key} = {value}: took {:?}",
            t.elapsed()
        );
        let msg = err.to_string();
        assert!(
            matches!(&err, ModelError::InvalidConfig(ConfigError { key: k, .. }) if k == key),
            "{key} = {value}: {msg}"
        );
        assert!(msg.contains(file), "{msg}");
        for w in wants {
            assert!(msg.contains(w), "{key} = {value}: {msg:?} lacks {w:?}");
        }
        // `rlx plan` / `rlx bench` read the same checked config.
        let plan = rlx_models::bert::load_dir_config(&dir)
            .unwrap_err()
            .to_string();
        assert_eq!(plan, msg);
        let _ = std::fs::remove_dir_all(&dir);
    }
    // An unknown activation is an unsupported architecture, not a panic.
    let dir = mutated(&m, "act", "config.json", "hidden_act", json!("swoosh"));
    let err = SentenceEmbedder::load(&dir).err().unwrap();
    assert!(
        matches!(err, ModelError::UnknownArchitecture { .. }),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sequence_longer_than_the_position_table_names_max_position_embeddings() {
    let cfg = BertConfig::minilm_l6();
    let outs = rlx_models::bert::BertOutputs {
        pooled: true,
        tokens: false,
    };
    let msg = rlx_models::bert::build_graph(&cfg, 1, 1000, outs)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("seq = 1000") && msg.contains("max_position_embeddings"),
        "{msg}"
    );
    assert!(msg.contains("1..=512"), "{msg}");
    // seq 1e9 is refused before the position constant (8 bytes a row) is built.
    let t = std::time::Instant::now();
    assert!(rlx_models::bert::build_graph(&cfg, 1, 1_000_000_000, outs).is_err());
    assert!(t.elapsed().as_millis() < 1000);
    for (b, s) in [(0, 8), (1, 0)] {
        assert!(rlx_models::bert::build_graph(&cfg, b, s, outs).is_err());
    }
    let bad = BertConfig {
        num_attention_heads: 0,
        ..BertConfig::minilm_l6()
    };
    let msg = rlx_models::bert::build_graph(&bad, 1, 8, outs)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("num_attention_heads = 0"), "{msg}");
}

/// Write `tensors` (name, shape, f32 values) as a safetensors file.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, v) in tensors {
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

/// A one-layer BERT of width 8 (MiniLM's tokenizer, random weights) with
/// `poison` written into element 0 of tensor `bad`.
fn tiny_bert(m: &Path, name: &str, bad: &str, poison: f32) -> PathBuf {
    let cfg = BertConfig {
        hidden_size: 8,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        intermediate_size: 16,
        max_position_embeddings: 64,
        ..BertConfig::minilm_l6()
    };
    let d = tmp(name);
    std::os::unix::fs::symlink(m.join("tokenizer.json"), d.join("tokenizer.json")).unwrap();
    std::fs::write(
        d.join("config.json"),
        json!({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 16, "vocab_size": cfg.vocab_size, "max_position_embeddings": 64,
            "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
            "architectures": ["BertModel"], "model_type": "bert"})
        .to_string(),
    )
    .unwrap();
    let mut values = synthetic_params(&cfg, 3);
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = cfg
        .params()
        .into_iter()
        .zip(values.iter_mut())
        .map(|((name, dims, transposed), (_, v))| {
            if name == bad {
                v[0] = poison;
            }
            // The values' layout does not matter here; the stored shape does.
            let stored = if transposed {
                vec![dims[1], dims[0]]
            } else {
                dims
            };
            (name, stored, std::mem::take(v))
        })
        .collect();
    write_safetensors(&d.join("model.safetensors"), &tensors);
    d
}

#[test]
fn non_finite_weights_are_an_error_not_null_embeddings() {
    let Some(m) = minilm() else {
        eprintln!("skipped: MiniLM not fetched");
        return;
    };
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    // A healthy tiny model embeds finitely.
    let ok = tiny_bert(&m, "ok", "", 0.0);
    let e = SentenceEmbedder::load(&ok)
        .unwrap()
        .embed(&["hello world"])
        .unwrap();
    assert!(e[0].iter().all(|v| v.is_finite()));
    for (name, bad, poison) in [
        ("nan", "embeddings.LayerNorm.weight", f32::NAN),
        (
            "inf",
            "encoder.layer.0.attention.output.dense.bias",
            f32::INFINITY,
        ),
    ] {
        let dir = tiny_bert(&m, name, bad, poison);
        // Default: one check of the outputs after the run.
        for hybrid in [false, true] {
            let opts = EmbedOptions {
                hybrid,
                ..Default::default()
            };
            let err = SentenceEmbedder::load_with(&dir, opts)
                .unwrap()
                .embed(&["hello world"])
                .unwrap_err();
            let msg = err.to_string();
            if std::env::var_os("RLX_CHECK_FINITE").is_none() {
                assert!(
                    matches!(err, ModelError::NonFinite { output: 0, .. }),
                    "{name}: {msg}"
                );
                assert!(msg.contains("RLX_CHECK_FINITE=1"), "{msg}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&ok);
}

#[test]
fn check_finite_env_names_the_first_node() {
    let Some(m) = minilm() else {
        eprintln!("skipped: MiniLM not fetched");
        return;
    };
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tiny_bert(
        &m,
        "nan-env",
        "encoder.layer.0.intermediate.dense.bias",
        f32::NAN,
    );
    // Read when a model is compiled (on the first embed of a shape).
    std::env::set_var("RLX_CHECK_FINITE", "1");
    let opts = EmbedOptions {
        hybrid: false,
        optimize: false,
        ..Default::default()
    };
    let r = SentenceEmbedder::load_with(&dir, opts)
        .unwrap()
        .embed(&["hello world"]);
    std::env::remove_var("RLX_CHECK_FINITE");
    let err = r.unwrap_err();
    let msg = err.to_string();
    // Unoptimized thunks: the bias Add after the FFN matmul is the first
    // node producing NaN.
    match &err {
        ModelError::Runtime(RuntimeError::NonFinite { op, shape, .. }) => {
            assert_eq!(op, "Binary(Add)", "{msg}");
            assert_eq!(shape.dims.last(), Some(&16), "{msg}");
        }
        _ => panic!("expected NonFinite from the executor, got {msg}"),
    }
    assert!(
        msg.contains("produced a non-finite value") && msg.contains("NaN"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
