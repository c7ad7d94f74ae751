//! QKV merge: matmuls sharing an lhs against weight leaves become one.

use super::{binary, is_vec};
use crate::{schedule, OptError, Pass, PassReport, Rewriter, Uses};
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Two or more `MatMul(x, W_i)` with the same lhs `x` and weights `W_i`
/// that are Param/Constant leaves of shape f32 `[K, N_i]` become
/// `MatMul(x, Concat{axis: 1}(W_1..W_n))` followed by one
/// `Narrow(last axis)` per original matmul.
///
/// When every matmul of the group (at least two) is read only by
/// `Add(., b_i)` with `b_i` an f32 `[N_i]` Param/Constant, the biases are
/// concatenated too (`Add(merged, Concat{axis: 0}(b_1..b_n))`) and the
/// Narrows replace the Adds, so that `FuseMatMulBiasAct` then yields one
/// fused matmul. The merged nodes are emitted where the first matmul of the
/// group was. The Concat of Params stays a node (runtimes compute
/// param-only subgraphs once); Concats of Constants are folded by
/// `ConstFold`. This pass creates no fused op, so it does not consult the
/// target. Patterns: `qkv` (groups merged) and `qkv_matmuls` (matmuls
/// merged).
#[derive(Debug, Clone, Copy, Default)]
pub struct FuseQkv;

/// One merge: members in id order, and for each the node it stands for
/// (the MatMul itself, or its bias Add) and its bias.
struct Group {
    x: NodeId,
    members: Vec<(NodeId, NodeId, Option<NodeId>)>,
}

fn is_weight(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    matches!(n.op, Op::Param { .. } | Op::Constant { .. })
        && n.shape.rank() == 2
        && n.shape.dtype == DType::F32
}

impl FuseQkv {
    fn groups(g: &Graph) -> Vec<Group> {
        let uses = Uses::of(g);
        let users = g.users_all();
        let mut by_lhs: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
        for n in g.nodes() {
            if n.op == Op::MatMul && n.inputs.len() == 2 {
                let (x, w) = (n.inputs[0], n.inputs[1]);
                let xs = &g.node(x).shape;
                if xs.rank() >= 2 && xs.dtype == DType::F32 && is_weight(g, w) {
                    by_lhs.entry(x).or_default().push(n.id);
                }
            }
        }
        let mut out = Vec::new();
        for (x, mms) in by_lhs {
            if mms.len() < 2 {
                continue;
            }
            let bias_of = |mm: NodeId| -> Option<(NodeId, NodeId)> {
                if !uses.single_internal(mm) {
                    return None;
                }
                let &[add] = users[mm.index()].as_slice() else {
                    return None;
                };
                let (a, b) = binary(g, add, BinaryOp::Add)?;
                let bias = if a == mm { b } else { a };
                let n = g.node(mm).shape.last_dim();
                let leaf = matches!(g.node(bias).op, Op::Param { .. } | Op::Constant { .. });
                (bias != mm && leaf && is_vec(g, bias, n) && g.node(add).shape == g.node(mm).shape)
                    .then_some((add, bias))
            };
            let biased: Vec<_> = mms
                .iter()
                .filter_map(|&m| bias_of(m).map(|ab| (m, ab)))
                .collect();
            let mut plain: Vec<NodeId> = mms.clone();
            if biased.len() >= 2 {
                let taken: HashSet<NodeId> = biased.iter().map(|(m, _)| *m).collect();
                plain.retain(|m| !taken.contains(m));
                out.push(Group {
                    x,
                    members: biased
                        .iter()
                        .map(|&(m, (add, b))| (m, add, Some(b)))
                        .collect(),
                });
            }
            if plain.len() >= 2 {
                out.push(Group {
                    x,
                    members: plain.iter().map(|&m| (m, m, None)).collect(),
                });
            }
        }
        out
    }
}

impl Pass for FuseQkv {
    fn name(&self) -> &'static str {
        "fuse_qkv"
    }

    fn run(
        &self,
        g: &Graph,
        _target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let groups = Self::groups(g);
        let mut report = PassReport::new();
        if groups.is_empty() {
            return Ok((g.clone(), report));
        }
        // First member id -> group; every member matmul is handled by its group.
        let mut at: HashMap<NodeId, &Group> = HashMap::new();
        let mut handled: HashSet<NodeId> = HashSet::new();
        for gr in &groups {
            at.insert(gr.members[0].0, gr);
            for &(m, stand, _) in &gr.members {
                handled.insert(m);
                handled.insert(stand);
            }
        }
        let mut rw = Rewriter::new(self.name(), g);
        for id in schedule(g) {
            if let Some(gr) = at.get(&id) {
                let first = gr.members[0].0;
                let ws: Vec<NodeId> = gr
                    .members
                    .iter()
                    .map(|&(m, _, _)| g.node(m).inputs[1])
                    .collect();
                let wcat = rw.emit_old(Op::Concat { axis: 1 }, &ws, first)?;
                let x = rw.map(gr.x)?;
                let mut merged = rw.emit(Op::MatMul, vec![x, wcat], first)?;
                let biases: Option<Vec<NodeId>> = gr.members.iter().map(|&(_, _, b)| b).collect();
                if let Some(bs) = biases {
                    let bcat = rw.emit_old(Op::Concat { axis: 0 }, &bs, first)?;
                    merged = rw.emit(Op::Binary(BinaryOp::Add), vec![merged, bcat], first)?;
                }
                let axis = rw.graph().node(merged).shape.rank() - 1;
                let mut start = 0;
                for &(m, stand, _) in &gr.members {
                    let len = g.node(m).shape.last_dim();
                    let nar = rw.emit(Op::Narrow { axis, start, len }, vec![merged], m)?;
                    rw.set(stand, nar)?;
                    start += len;
                }
                *report.entry("qkv".into()).or_insert(0) += 1;
                *report.entry("qkv_matmuls".into()).or_insert(0) += gr.members.len();
            } else if !handled.contains(&id) {
                rw.copy(id)?;
            }
        }
        Ok((rw.finish()?, report))
    }
}
