//! The sentence-transformers files of a model directory: `modules.json`,
//! the Pooling module's `config.json`, the Normalize module, the prompts
//! of `config_sentence_transformers.json` and `do_lower_case` of
//! `sentence_bert_config.json`.
//!
//! A directory without `modules.json` is read as all-MiniLM-L6-v2 was
//! before these files were read: mean pooling, then L2 normalization.

use crate::ModelError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One pooling mode of a sentence-transformers `Pooling` module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first kept token (`[CLS]`; with prompt tokens excluded, the
    /// first token after the prompt).
    Cls,
    /// The mean of the kept tokens.
    Mean,
    /// The element-wise maximum over the kept tokens.
    Max,
    /// The sum of the kept tokens divided by the square root of their count.
    MeanSqrtLen,
    /// The mean of the kept tokens weighted by their position (1, 2, ...).
    WeightedMean,
    /// The last kept token.
    LastToken,
}

/// The pooling mode names sentence-transformers writes (`pooling_mode`).
pub const POOLING_MODES: &str = "cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken";

impl PoolingMode {
    /// The mode for a sentence-transformers name (`"cls"`, `"mean"`, ...).
    pub fn from_name(name: &str) -> Option<PoolingMode> {
        Some(match name {
            "cls" => PoolingMode::Cls,
            "mean" => PoolingMode::Mean,
            "max" => PoolingMode::Max,
            "mean_sqrt_len_tokens" => PoolingMode::MeanSqrtLen,
            "weightedmean" => PoolingMode::WeightedMean,
            "lasttoken" => PoolingMode::LastToken,
            _ => return None,
        })
    }

    /// The sentence-transformers name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            PoolingMode::Cls => "cls",
            PoolingMode::Mean => "mean",
            PoolingMode::Max => "max",
            PoolingMode::MeanSqrtLen => "mean_sqrt_len_tokens",
            PoolingMode::WeightedMean => "weightedmean",
            PoolingMode::LastToken => "lasttoken",
        }
    }
}

/// How token states become one sentence vector: the pooling modes, whose
/// outputs are concatenated in this order, then an optional L2
/// normalization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    /// The modes, in the order their vectors are concatenated (at least one).
    pub modes: Vec<PoolingMode>,
    /// Whether prompt tokens take part in pooling (sentence-transformers'
    /// `include_prompt`; when false, the `[CLS]` token and the prompt's
    /// tokens are masked out of every mode).
    pub include_prompt: bool,
    /// L2-normalize the pooled vector (a `Normalize` module follows).
    pub normalize: bool,
}

impl Default for Pooling {
    /// Mean pooling, then L2 normalization (all-MiniLM-L6-v2).
    fn default() -> Self {
        Pooling {
            modes: vec![PoolingMode::Mean],
            include_prompt: true,
            normalize: true,
        }
    }
}

impl Pooling {
    /// Mean pooling with the prompt included (the graph of
    /// [`crate::bert::mean_pool`]).
    pub fn is_plain_mean(&self) -> bool {
        self.modes == [PoolingMode::Mean] && self.include_prompt
    }

    /// Width of the pooled vector for token states of width `hidden`.
    pub fn dim(&self, hidden: usize) -> usize {
        self.modes.len() * hidden
    }
}

/// What the sentence-transformers files of a directory say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StConfig {
    /// Pooling and normalization.
    pub pooling: Pooling,
    /// Named prompts (`config_sentence_transformers.json`'s `prompts`),
    /// prepended to a text before tokenization.
    pub prompts: BTreeMap<String, String>,
    /// The prompt used when none is named (`default_prompt_name`).
    pub default_prompt_name: Option<String>,
    /// Lowercase texts before tokenization (`sentence_bert_config.json`).
    pub do_lower_case: bool,
    /// Whether `modules.json` was there (else the defaults above apply).
    pub has_modules: bool,
}

/// The module types rlx runs, as the last component of their Python path.
pub const SUPPORTED_MODULES: &str = "Transformer, Pooling, Normalize";

fn config_err(path: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|_| ModelError::MissingFile {
        path: path.into(),
        what: "a JSON config",
    })?;
    serde_json::from_str(&text).map_err(|e| config_err(path, format!("invalid JSON: {e}")))
}

impl StConfig {
    /// Read the sentence-transformers files of `dir` (see the module docs).
    /// Unknown module types, pooling modes and malformed files are errors
    /// naming the file, what was found and what is supported.
    pub fn from_dir(dir: &Path) -> Result<StConfig, ModelError> {
        let mut st = StConfig::default();
        let modules_path = dir.join("modules.json");
        if modules_path.is_file() {
            st.has_modules = true;
            let v = read_json(&modules_path)?;
            let list = v
                .as_array()
                .ok_or_else(|| config_err(&modules_path, "expected a JSON array of modules"))?;
            let mut pooling: Option<Pooling> = None;
            let mut normalize = false;
            let mut transformer = false;
            for (i, m) in list.iter().enumerate() {
                let ty = m.get("type").and_then(Value::as_str).ok_or_else(|| {
                    config_err(&modules_path, format!("module {i}: no string \"type\""))
                })?;
                let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
                let last = ty.rsplit('.').next().unwrap_or(ty);
                let order_err = |what: &str| {
                    config_err(
                        &modules_path,
                        format!("module {i} ({ty}): {what}; expected Transformer, Pooling, then an optional Normalize"),
                    )
                };
                match last {
                    "Transformer" => {
                        if transformer || pooling.is_some() || i != 0 {
                            return Err(order_err("out of order"));
                        }
                        transformer = true;
                    }
                    "Pooling" => {
                        if !transformer || pooling.is_some() {
                            return Err(order_err("out of order"));
                        }
                        pooling = Some(read_pooling(&dir.join(sub).join("config.json"))?);
                    }
                    "Normalize" => {
                        if pooling.is_none() || normalize {
                            return Err(order_err("out of order"));
                        }
                        normalize = true;
                    }
                    _ => {
                        return Err(ModelError::UnsupportedModule {
                            path: modules_path,
                            found: ty.to_string(),
                            supported: SUPPORTED_MODULES,
                        })
                    }
                }
            }
            let Some(mut pooling) = pooling else {
                return Err(config_err(
                    &modules_path,
                    "no Pooling module: rlx embeds with a sentence-transformers Pooling module \
                     (a cross-encoder directory is loaded by Reranker)",
                ));
            };
            pooling.normalize = normalize;
            st.pooling = pooling;
        }
        let cst = dir.join("config_sentence_transformers.json");
        if cst.is_file() {
            let v = read_json(&cst)?;
            if let Some(p) = v.get("prompts").filter(|p| !p.is_null()) {
                let obj = p.as_object().ok_or_else(|| {
                    config_err(
                        &cst,
                        format!("prompts = {p}: expected an object of strings"),
                    )
                })?;
                for (k, val) in obj {
                    let s = val.as_str().ok_or_else(|| {
                        config_err(&cst, format!("prompts.{k} = {val}: expected a string"))
                    })?;
                    st.prompts.insert(k.clone(), s.to_string());
                }
            }
            match v.get("default_prompt_name") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => {
                    if !st.prompts.contains_key(s) {
                        return Err(config_err(
                            &cst,
                            format!(
                                "default_prompt_name {s:?} is not among the prompts ({})",
                                prompt_names(&st.prompts)
                            ),
                        ));
                    }
                    st.default_prompt_name = Some(s.clone());
                }
                Some(x) => {
                    return Err(config_err(
                        &cst,
                        format!("default_prompt_name = {x}: expected a string or null"),
                    ))
                }
            }
        }
        let sbc = dir.join("sentence_bert_config.json");
        if sbc.is_file() {
            match read_json(&sbc)?.get("do_lower_case") {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => st.do_lower_case = *b,
                Some(x) => {
                    return Err(config_err(
                        &sbc,
                        format!("do_lower_case = {x}: expected true or false"),
                    ))
                }
            }
        }
        Ok(st)
    }

    /// The text the model reads for `text` with `prompt` prepended:
    /// `prompt + text`, lower-cased when `do_lower_case` is set (what the
    /// embedder tokenizes).
    pub fn input_text(&self, prompt: &str, text: &str) -> String {
        let t = format!("{prompt}{text}");
        if self.do_lower_case {
            t.to_lowercase()
        } else {
            t
        }
    }

    /// The prompt text for `name`, or for the default prompt when `name` is
    /// `None` (`""` when there is none). An unknown name is an error
    /// listing the known ones.
    pub fn prompt(&self, name: Option<&str>) -> Result<&str, ModelError> {
        match name {
            Some(n) => {
                self.prompts
                    .get(n)
                    .map(String::as_str)
                    .ok_or_else(|| ModelError::UnknownPrompt {
                        name: n.to_string(),
                        known: prompt_names(&self.prompts),
                    })
            }
            None => Ok(self
                .default_prompt_name
                .as_ref()
                .and_then(|n| self.prompts.get(n))
                .map_or("", String::as_str)),
        }
    }
}

/// L2-normalize `v` in place as `torch.nn.functional.normalize` does
/// (sentence-transformers' `normalize_embeddings=True`): divided by its
/// Euclidean norm, floored at 1e-12 (an all-zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

fn prompt_names(p: &BTreeMap<String, String>) -> String {
    if p.is_empty() {
        "none".into()
    } else {
        p.keys()
            .map(|k| format!("{k:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Read a Pooling module's `config.json`: `pooling_mode` (a name or a list
/// of names) or the older `pooling_mode_*_token(s)` flags, and
/// `include_prompt`.
pub fn read_pooling(path: &Path) -> Result<Pooling, ModelError> {
    let v = read_json(path)?;
    let bad_mode = |found: String| ModelError::UnsupportedPooling {
        path: PathBuf::from(path),
        found,
        supported: POOLING_MODES,
    };
    let mut modes = Vec::new();
    match v.get("pooling_mode") {
        Some(Value::String(s)) => {
            modes.push(PoolingMode::from_name(s).ok_or_else(|| bad_mode(s.clone()))?)
        }
        Some(Value::Array(a)) => {
            for x in a {
                let s = x.as_str().ok_or_else(|| bad_mode(x.to_string()))?;
                modes.push(PoolingMode::from_name(s).ok_or_else(|| bad_mode(s.to_string()))?);
            }
        }
        Some(Value::Null) | None => {
            const LEGACY: [(&str, PoolingMode); 6] = [
                ("pooling_mode_cls_token", PoolingMode::Cls),
                ("pooling_mode_max_tokens", PoolingMode::Max),
                ("pooling_mode_mean_tokens", PoolingMode::Mean),
                (
                    "pooling_mode_mean_sqrt_len_tokens",
                    PoolingMode::MeanSqrtLen,
                ),
                (
                    "pooling_mode_weightedmean_tokens",
                    PoolingMode::WeightedMean,
                ),
                ("pooling_mode_lasttoken", PoolingMode::LastToken),
            ];
            for (key, mode) in LEGACY {
                match v.get(key) {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => modes.push(mode),
                    Some(x) => {
                        return Err(config_err(
                            path,
                            format!("{key} = {x}: expected true or false"),
                        ))
                    }
                }
            }
            // sentence-transformers: no flag set means mean pooling.
            if modes.is_empty() {
                modes.push(PoolingMode::Mean);
            }
        }
        Some(x) => return Err(bad_mode(x.to_string())),
    }
    if modes.is_empty() {
        return Err(bad_mode("[] (an empty list)".into()));
    }
    let include_prompt = match v.get("include_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(x) => {
            return Err(config_err(
                path,
                format!("include_prompt = {x}: expected true or false"),
            ))
        }
    };
    Ok(Pooling {
        modes,
        include_prompt,
        normalize: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_normalize_divides_by_the_norm_and_keeps_zero_vectors() {
        let mut v = [3.0f32, -4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, -0.8]);
        let mut z = [0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }

    #[test]
    fn input_text_prepends_the_prompt_and_lower_cases_when_asked() {
        let mut st = StConfig::default();
        assert_eq!(st.input_text("Query: ", "Paris"), "Query: Paris");
        st.do_lower_case = true;
        assert_eq!(st.input_text("Query: ", "Paris"), "query: paris");
    }
}
