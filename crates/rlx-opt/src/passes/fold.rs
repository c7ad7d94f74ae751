//! Constant folding through the reference interpreter.

use crate::{schedule, OptError, Pass, PassReport, Rewriter};
use rlx_ir::{Graph, NodeId, Op, Tensor};
use std::collections::HashMap;

/// Constant folding: a compute node whose inputs are all Constants (after
/// folding earlier nodes) is evaluated with `rlx_ref::run`, the reference
/// interpreter that defines op semantics, and replaced by a Constant.
/// Nodes whose work would exceed `max_elements` (elements produced; for
/// matmuls and attention, multiply-adds), and nodes the interpreter cannot
/// evaluate, are left in place. Pattern: `folded`.
#[derive(Debug, Clone, Copy)]
pub struct ConstFold {
    /// Most work folded for one node: elements produced, or multiply-adds
    /// for MatMul, FusedMatMulBiasAct and Attention.
    pub max_elements: usize,
}

impl Default for ConstFold {
    fn default() -> Self {
        ConstFold {
            max_elements: 16 << 20,
        }
    }
}

/// Work of evaluating node `n` of `g`: output elements, times the reduced
/// length for matmuls and attention.
fn work(g: &Graph, n: &rlx_ir::Node) -> usize {
    let out = n.shape.numel();
    let inner = match n.op {
        Op::MatMul | Op::FusedMatMulBiasAct { .. } => {
            n.inputs.first().map_or(1, |&a| g.node(a).shape.last_dim())
        }
        Op::Attention { .. } => n
            .inputs
            .get(1)
            .map_or(1, |&k| g.node(k).shape.dims.get(1).copied().unwrap_or(1)),
        _ => 1,
    };
    out.saturating_mul(inner.max(1))
}

impl ConstFold {
    /// Evaluate `op` on constant `args`; `None` if the interpreter declines
    /// or returns a value that does not fill `shape`.
    fn eval(op: &Op, args: Vec<Tensor>, shape: &rlx_ir::Shape) -> Option<Tensor> {
        let mut tiny = Graph::new("const_fold");
        let ids: Vec<NodeId> = args.into_iter().map(|t| tiny.constant(t)).collect();
        let out = tiny.add_node(op.clone(), ids, shape.clone());
        tiny.set_outputs(vec![out]);
        tiny.verify().ok()?;
        let mut vals = rlx_ref::run(&tiny, &HashMap::new()).ok()?;
        if vals.len() != 1 {
            return None;
        }
        let v = vals.pop()?;
        v.data.fits(shape).then(|| Tensor {
            shape: shape.clone(),
            data: v.data,
        })
    }
}

impl Pass for ConstFold {
    fn name(&self) -> &'static str {
        "const_fold"
    }

    fn run(
        &self,
        g: &Graph,
        _target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let mut rw = Rewriter::new(self.name(), g);
        let mut folded = 0usize;
        for id in schedule(g) {
            let n = g.node(id);
            if n.op.is_leaf()
                || n.inputs.is_empty()
                || super::has_side_effect(&n.op)
                || work(g, n) > self.max_elements
            {
                rw.copy(id)?;
                continue;
            }
            let inputs = rw.map_all(&n.inputs)?;
            let args: Option<Vec<Tensor>> = inputs
                .iter()
                .map(|&i| match &rw.graph().node(i).op {
                    Op::Constant { value } => Some(value.clone()),
                    _ => None,
                })
                .collect();
            match args.and_then(|a| Self::eval(&n.op, a, &n.shape)) {
                Some(value) => {
                    let c = rw.emit(Op::Constant { value }, Vec::new(), id)?;
                    rw.set(id, c)?;
                    folded += 1;
                }
                None => {
                    rw.copy(id)?;
                }
            }
        }
        let mut report = PassReport::new();
        if folded == 0 {
            return Ok((g.clone(), report));
        }
        report.insert("folded".into(), folded);
        Ok((rw.finish()?, report))
    }
}
