//! Errors of the Llama loader, graph builder and generation loop.

use rlx_formats::{FormatError, GgmlType};
use rlx_ir::IrError;
use rlx_runtime::RuntimeError;

/// Why loading or running a Llama model failed.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    /// The GGUF file could not be read, or a metadata key is missing or mistyped.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The graph failed to build or verify.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The CPU runtime refused to compile or run a graph.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The file's `general.architecture` is not a Llama-family decoder.
    #[error(
        "unsupported architecture '{arch}' in general.architecture (supported: {supported})",
        supported = super::SUPPORTED_ARCHS.join(", ")
    )]
    UnsupportedArch {
        /// The architecture named by the file.
        arch: String,
    },
    /// A hyper-parameter is inconsistent (e.g. heads do not divide the width).
    #[error("bad config: {detail}")]
    BadConfig {
        /// What is wrong, with the values involved.
        detail: String,
    },
    /// A hyper-parameter is out of range or disagrees with the tensors
    /// (names the key, its value and what was expected).
    #[error(transparent)]
    InvalidConfig(#[from] crate::validate::ConfigError),
    /// The requested context length is outside what the model supports.
    #[error("context length {ctx_len}: expected 1..={max} ({source_key})")]
    ContextLength {
        /// The context length requested.
        ctx_len: usize,
        /// The most the model allows.
        max: usize,
        /// Where the limit comes from, e.g. `llama.context_length of the model`.
        source_key: String,
    },
    /// A tensor the model needs is not in the file.
    #[error("missing tensor '{name}': expected {expected}")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// Expected shape and type.
        expected: String,
    },
    /// A tensor has the wrong shape.
    #[error("tensor '{name}' has shape {found:?} ({ty}), expected {expected}")]
    BadTensor {
        /// Tensor name.
        name: String,
        /// Expected shape and type.
        expected: String,
        /// Row-major shape found.
        found: Vec<usize>,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A tensor's block type cannot be computed with.
    #[error("tensor '{name}' has unsupported type {ty} (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, Q8_K)")]
    UnsupportedQuant {
        /// Tensor name.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A token id is outside the vocabulary.
    #[error("token id {id} at position {position} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Its position in the sequence fed to the model.
        position: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The sequence would not fit the KV cache.
    #[error("context overflow: {needed} positions needed but the context holds {ctx_len}")]
    ContextOverflow {
        /// Positions the request needs.
        needed: usize,
        /// Context length the model was loaded with.
        ctx_len: usize,
    },
    /// `prefill` was called with no tokens.
    #[error("empty prompt: prefill needs at least one token")]
    EmptyPrompt,
    /// `decode` was called before any `prefill`.
    #[error("decode called before prefill: the KV cache is empty")]
    NoPrefill,
    /// A graph output was not the expected f32 logits.
    #[error("internal: graph output is {found}, expected f32 logits [{vocab}]")]
    BadOutput {
        /// What came back.
        found: String,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A batched decode step was given no sequences, or more than the
    /// model runs in one step.
    #[error("batched decode of {batch} sequences: expected 1..={max}")]
    BatchSize {
        /// Sequences given.
        batch: usize,
        /// The most one step takes.
        max: usize,
    },
    /// A KV cache does not belong to this model: made by another model, or
    /// of another shape (layers, context length, kv width).
    #[error("KV cache: {detail}")]
    ForeignCache {
        /// What differs, with the values found and expected.
        detail: String,
    },
    /// One sequence of a batched decode step is invalid (nothing ran).
    #[error("batched decode, sequence {index}: {source}")]
    BatchSequence {
        /// Its index in the batch.
        index: usize,
        /// What is wrong with it (`TokenOutOfRange`, `ContextOverflow`,
        /// `NoPrefill` or `ForeignCache`).
        source: Box<LlamaError>,
    },
}
