//! One plain-op BERT encoder layer: the optimizer must find the QKV merge,
//! four fused matmuls and two fused residual LayerNorms, and stay exact.

mod common;
use common::*;
use rlx_ir::{Activation, Graph, MaskKind, NodeId, Op};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const FFN: usize = 256;

fn linear(g: &mut Graph, x: NodeId, name: &str, k: usize, n: usize) -> NodeId {
    let w = param(g, &format!("{name}.weight"), &[k, n]);
    let b = param(g, &format!("{name}.bias"), &[n]);
    let y = matmul(g, x, w);
    add(g, y, b)
}

fn ln(g: &mut Graph, x: NodeId, name: &str) -> NodeId {
    let gamma = param(g, &format!("{name}.gamma"), &[HIDDEN]);
    let beta = param(g, &format!("{name}.beta"), &[HIDDEN]);
    push(
        g,
        Op::LayerNorm {
            axis: -1,
            eps: 1e-12,
        },
        &[x, gamma, beta],
    )
}

fn bert_layer(batch: usize, seq: usize) -> Graph {
    let mut g = Graph::new("bert_layer");
    let x = input(&mut g, "hidden", &[batch, seq, HIDDEN]);
    let q = linear(&mut g, x, "query", HIDDEN, HIDDEN);
    let k = linear(&mut g, x, "key", HIDDEN, HIDDEN);
    let v = linear(&mut g, x, "value", HIDDEN, HIDDEN);
    let attn = push(
        &mut g,
        Op::Attention {
            num_heads: HEADS,
            head_dim: HIDDEN / HEADS,
            mask_kind: MaskKind::None,
            score_scale: None,
            attn_logit_softcap: None,
        },
        &[q, k, v],
    );
    let o = linear(&mut g, attn, "attn_out", HIDDEN, HIDDEN);
    let r1 = add(&mut g, o, x);
    let h1 = ln(&mut g, r1, "ln1");
    let up = linear(&mut g, h1, "ffn_up", HIDDEN, FFN);
    let up = act(&mut g, Activation::Gelu, up);
    let down = linear(&mut g, up, "ffn_down", FFN, HIDDEN);
    let r2 = add(&mut g, down, h1);
    let out = ln(&mut g, r2, "ln2");
    g.set_outputs(vec![out]);
    g
}

#[test]
fn bert_layer_report_and_parity() {
    let g = bert_layer(2, 7);
    let (h, r) = opt(&g);
    eprintln!("{r}\n{h}");
    assert_eq!(r.count("fuse_qkv", "qkv"), 1, "{r}");
    assert_eq!(r.count("fuse_qkv", "qkv_matmuls"), 3, "{r}");
    assert_eq!(r.total("fuse_matmul_bias_act"), 4, "{r}");
    assert_eq!(
        r.count("fuse_matmul_bias_act", "matmul+bias+Gelu"),
        1,
        "{r}"
    );
    assert_eq!(r.count("fuse_matmul_bias_act", "matmul+bias"), 3, "{r}");
    assert_eq!(
        r.count("fuse_residual_norm", "residual+LayerNorm"),
        2,
        "{r}"
    );
    assert_eq!(r.total("cse"), 0);

    let fused_mm = count(&h, |o| matches!(o, Op::FusedMatMulBiasAct { .. }));
    assert_eq!(fused_mm, 4, "{h}");
    assert_eq!(
        count(&h, |o| *o
            == Op::FusedMatMulBiasAct {
                activation: Some(Activation::Gelu)
            }),
        1
    );
    assert_eq!(
        count(&h, |o| matches!(
            o,
            Op::FusedResidualLN {
                has_bias: false,
                ..
            }
        )),
        2
    );
    // Nothing unfused is left: no plain matmul, add, activation or LayerNorm.
    for bad in ["MatMul", "Binary", "Activation", "LayerNorm"] {
        assert_eq!(h.op_counts().get(bad), None, "{bad} left in {h}");
    }
    // QKV: one weight concat, one bias concat, three narrows.
    assert_eq!(count(&h, |o| matches!(o, Op::Concat { axis: 1 })), 1);
    assert_eq!(count(&h, |o| matches!(o, Op::Concat { axis: 0 })), 1);
    assert_eq!(count(&h, |o| matches!(o, Op::Narrow { axis: 2, .. })), 3);
    assert_eq!(r.nodes_after, h.len());
    assert!(h.len() < g.len());

    assert_same(&g, &h, 42, 1e-5);
    assert_same(&g, &h, 43, 1e-5);
}

#[test]
fn bert_layer_on_a_target_without_fused_norms() {
    let g = bert_layer(1, 5);
    let o = rlx_opt::OptOptions::default().with_target(|op| {
        !matches!(
            op,
            Op::FusedResidualLN { .. } | Op::FusedResidualRmsNorm { .. }
        )
    });
    let (h, r) = opt_with(&g, &o);
    assert_eq!(r.total("fuse_residual_norm"), 0);
    assert_eq!(r.total("fuse_matmul_bias_act"), 4);
    assert_eq!(count(&h, |o| matches!(o, Op::LayerNorm { .. })), 2);
    assert_same(&g, &h, 44, 1e-5);
}

/// A pre-norm Llama-style block (GQA attention, SwiGLU MLP, no biases).
/// The q/k/v and gate/up projections each merge; the merged gate/up with
/// its two half Narrows becomes one packed SwiGLU. The residual stream is
/// read twice (by the norm and by the next residual add), so no residual
/// norm fusion may fire.
#[test]
fn llama_block_merges_projections_into_packed_swiglu() {
    let (d, heads, kv_heads, hd, ffn) = (32usize, 4usize, 2usize, 8usize, 48usize);
    let mut g = Graph::new("llama_block");
    let x = input(&mut g, "x", &[1, 5, d]);
    let n1 = param(&mut g, "attn_norm", &[d]);
    let h = push(
        &mut g,
        Op::RmsNorm {
            axis: -1,
            eps: 1e-6,
        },
        &[x, n1],
    );
    let wq = param(&mut g, "wq", &[d, heads * hd]);
    let wk = param(&mut g, "wk", &[d, kv_heads * hd]);
    let wv = param(&mut g, "wv", &[d, kv_heads * hd]);
    let q = matmul(&mut g, h, wq);
    let k = matmul(&mut g, h, wk);
    let v = matmul(&mut g, h, wv);
    let attn = push(
        &mut g,
        Op::Attention {
            num_heads: heads,
            head_dim: hd,
            mask_kind: MaskKind::Causal,
            score_scale: None,
            attn_logit_softcap: None,
        },
        &[q, k, v],
    );
    let wo = param(&mut g, "wo", &[heads * hd, d]);
    let o = matmul(&mut g, attn, wo);
    let r1 = add(&mut g, x, o);
    let n2 = param(&mut g, "ffn_norm", &[d]);
    let h2 = push(
        &mut g,
        Op::RmsNorm {
            axis: -1,
            eps: 1e-6,
        },
        &[r1, n2],
    );
    let wg = param(&mut g, "w_gate", &[d, ffn]);
    let wu = param(&mut g, "w_up", &[d, ffn]);
    let gate = matmul(&mut g, h2, wg);
    let up = matmul(&mut g, h2, wu);
    let sg = act(&mut g, Activation::Silu, gate);
    let m = mul(&mut g, sg, up);
    let wd = param(&mut g, "w_down", &[ffn, d]);
    let down = matmul(&mut g, m, wd);
    let r2 = add(&mut g, r1, down);
    g.set_outputs(vec![r2]);

    let (hg, r) = opt(&g);
    eprintln!("{r}\n{hg}");
    assert_eq!(r.count("fuse_qkv", "qkv"), 2, "{r}");
    assert_eq!(r.count("fuse_qkv", "qkv_matmuls"), 5, "{r}");
    assert_eq!(r.count("fuse_swiglu", "swiglu_packed"), 1, "{r}");
    assert_eq!(r.total("fuse_residual_norm"), 0, "{r}");
    assert_eq!(r.total("fuse_matmul_bias_act"), 0, "{r}");
    assert_eq!(
        count(&hg, |o| *o == Op::FusedSwiGLU { packed: true }),
        1,
        "{hg}"
    );
    assert_eq!(
        count(&hg, |o| matches!(o, Op::Narrow { .. })),
        3,
        "q, k, v only: {hg}"
    );
    assert_same(&g, &hg, 50, 1e-5);
}
