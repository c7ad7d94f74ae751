//! Structured IR errors.

use crate::{NodeId, Shape};

/// An error found while verifying a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    /// An op's inputs do not satisfy its shape rule.
    #[error("node {node} ({op}): inputs [{}] {expected}", fmt_shapes(.inputs))]
    Shape {
        /// Offending node.
        node: NodeId,
        /// Op with attributes.
        op: String,
        /// Shapes and dtypes of its inputs.
        inputs: Vec<Shape>,
        /// What the rule expected.
        expected: String,
    },
    /// The recorded shape of a node differs from the inferred one.
    #[error("node {node} ({op}): recorded shape {recorded} but inputs give {inferred}")]
    ShapeMismatch {
        /// Offending node.
        node: NodeId,
        /// Op name.
        op: String,
        /// Shape given to the builder.
        recorded: Shape,
        /// Shape that inference computed.
        inferred: Shape,
    },
    /// A node reads a node that does not precede it.
    #[error("node {node} ({op}): input {input} is not defined before it (graph is not in topological order)")]
    NotTopological {
        /// Offending node.
        node: NodeId,
        /// Op name.
        op: String,
        /// The bad input reference.
        input: NodeId,
    },
    /// A node's element count or byte size overflows (or exceeds the most
    /// one allocation can hold, `isize::MAX` bytes).
    #[error("node {node} ({op}): shape {shape} is too large: its size in bytes overflows (at most {max} bytes per tensor)", max = isize::MAX)]
    SizeOverflow {
        /// Offending node.
        node: NodeId,
        /// Op with attributes (for a leaf, e.g. `Param(name)`).
        op: String,
        /// The shape and dtype whose size overflows.
        shape: Shape,
    },
    /// A graph-builder argument is out of range (e.g. a sequence longer
    /// than the model's position table).
    #[error("{what} = {value}: expected {expected}")]
    InvalidArgument {
        /// The argument or config key.
        what: String,
        /// Its value.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A graph output refers to no node.
    #[error("graph output {0} does not exist")]
    BadOutput(NodeId),
    /// The graph has no outputs.
    #[error("graph '{0}' has no outputs")]
    NoOutputs(String),
    /// Two leaves share a name.
    #[error("node {node}: duplicate {kind} name '{name}'")]
    DuplicateName {
        /// Second node with the name.
        node: NodeId,
        /// "input" or "param".
        kind: &'static str,
        /// The name.
        name: String,
    },
}

fn fmt_shapes(s: &[Shape]) -> String {
    s.iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
