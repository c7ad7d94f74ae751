//! rlx-ir: the graph IR of rlx.
//!
//! A [`Graph`] is a list of [`Node`]s in topological order. Builders record
//! nodes without checking them; [`Graph::verify`] runs shape inference on
//! every node and returns a structured [`IrError`]. The `rlx-ref` crate holds the naive
//! reference interpreter that every backend is tested against.

#![deny(missing_docs)]

pub mod cost;
mod dtype;
mod error;
mod formula;
mod graph;
pub mod infer;
pub mod op;
mod shape;
mod tensor;

pub use dtype::DType;
pub use error::IrError;
pub use formula::Formula;
pub use graph::{Graph, Node, NodeId};
pub use op::{
    Activation, ActivationPrecision, BinaryOp, MaskKind, Op, QuantScheme, ReduceOp, RopeStyle,
};
pub use shape::{broadcast_dims, contiguous_strides, Shape};
pub use tensor::{Tensor, TensorData};
