//! rlx-runtime: what every backend shares.
//!
//! - [`hybrid`]: the schedule splitter, sub-graph extraction, the
//!   [`SegmentCompiler`](hybrid::SegmentCompiler) trait and the plan builder.
//! - [`memory`]: the step-aware arena planner (DESIGN.md invariant 2).
//! - [`Executable`]: the interface of a compiled model, and its errors.
//!
//! Backends (rlx-cpu, rlx-cuda) implement the traits and own their executors.

mod error;
mod exec;
pub mod hybrid;
pub mod memory;

pub use error::RuntimeError;
pub use exec::{Executable, MemoryStats, TensorRef};
