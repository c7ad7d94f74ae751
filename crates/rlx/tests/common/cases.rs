//! The conformance table: named single-op (and a few small multi-op)
//! graphs covering every `Op` variant, every `Activation`, `BinaryOp`,
//! `MaskKind`, `ReduceOp` and `RopeStyle`, with edge shapes (size-1 dims,
//! odd widths, GQA, decode rows, masks). `tests/conformance.rs` runs the
//! table on every backend against `rlx-ref`; [`op_cases`] ties each `Op`
//! variant to its cases with an exhaustive match, so a new variant does not
//! compile until it has an arm, and the coverage test fails until the arm
//! names a case that holds the op.
//!
//! Adding an op: add its arm to [`op_cases`] and a case to [`all`] (see
//! docs/ADDING_AN_OP.md).

use rlx::ir::op::{Activation, BinaryOp, MaskKind, ReduceOp, RopeStyle};
use rlx::ir::{ActivationPrecision, DType, Graph, NodeId, Op, QuantScheme, Shape, Tensor};

/// One named case of the table.
pub struct Case {
    /// Unique name (the coverage map refers to it).
    pub name: String,
    /// The graph; its leaves get seeded values (`super::random_bindings`)
    /// unless `fixed` names them.
    pub graph: Graph,
    /// Bindings that replace the random ones (special values: NaN, inf,
    /// exact positions).
    pub fixed: Vec<(String, Tensor)>,
    /// Why CUDA does not run this case, when it does not (the backend has
    /// no kernel for the op; the compile error is then checked instead).
    pub no_cuda: Option<&'static str>,
    /// Why the case is outside f16's range (intermediates stored in f16
    /// overflow past 65504), when it is: not run in f16.
    pub no_f16: Option<&'static str>,
}

impl Case {
    fn new(graph: Graph) -> Case {
        Case {
            name: graph.name.clone(),
            graph,
            fixed: Vec::new(),
            no_cuda: None,
            no_f16: None,
        }
    }
    fn fixed(mut self, name: &str, t: Tensor) -> Case {
        self.fixed.push((name.to_string(), t));
        self
    }
    fn no_cuda(mut self, why: &'static str) -> Case {
        self.no_cuda = Some(why);
        self
    }
    fn no_f16(mut self, why: &'static str) -> Case {
        self.no_f16 = Some(why);
        self
    }
}

/// Generates `op_cases` (an exhaustive match: no wildcard) and `OP_ARMS`
/// (every arm's variant name and case names), so the coverage test can walk
/// all arms.
macro_rules! op_case_map {
    ($($variant:literal, $pat:pat => [$($case:literal),+ $(,)?];)+) => {
        /// The table cases that exercise `op`'s variant.
        pub fn op_cases(op: &Op) -> &'static [&'static str] {
            match op {
                $($pat => &[$($case),+],)+
            }
        }
        /// Every arm of [`op_cases`]: (variant name, case names).
        pub const OP_ARMS: &[(&str, &[&str])] = &[$(($variant, &[$($case),+])),+];
    };
}

op_case_map! {
    "Input", Op::Input { .. } => ["act_Relu"];
    "Param", Op::Param { .. } => ["matmul_2d"];
    "Constant", Op::Constant { .. } => ["constant_scale"];
    "MatMul", Op::MatMul => ["matmul_2d", "matmul_1x1", "matmul_bcast_lhs"];
    "FusedMatMulBiasAct", Op::FusedMatMulBiasAct { .. } => ["fused_mm_None", "fused_mm_Gelu"];
    "Activation", Op::Activation(_) => ["act_Relu", "act_Softplus"];
    "Binary", Op::Binary(_) => ["bin_Add_0", "bin_Pow_3"];
    "LayerNorm", Op::LayerNorm { .. } => ["layernorm_3x4x300", "layernorm_2x3x1"];
    "RmsNorm", Op::RmsNorm { .. } => ["rmsnorm_40", "rmsnorm_1"];
    "FusedResidualLN", Op::FusedResidualLN { .. } => ["res_ln_false_20", "res_ln_true_30"];
    "FusedResidualRmsNorm", Op::FusedResidualRmsNorm { .. } => ["res_rms_false_20", "res_rms_true_576"];
    "Reshape", Op::Reshape { .. } => ["reshape", "reshape_param"];
    "Expand", Op::Expand { .. } => ["expand", "expand_rank_up"];
    "Cast", Op::Cast { .. } => ["cast_f_i32", "cast_special_I64", "cast_i64_f"];
    "Gather", Op::Gather { .. } => ["gather_i64", "gather_i32"];
    "Narrow", Op::Narrow { .. } => ["narrow_view", "narrow_copy", "narrow_bytes"];
    "FusedSwiGLU", Op::FusedSwiGLU { .. } => ["swiglu_packed", "swiglu"];
    "Concat", Op::Concat { .. } => ["concat_0", "concat_2", "concat_last_width1"];
    "Rope", Op::Rope { .. } => ["rope_NeoX_8_6", "rope_GptJ_12_4"];
    "Attention", Op::Attention { .. } => ["attn_Causal_4_2_8_7_7", "attn_None_3_3_24_1_1"];
    "GatedDeltaNet", Op::GatedDeltaNet { .. } => ["gdn_plain", "gdn_carry"];
    "Lstm", Op::Lstm { .. } => ["lstm_1layer", "lstm_bidir_carry"];
    "DequantMatMul", Op::DequantMatMul { .. } => ["dequant_Q4_0_[1, 64]_70", "dequant_Q6_K_[1, 256]_70"];
    "CacheWrite", Op::CacheWrite { .. } => ["cache_write_i64_3_1", "cache_write_then_attend"];
    "Softmax", Op::Softmax { .. } => ["softmax_last", "softmax_mid", "softmax_width1"];
    "Transpose", Op::Transpose { .. } => ["transpose", "transpose_2d"];
    "Reduce", Op::Reduce { .. } => ["reduce_Sum_0_false", "reduce_block_Max_0"];
}

/// The `MaskKind` of every attention case must cover this list (an
/// exhaustive match keeps it complete).
pub fn mask_kinds() -> Vec<MaskKind> {
    let all = [
        MaskKind::None,
        MaskKind::Causal,
        MaskKind::SlidingWindow(3),
        MaskKind::Custom,
        MaskKind::Bias,
    ];
    for m in all {
        match m {
            MaskKind::None
            | MaskKind::Causal
            | MaskKind::SlidingWindow(_)
            | MaskKind::Custom
            | MaskKind::Bias => {}
        }
    }
    all.to_vec()
}

/// Every reduce function (exhaustive match keeps the list complete).
pub fn reduce_ops() -> [ReduceOp; 4] {
    let all = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];
    for r in all {
        match r {
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min => {}
        }
    }
    all
}

fn f(dims: &[usize]) -> Shape {
    Shape::f32(dims)
}

/// A one-op graph: `inputs` are (name, shape, is_param).
pub fn one(name: &str, op: Op, inputs: &[(&str, Shape, bool)]) -> Graph {
    let mut g = Graph::new(name);
    let ids: Vec<NodeId> = inputs
        .iter()
        .map(|(n, s, param)| {
            if *param {
                g.param(n, s.clone())
            } else {
                g.input(n, s.clone())
            }
        })
        .collect();
    let y = g.push(op, ids).unwrap_or_else(|e| panic!("{name}: {e}"));
    g.set_outputs(vec![y]);
    g
}

fn attn_op(mask_kind: MaskKind, hq: usize, d: usize, scale: Option<f32>, cap: Option<f32>) -> Op {
    Op::Attention {
        num_heads: hq,
        head_dim: d,
        mask_kind,
        score_scale: scale,
        attn_logit_softcap: cap,
    }
}

/// `[b, sq, hq*d]` x `[b, sk, hkv*d]` attention with the mask input its kind needs.
#[allow(clippy::too_many_arguments)]
fn attn(
    mk: MaskKind,
    (scale, cap): (Option<f32>, Option<f32>),
    b: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    sq: usize,
    sk: usize,
) -> Case {
    let mut ins = vec![
        ("q", f(&[b, sq, hq * d]), false),
        ("k", f(&[b, sk, hkv * d]), false),
        ("v", f(&[b, sk, hkv * d]), false),
    ];
    match mk {
        MaskKind::Custom => ins.push(("keep", f(&[b, sk]), false)),
        MaskKind::Bias => ins.push(("bias", f(&[b, 1, sq, sk]), false)),
        _ => {}
    }
    let mut name = format!("attn_{mk:?}_{hq}_{hkv}_{d}_{sq}_{sk}");
    if b != 2 {
        name.push_str(&format!("_b{b}"));
    }
    if scale.is_some() {
        name.push_str("_scale");
    }
    if cap.is_some() {
        name.push_str("_cap");
    }
    let name = name.replace(['(', ')'], "");
    Case::new(one(&name, attn_op(mk, hq, d, scale, cap), &ins))
}

fn dequant(scheme: QuantScheme, x: &[usize], n: usize, name: &str) -> Case {
    let k = *x.last().unwrap();
    let rb = scheme.row_bytes(k).unwrap();
    let mut g = Graph::new(name);
    let xi = g.input("x", f(x));
    let w = g.param("w", Shape::new(&[n, rb], DType::U8));
    let op = Op::DequantMatMul {
        scheme,
        activations: ActivationPrecision::F32,
    };
    let y = g.push(op, vec![xi, w]).unwrap();
    g.set_outputs(vec![y]);
    Case::new(g)
}

/// The whole table.
pub fn all() -> Vec<Case> {
    let mut c: Vec<Case> = Vec::new();
    matmuls(&mut c);
    elementwise(&mut c);
    norms(&mut c);
    movement(&mut c);
    attention(&mut c);
    sequence(&mut c);
    quantized_and_cache(&mut c);
    softmax_reduce(&mut c);
    chains(&mut c);
    c
}

fn matmuls(c: &mut Vec<Case>) {
    for (name, a, b) in [
        ("matmul_2d", vec![5, 7], vec![7, 3]),
        ("matmul_1x1", vec![1, 1], vec![1, 1]),
        ("matmul_3d_weight", vec![2, 5, 7], vec![7, 3]),
        ("matmul_batched", vec![2, 5, 7], vec![2, 7, 3]),
        ("matmul_bcast_lhs", vec![5, 7], vec![3, 7, 4]),
        ("matmul_bcast_both", vec![2, 1, 5, 7], vec![1, 3, 7, 4]),
        ("matmul_bcast_rank", vec![2, 1, 3, 5], vec![4, 5, 6]),
        ("matmul_odd", vec![7, 13], vec![13, 33]),
        ("matmul_wide", vec![3, 16, 64], vec![64, 48]),
    ] {
        c.push(Case::new(one(
            name,
            Op::MatMul,
            &[("a", f(&a), false), ("b", f(&b), true)],
        )));
    }
    for act in [None]
        .into_iter()
        .chain(Activation::ALL.iter().map(|&a| Some(a)))
    {
        let name = match act {
            None => "fused_mm_None".to_string(),
            Some(a) => format!("fused_mm_{a:?}"),
        };
        c.push(Case::new(one(
            &name,
            Op::FusedMatMulBiasAct { activation: act },
            &[
                ("a", f(&[2, 6, 8]), false),
                ("w", f(&[8, 5]), true),
                ("bias", f(&[5]), true),
            ],
        )));
    }
}

fn elementwise(c: &mut Vec<Case>) {
    for act in Activation::ALL {
        c.push(Case::new(one(
            &format!("act_{act:?}"),
            Op::Activation(act),
            &[("x", f(&[3, 33]), false)],
        )));
        // Wide enough for the CPU's chunked parallel path and SIMD tails.
        c.push(Case::new(one(
            &format!("act_{act:?}_wide"),
            Op::Activation(act),
            &[("x", f(&[3, 4099]), false)],
        )));
        // NaN, zero and large values beside ordinary ones.
        let mut v: Vec<f32> = (0..7).map(|i| i as f32 * 0.37 - 1.1).collect();
        v.extend([f32::NAN, 0.0, 9.0, -9.0, 30.0]);
        let name = format!("act_{act:?}_special");
        c.push(
            Case::new(one(
                &name,
                Op::Activation(act),
                &[("x", f(&[1, 12]), false)],
            ))
            .fixed("x", Tensor::f32(&[1, 12], v)),
        );
    }
    for op in BinaryOp::ALL {
        for (i, (a, b)) in [
            (vec![4, 6], vec![4, 6]),
            (vec![4, 6], vec![6]),
            (vec![1], vec![4, 6]),
            (vec![2, 4, 6], vec![2, 4, 1]),
            (vec![2, 1, 6], vec![1, 4, 1]),
            (vec![13, 7], vec![7]),
            (vec![3, 1, 5], vec![4, 1]),
            (vec![], vec![2, 3]),
            (vec![5, 1], vec![1, 33]),
        ]
        .into_iter()
        .enumerate()
        {
            c.push(Case::new(one(
                &format!("bin_{op:?}_{i}"),
                Op::Binary(op),
                &[("a", f(&a), false), ("b", f(&b), false)],
            )));
        }
    }
    c.push(Case::new(one(
        "swiglu_packed",
        Op::FusedSwiGLU { packed: true },
        &[("x", f(&[3, 16]), false)],
    )));
    c.push(Case::new(one(
        "swiglu",
        Op::FusedSwiGLU { packed: false },
        &[("g", f(&[7, 13]), false), ("u", f(&[7, 13]), false)],
    )));
}

fn norms(c: &mut Vec<Case>) {
    let ln = Op::LayerNorm {
        axis: -1,
        eps: 1e-5,
    };
    // Widths for CUDA's one-warp-per-row kernel (multiples of 4 up to 1024;
    // 1103 rows: a partial last block) and its block-per-row kernel (30,
    // 1100), and a width of one.
    for dims in [
        vec![3, 4, 300],
        vec![1103, 384],
        vec![3, 600],
        vec![2, 1024],
        vec![4, 30],
        vec![2, 1100],
        vec![2, 3, 1],
    ] {
        let d = *dims.last().unwrap();
        let name = format!(
            "layernorm_{}",
            dims.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("x")
        );
        c.push(Case::new(one(
            &name,
            ln.clone(),
            &[
                ("x", f(&dims), false),
                ("g", f(&[d]), true),
                ("b", f(&[d]), true),
            ],
        )));
    }
    for d in [40, 576, 30, 1] {
        c.push(Case::new(one(
            &format!("rmsnorm_{d}"),
            Op::RmsNorm {
                axis: -1,
                eps: 1e-6,
            },
            &[("x", f(&[5, d]), false), ("g", f(&[d]), true)],
        )));
    }
    for (has_bias, d) in [(false, 20), (true, 20), (true, 576), (true, 30)] {
        let mut ins = vec![("x", f(&[2, 3, d]), false), ("r", f(&[2, 3, d]), false)];
        if has_bias {
            ins.push(("bias", f(&[d]), true));
        }
        let mut rms_ins = ins.clone();
        rms_ins.push(("g", f(&[d]), true));
        ins.push(("g", f(&[d]), true));
        ins.push(("beta", f(&[d]), true));
        c.push(Case::new(one(
            &format!("res_ln_{has_bias}_{d}"),
            Op::FusedResidualLN {
                has_bias,
                eps: 1e-12,
            },
            &ins,
        )));
        c.push(Case::new(one(
            &format!("res_rms_{has_bias}_{d}"),
            Op::FusedResidualRmsNorm {
                has_bias,
                eps: 1e-6,
            },
            &rms_ins,
        )));
    }
}

fn movement(c: &mut Vec<Case>) {
    c.push(Case::new(one(
        "reshape",
        Op::Reshape { shape: vec![6, 4] },
        &[("x", f(&[2, 3, 4]), false)],
    )));
    c.push(Case::new(one(
        "reshape_param",
        Op::Reshape { shape: vec![6, 4] },
        &[("x", f(&[2, 3, 4]), true)],
    )));
    c.push(Case::new(one(
        "expand",
        Op::Expand {
            shape: vec![3, 4, 5],
        },
        &[("x", f(&[4, 1]), false)],
    )));
    c.push(Case::new(one(
        "expand_rank_up",
        Op::Expand {
            shape: vec![2, 2, 3, 4],
        },
        &[("x", f(&[2, 3, 4]), false)],
    )));
    c.push(Case::new(one(
        "cast_f_i32",
        Op::Cast { to: DType::I32 },
        &[("x", f(&[10]), false)],
    )));
    c.push(Case::new(one(
        "cast_i64_f",
        Op::Cast { to: DType::F32 },
        &[("x", Shape::new(&[10], DType::I64), false)],
    )));
    c.push(Case::new(one(
        "cast_f_bool",
        Op::Cast { to: DType::Bool },
        &[("x", f(&[10]), false)],
    )));
    // Truncation toward zero, saturation, NaN (Rust `as`), bool = x != 0.
    let special = Tensor::f32(&[5], vec![1.7, -2.5, f32::NAN, 1e20, 0.0]);
    for to in [DType::I32, DType::I64, DType::U8, DType::Bool, DType::F32] {
        c.push(
            Case::new(one(
                &format!("cast_special_{to:?}"),
                Op::Cast { to },
                &[("x", f(&[5]), false)],
            ))
            .fixed("x", special.clone()),
        );
    }
    for (name, idx) in [("gather_i64", DType::I64), ("gather_i32", DType::I32)] {
        c.push(Case::new(one(
            name,
            Op::Gather { axis: 0 },
            &[
                ("table", f(&[11, 6]), true),
                ("ids", Shape::new(&[2, 5], idx), false),
            ],
        )));
    }
    for (name, axis, start, len, shape) in [
        ("narrow_view", 1, 2, 3, f(&[1, 6, 4])),
        ("narrow_copy", 2, 1, 2, f(&[2, 3, 5])),
        ("narrow_bytes", 1, 1, 3, Shape::new(&[2, 5], DType::U8)),
        ("narrow_to_one", 0, 1, 1, f(&[3, 4])),
    ] {
        c.push(Case::new(one(
            name,
            Op::Narrow { axis, start, len },
            &[("x", shape, false)],
        )));
    }
    for axis in 0..3 {
        let mut d2 = vec![2, 3, 4];
        d2[axis] = 5;
        c.push(Case::new(one(
            &format!("concat_{axis}"),
            Op::Concat { axis },
            &[
                ("a", f(&[2, 3, 4]), false),
                ("b", f(&d2), true),
                ("c", f(&[2, 3, 4]), false),
            ],
        )));
    }
    c.push(Case::new(one(
        "concat_last_width1",
        Op::Concat { axis: 2 },
        &[("a", f(&[2, 3, 4]), false), ("b", f(&[2, 3, 1]), false)],
    )));
    c.push(Case::new(one(
        "transpose",
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[("x", f(&[2, 3, 4]), false)],
    )));
    c.push(Case::new(one(
        "transpose_2d",
        Op::Transpose { perm: vec![1, 0] },
        &[("x", f(&[5, 1]), false)],
    )));
    for (style, hd, n_rot, pos) in [
        (RopeStyle::NeoX, 8, 6, vec![5]),
        (RopeStyle::GptJ, 8, 6, vec![2, 5]),
        (RopeStyle::NeoX, 12, 4, vec![2, 5]),
        (RopeStyle::GptJ, 12, 4, vec![5]),
    ] {
        let name = format!("rope_{style:?}_{hd}_{n_rot}");
        let p = pos.iter().product::<usize>();
        let positions: Vec<i64> = (0..p as i64).map(|i| i * 37 % 4096).collect();
        c.push(
            Case::new(one(
                &name,
                Op::Rope {
                    head_dim: hd,
                    n_rot,
                    theta: 10000.0,
                    style,
                },
                &[
                    ("x", f(&[2, 5, 2 * hd]), false),
                    ("pos", Shape::new(&pos, DType::I64), false),
                ],
            ))
            .fixed("pos", Tensor::i64(&pos, positions)),
        );
    }
}

fn attention(c: &mut Vec<Case>) {
    const PLAIN: (Option<f32>, Option<f32>) = (None, None);
    for mk in mask_kinds() {
        // Prefill: GQA, odd lengths, longer keys than queries; S_q >= 16
        // takes the CPU's packed path over several row blocks.
        c.push(attn(mk, PLAIN, 2, 4, 2, 8, 7, 7));
        c.push(attn(mk, PLAIN, 2, 2, 2, 32, 40, 70));
        c.push(attn(mk, PLAIN, 4, 2, 1, 8, 9, 11));
        c.push(attn(mk, PLAIN, 1, 2, 2, 20, 16, 16));
        // Decode rows: one and a few query rows over many keys.
        c.push(attn(mk, PLAIN, 2, 9, 3, 64, 1, 300));
        c.push(attn(mk, PLAIN, 3, 6, 2, 16, 1, 41));
        c.push(attn(mk, PLAIN, 2, 4, 4, 8, 3, 7));
        c.push(attn(mk, PLAIN, 1, 2, 2, 13, 5, 5));
        // A score scale and a logit softcap; fewer keys than queries.
        c.push(attn(mk, (Some(0.2), Some(3.0)), 2, 2, 1, 4, 6, 4));
        c.push(attn(mk, (Some(0.2), Some(3.0)), 2, 4, 2, 8, 70, 90));
    }
    c.push(attn(MaskKind::Causal, (None, Some(5.0)), 2, 4, 1, 16, 3, 9));
    c.push(attn(MaskKind::None, PLAIN, 2, 12, 12, 32, 128, 128));
    c.push(attn(MaskKind::Causal, PLAIN, 2, 3, 1, 128, 20, 33));
    c.push(attn(
        MaskKind::Custom,
        (None, Some(4.0)),
        2,
        2,
        1,
        128,
        2,
        513,
    ));
    c.push(attn(MaskKind::None, PLAIN, 2, 3, 3, 24, 1, 1));
    wide_heads(c);
    // A u8 keep-mask, q = k = v, an explicit score scale.
    for (name, sq) in [("attn_u8_mask", 5), ("attn_decode_u8_mask", 1)] {
        let mut g = Graph::new(name);
        let q = g.input("q", f(&[2, sq, 8]));
        let kv = if sq == 5 {
            q
        } else {
            g.input("kv", f(&[2, 5, 8]))
        };
        let m = g.input("m", Shape::new(&[2, 5], DType::U8));
        let y = g
            .push(
                attn_op(MaskKind::Custom, 2, 4, Some(0.3), None),
                vec![q, kv, kv, m],
            )
            .unwrap();
        g.set_outputs(vec![y]);
        c.push(Case::new(g));
    }
}

/// Heads wider than 128 (Gemma 3: head_dim 256, 4 query heads over 1 KV
/// head, windows on most layers): on CUDA the `*_d256` kernels, whose key
/// tiles are 16 wide and whose scores take two lanes per key. Prefill
/// shapes (1, 7, 64 and 200 query rows over as many keys or more), causal,
/// windows narrower than the keys, softcaps, GQA, keep-masks and
/// decode-shaped rows (1 and 3 queries over ~600 keys); widths 130 and 160
/// for partial rows (130 is no multiple of 4: the decode kernel's scalar
/// loads).
fn wide_heads(c: &mut Vec<Case>) {
    const PLAIN: (Option<f32>, Option<f32>) = (None, None);
    const CAP: (Option<f32>, Option<f32>) = (None, Some(3.0));
    let w = MaskKind::SlidingWindow;
    for (sq, sk) in [
        (1, 1),
        (7, 7),
        (1, 40),
        (7, 40),
        (64, 64),
        (64, 300),
        (200, 200),
    ] {
        c.push(attn(MaskKind::Causal, PLAIN, 1, 4, 1, 256, sq, sk));
    }
    c.push(attn(MaskKind::Causal, PLAIN, 2, 4, 1, 256, 5, 5));
    c.push(attn(MaskKind::None, PLAIN, 2, 2, 2, 256, 7, 19));
    c.push(attn(MaskKind::None, PLAIN, 1, 4, 1, 256, 200, 250));
    c.push(attn(MaskKind::None, PLAIN, 1, 4, 2, 256, 1, 600));
    // Windows narrower than the keys, prefill and decode.
    c.push(attn(w(48), PLAIN, 1, 4, 1, 256, 200, 200));
    c.push(attn(w(48), PLAIN, 1, 4, 1, 256, 64, 100));
    c.push(attn(w(20), PLAIN, 1, 4, 1, 256, 7, 60));
    c.push(attn(w(512), PLAIN, 1, 4, 1, 256, 1, 600));
    c.push(attn(w(512), PLAIN, 1, 4, 1, 256, 64, 600));
    // Softcaps, with and without a score scale.
    c.push(attn(MaskKind::Causal, CAP, 1, 4, 1, 256, 64, 64));
    c.push(attn(MaskKind::Causal, CAP, 1, 4, 1, 256, 1, 600));
    c.push(attn(
        w(30),
        (Some(0.0625), Some(5.0)),
        1,
        4,
        1,
        256,
        200,
        200,
    ));
    c.push(attn(MaskKind::None, (Some(0.1), None), 1, 4, 1, 256, 6, 9));
    // Keep-masks and a bias.
    c.push(attn(MaskKind::Custom, PLAIN, 2, 4, 1, 256, 64, 64));
    c.push(attn(MaskKind::Custom, PLAIN, 1, 4, 1, 256, 3, 600));
    c.push(attn(MaskKind::Bias, PLAIN, 1, 4, 1, 256, 64, 80));
    c.push(attn(MaskKind::Bias, PLAIN, 1, 4, 1, 256, 1, 600));
    // A decode step over a cache of 600 positions, 437 of them filled.
    let keep: Vec<f32> = (0..600).map(|j| if j < 437 { 1.0 } else { 0.0 }).collect();
    let mut case = attn(MaskKind::Custom, PLAIN, 1, 4, 1, 256, 1, 600)
        .fixed("keep", Tensor::f32(&[1, 600], keep));
    case.name.push_str("_filled_437");
    case.graph.name.clone_from(&case.name);
    c.push(case);
    // Widths between 128 and 256.
    c.push(attn(MaskKind::Causal, PLAIN, 1, 2, 1, 160, 9, 20));
    c.push(attn(MaskKind::Causal, PLAIN, 1, 2, 1, 160, 40, 40));
    c.push(attn(MaskKind::Causal, CAP, 1, 2, 2, 130, 1, 300));
    c.push(attn(MaskKind::None, PLAIN, 1, 2, 2, 130, 33, 33));
}

fn sequence(c: &mut Vec<Case>) {
    const NO_RNN: &str = "no CUDA kernel for recurrent scans (GatedDeltaNet, Lstm)";
    for (name, carry) in [("gdn_plain", false), ("gdn_carry", true)] {
        let (b, s, h, n) = (2, 5, 3, 4);
        let mut ins = vec![
            ("q", f(&[b, s, h, n]), false),
            ("k", f(&[b, s, h, n]), false),
            ("v", f(&[b, s, h, n]), false),
            ("g", f(&[b, s, h]), false),
            ("beta", f(&[b, s, h]), false),
        ];
        if carry {
            ins.push(("state", f(&[b, h, n, n]), false));
        }
        let op = Op::GatedDeltaNet {
            state_size: n,
            carry_state: carry,
        };
        c.push(Case::new(one(name, op, &ins)).no_cuda(NO_RNN));
    }
    for (name, layers, bidir, carry) in [
        ("lstm_1layer", 1, false, false),
        ("lstm_bidir_carry", 2, true, true),
    ] {
        let (b, s, input, h) = (2, 4, 3, 5);
        let d = if bidir { 2 } else { 1 };
        let ld = layers * d;
        let mut ins = vec![
            ("x", f(&[b, s, input]), false),
            ("w_ih", f(&[ld, 4 * h, input.max(d * h)]), true),
            ("w_hh", f(&[ld, 4 * h, h]), true),
            ("bias", f(&[ld, 4 * h]), true),
        ];
        if carry {
            ins.push(("h0", f(&[ld, b, h]), false));
            ins.push(("c0", f(&[ld, b, h]), false));
        }
        let op = Op::Lstm {
            hidden_size: h,
            num_layers: layers,
            bidirectional: bidir,
            carry,
        };
        c.push(Case::new(one(name, op, &ins)).no_cuda(NO_RNN));
    }
}

fn quantized_and_cache(c: &mut Vec<Case>) {
    // GEMV (one row) and tiles (prefill), N and M off the tile sizes.
    use QuantScheme as Q;
    for scheme in [Q::Q4_0, Q::Q4_1, Q::Q5_0, Q::Q5_1, Q::Q8_0] {
        for (x, n) in [
            (vec![1, 1, 576], 192),
            (vec![1, 64], 70),
            (vec![1, 11, 96], 130),
            (vec![2, 37, 64], 65),
            (vec![3, 32], 1),
        ] {
            let name = format!("dequant_{}_{:?}_{n}", scheme.name(), x);
            c.push(dequant(scheme, &x, n, &name));
        }
    }
    // Super-blocks of 256: GEMV (also vocabulary-wide, four outputs a warp)
    // and tiles, and Gemma-3-270M's FFN-down shape (K = 2048, N = 640).
    for scheme in [Q::Q4K, Q::Q5K, Q::Q6K] {
        for (x, n) in [
            (vec![1, 1, 512], 192),
            (vec![1, 256], 70),
            (vec![1, 2048], 640),
            (vec![1, 256], 8200),
            (vec![1, 11, 256], 130),
            (vec![2, 37, 512], 65),
            (vec![1, 24, 2048], 640),
            (vec![3, 256], 1),
        ] {
            let name = format!("dequant_{}_{:?}_{n}", scheme.name(), x);
            c.push(dequant(scheme, &x, n, &name));
        }
    }
    // Gemma-3-270M's Q5_0 projections (K = 640 is no whole super-block).
    for x in [vec![1, 640], vec![1, 24, 640]] {
        let name = format!("dequant_Q5_0_{x:?}_1024");
        c.push(dequant(Q::Q5_0, &x, 1024, &name));
    }
    for scheme in [Q::Q2K, Q::Q3K, Q::Q8K] {
        let name = format!("dequant_{}", scheme.name());
        let k = scheme.block_elems();
        c.push(dequant(scheme, &[3, k], 5, &name).no_cuda(
            "CUDA has kernels for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K only",
        ));
    }
    // In place into a param, as output and as an attention input (the
    // decode pattern), with i64 and i32 positions.
    for (idx, at, rows) in [
        (DType::I64, 3usize, 1usize),
        (DType::I32, 0, 4),
        (DType::I64, 6, 2),
    ] {
        let mut g = Graph::new(format!(
            "cache_write_{}_{at}_{rows}",
            idx.to_string().to_lowercase()
        ));
        let cache = g.param("cache", f(&[1, 8, 12]));
        let r = g.input("rows", f(&[1, rows, 12]));
        let p = g.constant(match idx {
            DType::I64 => Tensor::i64(&[1], vec![at as i64]),
            _ => Tensor::i32(&[1], vec![at as i32]),
        });
        let y = g
            .push(Op::CacheWrite { axis: 1 }, vec![cache, r, p])
            .unwrap();
        g.set_outputs(vec![y]);
        c.push(Case::new(g));
    }
    let mut g = Graph::new("cache_write_then_attend");
    let ck = g.param("cache.k", f(&[1, 16, 8]));
    let cv = g.param("cache.v", f(&[1, 16, 8]));
    let q = g.input("q", f(&[1, 1, 16]));
    let k = g.input("k", f(&[1, 1, 8]));
    let v = g.input("v", f(&[1, 1, 8]));
    let pos = g.input("pos", Shape::new(&[1], DType::I64));
    let keep = g.input("keep", f(&[1, 16]));
    let ck = g
        .push(Op::CacheWrite { axis: 1 }, vec![ck, k, pos])
        .unwrap();
    let cv = g
        .push(Op::CacheWrite { axis: 1 }, vec![cv, v, pos])
        .unwrap();
    let a = g
        .push(
            attn_op(MaskKind::Custom, 2, 8, None, None),
            vec![q, ck, cv, keep],
        )
        .unwrap();
    g.set_outputs(vec![a, ck]);
    c.push(Case::new(g));
}

fn softmax_reduce(c: &mut Vec<Case>) {
    for (name, axis, dims) in [
        ("softmax_last", 2, vec![2, 3, 50]),
        ("softmax_mid", 1, vec![2, 7, 3]),
        ("softmax_first", 0, vec![3, 4, 5]),
        ("softmax_width1", 1, vec![4, 1]),
    ] {
        c.push(Case::new(one(
            name,
            Op::Softmax { axis },
            &[("x", f(&dims), false)],
        )));
    }
    for op in reduce_ops() {
        for (i, (axes, keep)) in [(vec![1], false), (vec![0, 2], true), (vec![2], true)]
            .into_iter()
            .enumerate()
        {
            c.push(Case::new(one(
                &format!("reduce_{op:?}_{i}_{keep}"),
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: keep,
                },
                &[("x", f(&[3, 5, 4]), false)],
            )));
        }
        // Few outputs over many elements (CUDA's block, warp and coalesced
        // column kernels).
        for (i, (dims, axes)) in [
            (vec![3, 700], vec![1]),
            (vec![2, 40, 9], vec![0, 1]),
            (vec![4, 100, 48], vec![1]),
            (vec![3, 5, 40], vec![0, 1]),
            (vec![2, 30, 1100], vec![1]),
            (vec![3, 5, 2048], vec![0, 1]),
            (vec![2, 300, 1024], vec![1]),
            (vec![2, 3, 2050], vec![1]),
        ]
        .into_iter()
        .enumerate()
        {
            c.push(Case::new(one(
                &format!("reduce_block_{op:?}_{i}"),
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: false,
                },
                &[("x", f(&dims), false)],
            )));
        }
    }
}

/// Small multi-op graphs: fusions the backends make (reduce of a binary,
/// the pooling tail, an MLP), a constant operand, and mixed row counts.
fn chains(c: &mut Vec<Case>) {
    for (i, (op, rop, hd, md, axes)) in [
        (
            BinaryOp::Mul,
            ReduceOp::Sum,
            vec![2, 9, 8],
            vec![2, 9, 1],
            vec![1],
        ),
        (
            BinaryOp::Mul,
            ReduceOp::Sum,
            vec![2, 37, 384],
            vec![2, 37, 1],
            vec![1],
        ),
        (
            BinaryOp::Mul,
            ReduceOp::Mean,
            vec![3, 300],
            vec![300],
            vec![1],
        ),
        (
            BinaryOp::Sub,
            ReduceOp::Max,
            vec![2, 5, 70],
            vec![5, 1],
            vec![0, 2],
        ),
        (
            BinaryOp::Add,
            ReduceOp::Min,
            vec![4, 6],
            vec![4, 6],
            vec![0],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = Graph::new(format!("reduce_of_{op:?}_{i}"));
        let h = g.input("h", f(&hd));
        let m = g.input("m", f(&md));
        let b = g.push(Op::Binary(op), vec![h, m]).unwrap();
        let r = Op::Reduce {
            op: rop,
            axes,
            keep_dims: false,
        };
        let y = g.push(r, vec![b]).unwrap();
        g.set_outputs(vec![y]);
        c.push(Case::new(g));
    }
    for (b, s, h, normalize, count) in [
        (3, 7, 50, true, "keep_mask"),
        (2, 5, 1100, false, "keep_mask"),
        (3, 9, 96, true, "count"),
    ] {
        let mut g = Graph::new(format!("mean_pool_{b}x{s}x{h}_{normalize}_{count}"));
        let x = g.input("x", f(&[b, s, h]));
        let m = g.input(count, f(&[b, s]));
        let y = rlx::models::bert::mean_pool(&mut g, x, m, normalize).unwrap();
        g.set_outputs(vec![y]);
        let case = Case::new(g);
        c.push(if count == "count" {
            // Random "counts" in [-1, 1) fall under the 1e-9 floor: the
            // mean before the L2 norm reaches ~1e9 (inf in f16; a real
            // mask's count is at least 1).
            case.no_f16("a count under the floor makes the mean exceed f16's range")
        } else {
            case
        });
    }
    let mut g = Graph::new("constant_scale");
    let x = g.input("x", f(&[2, 5, 6]));
    let k = g.constant(Tensor::f32(
        &[6],
        (0..6).map(|i| i as f32 * 0.25 - 0.5).collect(),
    ));
    let y = g.push(Op::Binary(BinaryOp::Mul), vec![x, k]).unwrap();
    g.set_outputs(vec![y]);
    c.push(Case::new(g));
    // An MLP with a residual, a norm and a second matmul: several segments
    // under "decline every 2nd" (split by the softmax over axis 0).
    let mut g = Graph::new("mlp_chain");
    let x = g.input("x", f(&[3, 7, 16]));
    let w1 = g.param("w1", f(&[16, 24]));
    let b1 = g.param("b1", f(&[24]));
    let w2 = g.param("w2", f(&[24, 16]));
    let ga = g.param("ga", f(&[16]));
    let be = g.param("be", f(&[16]));
    let h = g
        .push(
            Op::FusedMatMulBiasAct {
                activation: Some(Activation::Gelu),
            },
            vec![x, w1, b1],
        )
        .unwrap();
    let h = g.push(Op::MatMul, vec![h, w2]).unwrap();
    let h = g
        .push(
            Op::FusedResidualLN {
                has_bias: false,
                eps: 1e-5,
            },
            vec![h, x, ga, be],
        )
        .unwrap();
    let s = g.push(Op::Softmax { axis: 0 }, vec![h]).unwrap();
    let t = g.push(Op::Activation(Activation::Tanh), vec![s]).unwrap();
    let u = g.push(Op::Binary(BinaryOp::Add), vec![t, h]).unwrap();
    let t2 = g
        .push(
            Op::Transpose {
                perm: vec![1, 0, 2],
            },
            vec![u],
        )
        .unwrap();
    let v = g.push(Op::Activation(Activation::Silu), vec![t2]).unwrap();
    g.set_outputs(vec![v]);
    c.push(Case::new(g));
    // Mixed row counts in one run of eligible ops: [B, S, D] work, a
    // per-sequence sum ([B, 1, D]) and work on it, then back to [B, S, D].
    let mut g = Graph::new("mixed_rows");
    let x = g.input("x", f(&[2, 6, 8]));
    let w = g.param("w", f(&[8, 8]));
    let h = g.push(Op::MatMul, vec![x, w]).unwrap();
    let h = g.push(Op::Activation(Activation::Silu), vec![h]).unwrap();
    let r = g
        .push(
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: vec![1],
                keep_dims: true,
            },
            vec![h],
        )
        .unwrap();
    let r = g.push(Op::Activation(Activation::Tanh), vec![r]).unwrap();
    let y = g.push(Op::Binary(BinaryOp::Mul), vec![h, r]).unwrap();
    let y = g.push(Op::MatMul, vec![y, w]).unwrap();
    g.set_outputs(vec![y]);
    c.push(Case::new(g));
}
