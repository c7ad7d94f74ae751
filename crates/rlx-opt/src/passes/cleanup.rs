//! Dead-code and common-subexpression elimination.

use super::has_side_effect;
use crate::{schedule, OptError, Pass, PassReport, Rewriter};
use rlx_ir::{Graph, NodeId, Op, Shape, TensorData};
use std::collections::HashMap;

/// Dead-code elimination: drops every node not reachable from the outputs,
/// except Inputs, which are always kept because callers bind them by name,
/// and side-effecting nodes ([`has_side_effect`], e.g. `CacheWrite`) with
/// everything they read.
/// Unused Params and Constants are dropped. Pattern: `removed`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(
        &self,
        g: &Graph,
        _target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let mut live = vec![false; g.len()];
        let mut stack: Vec<NodeId> = g.outputs.clone();
        for n in g.nodes() {
            if matches!(n.op, Op::Input { .. }) || has_side_effect(&n.op) {
                stack.push(n.id);
            }
        }
        while let Some(id) = stack.pop() {
            let Some(n) = g.get(id) else {
                return Err(OptError::BadId {
                    pass: self.name(),
                    id,
                    len: g.len(),
                });
            };
            if !live[id.index()] {
                live[id.index()] = true;
                stack.extend(n.inputs.iter().copied());
            }
        }
        let removed = live.iter().filter(|l| !**l).count();
        let mut report = PassReport::new();
        if removed == 0 {
            return Ok((g.clone(), report));
        }
        let mut rw = Rewriter::new(self.name(), g);
        for n in g.nodes() {
            if live[n.id.index()] {
                rw.copy(n.id)?;
            }
        }
        report.insert("removed".into(), removed);
        Ok((rw.finish()?, report))
    }
}

/// Common-subexpression elimination: a node whose op equals an earlier
/// node's op and whose (already merged) inputs are the same ids is merged
/// into the earlier node. Input and Param leaves never merge (their names are
/// unique); Constants merge only when bit-identical; side-effecting nodes
/// ([`has_side_effect`]) never merge. Pattern: `merged`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cse;

/// Equality for merging: like `==`, but Constants compare bit for bit, so
/// that `0.0` and `-0.0` stay apart and identical NaNs merge.
fn same_op(a: &Op, b: &Op) -> bool {
    match (a, b) {
        (Op::Constant { value: x }, Op::Constant { value: y }) => {
            x.shape == y.shape
                && match (&*x.data, &*y.data) {
                    (TensorData::F32(p), TensorData::F32(q)) => {
                        p.len() == q.len()
                            && p.iter().zip(q).all(|(u, v)| u.to_bits() == v.to_bits())
                    }
                    (p, q) => p == q,
                }
        }
        (Op::Input { .. } | Op::Param { .. }, _) => false,
        _ => a == b,
    }
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(
        &self,
        g: &Graph,
        _target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let mut rw = Rewriter::new(self.name(), g);
        // (op name, new inputs, shape) -> new ids with that key.
        let mut seen: HashMap<(&'static str, Vec<NodeId>, Shape), Vec<NodeId>> = HashMap::new();
        let mut merged = 0usize;
        for id in schedule(g) {
            let n = g.node(id);
            if matches!(n.op, Op::Input { .. } | Op::Param { .. }) || has_side_effect(&n.op) {
                rw.copy(id)?;
                continue;
            }
            let inputs = rw.map_all(&n.inputs)?;
            let key = (n.op.name(), inputs, n.shape.clone());
            let hit = seen.get(&key).and_then(|c| {
                c.iter()
                    .copied()
                    .find(|&c| same_op(&rw.graph().node(c).op, &n.op))
            });
            match hit {
                Some(existing) => {
                    rw.set(id, existing)?;
                    merged += 1;
                }
                None => {
                    let new = rw.copy(id)?;
                    seen.entry(key).or_default().push(new);
                }
            }
        }
        let mut report = PassReport::new();
        if merged == 0 {
            return Ok((g.clone(), report));
        }
        report.insert("merged".into(), merged);
        Ok((rw.finish()?, report))
    }
}
