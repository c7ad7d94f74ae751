//! Readers of the PyTorch reference files in `tests/data`
//! (`minilm_embeddings.json`, `smollm2_logits.json`).
//!
//! Shared by the parity tests (`#[path]`-included) and the fuzz target
//! `fuzz/fuzz_targets/reference_json.rs`: malformed input is an `Err` naming
//! the field, never a panic, and the readers check what the tests index
//! (equal-length lists, a non-empty top-10, at least 8 greedy ids).

#![allow(dead_code)]

use serde::Deserialize;

/// One sentence of `minilm_embeddings.json`.
pub struct MinilmCase {
    /// The sentence.
    pub text: String,
    /// sentence-transformers' token ids (with `[CLS]`/`[SEP]`).
    pub ids: Vec<i64>,
    /// The normalized embedding.
    pub emb: Vec<f32>,
}

/// Parses `minilm_embeddings.json`: `sentences`, `token_ids` and
/// `embeddings`, one entry per sentence.
pub fn parse_minilm_embeddings(text: &str) -> Result<Vec<MinilmCase>, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let list = |key: &str| {
        v.get(key)
            .and_then(|x| x.as_array())
            .ok_or_else(|| format!("`{key}` is missing or not an array"))
    };
    let (sentences, ids, embs) = (list("sentences")?, list("token_ids")?, list("embeddings")?);
    if ids.len() != sentences.len() || embs.len() != sentences.len() {
        return Err(format!(
            "{} sentences but {} token_ids and {} embeddings",
            sentences.len(),
            ids.len(),
            embs.len()
        ));
    }
    let mut cases = Vec::with_capacity(sentences.len());
    for (i, ((s, id), e)) in sentences.iter().zip(ids).zip(embs).enumerate() {
        let text = s
            .as_str()
            .ok_or_else(|| format!("sentences[{i}] is not a string"))?;
        let ids = id
            .as_array()
            .ok_or_else(|| format!("token_ids[{i}] is not an array"))?
            .iter()
            .map(|x| x.as_i64())
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| format!("token_ids[{i}] holds a non-integer"))?;
        let emb = e
            .as_array()
            .ok_or_else(|| format!("embeddings[{i}] is not an array"))?
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| format!("embeddings[{i}] holds a non-number"))?;
        cases.push(MinilmCase {
            text: text.to_string(),
            ids,
            emb,
        });
    }
    Ok(cases)
}

/// `smollm2_logits.json`.
#[derive(Deserialize)]
pub struct SmolReference {
    /// One prompt each.
    pub cases: Vec<SmolCase>,
}

/// One prompt of `smollm2_logits.json`.
#[derive(Deserialize)]
pub struct SmolCase {
    /// The prompt text.
    pub prompt: String,
    /// Its token ids.
    pub prompt_ids: Vec<u32>,
    /// The ten most likely next tokens with their logits, most likely first.
    pub top10_next: Vec<(u32, f32)>,
    /// Greedy continuation ids.
    pub greedy_ids: Vec<u32>,
}

/// Parses `smollm2_logits.json`.
pub fn parse_smollm2_logits(text: &str) -> Result<SmolReference, String> {
    let r: SmolReference =
        serde_json::from_str(text).map_err(|e| format!("invalid reference: {e}"))?;
    for (i, c) in r.cases.iter().enumerate() {
        if c.top10_next.is_empty() {
            return Err(format!("cases[{i}].top10_next is empty"));
        }
        if c.greedy_ids.len() < 8 {
            return Err(format!(
                "cases[{i}].greedy_ids has {} ids, the tests need 8",
                c.greedy_ids.len()
            ));
        }
    }
    Ok(r)
}
