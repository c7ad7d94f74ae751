//! Llama-family decoders from GGUF files: config from the GGUF metadata,
//! weights kept packed (quantized matmuls run as `DequantMatMul`), prefill
//! and decode graphs sharing a KV cache, and a generation loop.
//!
//! - [`LlamaConfig`]: hyper-parameters read from `llama.*` (or `qwen2.*`)
//!   metadata.
//! - [`LlamaWeights`]: every tensor the graphs bind, loaded from the file.
//! - [`build_graph`]: the prefill graph (`S` tokens at positions `0..S`) or
//!   the decode graph (one token at position `p`, attending over the cache).
//! - [`LlamaModel`]: load, prefill, decode, generate, on the CPU or (feature
//!   `cuda`) a CUDA GPU ([`LlamaDevice`]); and, on the CPU, a batched
//!   decode step over several sequences, each with its own [`KvCache`]
//!   ([`LlamaModel::decode_batch`]).
//!
//! Rope: GGUF converters permute the Q/K weights of `llama` models so that
//! rotary pairs are adjacent; llama.cpp therefore uses its `NORM` rope
//! (our [`rlx_ir::RopeStyle::GptJ`]) for this architecture, and so do we.
//!
//! `qwen2` (Qwen2, Qwen2.5) is the same block with biases on the q/k/v
//! projections (added after the matmul) and NeoX rope, as in llama.cpp.
//! `qwen3` adds an RMSNorm of every q and k head before rope; `gemma3`
//! adds those, scales the embeddings by `sqrt(d_model)`, norms the attention
//! and FFN outputs before the residual adds, uses a GELU-tanh gated FFN,
//! sliding-window attention (rope base 10000) on 5 of every 6 layers, and an
//! optional final logit soft-cap. Llama 3's rope scaling comes as
//! `rope_freqs.weight`, per-pair frequency divisors (the `Rope` op's third
//! input).

mod config;
mod error;
mod generate;
mod graph;
mod weights;

pub use config::{BlockOptions, FfnAct, LlamaConfig, SUPPORTED_ARCHS};
pub use error::LlamaError;
pub use generate::{argmax, KvCache, LlamaDevice, LlamaModel, MAX_DECODE_BATCH};
pub use graph::{
    batch_cache_names, build_graph, cache_names, extend_bias, swa_input, swa_keep, Phase,
};
pub use weights::{
    bias_name, gate_up_name, qkv_name, Linear, LlamaWeights, EMBED_TABLE, ROPE_FREQS,
};
