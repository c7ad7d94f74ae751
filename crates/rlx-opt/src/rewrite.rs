//! The single place where graph edits happen.
//!
//! A pass never mutates a graph. It walks the old graph (usually in
//! [`schedule`] order), and for every old node either copies it, drops it, or
//! emits replacement nodes and records which new node stands for it. The
//! [`Rewriter`] keeps the old -> new id map, re-runs shape inference for every
//! new node, checks that a replacement has exactly the shape of the node it
//! replaces, remaps the outputs and verifies the result.

use crate::OptError;
use rlx_ir::infer::infer_shape;
use rlx_ir::{Graph, NodeId, Op, Shape};

/// Old node ids in the order passes should visit them: every leaf (Input,
/// Param, Constant) first, then every compute node, each group in original
/// order. Leaves have no inputs, so this is still a topological order; having
/// all leaves up front lets a rewrite emit a node that reads any weight at the
/// position of its first compute user.
pub fn schedule(g: &Graph) -> Vec<NodeId> {
    let leaves = g.nodes().iter().filter(|n| n.op.is_leaf()).map(|n| n.id);
    let compute = g.nodes().iter().filter(|n| !n.op.is_leaf()).map(|n| n.id);
    leaves.chain(compute).collect()
}

/// Builds a new graph from an old one with an old -> new id map.
#[derive(Debug)]
pub struct Rewriter<'a> {
    pass: &'static str,
    old: &'a Graph,
    new: Graph,
    map: Vec<Option<NodeId>>,
}

impl<'a> Rewriter<'a> {
    /// Start rewriting `old` on behalf of the pass named `pass` (used in errors).
    pub fn new(pass: &'static str, old: &'a Graph) -> Self {
        Rewriter {
            pass,
            old,
            new: Graph::new(old.name.clone()),
            map: vec![None; old.len()],
        }
    }

    /// The graph being rewritten.
    pub fn old(&self) -> &'a Graph {
        self.old
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        &self.new
    }

    /// The new node standing for `old`, if one was recorded.
    pub fn mapped(&self, old: NodeId) -> Option<NodeId> {
        self.map.get(old.index()).copied().flatten()
    }

    /// The new node standing for `old`; an error naming `reader` if none.
    fn map_for(&self, old: NodeId, reader: impl FnOnce() -> String) -> Result<NodeId, OptError> {
        if old.index() >= self.map.len() {
            return Err(OptError::BadId {
                pass: self.pass,
                id: old,
                len: self.map.len(),
            });
        }
        self.mapped(old).ok_or_else(|| OptError::Dangling {
            pass: self.pass,
            reader: reader(),
            input: old,
        })
    }

    /// The new node standing for `old`, or a [`OptError::Dangling`] error.
    pub fn map(&self, old: NodeId) -> Result<NodeId, OptError> {
        self.map_for(old, || "a rewrite".to_string())
    }

    /// Map a list of old ids.
    pub fn map_all(&self, old: &[NodeId]) -> Result<Vec<NodeId>, OptError> {
        old.iter().map(|&i| self.map(i)).collect()
    }

    fn old_node(&self, old: NodeId) -> Result<&'a rlx_ir::Node, OptError> {
        self.old.get(old).ok_or(OptError::BadId {
            pass: self.pass,
            id: old,
            len: self.old.len(),
        })
    }

    /// Copy old node `old` with its inputs remapped, re-infer its shape and
    /// record the mapping. Returns the new id.
    pub fn copy(&mut self, old: NodeId) -> Result<NodeId, OptError> {
        let node = self.old_node(old)?;
        let id = match &node.op {
            Op::Input { .. } | Op::Param { .. } => {
                self.new
                    .add_node(node.op.clone(), Vec::new(), node.shape.clone())
            }
            _ => {
                let mut inputs = Vec::with_capacity(node.inputs.len());
                for &i in &node.inputs {
                    inputs.push(
                        self.map_for(i, || format!("node {} ({})", node.id, node.op.name()))?,
                    );
                }
                self.emit(node.op.clone(), inputs, old)?
            }
        };
        self.set(old, id)?;
        Ok(id)
    }

    /// Append a non-leaf-or-Constant node reading NEW ids `inputs`; its shape
    /// is inferred. `origin` is the old node it is built for (for errors).
    pub fn emit(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        origin: NodeId,
    ) -> Result<NodeId, OptError> {
        let mut shapes: Vec<Shape> = Vec::with_capacity(inputs.len());
        for &i in &inputs {
            match self.new.get(i) {
                Some(n) => shapes.push(n.shape.clone()),
                None => {
                    return Err(OptError::BadId {
                        pass: self.pass,
                        id: i,
                        len: self.new.len(),
                    })
                }
            }
        }
        let shape = infer_shape(&op, &shapes).map_err(|expected| OptError::Shape {
            pass: self.pass,
            origin,
            op: op.describe(),
            inputs: shapes.clone(),
            expected,
        })?;
        Ok(self.new.add_node(op, inputs, shape))
    }

    /// Like [`Rewriter::emit`], with OLD input ids that are mapped first.
    pub fn emit_old(
        &mut self,
        op: Op,
        old_inputs: &[NodeId],
        origin: NodeId,
    ) -> Result<NodeId, OptError> {
        let inputs = self.map_all(old_inputs)?;
        self.emit(op, inputs, origin)
    }

    /// Record that new node `new` stands for old node `old`. Their shapes
    /// (dims and dtype) must be equal.
    pub fn set(&mut self, old: NodeId, new: NodeId) -> Result<(), OptError> {
        let o = self.old_node(old)?;
        let n = self.new.get(new).ok_or(OptError::BadId {
            pass: self.pass,
            id: new,
            len: self.new.len(),
        })?;
        if o.shape != n.shape {
            return Err(OptError::ShapeChanged {
                pass: self.pass,
                origin: old,
                expected: o.shape.clone(),
                got: n.shape.clone(),
            });
        }
        self.map[old.index()] = Some(new);
        Ok(())
    }

    /// Remap the outputs and verify the new graph.
    pub fn finish(mut self) -> Result<Graph, OptError> {
        let mut outs = Vec::with_capacity(self.old.outputs.len());
        for &o in &self.old.outputs {
            outs.push(self.map_for(o, || "graph output".to_string())?);
        }
        self.new.set_outputs(outs);
        self.new.verify().map_err(|source| OptError::Verify {
            pass: self.pass,
            source: Box::new(source),
        })?;
        Ok(self.new)
    }
}

/// How many times each node is read: one per input slot that names it, plus
/// one per graph-output slot.
#[derive(Debug, Clone)]
pub struct Uses {
    counts: Vec<usize>,
    output: Vec<bool>,
}

impl Uses {
    /// Count the uses of every node of `g`.
    pub fn of(g: &Graph) -> Self {
        let mut counts = vec![0usize; g.len()];
        let mut output = vec![false; g.len()];
        for n in g.nodes() {
            for &i in &n.inputs {
                if let Some(c) = counts.get_mut(i.index()) {
                    *c += 1;
                }
            }
        }
        for &o in &g.outputs {
            if let Some(c) = counts.get_mut(o.index()) {
                *c += 1;
                output[o.index()] = true;
            }
        }
        Uses { counts, output }
    }

    /// Input slots and output slots that read `id`.
    pub fn count(&self, id: NodeId) -> usize {
        self.counts.get(id.index()).copied().unwrap_or(0)
    }

    /// Whether `id` is a graph output.
    pub fn is_output(&self, id: NodeId) -> bool {
        self.output.get(id.index()).copied().unwrap_or(false)
    }

    /// Whether `id` may disappear inside a fused op: it is read by exactly
    /// one input slot and is not a graph output.
    pub fn single_internal(&self, id: NodeId) -> bool {
        self.count(id) == 1 && !self.is_output(id)
    }
}
