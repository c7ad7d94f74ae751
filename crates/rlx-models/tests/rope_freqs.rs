//! `Rope` with its optional third input, per-pair frequency divisors (Llama
//! 3 rope scaling): the CPU thunk and the hybrid plan (where the Rope stays
//! a thunk) against the reference interpreter and a hand-written f64
//! formula, both pairing styles; a divisor input of the wrong shape is an
//! error naming the expected shape.

#![allow(clippy::needless_range_loop)]

use rlx_cpu::{CpuModel, CpuOptions};
use rlx_ir::{DType, Graph, Op, RopeStyle, Shape, Tensor};
use rlx_runtime::{Executable, TensorRef};
use std::collections::HashMap;

fn graph(style: RopeStyle, divisors: usize) -> Result<Graph, String> {
    let mut g = Graph::new("rope_freqs");
    let x = g.input("x", Shape::f32(&[1, 4, 16]));
    let pos = g.input("pos", Shape::new(&[4], DType::I64));
    let f = g.param("freqs", Shape::f32(&[divisors]));
    let r = g
        .push(
            Op::Rope {
                head_dim: 8,
                n_rot: 8,
                theta: 500.0,
                style,
            },
            vec![x, pos, f],
        )
        .map_err(|e| e.to_string())?;
    g.set_outputs(vec![r]);
    g.verify().map_err(|e| e.to_string())?;
    Ok(g)
}

#[test]
fn rope_divisors_match_reference_and_formula() {
    let x: Vec<f32> = (0..64)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
        .collect();
    let pos = [0i64, 3, 17, 40];
    let freqs = vec![1.0f32, 1.7, 8.0, 3.25];
    for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
        let g = graph(style, 4).unwrap();
        let mut want = vec![0.0f64; 64];
        for s in 0..4 {
            for h in 0..2 {
                let base = s * 16 + h * 8;
                for d in 0..8 {
                    want[base + d] = f64::from(x[base + d]);
                }
                for i in 0..4 {
                    let ang =
                        pos[s] as f64 * 500f64.powf(-2.0 * i as f64 / 8.0) / f64::from(freqs[i]);
                    let (a, b) = match style {
                        RopeStyle::NeoX => (base + i, base + i + 4),
                        RopeStyle::GptJ => (base + 2 * i, base + 2 * i + 1),
                    };
                    let (xa, xb) = (f64::from(x[a]), f64::from(x[b]));
                    want[a] = xa * ang.cos() - xb * ang.sin();
                    want[b] = xa * ang.sin() + xb * ang.cos();
                }
            }
        }
        let mut bind = HashMap::new();
        bind.insert("x".to_string(), Tensor::f32(&[1, 4, 16], x.clone()));
        bind.insert("pos".to_string(), Tensor::i64(&[4], pos.to_vec()));
        bind.insert("freqs".to_string(), Tensor::f32(&[4], freqs.clone()));
        let r = rlx_ref::run(&g, &bind).unwrap();
        let r = r[0].as_f32().unwrap().to_vec();
        for hybrid in [false, true] {
            let opts = CpuOptions {
                hybrid,
                ..CpuOptions::default()
            };
            let mut m = CpuModel::compile(g.clone(), &opts).unwrap();
            m.set_param_tensor("freqs", Tensor::f32(&[4], freqs.clone()))
                .unwrap();
            let out = m
                .run(&[("x", TensorRef::F32(&x)), ("pos", TensorRef::I64(&pos))])
                .unwrap();
            let got = out[0].as_f32().unwrap();
            for i in 0..64 {
                assert!(
                    (f64::from(got[i]) - want[i]).abs() < 1e-5,
                    "{style:?} hybrid={hybrid} [{i}]: {} vs formula {}",
                    got[i],
                    want[i]
                );
                assert!(
                    (got[i] - r[i]).abs() < 1e-5,
                    "{style:?} hybrid={hybrid} [{i}]: {} vs reference {}",
                    got[i],
                    r[i]
                );
            }
        }
        // The divisors matter: all ones gives another answer.
        let mut m = CpuModel::compile(g.clone(), &CpuOptions::default()).unwrap();
        m.set_param_tensor("freqs", Tensor::f32(&[4], vec![1.0; 4]))
            .unwrap();
        let out = m
            .run(&[("x", TensorRef::F32(&x)), ("pos", TensorRef::I64(&pos))])
            .unwrap();
        let diff = out[0]
            .as_f32()
            .unwrap()
            .iter()
            .zip(&want)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        assert!(diff > 0.1, "{style:?}: divisors changed nothing");
    }
}

#[test]
fn rope_divisors_of_the_wrong_shape_are_an_error() {
    let err = graph(RopeStyle::NeoX, 3).unwrap_err();
    assert!(err.contains("[4]") && err.contains("n_rot / 2"), "{err}");
}
