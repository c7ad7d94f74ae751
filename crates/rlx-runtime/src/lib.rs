//! rlx-runtime: what every backend shares.
//!
//! - [`hybrid`]: the schedule splitter, sub-graph extraction, the
//!   [`SegmentCompiler`](hybrid::SegmentCompiler) trait and the plan builder.
//! - [`memory`]: the step-aware arena planner (DESIGN.md invariant 2).
//! - [`bind`]: buffer checks and the param-only (static) split every backend uses.
//! - [`ThunkSchedule`]: one thunk per node, which thunk ranges index.
//! - [`Executable`]: the interface of a compiled model, and its errors.
//! - [`limits`]: the memory limit checked before big allocations.
//! - [`Precision`]: the arithmetic of a model's float tensors (f32, tf32, bf16, f16).
//!
//! Backends (rlx-cpu, rlx-cuda) implement the traits and own their executors.

#![deny(missing_docs)]

pub mod bind;
mod error;
mod exec;
pub mod hybrid;
pub mod limits;
pub mod memory;
mod precision;
mod schedule;

pub use error::{human_bytes, RuntimeError};
pub use exec::{Executable, MemoryStats, TensorRef};
pub use precision::Precision;
pub use schedule::{Thunk, ThunkSchedule};
