//! Schedule splitting: compiled segments separated by thunk ranges.
//!
//! [`segment`] walks `graph.nodes()` in order. A maximal run of ops that the
//! policy allows becomes one [`Segment::Compiled`]; every other compute op
//! lands in a [`Segment::Thunks`] range that indexes the one-thunk-per-node
//! schedule directly (invariant 1). Leaves are never in a segment.

mod extract;
mod plan;
mod split;

pub use extract::{extract, SubGraph};
pub use plan::{
    build_plan, Decline, HybridPlan, PlanReport, RangeOp, RangeReport, SegmentCompiler,
    SegmentReport, Step,
};
pub use split::{segment, CompiledSegment, Segment, SplitPolicy};
