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

mod config;
mod error;
mod generate;
mod graph;
mod weights;

pub use config::{LlamaConfig, SUPPORTED_ARCHS};
pub use error::LlamaError;
pub use generate::{argmax, KvCache, LlamaDevice, LlamaModel, MAX_DECODE_BATCH};
pub use graph::{batch_cache_names, build_graph, cache_names, extend_bias, Phase};
pub use weights::{bias_name, gate_up_name, qkv_name, Linear, LlamaWeights, EMBED_TABLE};
