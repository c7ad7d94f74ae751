//! BERT encoder graphs, driven by a Hugging Face `config.json`.
//!
//! The graph is written in plain ops (MatMul, Add, Gelu, LayerNorm, ...);
//! `rlx-opt` finds the fused ops. Param names are the safetensors tensor
//! names (without a `bert.` prefix). Linear weights are bound transposed,
//! as `[in, out]`, so that `MatMul(x, W)` computes `x W^T` of PyTorch.

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
}

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
        }
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
        let layer_norm_eps = match get("layer_norm_eps") {
            None => eps(),
            Some(x) => x.as_f64().ok_or_else(|| {
                ConfigError::new(file, "layer_norm_eps", x, "a positive finite number")
            })? as f32,
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
        Ok(BertConfig {
            hidden_size: uint("hidden_size", None)?,
            num_hidden_layers: uint("num_hidden_layers", None)?,
            num_attention_heads: uint("num_attention_heads", None)?,
            intermediate_size: uint("intermediate_size", None)?,
            vocab_size: uint("vocab_size", None)?,
            max_position_embeddings: uint("max_position_embeddings", None)?,
            type_vocab_size: uint("type_vocab_size", Some(two()))?,
            layer_norm_eps,
            hidden_act: string("hidden_act", gelu())?,
            architectures,
            model_type: string("model_type", String::new())?,
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
        positive("type_vocab_size", self.type_vocab_size)?;
        positive_finite(file, "layer_norm_eps", self.layer_norm_eps as f64)?;
        if self.activation().is_none() {
            return Err(ConfigError::new(
                file,
                "hidden_act",
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
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![self.type_vocab_size, h],
                false,
            ),
            ("embeddings.LayerNorm.weight".into(), vec![h], false),
            ("embeddings.LayerNorm.bias".into(), vec![h], false),
        ];
        for l in 0..self.num_hidden_layers {
            let pre = format!("encoder.layer.{l}.");
            let lin = |p: &mut Vec<_>, name: &str, i: usize, o: usize| {
                p.push((format!("{pre}{name}.weight"), vec![i, o], true));
                p.push((format!("{pre}{name}.bias"), vec![o], false));
            };
            lin(&mut p, "attention.self.query", h, h);
            lin(&mut p, "attention.self.key", h, h);
            lin(&mut p, "attention.self.value", h, h);
            lin(&mut p, "attention.output.dense", h, h);
            p.push((
                format!("{pre}attention.output.LayerNorm.weight"),
                vec![h],
                false,
            ));
            p.push((
                format!("{pre}attention.output.LayerNorm.bias"),
                vec![h],
                false,
            ));
            lin(&mut p, "intermediate.dense", h, f);
            lin(&mut p, "output.dense", f, h);
            p.push((format!("{pre}output.LayerNorm.weight"), vec![h], false));
            p.push((format!("{pre}output.LayerNorm.bias"), vec![h], false));
        }
        p
    }
}

/// What the graph returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertOutputs {
    /// Mean pooling over the mask, then L2 normalization (`[B, H]`).
    pub pooled: bool,
    /// The last hidden states (`[B, S, H]`).
    pub tokens: bool,
}

/// Build the encoder for `batch x seq` tokens.
///
/// Inputs: `input_ids` i64 `[B, S]`, `token_type_ids` i64 `[B, S]`,
/// `attention_mask` f32 `[B, S]` (1 = token, 0 = padding), used as a
/// `MaskKind::Custom` keep-mask. Outputs in order: pooled, then tokens.
pub fn build_graph(
    cfg: &BertConfig,
    batch: usize,
    seq: usize,
    outs: BertOutputs,
) -> Result<Graph, IrError> {
    check_shape_args(cfg, batch, seq)?;
    let (b, s, h) = (batch, seq, cfg.hidden_size);
    let heads = cfg.num_attention_heads;
    let act = cfg.activation().unwrap_or(Activation::Gelu);
    let eps = cfg.layer_norm_eps;
    let mut g = Graph::new(format!("bert{}x{}", b, s));
    let ids = g.input("input_ids", Shape::new(&[b, s], DType::I64));
    let tt = g.input("token_type_ids", Shape::new(&[b, s], DType::I64));
    let mask = g.input("attention_mask", Shape::new(&[b, s], DType::F32));
    let mut params = std::collections::HashMap::new();
    for (name, dims, _) in cfg.params() {
        let id = g.param(&name, Shape::new(&dims, DType::F32));
        params.insert(name, id);
    }
    let p = |n: &str| params[n];
    let pos = g.constant(Tensor::i64(&[s], (0..s as i64).collect()));
    let word = g.push(
        Op::Gather { axis: 0 },
        vec![p("embeddings.word_embeddings.weight"), ids],
    )?;
    let posv = g.push(
        Op::Gather { axis: 0 },
        vec![p("embeddings.position_embeddings.weight"), pos],
    )?;
    let ttv = g.push(
        Op::Gather { axis: 0 },
        vec![p("embeddings.token_type_embeddings.weight"), tt],
    )?;
    let e = g.push(Op::Binary(BinaryOp::Add), vec![word, posv])?;
    let e = g.push(Op::Binary(BinaryOp::Add), vec![e, ttv])?;
    let ln = |g: &mut Graph, x: NodeId, pre: &str| {
        g.push(
            Op::LayerNorm { axis: -1, eps },
            vec![p(&format!("{pre}.weight")), p(&format!("{pre}.bias"))]
                .into_iter()
                .fold(vec![x], |mut v, i| {
                    v.push(i);
                    v
                }),
        )
    };
    let linear = |g: &mut Graph, x: NodeId, pre: &str| -> Result<NodeId, IrError> {
        let m = g.push(Op::MatMul, vec![x, p(&format!("{pre}.weight"))])?;
        g.push(
            Op::Binary(BinaryOp::Add),
            vec![m, p(&format!("{pre}.bias"))],
        )
    };
    let mut x = ln(&mut g, e, "embeddings.LayerNorm")?;
    for l in 0..cfg.num_hidden_layers {
        let pre = format!("encoder.layer.{l}.");
        let q = linear(&mut g, x, &format!("{pre}attention.self.query"))?;
        let k = linear(&mut g, x, &format!("{pre}attention.self.key"))?;
        let v = linear(&mut g, x, &format!("{pre}attention.self.value"))?;
        let a = g.push(
            Op::Attention {
                num_heads: heads,
                head_dim: h / heads,
                mask_kind: MaskKind::Custom,
                score_scale: None,
                attn_logit_softcap: None,
            },
            vec![q, k, v, mask],
        )?;
        let o = linear(&mut g, a, &format!("{pre}attention.output.dense"))?;
        let r = g.push(Op::Binary(BinaryOp::Add), vec![o, x])?;
        x = ln(&mut g, r, &format!("{pre}attention.output.LayerNorm"))?;
        let f = linear(&mut g, x, &format!("{pre}intermediate.dense"))?;
        let f = g.push(Op::Activation(act), vec![f])?;
        let o = linear(&mut g, f, &format!("{pre}output.dense"))?;
        let r = g.push(Op::Binary(BinaryOp::Add), vec![o, x])?;
        x = ln(&mut g, r, &format!("{pre}output.LayerNorm"))?;
    }
    let mut outputs = Vec::new();
    if outs.pooled {
        outputs.push(mean_pool(&mut g, x, mask, true)?);
    }
    if outs.tokens {
        outputs.push(x);
    }
    g.set_outputs(outputs);
    Ok(g)
}

/// Check a config and a `batch x seq` request before a graph is built
/// (nothing is allocated from them before this passes): the config's ranges
/// ([`BertConfig::validate`]), `batch >= 1`, and
/// `1 <= seq <= max_position_embeddings`.
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
    if seq == 0 || seq > cfg.max_position_embeddings {
        return Err(IrError::InvalidArgument {
            what: "seq".into(),
            value: seq.to_string(),
            expected: format!(
                "1..={} (max_position_embeddings: the model's position table)",
                cfg.max_position_embeddings
            ),
        });
    }
    Ok(())
}

/// Read and check a BERT model directory's configs without reading the
/// weights: `config.json` (each key typed and range-checked, see
/// [`BertConfig::from_json`] and [`BertConfig::validate`]), checked against
/// the tensor names and shapes in `model.safetensors`'s header when the file
/// is there ([`BertConfig::check_tensors`]), and `max_seq_length` of
/// `sentence_bert_config.json` (a positive integer at most
/// `max_position_embeddings`). Returns the config and the tokenizer's
/// maximum length (`max_seq_length`, else `max_position_embeddings`).
pub fn load_dir_config(dir: &Path) -> Result<(BertConfig, usize), ModelError> {
    let cfg_path = dir.join("config.json");
    let file = cfg_path.display().to_string();
    let raw = read_json(&cfg_path)?;
    let cfg = BertConfig::from_json(&file, &raw)?;
    let is_bert =
        cfg.model_type == "bert" || cfg.architectures.iter().any(|a| a.starts_with("Bert"));
    if !is_bert || cfg.activation().is_none() {
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
        cfg.check_tensors(&file, "model.safetensors", st.names(), |n| {
            st.info(n).map(|(_, d)| d)
        })?;
    }
    let max_pos = cfg.max_position_embeddings;
    let st_path = dir.join("sentence_bert_config.json");
    let max_len = if st_path.exists() {
        let st_file = st_path.display().to_string();
        match read_json(&st_path)?.get("max_seq_length") {
            None | Some(Value::Null) => max_pos,
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if (1..=max_pos).contains(&n) => n,
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
        max_pos
    };
    Ok((cfg, max_len))
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
            let is_gamma = name.ends_with("LayerNorm.weight");
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
