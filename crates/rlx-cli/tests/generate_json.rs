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
