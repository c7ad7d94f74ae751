//! Rope, Attention, GatedDeltaNet and Lstm against hand-computed values
//! and independent formulations.

#![allow(clippy::needless_range_loop, clippy::cloned_ref_to_slice_refs)]

mod common;
use common::*;
use rlx_ir::{MaskKind, Op, RopeStyle, Tensor};

fn rope_op(head_dim: usize, n_rot: usize, style: RopeStyle) -> Op {
    Op::Rope {
        head_dim,
        n_rot,
        theta: 10000.0,
        style,
    }
}

#[test]
fn rope_at_position_zero_is_identity() {
    let x = rand_vec(2 * 3 * 8, 11);
    for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
        let got = run_f32(
            rope_op(4, 4, style),
            &[t(&[2, 3, 8], &x), Tensor::i64(&[3], vec![0, 0, 0])],
        );
        assert_close(&got, &f64s(&x), 0.0);
    }
}

#[test]
fn rope_hand_values_neox_and_gptj() {
    // head_dim 4, n_rot 4, pos 1: pair 0 angle 1, pair 1 angle 10000^-0.5 = 0.01.
    let (c1, s1) = (1f64.cos(), 1f64.sin());
    let (c2, s2) = (0.01f64.cos(), 0.01f64.sin());
    let pos = Tensor::i32(&[1], vec![1]);
    let neox = run_f32(
        rope_op(4, 4, RopeStyle::NeoX),
        &[t(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]), pos.clone()],
    );
    // NeoX pairs (0, 2) and (1, 3).
    assert_close(
        &neox,
        &[
            c1 - 3.0 * s1,
            2.0 * c2 - 4.0 * s2,
            s1 + 3.0 * c1,
            2.0 * s2 + 4.0 * c2,
        ],
        1e-6,
    );
    let gptj = run_f32(
        rope_op(4, 4, RopeStyle::GptJ),
        &[t(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]), pos],
    );
    // GPT-J pairs (0, 1) and (2, 3).
    assert_close(
        &gptj,
        &[
            c1 - 2.0 * s1,
            s1 + 2.0 * c1,
            3.0 * c2 - 4.0 * s2,
            3.0 * s2 + 4.0 * c2,
        ],
        1e-6,
    );
}

#[test]
fn rope_partial_rotary_and_norms() {
    // head_dim 6, n_rot 4, 2 heads: dims 4 and 5 of each head pass through,
    // and each rotated pair keeps its norm.
    let x = rand_vec(2 * 3 * 12, 12);
    let pos = Tensor::i64(&[2, 3], vec![0, 5, 17, 3, 1000, 2]);
    for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
        let got = run_f32(rope_op(6, 4, style), &[t(&[2, 3, 12], &x), pos.clone()]);
        for tok in 0..6 {
            for h in 0..2 {
                let base = tok * 12 + h * 6;
                for d in 4..6 {
                    assert_eq!(got[base + d], x[base + d]);
                }
                let pairs: [(usize, usize); 2] = match style {
                    RopeStyle::NeoX => [(0, 2), (1, 3)],
                    RopeStyle::GptJ => [(0, 1), (2, 3)],
                };
                for (a, b) in pairs {
                    let n0 = f64::from(x[base + a]).hypot(f64::from(x[base + b]));
                    let n1 = f64::from(got[base + a]).hypot(f64::from(got[base + b]));
                    assert!((n0 - n1).abs() < 1e-6, "pair norm changed");
                }
            }
        }
        // Per-batch positions equal running each batch row with [S] positions.
        for bi in 0..2 {
            let xb = &x[bi * 36..(bi + 1) * 36];
            let pb = Tensor::i64(&[3], vec![[0, 5, 17], [3, 1000, 2]][bi].to_vec());
            let one = run_f32(rope_op(6, 4, style), &[t(&[1, 3, 12], xb), pb]);
            assert_close(&got[bi * 36..(bi + 1) * 36], &f64s(&one), 0.0);
        }
    }
}

fn attn(heads: usize, head_dim: usize, mask_kind: MaskKind) -> Op {
    Op::Attention {
        num_heads: heads,
        head_dim,
        mask_kind,
        score_scale: None,
        attn_logit_softcap: None,
    }
}

#[test]
fn attention_with_one_key_returns_v() {
    let q = rand_vec(2 * 3 * 4, 20);
    let k = rand_vec(2 * 4, 21);
    let v = rand_vec(2 * 4, 22);
    let got = run_f32(
        attn(2, 2, MaskKind::None),
        &[t(&[2, 3, 4], &q), t(&[2, 1, 4], &k), t(&[2, 1, 4], &v)],
    );
    for bi in 0..2 {
        for i in 0..3 {
            let row = &got[(bi * 3 + i) * 4..(bi * 3 + i + 1) * 4];
            assert_close(row, &f64s(&v[bi * 4..bi * 4 + 4]), 1e-7);
        }
    }
}

#[test]
fn causal_attention_hand_values() {
    // head_dim 1, scale 1: q = [1, 1], k = [0, ln 2]; row 0 sees key 0 only,
    // row 1 weights softmax([0, ln 2]) = [1/3, 2/3].
    let ln2 = std::f32::consts::LN_2;
    let got = run_f32(
        attn(1, 1, MaskKind::Causal),
        &[
            t(&[1, 2, 1], &[1.0, 1.0]),
            t(&[1, 2, 1], &[0.0, ln2]),
            t(&[1, 2, 1], &[3.0, 6.0]),
        ],
    );
    assert_close(&got, &[3.0, 3.0 / 3.0 + 2.0 * 6.0 / 3.0], 1e-6);
    // Random: the first query row equals v[0].
    let (q, k, v) = (
        rand_vec(4 * 6, 23),
        rand_vec(4 * 6, 24),
        rand_vec(4 * 6, 25),
    );
    let got = run_f32(
        attn(2, 3, MaskKind::Causal),
        &[t(&[1, 4, 6], &q), t(&[1, 4, 6], &k), t(&[1, 4, 6], &v)],
    );
    assert_close(&got[..6], &f64s(&v[..6]), 1e-7);
}

#[test]
fn causal_offset_and_fully_masked_rows() {
    let (q, k, v) = (rand_vec(3 * 2, 26), rand_vec(2, 27), rand_vec(2, 28));
    // S_q = 3, S_k = 1: offset -2, rows 0 and 1 see no key and output zeros.
    let got = run_f32(
        attn(1, 2, MaskKind::Causal),
        &[t(&[1, 3, 2], &q), t(&[1, 1, 2], &k), t(&[1, 1, 2], &v)],
    );
    assert_close(
        &got,
        &[0.0, 0.0, 0.0, 0.0, f64::from(v[0]), f64::from(v[1])],
        1e-7,
    );
    // S_q = 1, S_k = 3: the single query sees every key (same as no mask).
    let (k3, v3) = (rand_vec(6, 29), rand_vec(6, 30));
    let ins = [
        t(&[1, 1, 2], &q[..2]),
        t(&[1, 3, 2], &k3),
        t(&[1, 3, 2], &v3),
    ];
    let causal = run_f32(attn(1, 2, MaskKind::Causal), &ins);
    let none = run_f32(attn(1, 2, MaskKind::None), &ins);
    assert_close(&causal, &f64s(&none), 0.0);
}

#[test]
fn sliding_window() {
    let (q, k, v) = (
        rand_vec(4 * 2, 31),
        rand_vec(4 * 2, 32),
        rand_vec(4 * 2, 33),
    );
    let ins = [t(&[1, 4, 2], &q), t(&[1, 4, 2], &k), t(&[1, 4, 2], &v)];
    // Window 1: each query sees only its own key.
    let got = run_f32(attn(1, 2, MaskKind::SlidingWindow(1)), &ins);
    assert_close(&got, &f64s(&v), 1e-7);
    // Window 2 equals a Custom mask over keys {i-1, i} per row.
    let got = run_f32(attn(1, 2, MaskKind::SlidingWindow(2)), &ins);
    for i in 0..4usize {
        let lo = i.saturating_sub(1);
        let n = i + 1 - lo;
        let sub = run_f32(
            attn(1, 2, MaskKind::None),
            &[
                t(&[1, 1, 2], &q[i * 2..i * 2 + 2]),
                t(&[1, n, 2], &k[lo * 2..(i + 1) * 2]),
                t(&[1, n, 2], &v[lo * 2..(i + 1) * 2]),
            ],
        );
        assert_close(&got[i * 2..i * 2 + 2], &f64s(&sub), 1e-6);
    }
    // A window wider than the sequence equals Causal.
    let wide = run_f32(attn(1, 2, MaskKind::SlidingWindow(10)), &ins);
    let causal = run_f32(attn(1, 2, MaskKind::Causal), &ins);
    assert_close(&wide, &f64s(&causal), 0.0);
}

#[test]
fn gqa_equals_repeated_kv_heads() {
    // Hq = 4, Hkv = 2, D = 3: query heads 0,1 read kv head 0; 2,3 read kv head 1.
    let (b, sq, sk, d) = (2, 3, 5, 3);
    let q = rand_vec(b * sq * 4 * d, 40);
    let k = rand_vec(b * sk * 2 * d, 41);
    let v = rand_vec(b * sk * 2 * d, 42);
    let repeat = |x: &[f32]| -> Vec<f32> {
        let mut out = Vec::new();
        for tok in x.chunks(2 * d) {
            for h in [0, 0, 1, 1] {
                out.extend_from_slice(&tok[h * d..(h + 1) * d]);
            }
        }
        out
    };
    for mask in [MaskKind::None, MaskKind::Causal] {
        let gqa = run_f32(
            attn(4, d, mask),
            &[
                t(&[b, sq, 4 * d], &q),
                t(&[b, sk, 2 * d], &k),
                t(&[b, sk, 2 * d], &v),
            ],
        );
        let mha = run_f32(
            attn(4, d, mask),
            &[
                t(&[b, sq, 4 * d], &q),
                t(&[b, sk, 4 * d], &repeat(&k)),
                t(&[b, sk, 4 * d], &repeat(&v)),
            ],
        );
        assert_close(&gqa, &f64s(&mha), 0.0);
    }
}

#[test]
fn custom_mask_equals_dropping_keys() {
    let (q, k, v) = (
        rand_vec(2 * 4, 50),
        rand_vec(3 * 4, 51),
        rand_vec(3 * 4, 52),
    );
    let base = [t(&[1, 2, 4], &q), t(&[1, 3, 4], &k), t(&[1, 3, 4], &v)];
    let kept_k: Vec<f32> = [&k[..4], &k[8..]].concat();
    let kept_v: Vec<f32> = [&v[..4], &v[8..]].concat();
    let want = run_f32(
        attn(2, 2, MaskKind::None),
        &[
            t(&[1, 2, 4], &q),
            t(&[1, 2, 4], &kept_k),
            t(&[1, 2, 4], &kept_v),
        ],
    );
    let masks = [
        t(&[1, 3], &[1.0, 0.0, 0.5]),
        Tensor::u8(&[1, 3], vec![1, 0, 7]),
    ];
    for m in masks {
        let mut ins = base.to_vec();
        ins.push(m);
        let got = run_f32(attn(2, 2, MaskKind::Custom), &ins);
        assert_close(&got, &f64s(&want), 1e-6);
    }
    // Every key masked: zeros.
    let mut ins = base.to_vec();
    ins.push(t(&[1, 3], &[0.0, 0.0, 0.0]));
    let got = run_f32(attn(2, 2, MaskKind::Custom), &ins);
    assert!(got.iter().all(|&x| x == 0.0));
}

#[test]
fn bias_mask() {
    let (q, k, v) = (
        rand_vec(2 * 2, 60),
        rand_vec(3 * 2, 61),
        rand_vec(3 * 2, 62),
    );
    let base = [t(&[1, 2, 2], &q), t(&[1, 3, 2], &k), t(&[1, 3, 2], &v)];
    let ninf = f32::NEG_INFINITY;
    // -inf in the bias masks like Custom; zeros change nothing.
    let mut with_bias = base.to_vec();
    with_bias.push(t(&[1, 1, 1, 3], &[0.0, ninf, 0.0]));
    let mut with_mask = base.to_vec();
    with_mask.push(t(&[1, 3], &[1.0, 0.0, 1.0]));
    assert_close(
        &run_f32(attn(1, 2, MaskKind::Bias), &with_bias),
        &f64s(&run_f32(attn(1, 2, MaskKind::Custom), &with_mask)),
        1e-7,
    );
    // A per-query bias [1,1,2,3] against a hand softmax of q.k/sqrt(2) + bias.
    let bias = [0.3f32, -1.0, 2.0, ninf, ninf, ninf];
    let mut ins = base.to_vec();
    ins.push(t(&[1, 1, 2, 3], &bias));
    let got = run_f32(attn(1, 2, MaskKind::Bias), &ins);
    let scale = 1.0 / 2f64.sqrt();
    let s: Vec<f64> = (0..3)
        .map(|j| {
            (f64::from(q[0]) * f64::from(k[j * 2]) + f64::from(q[1]) * f64::from(k[j * 2 + 1]))
                * scale
                + f64::from(bias[j])
        })
        .collect();
    let z: f64 = s.iter().map(|x| x.exp()).sum();
    let want0: Vec<f64> = (0..2)
        .map(|c| {
            (0..3)
                .map(|j| s[j].exp() / z * f64::from(v[j * 2 + c]))
                .sum()
        })
        .collect();
    assert_close(&got, &[want0[0], want0[1], 0.0, 0.0], 1e-6);
}

#[test]
fn score_scale_and_softcap() {
    // head_dim 1, q = 1, keys [1, 2], v = [10, 20].
    let ins = [
        t(&[1, 1, 1], &[1.0]),
        t(&[1, 2, 1], &[1.0, 2.0]),
        t(&[1, 2, 1], &[10.0, 20.0]),
    ];
    let weighted = |s0: f64, s1: f64| {
        let (e0, e1) = (s0.exp(), s1.exp());
        (10.0 * e0 + 20.0 * e1) / (e0 + e1)
    };
    let op = |scale: Option<f32>, cap: Option<f32>| Op::Attention {
        num_heads: 1,
        head_dim: 1,
        mask_kind: MaskKind::None,
        score_scale: scale,
        attn_logit_softcap: cap,
    };
    let got = run_f32(op(Some(2.0), None), &ins);
    assert_close(&got, &[weighted(2.0, 4.0)], 1e-6);
    let got = run_f32(op(Some(2.0), Some(1.5)), &ins);
    let cap = |s: f64| 1.5 * (s / 1.5).tanh();
    assert_close(&got, &[weighted(cap(2.0), cap(4.0))], 1e-6);
    let got = run_f32(op(None, Some(1e6)), &ins);
    assert_close(&got, &[weighted(1.0, 2.0)], 1e-6);
}

fn gdn(n: usize, carry_state: bool) -> Op {
    Op::GatedDeltaNet {
        state_size: n,
        carry_state,
    }
}

/// One gated delta-rule step on state `s [n][n]`, written from the formula.
fn gdn_step(s: &mut [Vec<f64>], q: &[f64], k: &[f64], v: &[f64], g: f64, beta: f64) -> Vec<f64> {
    let n = q.len();
    for row in s.iter_mut() {
        for x in row.iter_mut() {
            *x *= g.exp();
        }
    }
    let stk: Vec<f64> = (0..n)
        .map(|j| (0..n).map(|i| s[i][j] * k[i]).sum())
        .collect();
    let d: Vec<f64> = (0..n).map(|j| beta * (v[j] - stk[j])).collect();
    for i in 0..n {
        for j in 0..n {
            s[i][j] += k[i] * d[j];
        }
    }
    (0..n)
        .map(|j| (0..n).map(|i| s[i][j] * q[i]).sum::<f64>() / (n as f64).sqrt())
        .collect()
}

#[test]
fn gdn_single_step_from_zero_state() {
    // S = k ⊗ (beta v), so o = (k . q) beta v / sqrt(n).
    let q = [1.0f32, 2.0];
    let k = [0.5f32, -1.0];
    let v = [3.0f32, 4.0];
    let beta = 0.25f32;
    let got = run_f32(
        gdn(2, false),
        &[
            t(&[1, 1, 1, 2], &q),
            t(&[1, 1, 1, 2], &k),
            t(&[1, 1, 1, 2], &v),
            t(&[1, 1, 1], &[-0.7]),
            t(&[1, 1, 1], &[beta]),
        ],
    );
    let kq = 0.5 - 2.0;
    let s = kq * 0.25 / 2f64.sqrt();
    assert_close(&got, &[s * 3.0, s * 4.0], 1e-7);
}

#[test]
fn gdn_with_carried_state_matches_formula() {
    let (b, sl, h, n) = (2, 3, 2, 3);
    let q = rand_vec(b * sl * h * n, 70);
    let k = rand_vec(b * sl * h * n, 71);
    let v = rand_vec(b * sl * h * n, 72);
    let g: Vec<f32> = rand_vec(b * sl * h, 73)
        .iter()
        .map(|x| x * 0.5 - 0.2)
        .collect();
    let beta: Vec<f32> = rand_vec(b * sl * h, 74)
        .iter()
        .map(|x| 0.5 + 0.4 * x)
        .collect();
    let s0 = rand_vec(b * h * n * n, 75);
    let got = run_f32(
        gdn(n, true),
        &[
            t(&[b, sl, h, n], &q),
            t(&[b, sl, h, n], &k),
            t(&[b, sl, h, n], &v),
            t(&[b, sl, h], &g),
            t(&[b, sl, h], &beta),
            t(&[b, h, n, n], &s0),
        ],
    );
    assert_eq!(got.len(), b * (sl + n) * h * n);
    for bi in 0..b {
        for hi in 0..h {
            let mut s: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    let o = ((bi * h + hi) * n + i) * n;
                    f64s(&s0[o..o + n])
                })
                .collect();
            for ti in 0..sl {
                let o = ((bi * sl + ti) * h + hi) * n;
                let gi = (bi * sl + ti) * h + hi;
                let out = gdn_step(
                    &mut s,
                    &f64s(&q[o..o + n]),
                    &f64s(&k[o..o + n]),
                    &f64s(&v[o..o + n]),
                    f64::from(g[gi]),
                    f64::from(beta[gi]),
                );
                let oo = ((bi * (sl + n) + ti) * h + hi) * n;
                assert_close(&got[oo..oo + n], &out, 1e-6);
            }
            for i in 0..n {
                let oo = ((bi * (sl + n) + sl + i) * h + hi) * n;
                assert_close(&got[oo..oo + n], &s[i], 1e-6);
            }
        }
    }
}

#[test]
fn gdn_chunks_chain_through_the_state() {
    // Running 3 steps equals running 2 and then 1 more from the carried state.
    let (b, h, n) = (1, 2, 2);
    let q = rand_vec(3 * h * n, 80);
    let k = rand_vec(3 * h * n, 81);
    let v = rand_vec(3 * h * n, 82);
    let g = rand_vec(3 * h, 83);
    let beta: Vec<f32> = rand_vec(3 * h, 84).iter().map(|x| x.abs()).collect();
    let full = run_f32(
        gdn(n, false),
        &[
            t(&[b, 3, h, n], &q),
            t(&[b, 3, h, n], &k),
            t(&[b, 3, h, n], &v),
            t(&[b, 3, h], &g),
            t(&[b, 3, h], &beta),
        ],
    );
    let cut = 2 * h * n;
    let first = run_f32(
        gdn(n, true),
        &[
            t(&[b, 2, h, n], &q[..cut]),
            t(&[b, 2, h, n], &k[..cut]),
            t(&[b, 2, h, n], &v[..cut]),
            t(&[b, 2, h], &g[..2 * h]),
            t(&[b, 2, h], &beta[..2 * h]),
            t(&[b, h, n, n], &[0.0; 8]),
        ],
    );
    assert_close(&first[..cut], &f64s(&full[..cut]), 1e-6);
    // Packed state rows [S + i, h, j] -> state [h, i, j].
    let mut state = vec![0.0f32; h * n * n];
    for i in 0..n {
        for hi in 0..h {
            for j in 0..n {
                state[(hi * n + i) * n + j] = first[((2 + i) * h + hi) * n + j];
            }
        }
    }
    let last = run_f32(
        gdn(n, true),
        &[
            t(&[b, 1, h, n], &q[cut..]),
            t(&[b, 1, h, n], &k[cut..]),
            t(&[b, 1, h, n], &v[cut..]),
            t(&[b, 1, h], &g[2 * h..]),
            t(&[b, 1, h], &beta[2 * h..]),
            t(&[b, h, n, n], &state),
        ],
    );
    assert_close(&last[..h * n], &f64s(&full[cut..]), 1e-6);
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// One PyTorch LSTM cell step: w_ih [4H, in], w_hh [4H, H], b [4H] row-major.
fn lstm_cell(
    w_ih: &[f64],
    w_hh: &[f64],
    b: &[f64],
    x: &[f64],
    h: &[f64],
    c: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let hs = h.len();
    let gate = |r: usize| -> f64 {
        b[r] + (0..x.len())
            .map(|p| w_ih[r * x.len() + p] * x[p])
            .sum::<f64>()
            + (0..hs).map(|p| w_hh[r * hs + p] * h[p]).sum::<f64>()
    };
    let mut h2 = vec![0.0; hs];
    let mut c2 = vec![0.0; hs];
    for u in 0..hs {
        let i = sigmoid(gate(u));
        let f = sigmoid(gate(hs + u));
        let g = gate(2 * hs + u).tanh();
        let o = sigmoid(gate(3 * hs + u));
        c2[u] = f * c[u] + i * g;
        h2[u] = o * c2[u].tanh();
    }
    (h2, c2)
}

fn lstm(hidden: usize, layers: usize, bidirectional: bool, carry: bool) -> Op {
    Op::Lstm {
        hidden_size: hidden,
        num_layers: layers,
        bidirectional,
        carry,
    }
}

#[test]
fn lstm_single_step_by_hand() {
    // H = 1, in = 1: gates i, f, g, o.
    let (wi, wh, bias) = (
        [0.5f32, -0.3, 0.8, 1.2],
        [0.1f32, 0.2, -0.4, 0.3],
        [0.05f32, 0.1, -0.2, 0.0],
    );
    let x = 0.7f64;
    let (h0, c0) = (0.4f64, -0.6f64);
    let gate = |r: usize| f64::from(wi[r]) * x + f64::from(wh[r]) * h0 + f64::from(bias[r]);
    let c1 = sigmoid(gate(1)) * c0 + sigmoid(gate(0)) * gate(2).tanh();
    let h1 = sigmoid(gate(3)) * c1.tanh();
    let got = run_f32(
        lstm(1, 1, false, true),
        &[
            t(&[1, 1, 1], &[0.7]),
            t(&[1, 4, 1], &wi),
            t(&[1, 4, 1], &wh),
            t(&[1, 4], &bias),
            t(&[1, 1, 1], &[0.4]),
            t(&[1, 1, 1], &[-0.6]),
        ],
    );
    assert_close(&got, &[h1], 1e-7);
    // Without carry the state starts at zero.
    let got = run_f32(
        lstm(1, 1, false, false),
        &[
            t(&[1, 1, 1], &[0.7]),
            t(&[1, 4, 1], &wi),
            t(&[1, 4, 1], &wh),
            t(&[1, 4], &bias),
        ],
    );
    let gate0 = |r: usize| f64::from(wi[r]) * x + f64::from(bias[r]);
    let c = sigmoid(gate0(0)) * gate0(2).tanh();
    assert_close(&got, &[sigmoid(gate0(3)) * c.tanh()], 1e-7);
}

#[test]
fn lstm_sequence_matches_stepped_cells() {
    let (b, s, inp, hs) = (2, 3, 3, 2);
    let x = rand_vec(b * s * inp, 90);
    let w_ih = rand_vec(4 * hs * inp, 91);
    let w_hh = rand_vec(4 * hs * hs, 92);
    let bias = rand_vec(4 * hs, 93);
    let h0 = rand_vec(b * hs, 94);
    let c0 = rand_vec(b * hs, 95);
    let got = run_f32(
        lstm(hs, 1, false, true),
        &[
            t(&[b, s, inp], &x),
            t(&[1, 4 * hs, inp], &w_ih),
            t(&[1, 4 * hs, hs], &w_hh),
            t(&[1, 4 * hs], &bias),
            t(&[1, b, hs], &h0),
            t(&[1, b, hs], &c0),
        ],
    );
    for bi in 0..b {
        let mut h = f64s(&h0[bi * hs..(bi + 1) * hs]);
        let mut c = f64s(&c0[bi * hs..(bi + 1) * hs]);
        for ti in 0..s {
            let xt = f64s(&x[(bi * s + ti) * inp..(bi * s + ti + 1) * inp]);
            (h, c) = lstm_cell(&f64s(&w_ih), &f64s(&w_hh), &f64s(&bias), &xt, &h, &c);
            let o = (bi * s + ti) * hs;
            assert_close(&got[o..o + hs], &h, 1e-6);
        }
    }
}

#[test]
fn lstm_bidirectional_backward_runs_reversed() {
    let (b, s, inp, hs) = (1, 4, 2, 2);
    // max_in = max(in, D*H) = 4: layer 0 uses the first 2 columns.
    let x = rand_vec(b * s * inp, 100);
    let fw_ih = rand_vec(4 * hs * inp, 101);
    let bw_ih = rand_vec(4 * hs * inp, 102);
    let w_hh = rand_vec(2 * 4 * hs * hs, 103);
    let bias = rand_vec(2 * 4 * hs, 104);
    let mut packed_ih = vec![0.0f32; 2 * 4 * hs * 4];
    for (d, w) in [&fw_ih, &bw_ih].into_iter().enumerate() {
        for r in 0..4 * hs {
            for p in 0..inp {
                packed_ih[(d * 4 * hs + r) * 4 + p] = w[r * inp + p];
            }
        }
    }
    let got = run_f32(
        lstm(hs, 1, true, false),
        &[
            t(&[b, s, inp], &x),
            t(&[2, 4 * hs, 4], &packed_ih),
            t(&[2, 4 * hs, hs], &w_hh),
            t(&[2, 4 * hs], &bias),
        ],
    );
    let one_dir = |w_ih: &[f32], w_hh: &[f32], bias: &[f32], x: &[f32]| {
        run_f32(
            lstm(hs, 1, false, false),
            &[
                t(&[b, s, inp], x),
                t(&[1, 4 * hs, inp], w_ih),
                t(&[1, 4 * hs, hs], w_hh),
                t(&[1, 4 * hs], bias),
            ],
        )
    };
    let n = 4 * hs * hs;
    let fwd = one_dir(&fw_ih, &w_hh[..n], &bias[..4 * hs], &x);
    let rev_x: Vec<f32> = x.chunks(inp).rev().flatten().copied().collect();
    let bwd_rev = one_dir(&bw_ih, &w_hh[n..], &bias[4 * hs..], &rev_x);
    for ti in 0..s {
        let row = &got[ti * 2 * hs..(ti + 1) * 2 * hs];
        assert_close(&row[..hs], &f64s(&fwd[ti * hs..(ti + 1) * hs]), 1e-6);
        let tb = s - 1 - ti;
        assert_close(&row[hs..], &f64s(&bwd_rev[tb * hs..(tb + 1) * hs]), 1e-6);
    }
}

#[test]
fn lstm_two_layers_equal_chained_layers() {
    let (b, s, inp, hs) = (2, 3, 3, 2);
    // max_in = max(3, 2) = 3: layer 1 uses the first 2 columns of its w_ih.
    let x = rand_vec(b * s * inp, 110);
    let w0 = rand_vec(4 * hs * inp, 111);
    let w1 = rand_vec(4 * hs * hs, 112);
    let w_hh = rand_vec(2 * 4 * hs * hs, 113);
    let bias = rand_vec(2 * 4 * hs, 114);
    let h0 = rand_vec(2 * b * hs, 115);
    let c0 = rand_vec(2 * b * hs, 116);
    let mut packed = w0.clone();
    for r in 0..4 * hs {
        packed.extend_from_slice(&w1[r * hs..(r + 1) * hs]);
        packed.push(0.0);
    }
    let got = run_f32(
        lstm(hs, 2, false, true),
        &[
            t(&[b, s, inp], &x),
            t(&[2, 4 * hs, inp], &packed),
            t(&[2, 4 * hs, hs], &w_hh),
            t(&[2, 4 * hs], &bias),
            t(&[2, b, hs], &h0),
            t(&[2, b, hs], &c0),
        ],
    );
    let n = 4 * hs * hs;
    let (sb, sh) = (4 * hs, b * hs);
    let l0 = run_f32(
        lstm(hs, 1, false, true),
        &[
            t(&[b, s, inp], &x),
            t(&[1, 4 * hs, inp], &w0),
            t(&[1, 4 * hs, hs], &w_hh[..n]),
            t(&[1, 4 * hs], &bias[..sb]),
            t(&[1, b, hs], &h0[..sh]),
            t(&[1, b, hs], &c0[..sh]),
        ],
    );
    let l1 = run_f32(
        lstm(hs, 1, false, true),
        &[
            t(&[b, s, hs], &l0),
            t(&[1, 4 * hs, hs], &w1),
            t(&[1, 4 * hs, hs], &w_hh[n..]),
            t(&[1, 4 * hs], &bias[sb..]),
            t(&[1, b, hs], &h0[sh..]),
            t(&[1, b, hs], &c0[sh..]),
        ],
    );
    assert_close(&got, &f64s(&l1), 1e-6);
}
