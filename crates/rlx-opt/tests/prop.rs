//! Property: on random graphs of matmuls, biases, activations, norms,
//! residual adds, narrows and duplicates, `optimize` returns a graph that
//! verifies and computes the same outputs under the reference interpreter.

mod common;
use common::*;
use proptest::prelude::*;
use rlx_ir::{Activation, Graph, NodeId, Op};

const ACTS: [Activation; 9] = [
    Activation::Relu,
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Silu,
    Activation::Sigmoid,
    Activation::Tanh,
    Activation::Neg,
    Activation::Abs,
    Activation::Softplus,
];
const WIDTHS: [usize; 3] = [4, 8, 12];

struct Builder {
    g: Graph,
    pool: Vec<NodeId>,
    leaves: usize,
}

impl Builder {
    fn last(&self, id: NodeId) -> usize {
        self.g.node(id).shape.last_dim()
    }

    fn weight(&mut self, dims: &[usize], constant_: bool) -> NodeId {
        self.leaves += 1;
        if constant_ {
            constant(&mut self.g, dims, self.leaves as u64)
        } else {
            param(&mut self.g, &format!("p{}", self.leaves), dims)
        }
    }

    fn pick(&self, r: u32) -> NodeId {
        self.pool[r as usize % self.pool.len()]
    }

    fn step(&mut self, choice: u8, r: u32) {
        let bit = |i: u32| (r >> i) & 1 == 1;
        let p = self.pick(r >> 20);
        let d = self.last(p);
        match choice {
            // linear [+ bias] [+ activation]
            0 | 1 => {
                let n = WIDTHS[(r >> 3) as usize % 3];
                let w = self.weight(&[d, n], bit(0));
                let mut y = matmul(&mut self.g, p, w);
                if bit(1) {
                    let b = self.weight(&[n], bit(0));
                    y = if bit(5) {
                        add(&mut self.g, b, y)
                    } else {
                        add(&mut self.g, y, b)
                    };
                }
                if bit(2) {
                    y = act(&mut self.g, ACTS[(r >> 6) as usize % ACTS.len()], y);
                }
                self.pool.push(y);
            }
            // several projections of one lhs (QKV)
            2 => {
                for i in 0..2 + bit(0) as u32 {
                    let n = WIDTHS[((r >> (3 + i)) as usize) % 3];
                    let w = self.weight(&[d, n], bit(1));
                    let mut y = matmul(&mut self.g, p, w);
                    if bit(2) {
                        let b = self.weight(&[n], bit(1));
                        y = add(&mut self.g, y, b);
                    }
                    self.pool.push(y);
                }
            }
            // residual add [+ bias] [+ LayerNorm / RmsNorm]
            3 => {
                let shape = self.g.node(p).shape.clone();
                let same: Vec<NodeId> = self
                    .pool
                    .iter()
                    .copied()
                    .filter(|&q| self.g.node(q).shape == shape)
                    .collect();
                let q = same[(r >> 8) as usize % same.len()];
                let mut s = add(&mut self.g, p, q);
                if bit(0) {
                    let b = self.weight(&[d], bit(4));
                    s = add(&mut self.g, s, b);
                }
                match (r >> 1) % 3 {
                    0 => {
                        let gm = self.weight(&[d], false);
                        let bt = self.weight(&[d], bit(4));
                        s = layer_norm(&mut self.g, s, gm, bt);
                    }
                    1 => {
                        let gm = self.weight(&[d], false);
                        s = push(
                            &mut self.g,
                            Op::RmsNorm {
                                axis: -1,
                                eps: 1e-6,
                            },
                            &[s, gm],
                        );
                    }
                    _ => {}
                }
                self.pool.push(s);
            }
            // packed SwiGLU over halves of p
            4 if d % 2 == 1 => {
                let y = act(&mut self.g, ACTS[(r >> 6) as usize % ACTS.len()], p);
                self.pool.push(y);
            }
            4 => {
                let h = d / 2;
                let ax = self.g.node(p).shape.rank() - 1;
                let a = push(
                    &mut self.g,
                    Op::Narrow {
                        axis: ax,
                        start: 0,
                        len: h,
                    },
                    &[p],
                );
                let b = push(
                    &mut self.g,
                    Op::Narrow {
                        axis: ax,
                        start: h,
                        len: h,
                    },
                    &[p],
                );
                let s = act(&mut self.g, Activation::Silu, a);
                let m = if bit(0) {
                    mul(&mut self.g, b, s)
                } else {
                    mul(&mut self.g, s, b)
                };
                self.pool.push(m);
            }
            // unpacked SwiGLU
            5 => {
                let shape = self.g.node(p).shape.clone();
                let same: Vec<NodeId> = self
                    .pool
                    .iter()
                    .copied()
                    .filter(|&q| self.g.node(q).shape == shape)
                    .collect();
                let q = same[(r >> 8) as usize % same.len()];
                let s = act(&mut self.g, Activation::Silu, p);
                let m = mul(&mut self.g, s, q);
                self.pool.push(m);
            }
            // duplicate an existing compute node (CSE)
            6 => {
                let compute: Vec<NodeId> = self
                    .pool
                    .iter()
                    .copied()
                    .filter(|&n| !self.g.node(n).op.is_leaf())
                    .collect();
                if !compute.is_empty() {
                    let n = self
                        .g
                        .node(compute[(r >> 4) as usize % compute.len()])
                        .clone();
                    let id = self.g.add_node(n.op, n.inputs, n.shape);
                    self.pool.push(id);
                }
            }
            // constant arithmetic that folds
            _ => {
                let c = constant(&mut self.g, &[d], r as u64);
                let c2 = constant(&mut self.g, &[d], r as u64 + 1);
                let n = act(&mut self.g, Activation::Tanh, c);
                let s = add(&mut self.g, n, c2);
                let y = add(&mut self.g, p, s);
                self.pool.push(y);
            }
        }
    }
}

fn build(steps: &[(u8, u32)], outs: u32) -> Graph {
    let mut b = Builder {
        g: Graph::new("random"),
        pool: Vec::new(),
        leaves: 0,
    };
    let x = input(&mut b.g, "x", &[2, 3, 8]);
    let y = input(&mut b.g, "y", &[3, 4]);
    let _unused = input(&mut b.g, "unused", &[5]);
    b.pool.extend([x, y]);
    for &(c, r) in steps {
        b.step(c, r);
    }
    let mut outputs = vec![*b.pool.last().unwrap()];
    for (i, &p) in b.pool.iter().enumerate() {
        if (outs >> (i % 32)) & 1 == 1 && !b.g.node(p).op.is_leaf() {
            outputs.push(p);
        }
    }
    b.g.set_outputs(outputs);
    b.g
}

proptest! {
    // 256 cases unless PROPTEST_CASES says otherwise; a fixed seed, so CI
    // runs the same cases every time.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x726c_7801),
        ..ProptestConfig::default()
    })]

    #[test]
    fn optimize_preserves_semantics(
        steps in prop::collection::vec((0u8..8, any::<u32>()), 1..14),
        outs in any::<u32>(),
        seed in any::<u64>(),
    ) {
        let g = build(&steps, outs);
        prop_assert!(g.verify().is_ok(), "generator bug: {}", g);
        let (h, r) = rlx_opt::optimize(&g, &rlx_opt::OptOptions::default())
            .map_err(|e| TestCaseError::fail(format!("{e}\n{g}")))?;
        prop_assert!(h.verify().is_ok());
        prop_assert!(r.nodes_after == h.len() && r.nodes_before == g.len());
        // Every Input survives, by name.
        for n in g.nodes() {
            if let Op::Input { name } = &n.op {
                let want = Op::Input { name: name.clone() };
                let kept = h.nodes().iter().any(|m| m.op == want);
                prop_assert!(kept, "input {} dropped", name);
            }
        }
        assert_same(&g, &h, seed, 1e-5);
    }
}

/// The generator above is only useful if it reaches every pass: over a
/// fixed set of random graphs, every pass must fire, and every graph must
/// stay exact.
#[test]
fn generator_reaches_every_pass() {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut totals = std::collections::BTreeMap::new();
    for case in 0..150 {
        let n = 1 + next() as usize % 12;
        let steps: Vec<(u8, u32)> = (0..n)
            .map(|_| ((next() % 8) as u8, next() as u32))
            .collect();
        let g = build(&steps, next() as u32);
        let (h, r) = opt(&g);
        assert_same(&g, &h, case, 1e-5);
        for (p, m) in &r.passes {
            for (k, v) in m {
                *totals.entry(format!("{p}/{k}")).or_insert(0usize) += v;
            }
        }
    }
    eprintln!("{totals:#?}");
    for key in [
        "cse/merged",
        "dce/removed",
        "const_fold/folded",
        "fuse_qkv/qkv",
        "fuse_matmul_bias_act/matmul+bias",
        "fuse_residual_norm/residual+LayerNorm",
        "fuse_residual_norm/residual+bias+RmsNorm",
        "fuse_swiglu/swiglu_packed",
        "fuse_swiglu/swiglu",
    ] {
        assert!(
            totals.get(key).copied().unwrap_or(0) > 0,
            "{key} never fired: {totals:#?}"
        );
    }
    assert!(totals
        .keys()
        .any(|k| k.starts_with("fuse_matmul_bias_act/matmul+bias+")));
}
