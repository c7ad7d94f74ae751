//! BERT encoder graphs, driven by a Hugging Face `config.json`.
//!
//! The graph is written in plain ops (MatMul, Add, Gelu, LayerNorm, ...);
//! `rlx-opt` finds the fused ops. Param names are the safetensors tensor
//! names (without a `bert.` prefix). Linear weights are bound transposed,
//! as `[in, out]`, so that `MatMul(x, W)` computes `x W^T` of PyTorch.

use rlx_ir::{
    op::{Activation, BinaryOp, MaskKind, ReduceOp},
    DType, Graph, IrError, NodeId, Op, Shape, Tensor,
};
use serde::Deserialize;

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
