//! The step-aware arena planner (DESIGN.md invariant 2).
//!
//! Time advances in ticks: tick 0 binds the graph inputs, then each compute
//! thunk is one tick and each compiled segment is one atomic tick. A tensor
//! is live from the tick that defines it through the last tick that reads it
//! (inclusive), so a segment's boundary inputs and outputs are all live at its
//! tick and never share memory. Graph outputs stay live to the end. Views
//! alias their source and extend its interval. Slots are reused greedily
//! (first fit by offset) only when the intervals prove them free.

use rlx_ir::{Graph, NodeId, Op};

/// Arena offsets and sizes are multiples of this many bytes.
pub const ALIGN: usize = 64;

/// What happens in one tick.
#[derive(Debug, Clone, PartialEq)]
pub enum Tick {
    /// One thunk: reads the node's inputs, defines the node.
    Node(NodeId),
    /// One compiled segment: reads `inputs`, defines `outputs`, atomically.
    Segment {
        /// Boundary inputs.
        inputs: Vec<NodeId>,
        /// Boundary outputs.
        outputs: Vec<NodeId>,
    },
}

/// Where one tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset in the arena.
    pub offset: usize,
    /// Size in bytes (unpadded).
    pub bytes: usize,
    /// The node that owns the memory (itself, or a view's source).
    pub root: NodeId,
}

/// The result of planning.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Per node: its placement if it lives in the arena. Params, constants
    /// and segment-internal tensors have none.
    pub placements: Vec<Option<Placement>>,
    /// Per root tensor: `(first tick, last tick)` of liveness.
    pub intervals: Vec<Option<(usize, usize)>>,
    /// Arena size in bytes.
    pub arena_bytes: usize,
    /// Sum of all arena tensors' sizes without reuse (views not counted).
    pub naive_bytes: usize,
    /// For each tick, the roots whose last use is that tick (and that are not outputs).
    pub frees: Vec<Vec<NodeId>>,
}

fn round_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Plan the arena for `ticks` (tick `i + 1` is `ticks[i]`).
///
/// `view_of(node)` returns `Some((source, byte_offset))` when the backend
/// executes the node as an alias of `source` at that offset. Nodes for
/// which `outside(node)` holds live outside the arena (e.g. a `CacheWrite`
/// updates its cache param in place) and get no placement.
pub fn plan_memory(
    graph: &Graph,
    ticks: &[Tick],
    view_of: impl Fn(&rlx_ir::Node) -> Option<(NodeId, usize)>,
    outside: impl Fn(&rlx_ir::Node) -> bool,
) -> MemoryPlan {
    let n = graph.len();
    let end = ticks.len() + 1;
    let mut def: Vec<Option<usize>> = vec![None; n];
    let mut last: Vec<usize> = vec![0; n];
    let mut alias: Vec<Option<(NodeId, usize)>> = vec![None; n];
    for node in graph.nodes() {
        if matches!(node.op, Op::Input { .. }) {
            def[node.id.index()] = Some(0);
        }
    }
    let read = |id: NodeId, t: usize, last: &mut Vec<usize>| {
        last[id.index()] = last[id.index()].max(t);
    };
    for (i, tick) in ticks.iter().enumerate() {
        let t = i + 1;
        match tick {
            Tick::Node(id) => {
                let node = graph.node(*id);
                for &inp in &node.inputs {
                    read(inp, t, &mut last);
                }
                if outside(node) {
                    continue;
                }
                if let Some((src, off)) = view_of(node) {
                    if def[src.index()].is_some() {
                        alias[id.index()] = Some((src, off));
                    }
                }
                def[id.index()] = Some(t);
            }
            Tick::Segment { inputs, outputs } => {
                for &inp in inputs {
                    read(inp, t, &mut last);
                }
                for &o in outputs {
                    def[o.index()] = Some(t);
                }
            }
        }
    }
    for &o in &graph.outputs {
        last[o.index()] = end;
    }
    // Resolve aliases to roots and fold the views' lifetimes into them.
    let mut root: Vec<(NodeId, usize)> = (0..n).map(|i| (NodeId(i as u32), 0)).collect();
    for i in 0..n {
        if let Some((src, off)) = alias[i] {
            let (r, roff) = root[src.index()];
            root[i] = (r, roff + off);
        }
    }
    let mut intervals: Vec<Option<(usize, usize)>> = vec![None; n];
    for i in 0..n {
        if let Some(d) = def[i] {
            let r = root[i].0.index();
            let l = last[i].max(d);
            intervals[r] = Some(match intervals[r] {
                Some((d0, l0)) => (d0.min(d), l0.max(l)),
                None => (d, l),
            });
        }
    }
    // Greedy first-fit over offsets, in order of definition.
    let mut order: Vec<usize> = (0..n)
        .filter(|&i| root[i].0.index() == i && intervals[i].is_some())
        .collect();
    let size = |i: usize| graph.nodes()[i].shape.size_bytes();
    order.sort_by_key(|&i| (intervals[i].unwrap().0, std::cmp::Reverse(size(i))));
    let mut offset: Vec<usize> = vec![0; n];
    let mut active: Vec<usize> = Vec::new();
    let mut arena = 0usize;
    let mut naive = 0usize;
    for &i in &order {
        let (d, _) = intervals[i].unwrap();
        active.retain(|&a| intervals[a].unwrap().1 >= d);
        active.sort_by_key(|&a| offset[a]);
        let need = round_up(size(i).max(1));
        naive += need;
        let mut at = 0usize;
        for &a in &active {
            if offset[a] >= at + need {
                break;
            }
            at = at.max(offset[a] + round_up(size(a).max(1)));
        }
        offset[i] = at;
        arena = arena.max(at + need);
        active.push(i);
    }
    let placements = (0..n)
        .map(|i| {
            let (r, off) = root[i];
            intervals[r.index()].map(|_| Placement {
                offset: offset[r.index()] + off,
                bytes: size(i),
                root: r,
            })
        })
        .collect();
    let mut frees = vec![Vec::new(); end + 1];
    for &i in &order {
        let (_, l) = intervals[i].unwrap();
        if l < end {
            frees[l].push(NodeId(i as u32));
        }
    }
    MemoryPlan {
        placements,
        intervals,
        arena_bytes: arena,
        naive_bytes: naive,
        frees,
    }
}

impl MemoryPlan {
    /// Check the plan's safety property: no two root tensors whose live
    /// intervals intersect share a byte. Returns the first offending pair.
    pub fn check_no_overlap(&self) -> Result<(), (NodeId, NodeId)> {
        let roots: Vec<(usize, Placement, (usize, usize))> = self
            .placements
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = (*p)?;
                (p.root.index() == i).then(|| (i, p, self.intervals[i].unwrap()))
            })
            .collect();
        for (x, (i, pi, ii)) in roots.iter().enumerate() {
            for (j, pj, ij) in &roots[x + 1..] {
                let time = ii.0 <= ij.1 && ij.0 <= ii.1;
                let space = pi.offset < pj.offset + pj.bytes.max(1)
                    && pj.offset < pi.offset + pi.bytes.max(1);
                if time && space {
                    return Err((NodeId(*i as u32), NodeId(*j as u32)));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::op::{Activation, BinaryOp};
    use rlx_ir::Shape;

    // The CUDA backend uploads all inputs with one copy over the arena span
    // of their slots; that is sound only because nothing but the inputs (and
    // their views) is live at tick 0.
    #[test]
    fn only_inputs_are_live_at_tick_zero() {
        let mut g = Graph::new("t");
        let a = g.input("a", Shape::f32(&[3, 5]));
        let w = g.param("w", Shape::f32(&[5, 7]));
        let b = g.input("b", Shape::f32(&[3, 7]));
        let c = g.input("c", Shape::f32(&[1]));
        let m = g.push(Op::MatMul, vec![a, w]).unwrap();
        let s = g.push(Op::Binary(BinaryOp::Add), vec![m, b]).unwrap();
        let r = g.push(Op::Activation(Activation::Relu), vec![s]).unwrap();
        let o = g.push(Op::Binary(BinaryOp::Mul), vec![r, c]).unwrap();
        g.set_outputs(vec![o]);
        let ticks: Vec<Tick> = [m, s, r, o].into_iter().map(Tick::Node).collect();
        let plan = plan_memory(&g, &ticks, |_| None, |_| false);
        plan.check_no_overlap().unwrap();
        for node in g.nodes() {
            let Some(p) = plan.placements[node.id.index()] else {
                continue;
            };
            let (first, _) = plan.intervals[p.root.index()].unwrap();
            let is_input = matches!(g.node(p.root).op, Op::Input { .. });
            assert_eq!(first == 0, is_input, "{:?} starts at tick {first}", node.op);
        }
        // The three inputs are placed, each at a distinct slot.
        let slots: Vec<usize> = [a, b, c]
            .iter()
            .map(|i| plan.placements[i.index()].unwrap().offset)
            .collect();
        assert!(slots[0] != slots[1] && slots[1] != slots[2] && slots[0] != slots[2]);
    }
}
