//! SwiGLU fusion.

use super::{binary, FusionPlan};
use crate::{OptError, Pass, PassReport, Uses};
use rlx_ir::{Activation, BinaryOp, Graph, NodeId, Op};

/// `Mul(Silu(a), b)` (either operand order) becomes `FusedSwiGLU`.
///
/// Packed form: `a = Narrow(x, last, 0, N)`, `b = Narrow(x, last, N, N)` of
/// the same `x` whose last dim is `2N` gives `FusedSwiGLU { packed: true }`
/// over `x`. Otherwise, with `a` and `b` of the same shape, it gives
/// `FusedSwiGLU { packed: false }` over `(a, b)`. The Silu (and in the packed
/// form both Narrows) must have one use and not be graph outputs; the target
/// must claim the fused op. Patterns: `swiglu_packed`, `swiglu`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FuseSwiGlu;

/// `(x, axis, start, len)` if `id` is a Narrow.
fn narrow(g: &Graph, id: NodeId) -> Option<(NodeId, usize, usize, usize)> {
    let n = g.get(id)?;
    match (&n.op, n.inputs.as_slice()) {
        (Op::Narrow { axis, start, len }, &[x]) => Some((x, *axis, *start, *len)),
        _ => None,
    }
}

impl FuseSwiGlu {
    /// Try `mul = silu * b` where `silu = Silu(a)`.
    fn try_match(
        g: &Graph,
        uses: &Uses,
        target: &dyn Fn(&Op) -> bool,
        plan: &mut FusionPlan,
        mul: NodeId,
        silu: NodeId,
        b: NodeId,
    ) -> bool {
        let sn = g.node(silu);
        if sn.op != Op::Activation(Activation::Silu) || silu == b || !uses.single_internal(silu) {
            return false;
        }
        let a = sn.inputs[0];
        // Packed form.
        let packed = Op::FusedSwiGLU { packed: true };
        if let (Some((x, ax, s0, n0)), Some((x2, ax2, s1, n1))) = (narrow(g, a), narrow(g, b)) {
            let xs = &g.node(x).shape;
            let ok = x == x2
                && a != b
                && xs.rank() > 0
                && ax == xs.rank() - 1
                && ax2 == ax
                && s0 == 0
                && s1 == n0
                && n1 == n0
                && xs.last_dim() == 2 * n0
                && uses.single_internal(a)
                && uses.single_internal(b)
                && target(&packed);
            if ok && plan.add("swiglu_packed", mul, packed, vec![x], &[a, silu, b]) {
                return true;
            }
        }
        let op = Op::FusedSwiGLU { packed: false };
        let same = g.node(a).shape == g.node(b).shape && g.node(mul).shape == g.node(a).shape;
        same && target(&op) && plan.add("swiglu", mul, op, vec![a, b], &[silu])
    }
}

impl Pass for FuseSwiGlu {
    fn name(&self) -> &'static str {
        "fuse_swiglu"
    }

    fn run(
        &self,
        g: &Graph,
        target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let uses = Uses::of(g);
        let mut plan = FusionPlan::default();
        for n in g.nodes() {
            let Some((p, q)) = binary(g, n.id, BinaryOp::Mul) else {
                continue;
            };
            if !Self::try_match(g, &uses, target, &mut plan, n.id, p, q) {
                Self::try_match(g, &uses, target, &mut plan, n.id, q, p);
            }
        }
        plan.apply(self.name(), g)
    }
}
