//! rlx-cuda: the CUDA backend.
//!
//! - [`CudaModel`]: a graph compiled for one NVIDIA GPU. One device arena,
//!   planned step-aware by `rlx_runtime::memory::plan_memory`; weights
//!   uploaded once (param-only subgraphs, such as the optimizer's QKV weight
//!   concat, run once on the host through `rlx_cpu` and are uploaded as
//!   params, converted to the storage plan: matmul weights `[out, in]`,
//!   16-bit in a half [`Precision`]); kernels written in CUDA C and compiled
//!   by NVRTC once per process and compute capability (f32 and
//!   mixed-precision variants, tensor-core attention); matmuls through
//!   cuBLASLt with bias / ReLU / GELU epilogues and timed algorithms.
//! - Thunks mode: one launch (kernel, gemm or copy) per op.
//! - Hybrid mode: [`CudaSegmentCompiler`] lowers each segment of the plan;
//!   at the first run its launches are captured into a CUDA graph that
//!   replays as one dispatch. Boundary tensors are arena slots at fixed
//!   addresses; segment-internal tensors live in a shared scratch buffer;
//!   elementwise chains inside a segment run as one generated kernel, and a
//!   quantized GEMV, a one-row Rope or a Reduce absorbs its neighbours
//!   (`fuse_gemv`, `fuse_cache`, `fuse_reduce`), a masked mean pooling and
//!   its L2 normalization run as one kernel (`fuse_pool`), and a norm the Add before
//!   it (`fuse_norm`; opt-in, `CudaOptions::fuse_matmul_norm`: a small
//!   16-bit matmul with the LayerNorm reading it, slower than cuBLASLt on
//!   the H200 so far).
//! - Programmatic dependent launch on compute capability 9.0+
//!   (`CudaOptions::programmatic_launch`, on by default): every rlx kernel
//!   opens with `griddepcontrol.launch_dependents` and `griddepcontrol.wait`
//!   (inserted into each module's source at compile time), and is launched
//!   with programmatic stream serialization, so the next kernel's blocks
//!   are scheduled while the current one runs and wait on the device
//!   instead of after a full drain (in CUDA graphs too). It pays where rlx
//!   kernels follow each other (SmolLM2 decode); cuBLASLt's kernels launch
//!   as usual.
//! - [`CudaModel::set_graph`]: another shape bucket of the same model
//!   (weights kept, graphs captured again); [`plan`]: the plan without a
//!   device.
//!
//! cudarc loads the CUDA libraries at run time, so the crate builds without
//! a CUDA toolkit; [`cuda_available`] says whether a device can be used.

mod cu;
mod device;
mod error;
mod executor;
mod fuse;
mod kernels;
mod kv;
mod launch;
mod lower;
mod lt;
mod mixed;
mod opcodes;
mod quant;
mod store;
mod views;

pub use device::cuda_available;
pub use error::CudaError;
pub use executor::{plan, CudaModel, CudaOptions, CudaPlan, CudaSegmentCompiler, SegmentPlan};
pub use rlx_runtime::Precision;
