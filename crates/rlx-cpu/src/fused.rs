//! The CPU segment compiler.
//!
//! It claims row-local ops: ops where output row `r` (over all leading dims)
//! depends only on row `r` of its row-shaped inputs, plus whole weights and
//! vectors. A segment of such ops lowers to a [`FusedPlan`] that splits the
//! rows into chunks and runs the whole segment on each chunk inside one
//! rayon parallel region: one fork/join per segment, and every intermediate
//! stays in a chunk-sized, cache-resident scratch buffer (a [`Scratch`]
//! shared by the model's segments).
//!
//! Folding done at lower time:
//! - views: Reshape keeping the last dim, same-dtype Cast and last-axis
//!   Narrow become strided reads of their source (no copy);
//! - epilogues: Activation and Binary ops whose input is an intermediate
//!   with no other reader run in place on that buffer, i.e. in the epilogue
//!   of the producing matmul while its rows are hot in cache;
//! - FusedMatMulBiasAct applies bias and activation per row block.
//!
//! Before a plan is kept, a cost check (`fused_cost`) models the memory
//! traffic of the chunking against that of the thunks: every chunk streams
//! every weight, the thunks round-trip every intermediate through the
//! arena. A chunking that would move more bytes is replaced by the fewest
//! chunks, and a segment for which that also loses is declined (the hybrid
//! runs its ops as thunks; `rlx plan` prints the reason).

use crate::fused_cost::{llc_bytes, SegmentTraffic};
use crate::kernels::packed_gemm::{gemm_packed, gemm_packed_split, ColumnSplit, PackedB};
use crate::kernels::rope::{rope_rows_inplace, rope_tables_cached, RopeSpec};
use crate::kernels::{elementwise, matmul, norm, softmax, In, Out};
use rayon::prelude::*;
use rlx_ir::{Activation, BinaryOp, DType, Graph, Node, NodeId, Op, ReduceOp, Shape};
use rlx_runtime::hybrid::{Decline, SegmentCompiler, SubGraph};
use std::sync::Mutex;

/// Rows per chunk at most; bounds scratch memory and keeps chunks in cache.
const MAX_CHUNK_ROWS: usize = 512;

/// Below this many rows a segment runs as one chunk with parallel kernels:
/// splitting 128 rows in two halves each GEMM's work per weight panel.
const SPLIT_MIN_ROWS: usize = 512;

/// Fewest rows per chunk once a segment splits. Every chunk streams every
/// weight of the segment, so small chunks multiply the weight traffic by
/// the chunk count: at 16 threads, 512 rows in 32-row chunks read a 100 MB
/// projection 16 times (GDN block prefill on a 16-core Xeon: 0.69x
/// thunks). With fewer chunks than threads the chunks' kernels parallelize
/// inside each chunk (rayon nests), so threads share weight panels instead.
const MIN_CHUNK_ROWS: usize = 256;

/// `RLX_CPU_CHUNK_ROWS=N`: rows per chunk (at most [`MAX_CHUNK_ROWS`]) of
/// every segment with weights that splits into chunks, instead of the
/// count chosen from the shape and the thread count: for A/B runs of the
/// chunking. The plan's cost check still applies to it.
fn chunk_rows_override() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("RLX_CPU_CHUNK_ROWS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&r: &usize| r > 0)
    })
}

/// Fewest elements of the widest row per chunk of a segment without
/// matmuls (see `FusedCompiler`'s chunking).
const MIN_CHUNK_ELEMS: usize = 16 * 1024;

/// Elements of output from which a segment of one op without weights is
/// declined (its thunk skips the copy out of scratch). Below it both take
/// microseconds, and tiny segments keep the planner's pieces as they are.
const ONE_OP_DECLINE_ELEMS: usize = 64 * 1024;

/// The CPU segment compiler (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct FusedCompiler;

fn rows_of(s: &Shape) -> usize {
    if s.rank() == 0 {
        1
    } else {
        s.numel() / s.last_dim().max(1)
    }
}

fn is_weight(g: &Graph, id: NodeId) -> bool {
    matches!(g.node(id).op, Op::Param { .. } | Op::Constant { .. })
}

/// How an operand of shape `d` broadcasts over rows of `out`: `Some(true)`
/// when its last dim is 1 (one value per row), `Some(false)` when it matches.
fn row_broadcastable(d: &[usize], out: &[usize]) -> Option<bool> {
    let r = out.len();
    if d.len() > r || r == 0 {
        return None;
    }
    let pad: Vec<usize> = std::iter::repeat_n(1, r - d.len())
        .chain(d.iter().copied())
        .collect();
    let last = pad[r - 1];
    if last != out[r - 1] && last != 1 {
        return None;
    }
    let lead = &pad[..r - 1];
    let k = lead.iter().position(|&x| x != 1).unwrap_or(r - 1);
    (lead[k..] == out[k..r - 1]).then_some(last == 1 && out[r - 1] != 1)
}

impl SegmentCompiler for FusedCompiler {
    type Lowered = FusedPlan;

    fn name(&self) -> &'static str {
        "cpu-fused"
    }

    fn claims(&self, g: &Graph, n: &Node) -> Result<(), Decline> {
        let ids_ok = |k: usize| matches!(g.node(n.inputs[k]).shape.dtype, DType::I64 | DType::I32);
        match &n.op {
            Op::Cast { to } if g.node(n.inputs[0]).shape.dtype != *to => {
                return Err(format!(
                    "Cast {} -> {to} changes the dtype: fused plans hold f32 scratch only",
                    g.node(n.inputs[0]).shape.dtype
                )
                .into())
            }
            Op::Transpose { .. } => {
                return Err(
                    "Transpose reorders rows: a fused plan runs row-local ops over row chunks"
                        .into(),
                )
            }
            Op::Expand { .. } => {
                return Err(
                    "Expand materializes broadcast rows: a fused plan reads broadcast \
                            operands of its Binary ops in place instead"
                        .into(),
                )
            }
            Op::Concat { axis } if *axis + 1 != n.shape.rank() => {
                return Err(format!(
                    "Concat over axis {axis} interleaves rows: only last-axis Concat is fused"
                )
                .into())
            }
            Op::Rope { .. } if !ids_ok(1) => return Err("Rope positions are not i32/i64".into()),
            Op::Rope { .. } if n.inputs.len() > 2 => {
                return Err("Rope with frequency divisors (a third input) is not fused".into())
            }
            _ => {}
        }
        let f32s = n.shape.dtype == DType::F32
            && n.inputs.iter().enumerate().all(|(k, &i)| {
                g.node(i).shape.dtype == DType::F32
                    || matches!(n.op, Op::Gather { .. })
                    || matches!(n.op, Op::Rope { .. }) && k == 1
            });
        if !f32s {
            return Err("only f32 row-local ops are fused".into());
        }
        if n.shape.rank() == 0 {
            return Err("scalar output".into());
        }
        let in_shape = |k: usize| &g.node(n.inputs[k]).shape;
        match &n.op {
            Op::MatMul | Op::FusedMatMulBiasAct { .. } => {
                if in_shape(1).rank() == 2 && is_weight(g, n.inputs[1]) {
                    Ok(())
                } else {
                    Err("matmul rhs is not a rank-2 weight".into())
                }
            }
            Op::Activation(_)
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::FusedResidualLN { .. }
            | Op::FusedResidualRmsNorm { .. }
            | Op::FusedSwiGLU { .. } => Ok(()),
            Op::Softmax { axis } if *axis + 1 == n.shape.rank() => Ok(()),
            Op::Binary(_) => {
                for k in 0..2 {
                    if row_broadcastable(&in_shape(k).dims, &n.shape.dims).is_none() {
                        return Err(format!(
                            "operand {} does not broadcast over rows of {}",
                            in_shape(k),
                            n.shape
                        )
                        .into());
                    }
                }
                Ok(())
            }
            Op::Narrow { axis, .. } if *axis + 1 == n.shape.rank() => Ok(()),
            Op::Reshape { .. }
                if in_shape(0).last_dim() == n.shape.last_dim() && in_shape(0).rank() > 0 =>
            {
                Ok(())
            }
            Op::Reshape { .. } if g.node(n.inputs[0]).op.is_leaf() => Ok(()),
            Op::Reduce {
                axes,
                keep_dims: true,
                ..
            } if axes == &[n.shape.rank() - 1] => Ok(()),
            Op::Cast { to } if *to == in_shape(0).dtype => Ok(()),
            Op::Gather { axis: 0 } if in_shape(0).rank() == 2 && is_weight(g, n.inputs[0]) => {
                Ok(())
            }
            // Each row rotates by its own position (positions [S] repeat
            // over the batch, [B, S] give one per row).
            Op::Rope { head_dim, .. }
                if n.shape.rank() == 3 && n.shape.last_dim().is_multiple_of(*head_dim) =>
            {
                Ok(())
            }
            Op::Concat { .. } => Ok(()),
            other => Err(format!("{} is not row-local", other.name()).into()),
        }
    }

    fn try_lower(&self, sub: &SubGraph) -> Result<FusedPlan, Decline> {
        FusedPlan::lower(sub).map_err(Decline::from)
    }
}

/// Which source row a value's chunk-local row reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RowMap {
    /// Global row `r` (boundary inputs with one row per segment row).
    Global,
    /// Always row 0 (a vector broadcast over rows).
    Const,
    /// Global row `r % p` (e.g. `[S, D]` added to `[B, S, D]`).
    Periodic(usize),
    /// Chunk-local row (an intermediate in scratch).
    Local,
}

/// Where a value lives and how to read its rows.
#[derive(Debug, Clone, Copy, PartialEq)]
struct View {
    /// Boundary input index, or scratch slot.
    src: Src,
    map: RowMap,
    /// Column offset within a source row.
    col: usize,
    /// Elements between source rows.
    stride: usize,
    /// Row width.
    width: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Src {
    Ext(usize),
    Slot(usize),
}

#[derive(Debug, Clone)]
enum FOp {
    MatMul {
        a: View,
        w: usize,
        k: usize,
        n: usize,
        bias: Option<View>,
        act: Option<Activation>,
        out: usize,
    },
    Unary {
        act: Activation,
        x: View,
        out: usize,
    },
    Binary {
        op: BinaryOp,
        a: View,
        b: View,
        out: usize,
    },
    Norm {
        x: View,
        residual: Option<View>,
        bias: Option<View>,
        gamma: View,
        beta: Option<View>,
        eps: f32,
        out: usize,
    },
    Softmax {
        x: View,
        out: usize,
    },
    ReduceRow {
        op: ReduceOp,
        x: View,
        out: usize,
    },
    SwiGlu {
        gate: View,
        up: View,
        out: usize,
    },
    Gather {
        table: usize,
        ids: usize,
        width: usize,
        vocab: usize,
        out: usize,
    },
    Rope {
        spec: RopeSpec,
        x: View,
        /// Boundary input holding the positions.
        pos: usize,
        /// Row `r` reads position `r % period`.
        period: usize,
        out: usize,
    },
    Concat {
        parts: Vec<View>,
        out: usize,
    },
}

impl FOp {
    /// Whether any input view of this op reads scratch slot `s`.
    fn reads_slot(&self, s: usize) -> bool {
        let mut views: Vec<&View> = Vec::new();
        match self {
            FOp::MatMul { a, bias, .. } => views.extend(std::iter::once(a).chain(bias)),
            FOp::Unary { x, .. }
            | FOp::Softmax { x, .. }
            | FOp::ReduceRow { x, .. }
            | FOp::Rope { x, .. } => views.push(x),
            FOp::Binary { a, b, .. } => views.extend([a, b]),
            FOp::Norm {
                x,
                residual,
                bias,
                gamma,
                beta,
                ..
            } => views.extend(
                std::iter::once(x)
                    .chain(residual)
                    .chain(bias)
                    .chain([gamma])
                    .chain(beta),
            ),
            FOp::SwiGlu { gate, up, .. } => views.extend([gate, up]),
            FOp::Gather { .. } => {}
            FOp::Concat { parts, .. } => views.extend(parts),
        }
        views.iter().any(|v| v.src == Src::Slot(s))
    }

    /// The scratch slot this op writes.
    fn out(&self) -> usize {
        match *self {
            FOp::MatMul { out, .. }
            | FOp::Unary { out, .. }
            | FOp::Binary { out, .. }
            | FOp::Norm { out, .. }
            | FOp::Softmax { out, .. }
            | FOp::ReduceRow { out, .. }
            | FOp::SwiGlu { out, .. }
            | FOp::Gather { out, .. }
            | FOp::Rope { out, .. }
            | FOp::Concat { out, .. } => out,
        }
    }
}

/// Scratch memory for the chunks of compiled segments, shared by every
/// segment of a model and by the models made with
/// [`crate::CpuModel::compile_sharing`]. A running chunk takes one set (one
/// buffer per intermediate), grows its buffers to what its segment needs and
/// gives it back. Segments run one after another, so the sets cost the
/// largest segment's need times the chunks running at once, not the sum over
/// segments and shapes.
#[derive(Debug, Default)]
pub struct Scratch {
    sets: Mutex<Vec<Vec<Vec<f32>>>>,
}

impl Scratch {
    /// Bytes the scratch sets hold now.
    pub fn bytes(&self) -> usize {
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        sets.iter()
            .flat_map(|s| s.iter())
            .map(|b| b.capacity() * 4)
            .sum()
    }

    /// A set whose first `widths.len()` buffers hold at least `w * rows`
    /// floats each (their contents are whatever the last user left).
    fn take(&self, widths: &[usize], rows: usize) -> Vec<Vec<f32>> {
        let taken = self.sets.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut set = taken.unwrap_or_default();
        if set.len() < widths.len() {
            set.resize_with(widths.len(), Vec::new);
        }
        for (b, &w) in set.iter_mut().zip(widths) {
            if b.len() < w * rows {
                b.resize(w * rows, 0.0);
            }
        }
        set
    }

    fn give_back(&self, set: Vec<Vec<f32>>) {
        self.sets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(set);
    }
}

/// A lowered segment: ops over row chunks, run in one parallel region.
#[derive(Debug)]
pub struct FusedPlan {
    rows: usize,
    ops: Vec<(NodeId, FOp)>,
    /// Width of each scratch slot.
    slots: Vec<usize>,
    /// For each boundary output, the view holding it.
    outputs: Vec<View>,
    chunk_rows: usize,
    chunks: usize,
    /// The cost model's figures for the chosen chunking.
    cost: String,
    /// Chunks expected to run at once (each holds one scratch set).
    sets: usize,
    /// Per op: the boundary outputs it writes itself (see
    /// [`direct_outputs`]), empty for ops whose outputs are copied out.
    direct: Vec<Vec<usize>>,
}

impl FusedPlan {
    fn lower(sub: &SubGraph) -> Result<FusedPlan, String> {
        let g = &sub.graph;
        let rows = g
            .outputs
            .iter()
            .map(|&o| rows_of(&g.node(o).shape))
            .max()
            .ok_or("segment has no outputs")?;
        let users = g.users_all();
        let mut views: Vec<Option<View>> = vec![None; g.len()];
        let mut slots: Vec<usize> = Vec::new();
        let mut slot_value: Vec<usize> = Vec::new();
        let mut ops = Vec::new();
        let out_set: Vec<bool> = (0..g.len())
            .map(|i| g.outputs.contains(&NodeId(i as u32)))
            .collect();
        let mut ext = 0usize;
        for n in g.nodes() {
            let id = n.id.index();
            let parent = sub.parent_of[id];
            if n.op.is_leaf() {
                let r = rows_of(&n.shape);
                let map = if r == rows {
                    RowMap::Global
                } else if r == 1 {
                    RowMap::Const
                } else if r > 0 && rows % r == 0 {
                    RowMap::Periodic(r)
                } else {
                    RowMap::Const
                };
                let w = n.shape.last_dim();
                views[id] = Some(View {
                    src: Src::Ext(ext),
                    map,
                    col: 0,
                    stride: w,
                    width: w,
                });
                ext += 1;
                continue;
            }
            let v = |k: usize| views[n.inputs[k].index()].ok_or("input has no view".to_string());
            let w = n.shape.last_dim();
            let r = rows_of(&n.shape);
            if r != rows
                && !matches!(
                    n.op,
                    Op::Narrow { .. } | Op::Reshape { .. } | Op::Cast { .. }
                )
            {
                return Err(format!(
                    "node {parent} has {r} rows, the segment has {rows}"
                ));
            }
            let new_slot = |slots: &mut Vec<usize>, owners: &mut Vec<usize>| {
                slots.push(w);
                owners.push(id);
                slots.len() - 1
            };
            // In place: the first operand is a whole local slot that nothing
            // else reads, directly or through a folded view.
            let reuse = |x: View| -> Option<usize> {
                match x.src {
                    Src::Slot(s) if x.col == 0 && x.width == w && x.stride == w => {
                        // The node whose value the slot holds now (after any
                        // earlier in-place writers), seen through its views.
                        let holder = slot_value[s];
                        (reads_through_views(g, &users, &out_set, holder) == Some(1)).then_some(s)
                    }
                    _ => None,
                }
            };
            let local = |s: usize| View {
                src: Src::Slot(s),
                map: RowMap::Local,
                col: 0,
                stride: w,
                width: w,
            };
            let ext_index = |k: usize| match views[n.inputs[k].index()].map(|v| v.src) {
                Some(Src::Ext(e)) => Ok(e),
                _ => Err(format!(
                    "node {parent}: weight operand is not a boundary input"
                )),
            };
            let (fop, view) = match &n.op {
                Op::Reshape { .. } if g.node(n.inputs[0]).shape.last_dim() != w => {
                    // Re-view a whole, contiguous boundary input with a new row width.
                    let x = v(0)?;
                    let map = if r == rows {
                        RowMap::Global
                    } else if r == 1 {
                        RowMap::Const
                    } else {
                        return Err(format!(
                            "node {parent}: reshape to {r} rows in a {rows}-row segment"
                        ));
                    };
                    match x.src {
                        Src::Ext(_) if x.col == 0 && x.stride == x.width => (
                            None,
                            View {
                                map,
                                col: 0,
                                stride: w,
                                width: w,
                                ..x
                            },
                        ),
                        _ => {
                            return Err(format!(
                                "node {parent}: reshape changes the row width of an intermediate"
                            ))
                        }
                    }
                }
                Op::Reshape { .. } | Op::Cast { .. } => (None, v(0)?),
                Op::Reduce { op, .. } => {
                    let s = new_slot(&mut slots, &mut slot_value);
                    (
                        Some(FOp::ReduceRow {
                            op: *op,
                            x: v(0)?,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::Narrow { start, len, .. } => {
                    let mut x = v(0)?;
                    x.col += start;
                    x.width = *len;
                    (None, x)
                }
                Op::MatMul | Op::FusedMatMulBiasAct { .. } => {
                    let wshape = &g.node(n.inputs[1]).shape;
                    let (k, nn) = (wshape.dims[0], wshape.dims[1]);
                    let act = match &n.op {
                        Op::FusedMatMulBiasAct { activation } => *activation,
                        _ => None,
                    };
                    let bias = if n.inputs.len() > 2 {
                        Some(v(2)?)
                    } else {
                        None
                    };
                    let s = new_slot(&mut slots, &mut slot_value);
                    let a = v(0)?;
                    if a.map == RowMap::Const && rows != 1 || matches!(a.map, RowMap::Periodic(_)) {
                        return Err(format!("node {parent}: matmul lhs is broadcast over rows"));
                    }
                    (
                        Some(FOp::MatMul {
                            a,
                            w: ext_index(1)?,
                            k,
                            n: nn,
                            bias,
                            act,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::Activation(act) => {
                    let x = v(0)?;
                    let s = reuse(x).unwrap_or_else(|| new_slot(&mut slots, &mut slot_value));
                    (
                        Some(FOp::Unary {
                            act: *act,
                            x,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::Binary(op) => {
                    let (a, b) = (v(0)?, v(1)?);
                    let s = reuse(a).unwrap_or_else(|| new_slot(&mut slots, &mut slot_value));
                    (
                        Some(FOp::Binary {
                            op: *op,
                            a,
                            b,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::LayerNorm { eps, .. } | Op::RmsNorm { eps, .. } => {
                    let s = new_slot(&mut slots, &mut slot_value);
                    let beta = matches!(n.op, Op::LayerNorm { .. })
                        .then(|| v(2))
                        .transpose()?;
                    (
                        Some(FOp::Norm {
                            x: v(0)?,
                            residual: None,
                            bias: None,
                            gamma: v(1)?,
                            beta,
                            eps: *eps,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::FusedResidualLN { has_bias, eps }
                | Op::FusedResidualRmsNorm { has_bias, eps } => {
                    let s = new_slot(&mut slots, &mut slot_value);
                    let b = *has_bias as usize;
                    let beta = matches!(n.op, Op::FusedResidualLN { .. })
                        .then(|| v(3 + b))
                        .transpose()?;
                    (
                        Some(FOp::Norm {
                            x: v(0)?,
                            residual: Some(v(1)?),
                            bias: has_bias.then(|| v(2)).transpose()?,
                            gamma: v(2 + b)?,
                            beta,
                            eps: *eps,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::Softmax { .. } => {
                    let s = new_slot(&mut slots, &mut slot_value);
                    (Some(FOp::Softmax { x: v(0)?, out: s }), local(s))
                }
                Op::FusedSwiGLU { packed } => {
                    let s = new_slot(&mut slots, &mut slot_value);
                    let (gate, up) = if *packed {
                        let x = v(0)?;
                        let half = x.width / 2;
                        (
                            View { width: half, ..x },
                            View {
                                width: half,
                                col: x.col + half,
                                ..x
                            },
                        )
                    } else {
                        (v(0)?, v(1)?)
                    };
                    (Some(FOp::SwiGlu { gate, up, out: s }), local(s))
                }
                Op::Gather { .. } => {
                    let s = new_slot(&mut slots, &mut slot_value);
                    let t = &g.node(n.inputs[0]).shape;
                    if g.node(n.inputs[1]).shape.numel() != rows {
                        return Err(format!("node {parent}: ids do not cover the segment rows"));
                    }
                    (
                        Some(FOp::Gather {
                            table: ext_index(0)?,
                            ids: ext_index(1)?,
                            width: t.dims[1],
                            vocab: t.dims[0],
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::Rope {
                    head_dim,
                    n_rot,
                    theta,
                    style,
                } => {
                    let x = v(0)?;
                    let p = g.node(n.inputs[1]).shape.numel();
                    if p == 0 || rows % p != 0 {
                        return Err(format!(
                            "node {parent}: {p} positions do not tile the segment's {rows} rows"
                        ));
                    }
                    let s = reuse(x).unwrap_or_else(|| new_slot(&mut slots, &mut slot_value));
                    let spec = RopeSpec {
                        head_dim: *head_dim,
                        n_rot: *n_rot,
                        theta: *theta,
                        style: *style,
                        freqs: None,
                    };
                    (
                        Some(FOp::Rope {
                            spec,
                            x,
                            pos: ext_index(1)?,
                            period: p,
                            out: s,
                        }),
                        local(s),
                    )
                }
                Op::Concat { .. } => {
                    let parts = (0..n.inputs.len()).map(v).collect::<Result<Vec<_>, _>>()?;
                    let s = new_slot(&mut slots, &mut slot_value);
                    (Some(FOp::Concat { parts, out: s }), local(s))
                }
                other => return Err(format!("node {parent}: {} is not lowered", other.name())),
            };
            if let Some(f) = fop {
                if let Src::Slot(s) = view.src {
                    slot_value[s] = id;
                }
                ops.push((parent, f));
            }
            views[id] = Some(view);
        }
        let outputs = g
            .outputs
            .iter()
            .map(|&o| views[o.index()].ok_or("output has no view".to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        for (o, v) in g.outputs.iter().zip(&outputs) {
            if rows_of(&g.node(*o).shape) != rows || v.map == RowMap::Const && rows != 1 {
                return Err(format!(
                    "output {} does not have the segment's {rows} rows",
                    sub.outputs[0]
                ));
            }
        }
        let threads = rayon::current_num_threads().max(1);
        // Few rows: one chunk, and the kernels (GEMM) parallelize inside it.
        // Many rows: chunks of up to MAX_CHUNK_ROWS spread over the threads,
        // every op of the segment running on a chunk while it is in cache.
        let has_weights = ops.iter().any(|(_, op)| matches!(op, FOp::MatMul { .. }));
        let widest = ops.iter().map(|(_, op)| slots[op.out()]).max().unwrap_or(1);
        if !has_weights && ops.len() == 1 && rows * widest >= ONE_OP_DECLINE_ELEMS {
            // Nothing to fuse: the segment would run the op's kernel into
            // scratch and copy it out, one more pass than its thunk (a
            // SmolLM2 prefill's SwiGLU, 128 x 1536 on 2 threads of a Xeon:
            // 0.21 ms fused, 0.12 ms as a thunk).
            return Err(
                "one op without weights: its thunk writes the output directly, \
                 a segment adds a copy out of scratch"
                    .to_string(),
            );
        }
        let default_rows = if !has_weights {
            // Nothing to re-stream per chunk (norms, activations, residuals):
            // chunks just big enough to pay for a task. One chunk here ran a
            // 128 x 1536 SwiGLU on one of 16 threads (70 µs of a SmolLM2
            // prefill layer on the Xeon).
            rows.div_ceil(threads)
                .max(MIN_CHUNK_ELEMS.div_ceil(widest.max(1)))
                .clamp(1, MAX_CHUNK_ROWS)
        } else if rows < SPLIT_MIN_ROWS {
            rows.max(1)
        } else {
            rows.div_ceil(threads).clamp(MIN_CHUNK_ROWS, MAX_CHUNK_ROWS)
        };
        let default_rows = match chunk_rows_override() {
            Some(r) if has_weights && rows >= SPLIT_MIN_ROWS => r.min(MAX_CHUNK_ROWS),
            _ => default_rows,
        };
        let written: usize = ops.iter().map(|(_, op)| slots[op.out()]).sum();
        let escaping: usize = outputs.iter().map(|v| v.width).sum();
        let traffic = SegmentTraffic {
            rows,
            weight_bytes: ops
                .iter()
                .map(|(_, op)| match op {
                    FOp::MatMul { k, n, .. } => k * n * 4,
                    _ => 0,
                })
                .sum(),
            intermediate_row_bytes: written.saturating_sub(escaping) * 4,
            ops: ops.len(),
        };
        let choice = traffic.choose(default_rows, MAX_CHUNK_ROWS, llc_bytes())?;
        let chunk_rows = choice.chunk_rows;
        let chunks = rows.div_ceil(chunk_rows);
        let sets = chunks.min(threads);
        let direct = direct_outputs(&ops, &outputs);
        Ok(FusedPlan {
            direct,
            rows,
            ops,
            slots,
            outputs,
            chunk_rows,
            chunks,
            cost: choice.note,
            sets,
        })
    }

    /// How the rows run: `"R rows: one chunk, kernels on the pool"`, or `"R
    /// rows: N chunks of C rows, chunks on the pool"` (each chunk's kernels
    /// serial, every chunk streaming every weight), or `"..., kernels on the
    /// pool inside each chunk"` when there are fewer chunks than threads;
    /// then how many boundary outputs a GEMM writes in place, if any (see
    /// [`direct_outputs`]). The cost model's figures follow in brackets (see
    /// `fused_cost`).
    pub fn layout(&self) -> String {
        let threads = rayon::current_num_threads();
        let how = if self.chunks == 1 {
            format!("{} rows: one chunk, kernels on the pool", self.rows)
        } else if self.chunks < threads {
            format!(
                "{} rows: {} chunks of {} rows, kernels on the pool inside each chunk",
                self.rows, self.chunks, self.chunk_rows
            )
        } else {
            format!(
                "{} rows: {} chunks of {} rows, chunks on the pool",
                self.rows, self.chunks, self.chunk_rows
            )
        };
        let direct: usize = self.direct.iter().map(Vec::len).sum();
        let direct = if direct > 0 {
            format!("; {direct} outputs written by their matmul's GEMM (no copy)")
        } else {
            String::new()
        };
        format!("{how}{direct} [{}]", self.cost)
    }

    /// Bytes of scratch memory this plan needs: one set per chunk expected
    /// to run at once (see [`Scratch`], which segments share).
    pub fn scratch_bytes(&self) -> usize {
        self.sets * self.slots.iter().sum::<usize>() * self.chunk_rows * 4
    }

    /// Run the segment: `ins` are the boundary inputs in order, `outs` the
    /// boundary outputs in order. Errors carry the failing parent node.
    /// `packed[i]`, where present, is boundary input `i` packed for
    /// [`gemm_packed`] (a weight), used by the matmuls that read it. Chunks
    /// take their intermediate buffers from `scratch`.
    pub fn run(
        &mut self,
        ins: &[In<'_>],
        packed: &[Option<&PackedB>],
        outs: Vec<Out<'_>>,
        scratch: &Scratch,
    ) -> Result<(), (NodeId, String)> {
        let first = self.ops.first().map(|o| o.0).unwrap_or(NodeId(0));
        let mut outs: Vec<&mut [f32]> = outs
            .into_iter()
            .map(|o| match o {
                Out::F32(v) => Ok(v),
                other => Err((
                    first,
                    format!("segment output is {}, expected f32", other.kind()),
                )),
            })
            .collect::<Result<_, _>>()?;
        let cr = self.chunk_rows;
        let nchunks = self.chunks;
        // Hand each chunk its own disjoint rows of every output.
        let mut per_chunk: Vec<Vec<&mut [f32]>> = (0..nchunks).map(|_| Vec::new()).collect();
        for (o, v) in outs.iter_mut().zip(&self.outputs) {
            for (c, part) in o.chunks_mut(cr * v.width).enumerate() {
                if let Some(slot) = per_chunk.get_mut(c) {
                    slot.push(part);
                }
            }
        }
        let this = &*self;
        let serial = nchunks == 1;
        // Fewer chunks than threads: each chunk's kernels use the pool too.
        let parallel = nchunks < rayon::current_num_threads();
        let work = |(c, mut parts): (usize, Vec<&mut [f32]>)| -> Result<(), (NodeId, String)> {
            let r0 = c * cr;
            let nr = cr.min(this.rows - r0);
            let mut bufs = scratch.take(&this.slots, cr);
            let mut written = vec![false; this.outputs.len()];
            let res = (|| {
                for ((node, op), direct) in this.ops.iter().zip(&this.direct) {
                    let done = !direct.is_empty()
                        && matmul_into_outputs(
                            op,
                            ins,
                            packed,
                            &bufs,
                            r0,
                            nr,
                            parallel,
                            &mut parts,
                            direct,
                            &this.outputs,
                        )
                        .map_err(|m| (*node, m))?;
                    if done {
                        direct.iter().for_each(|&o| written[o] = true);
                    } else {
                        run_fop(op, ins, packed, &mut bufs, r0, nr, parallel)
                            .map_err(|m| (*node, m))?;
                    }
                }
                let bufs = &bufs;
                for ((part, v), _) in parts
                    .iter_mut()
                    .zip(&this.outputs)
                    .zip(&written)
                    .filter(|(_, &w)| !w)
                {
                    if v.width == 0 {
                        continue;
                    }
                    let copy = |r: usize, dst: &mut [f32]| -> Result<(), (NodeId, String)> {
                        dst.copy_from_slice(row(v, ins, bufs, r0, r)?.1);
                        Ok(())
                    };
                    let part = &mut part[..nr * v.width];
                    if serial && nr * v.width >= crate::kernels::PAR_MIN_ELEMS {
                        // One chunk: its kernels ran on every thread, and so
                        // does the copy out (one thread alone is slower than
                        // the Narrow thunks it replaces).
                        let per = nr.div_ceil(rayon::current_num_threads() * 2).max(1);
                        part.par_chunks_mut(per * v.width)
                            .enumerate()
                            .try_for_each(|(c, rows)| {
                                for (i, dst) in rows.chunks_mut(v.width).enumerate() {
                                    copy(c * per + i, dst)?;
                                }
                                Ok(())
                            })?;
                    } else {
                        for (r, dst) in part.chunks_mut(v.width).enumerate() {
                            copy(r, dst)?;
                        }
                    }
                }
                Ok(())
            })();
            scratch.give_back(bufs);
            res
        };
        if serial {
            per_chunk.into_iter().enumerate().try_for_each(work)
        } else {
            per_chunk.into_par_iter().enumerate().try_for_each(work)
        }
    }
}

/// For each op, the boundary outputs it may write straight into the
/// output tensors: a MatMul whose result no op of the plan reads, and
/// which every output viewing it reads as a column window starting on a
/// packed panel (the q, k and v Narrows of a fused QKV projection). Its
/// GEMM then writes those windows and nothing else (see
/// [`matmul_into_outputs`]), instead of filling a scratch slot that the
/// outputs are copied from.
fn direct_outputs(ops: &[(NodeId, FOp)], outputs: &[View]) -> Vec<Vec<usize>> {
    use crate::kernels::packed_gemm::NR;
    ops.iter()
        .enumerate()
        .map(|(i, (_, op))| {
            let FOp::MatMul { a, out, .. } = op else {
                return Vec::new();
            };
            let read = ops.iter().any(|(_, o)| o.reads_slot(*out));
            let rewritten = ops[i + 1..].iter().any(|(_, o)| o.out() == *out);
            if read || rewritten || a.map == RowMap::Const {
                return Vec::new();
            }
            let mine: Vec<usize> = (0..outputs.len())
                .filter(|&o| outputs[o].src == Src::Slot(*out))
                .collect();
            let windows = mine.iter().all(|&o| {
                let v = &outputs[o];
                v.map == RowMap::Local && v.col.is_multiple_of(NR) && v.width > 0
            });
            if windows {
                mine
            } else {
                Vec::new()
            }
        })
        .collect()
}

/// A MatMul's A operand: the data, the offset of this chunk's first row,
/// and the row stride (0 for a row broadcast).
fn a_operand<'a>(
    a: &View,
    ins: &[In<'a>],
    bufs: &'a [Vec<f32>],
    r0: usize,
) -> Result<(&'a [f32], usize, usize), String> {
    let (data, off) = match a.src {
        Src::Slot(s) => (&bufs[s][..], a.col),
        Src::Ext(e) => {
            let base = if a.map == RowMap::Const { 0 } else { r0 };
            (ext_f32(ins, e)?, base * a.stride + a.col)
        }
    };
    let lda = if a.map == RowMap::Const { 0 } else { a.stride };
    Ok((data, off, lda))
}

/// Run MatMul `op` with its GEMM writing this chunk's rows of the outputs
/// `direct` (column windows of its result, [`direct_outputs`]) in place.
/// `Ok(false)` when its weight has no packing of the right shape: the
/// caller then runs it into scratch and copies the outputs as usual.
#[allow(clippy::too_many_arguments)]
fn matmul_into_outputs(
    op: &FOp,
    ins: &[In<'_>],
    packed: &[Option<&PackedB>],
    bufs: &[Vec<f32>],
    r0: usize,
    nr: usize,
    parallel: bool,
    parts: &mut [&mut [f32]],
    direct: &[usize],
    outputs: &[View],
) -> Result<bool, String> {
    let FOp::MatMul {
        a,
        w,
        k,
        n,
        bias,
        act,
        ..
    } = *op
    else {
        return Ok(false);
    };
    let Some(pb) = packed
        .get(w)
        .copied()
        .flatten()
        .filter(|p| p.k() == k && p.n() == n)
    else {
        return Ok(false);
    };
    let (adata, off, lda) = a_operand(&a, ins, bufs, r0)?;
    let b = bias.map(|bv| rowf(&bv, ins, bufs, r0, 0)).transpose()?;
    let mut splits: Vec<ColumnSplit<'_>> = parts
        .iter_mut()
        .enumerate()
        .filter(|(o, _)| direct.contains(o))
        .map(|(o, part)| {
            let v = &outputs[o];
            ColumnSplit {
                col0: v.col,
                cols: v.width,
                c: &mut part[..nr * v.width],
                ldc: v.width,
            }
        })
        .collect();
    gemm_packed_split(nr, &adata[off..], lda, pb, &mut splits, b, act, parallel)
        .map_err(|e| e.to_string())?;
    Ok(true)
}

/// How many input slots read `node`'s value, following the views that the
/// lowering folds (Reshape, Cast, Narrow). `None` if the value escapes as a
/// segment output.
fn reads_through_views(
    g: &Graph,
    users: &[Vec<NodeId>],
    out_set: &[bool],
    node: usize,
) -> Option<usize> {
    if out_set[node] {
        return None;
    }
    let mut total = 0;
    for &u in &users[node] {
        let un = g.node(u);
        if matches!(
            un.op,
            Op::Reshape { .. } | Op::Cast { .. } | Op::Narrow { .. }
        ) {
            total += reads_through_views(g, users, out_set, u.index())?;
        } else {
            total += un.inputs.iter().filter(|i| i.index() == node).count();
        }
    }
    Some(total)
}

/// Run `f(row_index, row)` for rows `0..nr` of `o` (row width `w`), over
/// the rayon pool when `parallel` and the work is large enough.
fn for_rows(
    o: &mut [f32],
    w: usize,
    nr: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [f32]) -> Result<(), String> + Sync + Send,
) -> Result<(), String> {
    if w == 0 || nr == 0 {
        return Ok(());
    }
    let o = &mut o[..nr * w];
    if parallel && nr > 1 && nr * w >= crate::kernels::PAR_MIN_ELEMS {
        let per = nr.div_ceil(rayon::current_num_threads() * 2).max(1);
        o.par_chunks_mut(per * w)
            .enumerate()
            .try_for_each(|(c, chunk)| {
                for (i, row) in chunk.chunks_mut(w).enumerate() {
                    f(c * per + i, row)?;
                }
                Ok(())
            })
    } else {
        for (r, row) in o.chunks_mut(w).enumerate() {
            f(r, row)?;
        }
        Ok(())
    }
}

fn ext_f32<'a>(ins: &[In<'a>], k: usize) -> Result<&'a [f32], String> {
    match ins.get(k) {
        Some(In::F32(v)) => Ok(v),
        Some(other) => Err(format!(
            "boundary input {k} is {}, expected f32",
            other.kind()
        )),
        None => Err(format!("boundary input {k} missing")),
    }
}

/// Row `r` (chunk-local) of a view; returns the source slice and the row.
fn row<'a>(
    v: &View,
    ins: &[In<'a>],
    bufs: &'a [Vec<f32>],
    r0: usize,
    r: usize,
) -> Result<(usize, &'a [f32]), (NodeId, String)> {
    let err = |m: String| (NodeId(0), m);
    let (data, src_row): (&'a [f32], usize) = match v.src {
        Src::Slot(s) => (&bufs[s], r),
        Src::Ext(k) => {
            let d = ext_f32(ins, k).map_err(err)?;
            let gr = r0 + r;
            let sr = match v.map {
                RowMap::Global | RowMap::Local => gr,
                RowMap::Const => 0,
                RowMap::Periodic(p) => gr % p,
            };
            (d, sr)
        }
    };
    let s = src_row * v.stride + v.col;
    data.get(s..s + v.width)
        .map(|x| (src_row, x))
        .ok_or_else(|| err(format!("row {src_row} outside its buffer")))
}

fn rowf<'a>(
    v: &View,
    ins: &[In<'a>],
    bufs: &'a [Vec<f32>],
    r0: usize,
    r: usize,
) -> Result<&'a [f32], String> {
    row(v, ins, bufs, r0, r).map(|x| x.1).map_err(|e| e.1)
}

fn run_fop(
    op: &FOp,
    ins: &[In<'_>],
    packed: &[Option<&PackedB>],
    bufs: &mut [Vec<f32>],
    r0: usize,
    nr: usize,
    parallel: bool,
) -> Result<(), String> {
    let take = |bufs: &mut [Vec<f32>], s: usize| std::mem::take(&mut bufs[s]);
    match *op {
        FOp::MatMul {
            a,
            w,
            k,
            n,
            bias,
            act,
            out,
        } => {
            let mut o = take(bufs, out);
            let wdata = ext_f32(ins, w)?;
            let (adata, off, lda) = a_operand(&a, ins, bufs, r0)?;
            let pb = packed
                .get(w)
                .copied()
                .flatten()
                .filter(|p| p.k() == k && p.n() == n);
            if let Some(pb) = pb {
                let b = bias.map(|bv| rowf(&bv, ins, bufs, r0, 0)).transpose()?;
                let (nrows, lda) = if lda == 0 { (1, k) } else { (nr, lda) };
                gemm_packed(nrows, &adata[off..], lda, pb, &mut o, n, b, act, parallel)
                    .map_err(|e| e.to_string())?;
                for r in nrows..nr {
                    o.copy_within(0..n, r * n);
                }
                bufs[out] = o;
                return Ok(());
            }
            let res = if lda == 0 {
                (0..nr).try_for_each(|r| {
                    matmul::gemm(
                        1,
                        n,
                        k,
                        &adata[off..],
                        k,
                        wdata,
                        n,
                        &mut o[r * n..],
                        n,
                        false,
                        parallel,
                    )
                })
            } else {
                matmul::gemm(
                    nr,
                    n,
                    k,
                    &adata[off..],
                    lda,
                    wdata,
                    n,
                    &mut o,
                    n,
                    false,
                    parallel,
                )
            };
            res.map_err(|e| e.to_string())?;
            if bias.is_some() || act.is_some() {
                let b = match bias {
                    Some(bv) => rowf(&bv, ins, bufs, r0, 0)?.to_vec(),
                    None => vec![0.0; n],
                };
                for_rows(&mut o, n, nr, parallel, |_, row| {
                    matmul::bias_act_rows(row, &b, act);
                    Ok(())
                })?;
            }
            bufs[out] = o;
        }
        FOp::Unary { act, x, out } => {
            let mut o = take(bufs, out);
            let w = x.width;
            let src: &[Vec<f32>] = bufs;
            if x.src == Src::Slot(out) {
                for_rows(&mut o, w, nr, parallel, |_, row| {
                    elementwise::apply_activation(act, row);
                    Ok(())
                })?;
            } else {
                for_rows(&mut o, w, nr, parallel, |r, row| {
                    let xr = rowf(&x, ins, src, r0, r)?;
                    elementwise::activation_into(act, xr, row).map_err(|e| e.to_string())
                })?;
            }
            bufs[out] = o;
        }
        FOp::Binary { op, a, b, out } => {
            let mut o = take(bufs, out);
            let w = a.width.max(b.width);
            let in_place = a.src == Src::Slot(out);
            let src: &[Vec<f32>] = bufs;
            for_rows(&mut o, w, nr, parallel, |r, orow| {
                let br = rowf(&b, ins, src, r0, r)?;
                if !in_place {
                    let ar = rowf(&a, ins, src, r0, r)?;
                    if ar.len() == w {
                        orow.copy_from_slice(ar);
                    } else {
                        orow.fill(ar[0]);
                    }
                }
                if br.len() == w {
                    elementwise::binary_inplace(op, orow, br);
                } else {
                    let y = br[0];
                    for v in orow.iter_mut() {
                        *v = elementwise::binary_scalar(op, *v, y);
                    }
                }
                Ok(())
            })?;
            bufs[out] = o;
        }
        FOp::Norm {
            x,
            residual,
            bias,
            gamma,
            beta,
            eps,
            out,
        } => {
            let mut o = take(bufs, out);
            let d = x.width;
            let g = rowf(&gamma, ins, bufs, r0, 0)?;
            let bt = beta.map(|b| rowf(&b, ins, bufs, r0, 0)).transpose()?;
            let bs = bias.map(|b| rowf(&b, ins, bufs, r0, 0)).transpose()?;
            let src: &[Vec<f32>] = bufs;
            for_rows(&mut o, d, nr, parallel, |r, orow| {
                let xr = rowf(&x, ins, src, r0, r)?;
                let res = match (residual, bt) {
                    (Some(rv), Some(bt)) => {
                        let rr = rowf(&rv, ins, src, r0, r)?;
                        norm::residual_layer_norm_rows(xr, rr, bs, g, bt, eps, orow, d)
                    }
                    (Some(rv), None) => {
                        let rr = rowf(&rv, ins, src, r0, r)?;
                        norm::residual_rms_norm_rows(xr, rr, bs, g, eps, orow, d)
                    }
                    (None, Some(bt)) => norm::layer_norm_rows(xr, g, bt, eps, orow, d),
                    (None, None) => norm::rms_norm_rows(xr, g, eps, orow, d),
                };
                res.map_err(|e| e.to_string())
            })?;
            bufs[out] = o;
        }
        FOp::Softmax { x, out } => {
            let mut o = take(bufs, out);
            let d = x.width;
            let src: &[Vec<f32>] = bufs;
            for_rows(&mut o, d, nr, parallel, |r, orow| {
                let xr = rowf(&x, ins, src, r0, r)?;
                softmax::softmax_rows(xr, orow, d).map_err(|e| e.to_string())
            })?;
            bufs[out] = o;
        }
        FOp::ReduceRow { op, x, out } => {
            let mut o = take(bufs, out);
            for (r, slot) in o.iter_mut().enumerate().take(nr) {
                let xr = rowf(&x, ins, bufs, r0, r)?;
                *slot = match op {
                    // Accumulate in f64 like the Reduce thunk, so hybrid == thunks bit for bit.
                    ReduceOp::Sum => xr.iter().map(|&v| f64::from(v)).sum::<f64>() as f32,
                    ReduceOp::Mean => {
                        (xr.iter().map(|&v| f64::from(v)).sum::<f64>() / xr.len() as f64) as f32
                    }
                    ReduceOp::Max => xr
                        .iter()
                        .copied()
                        .fold(f32::NEG_INFINITY, crate::kernels::simd::max_nan),
                    ReduceOp::Min => xr
                        .iter()
                        .copied()
                        .fold(f32::INFINITY, crate::kernels::simd::min_nan),
                };
            }
            bufs[out] = o;
        }
        FOp::SwiGlu { gate, up, out } => {
            let mut o = take(bufs, out);
            let d = gate.width;
            let src: &[Vec<f32>] = bufs;
            for_rows(&mut o, d, nr, parallel, |r, orow| {
                let gr = rowf(&gate, ins, src, r0, r)?;
                let ur = rowf(&up, ins, src, r0, r)?;
                elementwise::swiglu(gr, ur, orow).map_err(|e| e.to_string())
            })?;
            bufs[out] = o;
        }
        FOp::Gather {
            table,
            ids,
            width,
            vocab,
            out,
        } => {
            let mut o = take(bufs, out);
            let t = ext_f32(ins, table)?;
            for r in 0..nr {
                let id = match ins.get(ids) {
                    Some(In::I64(v)) => v.get(r0 + r).map(|&x| x as i128),
                    Some(In::I32(v)) => v.get(r0 + r).map(|&x| x as i128),
                    _ => None,
                }
                .ok_or_else(|| "gather ids are not i32/i64 covering the rows".to_string())?;
                if id < 0 || id >= vocab as i128 {
                    return Err(format!(
                        "Gather: index {id} out of range for table of {vocab} rows"
                    ));
                }
                let id = id as usize;
                o[r * width..(r + 1) * width].copy_from_slice(&t[id * width..(id + 1) * width]);
            }
            bufs[out] = o;
        }
        FOp::Rope {
            ref spec,
            x,
            pos,
            period,
            out,
        } => {
            let mut o = take(bufs, out);
            let w = x.width;
            if x.src != Src::Slot(out) {
                let src: &[Vec<f32>] = bufs;
                for_rows(&mut o, w, nr, false, |r, row| {
                    row.copy_from_slice(rowf(&x, ins, src, r0, r)?);
                    Ok(())
                })?;
            }
            let at = |r: usize| (r0 + r) % period;
            let positions: Vec<i64> = match ins.get(pos) {
                Some(In::I64(v)) if v.len() == period => (0..nr).map(|r| v[at(r)]).collect(),
                Some(In::I32(v)) if v.len() == period => {
                    (0..nr).map(|r| i64::from(v[at(r)])).collect()
                }
                _ => return Err(format!("rope positions are not {period} i32/i64 values")),
            };
            // The same tables (f64 angles) as the Rope thunk, for this
            // chunk's rows: hybrid equals thunks bit for bit.
            let tables = rope_tables_cached(spec, &positions);
            rope_rows_inplace(spec, &mut o[..nr * w], w, &tables.0, &tables.1, |r| r)
                .map_err(|e| e.to_string())?;
            bufs[out] = o;
        }
        FOp::Concat { ref parts, out } => {
            let mut o = take(bufs, out);
            let w: usize = parts.iter().map(|p| p.width).sum();
            let src: &[Vec<f32>] = bufs;
            for_rows(&mut o, w, nr, parallel, |r, row| {
                let mut at = 0;
                for p in parts {
                    row[at..at + p.width].copy_from_slice(rowf(p, ins, src, r0, r)?);
                    at += p.width;
                }
                Ok(())
            })?;
            bufs[out] = o;
        }
    }
    Ok(())
}
