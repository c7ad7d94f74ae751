//! Every CPU kernel variant this CPU can run (`rlx::cpu::Isa::available`:
//! portable always, AVX2 and AVX-512 where present) on the same graphs:
//! a BERT encoder at MiniLM's widths with a padding mask (matmuls with
//! epilogues, exact GELU, LayerNorm, masked softmax attention, gathers,
//! pooling), a decoder block of RmsNorm, RoPE, causal GQA attention and
//! SwiGLU, every elementwise activation and softmax on ragged widths, and a
//! GatedDeltaNet block, in thunks and hybrid mode.
//!
//! Stated tolerances:
//! - AVX2 and AVX-512 run the same fused multiply-adds in the same order
//!   (wider registers only), so their outputs are equal bit for bit;
//! - the portable kernels multiply and add separately (no FMA), so they
//!   match the vector ones within 2e-5 relative, and the reference
//!   interpreter within 1e-4.
//!
//! The ISA is process-wide, so this file holds one test that walks the
//! variants in order.

mod common;
use common::*;
use rlx::cpu::Isa;
use rlx::ir::op::{Activation, MaskKind, RopeStyle};
use rlx::ir::{DType, Graph, Op, Shape, Tensor};
use rlx::{Device, ExecMode, Session};
use rlx_models::bert::{build_graph, BertConfig, BertOutputs};
use rlx_models::recurrent::{gdn_block_graph, synthetic_weights, GdnConfig};
use std::collections::HashMap;

type Case = (&'static str, Graph, HashMap<String, Tensor>);

fn bert_case() -> Case {
    let cfg = BertConfig {
        num_hidden_layers: 2,
        ..BertConfig::minilm_l6()
    };
    let (b, s) = (2, 24);
    let g = build_graph(
        &cfg,
        b,
        s,
        BertOutputs {
            pooled: true,
            tokens: true,
        },
    )
    .unwrap();
    let m = bert_bindings(&cfg, b, s, &[s, 17]);
    ("bert 2 layers 2x24, padded", g, m)
}

/// RmsNorm -> QKV -> RoPE (both styles) -> causal GQA attention -> out
/// projection + residual -> RmsNorm -> SwiGLU MLP.
fn decoder_case() -> Case {
    let (s, d, hq, hkv, hd, ff) = (19, 96, 6, 2, 16, 160);
    let mut g = Graph::new("decoder block");
    let f = |dims: &[usize]| Shape::new(dims, DType::F32);
    let x = g.input("x", f(&[1, s, d]));
    let pos = g.input("pos", Shape::new(&[s], DType::I64));
    let norm = |g: &mut Graph, name: &str, x| {
        let w = g.param(name, f(&[d]));
        g.push(
            Op::RmsNorm {
                axis: -1,
                eps: 1e-5,
            },
            vec![x, w],
        )
        .unwrap()
    };
    let h = norm(&mut g, "n1", x);
    let proj = |g: &mut Graph, name: &str, x, k: usize, n: usize| {
        let w = g.param(name, f(&[k, n]));
        g.push(Op::MatMul, vec![x, w]).unwrap()
    };
    let q = proj(&mut g, "wq", h, d, hq * hd);
    let k = proj(&mut g, "wk", h, d, hkv * hd);
    let v = proj(&mut g, "wv", h, d, hkv * hd);
    let rope = |style| Op::Rope {
        head_dim: hd,
        n_rot: hd,
        theta: 10000.0,
        style,
    };
    let q = g.push(rope(RopeStyle::NeoX), vec![q, pos]).unwrap();
    let k = g.push(rope(RopeStyle::GptJ), vec![k, pos]).unwrap();
    let a = g
        .push(
            Op::Attention {
                num_heads: hq,
                head_dim: hd,
                mask_kind: MaskKind::Causal,
                score_scale: None,
                attn_logit_softcap: None,
            },
            vec![q, k, v],
        )
        .unwrap();
    let o = proj(&mut g, "wo", a, hq * hd, d);
    let r = g
        .push(Op::Binary(rlx::ir::op::BinaryOp::Add), vec![x, o])
        .unwrap();
    let h2 = norm(&mut g, "n2", r);
    let gate = proj(&mut g, "wg", h2, d, ff);
    let up = proj(&mut g, "wu", h2, d, ff);
    let act = g
        .push(Op::Activation(Activation::Silu), vec![gate])
        .unwrap();
    let prod = g
        .push(Op::Binary(rlx::ir::op::BinaryOp::Mul), vec![act, up])
        .unwrap();
    let down = proj(&mut g, "wd", prod, ff, d);
    g.set_outputs(vec![down, a]);
    let mut rng = Rng::new(5);
    let mut b = random_bindings(&g, &mut rng, 0.5);
    b.insert(
        "pos".into(),
        Tensor::i64(&[s], (0..s as i64).map(|p| p + 3).collect()),
    );
    ("decoder block (RoPE, causal GQA, SwiGLU)", g, b)
}

/// Every activation, softmax, LayerNorm and RmsNorm on rows of 37 and 160
/// (vector bodies plus tails).
fn elementwise_case() -> Case {
    let mut g = Graph::new("elementwise");
    let mut outs = Vec::new();
    for (i, w) in [37usize, 160].into_iter().enumerate() {
        let x = g.input(&format!("x{i}"), Shape::new(&[5, w], DType::F32));
        for act in Activation::ALL {
            outs.push(g.push(Op::Activation(act), vec![x]).unwrap());
        }
        outs.push(g.push(Op::Softmax { axis: 1 }, vec![x]).unwrap());
        let gamma = g.param(&format!("gamma{i}"), Shape::new(&[w], DType::F32));
        let beta = g.param(&format!("beta{i}"), Shape::new(&[w], DType::F32));
        outs.push(
            g.push(
                Op::LayerNorm {
                    axis: -1,
                    eps: 1e-5,
                },
                vec![x, gamma, beta],
            )
            .unwrap(),
        );
        outs.push(
            g.push(
                Op::RmsNorm {
                    axis: -1,
                    eps: 1e-6,
                },
                vec![x, gamma],
            )
            .unwrap(),
        );
    }
    g.set_outputs(outs);
    let mut rng = Rng::new(9);
    // Wide enough for the exp/GELU tails and both signs of every function.
    let b = random_bindings(&g, &mut rng, 12.0);
    ("activations, softmax, norms", g, b)
}

fn gdn_case() -> Case {
    let cfg = GdnConfig {
        hidden: 64,
        num_k_heads: 2,
        num_v_heads: 4,
        head_dim: 32,
        conv_kernel: 4,
        norm_eps: 1e-6,
    };
    let g = gdn_block_graph(&cfg, 1, 21).unwrap();
    let mut b = synthetic_weights(&g, 4);
    let mut rng = Rng::new(6);
    for n in g.nodes() {
        if let Op::Input { name } = &n.op {
            let scale = if name == "ssm_state" { 0.2 } else { 1.0 };
            b.insert(
                name.clone(),
                Tensor::f32(&n.shape.dims, rng.vec(n.shape.numel(), scale)),
            );
        }
    }
    ("GatedDeltaNet block", g, b)
}

fn run_all(cases: &[Case], mode: ExecMode) -> Vec<Vec<Vec<f32>>> {
    let session = Session::new(Device::Cpu).mode(mode);
    cases
        .iter()
        .map(|(_, g, b)| run_session(&session, g, b))
        .collect()
}

#[test]
fn every_isa_matches_the_portable_kernels() {
    let cases = [bert_case(), decoder_case(), elementwise_case(), gdn_case()];
    let before = Isa::active();
    let available = Isa::available();
    println!("kernel variants on this CPU: {available:?}");
    let mut results = Vec::new();
    for &isa in &available {
        Isa::set_active(isa).unwrap();
        for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
            results.push((isa, mode, run_all(&cases, mode)));
        }
    }
    Isa::set_active(before).unwrap();

    let reference: Vec<Vec<Vec<f32>>> = cases.iter().map(|(_, g, b)| reference(g, b)).collect();
    let portable = &results[0].2;
    for (isa, mode, outs) in &results {
        for (c, (name, _, _)) in cases.iter().enumerate() {
            for (o, got) in outs[c].iter().enumerate() {
                let what = format!("{name} output {o}, {isa} {mode:?}");
                assert_close(got, &reference[c][o], 1e-4, &format!("{what} vs reference"));
                assert_close(got, &portable[c][o], 2e-5, &format!("{what} vs portable"));
            }
        }
    }
    // The vector variants agree bit for bit, mode by mode.
    let vector: Vec<_> = results.iter().filter(|r| r.0 != Isa::Portable).collect();
    for (i1, m1, b) in &vector {
        let Some((i0, _, a)) = vector.iter().find(|r| r.1 == *m1) else {
            continue;
        };
        for (c, (name, _, _)) in cases.iter().enumerate() {
            for (o, (x, y)) in a[c].iter().zip(&b[c]).enumerate() {
                let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{name} output {o}: {i0} and {i1} differ ({m1:?})");
            }
        }
    }
}
