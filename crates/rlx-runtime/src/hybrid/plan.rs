use super::split::{describe, push_thunk, split_by};
use super::{extract, CompiledSegment, Segment, SplitPolicy, SubGraph};
use rlx_ir::{Graph, Node, NodeId};

/// Why a segment compiler does not take a node or a segment: its reason,
/// and the node it is about when one node is the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decline {
    /// What the compiler lacks (shapes, dtypes, the op), for the plan.
    pub reason: String,
    /// The node that caused it (an id of the graph the planner split), if
    /// one did.
    pub node: Option<NodeId>,
}

impl Decline {
    /// A decline caused by `node`.
    pub fn at(node: NodeId, reason: impl Into<String>) -> Decline {
        Decline {
            reason: reason.into(),
            node: Some(node),
        }
    }
}

impl std::fmt::Display for Decline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl From<String> for Decline {
    fn from(reason: String) -> Decline {
        Decline { reason, node: None }
    }
}

impl From<&str> for Decline {
    fn from(reason: &str) -> Decline {
        Decline::from(reason.to_string())
    }
}

/// A backend's segment compiler.
pub trait SegmentCompiler {
    /// The backend's lowered form of one segment.
    type Lowered;

    /// Name used in reports.
    fn name(&self) -> &'static str;

    /// Capability: `Ok` when this compiler can take `node` (seen in its
    /// graph, so shapes count), or the reason it cannot.
    fn claims(&self, graph: &Graph, node: &Node) -> Result<(), Decline>;

    /// Lower one extracted segment, or say why not.
    fn try_lower(&self, sub: &SubGraph) -> Result<Self::Lowered, Decline>;
}

/// One executable step.
#[derive(Debug)]
pub enum Step<L> {
    /// Thunks `start..end`, indexing `graph.nodes()`.
    Thunks {
        /// First node index.
        start: usize,
        /// One past the last node index.
        end: usize,
    },
    /// A lowered segment.
    Compiled {
        /// Which nodes and boundaries.
        segment: CompiledSegment,
        /// The extracted sub-graph it was lowered from.
        sub: SubGraph,
        /// The backend's plan.
        lowered: L,
    },
}

/// Why an op in a thunk range is there.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeOp {
    /// The node.
    pub node: NodeId,
    /// Op name.
    pub op: &'static str,
    /// The rule that kept it out of a compiled segment.
    pub reason: String,
}

/// One thunk range, explained.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeReport {
    /// First node index.
    pub start: usize,
    /// One past the last node index.
    pub end: usize,
    /// Compute ops in the range (leaves omitted) and why each stayed out.
    pub ops: Vec<RangeOp>,
}

/// One compiled segment, summarized.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentReport {
    /// Ops in the segment.
    pub nodes: usize,
    /// First and last node.
    pub first: NodeId,
    /// Last node.
    pub last: NodeId,
    /// Boundary inputs.
    pub boundary_inputs: Vec<NodeId>,
    /// Boundary outputs.
    pub boundary_outputs: Vec<NodeId>,
}

/// What a compile did (DESIGN.md invariant 5).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanReport {
    /// Compiled segments in the plan.
    pub compiled_segments: usize,
    /// Thunk ranges in the plan.
    pub thunk_ranges: usize,
    /// Dispatches per run: one per compiled segment plus one per compute thunk.
    pub dispatches: usize,
    /// Dispatches the same graph takes on thunks alone.
    pub dispatches_thunks_only: usize,
    /// Every thunk range, in order, explained.
    pub ranges: Vec<RangeReport>,
    /// Every compiled segment, in order.
    pub segments: Vec<SegmentReport>,
    /// Segments (or single nodes of a split segment) the backend declined
    /// and that run as thunks, by first node, with its reason.
    pub declined: Vec<(NodeId, String)>,
    /// Segments the backend declined whole and the planner retried as
    /// smaller compiled pieces, by first node, with the reason the whole
    /// was declined (`segments` lists the pieces).
    pub split: Vec<(NodeId, String)>,
}

/// A split, lowered schedule.
#[derive(Debug)]
pub struct HybridPlan<L> {
    /// Steps in execution order.
    pub steps: Vec<Step<L>>,
    /// What the planner did.
    pub report: PlanReport,
}

impl<L> HybridPlan<L> {
    /// The memory planner's ticks for this plan: one per compute thunk, one
    /// per compiled segment (atomic), in execution order.
    pub fn ticks(&self, graph: &Graph) -> Vec<crate::memory::Tick> {
        use crate::memory::Tick;
        let mut ticks = Vec::new();
        for s in &self.steps {
            match s {
                Step::Thunks { start, end } => ticks.extend(
                    graph.nodes()[*start..*end]
                        .iter()
                        .filter(|n| !n.op.is_leaf())
                        .map(|n| Tick::Node(n.id)),
                ),
                Step::Compiled { segment, .. } => ticks.push(Tick::Segment {
                    inputs: segment.boundary_inputs.clone(),
                    outputs: segment.boundary_outputs.clone(),
                }),
            }
        }
        ticks
    }

    /// The all-thunks plan for `graph` (no compiled step).
    pub fn thunks_only(graph: &Graph) -> Self {
        let reasons = vec![Some("mode: thunks".to_string()); graph.len()];
        let segs = split_by(graph, |_| false);
        finish(
            graph,
            segs.into_iter().map(as_thunk_step).collect(),
            &reasons,
            vec![],
        )
    }
}

fn as_thunk_step<L>(s: Segment) -> Step<L> {
    match s {
        Segment::Thunks { start, end } => Step::Thunks { start, end },
        Segment::Compiled(_) => unreachable!("split_by with a false predicate yields only thunks"),
    }
}

/// Split `graph` by `policy` and the compiler's capability, then lower each
/// segment.
///
/// A segment the compiler declines is retried as its maximal compilable
/// sub-segments (see `lower_pieces`): only the nodes that no piece can
/// hold run as thunks, each with its own reason. A segment (or piece) whose
/// values nothing reads is compiled with its last node as output, as seed
/// 002 does (docs/DESIGN.md, "Dead segments"). Every thunk keeps its own
/// reason, also when nothing compiles.
pub fn build_plan<C: SegmentCompiler>(
    graph: &Graph,
    policy: &SplitPolicy,
    compiler: &C,
) -> HybridPlan<C::Lowered> {
    let mut reasons: Vec<Option<String>> = graph
        .nodes()
        .iter()
        .map(|n| {
            if n.op.is_leaf() {
                None
            } else if !policy.allows(&n.op) {
                Some(SplitPolicy::rule_for(&n.op).to_string())
            } else {
                compiler
                    .claims(graph, n)
                    .err()
                    .map(|why| format!("capability: {} does not take it: {why}", compiler.name()))
            }
        })
        .collect();
    let segs = split_by(graph, |i| reasons[i].is_none());
    let mut steps: Vec<Step<C::Lowered>> = Vec::new();
    let mut declined = Vec::new();
    let mut thunks: Vec<Segment> = Vec::new();
    let users = graph.users_all();
    let mut seg_index = 0usize;
    let mut split = Vec::new();
    for s in segs {
        match s {
            Segment::Thunks { start, end } => {
                for i in start..end {
                    push_thunk_step(&mut steps, &mut thunks, graph, i);
                }
            }
            Segment::Compiled(seg) => {
                seg_index += 1;
                if let Some(why) = policy.declines_segment(seg_index) {
                    for &n in &seg.nodes {
                        reasons[n.index()] = Some(why.clone());
                        push_thunk_step(&mut steps, &mut thunks, graph, n.index());
                    }
                    declined.push((seg.nodes[0], why));
                    continue;
                }
                let (pieces, whole_why) = lower_pieces(graph, &users, compiler, &seg.nodes);
                if let Some(why) = whole_why {
                    split.push((seg.nodes[0], why));
                }
                for piece in pieces {
                    match piece {
                        Piece::Compiled(segment, sub, lowered) => steps.push(Step::Compiled {
                            segment,
                            sub,
                            lowered,
                        }),
                        Piece::Declined(nodes, why) => {
                            for &n in &nodes {
                                reasons[n.index()] =
                                    Some(format!("declined: {} segment: {why}", compiler.name()));
                                push_thunk_step(&mut steps, &mut thunks, graph, n.index());
                            }
                            declined.push((nodes[0], why));
                        }
                    }
                }
            }
        }
    }
    let mut plan = finish(graph, steps, &reasons, declined);
    plan.report.split = split;
    plan
}

/// A part of a segment after lowering: compiled, or declined with the
/// compiler's reason.
enum Piece<L> {
    Compiled(CompiledSegment, SubGraph, L),
    Declined(Vec<NodeId>, String),
}

/// The boundaries of `nodes`; a run whose values nothing reads (a dead
/// segment) gets its last node as output, so it still lowers.
fn describe_live(graph: &Graph, users: &[Vec<NodeId>], nodes: Vec<NodeId>) -> CompiledSegment {
    let mut seg = describe(graph, users, nodes);
    if seg.boundary_outputs.is_empty() {
        seg.boundary_outputs
            .push(*seg.nodes.last().expect("segments are non-empty"));
    }
    seg
}

/// Lower `nodes` (one eligible run, ascending) as one segment, or, when the
/// compiler declines it, as its maximal compilable sub-segments.
///
/// From the first node not yet placed: if that node alone does not lower,
/// it is declined with the reason the compiler gave for it alone;
/// otherwise the longest run from it that lowers is found by bisection and
/// compiled (it lowers and one node more does not). Attempts grow as
/// `pieces * log2(n)`, and only for a segment that was declined whole.
/// Returns the pieces in order and, when the whole was declined, why.
fn lower_pieces<C: SegmentCompiler>(
    graph: &Graph,
    users: &[Vec<NodeId>],
    compiler: &C,
    nodes: &[NodeId],
) -> (Vec<Piece<C::Lowered>>, Option<String>) {
    let attempt = |run: &[NodeId]| {
        let seg = describe_live(graph, users, run.to_vec());
        let sub = extract(graph, &seg);
        compiler
            .try_lower(&sub)
            .map(|lowered| (seg, sub, lowered))
            .map_err(|d| d.reason)
    };
    let whole_why = match attempt(nodes) {
        Ok((seg, sub, lowered)) => return (vec![Piece::Compiled(seg, sub, lowered)], None),
        Err(why) => why,
    };
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let mut best = match attempt(&nodes[i..i + 1]) {
            Ok(ok) => (i + 1, ok),
            Err(why) => {
                match pieces.last_mut() {
                    Some(Piece::Declined(ns, w)) if *w == why => ns.push(nodes[i]),
                    _ => pieces.push(Piece::Declined(vec![nodes[i]], why)),
                }
                i += 1;
                continue;
            }
        };
        // Invariant: nodes[i..best.0] lowers, nodes[i..bad] does not (the
        // whole run failed when i == 0; past the end counts as failing).
        let mut bad = if i == 0 { nodes.len() } else { nodes.len() + 1 };
        while bad - best.0 > 1 {
            let mid = best.0 + (bad - best.0) / 2;
            match attempt(&nodes[i..mid]) {
                Ok(ok) => best = (mid, ok),
                Err(_) => bad = mid,
            }
        }
        let (end, (seg, sub, lowered)) = best;
        pieces.push(Piece::Compiled(seg, sub, lowered));
        i = end;
    }
    (pieces, Some(whole_why))
}

fn push_thunk_step<L>(
    steps: &mut Vec<Step<L>>,
    scratch: &mut Vec<Segment>,
    graph: &Graph,
    i: usize,
) {
    scratch.clear();
    if let Some(Step::Thunks { start, end }) = steps.last() {
        scratch.push(Segment::Thunks {
            start: *start,
            end: *end,
        });
        steps.pop();
    }
    push_thunk(scratch, graph.nodes(), i);
    for s in scratch.drain(..) {
        steps.push(as_thunk_step(s));
    }
}

fn finish<L>(
    graph: &Graph,
    steps: Vec<Step<L>>,
    reasons: &[Option<String>],
    declined: Vec<(NodeId, String)>,
) -> HybridPlan<L> {
    let compute =
        |r: std::ops::Range<usize>| graph.nodes()[r].iter().filter(|n| !n.op.is_leaf()).count();
    let mut report = PlanReport {
        dispatches_thunks_only: compute(0..graph.len()),
        declined,
        ..Default::default()
    };
    for s in &steps {
        match s {
            Step::Thunks { start, end } => {
                report.thunk_ranges += 1;
                report.dispatches += compute(*start..*end);
                let ops = graph.nodes()[*start..*end]
                    .iter()
                    .filter(|n| !n.op.is_leaf())
                    .map(|n| RangeOp {
                        node: n.id,
                        op: n.op.name(),
                        reason: reasons[n.id.index()].clone().unwrap_or_default(),
                    })
                    .collect();
                report.ranges.push(RangeReport {
                    start: *start,
                    end: *end,
                    ops,
                });
            }
            Step::Compiled { segment, .. } => {
                report.compiled_segments += 1;
                report.dispatches += 1;
                report.segments.push(SegmentReport {
                    nodes: segment.nodes.len(),
                    first: segment.nodes[0],
                    last: *segment.nodes.last().expect("segments are non-empty"),
                    boundary_inputs: segment.boundary_inputs.clone(),
                    boundary_outputs: segment.boundary_outputs.clone(),
                });
            }
        }
    }
    HybridPlan { steps, report }
}
