//! BERT encoder graphs, driven by a Hugging Face `config.json`.
//!
//! The graph is written in plain ops (MatMul, Add, Gelu, LayerNorm, ...);
//! `rlx-opt` finds the fused ops. Param names are the safetensors tensor
//! names (without a `bert.` prefix). Linear weights are bound transposed,
//! as `[in, out]`, so that `MatMul(x, W)` computes `x W^T` of PyTorch.

use crate::modernbert::ModernBertConfig;
use crate::validate::{layers_in_names, positive_finite, ConfigError, MAX_LAYERS};
use crate::ModelError;
use rlx_ir::{
    op::{Activation, BinaryOp, MaskKind, ReduceOp},
    DType, Graph, IrError, NodeId, Op, Shape, Tensor,
};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The `hidden_act` names [`BertConfig::activation`] knows.
pub const KNOWN_ACTIVATIONS: &str = "gelu, gelu_new, gelu_pytorch_tanh, relu, silu or swish";

/// The subset of a BERT `config.json` that shapes the graph.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    /// Hidden width.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Position-embedding rows.
    pub max_position_embeddings: usize,
    /// Token-type rows.
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "eps")]
    pub layer_norm_eps: f32,
    /// FFN activation name (`gelu`, `gelu_new`, `relu`, ...).
    #[serde(default = "gelu")]
    pub hidden_act: String,
    /// Architecture names, e.g. `["BertModel"]`.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// Model type, e.g. `bert`.
    #[serde(default)]
    pub model_type: String,
    /// The position of the first token: 0 for BERT; `pad_token_id + 1`
    /// for (XLM-)RoBERTa, whose position ids start past the padding index;
    /// 2 for MPNet (transformers fixes its padding index at 1).
    #[serde(default)]
    pub position_offset: usize,
    /// MPNet's relative position buckets (`relative_attention_num_buckets`,
    /// a bias per bucket and head added to every layer's attention scores);
    /// 0 for the other families.
    #[serde(default)]
    pub relative_attention_num_buckets: usize,
    /// ModernBERT's own settings (`model_type` `modernbert`: rotary
    /// positions, local and global layers, a gated MLP; see
    /// [`crate::modernbert`]); `None` for the other families. For
    /// ModernBERT, `hidden_act` holds `hidden_activation`,
    /// `layer_norm_eps` holds `norm_eps`, and `type_vocab_size` is 0 (no
    /// token types).
    #[serde(skip)]
    pub modernbert: Option<ModernBertConfig>,
}

/// MPNet's largest relative distance with its own bucket range
/// (transformers' `relative_position_bucket(max_distance=128)`).
const MPNET_MAX_DISTANCE: i64 = 128;

fn two() -> usize {
    2
}
fn eps() -> f32 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}

impl BertConfig {
    /// all-MiniLM-L6-v2's shape (a 6-layer BERT with hidden 384).
    pub fn minilm_l6() -> Self {
        BertConfig {
            hidden_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 12,
            intermediate_size: 1536,
            vocab_size: 30522,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_act: "gelu".into(),
            architectures: vec!["BertModel".into()],
            model_type: "bert".into(),
            position_offset: 0,
            relative_attention_num_buckets: 0,
            modernbert: None,
        }
    }

    /// Whether this is a ModernBERT config ([`BertConfig::modernbert`] is
    /// set, as [`BertConfig::from_json`] sets it for `model_type`
    /// `modernbert`; see [`crate::modernbert`]).
    pub fn is_modernbert(&self) -> bool {
        self.modernbert.is_some()
    }

    /// The config key of the FFN activation: `hidden_activation` for
    /// ModernBERT, `hidden_act` for the others.
    pub fn activation_key(&self) -> &'static str {
        if self.is_modernbert() {
            "hidden_activation"
        } else {
            "hidden_act"
        }
    }

    /// Whether `model_type` is `mpnet`: attention weights under
    /// `attention.attn.{q,k,v,o}`, no token types, and a relative position
    /// bias ([`relative_position_bucket`]).
    pub fn is_mpnet(&self) -> bool {
        self.model_type == "mpnet"
    }

    /// Whether `model_type` is one of the RoBERTa family (`roberta`,
    /// `xlm-roberta`), whose position ids start at `pad_token_id + 1`.
    pub fn is_roberta(&self) -> bool {
        matches!(self.model_type.as_str(), "roberta" | "xlm-roberta")
    }

    /// The longest sequence the position table holds
    /// (`max_position_embeddings - position_offset`).
    pub fn max_seq(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.position_offset)
    }

    /// The FFN activation, or `None` for an unsupported name.
    pub fn activation(&self) -> Option<Activation> {
        match self.hidden_act.as_str() {
            "gelu" => Some(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            "silu" | "swish" => Some(Activation::Silu),
            _ => None,
        }
    }

    /// Parse a `config.json` value, naming the key of any missing or
    /// mistyped field (`file` is used in the errors). Only types are checked
    /// here; see [`BertConfig::validate`] for ranges.
    pub fn from_json(file: &str, v: &Value) -> Result<BertConfig, ConfigError> {
        let get = |key: &str| v.get(key).filter(|x| !x.is_null());
        let uint = |key: &str, default: Option<usize>| -> Result<usize, ConfigError> {
            match (get(key), default) {
                (None, Some(d)) => Ok(d),
                (None, None) => Err(ConfigError::new(
                    file,
                    key,
                    "(missing)",
                    "a positive integer",
                )),
                (Some(x), _) => x
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| ConfigError::new(file, key, x, "a positive integer")),
            }
        };
        let model_type = match get("model_type") {
            None => String::new(),
            Some(x) => x
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| ConfigError::new(file, "model_type", x, "a string"))?,
        };
        let modern = model_type == "modernbert";
        // ModernBERT names these two differently, with other defaults.
        let (eps_key, eps_default, act_key) = if modern {
            ("norm_eps", 1e-5, "hidden_activation")
        } else {
            ("layer_norm_eps", eps(), "hidden_act")
        };
        let layer_norm_eps = match get(eps_key) {
            None => eps_default,
            Some(x) => x
                .as_f64()
                .ok_or_else(|| ConfigError::new(file, eps_key, x, "a positive finite number"))?
                as f32,
        };
        let string = |key: &str, default: String| -> Result<String, ConfigError> {
            match get(key) {
                None => Ok(default),
                Some(x) => x
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ConfigError::new(file, key, x, "a string")),
            }
        };
        let architectures = match get("architectures") {
            None => Vec::new(),
            Some(x) => x
                .as_array()
                .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect())
                .ok_or_else(|| ConfigError::new(file, "architectures", x, "an array of strings"))?,
        };
        let position_offset = match model_type.as_str() {
            "roberta" | "xlm-roberta" => uint("pad_token_id", Some(1))? + 1,
            // transformers' MPNetEmbeddings fixes padding_idx = 1.
            "mpnet" => 2,
            _ => 0,
        };
        let relative_attention_num_buckets = if model_type == "mpnet" {
            uint("relative_attention_num_buckets", Some(32))?
        } else {
            0
        };
        let modernbert = if modern {
            Some(ModernBertConfig::from_json(file, v)?)
        } else {
            None
        };
        Ok(BertConfig {
            hidden_size: uint("hidden_size", None)?,
            num_hidden_layers: uint("num_hidden_layers", None)?,
            num_attention_heads: uint("num_attention_heads", None)?,
            intermediate_size: uint("intermediate_size", None)?,
            vocab_size: uint("vocab_size", None)?,
            max_position_embeddings: uint("max_position_embeddings", None)?,
            type_vocab_size: if modern {
                0
            } else {
                uint("type_vocab_size", Some(two()))?
            },
            layer_norm_eps,
            hidden_act: string(act_key, gelu())?,
            architectures,
            model_type,
            position_offset,
            relative_attention_num_buckets,
            modernbert,
        })
    }

    /// Check every hyper-parameter against its sane range: sizes positive,
    /// heads dividing `hidden_size`, at most [`MAX_LAYERS`] layers, a
    /// positive finite `layer_norm_eps`, a known `hidden_act`. `file` names
    /// the source in the error.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let positive = |key: &str, v: usize| {
            if v == 0 {
                Err(ConfigError::new(file, key, v, "a positive integer"))
            } else {
                Ok(())
            }
        };
        positive("hidden_size", self.hidden_size)?;
        let heads = self.num_attention_heads;
        if heads == 0 || !self.hidden_size.is_multiple_of(heads) {
            return Err(ConfigError::new(
                file,
                "num_attention_heads",
                heads,
                format!("a positive divisor of hidden_size {}", self.hidden_size),
            ));
        }
        if !(1..=MAX_LAYERS).contains(&self.num_hidden_layers) {
            return Err(ConfigError::new(
                file,
                "num_hidden_layers",
                self.num_hidden_layers,
                format!("an integer in 1..={MAX_LAYERS}"),
            ));
        }
        positive("intermediate_size", self.intermediate_size)?;
        positive("vocab_size", self.vocab_size)?;
        positive("max_position_embeddings", self.max_position_embeddings)?;
        if let Some(m) = &self.modernbert {
            m.validate(file, self.num_hidden_layers)?;
        } else {
            positive("type_vocab_size", self.type_vocab_size)?;
        }
        if self.is_mpnet() && !(2..=1024).contains(&self.relative_attention_num_buckets) {
            return Err(ConfigError::new(
                file,
                "relative_attention_num_buckets",
                self.relative_attention_num_buckets,
                "an integer in 2..=1024",
            ));
        }
        if self.position_offset >= self.max_position_embeddings {
            return Err(ConfigError::new(
                file,
                "pad_token_id",
                self.position_offset.saturating_sub(1),
                format!(
                    "below max_position_embeddings {} - 1 (positions start at pad_token_id + 1)",
                    self.max_position_embeddings
                ),
            ));
        }
        let eps_key = if self.is_modernbert() {
            "norm_eps"
        } else {
            "layer_norm_eps"
        };
        positive_finite(file, eps_key, self.layer_norm_eps as f64)?;
        if self.activation().is_none() {
            return Err(ConfigError::new(
                file,
                self.activation_key(),
                format!("{:?}", self.hidden_act),
                format!("one of {KNOWN_ACTIVATIONS}"),
            ));
        }
        Ok(())
    }

    /// Check the config against the weight file's tensors: the layer count
    /// against the `encoder.layer.N.` names present (counted from the names
    /// alone, before any per-layer list is built), and `vocab_size`,
    /// `hidden_size`, `max_position_embeddings`, `type_vocab_size` and
    /// `intermediate_size` against the embedding tables and the first FFN.
    /// `shape` gives a tensor's shape by name; a missing tensor is left to
    /// the weight loader to report.
    pub fn check_tensors<'a>(
        &self,
        file: &str,
        weights: &str,
        names: impl IntoIterator<Item = &'a str>,
        shape: impl Fn(&str) -> Option<Vec<usize>>,
    ) -> Result<(), ConfigError> {
        if self.is_modernbert() {
            return crate::modernbert::check_tensors(self, file, weights, names, shape);
        }
        let layers = layers_in_names(names, "encoder.layer.");
        if layers != self.num_hidden_layers {
            return Err(ConfigError::new(
                file,
                "num_hidden_layers",
                self.num_hidden_layers,
                format!("the number of encoder layers in {weights} ({layers})"),
            ));
        }
        let h = self.hidden_size;
        let table = |name: &str, key: &str, rows: usize| -> Result<(), ConfigError> {
            match shape(name) {
                Some(d) if d.len() == 2 && d[1] != h => Err(ConfigError::new(
                    file,
                    "hidden_size",
                    h,
                    format!("the width of {name} {d:?} in {weights}"),
                )),
                Some(d) if d.len() == 2 && d[0] != rows => Err(ConfigError::new(
                    file,
                    key,
                    rows,
                    format!("the rows of {name} {d:?} in {weights} ({})", d[0]),
                )),
                _ => Ok(()),
            }
        };
        table(
            "embeddings.word_embeddings.weight",
            "vocab_size",
            self.vocab_size,
        )?;
        table(
            "embeddings.position_embeddings.weight",
            "max_position_embeddings",
            self.max_position_embeddings,
        )?;
        table(
            "embeddings.token_type_embeddings.weight",
            "type_vocab_size",
            self.type_vocab_size,
        )?;
        let ffn = "encoder.layer.0.intermediate.dense.weight";
        if let Some(d) = shape(ffn) {
            if d.len() == 2 && d[0] != self.intermediate_size {
                return Err(ConfigError::new(
                    file,
                    "intermediate_size",
                    self.intermediate_size,
                    format!("the rows of {ffn} {d:?} in {weights} ({})", d[0]),
                ));
            }
        }
        Ok(())
    }

    /// Every param: name, shape as bound (linear weights `[in, out]`), and
    /// whether the file stores it transposed (`[out, in]`).
    pub fn params(&self) -> Vec<(String, Vec<usize>, bool)> {
        if let Some(m) = &self.modernbert {
            return crate::modernbert::params(self, m);
        }
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let mut p = vec![
            (
                "embeddings.word_embeddings.weight".to_string(),
                vec![self.vocab_size, h],
                false,
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![self.max_position_embeddings, h],
                false,
            ),
            ("embeddings.LayerNorm.weight".into(), vec![h], false),
            ("embeddings.LayerNorm.bias".into(), vec![h], false),
        ];
        if self.is_mpnet() {
            p.push((
                "encoder.relative_attention_bias.weight".into(),
                vec![
                    self.relative_attention_num_buckets,
                    self.num_attention_heads,
                ],
                false,
            ));
        } else {
            p.push((
                "embeddings.token_type_embeddings.weight".into(),
                vec![self.type_vocab_size, h],
                false,
            ));
        }
        let [q, k, v, o, attn_ln] = self.attention_names();
        for l in 0..self.num_hidden_layers {
            let pre = format!("encoder.layer.{l}.");
            let lin = |p: &mut Vec<_>, name: &str, i: usize, o: usize| {
                p.push((format!("{pre}{name}.weight"), vec![i, o], true));
                p.push((format!("{pre}{name}.bias"), vec![o], false));
            };
            lin(&mut p, q, h, h);
            lin(&mut p, k, h, h);
            lin(&mut p, v, h, h);
            lin(&mut p, o, h, h);
            p.push((format!("{pre}{attn_ln}.weight"), vec![h], false));
            p.push((format!("{pre}{attn_ln}.bias"), vec![h], false));
            lin(&mut p, "intermediate.dense", h, f);
            lin(&mut p, "output.dense", f, h);
            p.push((format!("{pre}output.LayerNorm.weight"), vec![h], false));
            p.push((format!("{pre}output.LayerNorm.bias"), vec![h], false));
        }
        p
    }

    /// The attention's param names inside a layer: query, key, value,
    /// output projection and the LayerNorm after it.
    fn attention_names(&self) -> [&'static str; 5] {
        if self.is_mpnet() {
            [
                "attention.attn.q",
                "attention.attn.k",
                "attention.attn.v",
                "attention.attn.o",
                "attention.LayerNorm",
            ]
        } else {
            [
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
                "attention.output.dense",
                "attention.output.LayerNorm",
            ]
        }
    }
}

/// MPNet's bucket of the relative position `rel` (key position minus query
/// position), as transformers' `MPNetEncoder.relative_position_bucket`
/// computes it: half the buckets for keys before the query, half for keys
/// after; distances below a quarter of the buckets get one bucket each,
/// longer ones share buckets on a log scale up to 128 (float32 logarithms,
/// truncated), and every farther distance the last bucket.
pub fn relative_position_bucket(rel: i64, num_buckets: usize) -> usize {
    let half = (num_buckets / 2) as i64;
    let n = -rel;
    let base = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    if n < max_exact {
        return (base + n) as usize;
    }
    let scaled = (n as f32 / max_exact as f32).ln()
        / (MPNET_MAX_DISTANCE as f32 / max_exact as f32).ln()
        * (half - max_exact) as f32;
    let large = (max_exact + scaled as i64).min(half - 1);
    (base + large) as usize
}

/// What the graph returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertOutputs {
    /// The pooled sentence vector (`[B, P]`; mean pooling then L2
    /// normalization in [`build_graph`], the given pooling in
    /// [`build_graph_pooled`]).
    pub pooled: bool,
    /// The last hidden states (`[B, S, H]`).
    pub tokens: bool,
}

/// Build the encoder for `batch x seq` tokens.
///
/// Inputs: `input_ids` i64 `[B, S]`, `token_type_ids` i64 `[B, S]`,
/// `attention_mask` f32 `[B, S]` (1 = token, 0 = padding), used as a
/// `MaskKind::Custom` keep-mask. Outputs in order: pooled (mean pooling,
/// L2-normalized), then tokens.
pub fn build_graph(
    cfg: &BertConfig,
    batch: usize,
    seq: usize,
    outs: BertOutputs,
) -> Result<Graph, IrError> {
    build_graph_pooled(cfg, batch, seq, outs, &crate::st::Pooling::default())
}

/// The extra `[B, S]` f32 inputs a pooling needs besides `attention_mask`
/// (see [`build_graph_pooled`] and [`pool_inputs`]).
pub fn pool_input_names(pooling: &crate::st::Pooling) -> Vec<&'static str> {
    use crate::st::PoolingMode as M;
    if pooling.is_plain_mean() {
        return vec![];
    }
    let mut v = Vec::new();
    if !pooling.include_prompt {
        v.push(POOL_MASK);
    }
    for m in &pooling.modes {
        let name = match m {
            M::Cls => POOL_CLS,
            M::LastToken => POOL_LAST,
            M::WeightedMean => POOL_WEIGHTS,
            M::Mean | M::Max | M::MeanSqrtLen => continue,
        };
        if !v.contains(&name) {
            v.push(name);
        }
    }
    v
}

/// The pooling mask input (the attention mask with the prompt's tokens
/// zeroed) when `include_prompt` is false.
pub const POOL_MASK: &str = "pool_mask";
/// The one-hot row selecting the first kept token (CLS pooling).
pub const POOL_CLS: &str = "pool_cls";
/// The one-hot row selecting the last kept token (last-token pooling).
pub const POOL_LAST: &str = "pool_last";
/// The position weights of weighted-mean pooling (kept tokens' position + 1).
pub const POOL_WEIGHTS: &str = "pool_weights";

/// The values of the inputs [`pool_input_names`] lists, for a right-padded
/// batch of `lengths` (tokens per row) padded to `seq`, with the first
/// `prompt_len` tokens of each row excluded from pooling when
/// `include_prompt` is false (sentence-transformers' `prompt_length`:
/// `[CLS]` and the prompt's tokens). In the order of [`pool_input_names`].
pub fn pool_inputs(
    pooling: &crate::st::Pooling,
    lengths: &[usize],
    seq: usize,
    prompt_len: usize,
) -> Vec<(&'static str, Vec<f32>)> {
    let b = lengths.len();
    let skip = if pooling.include_prompt {
        0
    } else {
        prompt_len
    };
    // The pooling mask: kept tokens of each row.
    let kept = |r: usize, t: usize| t < lengths[r] && t >= skip;
    pool_input_names(pooling)
        .into_iter()
        .map(|name| {
            let mut v = vec![0f32; b * seq];
            for (r, row) in v.chunks_mut(seq).enumerate() {
                match name {
                    POOL_MASK => (0..seq).filter(|&t| kept(r, t)).for_each(|t| row[t] = 1.0),
                    // sentence-transformers: argmax of the mask, 0 when none is kept.
                    POOL_CLS => row[(0..seq).find(|&t| kept(r, t)).unwrap_or(0)] = 1.0,
                    // The last kept token, times its mask (0 when none is kept).
                    POOL_LAST => {
                        if let Some(t) = (0..seq).rev().find(|&t| kept(r, t)) {
                            row[t] = 1.0;
                        }
                    }
                    _ => (0..seq)
                        .filter(|&t| kept(r, t))
                        .for_each(|t| row[t] = (t + 1) as f32),
                }
            }
            (name, v)
        })
        .collect()
}

/// Gather the embeddings and run the encoder layers: the token states
/// `[B, S, H]`, the `attention_mask` input, and the params by name.
fn encoder(
    g: &mut Graph,
    cfg: &BertConfig,
    batch: usize,
    seq: usize,
    extra_params: &[(String, Vec<usize>, bool)],
) -> Result<(NodeId, NodeId, std::collections::HashMap<String, NodeId>), IrError> {
    if let Some(m) = &cfg.modernbert {
        if !extra_params.is_empty() {
            return Err(IrError::InvalidArgument {
                what: "model_type".into(),
                value: "modernbert".into(),
                expected:
                    "bert, roberta, xlm-roberta or mpnet (rlx builds no task head on ModernBERT)"
                        .into(),
            });
        }
        return crate::modernbert::encoder(g, cfg, m, batch, seq);
    }
    let (b, s, h) = (batch, seq, cfg.hidden_size);
    let heads = cfg.num_attention_heads;
    let act = cfg.activation().unwrap_or(Activation::Gelu);
    let eps = cfg.layer_norm_eps;
    let ids = g.input("input_ids", Shape::new(&[b, s], DType::I64));
    let tt = g.input("token_type_ids", Shape::new(&[b, s], DType::I64));
    let mask = g.input("attention_mask", Shape::new(&[b, s], DType::F32));
    let mut params = std::collections::HashMap::new();
    for (name, dims, _) in cfg.params().iter().chain(extra_params) {
        let id = g.param(name, Shape::new(dims, DType::F32));
        params.insert(name.clone(), id);
    }
    let p = |n: &str| params[n];
    let off = cfg.position_offset as i64;
    let pos = g.constant(Tensor::i64(&[s], (off..off + s as i64).collect()));
    let word = g.push(
        Op::Gather { axis: 0 },
        vec![p("embeddings.word_embeddings.weight"), ids],
    )?;
    let posv = g.push(
        Op::Gather { axis: 0 },
        vec![p("embeddings.position_embeddings.weight"), pos],
    )?;
    let mut e = g.push(Op::Binary(BinaryOp::Add), vec![word, posv])?;
    if !cfg.is_mpnet() {
        let ttv = g.push(
            Op::Gather { axis: 0 },
            vec![p("embeddings.token_type_embeddings.weight"), tt],
        )?;
        e = g.push(Op::Binary(BinaryOp::Add), vec![e, ttv])?;
    }
    let ln = |g: &mut Graph, x: NodeId, pre: &str| {
        g.push(
            Op::LayerNorm { axis: -1, eps },
            vec![x, p(&format!("{pre}.weight")), p(&format!("{pre}.bias"))],
        )
    };
    let mut x = ln(g, e, "embeddings.LayerNorm")?;
    // MPNet: one additive bias for every layer, the relative position bias
    // plus -1e30 on padded keys.
    let (mask_kind, mask_in) = if cfg.is_mpnet() {
        let table = p("encoder.relative_attention_bias.weight");
        (MaskKind::Bias, mpnet_bias(g, cfg, table, mask, b, s)?)
    } else {
        (MaskKind::Custom, mask)
    };
    let [qn, kn, vn, on, attn_ln] = cfg.attention_names();
    for l in 0..cfg.num_hidden_layers {
        let pre = format!("encoder.layer.{l}.");
        let q = linear(g, &params, x, &format!("{pre}{qn}"))?;
        let k = linear(g, &params, x, &format!("{pre}{kn}"))?;
        let v = linear(g, &params, x, &format!("{pre}{vn}"))?;
        let a = g.push(
            Op::Attention {
                num_heads: heads,
                head_dim: h / heads,
                mask_kind,
                score_scale: None,
                attn_logit_softcap: None,
            },
            vec![q, k, v, mask_in],
        )?;
        let o = linear(g, &params, a, &format!("{pre}{on}"))?;
        let r = g.push(Op::Binary(BinaryOp::Add), vec![o, x])?;
        x = ln(g, r, &format!("{pre}{attn_ln}"))?;
        let f = linear(g, &params, x, &format!("{pre}intermediate.dense"))?;
        let f = g.push(Op::Activation(act), vec![f])?;
        let o = linear(g, &params, f, &format!("{pre}output.dense"))?;
        let r = g.push(Op::Binary(BinaryOp::Add), vec![o, x])?;
        x = ln(g, r, &format!("{pre}output.LayerNorm"))?;
    }
    Ok((x, mask, params))
}

/// MPNet's attention bias `[B, H, S, S]`: the relative position bias
/// `table[bucket(j - i), h]` (`table` `[buckets, H]`, buckets a constant of
/// the sequence length) plus `(mask[b, j] - 1) * 1e30`, which takes padded
/// keys out of the softmax as transformers' extended mask does.
fn mpnet_bias(
    g: &mut Graph,
    cfg: &BertConfig,
    table: NodeId,
    mask: NodeId,
    b: usize,
    s: usize,
) -> Result<NodeId, IrError> {
    let heads = cfg.num_attention_heads;
    let buckets: Vec<i64> = (0..s)
        .flat_map(|i| (0..s).map(move |j| (i, j)))
        .map(|(i, j)| {
            relative_position_bucket(j as i64 - i as i64, cfg.relative_attention_num_buckets) as i64
        })
        .collect();
    let idx = g.constant(Tensor::i64(&[s, s], buckets));
    let rel = g.push(Op::Gather { axis: 0 }, vec![table, idx])?; // [S, S, H]
    let rel = g.push(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        vec![rel],
    )?;
    let rel = g.push(
        Op::Reshape {
            shape: vec![1, heads, s, s],
        },
        vec![rel],
    )?;
    let one = g.constant(Tensor::f32(&[1], vec![1.0]));
    let big = g.constant(Tensor::f32(&[1], vec![1e30]));
    let off = g.push(Op::Binary(BinaryOp::Sub), vec![mask, one])?;
    let off = g.push(Op::Binary(BinaryOp::Mul), vec![off, big])?;
    let off = g.push(
        Op::Reshape {
            shape: vec![b, 1, 1, s],
        },
        vec![off],
    )?;
    g.push(Op::Binary(BinaryOp::Add), vec![rel, off])
}

/// `x W + b` for the params `{pre}.weight` (bound `[in, out]`) and `{pre}.bias`.
fn linear(
    g: &mut Graph,
    params: &std::collections::HashMap<String, NodeId>,
    x: NodeId,
    pre: &str,
) -> Result<NodeId, IrError> {
    let m = g.push(Op::MatMul, vec![x, params[&format!("{pre}.weight")]])?;
    g.push(
        Op::Binary(BinaryOp::Add),
        vec![m, params[&format!("{pre}.bias")]],
    )
}

/// [`build_graph`] with a sentence-transformers pooling: the pooled output
/// is `pooling`'s modes concatenated (`[B, modes * H]`), L2-normalized if
/// `pooling.normalize`. Mean pooling with the prompt included uses only
/// `attention_mask` (the graph of [`build_graph`]); other poolings take the
/// extra `[B, S]` f32 inputs of [`pool_input_names`], whose values
/// [`pool_inputs`] computes.
pub fn build_graph_pooled(
    cfg: &BertConfig,
    batch: usize,
    seq: usize,
    outs: BertOutputs,
    pooling: &crate::st::Pooling,
) -> Result<Graph, IrError> {
    check_shape_args(cfg, batch, seq)?;
    if pooling.modes.is_empty() {
        return Err(IrError::InvalidArgument {
            what: "pooling modes".into(),
            value: "none".into(),
            expected: format!("at least one of {}", crate::st::POOLING_MODES),
        });
    }
    let mut g = Graph::new(format!("bert{}x{}", batch, seq));
    let (x, mask, _) = encoder(&mut g, cfg, batch, seq, &[])?;
    let mut outputs = Vec::new();
    if outs.pooled {
        let pooled = if pooling.is_plain_mean() {
            mean_pool(&mut g, x, mask, pooling.normalize)?
        } else {
            general_pool(&mut g, x, mask, pooling, batch, seq)?
        };
        outputs.push(pooled);
    }
    if outs.tokens {
        outputs.push(x);
    }
    g.set_outputs(outputs);
    Ok(g)
}

/// Every pooling mode in graph ops (see [`build_graph_pooled`]).
fn general_pool(
    g: &mut Graph,
    x: NodeId,
    attention_mask: NodeId,
    pooling: &crate::st::Pooling,
    b: usize,
    s: usize,
) -> Result<NodeId, IrError> {
    use crate::st::PoolingMode as M;
    let mut inputs = std::collections::HashMap::new();
    for name in pool_input_names(pooling) {
        inputs.insert(name, g.input(name, Shape::new(&[b, s], DType::F32)));
    }
    let mask = inputs.get(POOL_MASK).copied().unwrap_or(attention_mask);
    let sum_1 = |g: &mut Graph, x: NodeId, keep_dims: bool| {
        g.push(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![1],
                keep_dims,
            },
            vec![x],
        )
    };
    // sum over the sequence of x weighted by w [B, S]: [B, H].
    let weighted_sum = |g: &mut Graph, w: NodeId| -> Result<NodeId, IrError> {
        let w3 = g.push(
            Op::Reshape {
                shape: vec![b, s, 1],
            },
            vec![w],
        )?;
        let xw = g.push(Op::Binary(BinaryOp::Mul), vec![x, w3])?;
        sum_1(g, xw, false)
    };
    // The token count (or weight sum) of w, floored at 1e-9: [B, 1].
    let count = |g: &mut Graph, w: NodeId| -> Result<NodeId, IrError> {
        let c = sum_1(g, w, true)?;
        let tiny = g.constant(Tensor::f32(&[1], vec![1e-9]));
        g.push(Op::Binary(BinaryOp::Max), vec![c, tiny])
    };
    let mut parts = Vec::new();
    let mut mean_sum = None;
    for m in &pooling.modes {
        let v = match m {
            M::Cls => weighted_sum(g, inputs[POOL_CLS])?,
            M::LastToken => weighted_sum(g, inputs[POOL_LAST])?,
            M::Mean | M::MeanSqrtLen => {
                let (sum, cnt) = match mean_sum {
                    Some(sc) => sc,
                    None => {
                        let sc = (weighted_sum(g, mask)?, count(g, mask)?);
                        mean_sum = Some(sc);
                        sc
                    }
                };
                let den = if *m == M::Mean {
                    cnt
                } else {
                    g.push(Op::Activation(Activation::Sqrt), vec![cnt])?
                };
                g.push(Op::Binary(BinaryOp::Div), vec![sum, den])?
            }
            M::WeightedMean => {
                let w = inputs[POOL_WEIGHTS];
                let sum = weighted_sum(g, w)?;
                let cnt = count(g, w)?;
                g.push(Op::Binary(BinaryOp::Div), vec![sum, cnt])?
            }
            M::Max => {
                // x where kept, x - 1e30 (below every real value) elsewhere.
                let m3 = g.push(
                    Op::Reshape {
                        shape: vec![b, s, 1],
                    },
                    vec![mask],
                )?;
                let one = g.constant(Tensor::f32(&[1], vec![1.0]));
                let big = g.constant(Tensor::f32(&[1], vec![1e30]));
                let off = g.push(Op::Binary(BinaryOp::Sub), vec![m3, one])?;
                let off = g.push(Op::Binary(BinaryOp::Mul), vec![off, big])?;
                let xm = g.push(Op::Binary(BinaryOp::Add), vec![x, off])?;
                g.push(
                    Op::Reduce {
                        op: ReduceOp::Max,
                        axes: vec![1],
                        keep_dims: false,
                    },
                    vec![xm],
                )?
            }
        };
        parts.push(v);
    }
    let pooled = if parts.len() == 1 {
        parts[0]
    } else {
        g.push(Op::Concat { axis: 1 }, parts)?
    };
    if pooling.normalize {
        l2_normalize(g, pooled)
    } else {
        Ok(pooled)
    }
}

/// `v / max(||v||, 1e-12)` along the last axis of a `[B, P]` node (as
/// `torch.nn.functional.normalize`).
fn l2_normalize(g: &mut Graph, v: NodeId) -> Result<NodeId, IrError> {
    let sq = g.push(Op::Binary(BinaryOp::Mul), vec![v, v])?;
    let ss = g.push(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keep_dims: true,
        },
        vec![sq],
    )?;
    let norm = g.push(Op::Activation(Activation::Sqrt), vec![ss])?;
    let eps12 = g.constant(Tensor::f32(&[1], vec![1e-12]));
    let norm = g.push(Op::Binary(BinaryOp::Max), vec![norm, eps12])?;
    g.push(Op::Binary(BinaryOp::Div), vec![v, norm])
}

/// The params of a `BertForSequenceClassification` head beside
/// [`BertConfig::params`]: the pooler (`pooler.dense`, `[H, H]`) and the
/// classifier (`classifier`, `[H, labels]`), linear weights bound
/// `[in, out]` (stored transposed).
pub fn classifier_params(cfg: &BertConfig, labels: usize) -> Vec<(String, Vec<usize>, bool)> {
    let h = cfg.hidden_size;
    vec![
        ("pooler.dense.weight".into(), vec![h, h], true),
        ("pooler.dense.bias".into(), vec![h], false),
        ("classifier.weight".into(), vec![h, labels], true),
        ("classifier.bias".into(), vec![labels], false),
    ]
}

/// A `BertForSequenceClassification` graph for `batch x seq` tokens (the
/// inputs of [`build_graph`]): the `[CLS]` state through the pooler
/// (dense + tanh) and the classifier, one output, the logits `[B, labels]`.
pub fn build_classifier_graph(
    cfg: &BertConfig,
    batch: usize,
    seq: usize,
    labels: usize,
) -> Result<Graph, IrError> {
    check_shape_args(cfg, batch, seq)?;
    if labels == 0 {
        return Err(IrError::InvalidArgument {
            what: "num_labels".into(),
            value: "0".into(),
            expected: "at least 1".into(),
        });
    }
    let mut g = Graph::new(format!("bert_classifier{}x{}", batch, seq));
    let extra = classifier_params(cfg, labels);
    let (x, _, params) = encoder(&mut g, cfg, batch, seq, &extra)?;
    let h = cfg.hidden_size;
    let cls = g.push(
        Op::Narrow {
            axis: 1,
            start: 0,
            len: 1,
        },
        vec![x],
    )?;
    let cls = g.push(
        Op::Reshape {
            shape: vec![batch, h],
        },
        vec![cls],
    )?;
    let p = linear(&mut g, &params, cls, "pooler.dense")?;
    let p = g.push(Op::Activation(Activation::Tanh), vec![p])?;
    let logits = linear(&mut g, &params, p, "classifier")?;
    g.set_outputs(vec![logits]);
    Ok(g)
}

/// Check a config and a `batch x seq` request before a graph is built
/// (nothing is allocated from them before this passes): the config's ranges
/// ([`BertConfig::validate`]), `batch >= 1`, and
/// `1 <= seq <= max_position_embeddings - position_offset`.
pub fn check_shape_args(cfg: &BertConfig, batch: usize, seq: usize) -> Result<(), IrError> {
    cfg.validate("config")
        .map_err(|e| IrError::InvalidArgument {
            what: e.key,
            value: e.value,
            expected: e.expected,
        })?;
    if batch == 0 {
        return Err(IrError::InvalidArgument {
            what: "batch".into(),
            value: "0".into(),
            expected: "at least 1".into(),
        });
    }
    if seq == 0 || seq > cfg.max_seq() {
        return Err(IrError::InvalidArgument {
            what: "seq".into(),
            value: seq.to_string(),
            expected: format!(
                "1..={} (max_position_embeddings: the model's position table)",
                cfg.max_seq()
            ),
        });
    }
    Ok(())
}

/// The architectures [`load_dir_config`] accepts.
pub const SUPPORTED_ARCHITECTURES: &str = "BertModel, BertForSequenceClassification, \
     XLMRobertaModel, RobertaModel, MPNetModel, ModernBertModel \
     (model_type bert, xlm-roberta, roberta, mpnet or modernbert)";

/// The prefix of the encoder's tensor names in a weight file: `""` for a
/// base model's file (`embeddings.word_embeddings.weight`, ModernBERT's
/// `embeddings.tok_embeddings.weight`), `bert.`, `roberta.`, `mpnet.` or
/// (ModernBERT's) `model.` for a task model's (`bert.embeddings...`), `""`
/// if none matches (the loader then names the missing tensor).
pub fn weight_prefix<'a>(names: impl IntoIterator<Item = &'a str>) -> &'static str {
    let names: Vec<&str> = names.into_iter().collect();
    for pre in ["", "bert.", "roberta.", "mpnet.", "model."] {
        for table in ["word_embeddings", "tok_embeddings"] {
            let want = format!("{pre}embeddings.{table}.weight");
            if names.iter().any(|n| *n == want) {
                return pre;
            }
        }
    }
    ""
}

/// Read and check a BERT model directory's configs without reading the
/// weights: `config.json` (each key typed and range-checked, see
/// [`BertConfig::from_json`] and [`BertConfig::validate`]; the
/// architecture one of [`SUPPORTED_ARCHITECTURES`]), checked against
/// the tensor names and shapes in `model.safetensors`'s header when the file
/// is there ([`BertConfig::check_tensors`]), and the maximum sequence
/// length: `max_seq_length` of `sentence_bert_config.json` (a positive
/// integer at most the position table's length), else `model_max_length` of
/// `tokenizer_config.json` (where sentence-transformers 5+ saves it, capped
/// at the position table's length), else the position table's length
/// ([`BertConfig::max_seq`]). Returns the config and that length.
pub fn load_dir_config(dir: &Path) -> Result<(BertConfig, usize), ModelError> {
    let cfg_path = dir.join("config.json");
    let file = cfg_path.display().to_string();
    let raw = read_json(&cfg_path)?;
    let cfg = BertConfig::from_json(&file, &raw)?;
    let family = ["Bert", "XLMRoberta", "Roberta", "MPNet"];
    let is_bert = matches!(
        cfg.model_type.as_str(),
        "bert" | "roberta" | "xlm-roberta" | "mpnet"
    ) || cfg
        .architectures
        .iter()
        .any(|a| family.iter().any(|f| a.starts_with(f)));
    // ModernBERT's activation is checked by `validate`, which names the key.
    if !cfg.is_modernbert() && (!is_bert || cfg.activation().is_none()) {
        return Err(ModelError::UnknownArchitecture {
            path: cfg_path,
            found: cfg.architectures.clone(),
            model_type: cfg.model_type.clone(),
        });
    }
    cfg.validate(&file)?;
    let weights = dir.join("model.safetensors");
    if weights.is_file() {
        let st = rlx_formats::SafeTensorsFile::open(&weights)?;
        let pre = weight_prefix(st.names());
        let names: Vec<&str> = st
            .names()
            .into_iter()
            .filter_map(|n| n.strip_prefix(pre))
            .collect();
        cfg.check_tensors(&file, "model.safetensors", names, |n| {
            st.info(&format!("{pre}{n}")).map(|(_, d)| d)
        })?;
    }
    let max_pos = cfg.max_seq();
    let st_path = dir.join("sentence_bert_config.json");
    let from_st = if st_path.exists() {
        let st_file = st_path.display().to_string();
        match read_json(&st_path)?.get("max_seq_length") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if (1..=max_pos).contains(&n) => Some(n),
                _ => {
                    return Err(ConfigError::new(
                        st_file,
                        "max_seq_length",
                        v,
                        format!("a positive integer <= max_position_embeddings {max_pos}"),
                    )
                    .into())
                }
            },
        }
    } else {
        None
    };
    let max_len = match from_st {
        Some(n) => n,
        None => tokenizer_max_length(dir)?.map_or(max_pos, |n| n.min(max_pos)),
    };
    Ok((cfg, max_len))
}

/// `model_max_length` of `dir/tokenizer_config.json`, if the file and the
/// key are there (a huge value, as transformers writes for "no limit",
/// reads as `usize::MAX`).
pub fn tokenizer_max_length(dir: &Path) -> Result<Option<usize>, ModelError> {
    let path = dir.join("tokenizer_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    match read_json(&path)?.get("model_max_length") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x >= 1.0 => Ok(Some(if x >= usize::MAX as f64 {
                usize::MAX
            } else {
                x as usize
            })),
            _ => Err(ConfigError::new(
                path.display().to_string(),
                "model_max_length",
                v,
                "a positive number",
            )
            .into()),
        },
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|_| ModelError::MissingFile {
        path: path.into(),
        what: "a JSON config",
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: path.into(),
        message: format!("invalid JSON: {e}"),
    })
}

/// The sentence embedding of token states `x` `[B, S, H]` under the
/// attention mask `mask` `[B, S]` (1 keeps a token): the mean of the kept
/// rows (the count floored at 1e-9), L2-normalized (the norm floored at
/// 1e-12) when `normalize` is set, as sentence-transformers computes it.
/// The CUDA backend runs this tail as one kernel.
pub fn mean_pool(
    g: &mut Graph,
    x: NodeId,
    mask: NodeId,
    normalize: bool,
) -> Result<NodeId, IrError> {
    let shape = g.node(mask).shape.clone();
    let [b, s] = shape.dims[..] else {
        return Err(IrError::Shape {
            node: mask,
            op: "mean_pool".into(),
            inputs: vec![shape],
            expected: "a [batch, seq] attention mask".into(),
        });
    };
    // Sums over the sequence (axis 1), keeping it as a 1 or not.
    let sum_1 = |g: &mut Graph, x: NodeId, keep_dims: bool| {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keep_dims,
        };
        g.push(op, vec![x])
    };
    let m3 = g.push(
        Op::Reshape {
            shape: vec![b, s, 1],
        },
        vec![mask],
    )?;
    let xm = g.push(Op::Binary(BinaryOp::Mul), vec![x, m3])?;
    let sum = sum_1(g, xm, false)?;
    let cnt = sum_1(g, mask, true)?;
    let tiny = g.constant(Tensor::f32(&[1], vec![1e-9]));
    let cnt = g.push(Op::Binary(BinaryOp::Max), vec![cnt, tiny])?;
    let mean = g.push(Op::Binary(BinaryOp::Div), vec![sum, cnt])?;
    if !normalize {
        return Ok(mean);
    }
    let sq = g.push(Op::Binary(BinaryOp::Mul), vec![mean, mean])?;
    let ss = sum_1(g, sq, true)?;
    let norm = g.push(Op::Activation(Activation::Sqrt), vec![ss])?;
    let eps12 = g.constant(Tensor::f32(&[1], vec![1e-12]));
    let norm = g.push(Op::Binary(BinaryOp::Max), vec![norm, eps12])?;
    g.push(Op::Binary(BinaryOp::Div), vec![mean, norm])
}

/// Deterministic pseudo-random weights for a config (for tests and
/// benchmarks of BERT-shaped graphs). Values are in `[-scale, scale]`;
/// LayerNorm gammas are near 1.
pub fn synthetic_params(cfg: &BertConfig, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    cfg.params()
        .into_iter()
        .map(|(name, dims, _)| {
            let n: usize = dims.iter().product();
            let is_gamma = name.ends_with("LayerNorm.weight") || name.ends_with("norm.weight");
            let scale = if name.contains("embeddings") {
                0.5
            } else {
                0.08
            };
            let v = (0..n)
                .map(|_| {
                    if is_gamma {
                        1.0 + 0.1 * next()
                    } else {
                        scale * next()
                    }
                })
                .collect();
            (name, v)
        })
        .collect()
}
