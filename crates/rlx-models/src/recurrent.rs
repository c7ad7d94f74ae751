//! Recurrent model graphs: a Qwen3-Next-style GatedDeltaNet block and a
//! hybrid decoder that stacks three GDN layers per attention layer.
//!
//! The GDN block (per call over `S` new tokens, with carried state):
//!
//! 1. in-projections: `x W_qkvz -> [q | k | v | z]`, `x W_ba -> [b | a]`;
//! 2. a causal depthwise conv1d (kernel `K`, no bias) over the `[q | k | v]`
//!    channels, continuing from the carried conv state (the previous call's
//!    last `K - 1` pre-conv rows), then SiLU;
//! 3. GQA repeat of q and k from `Hk` to `Hv` heads (head `h` reads key head
//!    `h / (Hv / Hk)`, PyTorch's `repeat_interleave`), then L2 normalization
//!    of q and k per head, `x * rsqrt(sum(x^2) + 1e-6)`;
//! 4. `beta = sigmoid(b)`, `g = A * softplus(a + dt_bias)` with `A = -exp(A_log)`;
//! 5. `Op::GatedDeltaNet` with the carried state;
//! 6. gated RMSNorm per head, `RmsNorm(o) * silu(z)`;
//! 7. out-projection.
//!
//! The graph is written in plain ops; the hybrid planner keeps the
//! GatedDeltaNet (and the layout changes around it) on thunks and compiles
//! the projections, the conv arithmetic, the norms and the gates.
//!
//! Param conventions: linear weights are `[in, out]` (`MatMul(x, W)` is
//! PyTorch's `x W^T`); the conv weight is split into `K` taps
//! `conv_w.{j}` of shape `[C]` (tap `j` multiplies the input `K - 1 - j`
//! steps back, i.e. PyTorch's `conv1d.weight[:, 0, j]`); `A` holds
//! `-exp(A_log)`, computed when weights are loaded. The conv state is
//! `[B, K - 1, C]` (time-major, unlike PyTorch's `[B, C, K]` cache) and the
//! recurrent state `[B, Hv, n, n]`.

use rlx_ir::{
    op::{Activation, BinaryOp, MaskKind, ReduceOp, RopeStyle},
    DType, Graph, IrError, NodeId, Op, Shape, Tensor,
};
use std::collections::HashMap;

/// Sizes of one GatedDeltaNet block.
#[derive(Debug, Clone, PartialEq)]
pub struct GdnConfig {
    /// Model width D.
    pub hidden: usize,
    /// Query/key heads Hk.
    pub num_k_heads: usize,
    /// Value heads Hv (a multiple of Hk); the GDN runs with Hv heads.
    pub num_v_heads: usize,
    /// Head dim n of q, k and v (the state is `n x n` per head).
    pub head_dim: usize,
    /// Causal conv kernel length K (at least 1).
    pub conv_kernel: usize,
    /// Epsilon of the gated RMSNorm.
    pub norm_eps: f32,
}

impl GdnConfig {
    /// Qwen3-Next-80B's linear-attention layer: D 2048, 16 key heads,
    /// 32 value heads, head dim 128, conv kernel 4.
    pub fn qwen3_next() -> Self {
        GdnConfig {
            hidden: 2048,
            num_k_heads: 16,
            num_v_heads: 32,
            head_dim: 128,
            conv_kernel: 4,
            norm_eps: 1e-6,
        }
    }

    /// `Hk * n`.
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_dim
    }

    /// `Hv * n`.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_dim
    }

    /// Conv channels C = `2 * key_dim + value_dim` (q, k and v).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Dims of the carried conv state for batch `b`: `[b, K - 1, C]`.
    pub fn conv_state_dims(&self, b: usize) -> Vec<usize> {
        vec![b, self.conv_kernel - 1, self.conv_dim()]
    }

    /// Dims of the carried recurrent state for batch `b`: `[b, Hv, n, n]`.
    pub fn ssm_state_dims(&self, b: usize) -> Vec<usize> {
        vec![b, self.num_v_heads, self.head_dim, self.head_dim]
    }

    /// Errors (naming the node about to be built) on zero sizes, a conv
    /// kernel below 2, or value heads not divisible by key heads.
    fn check(&self, next: NodeId) -> Result<(), IrError> {
        let bad = self.hidden == 0
            || self.num_k_heads == 0
            || self.head_dim == 0
            || self.conv_kernel < 2
            || !self.num_v_heads.is_multiple_of(self.num_k_heads)
            || self.num_v_heads == 0;
        if bad {
            return Err(IrError::Shape {
                node: next,
                op: "GatedDeltaNet block".into(),
                inputs: vec![],
                expected: format!(
                    "non-zero sizes, conv kernel >= 2 and value heads divisible by key heads, got {self:?}"
                ),
            });
        }
        Ok(())
    }
}

/// The nodes a GDN block returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnBlockOut {
    /// Block output `[B, S, D]` (before any residual).
    pub out: NodeId,
    /// Next conv state `[B, K - 1, C]`.
    pub conv_state: NodeId,
    /// Next recurrent state `[B, Hv, n, n]`.
    pub ssm_state: NodeId,
}

fn narrow(
    g: &mut Graph,
    x: NodeId,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<NodeId, IrError> {
    g.push(Op::Narrow { axis, start, len }, vec![x])
}

fn reshape(g: &mut Graph, x: NodeId, dims: &[usize]) -> Result<NodeId, IrError> {
    g.push(
        Op::Reshape {
            shape: dims.to_vec(),
        },
        vec![x],
    )
}

fn bin(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
    g.push(Op::Binary(op), vec![a, b])
}

fn act(g: &mut Graph, a: Activation, x: NodeId) -> Result<NodeId, IrError> {
    g.push(Op::Activation(a), vec![x])
}

/// `x * rsqrt(sum(x^2, last axis) + eps)`.
fn l2_normalize(g: &mut Graph, x: NodeId, eps: NodeId) -> Result<NodeId, IrError> {
    let sq = bin(g, BinaryOp::Mul, x, x)?;
    let rank = g.node(x).shape.rank();
    let ss = g.push(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![rank - 1],
            keep_dims: true,
        },
        vec![sq],
    )?;
    let ss = bin(g, BinaryOp::Add, ss, eps)?;
    let inv = act(g, Activation::Rsqrt, ss)?;
    bin(g, BinaryOp::Mul, x, inv)
}

/// Append one GDN block reading `x [B, S, D]`, the conv state
/// `[B, K-1, C]` and the recurrent state `[B, Hv, n, n]`. Params are named
/// `{prefix}.in_proj_qkvz [D, C + Hv*n]`, `{prefix}.in_proj_ba [D, 2*Hv]`,
/// `{prefix}.conv_w.{j} [C]` for `j < K`, `{prefix}.dt_bias [Hv]`,
/// `{prefix}.A [Hv]`, `{prefix}.norm [n]`, `{prefix}.out_proj [Hv*n, D]`.
pub fn gdn_block(
    g: &mut Graph,
    cfg: &GdnConfig,
    prefix: &str,
    x: NodeId,
    conv_state: NodeId,
    ssm_state: NodeId,
) -> Result<GdnBlockOut, IrError> {
    cfg.check(NodeId(g.len() as u32))?;
    let xs = g.node(x).shape.dims.clone();
    let (b, s) = (xs[0], xs[1]);
    let (hk, hv, n, kk) = (
        cfg.num_k_heads,
        cfg.num_v_heads,
        cfg.head_dim,
        cfg.conv_kernel,
    );
    let (kd, vd, c) = (cfg.key_dim(), cfg.value_dim(), cfg.conv_dim());
    let f = |d: &[usize]| Shape::f32(d);
    let p = |g: &mut Graph, name: &str, d: &[usize]| g.param(&format!("{prefix}.{name}"), f(d));

    // 1. In-projections and gates (row-local: one compiled segment).
    let w_qkvz = p(g, "in_proj_qkvz", &[cfg.hidden, c + vd]);
    let w_ba = p(g, "in_proj_ba", &[cfg.hidden, 2 * hv]);
    let dt_bias = p(g, "dt_bias", &[hv]);
    let a_neg = p(g, "A", &[hv]);
    let taps: Vec<NodeId> = (0..kk)
        .map(|j| p(g, &format!("conv_w.{j}"), &[c]))
        .collect();
    let norm_w = p(g, "norm", &[n]);
    let w_out = p(g, "out_proj", &[vd, cfg.hidden]);
    let eps = g.constant(Tensor::f32(&[1], vec![1e-6]));

    let qkvz = g.push(Op::MatMul, vec![x, w_qkvz])?;
    let mixed = narrow(g, qkvz, 2, 0, c)?;
    let z = narrow(g, qkvz, 2, c, vd)?;
    let ba = g.push(Op::MatMul, vec![x, w_ba])?;
    let bgate = narrow(g, ba, 2, 0, hv)?;
    let agate = narrow(g, ba, 2, hv, hv)?;
    let beta = act(g, Activation::Sigmoid, bgate)?;
    let a_dt = bin(g, BinaryOp::Add, agate, dt_bias)?;
    let sp = act(g, Activation::Softplus, a_dt)?;
    let gdecay = bin(g, BinaryOp::Mul, sp, a_neg)?;

    // 2. Causal depthwise conv over [conv_state | mixed] along time (thunks
    //    for the time shifts, one compiled segment for the taps).
    let xp = g.push(Op::Concat { axis: 1 }, vec![conv_state, mixed])?;
    let shifted: Vec<NodeId> = (0..kk)
        .map(|j| narrow(g, xp, 1, j, s))
        .collect::<Result<_, _>>()?;
    let new_conv = narrow(g, xp, 1, s, kk - 1)?;
    let mut conv = bin(g, BinaryOp::Mul, shifted[0], taps[0])?;
    for j in 1..kk {
        let t = bin(g, BinaryOp::Mul, shifted[j], taps[j])?;
        conv = bin(g, BinaryOp::Add, conv, t)?;
    }
    let conv = act(g, Activation::Silu, conv)?;
    let q = narrow(g, conv, 2, 0, kd)?;
    let k = narrow(g, conv, 2, kd, kd)?;
    let v = narrow(g, conv, 2, 2 * kd, vd)?;

    // 3. Heads, GQA repeat (q, k: Hk -> Hv), then L2 norm of q and k.
    // The width-changing reshapes and the Expand run as thunks; they are
    // all built first so that the per-head reshapes and the L2 norms that
    // follow form one compiled segment.
    let r = hv / hk;
    let split = |g: &mut Graph, t: NodeId| -> Result<NodeId, IrError> {
        if r == 1 {
            return reshape(g, t, &[b, s, hv, n]);
        }
        let t5 = reshape(g, t, &[b, s, hk, 1, n])?;
        g.push(
            Op::Expand {
                shape: vec![b, s, hk, r, n],
            },
            vec![t5],
        )
    };
    let q = split(g, q)?;
    let k = split(g, k)?;
    let v = reshape(g, v, &[b, s, hv, n])?;
    let (q, k) = if r == 1 {
        (q, k)
    } else {
        (
            reshape(g, q, &[b, s, hv, n])?,
            reshape(g, k, &[b, s, hv, n])?,
        )
    };
    let q = l2_normalize(g, q, eps)?;
    let k = l2_normalize(g, k, eps)?;

    // 4-5. The recurrence, with the state carried in and out.
    let out = g.push(
        Op::GatedDeltaNet {
            state_size: n,
            carry_state: true,
        },
        vec![q, k, v, gdecay, beta, ssm_state],
    )?;
    let o = narrow(g, out, 1, 0, s)?;
    let new_state = narrow(g, out, 1, s, n)?;
    let new_state = g.push(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![new_state],
    )?;

    // 6. Gated RMSNorm per head: RmsNorm(o) * silu(z).
    let z4 = reshape(g, z, &[b, s, hv, n])?;
    let on = g.push(
        Op::RmsNorm {
            axis: -1,
            eps: cfg.norm_eps,
        },
        vec![o, norm_w],
    )?;
    let zs = act(g, Activation::Silu, z4)?;
    let gated = bin(g, BinaryOp::Mul, on, zs)?;
    let gated = reshape(g, gated, &[b, s, vd])?;

    // 7. Out-projection.
    let y = g.push(Op::MatMul, vec![gated, w_out])?;
    Ok(GdnBlockOut {
        out: y,
        conv_state: new_conv,
        ssm_state: new_state,
    })
}

/// A graph of one GDN block: inputs `x [B, S, D]`, `conv_state` and
/// `ssm_state`; outputs the block output, the next conv state and the next
/// recurrent state. Params are prefixed `gdn`.
pub fn gdn_block_graph(cfg: &GdnConfig, batch: usize, seq: usize) -> Result<Graph, IrError> {
    let mut g = Graph::new("gdn_block");
    let x = g.input("x", Shape::f32(&[batch, seq, cfg.hidden]));
    let cs = g.input("conv_state", Shape::f32(&cfg.conv_state_dims(batch)));
    let ss = g.input("ssm_state", Shape::f32(&cfg.ssm_state_dims(batch)));
    let o = gdn_block(&mut g, cfg, "gdn", x, cs, ss)?;
    g.set_outputs(vec![o.out, o.conv_state, o.ssm_state]);
    Ok(g)
}

/// Sizes of the hybrid decoder: groups of three GDN layers and one
/// attention layer, each followed by a SwiGLU MLP, with pre-RMSNorm and
/// residuals.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// The GDN layers' sizes (its `hidden` is the model width).
    pub gdn: GdnConfig,
    /// Groups of `[GDN, GDN, GDN, attention]`.
    pub num_groups: usize,
    /// Attention query heads.
    pub attn_heads: usize,
    /// Attention key/value heads.
    pub attn_kv_heads: usize,
    /// Attention head dim.
    pub attn_head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Vocabulary rows of the embedding table.
    pub vocab: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub eps: f32,
}

impl HybridConfig {
    /// A small config for tests and demos: D 256, GDN 4/8 heads of 32,
    /// attention 8/2 heads of 32, MLP 512, vocab 1000, two groups.
    pub fn small() -> Self {
        HybridConfig {
            gdn: GdnConfig {
                hidden: 256,
                num_k_heads: 4,
                num_v_heads: 8,
                head_dim: 32,
                conv_kernel: 4,
                norm_eps: 1e-6,
            },
            num_groups: 2,
            attn_heads: 8,
            attn_kv_heads: 2,
            attn_head_dim: 32,
            intermediate: 512,
            vocab: 1000,
            rope_theta: 10_000.0,
            eps: 1e-6,
        }
    }

    /// Layer `i` is attention when `i % 4 == 3`, else GDN.
    pub fn is_attention(i: usize) -> bool {
        i % 4 == 3
    }

    /// Total layers (`4 * num_groups`).
    pub fn num_layers(&self) -> usize {
        4 * self.num_groups
    }
}

fn swiglu_mlp(g: &mut Graph, cfg: &HybridConfig, pre: &str, x: NodeId) -> Result<NodeId, IrError> {
    let d = cfg.gdn.hidden;
    let f = cfg.intermediate;
    let wg = g.param(&format!("{pre}.mlp.gate_proj"), Shape::f32(&[d, f]));
    let wu = g.param(&format!("{pre}.mlp.up_proj"), Shape::f32(&[d, f]));
    let wd = g.param(&format!("{pre}.mlp.down_proj"), Shape::f32(&[f, d]));
    let gate = g.push(Op::MatMul, vec![x, wg])?;
    let up = g.push(Op::MatMul, vec![x, wu])?;
    let h = g.push(Op::FusedSwiGLU { packed: false }, vec![gate, up])?;
    g.push(Op::MatMul, vec![h, wd])
}

fn attention_block(
    g: &mut Graph,
    cfg: &HybridConfig,
    pre: &str,
    x: NodeId,
    pos: NodeId,
) -> Result<NodeId, IrError> {
    let d = cfg.gdn.hidden;
    let (hq, hkv, hd) = (cfg.attn_heads, cfg.attn_kv_heads, cfg.attn_head_dim);
    let w_qkv = g.param(
        &format!("{pre}.attn.qkv_proj"),
        Shape::f32(&[d, (hq + 2 * hkv) * hd]),
    );
    let w_o = g.param(&format!("{pre}.attn.o_proj"), Shape::f32(&[hq * hd, d]));
    let qkv = g.push(Op::MatMul, vec![x, w_qkv])?;
    let q = narrow(g, qkv, 2, 0, hq * hd)?;
    let k = narrow(g, qkv, 2, hq * hd, hkv * hd)?;
    let v = narrow(g, qkv, 2, (hq + hkv) * hd, hkv * hd)?;
    let rope = Op::Rope {
        head_dim: hd,
        n_rot: hd,
        theta: cfg.rope_theta,
        style: RopeStyle::NeoX,
    };
    let q = g.push(rope.clone(), vec![q, pos])?;
    let k = g.push(rope, vec![k, pos])?;
    let a = g.push(
        Op::Attention {
            num_heads: hq,
            head_dim: hd,
            mask_kind: MaskKind::Causal,
            score_scale: None,
            attn_logit_softcap: None,
        },
        vec![q, k, v],
    )?;
    g.push(Op::MatMul, vec![a, w_o])
}

/// The hybrid decoder over `ids [B, S]` (i64) and `positions [S]` (i64):
/// embedding, `4 * num_groups` layers (GDN, GDN, GDN, attention, ...), each
/// `h += mixer(RmsNorm(h)); h += mlp(RmsNorm(h))`, then a final RmsNorm.
///
/// Each GDN layer `l` has inputs `layers.{l}.conv_state` and
/// `layers.{l}.ssm_state`. Outputs: the final hidden states `[B, S, D]`,
/// then for each GDN layer in order its next conv state and next recurrent
/// state. Attention layers attend within the call (no KV cache).
pub fn hybrid_graph(cfg: &HybridConfig, batch: usize, seq: usize) -> Result<Graph, IrError> {
    let d = cfg.gdn.hidden;
    let mut g = Graph::new("gdn_attention_hybrid");
    let ids = g.input("ids", Shape::new(&[batch, seq], DType::I64));
    let pos = g.input("positions", Shape::new(&[seq], DType::I64));
    let table = g.param("embed_tokens", Shape::f32(&[cfg.vocab, d]));
    let mut h = g.push(Op::Gather { axis: 0 }, vec![table, ids])?;
    let mut state_outs = Vec::new();
    let norm = |g: &mut Graph, name: String, x: NodeId| -> Result<NodeId, IrError> {
        let w = g.param(&name, Shape::f32(&[d]));
        g.push(
            Op::RmsNorm {
                axis: -1,
                eps: cfg.eps,
            },
            vec![x, w],
        )
    };
    for l in 0..cfg.num_layers() {
        let pre = format!("layers.{l}");
        let xn = norm(&mut g, format!("{pre}.input_norm"), h)?;
        let mixed = if HybridConfig::is_attention(l) {
            attention_block(&mut g, cfg, &pre, xn, pos)?
        } else {
            let cs = g.input(
                &format!("{pre}.conv_state"),
                Shape::f32(&cfg.gdn.conv_state_dims(batch)),
            );
            let ss = g.input(
                &format!("{pre}.ssm_state"),
                Shape::f32(&cfg.gdn.ssm_state_dims(batch)),
            );
            let o = gdn_block(&mut g, &cfg.gdn, &format!("{pre}.gdn"), xn, cs, ss)?;
            state_outs.push(o.conv_state);
            state_outs.push(o.ssm_state);
            o.out
        };
        h = bin(&mut g, BinaryOp::Add, h, mixed)?;
        let xn = norm(&mut g, format!("{pre}.post_norm"), h)?;
        let m = swiglu_mlp(&mut g, cfg, &pre, xn)?;
        h = bin(&mut g, BinaryOp::Add, h, m)?;
    }
    let out = norm(&mut g, "final_norm".into(), h)?;
    let mut outs = vec![out];
    outs.extend(state_outs);
    g.set_outputs(outs);
    Ok(g)
}

/// SplitMix64: a tiny seeded generator for synthetic weights.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Seeded synthetic values for every Param of a graph built here, scaled
/// like a trained model's: linear weights uniform in `±1/sqrt(in)`, norm
/// gains near 1, conv taps in `±0.5`, `A` in `(-1.6, -0.6)` (= `-exp(A_log)`),
/// `dt_bias` in `±0.5`, embeddings in `±1`.
pub fn synthetic_weights(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    let mut rng = SplitMix(seed);
    let mut out = HashMap::new();
    for node in g.nodes() {
        let Op::Param { name } = &node.op else {
            continue;
        };
        let dims = &node.shape.dims;
        let numel = node.shape.numel();
        let leaf = name.rsplit('.').next().unwrap_or(name);
        let parent = name.rsplit('.').nth(1).unwrap_or("");
        let mut gen =
            |f: &dyn Fn(f32) -> f32| -> Vec<f32> { (0..numel).map(|_| f(rng.uniform())).collect() };
        let data = if parent == "conv_w" {
            gen(&|u| 0.5 * u)
        } else if leaf == "A" {
            gen(&|u| -1.1 + 0.5 * u)
        } else if leaf == "dt_bias" {
            gen(&|u| 0.5 * u)
        } else if leaf.ends_with("norm") {
            gen(&|u| 1.0 + 0.1 * u)
        } else if name == "embed_tokens" {
            gen(&|u| u)
        } else {
            let scale = 1.0 / (dims[0] as f32).sqrt();
            gen(&|u| scale * u)
        };
        out.insert(name.clone(), Tensor::f32(dims, data));
    }
    out
}
