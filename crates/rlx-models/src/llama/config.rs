//! Hyper-parameters from GGUF metadata.

use super::LlamaError;
use crate::validate::{layers_in_names, positive_finite, ConfigError};
use rlx_formats::GgufFile;
use rlx_ir::RopeStyle;

/// The `general.architecture` values this decoder runs: `llama` (Llama 1-3,
/// with `rope_freqs.weight` for Llama 3 rope scaling), `qwen2` (the same
/// block with biases on q/k/v and NeoX rope), `qwen3` (q/k RMSNorm per head,
/// NeoX rope) and `gemma3` (see [`BlockOptions`]).
pub const SUPPORTED_ARCHS: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

/// The gated FFN's activation: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// SiLU (Llama, Qwen).
    Silu,
    /// GELU, tanh approximation (Gemma).
    GeluTanh,
}

/// The per-family parts of a block; all off for `llama` and `qwen2`.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockOptions {
    /// RMSNorm of every q and k head (`attn_q_norm`, `attn_k_norm`, weight
    /// `[head_dim]`) before rope (`qwen3`, `gemma3`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before their residual adds
    /// (`post_attention_norm`, `post_ffw_norm`; `gemma3`).
    pub post_norms: bool,
    /// The FFN activation.
    pub ffn_act: FfnAct,
    /// Multiplier of the token embeddings (`sqrt(d_model)` for `gemma3`).
    pub embed_scale: Option<f32>,
    /// Attention score multiplier (`{arch}.attention.scale`; default
    /// `1/sqrt(head_dim)`).
    pub attn_scale: Option<f32>,
    /// Attention logit soft-cap (`{arch}.attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// Final logit soft-cap `c * tanh(logits / c)`
    /// (`{arch}.final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Sliding-window width of the local layers
    /// (`{arch}.attention.sliding_window`), if any layer is local.
    pub sliding_window: Option<usize>,
    /// Per layer, whether it attends over the sliding window only (for
    /// `gemma3`, layer `l` is local unless `(l + 1) % 6 == 0`, as in
    /// llama.cpp and transformers' default `sliding_window_pattern`).
    pub swa_layers: Vec<bool>,
    /// Rope base of the local layers (10000 for `gemma3`, as llama.cpp).
    pub rope_theta_swa: f32,
    /// Whether the file has `rope_freqs.weight` (Llama 3 rope scaling:
    /// per-pair frequency divisors).
    pub rope_freqs: bool,
}

impl BlockOptions {
    /// The plain Llama block.
    pub fn llama(n_layers: usize) -> BlockOptions {
        BlockOptions {
            qk_norm: false,
            post_norms: false,
            ffn_act: FfnAct::Silu,
            embed_scale: None,
            attn_scale: None,
            attn_softcap: None,
            final_softcap: None,
            sliding_window: None,
            swa_layers: vec![false; n_layers],
            rope_theta_swa: 10000.0,
            rope_freqs: false,
        }
    }

    /// Whether layer `l` is a sliding-window layer.
    pub fn is_swa(&self, l: usize) -> bool {
        self.sliding_window.is_some() && self.swa_layers.get(l).copied().unwrap_or(false)
    }
}

/// The shape of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `general.architecture` (`llama` or `qwen2`); the metadata keys below
    /// are read under this prefix.
    pub arch: String,
    /// Rotary pairing: `GptJ` (adjacent pairs) for `llama`, whose GGUF
    /// converters permute Q/K; `NeoX` (halves) for `qwen2`, as llama.cpp.
    pub rope_style: RopeStyle,
    /// Decoder blocks (`{arch}.block_count`).
    pub n_layers: usize,
    /// Model width (`{arch}.embedding_length`).
    pub d_model: usize,
    /// FFN width (`{arch}.feed_forward_length`).
    pub d_ff: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`{arch}.attention.head_count_kv`, default `n_heads`).
    pub n_kv_heads: usize,
    /// Dims per head (`{arch}.attention.key_length`, default
    /// `d_model / n_heads`); q is `n_heads * head_dim` wide.
    pub head_dim: usize,
    /// Rotated dims per head (`{arch}.rope.dimension_count`, default `head_dim`).
    pub n_rot: usize,
    /// Rope base θ (`{arch}.rope.freq_base`, default 10000).
    pub rope_theta: f32,
    /// RMSNorm epsilon (`{arch}.attention.layer_norm_rms_epsilon`, default 1e-5).
    pub rms_eps: f32,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub vocab: usize,
    /// The context length the model was trained for
    /// (`{arch}.context_length`), when the file says: the most KV cache
    /// positions a model may be loaded with.
    pub context_length: Option<usize>,
    /// The per-family parts of the block.
    pub block: BlockOptions,
}

impl LlamaConfig {
    /// An error unless `1 <= ctx_len <= context_length` (when the file gives
    /// a context length), and the KV caches of `ctx_len` positions
    /// (`2 * n_layers * ctx_len * kv_dim` f32s) fit the memory limit
    /// ([`rlx_runtime::limits::memory_limit`]). Checked before any graph or
    /// cache is built.
    pub fn check_ctx(&self, ctx_len: usize) -> Result<(), LlamaError> {
        let max = self.context_length.unwrap_or(usize::MAX);
        if ctx_len == 0 || ctx_len > max {
            return Err(LlamaError::ContextLength {
                ctx_len,
                max,
                source_key: format!("{}.context_length of the model", self.arch),
            });
        }
        let bytes = (2 * self.n_layers as u128) * ctx_len as u128 * self.kv_dim() as u128 * 4;
        rlx_runtime::limits::check_memory(
            &format!(
                "the KV caches of {ctx_len} positions ({} layers)",
                self.n_layers
            ),
            bytes,
        )?;
        Ok(())
    }

    /// Width of the K (and V) projections: `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of the Q projection (and of the attention output):
    /// `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// SmolLM2-135M's shape: 30 layers, width 576, FFN 1536, 9 heads / 3 KV
    /// heads of 64, rope θ 1e5 over 64 dims, RMS eps 1e-5, vocab 49152.
    pub fn smollm2_135m() -> LlamaConfig {
        LlamaConfig {
            arch: "llama".into(),
            rope_style: RopeStyle::GptJ,
            n_layers: 30,
            d_model: 576,
            d_ff: 1536,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            n_rot: 64,
            rope_theta: 100_000.0,
            rms_eps: 1e-5,
            vocab: 49152,
            context_length: Some(8192),
            block: BlockOptions::llama(30),
        }
    }

    /// Read the config of an open GGUF file.
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig, LlamaError> {
        let arch = f.get_str("general.architecture")?.to_string();
        let rope_style = match arch.as_str() {
            "llama" => RopeStyle::GptJ,
            "qwen2" | "qwen3" | "gemma3" => RopeStyle::NeoX,
            _ => return Err(LlamaError::UnsupportedArch { arch }),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let opt_usize = |k: &str| -> Result<Option<usize>, LlamaError> {
            match f.metadata(&key(k)) {
                None => Ok(None),
                Some(_) => Ok(Some(f.get_usize(&key(k))?)),
            }
        };
        let opt_float = |k: &str| -> Result<Option<f64>, LlamaError> {
            match f.metadata(&key(k)) {
                None => Ok(None),
                Some(_) => Ok(Some(f.get_float(&key(k))?)),
            }
        };
        let file = f.path().display().to_string();
        let bad = |k: &str, v: &dyn std::fmt::Display, expected: String| {
            LlamaError::InvalidConfig(ConfigError::new(&file, key(k), v, expected))
        };
        // The layer count is checked against the tensor names before
        // anything is built per layer.
        let n_layers = f.get_usize(&key("block_count"))?;
        let blocks = layers_in_names(f.tensors().iter().map(|t| t.name.as_str()), "blk.");
        if n_layers == 0 || n_layers != blocks {
            return Err(bad(
                "block_count",
                &n_layers,
                format!("the number of blk.N tensor groups in the file ({blocks})"),
            ));
        }
        let d_model = f.get_usize(&key("embedding_length"))?;
        if d_model == 0 {
            return Err(bad(
                "embedding_length",
                &d_model,
                "a positive integer".into(),
            ));
        }
        let emb = f
            .tensor_info("token_embd.weight")
            .ok_or_else(|| LlamaError::MissingTensor {
                name: "token_embd.weight".into(),
                expected: format!("[vocab, {d_model}]"),
            })?;
        if emb.row_len() != d_model {
            return Err(bad(
                "embedding_length",
                &d_model,
                format!(
                    "the row length of token_embd.weight {:?} ({})",
                    emb.shape(),
                    emb.row_len()
                ),
            ));
        }
        let d_ff = f.get_usize(&key("feed_forward_length"))?;
        if d_ff == 0 {
            return Err(bad(
                "feed_forward_length",
                &d_ff,
                "a positive integer".into(),
            ));
        }
        let n_heads = f.get_usize(&key("attention.head_count"))?;
        if n_heads == 0 || !d_model.is_multiple_of(n_heads) {
            return Err(bad(
                "attention.head_count",
                &n_heads,
                format!("a positive divisor of embedding_length {d_model}"),
            ));
        }
        let n_kv_heads = opt_usize("attention.head_count_kv")?.unwrap_or(n_heads);
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(bad(
                "attention.head_count_kv",
                &n_kv_heads,
                format!("a positive divisor of attention.head_count {n_heads}"),
            ));
        }
        let head_dim = match opt_usize("attention.key_length")? {
            None => d_model / n_heads,
            Some(k) => {
                if k == 0 || !k.is_multiple_of(2) {
                    return Err(bad(
                        "attention.key_length",
                        &k,
                        "an even positive integer".into(),
                    ));
                }
                if let Some(v) = opt_usize("attention.value_length")? {
                    if v != k {
                        return Err(bad(
                            "attention.value_length",
                            &v,
                            format!(
                                "attention.key_length ({k}): rlx needs equal k and v head widths"
                            ),
                        ));
                    }
                }
                k
            }
        };
        let n_rot = opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(bad(
                "rope.dimension_count",
                &n_rot,
                format!("an even positive integer <= head_dim {head_dim}"),
            ));
        }
        let float = |k: &str, default: f64| -> Result<f32, LlamaError> {
            let v = opt_float(k)?.unwrap_or(default);
            positive_finite(&file, &key(k), v)?;
            let v32 = v as f32;
            if !(v32.is_finite() && v32 > 0.0) {
                return Err(bad(k, &v, "a positive finite f32".into()));
            }
            Ok(v32)
        };
        let rope_theta = float("rope.freq_base", 10000.0)?;
        let rms_eps = float("attention.layer_norm_rms_epsilon", 1e-5)?;
        let context_length = opt_usize("context_length")?;
        if context_length == Some(0) {
            return Err(bad("context_length", &0, "a positive integer".into()));
        }
        // Rope scaling other than Llama 3's `rope_freqs.weight` (e.g. the
        // linear factor of Gemma 3 4B+ global layers) is refused rather
        // than ignored.
        if f.metadata(&key("rope.scaling.type")).is_some() {
            let t = f.get_str(&key("rope.scaling.type"))?;
            if t != "none" {
                return Err(bad(
                    "rope.scaling.type",
                    &t,
                    "none (only Llama 3 rope scaling, as rope_freqs.weight, is supported)".into(),
                ));
            }
        }
        let mut block = BlockOptions::llama(n_layers);
        block.rope_freqs = f.tensor_info("rope_freqs.weight").is_some();
        if let Some(v) = opt_float("attention.scale")? {
            block.attn_scale = Some(positive_finite(&file, &key("attention.scale"), v)? as f32);
        }
        if let Some(v) = opt_float("attn_logit_softcapping")? {
            block.attn_softcap =
                Some(positive_finite(&file, &key("attn_logit_softcapping"), v)? as f32);
        }
        if let Some(v) = opt_float("final_logit_softcapping")? {
            block.final_softcap =
                Some(positive_finite(&file, &key("final_logit_softcapping"), v)? as f32);
        }
        match arch.as_str() {
            "qwen3" => block.qk_norm = true,
            "gemma3" => {
                block.qk_norm = true;
                block.post_norms = true;
                block.ffn_act = FfnAct::GeluTanh;
                block.embed_scale = Some((d_model as f32).sqrt());
                block.rope_theta_swa = 10000.0;
                let w = opt_usize("attention.sliding_window")?;
                if w == Some(0) {
                    return Err(bad(
                        "attention.sliding_window",
                        &0,
                        "a positive integer".into(),
                    ));
                }
                block.sliding_window = w;
                block.swa_layers = (0..n_layers).map(|l| (l + 1) % 6 != 0).collect();
            }
            _ => {}
        }
        let vocab = emb.n_rows();
        if vocab == 0 {
            return Err(LlamaError::BadTensor {
                name: "token_embd.weight".into(),
                expected: format!("[vocab >= 1, {d_model}]"),
                found: emb.shape(),
                ty: emb.ggml_type,
            });
        }
        Ok(LlamaConfig {
            arch,
            rope_style,
            n_layers,
            d_model,
            d_ff,
            n_heads,
            n_kv_heads,
            head_dim,
            n_rot,
            rope_theta,
            rms_eps,
            vocab,
            context_length,
            block,
        })
    }
}
