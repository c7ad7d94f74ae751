//! `rlx generate --model GGUF --prompt-ids 17,200,5 --temperature 0 --json
//! --top-logits 10` on the random-init Qwen3 of
//! `crates/rlx-models/tests/data/families/qwen3` (transformers 5.24.0
//! reference): the ids go in untokenized, the 24 greedy ids and the first
//! step's top-10 logits equal transformers'; bad ids are an error, not a
//! panic.

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
fn prompt_ids_json_matches_transformers() {
    let dir = family("qwen3");
    let model = dir.join("model.gguf");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let case = &r["cases"][0];
    assert_eq!(case["prompt_ids"], serde_json::json!([17, 200, 5]));
    for mode in ["thunks", "hybrid"] {
        let out = Command::new(RLX)
            .args(["generate", "--model"])
            .arg(&model)
            .args([
                "--prompt-ids",
                "17,200,5",
                "--temperature",
                "0",
                "--json",
                "--top-logits",
                "10",
                "--max-tokens",
                "24",
                "--ctx",
                "64",
                "--mode",
                mode,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["prompt_ids"], case["prompt_ids"], "{mode}");
        assert_eq!(j["ids"], case["greedy_ids"], "{mode}: greedy ids");
        assert!(j["text"].is_string());
        let tops = j["top_logits"].as_array().unwrap();
        assert_eq!(tops.len(), 24);
        let first = tops[0].as_array().unwrap();
        let want = case["top10"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(first.len(), 10);
        for (g, w) in first.iter().zip(want) {
            assert_eq!(g[0], w[0], "{mode}: top-10 ids in order");
            let (g, w) = (g[1].as_f64().unwrap(), w[1].as_f64().unwrap());
            assert!((g - w).abs() < 1e-4, "{mode}: logit {g} vs reference {w}");
        }
        println!("{mode}: 24 greedy ids and the top-10 logits equal transformers'");
    }
}

#[test]
fn bad_prompt_ids_are_errors() {
    let model = family("qwen3").join("model.gguf");
    let run = |ids: &str| {
        Command::new(RLX)
            .args(["generate", "--model"])
            .arg(&model)
            .args([
                "--prompt-ids",
                ids,
                "--max-tokens",
                "2",
                "--ctx",
                "16",
                "--json",
            ])
            .output()
            .unwrap()
    };
    let out = run("5,320");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("token id 320") && err.contains("vocabulary of 320"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let out = run("5,x");
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    // A text prompt and --prompt-ids together are refused.
    let out = Command::new(RLX)
        .args(["generate", "hello", "--model"])
        .arg(&model)
        .args(["--prompt-ids", "5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
