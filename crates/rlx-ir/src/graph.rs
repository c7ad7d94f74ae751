//! The graph and its builder.

use crate::{infer, Activation, IrError, Op, Shape};
use std::collections::HashSet;
use std::fmt;

/// Index of a node in its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The id as a vector index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One operation with its inputs and its recorded output shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Position in `Graph::nodes()`.
    pub id: NodeId,
    /// The operator.
    pub op: Op,
    /// Input nodes, in the op's argument order.
    pub inputs: Vec<NodeId>,
    /// Output shape and dtype.
    pub shape: Shape,
}

/// A dataflow graph. Nodes are stored in insertion order, which is a
/// topological order for any graph that `verify` accepts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    /// Graph name, used in dumps and errors.
    pub name: String,
    nodes: Vec<Node>,
    /// Output nodes, in the order `run` returns them.
    pub outputs: Vec<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// All nodes in schedule order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node with this id. Panics on an id from another graph; use
    /// [`Graph::get`] for untrusted ids.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The node with this id, if it exists.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    /// Ids of the nodes that read `id`, ascending, without duplicates.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.inputs.contains(&id))
            .map(|n| n.id)
            .collect()
    }

    /// For every node, the ids of its users (ascending). O(edges).
    pub fn users_all(&self) -> Vec<Vec<NodeId>> {
        let mut u: Vec<Vec<NodeId>> = vec![Vec::new(); self.nodes.len()];
        for n in &self.nodes {
            for &i in &n.inputs {
                if let Some(list) = u.get_mut(i.index()) {
                    if list.last() != Some(&n.id) {
                        list.push(n.id);
                    }
                }
            }
        }
        u
    }

    /// Append a node and return its id. Builders record; they never reject.
    pub fn add_node(&mut self, op: Op, inputs: Vec<NodeId>, shape: Shape) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            id,
            op,
            inputs,
            shape,
        });
        id
    }

    /// A runtime input.
    pub fn input(&mut self, name: &str, shape: Shape) -> NodeId {
        self.add_node(Op::Input { name: name.into() }, vec![], shape)
    }

    /// A weight.
    pub fn param(&mut self, name: &str, shape: Shape) -> NodeId {
        self.add_node(Op::Param { name: name.into() }, vec![], shape)
    }

    /// A constant.
    pub fn constant(&mut self, value: crate::Tensor) -> NodeId {
        let shape = value.shape.clone();
        self.add_node(Op::Constant { value }, vec![], shape)
    }

    /// `a x b`.
    pub fn matmul(&mut self, a: NodeId, b: NodeId, shape: Shape) -> NodeId {
        self.add_node(Op::MatMul, vec![a, b], shape)
    }

    /// An elementwise activation.
    pub fn activation(&mut self, act: Activation, x: NodeId, shape: Shape) -> NodeId {
        self.add_node(Op::Activation(act), vec![x], shape)
    }

    /// Add a node whose shape is inferred from its inputs. Returns the
    /// inference error instead of recording an ill-formed node.
    pub fn push(&mut self, op: Op, inputs: Vec<NodeId>) -> Result<NodeId, IrError> {
        let id = NodeId(self.nodes.len() as u32);
        let mut shapes = Vec::with_capacity(inputs.len());
        for &i in &inputs {
            match self.get(i) {
                Some(n) => shapes.push(n.shape.clone()),
                None => {
                    return Err(IrError::NotTopological {
                        node: id,
                        op: op.name().into(),
                        input: i,
                    })
                }
            }
        }
        let shape = infer::infer_shape(&op, &shapes).map_err(|expected| IrError::Shape {
            node: id,
            op: op.describe(),
            inputs: shapes.clone(),
            expected,
        })?;
        Ok(self.add_node(op, inputs, shape))
    }

    /// Set the graph outputs.
    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.outputs = outputs;
    }

    /// Check that every input precedes its user (the stored order is topological).
    pub fn check_topological(&self) -> Result<(), IrError> {
        for n in &self.nodes {
            for &i in &n.inputs {
                if i >= n.id {
                    return Err(IrError::NotTopological {
                        node: n.id,
                        op: n.op.name().into(),
                        input: i,
                    });
                }
            }
        }
        Ok(())
    }

    /// Verify the whole graph: topological order, sizes that fit (every
    /// node's byte size is computed with checked arithmetic, else
    /// [`IrError::SizeOverflow`] names the node and shape), unique leaf
    /// names, shape inference for every node against its recorded shape,
    /// and outputs.
    pub fn verify(&self) -> Result<(), IrError> {
        self.check_topological()?;
        let mut inputs = HashSet::new();
        let mut params = HashSet::new();
        for n in &self.nodes {
            // Checked sizes first: nothing downstream (inference, memory
            // planning, allocation) sees a shape whose size overflows.
            if n.shape.checked_size_bytes().is_none() {
                return Err(IrError::SizeOverflow {
                    node: n.id,
                    op: n.op.describe(),
                    shape: n.shape.clone(),
                });
            }
            let (set, kind, name) = match &n.op {
                Op::Input { name } => (&mut inputs, "input", name),
                Op::Param { name } => (&mut params, "param", name),
                _ => {
                    let shapes: Vec<Shape> = n
                        .inputs
                        .iter()
                        .map(|&i| self.node(i).shape.clone())
                        .collect();
                    let inferred =
                        infer::infer_shape(&n.op, &shapes).map_err(|expected| IrError::Shape {
                            node: n.id,
                            op: n.op.describe(),
                            inputs: shapes.clone(),
                            expected,
                        })?;
                    if inferred != n.shape {
                        return Err(IrError::ShapeMismatch {
                            node: n.id,
                            op: n.op.describe(),
                            recorded: n.shape.clone(),
                            inferred,
                        });
                    }
                    continue;
                }
            };
            if !set.insert(name.clone()) {
                return Err(IrError::DuplicateName {
                    node: n.id,
                    kind,
                    name: name.clone(),
                });
            }
        }
        if self.outputs.is_empty() {
            return Err(IrError::NoOutputs(self.name.clone()));
        }
        for &o in &self.outputs {
            if self.get(o).is_none() {
                return Err(IrError::BadOutput(o));
            }
        }
        Ok(())
    }

    /// Count of nodes per op name, leaves included.
    pub fn op_counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut m = std::collections::BTreeMap::new();
        for n in &self.nodes {
            *m.entry(n.op.name()).or_insert(0) += 1;
        }
        m
    }
}

impl fmt::Display for Graph {
    /// One line per node: `%id = Op(attrs) (inputs) -> shape`, then outputs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {} ({} nodes)", self.name, self.nodes.len())?;
        for n in &self.nodes {
            let ins: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
            writeln!(
                f,
                "  {} = {} ({}) -> {}",
                n.id,
                n.op.describe(),
                ins.join(", "),
                n.shape
            )?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|i| i.to_string()).collect();
        writeln!(f, "  outputs: {}", outs.join(", "))
    }
}
