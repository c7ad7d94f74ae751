//! Positive and negative cases for every fusion pattern, checked against
//! the reference interpreter.

mod common;
use common::*;
use rlx_ir::{Activation, Graph, NodeId, Op};
use rlx_opt::{OptOptions, Pass};

const TOL: f32 = 1e-5;

fn is_fmba(op: &Op, a: Option<Activation>) -> bool {
    *op == Op::FusedMatMulBiasAct { activation: a }
}

/// x [2, 3, 8] x W [8, 6] + bias [6] -> act -> output.
fn linear(act_: Option<Activation>, bias_dims: &[usize]) -> (Graph, NodeId, NodeId, NodeId) {
    let mut g = Graph::new("linear");
    let x = input(&mut g, "x", &[2, 3, 8]);
    let w = param(&mut g, "w", &[8, 6]);
    let b = param(&mut g, "b", bias_dims);
    let mm = matmul(&mut g, x, w);
    let a = add(&mut g, mm, b);
    let out = match act_ {
        Some(f) => act(&mut g, f, a),
        None => a,
    };
    g.set_outputs(vec![out]);
    (g, mm, a, out)
}

#[test]
fn matmul_bias_act_fuses_each_fusable_activation() {
    for f in rlx_opt::FUSABLE_ACTIVATIONS {
        let (g, ..) = linear(Some(f), &[6]);
        let (h, r) = opt(&g);
        assert_eq!(
            r.count("fuse_matmul_bias_act", &format!("matmul+bias+{f:?}")),
            1,
            "{r}"
        );
        assert_eq!(count(&h, |o| is_fmba(o, Some(f))), 1, "{h}");
        assert_eq!(
            count(&h, |o| matches!(
                o,
                Op::MatMul | Op::Binary(_) | Op::Activation(_)
            )),
            0
        );
        assert_eq!(h.len(), 4, "x, w, b and the fused node: {h}");
        assert_same(&g, &h, 1, TOL);
    }
}

#[test]
fn matmul_bias_without_activation_and_bias_first() {
    let mut g = Graph::new("bias_first");
    let x = input(&mut g, "x", &[5, 8]);
    let w = param(&mut g, "w", &[8, 4]);
    let b = param(&mut g, "b", &[4]);
    let mm = matmul(&mut g, x, w);
    let a = add(&mut g, b, mm);
    let t = act(&mut g, Activation::Tanh, a);
    g.set_outputs(vec![t]);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 1, "{r}");
    assert_eq!(count(&h, |o| is_fmba(o, None)), 1);
    assert_eq!(
        count(&h, |o| *o == Op::Activation(Activation::Tanh)),
        1,
        "Tanh is not fusable"
    );
    assert_same(&g, &h, 2, TOL);
}

#[test]
fn unsupported_activation_fuses_only_the_bias() {
    let (g, ..) = linear(Some(Activation::Exp), &[6]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_matmul_bias_act"), 1);
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 1);
    assert_eq!(count(&h, |o| *o == Op::Activation(Activation::Exp)), 1);
    assert_same(&g, &h, 3, TOL);
}

#[test]
fn matmul_used_twice_is_not_fused() {
    let (mut g, mm, _, out) = linear(Some(Activation::Gelu), &[6]);
    let extra = act(&mut g, Activation::Relu, mm);
    g.set_outputs(vec![out, extra]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_matmul_bias_act"), 0, "{r}");
    assert_eq!(count(&h, |o| *o == Op::MatMul), 1);
    assert_same(&g, &h, 4, TOL);
}

#[test]
fn matmul_as_output_is_not_fused() {
    let (mut g, mm, _, out) = linear(Some(Activation::Gelu), &[6]);
    g.set_outputs(vec![out, mm]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_matmul_bias_act"), 0, "{r}");
    assert_same(&g, &h, 5, TOL);
}

#[test]
fn bias_add_as_output_keeps_the_activation_apart() {
    let (mut g, _, a, out) = linear(Some(Activation::Gelu), &[6]);
    g.set_outputs(vec![out, a]);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 1, "{r}");
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias+Gelu"), 0);
    assert_eq!(count(&h, |o| *o == Op::Activation(Activation::Gelu)), 1);
    assert_same(&g, &h, 6, TOL);
}

#[test]
fn bias_used_twice_by_activation_path_keeps_activation() {
    // The Add feeds the activation and another node: fuse matmul+bias only.
    let (mut g, _, a, out) = linear(Some(Activation::Relu), &[6]);
    let n = act(&mut g, Activation::Neg, a);
    g.set_outputs(vec![out, n]);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 1, "{r}");
    assert_eq!(count(&h, |o| is_fmba(o, None)), 1);
    assert_same(&g, &h, 7, TOL);
}

#[test]
fn wrong_bias_shapes_are_not_fused() {
    // [1] broadcasts but is not [N]; [3, 6] is a full matrix, not a bias.
    for dims in [&[1usize][..], &[3, 6], &[2, 3, 6]] {
        let (g, ..) = linear(Some(Activation::Relu), dims);
        let (h, r) = opt(&g);
        assert_eq!(r.total("fuse_matmul_bias_act"), 0, "bias {dims:?}: {r}");
        assert_eq!(count(&h, |o| matches!(o, Op::FusedMatMulBiasAct { .. })), 0);
        assert_same(&g, &h, 8, TOL);
    }
}

#[test]
fn target_decides_which_fused_ops_exist() {
    let (g, ..) = linear(Some(Activation::Gelu), &[6]);
    // Claims only the activation-free fused op.
    let o = OptOptions::default().with_target(|op| {
        !matches!(
            op,
            Op::FusedMatMulBiasAct {
                activation: Some(_)
            }
        )
    });
    let (h, r) = opt_with(&g, &o);
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 1, "{r}");
    assert_eq!(count(&h, |o| *o == Op::Activation(Activation::Gelu)), 1);
    assert_same(&g, &h, 9, TOL);
    // Claims no fused op at all.
    let o = OptOptions::default().with_target(|op| !matches!(op, Op::FusedMatMulBiasAct { .. }));
    let (h, r) = opt_with(&g, &o);
    assert_eq!(r.total("fuse_matmul_bias_act"), 0);
    assert_eq!(h.op_counts(), g.op_counts());
}

/// x + r [+ bias] -> LayerNorm/RmsNorm.
fn residual(rms: bool, bias: bool, r_dims: &[usize]) -> (Graph, NodeId, NodeId) {
    let mut g = Graph::new("residual");
    let x = input(&mut g, "x", &[2, 4, 16]);
    let r = input(&mut g, "r", r_dims);
    let gamma = param(&mut g, "gamma", &[16]);
    let beta = param(&mut g, "beta", &[16]);
    let s = add(&mut g, x, r);
    let t = if bias {
        let b = param(&mut g, "bias", &[16]);
        add(&mut g, b, s)
    } else {
        s
    };
    let out = if rms {
        push(&mut g, Op::RmsNorm { axis: 2, eps: 1e-6 }, &[t, gamma])
    } else {
        layer_norm(&mut g, t, gamma, beta)
    };
    g.set_outputs(vec![out]);
    (g, s, out)
}

#[test]
fn residual_norm_fuses_all_four_forms() {
    for rms in [false, true] {
        for bias in [false, true] {
            let (g, ..) = residual(rms, bias, &[2, 4, 16]);
            let (h, r) = opt(&g);
            let name = if rms { "RmsNorm" } else { "LayerNorm" };
            let pat = if bias {
                format!("residual+bias+{name}")
            } else {
                format!("residual+{name}")
            };
            assert_eq!(r.count("fuse_residual_norm", &pat), 1, "{r}");
            let want = if rms {
                Op::FusedResidualRmsNorm {
                    has_bias: bias,
                    eps: 1e-6,
                }
            } else {
                Op::FusedResidualLN {
                    has_bias: bias,
                    eps: 1e-5,
                }
            };
            assert_eq!(count(&h, |o| *o == want), 1, "{h}");
            assert_eq!(count(&h, |o| matches!(o, Op::Binary(_))), 0);
            assert_same(&g, &h, 10, TOL);
        }
    }
}

#[test]
fn broadcast_residual_is_not_fused() {
    let (g, ..) = residual(false, false, &[4, 16]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_residual_norm"), 0, "{r}");
    assert_eq!(count(&h, |o| matches!(o, Op::LayerNorm { .. })), 1);
    assert_same(&g, &h, 11, TOL);
}

#[test]
fn residual_sum_used_twice_or_output_is_not_fused() {
    let (mut g, s, out) = residual(false, false, &[2, 4, 16]);
    g.set_outputs(vec![out, s]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_residual_norm"), 0, "{r}");
    assert_same(&g, &h, 12, TOL);

    let (mut g, s, out) = residual(true, true, &[2, 4, 16]);
    let n = act(&mut g, Activation::Neg, s);
    g.set_outputs(vec![out, n]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_residual_norm"), 0, "{r}");
    assert_same(&g, &h, 13, TOL);
}

#[test]
fn residual_norm_respects_the_target() {
    let (g, ..) = residual(false, true, &[2, 4, 16]);
    let o = OptOptions::default().with_target(|op| !matches!(op, Op::FusedResidualLN { .. }));
    let (h, r) = opt_with(&g, &o);
    assert_eq!(r.total("fuse_residual_norm"), 0);
    assert_eq!(count(&h, |o| matches!(o, Op::LayerNorm { .. })), 1);
}

/// Mul(Silu(Narrow(x, 0, N)), Narrow(x, N, N)).
fn packed_swiglu(swap: bool, second_start: usize) -> (Graph, NodeId) {
    let mut g = Graph::new("swiglu");
    let x = input(&mut g, "x", &[3, 5, 12]);
    let a = push(
        &mut g,
        Op::Narrow {
            axis: 2,
            start: 0,
            len: 6,
        },
        &[x],
    );
    let b = push(
        &mut g,
        Op::Narrow {
            axis: 2,
            start: second_start,
            len: 6,
        },
        &[x],
    );
    let s = act(&mut g, Activation::Silu, a);
    let m = if swap {
        mul(&mut g, b, s)
    } else {
        mul(&mut g, s, b)
    };
    g.set_outputs(vec![m]);
    (g, s)
}

#[test]
fn packed_swiglu_fuses() {
    for swap in [false, true] {
        let (g, _) = packed_swiglu(swap, 6);
        let (h, r) = opt(&g);
        assert_eq!(r.count("fuse_swiglu", "swiglu_packed"), 1, "{r}");
        assert_eq!(count(&h, |o| *o == Op::FusedSwiGLU { packed: true }), 1);
        assert_eq!(h.len(), 2, "x and the fused node: {h}");
        assert_same(&g, &h, 14, TOL);
    }
}

#[test]
fn non_halves_fall_back_to_unpacked_swiglu() {
    // Second narrow starts at 4: not [gate | up] halves; the unpacked form is still exact.
    let (g, _) = packed_swiglu(false, 4);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_swiglu", "swiglu_packed"), 0, "{r}");
    assert_eq!(r.count("fuse_swiglu", "swiglu"), 1, "{r}");
    assert_eq!(count(&h, |o| *o == Op::FusedSwiGLU { packed: false }), 1);
    assert_same(&g, &h, 15, TOL);
}

#[test]
fn unpacked_swiglu_and_its_negatives() {
    let build = |act_: Activation, b_dims: &[usize]| {
        let mut g = Graph::new("swiglu2");
        let a = input(&mut g, "a", &[4, 8]);
        let b = input(&mut g, "b", b_dims);
        let s = act(&mut g, act_, a);
        let m = mul(&mut g, s, b);
        g.set_outputs(vec![m]);
        (g, s, m)
    };
    let (g, ..) = build(Activation::Silu, &[4, 8]);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_swiglu", "swiglu"), 1, "{r}");
    assert_eq!(count(&h, |o| *o == Op::FusedSwiGLU { packed: false }), 1);
    assert_same(&g, &h, 16, TOL);

    // Gelu is not SwiGLU; a broadcast up operand is not either.
    for (f, dims) in [
        (Activation::Gelu, &[4usize, 8][..]),
        (Activation::Silu, &[8]),
    ] {
        let (g, ..) = build(f, dims);
        let (_, r) = opt(&g);
        assert_eq!(r.total("fuse_swiglu"), 0, "{f:?} {dims:?}: {r}");
    }
    // Silu used twice / Silu as an output.
    let (mut g, s, m) = build(Activation::Silu, &[4, 8]);
    g.set_outputs(vec![m, s]);
    let (_, r) = opt(&g);
    assert_eq!(r.total("fuse_swiglu"), 0, "{r}");
    let (mut g, s, m) = build(Activation::Silu, &[4, 8]);
    let n = act(&mut g, Activation::Neg, s);
    g.set_outputs(vec![m, n]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_swiglu"), 0, "{r}");
    assert_same(&g, &h, 17, TOL);
    // Silu(a) * Silu(a): the up operand is the gate node itself.
    let mut g = Graph::new("square");
    let a = input(&mut g, "a", &[4, 8]);
    let s = act(&mut g, Activation::Silu, a);
    let m = mul(&mut g, s, s);
    g.set_outputs(vec![m]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_swiglu"), 0, "{r}");
    assert_same(&g, &h, 18, TOL);
    // Target declines.
    let (g, ..) = build(Activation::Silu, &[4, 8]);
    let o = OptOptions::default().with_target(|op| !matches!(op, Op::FusedSwiGLU { .. }));
    let (_, r) = opt_with(&g, &o);
    assert_eq!(r.total("fuse_swiglu"), 0);
}

#[test]
fn packed_swiglu_with_shared_narrow_is_not_packed() {
    // The up narrow is also an output: packed fusion would drop it.
    let mut g = Graph::new("swiglu3");
    let x = input(&mut g, "x", &[3, 12]);
    let a = push(
        &mut g,
        Op::Narrow {
            axis: 1,
            start: 0,
            len: 6,
        },
        &[x],
    );
    let b = push(
        &mut g,
        Op::Narrow {
            axis: 1,
            start: 6,
            len: 6,
        },
        &[x],
    );
    let s = act(&mut g, Activation::Silu, a);
    let m = mul(&mut g, s, b);
    g.set_outputs(vec![m, b]);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_swiglu", "swiglu_packed"), 0, "{r}");
    assert_eq!(r.count("fuse_swiglu", "swiglu"), 1, "{r}");
    assert_same(&g, &h, 19, TOL);
}

/// Three projections of one x, optionally with biases and params/constants.
fn qkv(bias: bool, constants: bool) -> Graph {
    let mut g = Graph::new("qkv");
    let x = input(&mut g, "x", &[2, 3, 8]);
    let mut outs = Vec::new();
    for (i, n) in [8usize, 4, 4].into_iter().enumerate() {
        let w = if constants {
            constant(&mut g, &[8, n], 100 + i as u64)
        } else {
            param(&mut g, &format!("w{i}"), &[8, n])
        };
        let mut y = matmul(&mut g, x, w);
        if bias {
            let b = if constants {
                constant(&mut g, &[n], 200 + i as u64)
            } else {
                param(&mut g, &format!("b{i}"), &[n])
            };
            y = add(&mut g, y, b);
        }
        outs.push(act(&mut g, Activation::Tanh, y));
    }
    g.set_outputs(outs);
    g
}

#[test]
fn qkv_merges_with_and_without_bias() {
    for bias in [false, true] {
        for constants in [false, true] {
            let g = qkv(bias, constants);
            let (h, r) = opt(&g);
            assert_eq!(
                r.count("fuse_qkv", "qkv"),
                1,
                "bias {bias} const {constants}: {r}"
            );
            assert_eq!(r.count("fuse_qkv", "qkv_matmuls"), 3);
            assert_eq!(count(&h, |o| matches!(o, Op::Narrow { .. })), 3, "{h}");
            let mms = count(&h, |o| *o == Op::MatMul);
            let fused = count(&h, |o| matches!(o, Op::FusedMatMulBiasAct { .. }));
            if bias {
                assert_eq!((mms, fused), (0, 1), "{h}");
                assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 1);
            } else {
                assert_eq!((mms, fused), (1, 0), "{h}");
            }
            let concats = count(&h, |o| matches!(o, Op::Concat { .. }));
            if constants {
                assert_eq!(concats, 0, "constant weights are folded: {h}");
                assert!(r.count("const_fold", "folded") >= 1);
            } else {
                assert_eq!(concats, 1 + bias as usize);
            }
            assert_same(&g, &h, 20, TOL);
        }
    }
}

#[test]
fn qkv_needs_shared_lhs_and_weight_leaves() {
    // Different lhs.
    let mut g = Graph::new("two_x");
    let x = input(&mut g, "x", &[3, 8]);
    let y = input(&mut g, "y", &[3, 8]);
    let w0 = param(&mut g, "w0", &[8, 4]);
    let w1 = param(&mut g, "w1", &[8, 4]);
    let a = matmul(&mut g, x, w0);
    let b = matmul(&mut g, y, w1);
    g.set_outputs(vec![a, b]);
    let (_, r) = opt(&g);
    assert_eq!(r.total("fuse_qkv"), 0, "{r}");

    // A computed rhs is not a weight.
    let mut g = Graph::new("computed_rhs");
    let x = input(&mut g, "x", &[3, 8]);
    let w0 = param(&mut g, "w0", &[8, 4]);
    let w1 = param(&mut g, "w1", &[8, 4]);
    let w1t = act(&mut g, Activation::Neg, w1);
    let a = matmul(&mut g, x, w0);
    let b = matmul(&mut g, x, w1t);
    g.set_outputs(vec![a, b]);
    let (h, r) = opt(&g);
    assert_eq!(r.total("fuse_qkv"), 0, "{r}");
    assert_same(&g, &h, 21, TOL);
}

#[test]
fn qkv_with_outputs_and_mixed_bias_still_exact() {
    // One projection is a graph output and has no bias: it merges without
    // the biased pair (which merges with its biases).
    let mut g = Graph::new("mixed");
    let x = input(&mut g, "x", &[5, 8]);
    let ws: Vec<NodeId> = (0..3)
        .map(|i| param(&mut g, &format!("w{i}"), &[8, 4]))
        .collect();
    let b0 = param(&mut g, "b0", &[4]);
    let b1 = param(&mut g, "b1", &[4]);
    let m0 = matmul(&mut g, x, ws[0]);
    let a0 = add(&mut g, m0, b0);
    let m1 = matmul(&mut g, x, ws[1]);
    let a1 = add(&mut g, b1, m1);
    let m2 = matmul(&mut g, x, ws[2]);
    g.set_outputs(vec![a0, a1, m2]);
    let (h, r) = opt(&g);
    assert_eq!(r.count("fuse_qkv", "qkv"), 1, "{r}");
    assert_eq!(r.count("fuse_qkv", "qkv_matmuls"), 2, "{r}");
    assert_eq!(
        count(&h, |o| matches!(o, Op::FusedMatMulBiasAct { .. })),
        1,
        "{h}"
    );
    assert_same(&g, &h, 22, TOL);
}

#[test]
fn passes_run_alone_return_verified_graphs() {
    let g = qkv(true, false);
    let target = |_: &Op| true;
    let (h, r) = rlx_opt::FuseQkv.run(&g, &target).unwrap();
    h.verify().unwrap();
    assert_eq!(r.get("qkv"), Some(&1));
    let (h2, r2) = rlx_opt::FuseMatMulBiasAct.run(&h, &target).unwrap();
    h2.verify().unwrap();
    assert_eq!(r2.get("matmul+bias"), Some(&1));
    assert_same(&g, &h2, 23, TOL);
}
