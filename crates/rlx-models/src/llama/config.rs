//! Hyper-parameters from GGUF metadata.

use super::LlamaError;
use rlx_formats::GgufFile;
use rlx_ir::RopeStyle;

/// The `general.architecture` values this decoder runs: `llama`, and
/// `qwen2` (the same block with biases on q/k/v and NeoX rope).
pub const SUPPORTED_ARCHS: [&str; 2] = ["llama", "qwen2"];

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
    /// Dims per head (`d_model / n_heads`).
    pub head_dim: usize,
    /// Rotated dims per head (`{arch}.rope.dimension_count`, default `head_dim`).
    pub n_rot: usize,
    /// Rope base θ (`{arch}.rope.freq_base`, default 10000).
    pub rope_theta: f32,
    /// RMSNorm epsilon (`{arch}.attention.layer_norm_rms_epsilon`, default 1e-5).
    pub rms_eps: f32,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub vocab: usize,
}

impl LlamaConfig {
    /// Width of the K (and V) projections: `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
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
        }
    }

    /// Read the config of an open GGUF file.
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig, LlamaError> {
        let arch = f.get_str("general.architecture")?.to_string();
        let rope_style = match arch.as_str() {
            "llama" => RopeStyle::GptJ,
            "qwen2" => RopeStyle::NeoX,
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
        let n_layers = f.get_usize(&key("block_count"))?;
        let d_model = f.get_usize(&key("embedding_length"))?;
        let d_ff = f.get_usize(&key("feed_forward_length"))?;
        let n_heads = f.get_usize(&key("attention.head_count"))?;
        let n_kv_heads = opt_usize("attention.head_count_kv")?.unwrap_or(n_heads);
        if n_heads == 0 || n_kv_heads == 0 || d_model % n_heads != 0 || n_heads % n_kv_heads != 0 {
            return Err(LlamaError::BadConfig {
                detail: format!(
                    "embedding_length {d_model}, head_count {n_heads}, head_count_kv {n_kv_heads}: \
                     heads must divide the width and kv heads must divide the heads"
                ),
            });
        }
        let head_dim = d_model / n_heads;
        let n_rot = opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(LlamaError::BadConfig {
                detail: format!(
                    "rope.dimension_count {n_rot} must be even and <= head_dim {head_dim}"
                ),
            });
        }
        let rope_theta = opt_float("rope.freq_base")?.unwrap_or(10000.0) as f32;
        let rms_eps = opt_float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32;
        let emb = f
            .tensor_info("token_embd.weight")
            .ok_or_else(|| LlamaError::MissingTensor {
                name: "token_embd.weight".into(),
                expected: format!("[vocab, {d_model}]"),
            })?;
        let vocab = emb.n_rows();
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
        })
    }
}
