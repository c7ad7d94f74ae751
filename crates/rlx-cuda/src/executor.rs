//! The CUDA executor: one device arena planned step-aware, weights uploaded
//! once, thunks as one launch per op, compiled segments as CUDA graphs.

use crate::device::{DeviceBuffer, Gpu, Graph as CuGraph, Pinned};
use crate::error::CudaError;
use crate::fuse::{find_fusions, fused_ticks, Fusion};
use crate::launch::{epilogue_launch, Arg, Launch};
use crate::lower::{lower, Env, WithStore};
use crate::store::{device_bytes, Store, StorePlan};
use crate::views::{view_of, view_of_st};
use cudarc::driver::{result as drv, sys as drv_sys};
use rlx_cpu::{CpuModel, CpuOptions};
use rlx_ir::{Graph, Node, NodeId, Op, Shape, Tensor};
use rlx_runtime::bind::{
    bind_inputs, check_params_set, param_shape, param_tensor_shape, split_static, tensor_bytes,
    tensor_from_bytes, StaticSplit,
};
use rlx_runtime::hybrid::{
    build_plan, Decline, HybridPlan, PlanReport, SegmentCompiler, SplitPolicy, Step, SubGraph,
};
use rlx_runtime::memory::{plan_memory, MemoryPlan, Tick};
use rlx_runtime::{Executable, MemoryStats, Precision, RuntimeError, TensorRef};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::Arc;

mod buckets;
mod summary;

pub use summary::{plan, CudaPlan};

/// How to compile a graph for a CUDA device.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// Device ordinal.
    pub device: usize,
    /// Split into CUDA-graph segments and thunk ranges (else thunks only).
    pub hybrid: bool,
    /// Which ops may enter compiled segments (default: every op the
    /// backend can run; attention included, since its shapes are static).
    pub policy: SplitPolicy,
    /// Arithmetic of float tensors: `F32` (default), `Tf32` (TF32 tensor
    /// core matmuls), or `Bf16` / `F16`: matmul weights converted once at
    /// upload, activations 16-bit between ops with mixed-precision kernels,
    /// matmuls on tensor cores with f32 accumulation, norms / softmax /
    /// reductions accumulating in f32. Inputs and outputs stay f32.
    pub precision: Precision,
    /// In 16-bit hybrid segments, run a small matmul (at most 256 rows)
    /// together with the `FusedResidualLN` reading it as one rlx kernel
    /// (`gemm_ln`) instead of cuBLASLt and the norm kernel. Off by
    /// default: on the H200 it is correct but slower than cuBLASLt (see
    /// [`crate`]'s notes and bench/README.md).
    pub fuse_matmul_norm: bool,
    /// Launch rlx's kernels with programmatic dependent launch on compute
    /// capability 9.0+: each kernel's blocks are scheduled while the
    /// previous kernel runs and wait on the device for it, which hides part
    /// of the gap between consecutive rlx kernels, inside CUDA graphs too
    /// (H200, SmolLM2-shaped decode: +3-4 % as one graph, +25-39 % as
    /// thunks). cuBLAS matmuls launch as usual, so a kernel after one gains
    /// nothing. On by default; the environment variable `RLX_CUDA_PDL=0`
    /// turns it off for A/B measurements.
    pub programmatic_launch: bool,
    /// Run 16-bit matmuls of at most 256 rows against uploaded weights on
    /// rlx's own kernel (`gemm_pf`: whole-K 16-row tiles whose weight rows
    /// load before the kernel waits for the previous one) instead of
    /// cuBLASLt, on compute capability 8.0+ (ignored below). Off by
    /// default: slower than cuBLASLt on the H200 so far (see
    /// bench/results/gpu_h200.md). The environment variable
    /// `RLX_CUDA_SMALL_GEMM=1` (or `0`) overrides it, for A/B measurements.
    pub small_matmul_kernel: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            hybrid: false,
            policy: SplitPolicy::new(|_| true),
            precision: Precision::F32,
            fuse_matmul_norm: false,
            programmatic_launch: true,
            small_matmul_kernel: false,
        }
    }
}

/// Whether `opts` puts small 16-bit matmuls on rlx's `gemm_pf` kernel:
/// `CudaOptions::small_matmul_kernel`, unless the environment variable
/// `RLX_CUDA_SMALL_GEMM` is `1` or `0`.
fn small_matmul_kernel(opts: &CudaOptions) -> bool {
    match std::env::var("RLX_CUDA_SMALL_GEMM").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => opts.small_matmul_kernel,
    }
}

/// The CUDA segment compiler: it takes every op the backend has a kernel
/// for, and lowers a segment to its own scratch memory plan. At run time
/// the segment's launches are captured into one CUDA graph that replays
/// as one dispatch; boundary tensors are arena slots at fixed addresses.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaSegmentCompiler;

/// A lowered segment: the memory plan of its internal tensors.
#[derive(Debug)]
pub struct SegmentPlan {
    mem: MemoryPlan,
}

impl SegmentPlan {
    /// Bytes of scratch memory for the segment's internal tensors.
    pub fn scratch_bytes(&self) -> usize {
        self.mem.arena_bytes
    }
}

/// Dummy addresses for capability checks: every node has one.
fn dummy_addr(id: NodeId) -> Option<u64> {
    Some(0x1000_0000 + (id.0 as u64) * 0x1000_0000)
}

impl SegmentCompiler for CudaSegmentCompiler {
    type Lowered = SegmentPlan;

    fn name(&self) -> &'static str {
        "cuda-graph"
    }

    fn claims(&self, graph: &Graph, node: &Node) -> Result<(), Decline> {
        lower(graph, node, &dummy_addr, &mut Vec::new())
            .map(|_| ())
            .map_err(|e| Decline::at(node.id, e))
    }

    fn try_lower(&self, sub: &SubGraph) -> Result<SegmentPlan, Decline> {
        let g = &sub.graph;
        for n in g.nodes() {
            if !n.op.is_leaf() {
                lower(g, n, &dummy_addr, &mut Vec::new()).map_err(|e| {
                    let parent = sub.parent_of[n.id.index()];
                    Decline::at(parent, format!("node {parent} ({}): {e}", n.op.name()))
                })?;
            }
        }
        let ticks: Vec<Tick> = g
            .nodes()
            .iter()
            .filter(|n| !n.op.is_leaf())
            .map(|n| Tick::Node(n.id))
            .collect();
        let mem = plan_memory(g, &ticks, |n| view_of(g, n), is_cache_write);
        Ok(SegmentPlan { mem })
    }
}

/// `CacheWrite` updates its cache param in place: its value lives outside
/// the arena, at the param's device address.
fn is_cache_write(n: &Node) -> bool {
    matches!(n.op, Op::CacheWrite { .. })
}

/// The node whose memory holds `id`'s value: through `CacheWrite`s to the
/// cache they update.
fn home(graph: &Graph, mut id: NodeId) -> NodeId {
    while let Op::CacheWrite { .. } = graph.node(id).op {
        id = graph.node(id).inputs[0];
    }
    id
}

/// The param-only part of a graph, run on the host when params change.
struct Prep {
    model: CpuModel,
    params: Vec<String>,
    names: Vec<String>,
}

/// A device failure as a run-time error ([`RuntimeError::Device`], or
/// `Unsupported` for [`CudaError::Unsupported`]).
fn rt(e: CudaError) -> RuntimeError {
    e.into()
}

/// Something this backend cannot do with these models or params.
fn unsupported(message: String) -> RuntimeError {
    RuntimeError::Unsupported(message)
}

/// A device failure while working on `node`: `Unsupported` becomes the
/// node's kernel error (as before), the rest [`RuntimeError::Device`] with
/// the node named.
fn node_err(graph: &Graph, node: NodeId, e: CudaError) -> RuntimeError {
    match e {
        CudaError::Unsupported(m) => kernel_err(graph, node, m),
        e => RuntimeError::Device(Box::new(e.at_node(node))),
    }
}

fn kernel_err(graph: &Graph, node: NodeId, message: String) -> RuntimeError {
    RuntimeError::Kernel {
        node,
        op: graph.get(node).map(|n| n.op.describe()).unwrap_or_default(),
        message,
    }
}

/// A launch with its arguments resolved to bytes.
struct Ready {
    work: Work,
    /// The node it belongs to (for errors).
    node: NodeId,
}

enum Work {
    Kernel {
        name: &'static str,
        f: drv_sys::CUfunction,
        grid: [u32; 3],
        block: u32,
        /// Bytes of dynamic shared memory.
        smem: u32,
        args: Box<[u64]>,
    },
    /// A gemm through `cublasGemmStridedBatchedEx` (no epilogue).
    Gemm(crate::launch::Gemm),
    /// A planned cuBLASLt matmul (epilogue included).
    Lt(Box<crate::lt::LtMatmul>),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Zero {
        dst: u64,
        bytes: usize,
    },
}

impl Work {
    /// A short label for profiles.
    fn kind(&self) -> &'static str {
        match self {
            Work::Kernel { name, .. } => name,
            Work::Gemm(_) => "gemm",
            Work::Lt(_) => "gemm-lt",
            Work::Copy { .. } => "copy",
            Work::Zero { .. } => "memset",
        }
    }
}

// SAFETY: `CUfunction` handles are plain identifiers of loaded kernels; they
// are used only through `&mut CudaModel`.
unsafe impl Send for Ready {}

impl Ready {
    fn issue(&self, gpu: &Gpu) -> Result<(), CudaError> {
        let stream = gpu.stream.cu_stream();
        match &self.work {
            Work::Kernel {
                f,
                grid,
                block,
                smem,
                args,
                ..
            } => {
                let mut ptrs: Vec<*mut c_void> = args
                    .iter()
                    .map(|a| a as *const u64 as *mut c_void)
                    .collect();
                if gpu.grid_dep {
                    return launch_grid_dep(*f, *grid, *block, *smem, stream, &mut ptrs);
                }
                // SAFETY: each pointer addresses an 8-byte slot whose low bytes hold
                // the kernel parameter in the kernel's own type (little-endian);
                // device addresses come from live allocations of this model.
                unsafe {
                    drv::launch_kernel(
                        *f,
                        (grid[0], grid[1], grid[2]),
                        (*block, 1, 1),
                        *smem,
                        stream,
                        &mut ptrs,
                    )
                }
                .map_err(|e| CudaError::driver("launch", e))
            }
            Work::Gemm(g) => crate::lt::gemm_ex(gpu, g),
            Work::Lt(m) => m.issue(gpu),
            Work::Copy { dst, src, bytes } => {
                // SAFETY: both ranges lie in live device allocations (lowered from the plan).
                unsafe { drv::memcpy_dtod_async(*dst, *src, *bytes, stream) }
                    .map_err(|e| CudaError::driver("copy", e))
            }
            Work::Zero { dst, bytes } => {
                // SAFETY: the range lies in a live device allocation.
                unsafe { drv::memset_d8_async(*dst, 0, *bytes, stream) }
                    .map_err(|e| CudaError::driver("memset", e))
            }
        }
    }
}

/// Launch `f` allowing programmatic stream serialization: it may start
/// before the previous work on the stream has finished. Sound because every
/// rlx kernel waits for its dependencies (`griddepcontrol.wait`) before its
/// first global access (`device::with_grid_dep`).
fn launch_grid_dep(
    f: drv_sys::CUfunction,
    grid: [u32; 3],
    block: u32,
    smem: u32,
    stream: drv_sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: a zeroed attribute is a valid plain-data value; the id and the
    // union field set next are the ones the driver reads.
    let mut attr: drv_sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = drv_sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as for `launch_kernel` in `Ready::issue`: each parameter
    // pointer addresses an 8-byte slot holding the kernel's argument; the
    // config and its one attribute live across the call.
    unsafe { drv_sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(|e| CudaError::driver("launch", e))
}

/// One executable step with resolved work.
enum ExecStep {
    Launches(Vec<Ready>),
    Graph(CuGraph),
}

/// The planned main graph.
struct Core {
    graph: Graph,
    steps: Vec<Step<SegmentPlan>>,
    report: PlanReport,
    mem: MemoryPlan,
    scratch_bytes: usize,
    /// How each node is stored on the device (precision, weight layout).
    store: StorePlan,
    /// Param name -> node.
    param_ids: HashMap<String, NodeId>,
    /// Per step: the fused elementwise chains of a compiled segment (by
    /// sub-graph node); empty for thunk ranges.
    chains: Vec<HashMap<NodeId, Fusion>>,
}

impl Core {
    /// `own_gemms`: small 16-bit matmuls may run on `gemm_pf`
    /// ([`small_matmul_kernel`]).
    fn new(graph: Graph, opts: &CudaOptions, own_gemms: bool) -> Core {
        let mut plan = if opts.hybrid {
            build_plan(&graph, &opts.policy, &CudaSegmentCompiler)
        } else {
            HybridPlan::thunks_only(&graph)
        };
        let mut store = StorePlan::new(&graph, opts.precision);
        if own_gemms {
            store.allow_own_gemms(&graph);
        }
        // Which step computes each node (a folded Narrow needs its readers
        // in its own step).
        let mut step_of = vec![usize::MAX; graph.len()];
        for (i, st) in plan.steps.iter().enumerate() {
            match st {
                Step::Thunks { start, end } => {
                    for n in &graph.nodes()[*start..*end] {
                        step_of[n.id.index()] = i;
                    }
                }
                Step::Compiled { sub, .. } => {
                    for n in sub.graph.nodes().iter().filter(|n| !n.op.is_leaf()) {
                        step_of[sub.parent_of[n.id.index()].index()] = i;
                    }
                }
            }
        }
        store.unfold_across(&graph, &step_of);
        // Fusions first: a fused group is one tick of its segment's memory
        // plan. Segment scratch plans under the storage plan (view offsets
        // count stored element sizes; folded Narrows alias their sources).
        let chains: Vec<HashMap<NodeId, Fusion>> = plan
            .steps
            .iter()
            .map(|s| match s {
                Step::Compiled { sub, .. } => {
                    find_fusions(&sub.graph, opts.fuse_matmul_norm, |id| {
                        store.get(sub.parent_of[id.index()])
                    })
                }
                Step::Thunks { .. } => HashMap::new(),
            })
            .collect();
        for (st, fusions) in plan.steps.iter_mut().zip(&chains) {
            if let Step::Compiled { sub, lowered, .. } = st {
                let g = &sub.graph;
                let sst = |id: NodeId| store.get(sub.parent_of[id.index()]);
                let ticks = fused_ticks(g, fusions);
                lowered.mem = plan_memory(g, &ticks, |n| view_of_st(g, n, &sst), is_cache_write);
            }
        }
        let ticks = plan.ticks(&graph);
        let mem = plan_memory(
            &graph,
            &ticks,
            |n| view_of_st(&graph, n, &|id| store.get(id)),
            is_cache_write,
        );
        let param_ids = graph
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Param { name } => Some((name.clone(), n.id)),
                _ => None,
            })
            .collect();
        let scratch_bytes = plan
            .steps
            .iter()
            .map(|s| match s {
                Step::Compiled { lowered, .. } => lowered.scratch_bytes(),
                Step::Thunks { .. } => 0,
            })
            .max()
            .unwrap_or(0);
        Core {
            graph,
            steps: plan.steps,
            report: plan.report,
            mem,
            scratch_bytes,
            store,
            param_ids,
            chains,
        }
    }

    /// How param `name` is stored on the device.
    fn param_store(&self, name: &str) -> Store {
        self.param_ids
            .get(name)
            .map(|&id| self.store.get(id))
            .unwrap_or_default()
    }
}

/// A param's device buffer moved out of a [`CudaModel`]
/// ([`CudaModel::take_param_buffer`], [`CudaModel::new_param_buffer`]) to
/// bind into another model of the same device, or back
/// ([`CudaModel::set_param_buffer`]), without a host copy: e.g. the KV cache
/// of one sequence between a decode model and a batched decode model. The
/// memory is freed when the last handle and model holding it are dropped.
pub struct DeviceParam {
    buf: Arc<DeviceBuffer>,
    shape: Shape,
    store: Store,
}

impl DeviceParam {
    /// The param's logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Bytes of device memory.
    pub fn bytes(&self) -> usize {
        self.buf.bytes
    }
}

impl std::fmt::Debug for DeviceParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceParam")
            .field("shape", &self.shape)
            .field("bytes", &self.buf.bytes)
            .field("store", &self.store)
            .finish()
    }
}

/// A graph compiled for a CUDA device.
pub struct CudaModel {
    core: Core,
    prep: Option<Prep>,
    params: HashMap<String, Tensor>,
    param_shapes: HashMap<String, Shape>,
    inputs: Vec<(String, NodeId, Shape)>,
    /// Params whose host value changed since the last upload.
    stale: HashSet<String>,
    /// Whether the prep graph must run again.
    prep_dirty: bool,
    /// The resolved schedule; `None` after any device address changed.
    exec: Option<Vec<ExecStep>>,
    /// Device copies of params; shared (see [`CudaModel::share_params`]).
    /// A param bound by [`CudaModel::set_param_buffer`] has a buffer here
    /// and no host value in `params`.
    dev_params: HashMap<String, Arc<DeviceBuffer>>,
    /// The device address of each param when `exec` was resolved: a
    /// [`CudaModel::set_param_buffer`] at the same address keeps `exec`
    /// (and its captured CUDA graphs).
    exec_addrs: HashMap<String, u64>,
    consts: HashMap<NodeId, DeviceBuffer>,
    arena: DeviceBuffer,
    scratch: DeviceBuffer,
    meta: Option<DeviceBuffer>,
    status: DeviceBuffer,
    in_stage: Pinned,
    out_stage: Pinned,
    /// Byte offset of each graph output in `out_stage` (arena outputs only).
    out_offsets: Vec<Option<usize>>,
    /// Byte offset of each input (by position in `inputs`) in `in_stage`,
    /// for inputs that live in the arena.
    in_offsets: Vec<Option<usize>>,
    /// The arena bytes `[lo, hi)` that hold the inputs. `in_stage` mirrors
    /// them, so one copy uploads every input: only inputs are live at tick
    /// 0, so the gaps between their slots hold nothing to preserve.
    in_span: (usize, usize),
    /// Whether the input upload / the output and status downloads are nodes
    /// of the first / last captured graph (the schedule starts / ends with a
    /// compiled segment), so a run issues no separate copies for them.
    copies_in_graph: (bool, bool),
    /// With `RLX_CUDA_PROFILE` set: per (op, work) synchronized time in ms and count.
    profile: Option<HashMap<String, (f64, usize)>>,
    /// The options it was compiled with (for [`CudaModel::set_graph`]).
    opts: CudaOptions,
    gpu: Gpu,
}

fn stage_offsets<'a>(
    sizes: impl Iterator<Item = Option<usize>> + 'a,
) -> (Vec<Option<usize>>, usize) {
    let mut at = 0usize;
    let offs = sizes
        .map(|s| {
            s.map(|b| {
                let o = at;
                at += b.div_ceil(64) * 64;
                o
            })
        })
        .collect();
    (offs, at)
}

impl CudaModel {
    /// Verify and plan `graph` for a CUDA device: allocate the arena, upload
    /// constants and load the kernels. Params are uploaded on the first run
    /// after they are set.
    pub fn compile(graph: Graph, opts: &CudaOptions) -> Result<CudaModel, RuntimeError> {
        graph.verify()?;
        let StaticSplit { main, prep } = split_static(&graph);
        // Every node that runs on the device must have a kernel.
        for n in main.nodes() {
            if !n.op.is_leaf() {
                lower(&main, n, &dummy_addr, &mut Vec::new())
                    .map_err(|e| kernel_err(&main, n.id, format!("CUDA backend: {e}")))?;
            }
        }
        let prep = match prep {
            None => None,
            Some((g, names)) => {
                let params = g
                    .nodes()
                    .iter()
                    .filter_map(|n| match &n.op {
                        Op::Param { name } => Some(name.clone()),
                        _ => None,
                    })
                    .collect();
                let model = CpuModel::compile(g, &CpuOptions::default())?;
                Some(Prep {
                    model,
                    params,
                    names,
                })
            }
        };
        let grid_dep =
            opts.programmatic_launch && std::env::var("RLX_CUDA_PDL").as_deref() != Ok("0");
        let gpu = Gpu::new(opts.device, grid_dep).map_err(rt)?;
        // gemm_pf asks for up to 99 KB of shared memory: compute capability 8.0+.
        let core = Core::new(main, opts, small_matmul_kernel(opts) && gpu.cc.0 >= 8);
        let mut param_shapes = HashMap::new();
        let mut inputs = Vec::new();
        for n in graph.nodes() {
            match &n.op {
                Op::Param { name } => {
                    param_shapes.insert(name.clone(), n.shape.clone());
                }
                Op::Input { name } => inputs.push((name.clone(), n.id, n.shape.clone())),
                _ => {}
            }
        }
        let mut consts = HashMap::new();
        for n in core.graph.nodes() {
            if let Op::Constant { value } = &n.op {
                let buf = DeviceBuffer::new(&gpu.ctx, n.shape.size_bytes()).map_err(rt)?;
                buf.upload(tensor_bytes(value)).map_err(rt)?;
                consts.insert(n.id, buf);
            }
        }
        let arena = DeviceBuffer::new(&gpu.ctx, core.mem.arena_bytes).map_err(rt)?;
        let scratch = DeviceBuffer::new(&gpu.ctx, core.scratch_bytes).map_err(rt)?;
        let status = DeviceBuffer::new(&gpu.ctx, 4).map_err(rt)?;
        status.upload(&[0u8; 4]).map_err(rt)?;
        let in_place: Vec<Option<(usize, usize)>> = inputs
            .iter()
            .map(|(_, id, _)| core.mem.placements[id.index()].map(|p| (p.offset, p.bytes)))
            .collect();
        let lo = in_place.iter().flatten().map(|p| p.0).min().unwrap_or(0);
        let hi = in_place
            .iter()
            .flatten()
            .map(|p| p.0 + p.1)
            .max()
            .unwrap_or(0);
        let (out_offsets, out_bytes) = stage_offsets(core.graph.outputs.iter().map(|&o| {
            let n = core.graph.node(o);
            core.mem.placements[o.index()]
                .map(|p| p.bytes)
                .or_else(|| is_cache_write(n).then(|| n.shape.size_bytes()))
        }));
        let in_stage = Pinned::new(&gpu.ctx, hi - lo).map_err(rt)?;
        let out_stage = Pinned::new(&gpu.ctx, out_bytes + 64).map_err(rt)?;
        Ok(CudaModel {
            core,
            prep_dirty: prep.is_some(),
            prep,
            params: HashMap::new(),
            param_shapes,
            inputs,
            stale: HashSet::new(),
            exec: None,
            dev_params: HashMap::new(),
            exec_addrs: HashMap::new(),
            consts,
            arena,
            scratch,
            meta: None,
            status,
            in_stage,
            out_stage,
            out_offsets,
            in_offsets: in_place.iter().map(|p| p.map(|p| p.0 - lo)).collect(),
            in_span: (lo, hi),
            copies_in_graph: (false, false),
            profile: std::env::var_os("RLX_CUDA_PROFILE").map(|_| HashMap::new()),
            opts: opts.clone(),
            gpu,
        })
    }

    /// A host value is about to be set for `name`: if its device buffer
    /// came from [`set_param_buffer`](Self::set_param_buffer), let it go
    /// (the upload gets a buffer of its own instead of writing into one
    /// that a [`DeviceParam`] handle may still share).
    fn detach_device_only(&mut self, name: &str) {
        if !self.params.contains_key(name) && self.dev_params.remove(name).is_some() {
            self.exec = None;
        }
    }

    /// The memory plan's safety check: no two live tensors overlap.
    pub fn check_memory_plan(&self) -> Result<(), (NodeId, NodeId)> {
        self.core.mem.check_no_overlap()
    }

    /// The precision the model was compiled for.
    pub fn precision(&self) -> Precision {
        self.core.store.precision
    }

    /// How many tensors (activations and weights) are stored in 16 bits.
    pub fn half_tensors(&self) -> usize {
        self.core.store.half_nodes()
    }

    /// The graph actually executed (param-only nodes replaced by `%static.N` params).
    pub fn graph(&self) -> &Graph {
        &self.core.graph
    }

    /// Kernel launches, gemms and copies per run in the resolved schedule
    /// (inside CUDA graphs included), or `None` before the first run.
    pub fn device_ops(&self) -> Option<usize> {
        self.exec.as_ref().map(|steps| {
            steps
                .iter()
                .map(|s| match s {
                    ExecStep::Launches(v) => v.len(),
                    ExecStep::Graph(g) => g.nodes,
                })
                .sum()
        })
    }

    /// Device address of a main-graph node's data.
    fn addr(&self, id: NodeId) -> Option<u64> {
        let id = home(&self.core.graph, id);
        let n = self.core.graph.node(id);
        if let Some(p) = self.core.mem.placements[id.index()] {
            return Some(self.arena.ptr + p.offset as u64);
        }
        match &n.op {
            Op::Param { name } => self.dev_params.get(name).map(|b| b.ptr),
            Op::Constant { .. } => self.consts.get(&id).map(|b| b.ptr),
            _ => None,
        }
    }

    /// Copy the staged inputs into their arena slots (one copy over the
    /// span of the input slots), on the stream.
    fn upload_inputs(&self) -> Result<(), CudaError> {
        let (lo, hi) = self.in_span;
        if hi == lo {
            return Ok(());
        }
        let src = &self.in_stage.as_slice()[..hi - lo];
        // SAFETY: the arena holds at least `hi` bytes; `src` is pinned memory
        // that is rewritten only between runs, after the stream synchronized.
        unsafe {
            drv::memcpy_htod_async(self.arena.ptr + lo as u64, src, self.gpu.stream.cu_stream())
        }
        .map_err(|e| CudaError::driver("input upload", e))
    }

    /// The copies that bring a run's results to `out_stage`: (stage offset,
    /// device address, bytes) for each arena output, then the status word
    /// into the stage's reserved tail.
    fn downloads(&self) -> Vec<(usize, u64, usize)> {
        let mut v: Vec<(usize, u64, usize)> = self
            .core
            .graph
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(i, &o)| Some((self.out_offsets[i]?, self.addr(o)?, self.out_bytes(o))))
            .filter(|d| d.2 > 0)
            .collect();
        v.push((self.out_stage.as_slice().len() - 64, self.status.ptr, 4));
        v
    }

    /// Issue `downloads` on the stream.
    fn download_outputs(&self, downloads: &[(usize, u64, usize)]) -> Result<(), CudaError> {
        let stream = self.gpu.stream.cu_stream();
        let stage = self.out_stage.host_ptr();
        for &(at, src, bytes) in downloads {
            // SAFETY: `stage + at .. + bytes` lies in the pinned staging buffer
            // (offsets planned at compile time, the status in its reserved
            // tail), which the host reads only after the stream synchronized;
            // the source is the output's arena slot (or, for a CacheWrite, the
            // cache param's device buffer) or the status word, `bytes` long.
            unsafe {
                drv_sys::cuMemcpyDtoHAsync_v2(
                    stage.add(at) as *mut std::ffi::c_void,
                    src,
                    bytes,
                    stream,
                )
                .result()
            }
            .map_err(|e| CudaError::driver("output download", e))?;
        }
        Ok(())
    }

    /// Bytes of output node `o`'s value.
    fn out_bytes(&self, o: NodeId) -> usize {
        self.core.mem.placements[o.index()]
            .map(|p| p.bytes)
            .unwrap_or_else(|| self.core.graph.node(o).shape.size_bytes())
    }

    /// The shape of param `name`, or `UnknownParam`.
    fn param_shape(&self, name: &str) -> Result<&Shape, RuntimeError> {
        self.param_shapes
            .get(name)
            .ok_or_else(|| RuntimeError::UnknownParam { name: name.into() })
    }

    /// Make the params `names` of this model use `from`'s device memory:
    /// weights are then uploaded once for both models, and a cache that one
    /// model's `CacheWrite` updates is what the other reads (e.g. a prefill
    /// and a decode model over one KV cache). Each param must have the same
    /// shape in both models and a value in `from`; `from`'s value is uploaded
    /// first if it is not on the device yet. Both models must use the same
    /// device. Runs are ordered because every run ends by synchronizing its
    /// stream. This model's host copy becomes `from`'s (shared, not copied).
    pub fn share_params(
        &mut self,
        from: &mut CudaModel,
        names: &[String],
    ) -> Result<(), RuntimeError> {
        if !Arc::ptr_eq(&self.gpu.ctx, &from.gpu.ctx) {
            return Err(unsupported(
                "share_params: the models are on different devices".into(),
            ));
        }
        from.gpu.bind().map_err(rt)?;
        for name in names {
            let shape = self
                .param_shapes
                .get(name)
                .ok_or_else(|| RuntimeError::UnknownParam { name: name.clone() })?;
            let theirs = from
                .param_shapes
                .get(name)
                .ok_or_else(|| RuntimeError::UnknownParam { name: name.clone() })?;
            if shape != theirs {
                return Err(unsupported(format!(
                    "share_params: param '{name}' is {shape} here and {theirs} in the other model"
                )));
            }
            let (mine, other) = (self.core.param_store(name), from.core.param_store(name));
            if mine != other {
                return Err(unsupported(format!(
                    "share_params: param '{name}' is stored as {mine:?} here and {other:?} in the other model"
                )));
            }
            if !from.params.contains_key(name) {
                if let Some(b) = from.dev_params.get(name) {
                    // Bound by `set_param_buffer` there: device-only here too.
                    self.params.remove(name);
                    self.stale.remove(name);
                    self.dev_params.insert(name.clone(), b.clone());
                    continue;
                }
            }
            let host =
                from.params
                    .get(name)
                    .cloned()
                    .ok_or_else(|| RuntimeError::MissingParam {
                        name: name.clone(),
                        shape: shape.clone(),
                    })?;
            let fresh = from.stale.remove(name);
            let buf = match from.dev_params.get(name) {
                Some(b) if !fresh => b.clone(),
                _ => {
                    let bytes =
                        device_bytes(&host, from.core.param_store(name)).map_err(unsupported)?;
                    let b = match from.dev_params.get(name) {
                        Some(b) if b.bytes == bytes.len() => b.clone(),
                        _ => {
                            from.exec = None;
                            Arc::new(DeviceBuffer::new(&from.gpu.ctx, bytes.len()).map_err(rt)?)
                        }
                    };
                    b.upload(&bytes).map_err(rt)?;
                    from.dev_params.insert(name.clone(), b.clone());
                    b
                }
            };
            self.params.insert(name.clone(), host);
            self.stale.remove(name);
            self.dev_params.insert(name.clone(), buf);
        }
        self.prep_dirty = self.prep.is_some();
        self.exec = None;
        Ok(())
    }

    /// Fail unless `p` can be bound to param `name` of this model by
    /// [`set_param_buffer`](Self::set_param_buffer): `name` is a param of
    /// the graph that runs on the device (not only of the host-side prep
    /// graph), and `p` has its shape and device storage and lives on this
    /// model's device. The error names the param.
    pub fn check_param_buffer(&self, name: &str, p: &DeviceParam) -> Result<(), RuntimeError> {
        let shape = self.param_shape(name)?;
        if !self.core.param_ids.contains_key(name)
            || self
                .prep
                .as_ref()
                .is_some_and(|p| p.params.iter().any(|n| n == name))
        {
            return Err(unsupported(format!(
                "set_param_buffer: param '{name}' is read by the host-side prep graph; bind it with set_param_tensor"
            )));
        }
        if &p.shape != shape {
            return Err(unsupported(format!(
                "set_param_buffer: param '{name}' is {shape}, the buffer holds {}",
                p.shape
            )));
        }
        let store = self.core.param_store(name);
        if p.store != store {
            return Err(unsupported(format!(
                "set_param_buffer: param '{name}' is stored as {store:?} here, the buffer as {:?}",
                p.store
            )));
        }
        if !Arc::ptr_eq(p.buf.ctx(), &self.gpu.ctx) {
            return Err(unsupported(format!(
                "set_param_buffer: the buffer for param '{name}' is on another device"
            )));
        }
        Ok(())
    }

    /// Bind param `name` to the device buffer `p` (moved in, no copy): the
    /// model reads it, and a `CacheWrite` updates it in place, until it is
    /// taken out again ([`take_param_buffer`](Self::take_param_buffer)) or
    /// replaced. Checked as [`check_param_buffer`](Self::check_param_buffer)
    /// says (on an error `p` is dropped). The resolved schedule, captured
    /// CUDA graphs included, is kept when the buffer's address is the one
    /// it was resolved with (rebinding the same buffers every step costs
    /// nothing), and rebuilt on the next run otherwise.
    pub fn set_param_buffer(&mut self, name: &str, p: DeviceParam) -> Result<(), RuntimeError> {
        self.check_param_buffer(name, &p)?;
        self.params.remove(name);
        self.stale.remove(name);
        if self.exec_addrs.get(name) != Some(&p.buf.ptr) {
            self.exec = None;
        }
        self.dev_params.insert(name.to_string(), p.buf);
        Ok(())
    }

    /// Move param `name`'s device buffer out of the model (no copy) as a
    /// handle for [`set_param_buffer`](Self::set_param_buffer) on this or
    /// another model of the same device; the model then has no value for
    /// `name` until one is set. A host value not uploaded yet is uploaded
    /// first. `Ok(None)` when `name` has no value; `UnknownParam` when it
    /// is not a param. The buffer keeps what `CacheWrite`s wrote into it.
    pub fn take_param_buffer(&mut self, name: &str) -> Result<Option<DeviceParam>, RuntimeError> {
        let shape = self.param_shape(name)?.clone();
        let store = self.core.param_store(name);
        let buf = match (self.params.get(name), self.dev_params.get(name)) {
            (None, None) => return Ok(None),
            (None, Some(b)) => b.clone(),
            (Some(_), Some(b)) if !self.stale.contains(name) => b.clone(),
            (Some(host), have) => {
                let bytes = device_bytes(host, store)
                    .map_err(|e| unsupported(format!("param '{name}': {e}")))?;
                let b = match have {
                    Some(b) if b.bytes == bytes.len() => b.clone(),
                    _ => Arc::new(DeviceBuffer::new(&self.gpu.ctx, bytes.len()).map_err(rt)?),
                };
                b.upload(&bytes).map_err(rt)?;
                b
            }
        };
        self.params.remove(name);
        self.stale.remove(name);
        self.dev_params.remove(name);
        self.prep_dirty |= self
            .prep
            .as_ref()
            .is_some_and(|p| p.params.iter().any(|n| n == name));
        Ok(Some(DeviceParam { buf, shape, store }))
    }

    /// A zeroed device buffer of param `name`'s shape and storage on this
    /// model's device, for [`set_param_buffer`](Self::set_param_buffer)
    /// (e.g. a fresh KV cache). `UnknownParam` when `name` is not a param.
    pub fn new_param_buffer(&self, name: &str) -> Result<DeviceParam, RuntimeError> {
        let shape = self.param_shape(name)?.clone();
        let store = self.core.param_store(name);
        let bytes = if shape.dtype == rlx_ir::DType::F32 {
            shape.numel() * store.dt.size()
        } else {
            shape.size_bytes()
        };
        let buf = DeviceBuffer::zeroed(&self.gpu.ctx, bytes).map_err(rt)?;
        Ok(DeviceParam {
            buf: Arc::new(buf),
            shape,
            store,
        })
    }

    /// Whether the resolved schedule (and, in hybrid mode, its captured
    /// CUDA graphs) is ready for the next run: `false` before the first run
    /// and after a param's device address changed.
    pub fn is_resolved(&self) -> bool {
        self.exec.is_some()
    }

    /// Resolve every step's launches (and capture graphs for compiled steps).
    fn build_exec(&mut self) -> Result<(), RuntimeError> {
        let graph = &self.core.graph;
        let mut meta: Vec<i32> = Vec::new();
        let mut raw: Vec<(bool, Vec<(NodeId, Launch)>)> = Vec::new();
        for (si, step) in self.core.steps.iter().enumerate() {
            match step {
                Step::Thunks { start, end } => {
                    let mut v = Vec::new();
                    for node in &graph.nodes()[*start..*end] {
                        if node.op.is_leaf() {
                            continue;
                        }
                        let env = WithStore(|id| self.addr(id), |id| self.core.store.get(id));
                        let ls = lower(graph, node, &env, &mut meta)
                            .map_err(|e| kernel_err(graph, node.id, e))?;
                        v.extend(ls.into_iter().map(|l| (node.id, l)));
                    }
                    raw.push((false, v));
                }
                Step::Compiled { sub, lowered, .. } => {
                    let g = &sub.graph;
                    let outs: HashMap<NodeId, NodeId> = g
                        .outputs
                        .iter()
                        .zip(&sub.outputs)
                        .map(|(&s, &p)| (s, p))
                        .collect();
                    let n_leaves = sub.inputs.len();
                    let sub_addr = |id: NodeId| -> Option<u64> {
                        let id = home(g, id);
                        if let Some(&p) = outs.get(&id) {
                            return self.addr(p);
                        }
                        if id.index() < n_leaves {
                            return self.addr(sub.inputs[id.index()]);
                        }
                        let pl = lowered.mem.placements[id.index()]?;
                        let r = pl.root;
                        if r.index() < n_leaves || outs.contains_key(&r) {
                            let rp = lowered.mem.placements[r.index()]?;
                            let base = if let Some(&p) = outs.get(&r) {
                                self.addr(p)?
                            } else {
                                self.addr(sub.inputs[r.index()])?
                            };
                            return Some(base + (pl.offset - rp.offset) as u64);
                        }
                        Some(self.scratch.ptr + pl.offset as u64)
                    };
                    let mut v = Vec::new();
                    for node in g.nodes() {
                        if node.op.is_leaf() {
                            continue;
                        }
                        let parent = sub.parent_of[node.id.index()];
                        let chains = &self.core.chains[si];
                        let env = Env(
                            &sub_addr,
                            |id: NodeId| self.core.store.get(sub.parent_of[id.index()]),
                            |id: NodeId| chains.get(&id).cloned().unwrap_or_default(),
                            |id: NodeId| sub.parent_of[id.index()],
                        );
                        let ls = lower(g, node, &env, &mut meta)
                            .map_err(|e| kernel_err(graph, parent, e))?;
                        v.extend(ls.into_iter().map(|l| (parent, l)));
                    }
                    raw.push((true, v));
                }
            }
        }
        let meta_buf = DeviceBuffer::new(&self.gpu.ctx, meta.len() * 4).map_err(rt)?;
        meta_buf.upload(bytemuck::cast_slice(&meta)).map_err(rt)?;
        let mut steps = Vec::new();
        let n_steps = raw.len();
        self.copies_in_graph = (false, false);
        for (i, (compiled, launches)) in raw.into_iter().enumerate() {
            let mut ready: Vec<Ready> = Vec::with_capacity(launches.len());
            for (node, l) in launches {
                self.resolve(node, l, meta_buf.ptr, &mut ready)?;
            }
            if compiled {
                self.gpu.sync().map_err(rt)?;
                let gpu = &self.gpu;
                let count = ready.len();
                let (first, last) = (i == 0, i + 1 == n_steps);
                let downloads = self.downloads();
                let g = CuGraph::capture(gpu, count, || {
                    if first {
                        self.upload_inputs()?;
                    }
                    for r in &ready {
                        r.issue(gpu).map_err(|e| e.at_node(r.node))?;
                    }
                    if last {
                        self.download_outputs(&downloads)?;
                    }
                    Ok(())
                })
                .map_err(rt)?;
                self.copies_in_graph.0 |= first;
                self.copies_in_graph.1 |= last;
                steps.push(ExecStep::Graph(g));
            } else {
                steps.push(ExecStep::Launches(ready));
            }
        }
        self.meta = Some(meta_buf);
        self.exec = Some(steps);
        self.exec_addrs = self
            .dev_params
            .iter()
            .map(|(n, b)| (n.clone(), b.ptr))
            .collect();
        Ok(())
    }

    /// Resolve one launch into `out`: kernel arguments to bytes, a gemm to a
    /// planned cuBLASLt matmul (or, where cuBLASLt declines it, a
    /// `cublasGemmEx` call followed by its epilogue kernel).
    fn resolve(
        &self,
        node: NodeId,
        l: Launch,
        meta: u64,
        out: &mut Vec<Ready>,
    ) -> Result<(), RuntimeError> {
        let graph = &self.core.graph;
        let work = match l {
            Launch::Kernel {
                name,
                grid,
                block,
                smem,
                args,
            } => Work::Kernel {
                name,
                f: self.gpu.func(name).map_err(rt)?,
                grid,
                block,
                smem,
                args: args
                    .iter()
                    .map(|a| match *a {
                        Arg::P(p) => p,
                        Arg::I(i) => i as u32 as u64,
                        Arg::L(l) => l as u64,
                        Arg::F(f) => f.to_bits() as u64,
                        Arg::Meta(at) => meta + 4 * at as u64,
                        Arg::Status => self.status.ptr,
                    })
                    .collect(),
            },
            Launch::Gemm(mut g) => {
                g.tf32 = self.core.store.precision == Precision::Tf32;
                match crate::lt::LtMatmul::plan(&self.gpu, &g)
                    .map_err(|e| node_err(graph, node, e))?
                {
                    Some(m) => Work::Lt(Box::new(m)),
                    None => {
                        out.push(Ready {
                            work: Work::Gemm(g),
                            node,
                        });
                        if let Some(e) = epilogue_launch(&g) {
                            self.resolve(node, e, meta, out)?;
                        }
                        return Ok(());
                    }
                }
            }
            Launch::Dyn {
                name,
                source,
                grid,
                block,
                args,
            } => {
                let f = crate::device::dynamic_function(&self.gpu, &name, &source)
                    .map_err(|e| node_err(graph, node, e))?;
                Work::Kernel {
                    name: "fused-chain",
                    f,
                    grid,
                    block,
                    smem: 0,
                    args: args
                        .iter()
                        .map(|a| match *a {
                            Arg::P(p) => p,
                            Arg::I(i) => i as u32 as u64,
                            Arg::L(l) => l as u64,
                            Arg::F(f) => f.to_bits() as u64,
                            Arg::Meta(at) => meta + 4 * at as u64,
                            Arg::Status => self.status.ptr,
                        })
                        .collect(),
                }
            }
            Launch::Copy { dst, src, bytes } => Work::Copy { dst, src, bytes },
            Launch::Zero { dst, bytes } => Work::Zero { dst, bytes },
        };
        out.push(Ready { work, node });
        Ok(())
    }

    /// Run the prep graph if params changed, and upload stale params.
    fn sync_params(&mut self) -> Result<(), RuntimeError> {
        if self.prep_dirty {
            if let Some(prep) = &mut self.prep {
                for name in &prep.params {
                    if let Some(t) = self.params.get(name) {
                        prep.model.set_param_tensor(name, t.clone())?;
                    }
                }
                let outs = prep.model.run(&[])?;
                for (name, t) in prep.names.iter().zip(outs) {
                    self.params.insert(name.clone(), t);
                    self.stale.insert(name.clone());
                }
            }
            self.prep_dirty = false;
        }
        let used: HashSet<&str> = self
            .core
            .graph
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Param { name } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        let stale: Vec<String> = self.stale.drain().collect();
        for name in stale {
            if !used.contains(name.as_str()) {
                continue;
            }
            let Some(t) = self.params.get(&name) else {
                continue;
            };
            // Converted to the storage plan: transposed matmul weights, 16-bit
            // in a half precision.
            let bytes = device_bytes(t, self.core.param_store(&name))
                .map_err(|e| unsupported(format!("param '{name}': {e}")))?;
            match self.dev_params.get(&name) {
                Some(b) if b.bytes == bytes.len() => b.upload(&bytes).map_err(rt)?,
                _ => {
                    let b = DeviceBuffer::new(&self.gpu.ctx, bytes.len()).map_err(rt)?;
                    b.upload(&bytes).map_err(rt)?;
                    self.dev_params.insert(name.clone(), Arc::new(b));
                    self.exec = None;
                }
            }
        }
        Ok(())
    }

    fn run_inner(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<Tensor>, RuntimeError> {
        let bound = bind_inputs(&self.inputs, inputs)?;
        check_params_set(&self.param_shapes, |n| {
            self.params.contains_key(n) || self.dev_params.contains_key(n)
        })?;
        self.gpu.bind().map_err(rt)?;
        self.sync_params()?;
        if self.exec.is_none() {
            self.build_exec()?;
        }
        // Bind inputs: host -> pinned staging (laid out as the arena's input
        // slots) -> arena, one copy (the first node of the first CUDA graph
        // when the schedule starts with a compiled segment).
        {
            let stage = self.in_stage.as_mut_slice();
            for (pos, data) in bound.iter().enumerate() {
                let Some(at) = self.in_offsets[pos] else {
                    continue;
                };
                let b = data.as_bytes();
                stage[at..at + b.len()].copy_from_slice(b);
            }
        }
        if !self.copies_in_graph.0 {
            self.upload_inputs().map_err(rt)?;
        }
        let graph = &self.core.graph;
        for step in self.exec.as_ref().expect("built above") {
            match step {
                ExecStep::Launches(v) => {
                    for r in v {
                        let t = self.profile.as_ref().map(|_| {
                            let _ = self.gpu.sync();
                            std::time::Instant::now()
                        });
                        r.issue(&self.gpu).map_err(|e| node_err(graph, r.node, e))?;
                        if let (Some(t), Some(p)) = (t, self.profile.as_mut()) {
                            self.gpu.sync().map_err(rt)?;
                            let key = format!("{} {}", graph.node(r.node).op.name(), r.work.kind());
                            let e = p.entry(key).or_default();
                            e.0 += t.elapsed().as_secs_f64() * 1e3;
                            e.1 += 1;
                        }
                    }
                }
                ExecStep::Graph(g) => g.launch(&self.gpu).map_err(rt)?,
            }
        }
        let out_ids = graph.outputs.clone();
        let status_at = self.out_stage.as_slice().len() - 64;
        if !self.copies_in_graph.1 {
            let downloads = self.downloads();
            self.download_outputs(&downloads).map_err(rt)?;
        }
        self.gpu.sync().map_err(rt)?;
        let stage = self.out_stage.as_slice();
        let code = i32::from_le_bytes(stage[status_at..status_at + 4].try_into().expect("4 bytes"));
        if code != 0 {
            self.status.upload(&[0u8; 4]).map_err(rt)?;
            // Negative codes come from CacheWrite, positive ones from Gather.
            let (node, message) = if code < 0 {
                (
                    NodeId((-code - 1) as u32),
                    "the write position plus the new rows does not fit the cache (nothing was written)",
                )
            } else {
                (
                    NodeId((code - 1) as u32),
                    "an index is out of range of the table (the output row was zeroed)",
                )
            };
            return Err(kernel_err(graph, node, message.into()));
        }
        out_ids
            .iter()
            .enumerate()
            .map(|(i, &o)| {
                let shape = &graph.node(o).shape;
                match (self.core.mem.placements[o.index()], self.out_offsets[i]) {
                    (Some(p), Some(at)) => Ok(tensor_from_bytes(shape, &stage[at..at + p.bytes])),
                    (None, Some(at)) => Ok(tensor_from_bytes(
                        shape,
                        &stage[at..at + shape.size_bytes()],
                    )),
                    _ => match &graph.node(o).op {
                        Op::Param { name } => self.params.get(name).cloned().ok_or_else(|| {
                            RuntimeError::MissingParam {
                                name: name.clone(),
                                shape: shape.clone(),
                            }
                        }),
                        Op::Constant { value } => Ok(value.clone()),
                        _ => Err(kernel_err(graph, o, "output has no home".into())),
                    },
                }
            })
            .collect()
    }
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let mut v: Vec<_> = p.iter().collect();
            v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
            let total: f64 = v.iter().map(|e| e.1 .0).sum();
            eprintln!("rlx-cuda profile (synchronized per launch, all runs): total {total:.3} ms");
            for (k, (ms, n)) in v {
                eprintln!(
                    "{k:<40} {n:>6} {ms:>10.3} ms {:>5.1}%",
                    100.0 * ms / total.max(1e-9)
                );
            }
        }
    }
}

impl Executable for CudaModel {
    fn set_param(&mut self, name: &str, value: TensorRef<'_>) -> Result<(), RuntimeError> {
        let t = value.to_tensor(param_shape(&self.param_shapes, name, &value)?);
        self.detach_device_only(name);
        self.params.insert(name.to_string(), t);
        self.stale.insert(name.to_string());
        self.prep_dirty = self.prep.is_some();
        Ok(())
    }

    fn set_param_tensor(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError> {
        param_tensor_shape(&self.param_shapes, name, &value)?;
        self.detach_device_only(name);
        self.params.insert(name.to_string(), value);
        self.stale.insert(name.to_string());
        self.prep_dirty = self.prep.is_some();
        Ok(())
    }

    fn take_param(&mut self, name: &str) -> Option<Tensor> {
        self.prep_dirty = self.prep.is_some();
        let dev = self.dev_params.remove(name);
        self.exec = None;
        let Some(host) = self.params.remove(name) else {
            // Bound by `set_param_buffer`: read the device buffer back
            // (plain f32 / native storage only).
            let b = dev?;
            let shape = self.param_shapes.get(name)?.clone();
            let store = self.core.param_store(name);
            if store.transposed || store.dt != crate::store::Dt::F32 {
                return None;
            }
            let mut bytes = vec![0u8; shape.size_bytes()];
            b.download(&mut bytes).ok()?;
            return Some(tensor_from_bytes(&shape, &bytes));
        };
        // A cache that CacheWrite updated on the device is handed back with
        // its device contents (None if they cannot be read).
        let written = self.core.graph.nodes().iter().any(|n| {
            is_cache_write(n)
                && matches!(&self.core.graph.node(n.inputs[0]).op, Op::Param { name: p } if p == name)
        });
        match dev {
            Some(b) if written => {
                let mut bytes = vec![0u8; b.bytes];
                b.download(&mut bytes).ok()?;
                Some(tensor_from_bytes(&host.shape, &bytes))
            }
            _ => Some(host),
        }
    }

    fn run(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_inner(inputs)
    }

    fn report(&self) -> &PlanReport {
        &self.core.report
    }

    fn memory(&self) -> MemoryStats {
        MemoryStats {
            arena_bytes: self.core.mem.arena_bytes,
            naive_bytes: self.core.mem.naive_bytes,
            scratch_bytes: self.core.scratch_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{MaskKind, Op, Shape};

    /// The segment compiler says which node it cannot take and why (no
    /// device needed: capability is checked with dummy addresses).
    #[test]
    fn declines_name_the_node_and_the_reason() {
        let mut g = Graph::new("decline");
        let q = g.input("q", Shape::f32(&[1, 2, 512]));
        let op = Op::Attention {
            num_heads: 1,
            head_dim: 512,
            mask_kind: MaskKind::None,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let a = g.push(op, vec![q, q, q]).unwrap();
        let d = CudaSegmentCompiler.claims(&g, g.node(a)).unwrap_err();
        assert_eq!(d.node, Some(a));
        assert!(d.reason.contains("head_dim 512"), "{d}");
        assert_eq!(d.to_string(), d.reason);
        assert_eq!(CudaSegmentCompiler.claims(&g, g.node(q)), Ok(()));
    }
}
