use rlx_ir::{Graph, NodeId, Op};
use std::fmt;
use std::sync::Arc;

/// Decides which ops may go inside a compiled segment.
#[derive(Clone)]
pub struct SplitPolicy {
    pred: Arc<dyn Fn(&Op) -> bool + Send + Sync>,
    /// Test aid: decline every k-th eligible segment (1-based).
    decline_every: Option<usize>,
}

impl SplitPolicy {
    /// A policy from a predicate: `true` means "may go in a compiled segment".
    pub fn new(pred: impl Fn(&Op) -> bool + Send + Sync + 'static) -> Self {
        SplitPolicy {
            pred: Arc::new(pred),
            decline_every: None,
        }
    }

    /// A testing aid: the planner declines every `k`-th eligible segment
    /// (the `k`-th, `2k`-th, ... in schedule order, before any retry), as
    /// if the backend's segment compiler had, and runs its ops as thunks
    /// with the reason `policy: test hook declines every k-th segment`.
    /// The conformance suite runs every case this way with `k = 2`, so the
    /// thunk fallback between compiled segments is checked on every op.
    /// `k = 0` turns the hook off.
    pub fn decline_every(mut self, k: usize) -> Self {
        self.decline_every = (k > 0).then_some(k);
        self
    }

    /// The reason the planner declines eligible segment `index` (1-based,
    /// schedule order) under [`SplitPolicy::decline_every`], if it does.
    pub fn declines_segment(&self, index: usize) -> Option<String> {
        let k = self.decline_every?;
        index
            .is_multiple_of(k)
            .then(|| format!("policy: test hook declines every {k}-th segment"))
    }

    /// A policy that keeps every op on thunks.
    pub fn all_thunks() -> Self {
        SplitPolicy::new(|_| false)
    }

    /// Whether `op` may go in a compiled segment. Leaves never may.
    pub fn allows(&self, op: &Op) -> bool {
        !op.is_leaf() && (self.pred)(op)
    }

    /// The rule name reported for ops this policy keeps out.
    pub fn rule_for(op: &Op) -> &'static str {
        match op {
            Op::Attention { .. } => "policy: attention reads a length that changes per call",
            Op::GatedDeltaNet { .. } | Op::Lstm { .. } => "policy: recurrent scan stays per-op",
            Op::DequantMatMul { .. } => "policy: packed quantized matmul stays per-op",
            _ => "policy: excluded by the split predicate",
        }
    }
}

impl Default for SplitPolicy {
    /// Keeps Attention, GatedDeltaNet, Lstm and DequantMatMul on thunks.
    fn default() -> Self {
        SplitPolicy::new(|op| {
            !matches!(
                op,
                Op::Attention { .. }
                    | Op::GatedDeltaNet { .. }
                    | Op::Lstm { .. }
                    | Op::DequantMatMul { .. }
            )
        })
    }
}

impl fmt::Debug for SplitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SplitPolicy(..)")
    }
}

/// A run of ops lowered to one dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledSegment {
    /// Ops in the segment, ascending.
    pub nodes: Vec<NodeId>,
    /// Nodes outside the segment that it reads, ascending.
    pub boundary_inputs: Vec<NodeId>,
    /// Segment nodes read outside it or that are graph outputs, ascending.
    pub boundary_outputs: Vec<NodeId>,
}

/// One step of a split schedule.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    /// Thunks `start..end` of the one-thunk-per-node schedule.
    Thunks {
        /// First thunk index (a node index).
        start: usize,
        /// One past the last thunk index.
        end: usize,
    },
    /// A compiled sub-graph.
    Compiled(CompiledSegment),
}

/// Split `graph` by `policy` (see the module docs).
pub fn segment(graph: &Graph, policy: &SplitPolicy) -> Vec<Segment> {
    split_by(graph, |i| policy.allows(&graph.nodes()[i].op))
}

/// Split by a per-node-index eligibility predicate.
pub(crate) fn split_by(graph: &Graph, eligible: impl Fn(usize) -> bool) -> Vec<Segment> {
    let nodes = graph.nodes();
    let mut out: Vec<Segment> = Vec::new();
    let mut run: Vec<NodeId> = Vec::new();
    let users = graph.users_all();
    let flush = |run: &mut Vec<NodeId>, out: &mut Vec<Segment>| {
        if !run.is_empty() {
            out.push(Segment::Compiled(describe(
                graph,
                &users,
                std::mem::take(run),
            )));
        }
    };
    for (i, n) in nodes.iter().enumerate() {
        if n.op.is_leaf() {
            continue;
        }
        if eligible(i) {
            run.push(n.id);
            continue;
        }
        flush(&mut run, &mut out);
        push_thunk(&mut out, nodes, i);
    }
    flush(&mut run, &mut out);
    out
}

/// Append thunk `i`, merging with a previous range when only leaves lie between.
pub(crate) fn push_thunk(out: &mut Vec<Segment>, nodes: &[rlx_ir::Node], i: usize) {
    if let Some(Segment::Thunks { end, .. }) = out.last_mut() {
        if nodes[*end..i].iter().all(|n| n.op.is_leaf()) {
            *end = i + 1;
            return;
        }
    }
    out.push(Segment::Thunks {
        start: i,
        end: i + 1,
    });
}

/// Compute the boundaries of a run of nodes.
pub(crate) fn describe(
    graph: &Graph,
    users: &[Vec<NodeId>],
    nodes: Vec<NodeId>,
) -> CompiledSegment {
    let inside = |id: NodeId| nodes.binary_search(&id).is_ok();
    let mut boundary_inputs: Vec<NodeId> = nodes
        .iter()
        .flat_map(|&n| graph.node(n).inputs.iter().copied())
        .filter(|&i| !inside(i))
        .collect();
    boundary_inputs.sort();
    boundary_inputs.dedup();
    let boundary_outputs = nodes
        .iter()
        .copied()
        .filter(|&n| graph.outputs.contains(&n) || users[n.index()].iter().any(|&u| !inside(u)))
        .collect();
    CompiledSegment {
        nodes,
        boundary_inputs,
        boundary_outputs,
    }
}
