//! The BERT config loader: `config.json` and `sentence_bert_config.json`
//! (the input split at its first NUL byte; no NUL: no sentence config)
//! written to a scratch model directory and loaded as `rlx embed` loads
//! it. The directory has no tokenizer or weights, so every load fails; it
//! must fail with an error, never a panic, an abort or a huge allocation.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rlx_models::bert::BertConfig;
use rlx_models::tokenizer::BertTokenizer;
use rlx_models::SentenceEmbedder;

fuzz_target!(|data: &[u8]| {
    let (cfg, st) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let dir = common::scratch_dir("bert");
    std::fs::write(dir.join("config.json"), cfg).expect("write config.json");
    if let Some(st) = st {
        std::fs::write(dir.join("sentence_bert_config.json"), st).expect("write st config");
    }
    if let Ok(c) = serde_json::from_slice::<BertConfig>(cfg) {
        let _ = c.activation();
    }
    assert!(
        SentenceEmbedder::load(&dir).is_err(),
        "loaded without weights"
    );
    assert!(
        BertTokenizer::from_dir(&dir, None).is_err(),
        "no tokenizer.json"
    );
});
