//! MatMul + bias [+ activation] fusion.

use super::{binary, is_vec, FusionPlan};
use crate::{OptError, Pass, PassReport, Uses};
use rlx_ir::{Activation, BinaryOp, Graph, Op};

/// Activations that may be fused into `FusedMatMulBiasAct`.
pub const FUSABLE_ACTIVATIONS: [Activation; 4] = [
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Relu,
    Activation::Silu,
];

/// `MatMul(x, W) -> Add(., bias[N]) [-> Activation(act)]` becomes
/// `FusedMatMulBiasAct { activation }` over `(x, W, bias)`.
///
/// Fires when the MatMul has exactly one use (the Add) and is not a graph
/// output, the bias is an f32 `[N]` vector (either Add operand order) with N
/// the matmul's last dim, and the target claims the fused op. The activation
/// is absorbed when it is in [`FUSABLE_ACTIVATIONS`], the Add has one use
/// and is not an output, and the target claims the op with that activation;
/// otherwise the fusion stops at the Add.
/// Patterns: `matmul+bias`, `matmul+bias+<Activation>` (e.g. `matmul+bias+Gelu`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FuseMatMulBiasAct;

impl Pass for FuseMatMulBiasAct {
    fn name(&self) -> &'static str {
        "fuse_matmul_bias_act"
    }

    fn run(
        &self,
        g: &Graph,
        target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, PassReport), OptError> {
        super::check_input(self.name(), g)?;
        let uses = Uses::of(g);
        let users = g.users_all();
        let mut plan = FusionPlan::default();
        for mm in g.nodes() {
            if mm.op != Op::MatMul || !uses.single_internal(mm.id) {
                continue;
            }
            let &[add] = users[mm.id.index()].as_slice() else {
                continue;
            };
            let Some((a, b)) = binary(g, add, BinaryOp::Add) else {
                continue;
            };
            let n = mm.shape.last_dim();
            let bias = if a == mm.id && b != mm.id && is_vec(g, b, n) {
                b
            } else if b == mm.id && a != mm.id && is_vec(g, a, n) {
                a
            } else {
                continue;
            };
            if g.node(add).shape != mm.shape {
                continue;
            }
            let inputs = vec![mm.inputs[0], mm.inputs[1], bias];
            // Try to absorb the activation that follows.
            let act = match users[add.index()].as_slice() {
                &[u] if uses.single_internal(add) => match g.node(u).op {
                    Op::Activation(act) if FUSABLE_ACTIVATIONS.contains(&act) => {
                        let op = Op::FusedMatMulBiasAct {
                            activation: Some(act),
                        };
                        target(&op).then_some((u, op, act))
                    }
                    _ => None,
                },
                _ => None,
            };
            if let Some((root, op, act)) = act {
                let pattern = format!("matmul+bias+{act:?}");
                if plan.add(&pattern, root, op, inputs.clone(), &[mm.id, add]) {
                    continue;
                }
            }
            let op = Op::FusedMatMulBiasAct { activation: None };
            if target(&op) {
                plan.add("matmul+bias", add, op, inputs, &[mm.id]);
            }
        }
        plan.apply(self.name(), g)
    }
}
