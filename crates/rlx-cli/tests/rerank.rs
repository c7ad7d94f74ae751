//! `rlx rerank` on the random-init cross-encoder of
//! rlx-models/tests/data/families/reranker: scores equal CrossEncoder's
//! (reference.json) within 1e-4 relative, best first, in both formats;
//! bad input is a clear error.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const RLX: &str = env!("CARGO_BIN_EXE_rlx");

fn family(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rlx-models/tests/data/families")
        .join(name)
}

fn rlx(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(RLX).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn rerank_prints_cross_encoder_scores_best_first() {
    let dir = family("reranker");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let cases = r["cases"].as_array().unwrap();
    let query = cases[0]["query"].as_str().unwrap();
    let mine: Vec<&Value> = cases.iter().filter(|c| c["query"] == query).collect();
    let docs: Vec<&str> = mine
        .iter()
        .map(|c| c["document"].as_str().unwrap())
        .collect();
    for mode in ["thunks", "hybrid"] {
        let mut args = vec![
            "rerank",
            "--model",
            dir.to_str().unwrap(),
            "--query",
            query,
            "--mode",
            mode,
            "--docs",
        ];
        args.extend(&docs);
        let (ok, out, err) = rlx(&args);
        assert!(ok, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["query"], query);
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), docs.len());
        let mut last = f64::INFINITY;
        for x in results {
            let i = x["index"].as_u64().unwrap() as usize;
            let got = x["score"].as_f64().unwrap();
            let want = mine[i]["score"].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 1e-4 * want.abs(),
                "{mode} doc {i}: {got} vs {want}"
            );
            assert_eq!(x["document"], docs[i]);
            assert!(got <= last);
            last = got;
        }
    }
    let mut args = vec![
        "rerank",
        "--model",
        dir.to_str().unwrap(),
        "--query",
        query,
        "--format",
        "table",
        "--top-n",
        "2",
        "--docs",
    ];
    args.extend(&docs);
    let (ok, out, err) = rlx(&args);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.lines().next().unwrap().contains("score"), "{out}");
}

#[test]
fn rerank_refuses_bad_input_clearly() {
    let emb = family("bert_cls");
    let (ok, _, err) = rlx(&[
        "rerank",
        "--model",
        emb.to_str().unwrap(),
        "--query",
        "q",
        "--docs",
        "d",
    ]);
    assert!(!ok);
    assert!(err.contains("BertForSequenceClassification"), "{err}");
    let dir = family("reranker");
    let (ok, _, err) = rlx(&["rerank", "--model", dir.to_str().unwrap(), "--query", "q"]);
    assert!(!ok);
    assert!(err.contains("--docs"), "{err}");
    let (ok, _, err) = rlx(&[
        "rerank",
        "--model",
        dir.to_str().unwrap(),
        "--query",
        "q",
        "--top-n",
        "0",
        "--docs",
        "d",
    ]);
    assert!(!ok);
    assert!(err.contains("--top-n 0"), "{err}");
}
