//! Random-init embedding families and a cross-encoder reranker against
//! sentence-transformers (tests/data/families/<name>/reference.json,
//! written by `scripts/gen_model_refs.py`): token ids equal, embeddings at
//! cosine >= 0.99999 and max abs error <= 1e-4 (relative to the largest
//! component for unnormalized ones), reranker scores within 1e-4 relative;
//! in thunks and hybrid mode, batched and one text at a time. Plus the
//! errors for unsupported pooling modes, modules, prompts and activations,
//! and for ModernBERT settings rlx does not build.

use rlx_models::{EmbedOptions, PoolingMode, Reranker, ScoreActivation, SentenceEmbedder};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn family(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/families")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(family(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// (max abs error relative to max(1, largest |want|), cosine).
fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "embedding width");
    let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
    let max_abs = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
        / scale;
    let dot: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum();
    let na: f64 = got.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = want.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    (max_abs, (dot / (na * nb)) as f32)
}

/// Every case of a family, in thunks and hybrid mode.
fn check_family(name: &str) {
    let r = reference(name);
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 10, "{name}: {} cases", cases.len());
    let max_seq = r["max_seq_length"].as_u64().unwrap() as usize;
    let mut groups: Vec<(Option<String>, Vec<&Value>)> = Vec::new();
    for c in cases {
        let pn = c["prompt_name"].as_str().map(str::to_string);
        match groups.iter_mut().find(|(p, _)| *p == pn) {
            Some((_, v)) => v.push(c),
            None => groups.push((pn, vec![c])),
        }
    }
    let mut truncated = false;
    for hybrid in [false, true] {
        let mut m = SentenceEmbedder::load_with(
            family(name),
            EmbedOptions {
                hybrid,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            m.tokenizer().max_seq_len(),
            max_seq,
            "{name}: max_seq_length"
        );
        let plan = m.plan_for(2, 16).unwrap();
        assert_eq!(
            !plan.report.segments.is_empty(),
            hybrid,
            "{name} hybrid={hybrid}: compiled segments {}",
            plan.report.segments.len()
        );
        let (mut worst_cos, mut worst_abs) = (1f32, 0f32);
        for (pn, cs) in &groups {
            let prompt = m.st_config().prompt(pn.as_deref()).unwrap().to_string();
            let texts: Vec<&str> = cs.iter().map(|c| c["text"].as_str().unwrap()).collect();
            for (c, t) in cs.iter().zip(&texts) {
                let got = m.tokenizer().encode(&format!("{prompt}{t}")).unwrap();
                assert_eq!(got, ids(&c["ids"]), "{name}: ids of {t:?} (prompt {pn:?})");
                truncated |= got.len() == max_seq && t.len() > 4 * max_seq;
            }
            let batched = m.embed_with_prompt(&texts, pn.as_deref()).unwrap();
            for ((c, t), got) in cs.iter().zip(&texts).zip(&batched) {
                let want = floats(&c["embedding"]);
                for (what, got) in [
                    ("batched", got.clone()),
                    (
                        "single",
                        m.embed_with_prompt(&[t], pn.as_deref()).unwrap().remove(0),
                    ),
                ] {
                    let (abs, cos) = compare(&got, &want);
                    worst_cos = worst_cos.min(cos);
                    worst_abs = worst_abs.max(abs);
                    assert!(
                        cos >= 0.99999 && abs <= 1e-4,
                        "{name} hybrid={hybrid} {what} {t:?} prompt {pn:?}: cosine {cos}, max abs {abs:e}"
                    );
                }
            }
        }
        println!("{name} hybrid={hybrid}: worst cosine {worst_cos}, worst max abs {worst_abs:e}");
    }
    assert!(truncated, "{name}: no case reached max_seq_length");
}

#[test]
fn bert_cls_pooling_matches_sentence_transformers() {
    let m = SentenceEmbedder::load(family("bert_cls")).unwrap();
    assert_eq!(m.pooling().modes, [PoolingMode::Cls]);
    assert!(m.pooling().normalize);
    check_family("bert_cls");
}

#[test]
fn bert_mean_pooling_with_prompts_matches_sentence_transformers() {
    let m = SentenceEmbedder::load(family("bert_mean")).unwrap();
    assert_eq!(m.prompts()["query"], "query: ");
    assert_eq!(m.default_prompt_name(), None);
    check_family("bert_mean");
}

#[test]
fn bert_max_cls_sqrt_len_without_prompt_tokens_matches_sentence_transformers() {
    let m = SentenceEmbedder::load(family("bert_max")).unwrap();
    assert_eq!(
        m.pooling().modes,
        [PoolingMode::Max, PoolingMode::Cls, PoolingMode::MeanSqrtLen]
    );
    assert!(!m.pooling().include_prompt);
    assert_eq!(m.default_prompt_name(), Some("query"));
    assert_eq!(m.dim(), 3 * 64);
    check_family("bert_max");
}

/// Ids tokenized from `StConfig::input_text` with the default prompt and
/// run with that prompt's length (`embed_ids_with_prompt_len`, what the
/// server does) embed bit for bit as `embed` of the text. bert_max pools
/// without the prompt tokens (`include_prompt` false): the same ids run
/// with no prompt length pool them too and differ.
#[test]
fn ids_with_the_prompt_length_embed_as_the_text_with_the_default_prompt() {
    let r = reference("bert_max");
    let mut m = SentenceEmbedder::load(family("bert_max")).unwrap();
    let prompt = m.st_config().prompt(None).unwrap().to_string();
    assert_eq!(prompt, "represent this sentence for searching: ");
    let pl = m.prompt_len(&prompt).unwrap();
    // sentence-transformers' prompt_length: [CLS] and the prompt's tokens.
    assert_eq!(pl, m.tokenizer().encode(&prompt).unwrap().len() - 1);
    assert!(pl > 2);
    assert_eq!(m.prompt_len("").unwrap(), 0);
    let cases: Vec<&Value> = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["prompt_name"].is_null())
        .collect();
    assert!(cases.len() >= 10);
    for c in cases {
        let t = c["text"].as_str().unwrap();
        let row = m
            .tokenizer()
            .encode(&m.st_config().input_text(&prompt, t))
            .unwrap();
        assert_eq!(row, ids(&c["ids"]), "ids of {t:?}");
        let want = m.embed(&[t]).unwrap().remove(0);
        let got = m
            .embed_ids_with_prompt_len(std::slice::from_ref(&row), pl)
            .unwrap()
            .remove(0);
        assert_eq!(got, want, "{t:?}");
        let (abs, cos) = compare(&got, &floats(&c["embedding"]));
        assert!(
            cos >= 0.99999 && abs <= 1e-4,
            "{t:?}: cosine {cos}, max abs {abs:e}"
        );
        let pooled_with_prompt = m.embed_ids(&[row]).unwrap().remove(0);
        let (abs, _) = compare(&pooled_with_prompt, &want);
        assert!(
            abs > 1e-3,
            "{t:?}: the prompt tokens changed nothing ({abs:e})"
        );
    }
}

/// Models without a Normalize module (gte: mean; bert_max: max + cls +
/// mean_sqrt_len) give rows that are not unit length, and
/// `st::l2_normalize` of a row is sentence-transformers' vector
/// normalized (its `normalize_embeddings=True`).
#[test]
fn l2_normalize_of_unnormalized_rows_is_the_reference_direction() {
    for name in ["gte", "bert_max"] {
        let r = reference(name);
        let mut m = SentenceEmbedder::load(family(name)).unwrap();
        assert!(!m.pooling().normalize, "{name}");
        let cases: Vec<&Value> = r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["prompt_name"].is_null())
            .collect();
        let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
        let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        for (c, row) in cases.iter().zip(m.embed(&texts).unwrap()) {
            assert!(
                (norm(&row) - 1.0).abs() > 1e-2,
                "{name}: norm {}",
                norm(&row)
            );
            let mut got = row.clone();
            rlx_models::st::l2_normalize(&mut got);
            assert!(
                (norm(&got) - 1.0).abs() <= 1e-6,
                "{name}: norm {}",
                norm(&got)
            );
            let mut want = floats(&c["embedding"]);
            let n = norm(&want) as f32;
            want.iter_mut().for_each(|x| *x /= n);
            let (abs, cos) = compare(&got, &want);
            assert!(
                cos >= 0.99999 && abs <= 1e-5,
                "{name}: cosine {cos}, max abs {abs:e}"
            );
        }
    }
}

#[test]
fn gte_like_unnormalized_mean_matches_sentence_transformers() {
    let m = SentenceEmbedder::load(family("gte")).unwrap();
    assert!(!m.pooling().normalize);
    check_family("gte");
}

#[test]
fn bert_last_token_and_weighted_mean_match_sentence_transformers() {
    check_family("bert_last");
}

#[test]
fn xlm_roberta_with_unigram_tokenizer_matches_sentence_transformers() {
    let m = SentenceEmbedder::load(family("xlmr")).unwrap();
    assert_eq!(m.config().position_offset, 2);
    check_family("xlmr");
}

#[test]
fn mpnet_with_relative_position_buckets_matches_sentence_transformers() {
    let m = SentenceEmbedder::load(family("mpnet")).unwrap();
    assert!(m.config().is_mpnet());
    assert_eq!(m.config().position_offset, 2);
    assert_eq!(m.config().relative_attention_num_buckets, 32);
    check_family("mpnet");
}

#[test]
fn modernbert_with_rotary_and_local_attention_matches_sentence_transformers() {
    use rlx_models::modernbert::LayerAttention::{Global, Local};
    let m = SentenceEmbedder::load(family("modernbert")).unwrap();
    let mb = m.config().modernbert.clone().expect("a ModernBERT config");
    // The Hub's legacy config form: layer kinds from
    // global_attn_every_n_layers 3, thetas from global/local_rope_theta.
    assert_eq!(mb.layer_types, None);
    let kinds: Vec<_> = (0..4).map(|l| mb.layer(l)).collect();
    assert_eq!(kinds, [Global, Local, Local, Global]);
    assert_eq!(
        (mb.global_rope_theta, mb.local_rope_theta),
        (160000.0, 10000.0)
    );
    // A window of 4 tokens either side, far shorter than most cases.
    assert_eq!(mb.half_window(), 4);
    assert!(!mb.attention_bias && !mb.mlp_bias && !mb.norm_bias);
    assert_eq!(m.prompts()["query"], "search_query: ");
    let long = reference("modernbert")["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ids"].as_array().unwrap().len() > 2 * mb.half_window() + 1)
        .count();
    assert!(long >= 20, "{long} cases longer than the window");
    check_family("modernbert");
}

#[test]
fn modernbert_with_biases_and_silu_gate_matches_sentence_transformers() {
    use rlx_models::modernbert::LayerAttention::{Global, Local};
    let m = SentenceEmbedder::load(family("modernbert_bias")).unwrap();
    let mb = m.config().modernbert.clone().expect("a ModernBERT config");
    // transformers 5's config form: layer_types and rope_parameters.
    assert_eq!(mb.layer_types, Some(vec![Global, Local, Global]));
    assert_eq!(
        (mb.global_rope_theta, mb.local_rope_theta),
        (50000.0, 1000.0)
    );
    assert_eq!(mb.half_window(), 8);
    assert!(mb.attention_bias && mb.mlp_bias && mb.norm_bias);
    assert_eq!(m.config().hidden_act, "silu");
    assert_eq!(m.pooling().modes, [PoolingMode::Cls]);
    check_family("modernbert_bias");
}

/// A copy of the modernbert family with `config.json` edited by `edit`,
/// and the error loading it.
fn modernbert_config_err(tag: &str, edit: impl FnOnce(&mut Value)) -> String {
    let d = copy_family("modernbert", tag);
    let path = d.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).unwrap();
    let e = load_err(&d);
    std::fs::remove_dir_all(&d).ok();
    e
}

#[test]
fn modernbert_unsupported_settings_are_clear_errors() {
    let e = modernbert_config_err("mb-act", |c| c["hidden_activation"] = "geglu".into());
    assert!(
        e.contains("hidden_activation = \"geglu\"")
            && e.contains("gelu, gelu_new, gelu_pytorch_tanh, relu, silu or swish"),
        "{e}"
    );
    let e = modernbert_config_err("mb-rope", |c| {
        c["rope_parameters"] =
            serde_json::json!({"full_attention": {"rope_type": "yarn", "factor": 4.0}});
    });
    assert!(
        e.contains("rope_parameters.full_attention.rope_type = \"yarn\"")
            && e.contains("\"default\""),
        "{e}"
    );
    let e = modernbert_config_err("mb-scaling", |c| {
        c["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
    });
    assert!(e.contains("rope_scaling.type = \"linear\""), "{e}");
    let e = modernbert_config_err("mb-kind", |c| {
        c["layer_types"] = serde_json::json!(["full_attention", "chunked_attention"]);
    });
    assert!(
        e.contains("layer_types[1] = \"chunked_attention\"") && e.contains("sliding_attention"),
        "{e}"
    );
    let e = modernbert_config_err("mb-kinds", |c| {
        c["layer_types"] = serde_json::json!(["full_attention", "sliding_attention"]);
    });
    assert!(
        e.contains("layer_types = 2 entries") && e.contains("num_hidden_layers 4"),
        "{e}"
    );
    let e = modernbert_config_err("mb-every", |c| c["global_attn_every_n_layers"] = 0.into());
    assert!(e.contains("global_attn_every_n_layers = 0"), "{e}");
    let e = modernbert_config_err("mb-theta", |c| c["local_rope_theta"] = (-1.0).into());
    assert!(e.contains("local_rope_theta = -1"), "{e}");
    let e = modernbert_config_err("mb-ffn", |c| c["intermediate_size"] = 128.into());
    assert!(
        e.contains("intermediate_size = 128") && e.contains("layers.0.mlp.Wi.weight"),
        "{e}"
    );
    // A ModernBERT directory is no cross-encoder.
    let e = Reranker::load(family("modernbert"))
        .err()
        .expect("must fail")
        .to_string();
    assert!(e.contains("BertForSequenceClassification"), "{e}");
}

#[test]
fn reranker_matches_cross_encoder() {
    let r = reference("reranker");
    let cases = r["cases"].as_array().unwrap();
    let pairs: Vec<(&str, &str)> = cases
        .iter()
        .map(|c| {
            (
                c["query"].as_str().unwrap(),
                c["document"].as_str().unwrap(),
            )
        })
        .collect();
    for hybrid in [false, true] {
        let mut m = Reranker::load_with(
            family("reranker"),
            EmbedOptions {
                hybrid,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(m.activation(), ScoreActivation::Sigmoid);
        for (c, &(q, d)) in cases.iter().zip(&pairs) {
            let b = m.tokenizer().encode_pairs(&[(q, d)]).unwrap();
            assert_eq!(
                b.row_ids(0).unwrap(),
                &ids(&c["ids"])[..],
                "ids of {q:?} / {d:?}"
            );
        }
        let scores = m.score(&pairs).unwrap();
        let logits = m.logits(&pairs).unwrap();
        let mut worst = 0f32;
        for ((c, s), l) in cases.iter().zip(&scores).zip(&logits) {
            for (got, key) in [(*s, "score"), (*l, "logit")] {
                let want = c[key].as_f64().unwrap() as f32;
                let rel = (got - want).abs() / want.abs().max(1e-3);
                worst = worst.max(rel);
                assert!(rel <= 1e-4, "hybrid={hybrid} {key} of {c}: {got} vs {want}");
            }
        }
        // Other batch sizes (one pair a pass, passes of 5 padded to their
        // longest, all in one): the same scores to float rounding.
        for bs in [1, 5, 64] {
            let got = m.score_batched(&pairs, bs).unwrap();
            assert_eq!(got.len(), scores.len());
            for (i, (g, s)) in got.iter().zip(&scores).enumerate() {
                assert!(
                    (g - s).abs() <= 1e-6,
                    "batch_size {bs}, pair {i}: {g} vs {s}"
                );
            }
        }
        assert!(m.score_batched(&[], 4).unwrap().is_empty());
        // rerank: best first, every index once, scores from score().
        let q = pairs[0].0;
        let docs: Vec<&str> = pairs.iter().filter(|p| p.0 == q).map(|p| p.1).collect();
        let ranked = m.rerank(q, &docs).unwrap();
        assert_eq!(ranked.len(), docs.len());
        assert!(ranked.windows(2).all(|w| w[0].score >= w[1].score));
        for x in &ranked {
            assert!((x.score - scores[x.index]).abs() <= 1e-6);
        }
        println!("reranker hybrid={hybrid}: worst relative error {worst:e}");
    }
}

/// A copy of a family directory to edit.
fn copy_family(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("rlx-fam-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    fn copy(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            let to = dst.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &to);
            } else {
                std::fs::copy(e.path(), to).unwrap();
            }
        }
    }
    copy(&family(name), &dst);
    dst
}

fn load_err(dir: &Path) -> String {
    SentenceEmbedder::load(dir)
        .err()
        .expect("must fail")
        .to_string()
}

#[test]
fn unsupported_pooling_modules_prompts_and_kinds_are_clear_errors() {
    let d = copy_family("bert_mean", "errors");
    let pool = d.join("1_Pooling/config.json");
    std::fs::write(
        &pool,
        r#"{"embedding_dimension": 64, "pooling_mode": "median"}"#,
    )
    .unwrap();
    let e = load_err(&d);
    assert!(
        e.contains("unsupported pooling mode median") && e.contains("lasttoken"),
        "{e}"
    );
    std::fs::write(&pool, r#"{"pooling_mode": ["cls", 3]}"#).unwrap();
    assert!(load_err(&d).contains("unsupported pooling mode 3"));
    // Legacy flags: cls and mean concatenated, in sentence-transformers' order.
    std::fs::write(
        &pool,
        r#"{"word_embedding_dimension": 64, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#,
    )
    .unwrap();
    let m = SentenceEmbedder::load(&d).unwrap();
    assert_eq!(m.pooling().modes, [PoolingMode::Cls, PoolingMode::Mean]);
    std::fs::write(&pool, r#"{"pooling_mode": "mean"}"#).unwrap();

    let modules = d.join("modules.json");
    let orig = std::fs::read_to_string(&modules).unwrap();
    std::fs::write(
        &modules,
        orig.replace(
            "sentence_transformers.base.modules.normalize.Normalize",
            "sentence_transformers.models.Dense",
        ),
    )
    .unwrap();
    let e = load_err(&d);
    assert!(
        e.contains("unsupported sentence-transformers module")
            && e.contains("Dense")
            && e.contains("Transformer, Pooling, Normalize"),
        "{e}"
    );
    std::fs::write(&modules, &orig).unwrap();

    let mut m = SentenceEmbedder::load(&d).unwrap();
    let e = m
        .embed_with_prompt(&["x"], Some("nope"))
        .expect_err("unknown prompt must fail")
        .to_string();
    assert!(
        e.contains("unknown prompt name \"nope\"") && e.contains("\"query\""),
        "{e}"
    );

    // An embedder is not a reranker, and the other way round.
    let e = Reranker::load(&d).err().expect("must fail").to_string();
    assert!(e.contains("BertForSequenceClassification"), "{e}");
    let e = load_err(&family("reranker"));
    assert!(e.contains("no Pooling module"), "{e}");

    // An architecture outside the BERT family names the supported ones.
    let cfg = d.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("\"BertModel\"", "\"NomicBertModel\"")
            .replace("\"model_type\": \"bert\"", "\"model_type\": \"nomic_bert\""),
    )
    .unwrap();
    let e = load_err(&d);
    assert!(
        e.contains("NomicBertModel")
            && e.contains("XLMRobertaModel")
            && e.contains("ModernBertModel"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).ok();

    let r = copy_family("reranker", "act");
    let cst = r.join("config_sentence_transformers.json");
    let text = std::fs::read_to_string(&cst).unwrap();
    std::fs::write(
        &cst,
        text.replace(
            "torch.nn.modules.activation.Sigmoid",
            "torch.nn.modules.activation.Tanh",
        ),
    )
    .unwrap();
    let e = Reranker::load(&r).err().expect("must fail").to_string();
    assert!(e.contains("Tanh") && e.contains("Sigmoid, torch"), "{e}");
    std::fs::write(
        &cst,
        text.replace(
            "torch.nn.modules.activation.Sigmoid",
            "torch.nn.modules.linear.Identity",
        ),
    )
    .unwrap();
    let mut m = Reranker::load(&r).unwrap();
    assert_eq!(m.activation(), ScoreActivation::Identity);
    let want = reference("reranker")["cases"][0]["logit"].as_f64().unwrap() as f32;
    let c = &reference("reranker")["cases"][0];
    let got = m
        .score(&[(
            c["query"].as_str().unwrap(),
            c["document"].as_str().unwrap(),
        )])
        .unwrap()[0];
    assert!(
        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
        "{got} vs {want}"
    );
    std::fs::remove_dir_all(&r).ok();
}
