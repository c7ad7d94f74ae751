//! The lowering context: where each node's data lives ([`Addr`]) and the
//! node being lowered ([`Cx`]).

use crate::fuse::Fusion;
use crate::store::{Dt, Store};
use rlx_ir::{DType, Graph, Node, NodeId, Shape};

/// Ranks above this need more metadata than the kernels read.
pub(super) const MAX_RANK: usize = 8;

/// Where each node's data lives.
pub(crate) trait Addr {
    /// The device address of `id`'s data, if it has one.
    fn addr(&self, id: NodeId) -> Option<u64>;
    /// How `id` is stored (f32 and untransposed unless a plan says otherwise).
    fn store(&self, _id: NodeId) -> Store {
        Store::default()
    }
    /// Whether `id` belongs to a fused elementwise chain.
    fn fusion(&self, _id: NodeId) -> Fusion {
        Fusion::None
    }
    /// The id that device-side errors report for `id`: its id in the
    /// compiled graph (a segment's sub-graph numbers its nodes anew).
    fn graph_id(&self, id: NodeId) -> NodeId {
        id
    }
}

/// Addresses, a storage plan, the fusions and the parent ids of a
/// segment's nodes.
pub(crate) struct Env<F, S, C, P>(pub F, pub S, pub C, pub P);

impl<F, S, C, P> Addr for Env<F, S, C, P>
where
    F: Fn(NodeId) -> Option<u64>,
    S: Fn(NodeId) -> Store,
    C: Fn(NodeId) -> Fusion,
    P: Fn(NodeId) -> NodeId,
{
    fn graph_id(&self, id: NodeId) -> NodeId {
        (self.3)(id)
    }
    fn addr(&self, id: NodeId) -> Option<u64> {
        (self.0)(id)
    }
    fn store(&self, id: NodeId) -> Store {
        (self.1)(id)
    }
    fn fusion(&self, id: NodeId) -> Fusion {
        (self.2)(id)
    }
}

/// Addresses and a storage plan together.
pub(crate) struct WithStore<F, S>(pub F, pub S);

impl<F: Fn(NodeId) -> Option<u64>, S: Fn(NodeId) -> Store> Addr for WithStore<F, S> {
    fn addr(&self, id: NodeId) -> Option<u64> {
        (self.0)(id)
    }
    fn store(&self, id: NodeId) -> Store {
        (self.1)(id)
    }
}

impl<F: Fn(NodeId) -> Option<u64>> Addr for F {
    fn addr(&self, id: NodeId) -> Option<u64> {
        self(id)
    }
}

pub(super) struct Cx<'a, A: Addr> {
    pub(super) graph: &'a Graph,
    pub(super) node: &'a Node,
    pub(super) addr: &'a A,
    pub(super) meta: &'a mut Vec<i32>,
}

impl<A: Addr> Cx<'_, A> {
    pub(super) fn shape(&self, i: usize) -> &Shape {
        &self.graph.node(self.node.inputs[i]).shape
    }
    pub(super) fn input(&self, i: usize) -> Result<u64, String> {
        let id = *self
            .node
            .inputs
            .get(i)
            .ok_or_else(|| format!("missing input {i}"))?;
        self.addr
            .addr(id)
            .ok_or_else(|| format!("input {i} (node {id}) has no device address"))
    }
    pub(super) fn out(&self) -> Result<u64, String> {
        self.addr
            .addr(self.node.id)
            .ok_or_else(|| "output has no device address".to_string())
    }
    pub(super) fn f32_in(&self, i: usize) -> Result<(), String> {
        let s = self.shape(i);
        if s.dtype != DType::F32 {
            return Err(format!("input {i} is {s}; the CUDA kernel takes f32"));
        }
        Ok(())
    }
    pub(super) fn push_meta(&mut self, v: &[i32]) -> usize {
        let at = self.meta.len();
        self.meta.extend_from_slice(v);
        at
    }
    /// Storage element type of input `i`.
    pub(super) fn dt_in(&self, i: usize) -> Dt {
        self.node
            .inputs
            .get(i)
            .map(|&id| self.addr.store(id).dt)
            .unwrap_or_default()
    }
    /// Storage element type of the output.
    pub(super) fn dt_out(&self) -> Dt {
        self.addr.store(self.node.id).dt
    }
    /// Whether the output or any of the first `k` inputs is stored in 16 bits.
    pub(super) fn half_any(&self, k: usize) -> bool {
        self.dt_out() != Dt::F32
            || (0..k.min(self.node.inputs.len())).any(|i| self.dt_in(i) != Dt::F32)
    }
}

/// The error for a family function handed a node of another op.
pub(super) fn wrong_op(node: &Node) -> String {
    format!(
        "node {}: internal error: lowered by the wrong family ({:?})",
        node.id, node.op
    )
}

/// Bytes per output element as stored.
pub(super) fn out_esz<A: Addr>(cx: &Cx<'_, A>) -> usize {
    let s = &cx.node.shape;
    if s.dtype == rlx_ir::DType::F32 {
        cx.dt_out().size()
    } else {
        s.dtype.size_bytes()
    }
}
