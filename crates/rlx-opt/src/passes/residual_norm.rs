//! Residual add [+ bias] + LayerNorm / RmsNorm fusion.

use super::{binary, is_vec, FusionPlan};
use crate::{OptError, Pass, PassReport, Uses};
use rlx_ir::{BinaryOp, Graph, NodeId, Op};

/// `Add(x, residual) [-> Add(., bias[D])] -> LayerNorm` becomes
/// `FusedResidualLN { has_bias, eps }` over `(x, residual, [bias], gamma,
/// beta)`; the same with RmsNorm gives `FusedResidualRmsNorm` over
/// `(x, residual, [bias], gamma)`.
///
/// Both operands of the residual Add must have the Add's full shape (no
/// broadcasting); the bias must be an f32 `[D]` vector (either operand
/// order); every Add must have one use and not be a graph output; the target
/// must claim the fused op. Patterns: `residual+LayerNorm`,
/// `residual+bias+LayerNorm`, `residual+RmsNorm`, `residual+bias+RmsNorm`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FuseResidualNorm;

/// `(x, residual)` if `id` is an Add of two operands of its own full shape.
fn residual_add(g: &Graph, uses: &Uses, id: NodeId) -> Option<(NodeId, NodeId)> {
    let (a, b) = binary(g, id, BinaryOp::Add)?;
    let s = &g.node(id).shape;
    let ok = uses.single_internal(id) && g.node(a).shape == *s && g.node(b).shape == *s;
    ok.then_some((a, b))
}

impl Pass for FuseResidualNorm {
    fn name(&self) -> &'static str {
        "fuse_residual_norm"
    }

    fn run(
        &self,
        g: &Graph,
        target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let uses = Uses::of(g);
        let mut plan = FusionPlan::default();
        for norm in g.nodes() {
            let (eps, affine, rms) = match norm.op {
                Op::LayerNorm { eps, .. } => (eps, &norm.inputs[1..], false),
                Op::RmsNorm { eps, .. } => (eps, &norm.inputs[1..], true),
                _ => continue,
            };
            let Some(&xin) = norm.inputs.first() else {
                continue;
            };
            let d = norm.shape.last_dim();
            // With a bias: Add(Add(x, r), bias) in either order.
            let with_bias = binary(g, xin, BinaryOp::Add)
                .filter(|_| uses.single_internal(xin))
                .and_then(|(p, q)| {
                    let try_side = |inner: NodeId, bias: NodeId| {
                        if inner == bias || !is_vec(g, bias, d) || g.node(inner).shape != norm.shape
                        {
                            return None;
                        }
                        residual_add(g, &uses, inner).map(|(x, r)| (inner, x, r, bias))
                    };
                    try_side(p, q).or_else(|| try_side(q, p))
                });
            let (intermediates, mut inputs, has_bias) = match with_bias {
                Some((inner, x, r, bias)) => (vec![inner, xin], vec![x, r, bias], true),
                None => match residual_add(g, &uses, xin) {
                    Some((x, r)) => (vec![xin], vec![x, r], false),
                    None => continue,
                },
            };
            inputs.extend_from_slice(affine);
            let (op, name) = if rms {
                (Op::FusedResidualRmsNorm { has_bias, eps }, "RmsNorm")
            } else {
                (Op::FusedResidualLN { has_bias, eps }, "LayerNorm")
            };
            if !target(&op) {
                continue;
            }
            let pattern = if has_bias {
                format!("residual+bias+{name}")
            } else {
                format!("residual+{name}")
            };
            plan.add(&pattern, norm.id, op, inputs, &intermediates);
        }
        plan.apply(self.name(), g)
    }
}
