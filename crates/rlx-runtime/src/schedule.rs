//! The thunk schedule: exactly one thunk per graph node, in node order
//! (DESIGN.md invariant 1), so a `Thunks { start, end }` range indexes it
//! directly.

use rlx_ir::{Graph, NodeId};

/// One entry of the thunk schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thunk {
    /// A leaf (Input, Param, Constant): bound by the executor, no dispatch.
    Nop(NodeId),
    /// A compute node: one kernel dispatch.
    Op(NodeId),
}

impl Thunk {
    /// The node this thunk stands for.
    pub fn node(self) -> NodeId {
        match self {
            Thunk::Nop(n) | Thunk::Op(n) => n,
        }
    }
}

/// One thunk per node of a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThunkSchedule {
    /// `thunks[i]` is node `i`.
    pub thunks: Vec<Thunk>,
}

impl ThunkSchedule {
    /// The schedule of `graph`.
    pub fn new(graph: &Graph) -> Self {
        ThunkSchedule {
            thunks: graph
                .nodes()
                .iter()
                .map(|n| {
                    if n.op.is_leaf() {
                        Thunk::Nop(n.id)
                    } else {
                        Thunk::Op(n.id)
                    }
                })
                .collect(),
        }
    }

    /// Dispatches of `thunks[start..end]` (Nops excluded).
    pub fn dispatches(&self, start: usize, end: usize) -> usize {
        self.thunks[start..end]
            .iter()
            .filter(|t| matches!(t, Thunk::Op(_)))
            .count()
    }
}
