//! [`Reranker`]: a cross-encoder (`BertForSequenceClassification` with one
//! label, as sentence-transformers' `CrossEncoder` saves it) scoring
//! (query, document) pairs.

use crate::bert::{build_classifier_graph, classifier_params, BertConfig};
use crate::embedder::{load_weights, pad_batch, run_inputs, EmbedOptions, ModelError};
use crate::lru::ByteLru;
use crate::tokenizer::BertTokenizer;
use rlx_cpu::{CpuModel, CpuOptions};
use rlx_ir::{Tensor, TensorData};
use rlx_runtime::Executable;
use serde_json::Value;
use std::path::Path;

/// The function a cross-encoder applies to its logit to give a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreActivation {
    /// `1 / (1 + e^-x)`: sentence-transformers' default for one label.
    Sigmoid,
    /// The raw logit.
    Identity,
}

/// The activation names (Python paths) a cross-encoder config may give.
pub const SUPPORTED_ACTIVATIONS: &str =
    "torch.nn.modules.activation.Sigmoid, torch.nn.modules.linear.Identity";

impl ScoreActivation {
    /// Apply to a logit.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            ScoreActivation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            ScoreActivation::Identity => x,
        }
    }
}

/// One document's place in a [`Reranker::rerank`] result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    /// The document's index in the input.
    pub index: usize,
    /// Its relevance score (after the model's activation).
    pub score: f32,
}

/// Pairs per forward pass.
pub const RERANK_BATCH: usize = 32;

/// A loaded cross-encoder reranker (runs on the CPU).
pub struct Reranker {
    cfg: BertConfig,
    tokenizer: BertTokenizer,
    weights: Vec<(String, Tensor)>,
    activation: ScoreActivation,
    opts: EmbedOptions,
    models: ByteLru<(usize, usize), CpuModel>,
}

impl Reranker {
    /// Load a cross-encoder directory (`config.json` with architecture
    /// `BertForSequenceClassification` and one label, `tokenizer.json`,
    /// `model.safetensors`; the activation from
    /// `config_sentence_transformers.json` or `config.json`'s
    /// `sentence_transformers.activation_fn`, else sigmoid).
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        Self::load_with(dir, EmbedOptions::default())
    }

    /// [`Reranker::load`] with options (`hybrid`, `threads`, `optimize`,
    /// `cache_bytes`, `seq_bucket` apply).
    pub fn load_with(dir: impl AsRef<Path>, opts: EmbedOptions) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let (cfg, max_len) = crate::bert::load_dir_config(dir)?;
        let cfg_path = dir.join("config.json");
        if !cfg
            .architectures
            .iter()
            .any(|a| a == "BertForSequenceClassification")
        {
            return Err(ModelError::WrongKind {
                path: cfg_path,
                message: format!(
                    "architectures {:?} (model_type '{}'): a reranker is a BertForSequenceClassification (cross-encoder) model",
                    cfg.architectures, cfg.model_type
                ),
            });
        }
        let raw: Value = std::fs::read_to_string(&cfg_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let labels = match raw.get("id2label").and_then(Value::as_object) {
            Some(m) => m.len(),
            None => raw
                .get("num_labels")
                .and_then(Value::as_u64)
                .map_or(2, |n| n as usize),
        };
        if labels != 1 {
            return Err(ModelError::WrongKind {
                path: cfg_path,
                message: format!(
                    "{labels} labels: a reranker has one (num_labels 1, a relevance logit)"
                ),
            });
        }
        let activation = read_activation(dir, &raw)?;
        let tokenizer = BertTokenizer::from_dir(dir, Some(max_len))?;
        let mut params = cfg.params();
        params.extend(classifier_params(&cfg, labels));
        let weights = load_weights(dir, &params)?;
        Ok(Reranker {
            cfg,
            tokenizer,
            weights,
            activation,
            opts,
            models: ByteLru::new(opts.cache_bytes),
        })
    }

    /// The score activation.
    pub fn activation(&self) -> ScoreActivation {
        self.activation
    }

    /// The tokenizer (pairs are truncated to its maximum length).
    pub fn tokenizer(&self) -> &BertTokenizer {
        &self.tokenizer
    }

    /// The encoder's config.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    fn model_for(&mut self, batch: usize, seq: usize) -> Result<&mut CpuModel, ModelError> {
        let key = (batch, seq);
        if !self.models.contains(&key) {
            let g = build_classifier_graph(&self.cfg, batch, seq, 1)
                .map_err(|e| ModelError::Graph(e.to_string()))?;
            let g = if self.opts.optimize {
                let opt = rlx_opt::OptOptions {
                    target: std::sync::Arc::new(|_: &rlx_ir::Op| true),
                    ..Default::default()
                };
                rlx_opt::optimize(&g, &opt)
                    .map_err(|e| ModelError::Graph(e.to_string()))?
                    .0
            } else {
                g
            };
            let m = match self.models.most_recent_mut() {
                Some(donor) => donor.compile_sharing(g)?,
                None => {
                    let mut m = CpuModel::compile(
                        g,
                        &CpuOptions {
                            hybrid: self.opts.hybrid,
                            threads: self.opts.threads,
                            ..Default::default()
                        },
                    )?;
                    for (name, t) in &self.weights {
                        m.set_param_tensor(name, t.clone())?;
                    }
                    m
                }
            };
            let bytes = m.plan_bytes();
            self.models.insert(key, m, bytes);
        }
        Ok(self.models.get_mut(&key).expect("inserted above"))
    }

    /// The raw logits of (first, second) pairs, one per pair (in forward
    /// passes of [`RERANK_BATCH`] pairs).
    pub fn logits(&mut self, pairs: &[(&str, &str)]) -> Result<Vec<f32>, ModelError> {
        self.logits_batched(pairs, RERANK_BATCH)
    }

    /// [`logits`](Self::logits) in forward passes of at most `batch_size`
    /// pairs (`0` counts as 1), as `CrossEncoder.predict(batch_size=...)`
    /// runs them: each pass is padded to its longest pair, and the padding
    /// is masked, so a pair's logit does not depend on its batch beyond
    /// float rounding.
    pub fn logits_batched(
        &mut self,
        pairs: &[(&str, &str)],
        batch_size: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let mut out = Vec::with_capacity(pairs.len());
        for chunk in pairs.chunks(batch_size.max(1)) {
            let batch = self.tokenizer.encode_pairs(chunk)?;
            let batch = pad_batch(batch, self.opts.seq_bucket, self.cfg.max_seq());
            let model = self.model_for(batch.batch, batch.seq)?;
            let outs = model.run(&run_inputs(&batch, &[]))?;
            let Some(TensorData::F32(v)) = outs.first().map(|t| &*t.data) else {
                return Err(ModelError::Graph(
                    "the classifier returned no f32 logits".into(),
                ));
            };
            if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(ModelError::NonFinite {
                    output: 0,
                    what: "reranker logits",
                    index,
                    value,
                });
            }
            out.extend_from_slice(&v[..]);
        }
        Ok(out)
    }

    /// The scores of (query, document) pairs, one per pair: the logits
    /// through the model's activation, as `CrossEncoder.predict`.
    pub fn score(&mut self, pairs: &[(&str, &str)]) -> Result<Vec<f32>, ModelError> {
        self.score_batched(pairs, RERANK_BATCH)
    }

    /// [`score`](Self::score) in forward passes of at most `batch_size`
    /// pairs (see [`logits_batched`](Self::logits_batched)).
    pub fn score_batched(
        &mut self,
        pairs: &[(&str, &str)],
        batch_size: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let act = self.activation;
        Ok(self
            .logits_batched(pairs, batch_size)?
            .into_iter()
            .map(|x| act.apply(x))
            .collect())
    }

    /// Score every document against `query` and return them best first
    /// (ties keep input order).
    pub fn rerank(&mut self, query: &str, docs: &[&str]) -> Result<Vec<Ranked>, ModelError> {
        let pairs: Vec<(&str, &str)> = docs.iter().map(|d| (query, *d)).collect();
        let scores = self.score(&pairs)?;
        let mut ranked: Vec<Ranked> = scores
            .into_iter()
            .enumerate()
            .map(|(index, score)| Ranked { index, score })
            .collect();
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(ranked)
    }
}

/// The activation a cross-encoder directory asks for (see
/// [`Reranker::load`]).
fn read_activation(dir: &Path, config: &Value) -> Result<ScoreActivation, ModelError> {
    let cst = dir.join("config_sentence_transformers.json");
    let from_cst: Option<(std::path::PathBuf, Value)> = std::fs::read_to_string(&cst)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.get("activation_fn").cloned())
        .map(|a| (cst.clone(), a));
    let cfg_path = dir.join("config.json");
    let from_cfg = config
        .get("sentence_transformers")
        .and_then(|s| s.get("activation_fn"))
        .or_else(|| config.get("sbert_ce_default_activation_function"))
        .cloned()
        .map(|a| (cfg_path, a));
    match from_cst.or(from_cfg) {
        None => Ok(ScoreActivation::Sigmoid),
        Some((_, Value::Null)) => Ok(ScoreActivation::Sigmoid),
        Some((path, v)) => match v.as_str() {
            Some("torch.nn.modules.activation.Sigmoid") | Some("torch.nn.Sigmoid") => {
                Ok(ScoreActivation::Sigmoid)
            }
            Some("torch.nn.modules.linear.Identity") | Some("torch.nn.Identity") => {
                Ok(ScoreActivation::Identity)
            }
            _ => Err(ModelError::Config {
                path,
                message: format!(
                    "activation_fn {v}: unsupported; supported: {SUPPORTED_ACTIVATIONS}"
                ),
            }),
        },
    }
}
