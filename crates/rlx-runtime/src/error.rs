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
    /// A node produced a NaN or an infinity (reported when finite checks
    /// are on: `RLX_CHECK_FINITE=1`, `CpuOptions::check_finite`, or
    /// `rlx::Session::check_finite`).
    #[error("node {node} ({op}) {shape} produced a non-finite value: element {index} is {value}{context}")]
    NonFinite {
        /// The first node found producing a non-finite value.
        node: NodeId,
        /// Its op (with attributes).
        op: String,
        /// Its shape and dtype.
        shape: Shape,
        /// Flat index of the first non-finite element.
        index: usize,
        /// That element (`NaN`, `inf` or `-inf`).
        value: f32,
        /// Where it ran, e.g. ` (boundary output of compiled segment %3..=%9)`;
        /// empty for a thunk.
        context: String,
    },
    /// The memory a compile would allocate is above the limit.
    #[error("{what} needs {bytes} bytes ({}), above the memory limit of {limit} bytes ({}); set RLX_MAX_MEMORY=<bytes> to change the limit", human_bytes(*.bytes), human_bytes(*.limit))]
    MemoryLimit {
        /// What would be allocated (e.g. `arena of graph 'bert1x128'`).
        what: String,
        /// Bytes it needs.
        bytes: u128,
        /// The limit (`RLX_MAX_MEMORY`, or the machine's RAM).
        limit: u128,
    },
    /// The backend cannot run this graph.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A device operation failed: an allocation, a copy, a kernel compile
    /// or launch. The backend's own error type (e.g. `rlx_cuda::CudaError`)
    /// is inside, for `downcast_ref`.
    #[error("device error: {0}")]
    Device(Box<dyn std::error::Error + Send + Sync>),
}

/// `bytes` in binary units, e.g. `1.5 GiB`.
pub fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
