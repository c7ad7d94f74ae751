//! `CacheWrite` updates a cache param in place across runs, and readers of
//! its output see the new rows, in thunks and hybrid mode.

mod common;
use common::*;
use rlx::ir::op::MaskKind;
use rlx::ir::{DType, Graph, Op, Shape, Tensor};
use rlx::{Device, ExecMode, Session, TensorRef};
use std::collections::HashMap;

fn decode_graph(ctx: usize, d: usize) -> Graph {
    let mut g = Graph::new("decode");
    let x = g.input("x", Shape::f32(&[1, 1, d]));
    let pos = g.input("pos", Shape::new(&[1], DType::I64));
    let mask = g.input("kv_mask", Shape::f32(&[1, ctx]));
    let w = g.param("w", Shape::f32(&[d, d]));
    let cache = g.param("cache.k", Shape::f32(&[1, ctx, d]));
    let k = g.push(Op::MatMul, vec![x, w]).unwrap();
    let c = g
        .push(Op::CacheWrite { axis: 1 }, vec![cache, k, pos])
        .unwrap();
    let a = g
        .push(
            Op::Attention {
                num_heads: 2,
                head_dim: d / 2,
                mask_kind: MaskKind::Custom,
                score_scale: None,
                attn_logit_softcap: None,
            },
            vec![k, c, c, mask],
        )
        .unwrap();
    g.set_outputs(vec![a]);
    g
}

#[test]
fn cache_persists_across_runs_and_matches_reference() {
    let (ctx, d) = (6, 8);
    let g = decode_graph(ctx, d);
    let mut rng = Rng::new(21);
    let w = rng.vec(d * d, 0.5);
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let mut m = Session::new(Device::Cpu)
            .mode(mode)
            .compile(g.clone())
            .unwrap();
        m.set_param("w", &w).unwrap();
        m.set_param("cache.k", &vec![0.0; ctx * d]).unwrap();
        let mut cache = vec![0f32; ctx * d];
        let mut rng = Rng::new(5);
        for p in 0..4 {
            let x = rng.vec(d, 1.0);
            let mut mask = vec![0f32; ctx];
            mask[..=p].fill(1.0);
            let got = m
                .run_typed(&[
                    ("x", TensorRef::F32(&x)),
                    ("pos", TensorRef::I64(&[p as i64])),
                    ("kv_mask", TensorRef::F32(&mask)),
                ])
                .unwrap();
            // The reference sees the cache state explicitly.
            let mut b: HashMap<String, Tensor> = HashMap::new();
            b.insert("x".into(), Tensor::f32(&[1, 1, d], x.clone()));
            b.insert("pos".into(), Tensor::i64(&[1], vec![p as i64]));
            b.insert("kv_mask".into(), Tensor::f32(&[1, ctx], mask));
            b.insert("w".into(), Tensor::f32(&[d, d], w.clone()));
            b.insert("cache.k".into(), Tensor::f32(&[1, ctx, d], cache.clone()));
            let want = reference(&g, &b);
            assert_close(
                got[0].as_f32().unwrap(),
                &want[0],
                1e-5,
                &format!("{mode:?} step {p}"),
            );
            // Track the cache: row p is x W.
            for j in 0..d {
                cache[p * d + j] = (0..d).map(|i| x[i] * w[i * d + j]).sum();
            }
        }
    }
}

#[test]
fn cache_overflow_is_an_error() {
    let g = decode_graph(2, 4);
    let mut m = Session::new(Device::Cpu).compile(g).unwrap();
    m.set_param("w", &[0.1; 16]).unwrap();
    m.set_param("cache.k", &[0.0; 8]).unwrap();
    let err = m
        .run_typed(&[
            ("x", TensorRef::F32(&[1.0; 4])),
            ("pos", TensorRef::I64(&[2])),
            ("kv_mask", TensorRef::F32(&[1.0; 2])),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("does not fit the cache"), "{err}");
}
