//! Property tests: algebraic identities the interpreter must satisfy on
//! random shapes and values.

#![allow(clippy::needless_range_loop, clippy::cloned_ref_to_slice_refs)]

mod common;
use common::*;
use proptest::prelude::*;
use rlx_ir::{Op, Tensor};
use rlx_ref::RefError;

proptest! {
    // A fixed seed, so CI runs the same cases every time.
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x726c_7802),
        ..ProptestConfig::default()
    })]

    /// (A B)^T == B^T A^T.
    #[test]
    fn matmul_transpose_identity(m in 1usize..5, k in 1usize..5, n in 1usize..5, seed in 0u64..1000) {
        let a = rand_vec(m * k, seed);
        let b = rand_vec(k * n, seed + 1);
        let ab = run_f32(Op::MatMul, &[t(&[m, k], &a), t(&[k, n], &b)]);
        let at = run_f32(Op::Transpose { perm: vec![1, 0] }, &[t(&[m, k], &a)]);
        let bt = run_f32(Op::Transpose { perm: vec![1, 0] }, &[t(&[k, n], &b)]);
        let btat = run_f32(Op::MatMul, &[t(&[n, k], &bt), t(&[k, m], &at)]);
        for i in 0..m {
            for j in 0..n {
                prop_assert!((ab[i * n + j] - btat[j * m + i]).abs() < 1e-6);
            }
        }
    }

    /// Softmax rows are positive and sum to one on any axis.
    #[test]
    fn softmax_sums_to_one(d0 in 1usize..4, d1 in 1usize..6, d2 in 1usize..4, axis in 0usize..3, seed in 0u64..1000) {
        let x: Vec<f32> = rand_vec(d0 * d1 * d2, seed).iter().map(|v| v * 20.0).collect();
        let dims = [d0, d1, d2];
        let y = run_f32(Op::Softmax { axis }, &[t(&dims, &x)]);
        let sum = run_f32(
            Op::Reduce { op: rlx_ir::ReduceOp::Sum, axes: vec![axis], keep_dims: false },
            &[t(&dims, &y)],
        );
        for s in sum {
            prop_assert!((s - 1.0).abs() < 1e-6);
        }
    }

    /// Gather either returns rows or reports the bad id; it never panics.
    #[test]
    fn gather_never_panics(rows in 1usize..5, ids in proptest::collection::vec(-3i64..8, 1..6)) {
        let table: Vec<f32> = (0..rows * 2).map(|i| i as f32).collect();
        let res = run_op(Op::Gather { axis: 0 }, &[t(&[rows, 2], &table), Tensor::i64(&[ids.len()], ids.clone())]);
        match ids.iter().position(|&i| i < 0 || i >= rows as i64) {
            Some(p) => prop_assert_eq!(
                res.unwrap_err(),
                RefError::IndexOutOfRange { node: rlx_ir::NodeId(2), id: ids[p], position: p, rows }
            ),
            None => {
                let out = res.unwrap();
                let v = out.as_f32().unwrap();
                for (j, &id) in ids.iter().enumerate() {
                    prop_assert_eq!(v[j * 2], (id * 2) as f32);
                }
            }
        }
    }
}
