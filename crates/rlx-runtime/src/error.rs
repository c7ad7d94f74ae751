//! Errors a compiled model reports at run time.

use rlx_ir::{DType, IrError, NodeId, Shape};

/// A run-time or compile-time error of an executable model.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The graph failed verification.
    #[error("invalid graph: {0}")]
    InvalidGraph(#[from] IrError),
    /// A param was never set.
    #[error("param '{name}' ({shape}) was not set")]
    MissingParam {
        /// Param name.
        name: String,
        /// Expected shape.
        shape: Shape,
    },
    /// `set_param` named no param of the graph.
    #[error("the graph has no param named '{name}'")]
    UnknownParam {
        /// The name given.
        name: String,
    },
    /// `run` named no input of the graph.
    #[error("the graph has no input named '{name}' (inputs: {known})")]
    UnknownInput {
        /// The name given.
        name: String,
        /// The graph's input names.
        known: String,
    },
    /// An input was not given to `run`.
    #[error("input '{name}' ({shape}) was not given")]
    MissingInput {
        /// Input name.
        name: String,
        /// Expected shape.
        shape: Shape,
    },
    /// An input was given twice in one `run`.
    #[error("input '{name}' was given twice")]
    DuplicateInput {
        /// Input name.
        name: String,
    },
    /// A buffer does not hold the expected number of elements.
    #[error("'{name}': expected {expected} elements for {shape}, got {got}")]
    WrongLength {
        /// Input or param name.
        name: String,
        /// Its shape.
        shape: Shape,
        /// Expected element count.
        expected: usize,
        /// Given element count.
        got: usize,
    },
    /// A buffer has the wrong dtype.
    #[error("'{name}': expected {expected} data for {shape}, got {got}")]
    WrongDType {
        /// Input or param name.
        name: String,
        /// Its shape.
        shape: Shape,
        /// Expected dtype.
        expected: DType,
        /// Given dtype.
        got: DType,
    },
    /// A kernel rejected its operands.
    #[error("node {node} ({op}): {message}")]
    Kernel {
        /// Failing node.
        node: NodeId,
        /// Op name.
        op: String,
        /// The kernel's message (shapes, dtypes, what was expected).
        message: String,
    },
    /// The backend cannot run this graph.
    #[error("unsupported: {0}")]
    Unsupported(String),
}
