//! `rlx generate --json --top-logits K` and `--chat` on the fetched
//! SmolLM2 (skipped when it is not fetched): the JSON object agrees with
//! the streamed text, greedy ids are the top logit of each step, and
//! `--chat` wraps the prompt in the model's template.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const RLX: &str = env!("CARGO_BIN_EXE_rlx");

fn have_model() -> bool {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))
        .unwrap_or_default();
    let ok = root
        .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
        .exists();
    if !ok {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py smollm2)");
    }
    ok
}

fn run(args: &[&str]) -> String {
    let out = Command::new(RLX).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn json_agrees_with_the_stream_and_greedy_ids_are_the_top_logits() {
    if !have_model() {
        return;
    }
    let prompt = "The capital of France is";
    let plain = run(&["generate", prompt, "--max-tokens", "6"]);
    let j: Value = serde_json::from_str(&run(&[
        "generate",
        prompt,
        "--max-tokens",
        "6",
        "--json",
        "--top-logits",
        "3",
    ]))
    .unwrap();
    assert_eq!(format!("{}\n", j["text"].as_str().unwrap()), plain);
    let ids = j["ids"].as_array().unwrap();
    let tops = j["top_logits"].as_array().unwrap();
    assert!(!ids.is_empty() && ids.len() <= 6);
    assert_eq!(ids.len(), tops.len());
    for (id, top) in ids.iter().zip(tops) {
        let top = top.as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(&top[0][0], id, "greedy picks the largest logit");
        let l: Vec<f64> = top.iter().map(|p| p[1].as_f64().unwrap()).collect();
        assert!(l[0] >= l[1] && l[1] >= l[2], "{l:?}");
    }
    assert!(!j["prompt_ids"].as_array().unwrap().is_empty());
}

#[test]
fn chat_applies_the_models_template() {
    if !have_model() {
        return;
    }
    let q = "What is the capital of France?";
    let plain: Value =
        serde_json::from_str(&run(&["generate", q, "--max-tokens", "1", "--json"])).unwrap();
    let chat: Value = serde_json::from_str(&run(&[
        "generate",
        q,
        "--max-tokens",
        "24",
        "--json",
        "--chat",
    ]))
    .unwrap();
    let (p, c) = (
        plain["prompt_ids"].as_array().unwrap(),
        chat["prompt_ids"].as_array().unwrap(),
    );
    // The template adds turns around the question: its ids appear inside.
    assert!(c.len() > p.len() + 4, "{} vs {}", c.len(), p.len());
    assert!(c.windows(p.len()).any(|w| w == p.as_slice()));
    assert!(
        chat["text"].as_str().unwrap().contains("Paris"),
        "{}",
        chat["text"]
    );
}

/// The fetched Gemma-3-270M Q4_K_M (SentencePiece tokenizer), if present.
fn gemma3() -> Option<String> {
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))
        .unwrap_or_default();
    let p = root.join("gemma-3-270m/gemma-3-270m-q4_k_m.gguf");
    if !p.exists() {
        println!("skipped: model not fetched (run python3 scripts/fetch_models.py gemma3)");
        return None;
    }
    Some(p.to_string_lossy().into_owned())
}

#[test]
fn gemma3_text_prompt_matches_the_transformers_reference() {
    let Some(model) = gemma3() else { return };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rlx-models/tests/data/gemma3_270m_logits.json"
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = &r["cases"][0];
    let prompt = case["prompt"].as_str().unwrap();
    assert_eq!(prompt, "The capital of France is");
    let j: Value = serde_json::from_str(&run(&[
        "generate",
        "--model",
        &model,
        prompt,
        "--max-tokens",
        "24",
        "--json",
    ]))
    .unwrap();
    assert_eq!(j["prompt_ids"], case["prompt_ids"]);
    assert_eq!(j["ids"], case["greedy_ids"]);
    assert_eq!(j["text"], case["greedy_text"]);
}

#[test]
fn gemma3_chat_uses_the_gemma_turn_format() {
    let Some(model) = gemma3() else { return };
    let j: Value = serde_json::from_str(&run(&[
        "generate",
        "--model",
        &model,
        "What is the capital of France?",
        "--chat",
        "--max-tokens",
        "1",
        "--json",
    ]))
    .unwrap();
    // <bos><start_of_turn>user\n What is the capital of France?<end_of_turn>\n
    // <start_of_turn>model\n
    let want = [
        2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107,
    ];
    let got: Vec<u64> = j["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(got, want);
}
