use super::CompiledSegment;
use rlx_ir::{Graph, NodeId, Op};
use std::collections::HashMap;

/// A compiled segment as a standalone graph.
#[derive(Debug, Clone)]
pub struct SubGraph {
    /// The standalone graph. Its leaves come first, one per boundary input,
    /// in `inputs` order; its outputs are the boundary outputs in order.
    pub graph: Graph,
    /// For each sub-graph leaf (index = sub-graph node id), the parent node it stands for.
    pub inputs: Vec<NodeId>,
    /// For each sub-graph output, the parent node it computes.
    pub outputs: Vec<NodeId>,
    /// Parent node id for every sub-graph node.
    pub parent_of: Vec<NodeId>,
}

/// Build the standalone graph of `seg`.
///
/// Boundary inputs become placeholders: Inputs and Params keep their names,
/// Constants are copied, and computed parents become Inputs named `%<id>`.
pub fn extract(graph: &Graph, seg: &CompiledSegment) -> SubGraph {
    let mut g = Graph::new(format!("{}.seg{}", graph.name, seg.nodes[0].0));
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let mut parent_of = Vec::new();
    for &b in &seg.boundary_inputs {
        let n = graph.node(b);
        let op = match &n.op {
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => n.op.clone(),
            _ => Op::Input {
                name: format!("%{}", b.0),
            },
        };
        map.insert(b, g.add_node(op, vec![], n.shape.clone()));
        parent_of.push(b);
    }
    for &id in &seg.nodes {
        let n = graph.node(id);
        let ins = n.inputs.iter().map(|i| map[i]).collect();
        map.insert(id, g.add_node(n.op.clone(), ins, n.shape.clone()));
        parent_of.push(id);
    }
    g.set_outputs(seg.boundary_outputs.iter().map(|o| map[o]).collect());
    SubGraph {
        graph: g,
        inputs: seg.boundary_inputs.clone(),
        outputs: seg.boundary_outputs.clone(),
        parent_of,
    }
}
