//! Loading the tensors a Llama graph binds.
//!
//! Block-quantized matmul weights stay packed as `U8 [N, row_bytes]` params
//! for `DequantMatMul`; float (F32/F16/BF16) matmul weights become f32
//! `[K, N]` params for `MatMul`; norms become f32 `[D]`. The token embedding
//! is dequantized once into an f32 table for `Gather`, and when the file has
//! no `output.weight` the head reuses `token_embd.weight` (tied). A linear
//! `X.weight` with a `X.bias` tensor in the file (qwen2's q/k/v) gets that
//! bias as an f32 `[N]` param under [`bias_name`]`(X.weight)`.

use super::{LlamaConfig, LlamaError};
use rlx_formats::{GgmlType, GgufFile};
use rlx_ir::{ActivationPrecision, QuantScheme, Tensor};
use std::collections::HashMap;

/// Name of the f32 embedding table param (`token_embd.weight` dequantized,
/// times the family's embedding scale).
pub const EMBED_TABLE: &str = "token_embd.table";

/// Name of Llama 3's rope frequency divisors (f32 `[n_rot / 2]`).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// How one linear layer `y = x W^T` (`W [N, K]` in the file) is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linear {
    /// Packed blocks, param `U8 [n, row_bytes]`, run by `DequantMatMul`.
    Quant {
        /// Block format.
        scheme: QuantScheme,
        /// Output features.
        n: usize,
        /// Input features.
        k: usize,
    },
    /// Float weights, param f32 `[k, n]` (transposed at load), run by `MatMul`.
    Dense {
        /// Output features.
        n: usize,
        /// Input features.
        k: usize,
    },
}

/// Name of the bias param of linear `weight_name` (`X.weight` -> `X.bias`).
pub fn bias_name(weight_name: &str) -> String {
    let base = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
    format!("{base}.bias")
}

/// Name of layer `l`'s merged q/k/v projection (rows `[q | k | v]`).
pub fn qkv_name(l: usize) -> String {
    format!("blk.{l}.attn_qkv.weight")
}

/// Name of layer `l`'s merged gate/up projection (rows `[gate | up]`).
pub fn gate_up_name(l: usize) -> String {
    format!("blk.{l}.ffn_gate_up.weight")
}

/// Every param of a Llama graph, by name, with how each linear is bound.
#[derive(Debug, Clone)]
pub struct LlamaWeights {
    /// The model config the weights were checked against.
    pub config: LlamaConfig,
    /// Param tensors by name (GGUF names, plus [`EMBED_TABLE`]).
    pub tensors: HashMap<String, Tensor>,
    /// Linear layers by param name; the head is under `"output.weight"`
    /// or, when tied, `"token_embd.weight"`.
    pub linears: HashMap<String, Linear>,
    /// Param name of the output head.
    pub head: String,
    /// How every `DequantMatMul` of the graphs rounds its activations:
    /// `F32` (the default, exact up to f32 rounding) or `Int8` (llama.cpp's
    /// 8-bit activation blocks; faster, looser). Set it before building a
    /// model; it is an attribute of each `DequantMatMul` node.
    pub activations: ActivationPrecision,
}

impl LlamaWeights {
    /// Load and check every tensor of `f` for `config`, then merge each
    /// layer's q/k/v and gate/up projections into one packed weight where
    /// they share a block format (see [`merge_projections`](Self::merge_projections)).
    pub fn load(f: &GgufFile, config: &LlamaConfig) -> Result<LlamaWeights, LlamaError> {
        let mut w = Self::load_unmerged(f, config)?;
        w.merge_projections();
        Ok(w)
    }

    /// Random weights of the right shapes: every linear packed in `scheme`
    /// (the head in `head_scheme`, tied to the embedding) with small f16
    /// scales, norms of ones, a random embedding table. The numbers mean
    /// nothing; this is for speed measurements and shape tests without a
    /// model file. Errors if `d_model`, `d_ff` are not whole blocks.
    pub fn synthetic(
        config: &LlamaConfig,
        scheme: QuantScheme,
        head_scheme: QuantScheme,
        seed: u64,
    ) -> Result<LlamaWeights, LlamaError> {
        let c = config;
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let mut w = LlamaWeights {
            config: c.clone(),
            tensors: HashMap::new(),
            linears: HashMap::new(),
            head: "token_embd.weight".into(),
            activations: ActivationPrecision::F32,
        };
        let mut packed =
            |w: &mut LlamaWeights, name: String, scheme: QuantScheme, n: usize, k: usize| {
                let rb = scheme.row_bytes(k).ok_or_else(|| LlamaError::BadConfig {
                    detail: format!(
                        "{name}: K = {k} is not a whole number of {} blocks",
                        scheme.name()
                    ),
                })?;
                let mut bytes: Vec<u8> = (0..n * rb).map(|_| next() as u8).collect();
                // Every f16 field of a block gets a small positive scale; for
                // the 32-element formats these are the leading 2 or 4 bytes.
                // 0x211F is f16 0.010002.
                let scale = 0x211Fu16.to_le_bytes();
                let fields: &[usize] = match scheme {
                    QuantScheme::Q4_0 | QuantScheme::Q5_0 | QuantScheme::Q8_0 => &[0],
                    QuantScheme::Q4_1 | QuantScheme::Q5_1 | QuantScheme::Q4K | QuantScheme::Q5K => {
                        &[0, 2]
                    }
                    QuantScheme::Q2K => &[80, 82],
                    QuantScheme::Q3K => &[108],
                    QuantScheme::Q6K => &[208],
                    QuantScheme::Q8K => &[],
                };
                for blk in bytes.chunks_exact_mut(scheme.block_bytes()) {
                    for &o in fields {
                        blk[o..o + 2].copy_from_slice(&scale);
                    }
                    if scheme == QuantScheme::Q8K {
                        blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
                    }
                }
                w.tensors.insert(name.clone(), Tensor::u8(&[n, rb], bytes));
                w.linears.insert(name, Linear::Quant { scheme, n, k });
                Ok::<(), LlamaError>(())
            };
        for l in 0..c.n_layers {
            let p = |s: &str| format!("blk.{l}.{s}.weight");
            packed(&mut w, p("attn_q"), scheme, c.q_dim(), c.d_model)?;
            packed(&mut w, p("attn_k"), scheme, c.kv_dim(), c.d_model)?;
            packed(&mut w, p("attn_v"), scheme, c.kv_dim(), c.d_model)?;
            packed(&mut w, p("attn_output"), scheme, c.d_model, c.q_dim())?;
            packed(&mut w, p("ffn_gate"), scheme, c.d_ff, c.d_model)?;
            packed(&mut w, p("ffn_up"), scheme, c.d_ff, c.d_model)?;
            packed(&mut w, p("ffn_down"), scheme, c.d_model, c.d_ff)?;
            for norm in ["attn_norm", "ffn_norm"] {
                w.tensors
                    .insert(p(norm), Tensor::f32(&[c.d_model], vec![1.0; c.d_model]));
            }
        }
        w.tensors.insert(
            "output_norm.weight".into(),
            Tensor::f32(&[c.d_model], vec![1.0; c.d_model]),
        );
        packed(
            &mut w,
            "token_embd.weight".into(),
            head_scheme,
            c.vocab,
            c.d_model,
        )?;
        let table: Vec<f32> = (0..c.vocab * c.d_model)
            .map(|_| (next() % 2001) as f32 * 1e-3 - 1.0)
            .collect();
        w.tensors.insert(
            EMBED_TABLE.into(),
            Tensor::f32(&[c.vocab, c.d_model], table),
        );
        w.merge_projections();
        Ok(w)
    }

    /// Merge, per layer, `attn_q|attn_k|attn_v` into [`qkv_name`] and
    /// `ffn_gate|ffn_up` into [`gate_up_name`] by concatenating their packed
    /// rows, when the parts are all block-quantized with one scheme. One
    /// `DequantMatMul` then replaces three (or two): fewer passes over the
    /// activations and fewer parallel dispatches per token. The parts are
    /// removed; the graph builder uses whichever form is present. Models
    /// with q/k norms keep q/k/v apart (each is normed per head), and
    /// models whose FFN activation is not SiLU keep gate/up apart.
    pub fn merge_projections(&mut self) {
        let block = &self.config.block;
        let (qkv, gate_up) = (!block.qk_norm, block.ffn_act == super::FfnAct::Silu);
        for l in 0..self.config.n_layers {
            let p = |s: &str| format!("blk.{l}.{s}.weight");
            if qkv {
                self.merge(&[p("attn_q"), p("attn_k"), p("attn_v")], qkv_name(l));
            }
            if gate_up {
                self.merge(&[p("ffn_gate"), p("ffn_up")], gate_up_name(l));
            }
        }
    }

    fn merge(&mut self, parts: &[String], merged: String) {
        let mut scheme0 = None;
        let mut k0 = 0;
        let mut n_total = 0;
        for name in parts {
            match self.linears.get(name) {
                Some(&Linear::Quant { scheme, n, k })
                    if scheme0.is_none_or(|s| s == scheme && k == k0) =>
                {
                    scheme0 = Some(scheme);
                    k0 = k;
                    n_total += n;
                }
                _ => return,
            }
        }
        let Some(scheme) = scheme0 else { return };
        // Biases concatenate like the rows; a part without one adds zeros.
        let has_bias = parts
            .iter()
            .any(|p| self.tensors.contains_key(&bias_name(p)));
        let mut bias = Vec::new();
        let mut bytes = Vec::new();
        for name in parts {
            if let Some(t) = self.tensors.remove(name) {
                if let rlx_ir::TensorData::U8(b) = &*t.data {
                    bytes.extend_from_slice(b);
                }
            }
            if has_bias {
                let n = match self.linears.get(name) {
                    Some(Linear::Quant { n, .. } | Linear::Dense { n, .. }) => *n,
                    None => 0,
                };
                match self
                    .tensors
                    .remove(&bias_name(name))
                    .as_ref()
                    .and_then(|t| t.as_f32())
                {
                    Some(b) if b.len() == n => bias.extend_from_slice(b),
                    _ => bias.extend(std::iter::repeat_n(0.0, n)),
                }
            }
            self.linears.remove(name);
        }
        if has_bias {
            self.tensors
                .insert(bias_name(&merged), Tensor::f32(&[n_total], bias));
        }
        let rb = bytes.len() / n_total.max(1);
        self.tensors
            .insert(merged.clone(), Tensor::u8(&[n_total, rb], bytes));
        self.linears.insert(
            merged,
            Linear::Quant {
                scheme,
                n: n_total,
                k: k0,
            },
        );
    }

    /// Load and check every tensor of `f` for `config`, one param per
    /// GGUF tensor (no merged projections).
    pub fn load_unmerged(f: &GgufFile, config: &LlamaConfig) -> Result<LlamaWeights, LlamaError> {
        let c = config;
        let mut w = LlamaWeights {
            config: c.clone(),
            tensors: HashMap::new(),
            linears: HashMap::new(),
            head: String::new(),
            activations: ActivationPrecision::F32,
        };
        // Embedding table (dequantized once).
        check_shape(f, "token_embd.weight", &[c.vocab, c.d_model])?;
        let mut table = f
            .tensor_f32("token_embd.weight")
            .map_err(|e| dequant_error(f, "token_embd.weight", e))?;
        if let Some(scale) = c.block.embed_scale {
            table.iter_mut().for_each(|v| *v *= scale);
        }
        if c.block.rope_freqs {
            let name = ROPE_FREQS;
            w.norm(f, name, c.n_rot / 2)?;
            let ok = w.tensors[name]
                .as_f32()
                .is_some_and(|v| v.iter().all(|x| x.is_finite() && *x > 0.0));
            if !ok {
                return Err(LlamaError::BadTensor {
                    name: name.into(),
                    expected: "positive finite frequency divisors".into(),
                    found: vec![c.n_rot / 2],
                    ty: f.tensor_info(name).map_or(GgmlType::F32, |i| i.ggml_type),
                });
            }
        }
        w.tensors.insert(
            EMBED_TABLE.into(),
            Tensor::f32(&[c.vocab, c.d_model], table),
        );
        for l in 0..c.n_layers {
            let p = |s: &str| format!("blk.{l}.{s}.weight");
            w.norm(f, &p("attn_norm"), c.d_model)?;
            w.norm(f, &p("ffn_norm"), c.d_model)?;
            if c.block.qk_norm {
                w.norm(f, &p("attn_q_norm"), c.head_dim)?;
                w.norm(f, &p("attn_k_norm"), c.head_dim)?;
            }
            if c.block.post_norms {
                w.norm(f, &p("post_attention_norm"), c.d_model)?;
                w.norm(f, &p("post_ffw_norm"), c.d_model)?;
            }
            w.linear(f, &p("attn_q"), c.q_dim(), c.d_model)?;
            w.linear(f, &p("attn_k"), c.kv_dim(), c.d_model)?;
            w.linear(f, &p("attn_v"), c.kv_dim(), c.d_model)?;
            w.linear(f, &p("attn_output"), c.d_model, c.q_dim())?;
            w.linear(f, &p("ffn_gate"), c.d_ff, c.d_model)?;
            w.linear(f, &p("ffn_up"), c.d_ff, c.d_model)?;
            w.linear(f, &p("ffn_down"), c.d_model, c.d_ff)?;
        }
        w.norm(f, "output_norm.weight", c.d_model)?;
        let head = if f.tensor_info("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        w.linear(f, head, c.vocab, c.d_model)?;
        w.head = head.into();
        Ok(w)
    }

    fn norm(&mut self, f: &GgufFile, name: &str, d: usize) -> Result<(), LlamaError> {
        check_shape(f, name, &[d])?;
        let info = f.tensor_info(name).ok_or_else(|| missing(name, &[d]))?;
        if !matches!(
            info.ggml_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
        ) {
            return Err(LlamaError::UnsupportedQuant {
                name: name.into(),
                ty: info.ggml_type,
            });
        }
        let v = f.tensor_f32(name).map_err(|e| dequant_error(f, name, e))?;
        self.tensors.insert(name.into(), Tensor::f32(&[d], v));
        Ok(())
    }

    fn linear(&mut self, f: &GgufFile, name: &str, n: usize, k: usize) -> Result<(), LlamaError> {
        check_shape(f, name, &[n, k])?;
        let info = f.tensor_info(name).ok_or_else(|| missing(name, &[n, k]))?;
        let ty = info.ggml_type;
        if let Some(scheme) = ty.quant_scheme() {
            let rb = scheme.row_bytes(k).ok_or_else(|| LlamaError::BadTensor {
                name: name.into(),
                expected: format!("rows of whole {} blocks", scheme.name()),
                found: info.shape(),
                ty,
            })?;
            let bytes = f.tensor_bytes(name)?.to_vec();
            self.tensors
                .insert(name.into(), Tensor::u8(&[n, rb], bytes));
            self.linears
                .insert(name.into(), Linear::Quant { scheme, n, k });
        } else if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            let v = f.tensor_f32(name).map_err(|e| dequant_error(f, name, e))?;
            let mut t = vec![0.0f32; n * k];
            for (r, row) in v.chunks_exact(k).enumerate() {
                for (c, &x) in row.iter().enumerate() {
                    t[c * n + r] = x;
                }
            }
            self.tensors.insert(name.into(), Tensor::f32(&[k, n], t));
            self.linears.insert(name.into(), Linear::Dense { n, k });
        } else {
            return Err(LlamaError::UnsupportedQuant {
                name: name.into(),
                ty,
            });
        }
        let bias = bias_name(name);
        if f.tensor_info(&bias).is_some() {
            self.norm(f, &bias, n)?;
        }
        Ok(())
    }
}

fn missing(name: &str, shape: &[usize]) -> LlamaError {
    LlamaError::MissingTensor {
        name: name.into(),
        expected: format!("{shape:?} (row-major; F32 norms, quantized or float matmul weights)"),
    }
}

fn check_shape(f: &GgufFile, name: &str, shape: &[usize]) -> Result<(), LlamaError> {
    let info = f.tensor_info(name).ok_or_else(|| missing(name, shape))?;
    if info.shape() != shape {
        return Err(LlamaError::BadTensor {
            name: name.into(),
            expected: format!("{shape:?}"),
            found: info.shape(),
            ty: info.ggml_type,
        });
    }
    Ok(())
}

fn dequant_error(f: &GgufFile, name: &str, e: rlx_formats::FormatError) -> LlamaError {
    match f.tensor_info(name) {
        Some(info) if !info.ggml_type.can_dequantize() => LlamaError::UnsupportedQuant {
            name: name.into(),
            ty: info.ggml_type,
        },
        _ => LlamaError::Format(e),
    }
}
