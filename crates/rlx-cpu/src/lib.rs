//! rlx-cpu: the CPU backend.
//!
//! - [`kernels`]: one reference-checked kernel per op (the thunks).
//! - [`CpuModel`]: a graph compiled for the CPU, run as thunks or as a hybrid
//!   plan whose compiled segments come from [`FusedCompiler`].
//! - [`FusedCompiler`]: the CPU segment compiler. It lowers a segment of
//!   row-local ops to a fused plan that runs in one parallel region.

#![deny(missing_docs)]

mod arena;
mod executor;
mod fused;
mod fused_cost;
pub mod isa;
pub mod kernels;
pub mod peak;

pub use executor::{check_finite_from_env, CpuModel, CpuOptions, ProfileEntry, CHECK_FINITE_ENV};
pub use fused::{FusedCompiler, FusedPlan, Scratch};
pub use isa::{CpuFeatures, Isa};
pub use peak::{measure_fma_peak, measure_gemm_peak, measure_peaks};
