//! The CUDA plan without a device: what `compile` would build.

use super::{Core, CudaOptions};
use rlx_ir::Graph;
use rlx_runtime::bind::{split_static, StaticSplit};
use rlx_runtime::hybrid::PlanReport;
use rlx_runtime::{MemoryStats, RuntimeError};

/// What compiling a graph for CUDA plans, computed without a device: the
/// segment plan (compiled segments, thunk ranges, dispatches and why each
/// op stayed out), the arena figures and the storage plan.
#[derive(Debug, Clone)]
pub struct CudaPlan {
    /// Segments, thunk ranges, dispatches and reasons.
    pub report: PlanReport,
    /// Arena and segment scratch figures (f32-sized slots).
    pub memory: MemoryStats,
    /// Tensors stored in 16 bits (activations and weights) at the
    /// options' precision.
    pub half_tensors: usize,
    /// Matmul weights stored transposed (`[out, in]`).
    pub transposed_weights: usize,
    /// Narrows that attention reads in place (never materialized).
    pub folded_narrows: usize,
    /// Elementwise chains fused into one generated kernel each (hybrid
    /// segments only), and the nodes they cover.
    pub fused_chains: usize,
    /// Nodes inside fused chains.
    pub fused_nodes: usize,
    /// Quantized GEMVs that absorbed their RmsNorm / SwiGLU prologue or
    /// bias / residual Add (hybrid segments only).
    pub fused_gemvs: usize,
    /// Nodes absorbed by those GEMVs (the GEMVs not counted).
    pub gemv_absorbed: usize,
    /// One-row `Rope`s whose launch also does KV-cache writes, and the
    /// `CacheWrite`s they do.
    pub fused_ropes: usize,
    /// `CacheWrite`s done by those ropes.
    pub rope_writes: usize,
    /// `Reduce`s that apply their input's `Binary` per element (the
    /// binary never materialized).
    pub fused_reduces: usize,
    /// Masked mean poolings (with their L2 normalization where one
    /// follows) run as one kernel each.
    pub fused_pools: usize,
    /// `FusedResidualLN`s that compute the matmul they read (small 16-bit
    /// matmuls; the matmul never materialized).
    pub fused_gemm_norms: usize,
    /// Norms that compute the `Add` making their input.
    pub fused_norm_adds: usize,
    /// Embedding `Gather`s whose rows a norm reads from the table (never
    /// materialized).
    pub fused_norm_gathers: usize,
}

/// Plan `graph` for CUDA as [`CudaModel::compile`](super::CudaModel::compile)
/// would (param-only subgraphs split off, the hybrid plan, the storage
/// plan, the arena), without opening a device.
pub fn plan(graph: Graph, opts: &CudaOptions) -> Result<CudaPlan, RuntimeError> {
    graph.verify()?;
    let StaticSplit { main, .. } = split_static(&graph);
    let core = Core::new(main, opts, super::small_matmul_kernel(opts));
    let (mut transposed, mut folded) = (0, 0);
    for n in core.graph.nodes() {
        let s = core.store.get(n.id);
        transposed += s.transposed as usize;
        folded += s.folded as usize;
    }
    let (mut fused_chains, mut fused_nodes) = (0, 0);
    let (mut fused_gemvs, mut gemv_absorbed) = (0, 0);
    let (mut fused_ropes, mut rope_writes, mut fused_reduces) = (0, 0, 0);
    let (mut fused_gemm_norms, mut fused_norm_adds, mut fused_pools) = (0, 0, 0);
    let mut fused_norm_gathers = 0;
    for c in core.chains.iter().flat_map(|m| m.values()) {
        match c {
            crate::fuse::Fusion::Root(ch) => {
                fused_chains += 1;
                fused_nodes += ch.nodes.len();
            }
            crate::fuse::Fusion::Gemv(f) => {
                fused_gemvs += 1;
                gemv_absorbed += f.nodes.len() - 1;
            }
            crate::fuse::Fusion::RopeCache(f) => {
                fused_ropes += 1;
                rope_writes += 1 + f.v.is_some() as usize;
            }
            crate::fuse::Fusion::Reduce(_) => fused_reduces += 1,
            crate::fuse::Fusion::Pool(_) => fused_pools += 1,
            crate::fuse::Fusion::GemmNorm(_) => fused_gemm_norms += 1,
            crate::fuse::Fusion::NormFeed(f) => {
                fused_norm_adds += f.add.is_some() as usize;
                fused_norm_gathers += f.gathers.iter().flatten().count();
            }
            _ => {}
        }
    }
    Ok(CudaPlan {
        report: core.report.clone(),
        memory: MemoryStats {
            arena_bytes: core.mem.arena_bytes,
            naive_bytes: core.mem.naive_bytes,
            scratch_bytes: core.scratch_bytes,
        },
        half_tensors: core.store.half_nodes(),
        transposed_weights: transposed,
        folded_narrows: folded,
        fused_chains,
        fused_nodes,
        fused_gemvs,
        gemv_absorbed,
        fused_ropes,
        rope_writes,
        fused_reduces,
        fused_pools,
        fused_gemm_norms,
        fused_norm_adds,
        fused_norm_gathers,
    })
}
