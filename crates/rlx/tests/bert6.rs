//! A 6-layer BERT-shaped graph (hidden 384, 12 heads, FFN 1536, seq 128,
//! random weights) through `Session`: thunks equal the reference
//! interpreter, hybrid equals thunks, and the plan has the expected shape.

mod common;
use common::*;
use rlx::{Device, ExecMode, Session};
use rlx_models::bert::{build_graph, BertConfig, BertOutputs};

#[test]
fn bert6_thunks_equal_reference_and_hybrid_equals_thunks() {
    let cfg = BertConfig::minilm_l6();
    let g = build_graph(
        &cfg,
        1,
        128,
        BertOutputs {
            pooled: true,
            tokens: true,
        },
    )
    .unwrap();
    let b = bert_bindings(&cfg, 1, 128, &[128]);
    let want = reference(&g, &b);

    let mut thunks = Session::new(Device::Cpu)
        .mode(ExecMode::Thunks)
        .compile(g.clone())
        .unwrap();
    let t = run_compiled(&mut thunks, &g, &b);
    assert_close(&t[0], &want[0], 1e-5, "pooled, thunks vs reference");
    assert_close(&t[1], &want[1], 1e-5, "tokens, thunks vs reference");
    let mem = thunks.memory();
    assert!(
        mem.arena_bytes < mem.naive_bytes,
        "arena {} >= naive {}",
        mem.arena_bytes,
        mem.naive_bytes
    );
    eprintln!(
        "BERT-6 1x128 thunks arena {} B, naive sum {} B",
        mem.arena_bytes, mem.naive_bytes
    );

    let mut hybrid = Session::new(Device::Cpu)
        .mode(ExecMode::Hybrid)
        .compile(g.clone())
        .unwrap();
    let h = run_compiled(&mut hybrid, &g, &b);
    assert_close(&h[0], &t[0], 1e-5, "pooled, hybrid vs thunks");
    assert_close(&h[1], &t[1], 1e-5, "tokens, hybrid vs thunks");

    // The plan check uses the encoder alone (token outputs): pooling adds a
    // sequence reduction that no row-local segment can take.
    let enc = build_graph(
        &cfg,
        1,
        128,
        BertOutputs {
            pooled: false,
            tokens: true,
        },
    )
    .unwrap();
    let hybrid = Session::new(Device::Cpu)
        .mode(ExecMode::Hybrid)
        .compile(enc)
        .unwrap();
    let r = hybrid.plan_report();
    let attn_ranges = r
        .ranges
        .iter()
        .filter(|x| x.ops.iter().any(|o| o.op == "Attention"))
        .count();
    assert_eq!(attn_ranges, 6, "{r:#?}");
    let declined: usize = r
        .ranges
        .iter()
        .flat_map(|x| &x.ops)
        .filter(|o| o.op != "Attention")
        .inspect(|o| assert!(!o.reason.is_empty(), "{o:?} has no reason"))
        .count();
    assert!(
        r.dispatches <= 13 + declined,
        "{} dispatches, {declined} declined",
        r.dispatches
    );
    assert_eq!(r.compiled_segments, 7);
}

#[test]
fn bert6_batched_with_padding_hybrid_equals_thunks() {
    let mut cfg = BertConfig::minilm_l6();
    cfg.num_hidden_layers = 2;
    let g = build_graph(
        &cfg,
        3,
        40,
        BertOutputs {
            pooled: true,
            tokens: false,
        },
    )
    .unwrap();
    let b = bert_bindings(&cfg, 3, 40, &[40, 17, 1]);
    let want = reference(&g, &b);
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let got = run_session(
            &Session::new(Device::Cpu).mode(mode).poison_freed(true),
            &g,
            &b,
        );
        assert_close(&got[0], &want[0], 1e-5, &format!("{mode:?} vs reference"));
    }
}

#[test]
fn optimizer_fuses_the_bert_graph() {
    let cfg = BertConfig::minilm_l6();
    let g = build_graph(
        &cfg,
        1,
        16,
        BertOutputs {
            pooled: true,
            tokens: false,
        },
    )
    .unwrap();
    let (opt, report) = rlx::opt::optimize(&g, &Default::default()).unwrap();
    let count = |name: &str| opt.nodes().iter().filter(|n| n.op.name() == name).count();
    let gelu = opt
        .nodes()
        .iter()
        .filter(|n| {
            matches!(
                n.op,
                rlx::ir::Op::FusedMatMulBiasAct {
                    activation: Some(rlx::ir::op::Activation::Gelu)
                }
            )
        })
        .count();
    // Per layer: QKV (one merged matmul), out-proj, FFN up (+GELU), FFN down.
    assert_eq!(count("FusedMatMulBiasAct"), 6 * 4);
    assert_eq!(gelu, 6);
    assert_eq!(count("MatMul"), 0, "every linear layer has a bias");
    // Two residual norms per layer plus the embeddings' add + LayerNorm.
    assert_eq!(count("FusedResidualLN"), 6 * 2 + 1);
    assert_eq!(count("LayerNorm"), 0);
    assert_eq!(report.count("fuse_qkv", "qkv"), 6);
    // Same numbers as the unoptimized graph under the reference.
    let b = bert_bindings(&cfg, 1, 16, &[16]);
    let want = reference(&g, &b);
    let got = reference(&opt, &b);
    assert_close(&got[0], &want[0], 1e-5, "optimized vs plain BERT");
}
