//! The CPU executor: binds inputs into the arena, walks the plan's steps,
//! dispatches thunks and compiled segments, and reads the outputs back.

use crate::arena::{region, region_mut, split_io, Region};
use crate::fused::{FusedCompiler, FusedPlan, Scratch};
use crate::kernels::packed_gemm::PackedB;
use crate::kernels::quant_panels::{panels_wanted, QuantPanels};
use crate::kernels::team::{self, Team};
use crate::kernels::{self, In};
use rlx_ir::{Graph, Node, NodeId, Op, Tensor, TensorData};
use rlx_runtime::bind::{
    bind_inputs, check_params_set, outputs_subgraph, param_shape, param_tensor_shape, split_static,
    tensor_from_bytes, StaticSplit,
};
use rlx_runtime::hybrid::{build_plan, HybridPlan, PlanReport, SplitPolicy, Step};
use rlx_runtime::memory::{plan_memory, MemoryPlan};
use rlx_runtime::{Executable, MemoryStats, RuntimeError, TensorRef, Thunk, ThunkSchedule};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Packed copies of weight params, by the Param node they came from.
#[derive(Default)]
struct PackedParams {
    /// f32 matmul right-hand sides, for [`kernels::packed_gemm`].
    gemm: HashMap<NodeId, Arc<PackedB>>,
    /// Quantized weights of `DequantMatMul`s in 16-row panels
    /// ([`kernels::quant_panels`]), on CPUs with AVX512-VNNI.
    panels: HashMap<NodeId, Arc<QuantPanels>>,
    /// Products in bf16 ([`CpuOptions::bf16`]): the `gemm` packings are
    /// bf16 pairs, and attention multiplies in bf16 too.
    bf16: bool,
}

/// How to compile a graph for the CPU.
#[derive(Debug, Clone, Default)]
pub struct CpuOptions {
    /// Split into compiled segments and thunk ranges (else thunks only).
    pub hybrid: bool,
    /// Which ops may enter compiled segments.
    pub policy: SplitPolicy,
    /// Worker threads; `None` uses rayon's global pool. Models asking for
    /// the same count share one pool per process (see `shared_pool`)
    /// while any of them lives, so compiling many models never multiplies
    /// the threads.
    pub threads: Option<usize>,
    /// Fill every tensor with NaN bytes once its last reader has run. A test
    /// aid: a plan that frees memory too early then shows up as NaN.
    pub poison_freed: bool,
    /// Store the packed copies of matmul weights (2-D f32 params) as IEEE
    /// f16: half the weight bytes streamed per run, products still
    /// accumulated in f32. Off by default: weights are rounded to 11
    /// significant bits (MiniLM embeddings move by ~1e-4).
    pub f16_weights: bool,
    /// Multiply with matmul weights in bf16: the packed weights and, per
    /// call, the activations they multiply are rounded to bf16, products
    /// accumulate in f32 (`vdpbf16ps` on CPUs with AVX512-BF16, AMX tiles
    /// where present, a portable kernel adding in the same order
    /// elsewhere). Attention over 16 or more query rows multiplies in bf16
    /// too (its softmax stays f32). Half the weight bytes, 8 significant
    /// bits per operand (MiniLM embeddings keep a cosine >= 0.9999 to
    /// PyTorch's). Faster than f32 where bf16 products issue at twice the
    /// f32 FMA rate (Zen 4's `vdpbf16ps`, AMX): MiniLM 32x128 at 0.6x the
    /// f32 time on a 2-vCPU Zen 4; on Intel cores without AMX `vdpbf16ps`
    /// runs at the f32 rate, and the portable kernel is ~2.5x slower than
    /// f32 (Zen 3). Takes precedence over `f16_weights`. Off by default.
    pub bf16: bool,
    /// After every step, check each f32 tensor it wrote for NaN and
    /// infinities, and fail the run with [`RuntimeError::NonFinite`] naming
    /// the first node (id, op, shape) that produced one. A thunk reports its
    /// own node; a compiled segment reports the first boundary output found
    /// non-finite (its internal tensors live in scratch and are not
    /// checked). Costs one pass over every written tensor. Also switched on
    /// by the environment variable [`CHECK_FINITE_ENV`]`=1`.
    pub check_finite: bool,
}

/// Environment variable that turns on [`CpuOptions::check_finite`] for every
/// compiled model (`1`, `true` or `yes`).
pub const CHECK_FINITE_ENV: &str = "RLX_CHECK_FINITE";

/// Whether [`CHECK_FINITE_ENV`] asks for finite checks.
pub fn check_finite_from_env() -> bool {
    std::env::var(CHECK_FINITE_ENV)
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// Time spent in one dispatch of a profiled run.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileEntry {
    /// The node (thunk) or `segment %a..=%b` (compiled step).
    pub label: String,
    /// Op name, or `CompiledSegment`.
    pub op: &'static str,
    /// Wall time in nanoseconds.
    pub nanos: u64,
    /// Floating-point work (see `rlx_ir::cost`).
    pub flops: u64,
    /// Bytes read and written at the step boundary.
    pub bytes: u64,
}

/// One planned graph with its arena.
struct Core {
    graph: Graph,
    /// Arena region of every node (from the memory plan), by node index.
    regions: Vec<Option<Region>>,
    schedule: ThunkSchedule,
    steps: Vec<Step<FusedPlan>>,
    report: PlanReport,
    mem: MemoryPlan,
    /// Allocated on the first run (empty until then), so compiling to
    /// inspect a plan never touches the arena's memory.
    arena: Vec<u64>,
    /// The most scratch one compiled segment needs (segments share one
    /// [`Scratch`], one at a time).
    scratch_bytes: usize,
    /// Collects per-dispatch timings while `Some`.
    profile: Option<Vec<ProfileEntry>>,
}

/// Whether the CPU runs `node` as an alias of its first input, and at which byte offset.
fn cpu_view(graph: &Graph, node: &Node) -> Option<(NodeId, usize)> {
    let src = *node.inputs.first()?;
    let s = &graph.node(src).shape;
    match &node.op {
        Op::Reshape { .. } => Some((src, 0)),
        Op::Cast { to } if *to == s.dtype => Some((src, 0)),
        Op::Expand { shape } if *shape == s.dims => Some((src, 0)),
        Op::Narrow { axis, start, .. } if s.dims[..*axis].iter().all(|&d| d == 1) => {
            Some((src, start * s.strides()[*axis] * s.dtype.size_bytes()))
        }
        _ => None,
    }
}

impl Core {
    fn new(graph: Graph, opts: &CpuOptions) -> Result<Core, RuntimeError> {
        let plan = if opts.hybrid {
            build_plan(&graph, &opts.policy, &FusedCompiler)
        } else {
            HybridPlan::thunks_only(&graph)
        };
        let ticks = plan.ticks(&graph);
        let mem = plan_memory(
            &graph,
            &ticks,
            |n| cpu_view(&graph, n),
            |n| matches!(n.op, Op::CacheWrite { .. }),
        );
        // Segments run one after another and take their scratch from one
        // process-wide pool: the largest segment's need is what a run uses.
        let scratch_bytes = plan
            .steps
            .iter()
            .map(|s| match s {
                Step::Compiled { lowered, .. } => lowered.scratch_bytes(),
                Step::Thunks { .. } => 0,
            })
            .max()
            .unwrap_or(0);
        let what = format!("the arena and segment scratch of graph '{}'", graph.name);
        rlx_runtime::limits::check_memory(&what, mem.arena_bytes as u128 + scratch_bytes as u128)?;
        let regions = graph
            .nodes()
            .iter()
            .map(|n| {
                mem.placements[n.id.index()].map(|p| Region {
                    offset: p.offset,
                    bytes: p.bytes,
                    dtype: n.shape.dtype,
                })
            })
            .collect();
        Ok(Core {
            regions,
            arena: Vec::new(),
            schedule: ThunkSchedule::new(&graph),
            graph,
            steps: plan.steps,
            report: plan.report,
            mem,
            scratch_bytes,
            profile: None,
        })
    }

    fn region(&self, id: NodeId) -> Option<Region> {
        self.regions[id.index()]
    }

    /// Allocate the arena if this is the first run (fallibly: an arena the
    /// allocator refuses is an error, not an abort).
    fn ensure_arena(&mut self) -> Result<(), RuntimeError> {
        let words = self.mem.arena_bytes.div_ceil(8);
        if self.arena.len() != words {
            let mut a: Vec<u64> = Vec::new();
            a.try_reserve_exact(words)
                .map_err(|_| RuntimeError::MemoryLimit {
                    what: format!(
                        "the arena of graph '{}' (allocation refused)",
                        self.graph.name
                    ),
                    bytes: self.mem.arena_bytes as u128,
                    limit: rlx_runtime::limits::memory_limit()
                        .ok()
                        .flatten()
                        .unwrap_or(0),
                })?;
            a.resize(words, 0);
            self.arena = a;
        }
        Ok(())
    }

    fn execute(
        &mut self,
        inputs: &HashMap<NodeId, TensorRef<'_>>,
        params: &mut HashMap<String, Tensor>,
        packed: &PackedParams,
        poison: bool,
        check_finite: bool,
        scratch: &Scratch,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        self.ensure_arena()?;
        for (&id, data) in inputs {
            if let Some(r) = self.region(id) {
                let dst =
                    region_mut(&mut self.arena, r).ok_or_else(|| internal(id, "input slot"))?;
                dst.copy_from_slice(data.as_bytes());
            }
        }
        let Core {
            graph,
            regions,
            schedule,
            steps,
            mem,
            arena,
            profile,
            ..
        } = self;
        let shapes_of = |n: &Node| -> Vec<&rlx_ir::Shape> {
            n.inputs.iter().map(|&i| &graph.node(i).shape).collect()
        };
        let regions = &regions[..];
        let mut tick = 0usize;
        for step in steps.iter_mut() {
            match step {
                Step::Thunks { start, end } => {
                    for thunk in &schedule.thunks[*start..*end] {
                        let Thunk::Op(id) = *thunk else { continue };
                        let node = graph.node(id);
                        tick += 1;
                        if matches!(node.op, Op::CacheWrite { .. }) {
                            cache_write(graph, node, regions, arena, params)?;
                            continue;
                        }
                        let p = mem.placements[node.id.index()]
                            .ok_or_else(|| internal(node.id, "no arena slot"))?;
                        if p.root == node.id {
                            let t0 = std::time::Instant::now();
                            run_thunk(graph, node, regions, arena, params, packed)?;
                            if check_finite {
                                check_node_finite(graph, node.id, regions, arena, "")?;
                            }
                            if let Some(prof) = profile.as_mut() {
                                let ins = shapes_of(node);
                                prof.push(ProfileEntry {
                                    label: node.id.to_string(),
                                    op: node.op.name(),
                                    nanos: t0.elapsed().as_nanos() as u64,
                                    flops: rlx_ir::cost::flops(&node.op, &ins, &node.shape),
                                    bytes: rlx_ir::cost::bytes(&ins, &node.shape),
                                });
                            }
                        }
                        if poison {
                            poison_tick(mem, regions, arena, tick);
                        }
                    }
                }
                Step::Compiled {
                    segment, lowered, ..
                } => {
                    tick += 1;
                    let outs: Vec<Region> = segment
                        .boundary_outputs
                        .iter()
                        .map(|&o| {
                            regions[o.index()].ok_or_else(|| internal(o, "segment output slot"))
                        })
                        .collect::<Result<_, _>>()?;
                    let (srcs, arena_ins) = sources(graph, &segment.boundary_inputs, regions);
                    let (outs, ins) = split_io(arena, &outs, &arena_ins)
                        .ok_or_else(|| internal(segment.nodes[0], "segment regions overlap"))?;
                    let ins = resolve(graph, &srcs, ins, params)?;
                    let packs: Vec<Option<&PackedB>> = segment
                        .boundary_inputs
                        .iter()
                        .map(|id| packed.gemm.get(id).map(|p| &**p))
                        .collect();
                    let t0 = std::time::Instant::now();
                    lowered
                        .run(&ins, &packs, outs, scratch)
                        .map_err(|(node, message)| RuntimeError::Kernel {
                            node,
                            op: graph.node(node).op.name().to_string(),
                            message,
                        })?;
                    if check_finite {
                        let context = format!(
                            " (boundary output of compiled segment {}..={})",
                            segment.nodes[0],
                            segment.nodes[segment.nodes.len() - 1]
                        );
                        for &o in &segment.boundary_outputs {
                            check_node_finite(graph, o, regions, arena, &context)?;
                        }
                    }
                    if let Some(prof) = profile.as_mut() {
                        let flops = segment
                            .nodes
                            .iter()
                            .map(|&id| {
                                let n = graph.node(id);
                                rlx_ir::cost::flops(&n.op, &shapes_of(n), &n.shape)
                            })
                            .sum();
                        let bytes = segment
                            .boundary_inputs
                            .iter()
                            .chain(&segment.boundary_outputs)
                            .map(|&id| graph.node(id).shape.size_bytes() as u64)
                            .sum();
                        prof.push(ProfileEntry {
                            label: format!(
                                "segment {}..={} ({} ops)",
                                segment.nodes[0],
                                segment.nodes[segment.nodes.len() - 1],
                                segment.nodes.len()
                            ),
                            op: "CompiledSegment",
                            nanos: t0.elapsed().as_nanos() as u64,
                            flops,
                            bytes,
                        });
                    }
                    if poison {
                        poison_tick(mem, regions, arena, tick);
                    }
                }
            }
        }
        graph
            .outputs
            .iter()
            .map(|&o| match regions[o.index()] {
                Some(r) => {
                    let b = region(arena, r).ok_or_else(|| internal(o, "output slot"))?;
                    Ok(tensor_from_bytes(&graph.node(o).shape, b))
                }
                None => external(graph, graph.node(o), params)
                    .map(|i| tensor_from_in(&graph.node(o).shape, i)),
            })
            .collect()
    }
}

fn internal(node: NodeId, what: &str) -> RuntimeError {
    RuntimeError::Kernel {
        node,
        op: "executor".into(),
        message: format!("internal planner error: {what}"),
    }
}

/// [`RuntimeError::NonFinite`] if node `id`'s f32 region holds a NaN or an
/// infinity.
fn check_node_finite(
    graph: &Graph,
    id: NodeId,
    regions: &[Option<Region>],
    arena: &[u64],
    context: &str,
) -> Result<(), RuntimeError> {
    let Some(r) = regions[id.index()] else {
        return Ok(());
    };
    if r.dtype != rlx_ir::DType::F32 {
        return Ok(());
    }
    let bytes = region(arena, r).ok_or_else(|| internal(id, "finite check slot"))?;
    let found = match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(v) => first_non_finite(v.iter().copied()),
        Err(_) => first_non_finite(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
    };
    match found {
        None => Ok(()),
        Some((index, value)) => {
            let node = graph.node(id);
            Err(RuntimeError::NonFinite {
                node: id,
                op: node.op.describe(),
                shape: node.shape.clone(),
                index,
                value,
                context: context.to_string(),
            })
        }
    }
}

/// The first element that is NaN or infinite, with its index.
pub(crate) fn first_non_finite(v: impl Iterator<Item = f32>) -> Option<(usize, f32)> {
    v.enumerate().find(|(_, x)| !x.is_finite())
}

fn poison_tick(mem: &MemoryPlan, regions: &[Option<Region>], arena: &mut [u64], tick: usize) {
    for &id in &mem.frees[tick] {
        if let Some(b) = regions[id.index()].and_then(|r| region_mut(arena, r)) {
            b.fill(0xFF);
        }
    }
}

/// Where each input of a step comes from: the arena (index into the list of
/// arena regions) or an external buffer (param, constant).
enum Src {
    Arena(usize),
    External(NodeId),
}

fn sources(graph: &Graph, ids: &[NodeId], regions: &[Option<Region>]) -> (Vec<Src>, Vec<Region>) {
    let mut arena = Vec::new();
    let srcs = ids
        .iter()
        .map(|&i| match regions[i.index()] {
            Some(r)
                if !graph.node(i).op.is_leaf() || matches!(graph.node(i).op, Op::Input { .. }) =>
            {
                arena.push(r);
                Src::Arena(arena.len() - 1)
            }
            _ => Src::External(i),
        })
        .collect();
    (srcs, arena)
}

fn resolve<'a>(
    graph: &'a Graph,
    srcs: &[Src],
    arena_ins: Vec<In<'a>>,
    params: &'a HashMap<String, Tensor>,
) -> Result<Vec<In<'a>>, RuntimeError> {
    srcs.iter()
        .map(|s| match s {
            Src::Arena(i) => Ok(arena_ins[*i]),
            Src::External(id) => external(graph, graph.node(*id), params),
        })
        .collect()
}

fn external<'a>(
    graph: &'a Graph,
    node: &'a Node,
    params: &'a HashMap<String, Tensor>,
) -> Result<In<'a>, RuntimeError> {
    match &node.op {
        Op::CacheWrite { .. } => external(graph, graph.node(node.inputs[0]), params),
        Op::Param { name } => {
            params
                .get(name)
                .map(tensor_in)
                .ok_or_else(|| RuntimeError::MissingParam {
                    name: name.clone(),
                    shape: node.shape.clone(),
                })
        }
        Op::Constant { value } => Ok(tensor_in(value)),
        _ => Err(internal(node.id, "value has no home")),
    }
}

fn run_thunk(
    graph: &Graph,
    node: &Node,
    regions: &[Option<Region>],
    arena: &mut [u64],
    params: &HashMap<String, Tensor>,
    packed: &PackedParams,
) -> Result<(), RuntimeError> {
    let out = regions[node.id.index()].ok_or_else(|| internal(node.id, "thunk output slot"))?;
    let (srcs, arena_ins) = sources(graph, &node.inputs, regions);
    let (mut outs, ins) = split_io(arena, &[out], &arena_ins)
        .ok_or_else(|| internal(node.id, "thunk regions overlap"))?;
    let ins = resolve(graph, &srcs, ins, params)?;
    let shapes: Vec<&rlx_ir::Shape> = node.inputs.iter().map(|&i| &graph.node(i).shape).collect();
    let out = outs.pop().expect("one output region");
    let rhs = node.inputs.get(1);
    let result = match (&node.op, rhs) {
        (Op::MatMul | Op::FusedMatMulBiasAct { .. }, Some(id)) if packed.gemm.contains_key(id) => {
            let pb = &packed.gemm[id];
            kernels::run_matmul_packed(&node.op, &ins, &shapes, pb, out, &node.shape)
        }
        (Op::DequantMatMul { .. }, Some(id)) if packed.panels.contains_key(id) => {
            let panels = &packed.panels[id];
            kernels::run_dequant_panels(&node.op, &ins, &shapes, panels, out, &node.shape)
        }
        _ => kernels::run_op_with(&node.op, &ins, &shapes, out, &node.shape, packed.bf16),
    };
    result.map_err(|e| RuntimeError::Kernel {
        node: node.id,
        op: node.op.describe(),
        message: e.to_string(),
    })
}

/// Write the new rows into the cache param in place (see `Op::CacheWrite`).
fn cache_write(
    graph: &Graph,
    node: &Node,
    regions: &[Option<Region>],
    arena: &mut [u64],
    params: &mut HashMap<String, Tensor>,
) -> Result<(), RuntimeError> {
    let fail = |message: String| RuntimeError::Kernel {
        node: node.id,
        op: "CacheWrite".into(),
        message,
    };
    let Op::Param { name } = &graph.node(node.inputs[0]).op else {
        return Err(fail("the cache input must be a Param".into()));
    };
    let (srcs, arena_ins) = sources(graph, &node.inputs[1..], regions);
    let (_, ins) =
        split_io(arena, &[], &arena_ins).ok_or_else(|| internal(node.id, "cache inputs"))?;
    let rows: Vec<f32>;
    let pos: i64;
    {
        let ins = resolve(graph, &srcs, ins, params)?;
        rows = match ins[0] {
            In::F32(v) => v.to_vec(),
            _ => return Err(fail("new rows must be f32".into())),
        };
        pos = match ins[1] {
            In::I64(v) => v[0],
            In::I32(v) => v[0] as i64,
            _ => return Err(fail("position must be i32/i64".into())),
        };
    }
    let shape = &graph.node(node.inputs[0]).shape;
    let (b, ctx, d) = (shape.dims[0], shape.dims[1], shape.dims[2]);
    let n = graph.node(node.inputs[1]).shape.dims[1];
    if pos < 0 || pos as usize + n > ctx {
        return Err(fail(format!(
            "position {pos} + {n} rows does not fit the cache '{name}' {shape} (context {ctx})"
        )));
    }
    let cache = params
        .get_mut(name)
        .ok_or_else(|| RuntimeError::MissingParam {
            name: name.clone(),
            shape: shape.clone(),
        })?;
    let TensorData::F32(data) = std::sync::Arc::make_mut(&mut cache.data) else {
        return Err(fail(format!("cache '{name}' is not f32")));
    };
    let pos = pos as usize;
    for bi in 0..b {
        let dst = (bi * ctx + pos) * d;
        data[dst..dst + n * d].copy_from_slice(&rows[bi * n * d..(bi + 1) * n * d]);
    }
    Ok(())
}

fn tensor_in(t: &Tensor) -> In<'_> {
    match &*t.data {
        TensorData::F32(v) => In::F32(v),
        TensorData::I32(v) => In::I32(v),
        TensorData::I64(v) => In::I64(v),
        TensorData::U8(v) => In::U8(v),
    }
}

fn tensor_from_in(shape: &rlx_ir::Shape, i: In<'_>) -> Tensor {
    let data = match i {
        In::F32(v) => TensorData::F32(v.to_vec()),
        In::I32(v) => TensorData::I32(v.to_vec()),
        In::I64(v) => TensorData::I64(v.to_vec()),
        In::U8(v) => TensorData::U8(v.to_vec()),
    };
    Tensor {
        shape: shape.clone(),
        data: data.into(),
    }
}

/// Params that some matmul reads as its 2-D f32 right-hand side.
fn packable_params(graph: &Graph) -> Vec<(NodeId, String)> {
    let mut out: Vec<(NodeId, String)> = Vec::new();
    for n in graph.nodes() {
        if !matches!(n.op, Op::MatMul | Op::FusedMatMulBiasAct { .. }) {
            continue;
        }
        let rhs = graph.node(n.inputs[1]);
        if let Op::Param { name } = &rhs.op {
            if rhs.shape.rank() == 2
                && rhs.shape.dtype == rlx_ir::DType::F32
                && !out.iter().any(|(id, _)| *id == rhs.id)
            {
                out.push((rhs.id, name.clone()));
            }
        }
    }
    out
}

/// Params that a `DequantMatMul` reads as its weights, when this CPU runs
/// that scheme on panels ([`panels_wanted`]): with the scheme and K.
fn panelable_params(graph: &Graph) -> Vec<(NodeId, String, rlx_ir::QuantScheme, usize)> {
    let mut out: Vec<(NodeId, String, rlx_ir::QuantScheme, usize)> = Vec::new();
    for n in graph.nodes() {
        let Op::DequantMatMul { scheme, .. } = n.op else {
            continue;
        };
        let w = graph.node(n.inputs[1]);
        let k = graph.node(n.inputs[0]).shape.last_dim();
        if let Op::Param { name } = &w.op {
            if panels_wanted(scheme) && !out.iter().any(|(id, ..)| *id == w.id) {
                out.push((w.id, name.clone(), scheme, k));
            }
        }
    }
    out
}

/// The param-derived part of a graph, run as thunks when params change.
struct Prep {
    core: Core,
    /// Name under which each prep output is stored among the params.
    names: Vec<String>,
    /// Outputs whose stored value is current (taken over from another
    /// model by [`CpuModel::compile_sharing`], or computed since the last
    /// param change); the prep graph runs when any other is needed.
    valid: HashSet<String>,
}

/// The process-wide rayon pool of `threads` workers: the one some live model
/// already uses, or a new one. Pools are held by the models (through the
/// `Arc`) and end when the last model using them is dropped.
pub fn shared_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, RuntimeError> {
    static POOLS: std::sync::Mutex<Vec<(usize, std::sync::Weak<rayon::ThreadPool>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    pools.retain(|(_, w)| w.strong_count() > 0);
    if let Some(p) = pools
        .iter()
        .find(|(t, _)| *t == threads)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(p);
    }
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| RuntimeError::Unsupported(format!("thread pool of {threads}: {e}")))?,
    );
    pools.push((threads, Arc::downgrade(&pool)));
    Ok(pool)
}

/// `f` on `pool` (or on the caller's pool).
fn on_pool<R: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
    match pool {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// A number per node of each graph, equal for two nodes exactly when they
/// apply the same op, at the same shape, to equally numbered inputs (leaves:
/// the same param name or constant value at the same shape). Nodes of
/// different graphs with equal numbers compute the same value from equal
/// params.
fn value_ids(graphs: &[&Graph]) -> Vec<Vec<u32>> {
    let mut table: HashMap<String, u32> = HashMap::new();
    graphs
        .iter()
        .map(|g| {
            let mut ids: Vec<u32> = Vec::with_capacity(g.len());
            for n in g.nodes() {
                let ins: Vec<u32> = n
                    .inputs
                    .iter()
                    .map(|i| ids.get(i.index()).copied().unwrap_or(u32::MAX))
                    .collect();
                let key = format!("{:?}|{:?}|{:?}", n.op, n.shape, ins);
                let fresh = table.len() as u32;
                ids.push(*table.entry(key).or_insert(fresh));
            }
            ids
        })
        .collect()
}

/// A graph compiled for the CPU.
pub struct CpuModel {
    core: Core,
    prep: Option<Prep>,
    params: HashMap<String, Tensor>,
    param_shapes: HashMap<String, rlx_ir::Shape>,
    inputs: Vec<(String, NodeId, rlx_ir::Shape)>,
    dirty: bool,
    /// Params used as a matmul's 2-D right-hand side: packed once per value.
    packable: Vec<(NodeId, String)>,
    /// Params that `DequantMatMul`s read as weights and that run on panels
    /// here ([`panels_wanted`]), with the scheme and K.
    panelable: Vec<(NodeId, String, rlx_ir::QuantScheme, usize)>,
    packed: PackedParams,
    /// Params set since their packed copies were made.
    stale: HashSet<String>,
    /// The shared pool of `opts.threads` workers (see [`shared_pool`]).
    pool: Option<Arc<rayon::ThreadPool>>,
    /// The spinning team of as many threads that runs the small loops of
    /// a decode step ([`crate::kernels::team`]); `None` on one thread.
    team: Option<Arc<Team>>,
    /// Scratch of the compiled segments, shared with the models made by
    /// [`CpuModel::compile_sharing`].
    scratch: Arc<Scratch>,
    opts: CpuOptions,
    check_finite: bool,
}

impl CpuModel {
    /// Verify and plan `graph` for the CPU.
    ///
    /// Nothing big is allocated here: the arena is allocated on the first
    /// run. The plan's memory (arena, segment scratch and the params the
    /// caller will bind) is checked against
    /// [`rlx_runtime::limits::memory_limit`] first, and a graph that would
    /// not fit is a [`RuntimeError::MemoryLimit`] naming the size.
    pub fn compile(graph: Graph, opts: &CpuOptions) -> Result<CpuModel, RuntimeError> {
        let pool = opts.threads.map(shared_pool).transpose()?;
        // Plans size their work split by the pool they will run on.
        on_pool(pool.as_deref(), || {
            Self::compile_on(graph, opts, pool.clone())
        })
    }

    fn compile_on(
        graph: Graph,
        opts: &CpuOptions,
        pool: Option<Arc<rayon::ThreadPool>>,
    ) -> Result<CpuModel, RuntimeError> {
        graph.verify()?;
        let param_bytes: u128 = graph
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Param { .. }))
            .map(|n| n.shape.size_bytes() as u128)
            .sum();
        rlx_runtime::limits::check_memory(
            &format!("the params of graph '{}'", graph.name),
            param_bytes,
        )?;
        let StaticSplit { main, prep } = split_static(&graph);
        let prep = match prep {
            None => None,
            Some((prep_graph, names)) => {
                let thunks = CpuOptions {
                    hybrid: false,
                    ..opts.clone()
                };
                Some(Prep {
                    core: Core::new(prep_graph, &thunks)?,
                    names,
                    valid: HashSet::new(),
                })
            }
        };
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
        let packable = packable_params(&main);
        let panelable = panelable_params(&main);
        // Inside the pool: segment layouts depend on its thread count.
        let core = on_pool(pool.as_deref(), || Core::new(main, opts))?;
        Ok(CpuModel {
            core,
            prep,
            params: HashMap::new(),
            param_shapes,
            inputs,
            dirty: true,
            packable,
            panelable,
            packed: PackedParams {
                bf16: opts.bf16,
                ..PackedParams::default()
            },
            stale: HashSet::new(),
            pool,
            // Inside the pool here: its thread count.
            team: team::shared_team(rayon::current_num_threads()),
            check_finite: opts.check_finite || check_finite_from_env(),
            scratch: Arc::default(),
            opts: opts.clone(),
        })
    }

    /// Whether every step's outputs are checked for NaN/inf
    /// ([`CpuOptions::check_finite`] or `RLX_CHECK_FINITE=1`).
    pub fn checks_finite(&self) -> bool {
        self.check_finite
    }

    /// Turn the per-step finite checks on or off after compiling.
    pub fn set_check_finite(&mut self, on: bool) {
        self.check_finite = on;
    }

    /// Whether the arena has been allocated (it is, from the first run on;
    /// compiling alone never allocates it).
    pub fn arena_allocated(&self) -> bool {
        !self.core.arena.is_empty() || self.core.mem.arena_bytes == 0
    }

    /// Compile `graph` (typically the same model at another batch shape)
    /// with this model's options, sharing with this model every value that
    /// does not depend on the graph's inputs:
    ///
    /// - params of the same name and shape (the tensors, not copies);
    /// - param-only results (e.g. concatenated weights) that the new graph
    ///   computes the same way from the same params;
    /// - the packed copies of matmul weights made from those;
    /// - the thread pool and the scratch memory of compiled segments (the
    ///   models run one at a time or take more scratch).
    ///
    /// Only the plan and the arena are the new model's own. Both models stay
    /// independent: a later `set_param` on either replaces its value there
    /// only. When this model has every param set, its pending param changes
    /// are applied first (its param-only graph runs and stale weights are
    /// packed), so all of it is shared; otherwise only its set params are
    /// (the new model computes the rest on its first run).
    pub fn compile_sharing(&mut self, graph: Graph) -> Result<CpuModel, RuntimeError> {
        let pool = self.pool.clone();
        if self
            .param_shapes
            .keys()
            .all(|n| self.params.contains_key(n))
        {
            on_pool(pool.as_deref(), || self.prepare())?;
        }
        let mut next = on_pool(pool.as_deref(), || {
            Self::compile_on(graph, &self.opts, pool.clone())
        })?;
        next.scratch = self.scratch.clone();
        // Which of the new model's values are this model's, by name there.
        let mut same: HashMap<String, String> = HashMap::new();
        for (name, shape) in &next.param_shapes {
            if self.param_shapes.get(name) == Some(shape) {
                if let Some(t) = self.params.get(name) {
                    next.params.insert(name.clone(), t.clone());
                    same.insert(name.clone(), name.clone());
                }
            }
        }
        if let (Some(mine), Some(theirs)) = (&self.prep, &mut next.prep) {
            let ids = value_ids(&[&mine.core.graph, &theirs.core.graph]);
            let id_of = |ids: &[u32], g: &Graph, k: usize| ids[g.outputs[k].index()];
            for (k, name) in theirs.names.iter().enumerate() {
                let want = id_of(&ids[1], &theirs.core.graph, k);
                let found = (0..mine.names.len())
                    .find(|&j| id_of(&ids[0], &mine.core.graph, j) == want)
                    .map(|j| &mine.names[j]);
                let Some(src) = found.filter(|src| mine.valid.contains(*src)) else {
                    continue;
                };
                let inputs_shared = theirs.core.graph.nodes().iter().all(|n| match &n.op {
                    Op::Param { name } => same.contains_key(name),
                    _ => true,
                });
                if let (true, Some(t)) = (inputs_shared, self.params.get(src)) {
                    next.params.insert(name.clone(), t.clone());
                    theirs.valid.insert(name.clone());
                    same.insert(name.clone(), src.clone());
                }
            }
        }
        for (id, name) in &next.packable {
            let Some(src) = same.get(name).filter(|src| !self.stale.contains(*src)) else {
                continue;
            };
            let packed = self
                .packable
                .iter()
                .find(|(_, n)| n == src)
                .and_then(|(sid, _)| self.packed.gemm.get(sid));
            if let Some(p) = packed {
                next.packed.gemm.insert(*id, p.clone());
            }
        }
        for (id, name, scheme, k) in &next.panelable {
            let Some(src) = same.get(name).filter(|src| !self.stale.contains(*src)) else {
                continue;
            };
            let panels = self
                .panelable
                .iter()
                .find(|(_, n, s, kk)| n == src && s == scheme && kk == k)
                .and_then(|(sid, ..)| self.packed.panels.get(sid));
            if let Some(p) = panels {
                next.packed.panels.insert(*id, p.clone());
            }
        }
        Ok(next)
    }

    /// Bytes this model holds for itself alone while it is kept: its arena
    /// (allocated on the first run). Not counted: what it may share with
    /// other models (see [`CpuModel::compile_sharing`]): params, packed
    /// weights and segment scratch ([`CpuModel::scratch_bytes`]); and the
    /// arena of the param-only graph, which exists only while that runs
    /// after a param change.
    pub fn plan_bytes(&self) -> usize {
        self.core.mem.arena_bytes
    }

    /// Bytes the (possibly shared) scratch of compiled segments holds now:
    /// the largest need of one segment among the models sharing it, per
    /// chunk running at once.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// The packed copies of matmul weights this model holds. Models made
    /// with [`CpuModel::compile_sharing`] hold the same `Arc`s (compare
    /// them with `Arc::ptr_eq`).
    pub fn packed_weights(&self) -> Vec<Arc<PackedB>> {
        let mut v: Vec<(NodeId, Arc<PackedB>)> = self
            .packed
            .gemm
            .iter()
            .map(|(k, p)| (*k, p.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v.into_iter().map(|(_, p)| p).collect()
    }

    /// Bytes of the memory plan's safety check: no two live tensors overlap.
    pub fn check_memory_plan(&self) -> Result<(), (NodeId, NodeId)> {
        self.core.mem.check_no_overlap()
    }

    /// Run once, timing every dispatch. Returns the outputs and one entry
    /// per compiled segment and per executed thunk, in order.
    pub fn run_profiled(
        &mut self,
        inputs: &[(&str, TensorRef<'_>)],
    ) -> Result<(Vec<Tensor>, Vec<ProfileEntry>), RuntimeError> {
        self.core.profile = Some(Vec::new());
        let r = Executable::run(self, inputs);
        let prof = self.core.profile.take().unwrap_or_default();
        r.map(|o| (o, prof))
    }

    /// Bytes held by packed copies of matmul weights.
    pub fn packed_bytes(&self) -> usize {
        let gemm: usize = self.packed.gemm.values().map(|p| p.bytes()).sum();
        gemm + self
            .packed
            .panels
            .values()
            .map(|p| p.bytes())
            .sum::<usize>()
    }

    /// Re-pack every packable param set since the last run.
    fn repack(&mut self) -> Result<(), RuntimeError> {
        for (id, name) in &self.packable {
            if !self.stale.contains(name) && self.packed.gemm.contains_key(id) {
                continue;
            }
            let Some(t) = self.params.get(name) else {
                continue;
            };
            let TensorData::F32(data) = &*t.data else {
                continue;
            };
            let (k, n) = (t.shape.dims[0], t.shape.dims[1]);
            let packed = PackedB::pack(data, k, n, n).map_err(|e| RuntimeError::Kernel {
                node: *id,
                op: "PackWeight".into(),
                message: format!("param '{name}' {}: {e}", t.shape),
            })?;
            let packed = if self.opts.bf16 {
                packed.to_bf16()
            } else if self.opts.f16_weights {
                packed.to_f16()
            } else {
                packed
            };
            self.packed.gemm.insert(*id, Arc::new(packed));
        }
        for (id, name, scheme, k) in &self.panelable {
            if !self.stale.contains(name) && self.packed.panels.contains_key(id) {
                continue;
            }
            let Some(t) = self.params.get(name) else {
                continue;
            };
            let TensorData::U8(data) = &*t.data else {
                continue;
            };
            let n = t.shape.dims.first().copied().unwrap_or(0);
            let panels =
                QuantPanels::pack(*scheme, data, n, *k).map_err(|e| RuntimeError::Kernel {
                    node: *id,
                    op: "PackQuantPanels".into(),
                    message: format!("param '{name}' {}: {e}", t.shape),
                })?;
            self.packed.panels.insert(*id, Arc::new(panels));
        }
        self.stale.clear();
        Ok(())
    }

    /// For each compiled segment, its first and last node and how its rows
    /// run on this machine's threads ([`FusedPlan::layout`]).
    pub fn segment_layouts(&self) -> Vec<(NodeId, NodeId, String)> {
        let layouts = || {
            self.core
                .steps
                .iter()
                .filter_map(|s| match s {
                    Step::Compiled {
                        segment, lowered, ..
                    } => Some((
                        *segment.nodes.first()?,
                        *segment.nodes.last()?,
                        lowered.layout(),
                    )),
                    Step::Thunks { .. } => None,
                })
                .collect()
        };
        on_pool(self.pool.as_deref(), layouts)
    }

    /// The graph actually executed (param-only nodes replaced by `%static.N` params).
    pub fn graph(&self) -> &Graph {
        &self.core.graph
    }

    /// `name` got a new value (or lost it): its packed copy and every
    /// param-only result are out of date.
    fn param_changed(&mut self, name: &str) {
        self.stale.insert(name.to_string());
        self.dirty = true;
        if let Some(prep) = &mut self.prep {
            prep.valid.clear();
        }
    }

    fn run_inner(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<Tensor>, RuntimeError> {
        let given = bind_inputs(&self.inputs, inputs)?;
        let bound: HashMap<NodeId, TensorRef<'_>> = self
            .inputs
            .iter()
            .zip(given)
            .map(|((_, id, _), t)| (*id, t))
            .collect();
        check_params_set(&self.param_shapes, |n| self.params.contains_key(n))?;
        self.prepare()?;
        self.core.execute(
            &bound,
            &mut self.params,
            &self.packed,
            self.opts.poison_freed,
            self.check_finite,
            &self.scratch,
        )
    }

    /// Bring param-only results and packed weights up to date after param
    /// changes (a no-op when nothing changed).
    fn prepare(&mut self) -> Result<(), RuntimeError> {
        if !self.dirty {
            return Ok(());
        }
        if let Some(prep) = &mut self.prep {
            let missing: Vec<usize> = (0..prep.names.len())
                .filter(|&k| !prep.valid.contains(&prep.names[k]))
                .collect();
            if !missing.is_empty() {
                // Outputs taken over from another model are not computed
                // again: a new batch shape of an embedder shares its
                // concatenated weights and needs only its own position
                // rows (recomputing all of it was most of a new shape's cost).
                let mut part = if missing.len() < prep.names.len() {
                    let thunks = CpuOptions {
                        hybrid: false,
                        ..self.opts.clone()
                    };
                    Some(Core::new(
                        outputs_subgraph(&prep.core.graph, &missing),
                        &thunks,
                    )?)
                } else {
                    None
                };
                let core = part.as_mut().unwrap_or(&mut prep.core);
                let outs = core.execute(
                    &HashMap::new(),
                    &mut self.params,
                    &PackedParams::default(),
                    false,
                    self.check_finite,
                    &self.scratch,
                )?;
                // Prep runs only when params change: its arena is not kept.
                core.arena = Vec::new();
                for (&k, t) in missing.iter().zip(outs) {
                    self.params.insert(prep.names[k].clone(), t);
                    self.stale.insert(prep.names[k].clone());
                }
                prep.valid = prep.names.iter().cloned().collect();
            }
        }
        self.repack()?;
        self.dirty = false;
        Ok(())
    }
}

impl Executable for CpuModel {
    fn set_param(&mut self, name: &str, value: TensorRef<'_>) -> Result<(), RuntimeError> {
        let shape = param_shape(&self.param_shapes, name, &value)?;
        self.params.insert(name.to_string(), value.to_tensor(shape));
        self.param_changed(name);
        Ok(())
    }

    fn set_param_tensor(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError> {
        param_tensor_shape(&self.param_shapes, name, &value)?;
        self.params.insert(name.to_string(), value);
        self.param_changed(name);
        Ok(())
    }

    fn take_param(&mut self, name: &str) -> Option<Tensor> {
        self.param_changed(name);
        let graph = &self.core.graph;
        let named = |id: &NodeId| matches!(&graph.node(*id).op, Op::Param { name: n } if n == name);
        self.packed.gemm.retain(|id, _| !named(id));
        self.packed.panels.retain(|id, _| !named(id));
        self.params.remove(name)
    }

    fn run(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<Tensor>, RuntimeError> {
        let (pool, team) = (self.pool.clone(), self.team.clone());
        on_pool(pool.as_deref(), || {
            team::with_team(team.as_ref(), || self.run_inner(inputs))
        })
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
