//! Property tests: random DAGs of random ops and shapes give thunk output
//! equal to the reference interpreter, and hybrid output (under random split
//! policies, including "split after every k-th op") equal to thunks.

mod common;
use common::{assert_close, every_kth, random_bindings, random_graph, reference, run_session, Rng};
use proptest::prelude::*;
use rlx::hybrid::SplitPolicy;
use rlx::ir::op::{Activation, BinaryOp};
use rlx::ir::{Graph, Op};
use rlx::{Device, ExecMode, Session};

proptest! {
    // A fixed seed: CI runs the same 200 cases every time (a random seed
    // made CI fail on an ill-conditioned case now and then; see below).
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x726c_7800),
        .. ProptestConfig::default()
    })]

    #[test]
    fn thunks_equal_reference_and_hybrid_equals_thunks(seed in 0u64..1_000_000, n_ops in 2usize..14, k in 1usize..5) {
        let g = random_graph(seed, n_ops);
        let b = random_bindings(&g, &mut Rng::new(seed ^ 0xABCD), 1.0);
        let want = reference(&g, &b);
        let t = run_session(&Session::new(Device::Cpu), &g, &b);
        // f32 kernels against the f64 reference: a norm of nearly constant
        // rows amplifies f32 rounding (seed 150529: LayerNorm after
        // softmax(softmax(x)) is 1.7e-5 off), so 1e-4 here; hybrid runs the
        // same kernels as thunks and must agree within 1e-5.
        for i in 0..want.len() {
            assert_close(&t[i], &want[i], 1e-4, &format!("thunks output {i}"));
        }
        for policy in [SplitPolicy::default(), every_kth(k)] {
            let s = Session::new(Device::Cpu).mode(ExecMode::Hybrid).policy(policy).poison_freed(true);
            let h = run_session(&s, &g, &b);
            for i in 0..want.len() {
                assert_close(&h[i], &t[i], 1e-5, &format!("hybrid output {i}"));
            }
        }
    }
}

#[test]
/// Regression: in-place epilogues must not overwrite a value that escapes
/// the segment or is read again (found by the property test).
fn in_place_chains_respect_escaping_values() {
    use rlx::ir::Shape;
    for variant in 0..4 {
        let mut g = Graph::new("small");
        let x = g.input("x", Shape::f32(&[1, 3, 4]));
        let r = g.param("r", Shape::f32(&[4]));
        let n5 = g
            .push(
                Op::RmsNorm {
                    axis: -1,
                    eps: 1e-5,
                },
                vec![x, r],
            )
            .unwrap();
        let t = g.push(Op::Activation(Activation::Tanh), vec![n5]).unwrap();
        let out = if variant >= 1 {
            g.push(Op::Activation(Activation::Neg), vec![t]).unwrap()
        } else {
            t
        };
        if variant >= 2 {
            let b8 = g.param("b8", Shape::f32(&[4]));
            g.push(Op::Binary(BinaryOp::Add), vec![out, b8]).unwrap();
        }
        let y = if variant >= 3 {
            g.push(Op::Activation(Activation::Abs), vec![out]).unwrap()
        } else {
            out
        };
        g.set_outputs(vec![y]);
        let b = random_bindings(&g, &mut Rng::new(3), 1.0);
        let t = run_session(&Session::new(Device::Cpu), &g, &b);
        let h = run_session(&Session::new(Device::Cpu).mode(ExecMode::Hybrid), &g, &b);
        assert_eq!(t, h, "variant {variant}");
    }
}
