//! The passes. Each is a unit struct (or a struct of settings) implementing
//! [`crate::Pass`].

mod bias_act;
mod cleanup;
mod fold;
mod qkv;
mod residual_norm;
mod swiglu;

pub use bias_act::{FuseMatMulBiasAct, FUSABLE_ACTIVATIONS};
pub use cleanup::{Cse, Dce};
pub use fold::ConstFold;
pub use qkv::FuseQkv;
pub use residual_norm::FuseResidualNorm;
pub use swiglu::FuseSwiGlu;

use crate::{schedule, OptError, PassReport, Rewriter};
use rlx_ir::{BinaryOp, Graph, NodeId, Op};
use std::collections::{BTreeMap, HashSet};

/// Fusions found by one pass: each root becomes one fused node; skipped
/// nodes (the pattern's intermediates) are dropped.
#[derive(Debug, Default)]
pub(crate) struct FusionPlan {
    roots: BTreeMap<NodeId, (Op, Vec<NodeId>)>,
    skip: HashSet<NodeId>,
    read: HashSet<NodeId>,
    report: PassReport,
}

impl FusionPlan {
    /// Whether `id` is already part of a planned fusion.
    pub(crate) fn claimed(&self, id: NodeId) -> bool {
        self.skip.contains(&id) || self.roots.contains_key(&id)
    }

    /// Plan replacing `root` by `op` over OLD `inputs`, dropping `intermediates`.
    /// Refused (returns false) when any involved node is already claimed or an
    /// input is one of the dropped intermediates.
    pub(crate) fn add(
        &mut self,
        pattern: &str,
        root: NodeId,
        op: Op,
        inputs: Vec<NodeId>,
        intermediates: &[NodeId],
    ) -> bool {
        let overlap = self.claimed(root)
            || intermediates.iter().any(|&i| self.claimed(i) || i == root)
            || inputs
                .iter()
                .any(|i| intermediates.contains(i) || self.skip.contains(i) || *i == root)
            || intermediates.iter().any(|i| self.read.contains(i))
            || self.read.contains(&root);
        if overlap {
            return false;
        }
        self.skip.extend(intermediates.iter().copied());
        self.read.extend(inputs.iter().copied());
        self.roots.insert(root, (op, inputs));
        *self.report.entry(pattern.to_string()).or_insert(0) += 1;
        true
    }

    /// Build the new graph.
    pub(crate) fn apply(
        self,
        pass: &'static str,
        g: &Graph,
    ) -> Result<(Graph, PassReport), OptError> {
        if self.roots.is_empty() {
            return Ok((g.clone(), PassReport::new()));
        }
        let mut rw = Rewriter::new(pass, g);
        for id in schedule(g) {
            if self.skip.contains(&id) {
                continue;
            }
            match self.roots.get(&id) {
                Some((op, inputs)) => {
                    let new = rw.emit_old(op.clone(), inputs, id)?;
                    rw.set(id, new)?;
                }
                None => {
                    rw.copy(id)?;
                }
            }
        }
        Ok((rw.finish()?, self.report))
    }
}

/// Every pass verifies its input first, so that a bad graph handed to a
/// pass directly is an error, not a panic.
pub(crate) fn check_input(pass: &'static str, g: &Graph) -> Result<(), OptError> {
    g.verify().map_err(|source| OptError::PassInput {
        pass,
        graph: g.name.clone(),
        source: Box::new(source),
    })
}

/// Whether `op` has an effect beyond its output value (e.g. `CacheWrite`
/// updates a persistent cache in place): such nodes are never removed by
/// DCE, never merged by CSE and never folded.
pub fn has_side_effect(op: &Op) -> bool {
    matches!(op, Op::CacheWrite { .. })
}

/// The two inputs of `id` if it is `Binary(op)`.
pub(crate) fn binary(g: &Graph, id: NodeId, op: BinaryOp) -> Option<(NodeId, NodeId)> {
    let n = g.get(id)?;
    match (&n.op, n.inputs.as_slice()) {
        (Op::Binary(b), &[a, c]) if *b == op => Some((a, c)),
        _ => None,
    }
}

/// Whether `id` is an f32 vector `[d]`.
pub(crate) fn is_vec(g: &Graph, id: NodeId, d: usize) -> bool {
    g.get(id)
        .is_some_and(|n| n.shape.dims == [d] && n.shape.dtype == rlx_ir::DType::F32)
}
