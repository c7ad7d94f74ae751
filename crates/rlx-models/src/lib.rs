//! rlx-models: model graph builders and weight mapping.
//!
//! - [`bert`]: BERT encoders from `config.json`.
//! - [`modernbert`]: ModernBERT (rotary, local/global attention, GeGLU) as a BERT variant.
//! - [`embedder`]: [`SentenceEmbedder`], sentence embeddings end to end.
//! - [`st`]: the sentence-transformers files (pooling, Normalize, prompts).
//! - [`tokenizer`]: BERT WordPiece tokenization via `tokenizers`.
//! - [`gguf_tokenizer`]: byte-level BPE (`gpt2`) and SentencePiece (`llama`)
//!   tokenization from GGUF metadata.
//! - [`llama`]: Llama-family decoders from GGUF (prefill/decode graphs, KV cache, generation).
//! - [`reranker`]: [`Reranker`], cross-encoder scores of (query, document) pairs.
//! - [`recurrent`]: a Qwen3-Next-style GatedDeltaNet block and a 3:1 GDN/attention hybrid.
//! - [`qwen3_next`]: Qwen3-Next and Qwen3.5 text (GatedDeltaNet hybrids) from an HF directory.
//! - [`sampling`]: greedy / temperature / top-k / top-p sampling.
//! - [`validate`]: [`ConfigError`], the error of every hyper-parameter check.

#![deny(missing_docs)]

pub mod bert;
pub mod chat_template;
pub mod embedder;
pub mod gguf_tokenizer;
pub mod llama;
mod lru;
pub mod modernbert;
pub mod qwen3_next;
pub mod recurrent;
pub mod reranker;
pub mod sampling;
pub mod st;
pub mod stop;
pub mod tokenizer;
pub mod validate;

pub use embedder::{
    padded_len, plan_runs, CacheStats, EmbedDevice, EmbedOptions, ModelError, SentenceEmbedder,
    CPU_SEQ_BUCKET, CUDA_SEQ_BUCKET, DEFAULT_CACHE_BYTES,
};
pub use reranker::{Ranked, Reranker, ScoreActivation};
pub use st::{Pooling, PoolingMode, StConfig};
pub use validate::ConfigError;

/// The hybrid plan of one compiled graph, as a model holds it: what
/// `Executable::report` says, with the length of the schedule the report's
/// node indices run along.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledPlan {
    /// Which graph, e.g. `decode` or `decode_batch 4`.
    pub name: String,
    /// Nodes in the executed graph's schedule (thunk ranges and segments
    /// index it).
    pub nodes: usize,
    /// Segments and thunk ranges, in schedule order, with why each thunk
    /// range stayed out of a segment.
    pub report: rlx_runtime::hybrid::PlanReport,
}

/// A plan's layout as JSON, the form `rlx plan --json` and `GET /v1/plans`
/// share: `segments` (`nodes`, `first`, `last`, `boundary_inputs`,
/// `boundary_outputs`) and thunk `ranges` (`start`, `end`, and each op's
/// `node`, `op` and `reason`).
pub fn plan_layout_json(r: &rlx_runtime::hybrid::PlanReport) -> serde_json::Value {
    use serde_json::json;
    json!({
        "segments": r.segments.iter().map(|s| json!({
            "nodes": s.nodes, "first": s.first.0, "last": s.last.0,
            "boundary_inputs": s.boundary_inputs.iter().map(|n| n.0).collect::<Vec<_>>(),
            "boundary_outputs": s.boundary_outputs.iter().map(|n| n.0).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "ranges": r.ranges.iter().map(|t| json!({
            "start": t.start, "end": t.end,
            "ops": t.ops.iter().map(|o| json!({"node": o.node.0, "op": o.op, "reason": o.reason})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
