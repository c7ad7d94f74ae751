//! Qwen3-Next (`qwen3_next`) and Qwen3.5's text decoder (`qwen3_5_text`):
//! GatedDeltaNet / gated-attention hybrids loaded from a Hugging Face
//! directory (`config.json` + `model.safetensors`), as transformers defines
//! them.
//!
//! Per layer: `h += mixer(RmsNorm(h)); h += ffn(RmsNorm(h))`, then a final
//! RmsNorm and the head. `layer_types` (or `full_attention_interval`) picks
//! the mixer:
//!
//! - `linear_attention`: the GatedDeltaNet block of [`crate::recurrent`]
//!   ([`gdn_block`]), with a carried conv state and recurrent state;
//! - `full_attention`: q (with an output gate), k, v projections; per-head
//!   q/k RMSNorm; partial NeoX rotary (`partial_rotary_factor`); attention
//!   over a KV cache (`CacheWrite` into params `cache.k.{l}` / `cache.v.{l}`);
//!   `o * sigmoid(gate)`; out-projection.
//!
//! The FFN is a SwiGLU MLP, or (Qwen3-Next, layers with
//! `(l + 1) % decoder_sparse_step == 0` not in `mlp_only_layers`) a sparse
//! MoE block: router softmax over `num_experts`, the top `num_experts_per_tok`
//! kept (renormalized with `norm_topk_prob`), plus a shared expert scaled by
//! `sigmoid(shared_expert_gate(x))`. rlx has no routing op, so the block is
//! dense: every expert runs on every token and the unselected ones get weight
//! 0. The top-k mask is built from plain ops: expert `e` is kept when fewer
//! than `k` experts have a strictly larger probability (`step(x) =
//! min(max(x * 1e30, 0), 1)` on the pairwise differences). Right for the
//! small test configs; a real 512-expert model would want a gather-based
//! routing op. Exactly tied probabilities (which random weights do not
//! produce) would keep more than `k` experts.
//!
//! # How the loader maps transformers' conventions onto rlx's
//!
//! - Linear weights `[out, in]` become `[in, out]` (`MatMul(x, W)`).
//! - `in_proj_qkvz` / `in_proj_ba` (Qwen3-Next) are grouped per key head:
//!   per key head `[q (dk) | k (dk) | v (r dv) | z (r dv)]` and `[b (r) | a (r)]`
//!   with `r = Hv / Hk` (`fix_query_key_value_ordering`). The loader permutes
//!   the rows into rlx's `[q all | k all | v all | z all]` and
//!   `[b all | a all]` ([`qkvz_row_order`], [`ba_row_order`]). Qwen3.5's
//!   separate `in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a` are
//!   already in that order and are concatenated.
//! - `conv1d.weight [C, 1, K]` becomes the taps `conv_w.{j} = weight[:, 0, j]`.
//! - `A_log` becomes `A = -exp(A_log)`; with `dt_bias` the block computes
//!   transformers' `g = -exp(A_log) * softplus(a + dt_bias)` and passes it as
//!   the log decay of `Op::GatedDeltaNet`; `beta = sigmoid(b)` as its beta.
//! - q/k are L2-normalized before the op (transformers'
//!   `use_qk_l2norm_in_kernel`, eps 1e-6); the op's output scale
//!   `1/sqrt(n)` is transformers' `query * head_k_dim^-0.5`. The state
//!   layouts agree (`[B, Hv, dk, dv]`, `S[i][j] += k[i] delta[j]`); the conv
//!   state is time-major `[B, K - 1, C]` (transformers: `[B, C, K]`).
//! - The gated norm (`Qwen3NextRMSNormGated`, weight used as is) is
//!   `RmsNorm(o) * silu(z)` per value head.
//! - Every other RMSNorm (`input_layernorm`, `post_attention_layernorm`,
//!   `norm`, `q_norm`, `k_norm`) scales by `1 + w`: the loader adds 1.
//! - `q_proj` rows are per head `[query (hd) | gate (hd)]`; the loader
//!   permutes them into `[all queries | all gates]`.
//!
//! The op's single head width needs `linear_key_head_dim ==
//! linear_value_head_dim` (true of the released models); other configs are
//! refused with an error naming both.

use crate::recurrent::{gdn_block, GdnConfig};
use rlx_cpu::{CpuModel, CpuOptions};
use rlx_formats::{FormatError, SafeTensorsFile};
use rlx_ir::{
    op::{Activation, BinaryOp, MaskKind, ReduceOp, RopeStyle},
    DType, Graph, IrError, NodeId, Op, Shape, Tensor,
};
use rlx_runtime::{Executable, RuntimeError, TensorRef};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The `model_type`s this module loads.
pub const SUPPORTED_MODEL_TYPES: [&str; 2] = ["qwen3_next", "qwen3_5_text"];

/// Why loading or running a Qwen3-Next-family model failed.
#[derive(Debug, thiserror::Error)]
pub enum Qwen3NextError {
    /// `config.json` could not be read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON or a key has the wrong type.
    #[error("{path}: {detail}", path = path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The config names another architecture.
    #[error("unsupported model_type '{found}' (supported: qwen3_next, qwen3_5_text)")]
    UnsupportedModelType {
        /// The `model_type` found.
        found: String,
    },
    /// A hyper-parameter is missing, out of range or inconsistent.
    #[error("config key '{key}': {detail}")]
    BadConfig {
        /// The key.
        key: String,
        /// What is wrong, with the value found and what was expected.
        detail: String,
    },
    /// A tensor the model needs is not in the file.
    #[error("missing tensor '{name}': expected {expected}")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// Expected dtype and shape.
        expected: String,
    },
    /// A tensor has the wrong shape.
    #[error("tensor '{name}' has shape {found:?} ({dtype}), expected {expected}")]
    BadTensor {
        /// Tensor name.
        name: String,
        /// Shape found.
        found: Vec<usize>,
        /// Dtype found.
        dtype: String,
        /// Expected dtype and shape.
        expected: String,
    },
    /// The safetensors file could not be read (truncated, corrupt header,
    /// a dtype that is not F32/F16/BF16).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The graph failed to build or verify.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The runtime refused to compile or run a graph.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A token id is outside the vocabulary.
    #[error("token id {id} at position {position} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Its index in the ids given.
        position: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The tokens would not fit the KV cache.
    #[error("context overflow: {needed} positions needed but the context holds {ctx_len}")]
    ContextOverflow {
        /// Positions needed.
        needed: usize,
        /// Context length the model was loaded with.
        ctx_len: usize,
    },
    /// No tokens were given.
    #[error("empty input: at least one token id is needed")]
    Empty,
    /// A graph output was not what the builder declared.
    #[error("internal: output {index} is {found}, expected {expected}")]
    BadOutput {
        /// Output index.
        index: usize,
        /// What came back.
        found: String,
        /// What was expected.
        expected: String,
    },
}

/// Which token mixer a layer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// A GatedDeltaNet block (`linear_attention`).
    Linear,
    /// Gated softmax attention over a KV cache (`full_attention`).
    Full,
}

/// Which FFN a layer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// SwiGLU MLP of `intermediate_size`.
    Dense,
    /// Sparse MoE with a shared expert.
    Moe,
}

/// Hyper-parameters from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3NextConfig {
    /// `qwen3_next` or `qwen3_5_text`.
    pub model_type: String,
    /// Vocabulary size.
    pub vocab: usize,
    /// Model width D.
    pub hidden: usize,
    /// Dense MLP width.
    pub intermediate: usize,
    /// Per layer: its mixer.
    pub layers: Vec<LayerKind>,
    /// Per layer: its FFN.
    pub ffn: Vec<FfnKind>,
    /// Attention query heads.
    pub num_heads: usize,
    /// Attention key/value heads.
    pub num_kv_heads: usize,
    /// Attention head dim.
    pub head_dim: usize,
    /// Rotated dims per attention head (`head_dim * partial_rotary_factor`).
    pub n_rot: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon (also the gated norm's).
    pub eps: f32,
    /// The GDN layers' sizes.
    pub gdn: GdnConfig,
    /// Routed experts (0: no MoE).
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Each expert's MLP width.
    pub moe_intermediate: usize,
    /// The shared expert's MLP width.
    pub shared_intermediate: usize,
    /// Renormalize the kept router probabilities to sum 1.
    pub norm_topk_prob: bool,
    /// The head reuses the embedding table.
    pub tie_embeddings: bool,
}

fn cfg_err(key: &str, detail: impl Into<String>) -> Qwen3NextError {
    Qwen3NextError::BadConfig {
        key: key.into(),
        detail: detail.into(),
    }
}

fn get_usize(j: &serde_json::Value, key: &str) -> Result<usize, Qwen3NextError> {
    match j.get(key) {
        None => Err(cfg_err(key, "missing; expected a positive integer")),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| cfg_err(key, format!("found {v}, expected a positive integer"))),
    }
}

fn get_usize_or(j: &serde_json::Value, key: &str, default: usize) -> Result<usize, Qwen3NextError> {
    match j.get(key) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| cfg_err(key, format!("found {v}, expected a non-negative integer"))),
    }
}

fn get_f64_or(j: &serde_json::Value, key: &str, default: f64) -> Result<f64, Qwen3NextError> {
    match j.get(key) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| cfg_err(key, format!("found {v}, expected a finite number"))),
    }
}

impl Qwen3NextConfig {
    /// Parse a `config.json` value. Errors name the key, the value found and
    /// what was expected; an unknown `model_type` is
    /// [`Qwen3NextError::UnsupportedModelType`].
    pub fn from_json(j: &serde_json::Value) -> Result<Self, Qwen3NextError> {
        let model_type = j
            .get("model_type")
            .and_then(|v| v.as_str())
            .ok_or_else(|| cfg_err("model_type", "missing; expected a string"))?
            .to_string();
        if !SUPPORTED_MODEL_TYPES.contains(&model_type.as_str()) {
            return Err(Qwen3NextError::UnsupportedModelType { found: model_type });
        }
        let act = j
            .get("hidden_act")
            .and_then(|v| v.as_str())
            .unwrap_or("silu");
        if act != "silu" {
            return Err(cfg_err(
                "hidden_act",
                format!("found '{act}', expected 'silu'"),
            ));
        }
        let n_layers = get_usize(j, "num_hidden_layers")?;
        let layers: Vec<LayerKind> = match j.get("layer_types") {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(LayerKind::Linear),
                    Some("full_attention") => Ok(LayerKind::Full),
                    _ => Err(cfg_err(
                        "layer_types",
                        format!("found {t}, expected 'linear_attention' or 'full_attention'"),
                    )),
                })
                .collect::<Result<_, _>>()?,
            None | Some(serde_json::Value::Null) => {
                let every = get_usize_or(j, "full_attention_interval", 4)?.max(1);
                (0..n_layers)
                    .map(|i| {
                        if (i + 1) % every == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Linear
                        }
                    })
                    .collect()
            }
            Some(v) => {
                return Err(cfg_err(
                    "layer_types",
                    format!("found {v}, expected a list"),
                ))
            }
        };
        if layers.len() != n_layers {
            return Err(cfg_err(
                "layer_types",
                format!(
                    "{} entries, expected num_hidden_layers = {n_layers}",
                    layers.len()
                ),
            ));
        }
        let hidden = get_usize(j, "hidden_size")?;
        let num_heads = get_usize(j, "num_attention_heads")?;
        let num_kv_heads = get_usize(j, "num_key_value_heads")?;
        let head_dim = get_usize_or(j, "head_dim", hidden / num_heads)?;
        if head_dim == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(cfg_err(
                "num_key_value_heads",
                format!("{num_kv_heads} must divide num_attention_heads {num_heads} (head_dim {head_dim})"),
            ));
        }
        let rope = j.get("rope_parameters").or_else(|| j.get("rope_scaling"));
        let rope_obj = rope.filter(|v| v.is_object());
        if let Some(t) = rope_obj
            .and_then(|r| r.get("rope_type"))
            .and_then(|v| v.as_str())
        {
            if t != "default" {
                return Err(cfg_err(
                    "rope_parameters.rope_type",
                    format!("found '{t}', expected 'default'"),
                ));
            }
        }
        let from_rope = |k: &str| rope_obj.and_then(|r| r.get(k)).and_then(|v| v.as_f64());
        let rope_theta = from_rope("rope_theta")
            .map(Ok)
            .unwrap_or_else(|| get_f64_or(j, "rope_theta", 10_000.0))?;
        let partial = from_rope("partial_rotary_factor")
            .map(Ok)
            .unwrap_or_else(|| get_f64_or(j, "partial_rotary_factor", 0.25))?;
        let n_rot = (head_dim as f64 * partial) as usize;
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > head_dim {
            return Err(cfg_err(
                "partial_rotary_factor",
                format!("{partial} gives {n_rot} rotary dims of head_dim {head_dim}; expected an even count in 2..=head_dim"),
            ));
        }
        let eps = get_f64_or(j, "rms_norm_eps", 1e-6)? as f32;
        let dk = get_usize(j, "linear_key_head_dim")?;
        let dv = get_usize(j, "linear_value_head_dim")?;
        if dk != dv {
            return Err(cfg_err(
                "linear_value_head_dim",
                format!("{dv} differs from linear_key_head_dim {dk}: rlx's GatedDeltaNet takes one head width"),
            ));
        }
        let gdn = GdnConfig {
            hidden,
            num_k_heads: get_usize(j, "linear_num_key_heads")?,
            num_v_heads: get_usize(j, "linear_num_value_heads")?,
            head_dim: dk,
            conv_kernel: get_usize(j, "linear_conv_kernel_dim")?,
            norm_eps: eps,
        };
        if !gdn.num_v_heads.is_multiple_of(gdn.num_k_heads) || gdn.conv_kernel < 2 {
            return Err(cfg_err(
                "linear_num_value_heads",
                format!(
                    "{} value heads over {} key heads, conv kernel {}: expected a multiple and a kernel >= 2",
                    gdn.num_v_heads, gdn.num_k_heads, gdn.conv_kernel
                ),
            ));
        }
        let is_next = model_type == "qwen3_next";
        let num_experts = if is_next {
            get_usize_or(j, "num_experts", 0)?
        } else {
            0
        };
        let mut ffn = vec![FfnKind::Dense; n_layers];
        let (mut top_k, mut moe_intermediate, mut shared_intermediate) = (0, 0, 0);
        if num_experts > 0 {
            top_k = get_usize(j, "num_experts_per_tok")?;
            if top_k > num_experts {
                return Err(cfg_err(
                    "num_experts_per_tok",
                    format!("{top_k} exceeds num_experts {num_experts}"),
                ));
            }
            moe_intermediate = get_usize(j, "moe_intermediate_size")?;
            shared_intermediate = get_usize(j, "shared_expert_intermediate_size")?;
            let step = get_usize_or(j, "decoder_sparse_step", 1)?.max(1);
            let dense_only: Vec<u64> = match j.get("mlp_only_layers") {
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_u64().ok_or_else(|| {
                            cfg_err(
                                "mlp_only_layers",
                                format!("found {v}, expected layer indices"),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?,
                _ => vec![],
            };
            for (l, f) in ffn.iter_mut().enumerate() {
                if !dense_only.contains(&(l as u64)) && (l + 1) % step == 0 {
                    *f = FfnKind::Moe;
                }
            }
        }
        let needs_dense = ffn.contains(&FfnKind::Dense);
        let intermediate = if needs_dense {
            get_usize(j, "intermediate_size")?
        } else {
            get_usize_or(j, "intermediate_size", 0)?
        };
        Ok(Qwen3NextConfig {
            vocab: get_usize(j, "vocab_size")?,
            hidden,
            intermediate,
            layers,
            ffn,
            num_heads,
            num_kv_heads,
            head_dim,
            n_rot,
            rope_theta: rope_theta as f32,
            eps,
            gdn,
            num_experts,
            top_k,
            moe_intermediate,
            shared_intermediate,
            norm_topk_prob: j
                .get("norm_topk_prob")
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
            tie_embeddings: j
                .get("tie_word_embeddings")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            model_type,
        })
    }

    /// Read and parse `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, Qwen3NextError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Qwen3NextError::Io {
            path: path.clone(),
            source,
        })?;
        let j: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Qwen3NextError::Json {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        Self::from_json(&j)
    }

    /// Width of one attention layer's K (or V) cache row: `Hkv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Indices of the GDN layers, in order.
    pub fn linear_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.layers[l] == LayerKind::Linear)
            .collect()
    }
}

/// The order in which rlx's `[q | k | v | z]` columns take transformers'
/// `in_proj_qkvz` rows: entry `i` is the HF row of rlx column `i`.
/// `hk` key heads, `r = Hv / Hk`, head dims `dk`, `dv`.
pub fn qkvz_row_order(hk: usize, r: usize, dk: usize, dv: usize) -> Vec<usize> {
    let blk = 2 * dk + 2 * r * dv;
    let mut order = Vec::with_capacity(hk * blk);
    for (off, len) in [
        (0, dk),
        (dk, dk),
        (2 * dk, r * dv),
        (2 * dk + r * dv, r * dv),
    ] {
        for g in 0..hk {
            order.extend((0..len).map(|i| g * blk + off + i));
        }
    }
    order
}

/// The order in which rlx's `[b | a]` columns take transformers'
/// `in_proj_ba` rows (per key head `[b (r) | a (r)]`).
pub fn ba_row_order(hk: usize, r: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(2 * hk * r);
    for off in [0, r] {
        for g in 0..hk {
            order.extend((0..r).map(|i| g * 2 * r + off + i));
        }
    }
    order
}

/// The order in which `[all queries | all gates]` takes the `q_proj` rows
/// (per head `[query (hd) | gate (hd)]`).
pub fn q_gate_row_order(heads: usize, hd: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(2 * heads * hd);
    for off in [0, hd] {
        for h in 0..heads {
            order.extend((0..hd).map(|i| h * 2 * hd + off + i));
        }
    }
    order
}

/// `w [rows, cols]` (PyTorch `[out, in]`) with its rows taken in `order`,
/// transposed to `[cols, order.len()]` (rlx `[in, out]`).
fn rows_to_in_out(w: &[f32], cols: usize, order: &[usize]) -> Vec<f32> {
    let n = order.len();
    let mut out = vec![0.0; cols * n];
    for (j, &r) in order.iter().enumerate() {
        for c in 0..cols {
            out[c * n + j] = w[r * cols + c];
        }
    }
    out
}

/// The safetensors file and its path, for reading checked tensors.
struct Reader {
    file: SafeTensorsFile,
}

impl Reader {
    /// `name` as f32 of exactly `dims`, with an error naming the tensor, its
    /// shape and dtype, and what was expected.
    fn get(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, Qwen3NextError> {
        let expected = format!("F32/F16/BF16 {dims:?}");
        let Some((dtype, shape)) = self.file.info(name) else {
            return Err(Qwen3NextError::MissingTensor {
                name: name.into(),
                expected,
            });
        };
        if shape != dims {
            return Err(Qwen3NextError::BadTensor {
                name: name.into(),
                found: shape,
                dtype: format!("{dtype:?}"),
                expected,
            });
        }
        Ok(self.file.tensor_f32(name, dims)?.into_owned())
    }

    /// A `[out, in]` linear weight, rows in `order` (all rows when `None`),
    /// as rlx `[in, out]`.
    fn linear(
        &self,
        name: &str,
        out: usize,
        inp: usize,
        order: Option<&[usize]>,
    ) -> Result<Vec<f32>, Qwen3NextError> {
        let w = self.get(name, &[out, inp])?;
        let all: Vec<usize>;
        let order = match order {
            Some(o) => o,
            None => {
                all = (0..out).collect();
                &all
            }
        };
        Ok(rows_to_in_out(&w, inp, order))
    }

    /// An RMSNorm weight with transformers' `1 + w` folded in.
    fn norm_plus_one(&self, name: &str, n: usize) -> Result<Vec<f32>, Qwen3NextError> {
        Ok(self.get(name, &[n])?.into_iter().map(|w| 1.0 + w).collect())
    }
}

/// Every param the graphs bind, in rlx layout, by rlx name.
#[derive(Debug, Clone)]
pub struct Qwen3NextWeights {
    /// The hyper-parameters.
    pub config: Qwen3NextConfig,
    /// Param name -> tensor.
    pub tensors: HashMap<String, Tensor>,
}

impl Qwen3NextWeights {
    /// Load and map `dir/model.safetensors` for `config`.
    pub fn load(dir: &Path, config: &Qwen3NextConfig) -> Result<Self, Qwen3NextError> {
        let file = SafeTensorsFile::open(dir.join("model.safetensors"))?;
        Self::from_file(file, config)
    }

    fn from_file(file: SafeTensorsFile, c: &Qwen3NextConfig) -> Result<Self, Qwen3NextError> {
        let rd = Reader { file };
        let mut t: HashMap<String, Tensor> = HashMap::new();
        let mut put = |name: String, dims: &[usize], data: Vec<f32>| {
            t.insert(name, Tensor::f32(dims, data));
        };
        let d = c.hidden;
        let embed = rd.get("model.embed_tokens.weight", &[c.vocab, d])?;
        let head = if c.tie_embeddings {
            rows_to_in_out(&embed, d, &(0..c.vocab).collect::<Vec<_>>())
        } else {
            rd.linear("lm_head.weight", c.vocab, d, None)?
        };
        put("embed_tokens".into(), &[c.vocab, d], embed);
        put("lm_head".into(), &[d, c.vocab], head);
        put(
            "norm".into(),
            &[d],
            rd.norm_plus_one("model.norm.weight", d)?,
        );
        let g = &c.gdn;
        let (hk, hv, n, kk) = (g.num_k_heads, g.num_v_heads, g.head_dim, g.conv_kernel);
        let r = hv / hk;
        let (cd, vd) = (g.conv_dim(), g.value_dim());
        for (l, kind) in c.layers.iter().enumerate() {
            let hf = |s: &str| format!("model.layers.{l}.{s}");
            let me = |s: &str| format!("layers.{l}.{s}");
            put(
                me("input_norm"),
                &[d],
                rd.norm_plus_one(&hf("input_layernorm.weight"), d)?,
            );
            put(
                me("post_norm"),
                &[d],
                rd.norm_plus_one(&hf("post_attention_layernorm.weight"), d)?,
            );
            match kind {
                LayerKind::Linear => {
                    let la = |s: &str| hf(&format!("linear_attn.{s}"));
                    let gd = |s: &str| me(&format!("gdn.{s}"));
                    let (qkvz, ba) = if c.model_type == "qwen3_next" {
                        (
                            rd.linear(
                                &la("in_proj_qkvz.weight"),
                                cd + vd,
                                d,
                                Some(&qkvz_row_order(hk, r, n, n)),
                            )?,
                            rd.linear(
                                &la("in_proj_ba.weight"),
                                2 * hv,
                                d,
                                Some(&ba_row_order(hk, r)),
                            )?,
                        )
                    } else {
                        // Qwen3.5: separate projections already in rlx's order.
                        let qkv = rd.get(&la("in_proj_qkv.weight"), &[cd, d])?;
                        let z = rd.get(&la("in_proj_z.weight"), &[vd, d])?;
                        let b = rd.get(&la("in_proj_b.weight"), &[hv, d])?;
                        let a = rd.get(&la("in_proj_a.weight"), &[hv, d])?;
                        let qkvz: Vec<f32> = qkv.into_iter().chain(z).collect();
                        let ba: Vec<f32> = b.into_iter().chain(a).collect();
                        (
                            rows_to_in_out(&qkvz, d, &(0..cd + vd).collect::<Vec<_>>()),
                            rows_to_in_out(&ba, d, &(0..2 * hv).collect::<Vec<_>>()),
                        )
                    };
                    put(gd("in_proj_qkvz"), &[d, cd + vd], qkvz);
                    put(gd("in_proj_ba"), &[d, 2 * hv], ba);
                    let conv = rd.get(&la("conv1d.weight"), &[cd, 1, kk])?;
                    for j in 0..kk {
                        let tap: Vec<f32> = (0..cd).map(|ch| conv[ch * kk + j]).collect();
                        put(gd(&format!("conv_w.{j}")), &[cd], tap);
                    }
                    put(gd("dt_bias"), &[hv], rd.get(&la("dt_bias"), &[hv])?);
                    let a_log = rd.get(&la("A_log"), &[hv])?;
                    put(gd("A"), &[hv], a_log.iter().map(|x| -x.exp()).collect());
                    put(gd("norm"), &[n], rd.get(&la("norm.weight"), &[n])?);
                    put(
                        gd("out_proj"),
                        &[vd, d],
                        rd.linear(&la("out_proj.weight"), d, vd, None)?,
                    );
                }
                LayerKind::Full => {
                    let sa = |s: &str| hf(&format!("self_attn.{s}"));
                    let (hq, hd, kv) = (c.num_heads, c.head_dim, c.kv_dim());
                    put(
                        me("attn.q_proj"),
                        &[d, 2 * hq * hd],
                        rd.linear(
                            &sa("q_proj.weight"),
                            2 * hq * hd,
                            d,
                            Some(&q_gate_row_order(hq, hd)),
                        )?,
                    );
                    put(
                        me("attn.k_proj"),
                        &[d, kv],
                        rd.linear(&sa("k_proj.weight"), kv, d, None)?,
                    );
                    put(
                        me("attn.v_proj"),
                        &[d, kv],
                        rd.linear(&sa("v_proj.weight"), kv, d, None)?,
                    );
                    put(
                        me("attn.o_proj"),
                        &[hq * hd, d],
                        rd.linear(&sa("o_proj.weight"), d, hq * hd, None)?,
                    );
                    put(
                        me("attn.q_norm"),
                        &[hd],
                        rd.norm_plus_one(&sa("q_norm.weight"), hd)?,
                    );
                    put(
                        me("attn.k_norm"),
                        &[hd],
                        rd.norm_plus_one(&sa("k_norm.weight"), hd)?,
                    );
                }
            }
            match c.ffn[l] {
                FfnKind::Dense => {
                    let i = c.intermediate;
                    for (p, o, inp) in [("gate_proj", i, d), ("up_proj", i, d), ("down_proj", d, i)]
                    {
                        put(
                            me(&format!("mlp.{p}")),
                            &[inp, o],
                            rd.linear(&hf(&format!("mlp.{p}.weight")), o, inp, None)?,
                        );
                    }
                }
                FfnKind::Moe => {
                    let (e, i, si) = (c.num_experts, c.moe_intermediate, c.shared_intermediate);
                    put(
                        me("moe.router"),
                        &[d, e],
                        rd.linear(&hf("mlp.gate.weight"), e, d, None)?,
                    );
                    // Experts: per-expert 2-D weights (the checkpoint form
                    // save_pretrained writes), or transformers' fused 3-D
                    // `experts.gate_up_proj [E, 2I, D]` / `experts.down_proj [E, D, I]`.
                    let fused = hf("mlp.experts.gate_up_proj");
                    if rd.file.contains(&fused) {
                        let gu = rd.get(&fused, &[e, 2 * i, d])?;
                        let dn = rd.get(&hf("mlp.experts.down_proj"), &[e, d, i])?;
                        for x in 0..e {
                            let gu_x = &gu[x * 2 * i * d..(x + 1) * 2 * i * d];
                            put(
                                me(&format!("moe.{x}.gate_proj")),
                                &[d, i],
                                rows_to_in_out(gu_x, d, &(0..i).collect::<Vec<_>>()),
                            );
                            put(
                                me(&format!("moe.{x}.up_proj")),
                                &[d, i],
                                rows_to_in_out(gu_x, d, &(i..2 * i).collect::<Vec<_>>()),
                            );
                            put(
                                me(&format!("moe.{x}.down_proj")),
                                &[i, d],
                                rows_to_in_out(
                                    &dn[x * d * i..(x + 1) * d * i],
                                    i,
                                    &(0..d).collect::<Vec<_>>(),
                                ),
                            );
                        }
                    } else {
                        for x in 0..e {
                            for (p, o, inp) in
                                [("gate_proj", i, d), ("up_proj", i, d), ("down_proj", d, i)]
                            {
                                put(
                                    me(&format!("moe.{x}.{p}")),
                                    &[inp, o],
                                    rd.linear(
                                        &hf(&format!("mlp.experts.{x}.{p}.weight")),
                                        o,
                                        inp,
                                        None,
                                    )?,
                                );
                            }
                        }
                    }
                    for (p, o, inp) in [
                        ("gate_proj", si, d),
                        ("up_proj", si, d),
                        ("down_proj", d, si),
                    ] {
                        put(
                            me(&format!("moe.shared.{p}")),
                            &[inp, o],
                            rd.linear(&hf(&format!("mlp.shared_expert.{p}.weight")), o, inp, None)?,
                        );
                    }
                    put(
                        me("moe.shared_gate"),
                        &[d, 1],
                        rd.linear(&hf("mlp.shared_expert_gate.weight"), 1, d, None)?,
                    );
                }
            }
        }
        Ok(Qwen3NextWeights {
            config: c.clone(),
            tensors: t,
        })
    }
}

/// Names of the KV cache params of attention layer `l`.
pub fn cache_names(l: usize) -> (String, String) {
    (format!("cache.k.{l}"), format!("cache.v.{l}"))
}

/// Names of the conv-state and recurrent-state inputs of GDN layer `l`
/// (the graph outputs the next ones in the same order).
pub fn state_names(l: usize) -> (String, String) {
    (
        format!("layers.{l}.conv_state"),
        format!("layers.{l}.ssm_state"),
    )
}

/// The `kv_bias` input: `[1, 1, seq_len, ctx_len]`, row `i` is 0 for keys
/// `j <= start + i` and -inf after.
pub fn kv_bias(start: usize, seq_len: usize, ctx_len: usize) -> Vec<f32> {
    let mut b = vec![f32::NEG_INFINITY; seq_len * ctx_len];
    for (i, row) in b.chunks_exact_mut(ctx_len.max(1)).enumerate() {
        row[..(start + i + 1).min(ctx_len)].fill(0.0);
    }
    b
}

struct Builder<'a> {
    g: Graph,
    w: &'a Qwen3NextWeights,
}

impl Builder<'_> {
    fn param(&mut self, name: &str) -> Result<NodeId, Qwen3NextError> {
        let t = self
            .w
            .tensors
            .get(name)
            .ok_or_else(|| Qwen3NextError::MissingTensor {
                name: name.into(),
                expected: "a loaded weight".into(),
            })?;
        Ok(self.g.param(name, t.shape.clone()))
    }
    fn op(&mut self, op: Op, inputs: Vec<NodeId>) -> Result<NodeId, Qwen3NextError> {
        Ok(self.g.push(op, inputs)?)
    }
    fn mm(&mut self, x: NodeId, w: &str) -> Result<NodeId, Qwen3NextError> {
        let w = self.param(w)?;
        self.op(Op::MatMul, vec![x, w])
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, Qwen3NextError> {
        self.op(Op::Binary(op), vec![a, b])
    }
    fn act(&mut self, a: Activation, x: NodeId) -> Result<NodeId, Qwen3NextError> {
        self.op(Op::Activation(a), vec![x])
    }
    fn narrow(
        &mut self,
        x: NodeId,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Result<NodeId, Qwen3NextError> {
        self.op(Op::Narrow { axis, start, len }, vec![x])
    }
    fn reshape(&mut self, x: NodeId, dims: &[usize]) -> Result<NodeId, Qwen3NextError> {
        self.op(
            Op::Reshape {
                shape: dims.to_vec(),
            },
            vec![x],
        )
    }
    fn rms(&mut self, x: NodeId, w: &str) -> Result<NodeId, Qwen3NextError> {
        let w = self.param(w)?;
        let eps = self.w.config.eps;
        self.op(Op::RmsNorm { axis: -1, eps }, vec![x, w])
    }
    fn swiglu(&mut self, x: NodeId, pre: &str) -> Result<NodeId, Qwen3NextError> {
        let gate = self.mm(x, &format!("{pre}.gate_proj"))?;
        let up = self.mm(x, &format!("{pre}.up_proj"))?;
        let h = self.op(Op::FusedSwiGLU { packed: false }, vec![gate, up])?;
        self.mm(h, &format!("{pre}.down_proj"))
    }
    /// `min(max(x * 1e30, 0), 1)`: 1 where `x > 0` (for any `x` above
    /// 1e-30), else 0.
    fn step(
        &mut self,
        x: NodeId,
        big: NodeId,
        zero: NodeId,
        one: NodeId,
    ) -> Result<NodeId, Qwen3NextError> {
        let s = self.bin(BinaryOp::Mul, x, big)?;
        let s = self.bin(BinaryOp::Max, s, zero)?;
        self.bin(BinaryOp::Min, s, one)
    }

    fn moe(&mut self, x: NodeId, pre: &str, s: usize) -> Result<NodeId, Qwen3NextError> {
        let c = &self.w.config;
        let (e, k, norm_topk) = (c.num_experts, c.top_k, c.norm_topk_prob);
        let logits = self.mm(x, &format!("{pre}.router"))?;
        let p = self.op(Op::Softmax { axis: 2 }, vec![logits])?;
        // rank[e] = #{j : p[j] > p[e]}; kept when rank < k.
        let pj = self.reshape(p, &[1, s, 1, e])?;
        let pe = self.reshape(p, &[1, s, e, 1])?;
        let diff = self.bin(BinaryOp::Sub, pj, pe)?;
        let big = self.g.constant(Tensor::f32(&[1], vec![1e30]));
        let zero = self.g.constant(Tensor::f32(&[1], vec![0.0]));
        let one = self.g.constant(Tensor::f32(&[1], vec![1.0]));
        let kc = self.g.constant(Tensor::f32(&[1], vec![k as f32]));
        let gt = self.step(diff, big, zero, one)?;
        let rank = self.op(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![3],
                keep_dims: false,
            },
            vec![gt],
        )?;
        let room = self.bin(BinaryOp::Sub, kc, rank)?;
        let keep = self.step(room, big, zero, one)?;
        let mut wts = self.bin(BinaryOp::Mul, p, keep)?;
        if norm_topk {
            let sum = self.op(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: vec![2],
                    keep_dims: true,
                },
                vec![wts],
            )?;
            wts = self.bin(BinaryOp::Div, wts, sum)?;
        }
        let mut out: Option<NodeId> = None;
        for x_i in 0..e {
            let y = self.swiglu(x, &format!("{pre}.{x_i}"))?;
            let w_i = self.narrow(wts, 2, x_i, 1)?;
            let y = self.bin(BinaryOp::Mul, y, w_i)?;
            out = Some(match out {
                None => y,
                Some(acc) => self.bin(BinaryOp::Add, acc, y)?,
            });
        }
        let shared = self.swiglu(x, &format!("{pre}.shared"))?;
        let sg = self.mm(x, &format!("{pre}.shared_gate"))?;
        let sg = self.act(Activation::Sigmoid, sg)?;
        let shared = self.bin(BinaryOp::Mul, shared, sg)?;
        match out {
            Some(acc) => self.bin(BinaryOp::Add, acc, shared),
            None => Ok(shared),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        x: NodeId,
        l: usize,
        s: usize,
        ctx: usize,
        pos: NodeId,
        start: NodeId,
        bias: NodeId,
    ) -> Result<NodeId, Qwen3NextError> {
        let c = &self.w.config;
        let (hq, hkv, hd, n_rot, theta) = (
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.n_rot,
            c.rope_theta,
        );
        let pre = format!("layers.{l}.attn");
        let qg = self.mm(x, &format!("{pre}.q_proj"))?;
        let q = self.narrow(qg, 2, 0, hq * hd)?;
        let gate = self.narrow(qg, 2, hq * hd, hq * hd)?;
        let k = self.mm(x, &format!("{pre}.k_proj"))?;
        let v = self.mm(x, &format!("{pre}.v_proj"))?;
        let q = self.reshape(q, &[1, s, hq, hd])?;
        let q = self.rms(q, &format!("{pre}.q_norm"))?;
        let q = self.reshape(q, &[1, s, hq * hd])?;
        let k = self.reshape(k, &[1, s, hkv, hd])?;
        let k = self.rms(k, &format!("{pre}.k_norm"))?;
        let k = self.reshape(k, &[1, s, hkv * hd])?;
        let rope = Op::Rope {
            head_dim: hd,
            n_rot,
            theta,
            style: RopeStyle::NeoX,
        };
        let q = self.op(rope.clone(), vec![q, pos])?;
        let k = self.op(rope, vec![k, pos])?;
        let (ck, cv) = cache_names(l);
        let kv_shape = Shape::f32(&[1, ctx, hkv * hd]);
        let ck = self.g.param(&ck, kv_shape.clone());
        let cv = self.g.param(&cv, kv_shape);
        let ck = self.op(Op::CacheWrite { axis: 1 }, vec![ck, k, start])?;
        let cv = self.op(Op::CacheWrite { axis: 1 }, vec![cv, v, start])?;
        let a = self.op(
            Op::Attention {
                num_heads: hq,
                head_dim: hd,
                mask_kind: MaskKind::Bias,
                score_scale: None,
                attn_logit_softcap: None,
            },
            vec![q, ck, cv, bias],
        )?;
        let sg = self.act(Activation::Sigmoid, gate)?;
        let a = self.bin(BinaryOp::Mul, a, sg)?;
        self.mm(a, &format!("{pre}.o_proj"))
    }
}

/// The graph of one step over `seq_len` new tokens at positions
/// `start..start + seq_len` after `start` cached ones, with KV caches of
/// `ctx_len` positions.
///
/// Inputs: `ids` i64 `[1, S]`; `pos` i64 `[S]` (`start..start+S`); `start`
/// i64 `[1]`; `kv_bias` f32 `[1, 1, S, ctx]` ([`kv_bias`]); per GDN layer
/// `l` the inputs [`state_names`]`(l)`, f32 `[1, K-1, C]` and
/// `[1, Hv, n, n]`. Params: the weights and, per attention layer, the
/// caches [`cache_names`]`(l)` f32 `[1, ctx, kv_dim]`, written in place.
/// Outputs: logits f32 `[1, S, vocab]` at every position, then per GDN
/// layer in order its next conv state and next recurrent state.
pub fn build_graph(
    weights: &Qwen3NextWeights,
    seq_len: usize,
    ctx_len: usize,
) -> Result<Graph, Qwen3NextError> {
    let c = &weights.config;
    let s = seq_len;
    if s == 0 {
        return Err(Qwen3NextError::Empty);
    }
    if s > ctx_len {
        return Err(Qwen3NextError::ContextOverflow { needed: s, ctx_len });
    }
    let mut b = Builder {
        g: Graph::new(format!("{}.step.{s}", c.model_type)),
        w: weights,
    };
    let ids = b.g.input("ids", Shape::new(&[1, s], DType::I64));
    let pos = b.g.input("pos", Shape::new(&[s], DType::I64));
    let start = b.g.input("start", Shape::new(&[1], DType::I64));
    let bias = b.g.input("kv_bias", Shape::f32(&[1, 1, s, ctx_len]));
    let table = b.param("embed_tokens")?;
    let mut h = b.op(Op::Gather { axis: 0 }, vec![table, ids])?;
    let mut state_outs = Vec::new();
    for (l, kind) in c.layers.iter().enumerate() {
        let xn = b.rms(h, &format!("layers.{l}.input_norm"))?;
        let mixed = match kind {
            LayerKind::Linear => {
                let (cs, ss) = state_names(l);
                let cs = b.g.input(&cs, Shape::f32(&c.gdn.conv_state_dims(1)));
                let ss = b.g.input(&ss, Shape::f32(&c.gdn.ssm_state_dims(1)));
                for name in [
                    "in_proj_qkvz",
                    "in_proj_ba",
                    "dt_bias",
                    "A",
                    "norm",
                    "out_proj",
                ] {
                    let full = format!("layers.{l}.gdn.{name}");
                    if !weights.tensors.contains_key(&full) {
                        return Err(Qwen3NextError::MissingTensor {
                            name: full,
                            expected: "a loaded weight".into(),
                        });
                    }
                }
                let o = gdn_block(&mut b.g, &c.gdn, &format!("layers.{l}.gdn"), xn, cs, ss)?;
                state_outs.push(o.conv_state);
                state_outs.push(o.ssm_state);
                o.out
            }
            LayerKind::Full => b.attention(xn, l, s, ctx_len, pos, start, bias)?,
        };
        h = b.bin(BinaryOp::Add, h, mixed)?;
        let xn = b.rms(h, &format!("layers.{l}.post_norm"))?;
        let f = match c.ffn[l] {
            FfnKind::Dense => b.swiglu(xn, &format!("layers.{l}.mlp"))?,
            FfnKind::Moe => b.moe(xn, &format!("layers.{l}.moe"), s)?,
        };
        h = b.bin(BinaryOp::Add, h, f)?;
    }
    let h = b.rms(h, "norm")?;
    let logits = b.mm(h, "lm_head")?;
    let mut outs = vec![logits];
    outs.extend(state_outs);
    b.g.set_outputs(outs);
    b.g.verify()?;
    Ok(b.g)
}

/// A loaded Qwen3-Next-family model on the CPU: the compiled step graphs
/// (one per step length, sharing the weights), the KV caches and the
/// carried GDN states.
///
/// [`forward`](Self::forward) feeds tokens after those already seen
/// (prefill and decode are the same step at different lengths, so they
/// share the recurrent states and the KV caches); [`reset`](Self::reset)
/// forgets them.
pub struct Qwen3NextModel {
    weights: Qwen3NextWeights,
    ctx_len: usize,
    /// Compiled step models: step length, graph nodes, model; the first one compiled owns
    /// the weights the others share.
    models: Vec<(usize, usize, CpuModel)>,
    /// Which entry of `models` holds the KV cache params.
    cache_at: usize,
    /// Per GDN layer: conv state, recurrent state.
    states: Vec<Tensor>,
    pos: usize,
}

impl Qwen3NextModel {
    /// Load `dir/config.json` + `dir/model.safetensors` with KV caches of
    /// `ctx_len` positions, compiled with `opts` (e.g. `hybrid: true`).
    pub fn load(
        dir: impl AsRef<Path>,
        ctx_len: usize,
        opts: CpuOptions,
    ) -> Result<Self, Qwen3NextError> {
        let dir = dir.as_ref();
        let config = Qwen3NextConfig::from_dir(dir)?;
        let weights = Qwen3NextWeights::load(dir, &config)?;
        Self::from_weights(weights, ctx_len, opts)
    }

    /// Build from loaded weights.
    pub fn from_weights(
        weights: Qwen3NextWeights,
        ctx_len: usize,
        opts: CpuOptions,
    ) -> Result<Self, Qwen3NextError> {
        if ctx_len == 0 {
            return Err(Qwen3NextError::ContextOverflow { needed: 1, ctx_len });
        }
        let g = build_graph(&weights, 1, ctx_len)?;
        let nodes = g.len();
        let mut m = CpuModel::compile(g, &opts)?;
        for (name, t) in &weights.tensors {
            m.set_param_tensor(name, t.clone())?;
        }
        let kv = weights.config.kv_dim();
        for l in 0..weights.config.layers.len() {
            if weights.config.layers[l] == LayerKind::Full {
                let (k, v) = cache_names(l);
                for name in [k, v] {
                    m.set_param_tensor(
                        &name,
                        Tensor::f32(&[1, ctx_len, kv], vec![0.0; ctx_len * kv]),
                    )?;
                }
            }
        }
        let mut me = Qwen3NextModel {
            weights,
            ctx_len,
            models: vec![(1, nodes, m)],
            cache_at: 0,
            states: Vec::new(),
            pos: 0,
        };
        me.reset();
        Ok(me)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Qwen3NextConfig {
        &self.weights.config
    }

    /// Tokens seen since the last reset.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// KV cache positions.
    pub fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    /// Forget every token: zero GDN states, position 0 (the KV caches are
    /// overwritten from position 0 on and masked beyond the position).
    pub fn reset(&mut self) {
        let c = &self.weights.config;
        self.states.clear();
        for _ in c.linear_layers() {
            for dims in [c.gdn.conv_state_dims(1), c.gdn.ssm_state_dims(1)] {
                let n = dims.iter().product();
                self.states.push(Tensor::f32(&dims, vec![0.0; n]));
            }
        }
        self.pos = 0;
    }

    /// The compiled plans of the step models compiled so far, by step length.
    pub fn plans(&self) -> Vec<crate::CompiledPlan> {
        self.models
            .iter()
            .map(|(s, nodes, m)| crate::CompiledPlan {
                name: format!("step {s}"),
                nodes: *nodes,
                report: m.report().clone(),
            })
            .collect()
    }

    /// The index in `models` of the step model of length `s`, compiled
    /// (sharing the weights) on first use.
    fn model_for(&mut self, s: usize) -> Result<usize, Qwen3NextError> {
        if let Some(i) = self.models.iter().position(|(n, _, _)| *n == s) {
            return Ok(i);
        }
        let g = build_graph(&self.weights, s, self.ctx_len)?;
        let nodes = g.len();
        let m = self.models[0].2.compile_sharing(g)?;
        self.models.push((s, nodes, m));
        Ok(self.models.len() - 1)
    }

    fn move_caches(&mut self, to: usize) -> Result<(), Qwen3NextError> {
        if self.cache_at == to {
            return Ok(());
        }
        let c = &self.weights.config;
        for l in 0..c.layers.len() {
            if c.layers[l] != LayerKind::Full {
                continue;
            }
            let (k, v) = cache_names(l);
            for name in [k, v] {
                let t = self.models[self.cache_at]
                    .2
                    .take_param(&name)
                    .ok_or_else(|| Qwen3NextError::MissingTensor {
                        name: name.clone(),
                        expected: format!("KV cache f32 [1, {}, {}]", self.ctx_len, c.kv_dim()),
                    })?;
                self.models[to].2.set_param_tensor(&name, t)?;
            }
        }
        self.cache_at = to;
        Ok(())
    }

    /// Feed `ids` after the tokens already seen; returns the logits at each
    /// of their positions, `ids.len() * vocab` values. Checks every id and
    /// the context before anything runs.
    pub fn forward(&mut self, ids: &[u32]) -> Result<Vec<f32>, Qwen3NextError> {
        let c = &self.weights.config;
        let s = ids.len();
        if s == 0 {
            return Err(Qwen3NextError::Empty);
        }
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= c.vocab)
        {
            return Err(Qwen3NextError::TokenOutOfRange {
                id,
                position,
                vocab: c.vocab,
            });
        }
        if self.pos + s > self.ctx_len {
            return Err(Qwen3NextError::ContextOverflow {
                needed: self.pos + s,
                ctx_len: self.ctx_len,
            });
        }
        let vocab = c.vocab;
        let lin = c.linear_layers();
        let idx = self.model_for(s)?;
        self.move_caches(idx)?;
        let ids64: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let pos: Vec<i64> = (self.pos..self.pos + s).map(|p| p as i64).collect();
        let start = [self.pos as i64];
        let bias = kv_bias(self.pos, s, self.ctx_len);
        let names: Vec<(String, String)> = lin.iter().map(|&l| state_names(l)).collect();
        let mut inputs: Vec<(&str, TensorRef<'_>)> = vec![
            ("ids", TensorRef::I64(&ids64)),
            ("pos", TensorRef::I64(&pos)),
            ("start", TensorRef::I64(&start)),
            ("kv_bias", TensorRef::F32(&bias)),
        ];
        for (i, (cs, ss)) in names.iter().enumerate() {
            for (name, t) in [(cs, &self.states[2 * i]), (ss, &self.states[2 * i + 1])] {
                let data = t.as_f32().ok_or_else(|| Qwen3NextError::BadOutput {
                    index: i,
                    found: format!("{}", t.shape),
                    expected: "an f32 state".into(),
                })?;
                inputs.push((name.as_str(), TensorRef::F32(data)));
            }
        }
        let mut outs = self.models[idx].2.run(&inputs)?;
        drop(inputs);
        if outs.len() != 1 + self.states.len() {
            return Err(Qwen3NextError::BadOutput {
                index: outs.len(),
                found: format!("{} outputs", outs.len()),
                expected: format!("{} outputs", 1 + self.states.len()),
            });
        }
        let new_states = outs.split_off(1);
        for (i, (t, old)) in new_states.iter().zip(&self.states).enumerate() {
            if t.shape != old.shape || t.as_f32().is_none() {
                return Err(Qwen3NextError::BadOutput {
                    index: i + 1,
                    found: format!("{}", t.shape),
                    expected: format!("{}", old.shape),
                });
            }
        }
        let logits = outs
            .pop()
            .and_then(|t| match t.as_f32() {
                Some(v) if v.len() == s * vocab => Some(v.to_vec()),
                _ => None,
            })
            .ok_or_else(|| Qwen3NextError::BadOutput {
                index: 0,
                found: "another tensor".into(),
                expected: format!("f32 logits [1, {s}, {vocab}]"),
            })?;
        self.states = new_states;
        self.pos += s;
        Ok(logits)
    }

    /// Reset, then run `ids` as a prompt; returns the logits at every
    /// position.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, Qwen3NextError> {
        self.reset();
        self.forward(ids)
    }

    /// Greedy generation: prefill `prompt`, then `n` tokens, each the
    /// argmax of the previous logits (first index on ties).
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        n: usize,
    ) -> Result<Vec<u32>, Qwen3NextError> {
        let vocab = self.weights.config.vocab;
        let logits = self.prefill(prompt)?;
        let mut last = logits[logits.len() - vocab..].to_vec();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let id = crate::llama::argmax(&last);
            out.push(id);
            if i + 1 < n {
                last = self.forward(&[id])?;
            }
        }
        Ok(out)
    }
}

/// Whether `dir` holds an HF `config.json` whose `model_type` this module
/// loads.
pub fn is_supported_dir(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|j| {
            j.get("model_type")
                .and_then(|v| v.as_str())
                .map(String::from)
        })
        .is_some_and(|t| SUPPORTED_MODEL_TYPES.contains(&t.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_orders_ungroup_per_key_head() {
        // 2 key heads, r = 2, dk = dv = 1: per head [q k v v z z].
        assert_eq!(
            qkvz_row_order(2, 2, 1, 1),
            vec![0, 6, 1, 7, 2, 3, 8, 9, 4, 5, 10, 11]
        );
        // per head [b b a a]
        assert_eq!(ba_row_order(2, 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
        // per head [q q g g]
        assert_eq!(q_gate_row_order(2, 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn kv_bias_is_causal_from_start() {
        let b = kv_bias(2, 2, 4);
        let inf = f32::NEG_INFINITY;
        assert_eq!(b, vec![0.0, 0.0, 0.0, inf, 0.0, 0.0, 0.0, 0.0]);
    }
}
