//! Typed optimizer errors.

use rlx_ir::{IrError, NodeId, Shape};

/// An error raised by a pass or by [`crate::optimize`].
///
/// Every variant names the pass, the node (old-graph id unless stated) and
/// what was expected, so that a failure points at the offending rewrite.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptError {
    /// The graph handed to the optimizer does not verify.
    #[error("input graph '{graph}' does not verify: {source}")]
    InvalidInput {
        /// Graph name.
        graph: String,
        /// The verification error.
        #[source]
        source: Box<IrError>,
    },
    /// The graph handed to a pass does not verify.
    #[error("pass '{pass}': input graph '{graph}' does not verify: {source}")]
    PassInput {
        /// Pass name.
        pass: &'static str,
        /// Graph name.
        graph: String,
        /// The verification error.
        #[source]
        source: Box<IrError>,
    },
    /// A node built by a pass fails shape inference.
    #[error("pass '{pass}': new node for {origin} ({op}) with inputs [{}] fails shape inference: {expected}", fmt_shapes(.inputs))]
    Shape {
        /// Pass name.
        pass: &'static str,
        /// Old node the new node was built for.
        origin: NodeId,
        /// Op with attributes.
        op: String,
        /// Shapes of the new node's inputs.
        inputs: Vec<Shape>,
        /// What the shape rule expected.
        expected: String,
    },
    /// A pass mapped an old node onto a new node of another shape.
    #[error(
        "pass '{pass}': node {origin} of shape {expected} was replaced by a node of shape {got}"
    )]
    ShapeChanged {
        /// Pass name.
        pass: &'static str,
        /// Old node.
        origin: NodeId,
        /// Shape of the old node.
        expected: Shape,
        /// Shape of its replacement.
        got: Shape,
    },
    /// A node (or a graph output) reads an old node that the pass dropped.
    #[error(
        "pass '{pass}': {reader} reads old node {input}, which was dropped without a replacement"
    )]
    Dangling {
        /// Pass name.
        pass: &'static str,
        /// Who reads it: `node %N (Op)` or `graph output`.
        reader: String,
        /// The dropped old node.
        input: NodeId,
    },
    /// A node id does not exist in the graph it was used with.
    #[error("pass '{pass}': node id {id} does not exist (graph has {len} nodes)")]
    BadId {
        /// Pass name.
        pass: &'static str,
        /// The bad id.
        id: NodeId,
        /// Node count of the graph.
        len: usize,
    },
    /// The graph produced by a pass does not verify.
    #[error("pass '{pass}' produced a graph that does not verify: {source}")]
    Verify {
        /// Pass name.
        pass: &'static str,
        /// The verification error.
        #[source]
        source: Box<IrError>,
    },
}

fn fmt_shapes(s: &[Shape]) -> String {
    s.iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
