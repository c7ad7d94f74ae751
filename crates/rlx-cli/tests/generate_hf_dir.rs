//! `rlx generate --model DIR --prompt-ids ... --temperature 0 --json` on the
//! random-init Qwen3-Next and Qwen3.5 text directories of
//! `crates/rlx-models/tests/data/families` (HF `config.json` +
//! `model.safetensors`, transformers 5.24.0 references): the 24 greedy ids
//! equal transformers', and the first step's top logit equals its logit.
//! A directory of another model type and a text prompt without ids are
//! errors that say what is supported.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const RLX: &str = env!("CARGO_BIN_EXE_rlx");

fn family(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rlx-models/tests/data/families")
        .join(name)
}

#[test]
fn hf_directory_greedy_ids_match_transformers() {
    for name in ["qwen3_next", "qwen3_5"] {
        let dir = family(name);
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let case = &r["prompts"][0];
        let ids: Vec<String> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let want = case["greedy_ids"].as_array().unwrap();
        for mode in ["thunks", "hybrid"] {
            let out = Command::new(RLX)
                .args(["generate", "--model"])
                .arg(&dir)
                .args([
                    "--prompt-ids",
                    &ids.join(","),
                    "--temperature",
                    "0",
                    "--json",
                ])
                .args(["--top-logits", "3", "--ctx", "64", "--mode", mode])
                .args(["--max-tokens", &want.len().to_string()])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name} {mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let j: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(j["ids"], case["greedy_ids"], "{name} {mode}: greedy ids");
            assert_eq!(j["prompt_ids"], case["prompt_ids"], "{name} {mode}");
            // The first step's best logit equals transformers' last-position max.
            let logits: Vec<f64> = case["logits"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let max = logits.iter().cloned().fold(f64::MIN, f64::max);
            let top = j["top_logits"][0][0][1].as_f64().unwrap();
            assert!(
                (top - max).abs() <= 1e-4 * max.abs().max(1.0),
                "{name} {mode}: top logit {top} vs {max}"
            );
        }
    }
}

#[test]
fn hf_directory_errors_name_what_is_supported() {
    let tmp = std::env::temp_dir().join(format!("rlx-hf-dir-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("config.json"), r#"{"model_type": "mamba"}"#).unwrap();
    let out = Command::new(RLX)
        .args(["generate", "--model"])
        .arg(&tmp)
        .args(["--prompt-ids", "1,2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("'mamba'") && err.contains("qwen3_next"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).ok();
    let out = Command::new(RLX)
        .args(["generate", "--model"])
        .arg(family("qwen3_next"))
        .arg("hello")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--prompt-ids"), "{err}");
}
