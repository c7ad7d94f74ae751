//! Random DAGs for the property tests (CPU) and the CUDA random-graph
//! parity test: one generator, one "split after every k-th op" policy.

use super::Rng;
use rlx::hybrid::SplitPolicy;
use rlx::ir::op::{Activation, BinaryOp, MaskKind};
use rlx::ir::{Graph, NodeId, Op, Shape};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A random DAG over `[b, s, d]` activations: every op reads earlier values.
pub fn random_graph(seed: u64, n_ops: usize) -> Graph {
    let mut r = Rng::new(seed);
    let (b, s) = (1 + r.below(2), 1 + r.below(9));
    let d = [4usize, 6, 8, 12][r.below(4)];
    let mut g = Graph::new(format!("random{seed}"));
    let x = g.input("x", Shape::f32(&[b, s, d]));
    let mut vals: Vec<NodeId> = vec![x];
    for i in 0..n_ops {
        let a = vals[r.below(vals.len())];
        let c = vals[r.below(vals.len())];
        let ad = g.node(a).shape.dims.clone();
        let w = *ad.last().unwrap();
        let out = match r.below(11) {
            0 => {
                let n = [4usize, 6, 8, 12][r.below(4)];
                let wp = g.param(&format!("w{i}"), Shape::f32(&[w, n]));
                g.push(Op::MatMul, vec![a, wp])
            }
            1 => {
                let act = Activation::ALL[r.below(Activation::ALL.len())];
                let act = if matches!(act, Activation::Sqrt | Activation::Rsqrt | Activation::Exp) {
                    Activation::Tanh
                } else {
                    act
                };
                g.push(Op::Activation(act), vec![a])
            }
            2 if g.node(c).shape == g.node(a).shape => {
                let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max][r.below(4)];
                g.push(Op::Binary(op), vec![a, c])
            }
            3 => {
                let bias = g.param(&format!("b{i}"), Shape::f32(&[w]));
                g.push(Op::Binary(BinaryOp::Add), vec![a, bias])
            }
            4 => {
                let gm = g.param(&format!("g{i}"), Shape::f32(&[w]));
                let bt = g.param(&format!("be{i}"), Shape::f32(&[w]));
                g.push(
                    Op::LayerNorm {
                        axis: -1,
                        eps: 1e-5,
                    },
                    vec![a, gm, bt],
                )
            }
            5 if w >= 2 => {
                let len = 1 + r.below(w - 1);
                g.push(
                    Op::Narrow {
                        axis: ad.len() - 1,
                        start: r.below(w - len + 1),
                        len,
                    },
                    vec![a],
                )
            }
            6 if w.is_multiple_of(2) && ad.len() == 3 => {
                let heads = if w.is_multiple_of(4) { 2 } else { 1 };
                let mk = [MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow(2)][r.below(3)];
                let op = Op::Attention {
                    num_heads: heads,
                    head_dim: w / heads,
                    mask_kind: mk,
                    score_scale: None,
                    attn_logit_softcap: None,
                };
                g.push(op, vec![a, a, a])
            }
            7 => g.push(Op::Softmax { axis: ad.len() - 1 }, vec![a]),
            8 => {
                let gm = g.param(&format!("r{i}"), Shape::f32(&[w]));
                g.push(
                    Op::RmsNorm {
                        axis: -1,
                        eps: 1e-5,
                    },
                    vec![a, gm],
                )
            }
            9 if g.node(c).shape == g.node(a).shape && ad.len() == 3 => {
                g.push(Op::Concat { axis: 1 }, vec![a, c])
            }
            _ => {
                let rows: usize = ad[..ad.len() - 1].iter().product();
                g.push(
                    Op::Reshape {
                        shape: vec![rows, w],
                    },
                    vec![a],
                )
            }
        };
        if let Ok(id) = out {
            vals.push(id);
        }
    }
    let mut outs = vec![*vals.last().unwrap()];
    if vals.len() > 3 {
        outs.push(vals[vals.len() / 2]);
    }
    g.set_outputs(outs);
    g
}

/// "Split after every k-th op": a stateful predicate that counts calls.
pub fn every_kth(k: usize) -> SplitPolicy {
    let n = Arc::new(AtomicUsize::new(0));
    SplitPolicy::new(move |op: &Op| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        !matches!(op, Op::Attention { .. }) && !(i + 1).is_multiple_of(k)
    })
}
