//! erf/erfc against high-precision values (mpmath, 30 digits) and the
//! activations against their defining formulas.

#![allow(clippy::needless_range_loop, clippy::cloned_ref_to_slice_refs)]

mod common;
use common::*;
use rlx_ir::{Activation, Op};
use rlx_ref::{activation, erf, erfc};

#[test]
fn erf_matches_known_values() {
    let cases = [
        (0.0, 0.0),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (1.5, 0.9661051464753107),
        (2.0, 0.9953222650189527),
        (2.5, 0.999593047982555),
        (3.0, 0.9999779095030014),
        (3.5, 0.9999992569016277),
        (4.0, 0.9999999845827421),
        (5.0, 0.9999999999984625),
        (-2.0, -0.9953222650189527),
        (-0.5, -0.5204998778130465),
        (30.0, 1.0),
        (-30.0, -1.0),
    ];
    for (x, want) in cases {
        let got = erf(x);
        assert!((got - want).abs() < 1e-14, "erf({x}) = {got}, want {want}");
    }
    assert!(erf(f64::NAN).is_nan());
    assert_eq!(erf(f64::INFINITY), 1.0);
    assert_eq!(erf(f64::NEG_INFINITY), -1.0);
}

#[test]
fn erfc_is_accurate_in_the_tail() {
    let cases = [
        (2.0, 0.004677734981047266),
        (3.0, 2.209049699858544e-5),
        (5.0, 1.537459794428035e-12),
        (10.0, 2.088487583762545e-45),
        (-1.0, 1.842700792949715),
        (0.5, 1.0 - 0.5204998778130465),
    ];
    for (x, want) in cases {
        let got = erfc(x);
        assert!(
            ((got - want) / want).abs() < 1e-12,
            "erfc({x}) = {got}, want {want}"
        );
    }
}

#[test]
fn erf_is_odd_monotone_and_continuous_at_branch_points() {
    let mut prev = -1.0;
    for i in -600..=600 {
        let x = i as f64 * 0.01;
        let e = erf(x);
        assert!(e >= prev, "erf not monotone at {x}");
        assert!((-1.0..=1.0).contains(&e));
        assert_eq!(e, -erf(-x));
        assert!(
            (erf(x) + erfc(x) - 1.0).abs() < 1e-15,
            "erf + erfc != 1 at {x}"
        );
        prev = e;
    }
    for b in [2.0f64, 3.0] {
        let (lo, hi) = (b - 1e-12, b + 1e-12);
        assert!((erf(lo) - erf(hi)).abs() < 1e-13);
        assert!(((erfc(lo) - erfc(hi)) / erfc(b)).abs() < 1e-10);
    }
}

#[test]
fn gelu_is_x_times_normal_cdf() {
    let cases = [
        (1.0, 0.841344746068543),
        (-1.0, -0.15865525393145705),
        (-3.0, -0.004049694094890284),
        (0.5, 0.34573123063700655),
        (-10.0, -7.619853024160526e-23),
    ];
    for (x, want) in cases {
        let got = activation(Activation::Gelu, x);
        assert!(((got - want) / want).abs() < 1e-12, "gelu({x}) = {got}");
    }
    assert_eq!(activation(Activation::Gelu, 0.0), 0.0);
}

#[test]
fn scalar_activations() {
    use Activation::*;
    let ln2 = std::f64::consts::LN_2;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-15 * (1.0 + b.abs());
    assert!(close(activation(GeluTanh, 1.0), 0.8411919906082768));
    assert_eq!(activation(Relu, -2.0), 0.0);
    assert_eq!(activation(Relu, 3.0), 3.0);
    assert!(activation(Relu, f64::NAN).is_nan());
    assert_eq!(activation(Sigmoid, 0.0), 0.5);
    assert!(close(activation(Silu, 2.0), 2.0 / (1.0 + (-2.0f64).exp())));
    assert!(close(activation(Tanh, 0.5), 0.5f64.tanh()));
    assert!(close(activation(Exp, 1.0), std::f64::consts::E));
    assert_eq!(activation(Neg, 2.5), -2.5);
    assert_eq!(activation(Sqrt, 9.0), 3.0);
    assert_eq!(activation(Rsqrt, 4.0), 0.5);
    assert_eq!(activation(Abs, -7.0), 7.0);
    assert!(close(activation(Softplus, 0.0), ln2));
    assert_eq!(activation(Softplus, 800.0), 800.0);
    assert!(close(activation(Softplus, -50.0), (-50.0f64).exp()));
    assert!(close(activation(Softplus, 1.0), (1.0 + 1.0f64.exp()).ln()));
}

#[test]
fn activation_op_applies_elementwise() {
    let x = [-2.0f32, -0.5, 0.0, 0.5, 2.0];
    for act in Activation::ALL {
        let got = run_f32(Op::Activation(act), &[t(&[5], &x)]);
        let want: Vec<f64> = x.iter().map(|&v| activation(act, f64::from(v))).collect();
        assert_close(&got, &want, 1e-7);
    }
    let got = run_f32(Op::Activation(Activation::Gelu), &[t(&[2], &[1.0, -1.0])]);
    assert_close(&got, &[0.841344746068543, -0.15865525393145705], 1e-7);
}

/// Every activation's table formula agrees with the reference's own
/// definition (where it has one) to f64 rounding.
#[test]
fn activation_formulas_match_the_reference() {
    for act in Activation::ALL {
        let Some(f) = act.formula() else { continue };
        let mut x = -25.0f64;
        while x < 25.0 {
            let (want, got) = (activation(act, x), f.eval_f64(x));
            if !(want.is_nan() && got.is_nan()) {
                let tol = 1e-12 * want.abs().max(1.0);
                assert!((want - got).abs() <= tol, "{act:?}({x}): {got} vs {want}");
            }
            x += 0.173;
        }
        for x in [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let (want, got) = (activation(act, x), f.eval_f64(x));
            assert!(
                want == got || (want.is_nan() && got.is_nan()),
                "{act:?}({x}): {got} vs {want}"
            );
        }
    }
}
