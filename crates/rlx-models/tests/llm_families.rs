//! The GGUF LLM families (Llama 3, Qwen3, Gemma 3) against transformers:
//! small random-init models written to F32 GGUF by
//! `scripts/model_refs/llm.py` (`tests/data/families/<family>/`), with
//! transformers 5.24.0's logits for three prompts given as token ids.
//!
//! For each family, in thunks and hybrid mode on the CPU:
//! - the last position's logits after each prompt within 1e-4 of
//!   max |logit| (every logit of the vocabulary), and the top-10 at every
//!   earlier position (prefill of each prefix);
//! - the 24 greedy ids (prefill, then decode steps over the KV cache);
//! - a prompt fed in two chunks (`prefill_continue`) equal to one prefill.
//!
//! Plus: an unsupported `general.architecture` names what it found and
//! the supported list.

use rlx_cpu::CpuOptions;
use rlx_formats::GgufFile;
use rlx_models::llama::{argmax, LlamaConfig, LlamaError, LlamaModel, SUPPORTED_ARCHS};
use std::path::PathBuf;

struct Case {
    prompt: Vec<u32>,
    /// Per position: top-10 `(id, logit)`.
    top10: Vec<Vec<(u32, f32)>>,
    last: Vec<f32>,
    greedy: Vec<u32>,
}

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/families/{family}"))
}

fn cases(family: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(dir(family).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt_ids"]),
            top10: c["top10"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                        .collect()
                })
                .collect(),
            last: c["last_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
            greedy: ids(&c["greedy_ids"]),
        })
        .collect()
}

fn load(family: &str, hybrid: bool) -> LlamaModel {
    let opts = CpuOptions {
        hybrid,
        ..CpuOptions::default()
    };
    LlamaModel::load_with(dir(family).join("model.gguf"), 64, opts).unwrap()
}

fn run_family(family: &str, hybrid: bool) {
    let what = format!("{family} {}", if hybrid { "hybrid" } else { "thunks" });
    let mut m = load(family, hybrid);
    let cases = cases(family);
    assert_eq!(cases.len(), 3);
    for case in &cases {
        // Every logit of the last position.
        let logits = m.prefill(&case.prompt).unwrap();
        assert_eq!(logits.len(), case.last.len());
        let scale = case.last.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let worst = logits
            .iter()
            .zip(&case.last)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-4 * scale,
            "{what} {:?}: max |logit diff| {worst} > 1e-4 * {scale}",
            case.prompt
        );
        println!(
            "{what} prompt of {}: last logits max |diff| {worst:.2e} (max |logit| {scale:.3})",
            case.prompt.len()
        );
        // Top-10 at every earlier position (prefill of each prefix).
        for (i, top) in case.top10.iter().enumerate().take(case.prompt.len() - 1) {
            let l = m.prefill(&case.prompt[..=i]).unwrap();
            for &(id, want) in top {
                let got = l[id as usize];
                assert!(
                    (got - want).abs() <= 1e-4 * scale,
                    "{what} {:?} position {i}: logit of {id} is {got}, reference {want}",
                    case.prompt
                );
            }
            assert_eq!(argmax(&l), top[0].0, "{what} position {i}: top-1");
        }
        // 24 greedy ids: prefill, then decode over the KV cache.
        let ids = m
            .generate_greedy(&case.prompt, case.greedy.len(), None)
            .unwrap();
        assert_eq!(ids, case.greedy, "{what} {:?}: greedy ids", case.prompt);
        // Two chunks equal one prefill.
        if case.prompt.len() > 2 {
            let cut = case.prompt.len() / 2;
            m.prefill(&case.prompt[..cut]).unwrap();
            let l = m.prefill_continue(&case.prompt[cut..]).unwrap();
            let worst = l
                .iter()
                .zip(&case.last)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-4 * scale,
                "{what} {:?}: chunked prefill differs by {worst}",
                case.prompt
            );
        }
    }
}

#[test]
fn qwen3_matches_transformers_thunks() {
    run_family("qwen3", false);
}

#[test]
fn qwen3_matches_transformers_hybrid() {
    run_family("qwen3", true);
}

#[test]
fn gemma3_matches_transformers_thunks() {
    run_family("gemma3", false);
}

#[test]
fn gemma3_matches_transformers_hybrid() {
    run_family("gemma3", true);
}

#[test]
fn llama3_matches_transformers_thunks() {
    run_family("llama3", false);
}

#[test]
fn llama3_matches_transformers_hybrid() {
    run_family("llama3", true);
}

/// What the loader reads from each family's metadata.
#[test]
fn family_configs() {
    let cfg = |f: &str| {
        LlamaConfig::from_gguf(&GgufFile::open(dir(f).join("model.gguf")).unwrap()).unwrap()
    };
    let q = cfg("qwen3");
    assert_eq!(
        (q.arch.as_str(), q.head_dim, q.q_dim(), q.d_model),
        ("qwen3", 32, 128, 64)
    );
    assert!(q.block.qk_norm && !q.block.post_norms && q.block.sliding_window.is_none());
    let g = cfg("gemma3");
    assert_eq!(g.block.sliding_window, Some(6));
    assert_eq!(
        g.block.swa_layers,
        vec![true, true, true, true, true, false]
    );
    assert_eq!(g.block.final_softcap, Some(8.0));
    assert_eq!(g.block.embed_scale, Some(8.0));
    assert_eq!((g.rope_theta, g.block.rope_theta_swa), (1e6, 1e4));
    let l = cfg("llama3");
    assert!(l.block.rope_freqs);
    assert_eq!(l.rope_style, rlx_ir::RopeStyle::GptJ);
}

/// An unsupported architecture names what was found and what is supported.
#[test]
fn unsupported_architecture_is_named() {
    let src = std::fs::read(dir("qwen3").join("model.gguf")).unwrap();
    // Same-length rename of the architecture value: "qwen3" -> "mamba".
    let key = b"general.architecture";
    let at = src.windows(key.len()).position(|w| w == key).unwrap();
    let mut bytes = src.clone();
    let val = at + key.len() + 4 + 8; // type u32, then the string's u64 length
    assert_eq!(&bytes[val..val + 5], b"qwen3");
    bytes[val..val + 5].copy_from_slice(b"mamba");
    let path = std::env::temp_dir().join(format!("rlx_arch_{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let err = LlamaModel::load(&path, 16).unwrap_err();
    std::fs::remove_file(&path).ok();
    assert!(matches!(err, LlamaError::UnsupportedArch { ref arch } if arch == "mamba"));
    let msg = err.to_string();
    assert!(msg.contains("'mamba'"), "{msg}");
    for a in SUPPORTED_ARCHS {
        assert!(msg.contains(a), "{msg} should list {a}");
    }
}

/// The references exercise what each family adds: with the feature turned
/// off in the loaded config, rlx no longer matches (so the parity above is
/// not vacuous).
#[test]
fn each_family_feature_changes_the_logits() {
    use rlx_models::llama::{FfnAct, LlamaWeights};
    let off = |family: &str, edit: &dyn Fn(&mut LlamaConfig)| -> f32 {
        let f = GgufFile::open(dir(family).join("model.gguf")).unwrap();
        let mut cfg = LlamaConfig::from_gguf(&f).unwrap();
        let mut w = LlamaWeights::load(&f, &cfg).unwrap();
        edit(&mut cfg);
        if !cfg.block.rope_freqs {
            w.tensors.remove(rlx_models::llama::ROPE_FREQS);
        }
        let w = LlamaWeights { config: cfg, ..w };
        let mut m = LlamaModel::from_weights(w, 64, CpuOptions::default()).unwrap();
        let case = &cases(family)[2];
        let l = m.prefill(&case.prompt).unwrap();
        l.iter()
            .zip(&case.last)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max)
    };
    type Edit<'a> = &'a dyn Fn(&mut LlamaConfig);
    let checks: [(&str, &str, Edit); 6] = [
        ("llama3", "rope_freqs", &|c| c.block.rope_freqs = false),
        ("gemma3", "sliding window", &|c| {
            c.block.sliding_window = None
        }),
        ("gemma3", "local rope base", &|c| {
            c.block.rope_theta_swa = c.rope_theta
        }),
        ("gemma3", "final softcap", &|c| c.block.final_softcap = None),
        ("gemma3", "GELU-tanh", &|c| c.block.ffn_act = FfnAct::Silu),
        ("qwen3", "attention scale", &|c| {
            c.block.attn_scale = Some(0.1)
        }),
    ];
    for (family, what, edit) in checks {
        let d = off(family, edit);
        println!("{family} without {what}: last logits differ by {d:.3}");
        assert!(
            d > 1e-2,
            "{family}: turning off {what} changed nothing ({d})"
        );
    }
}
