//! The prefill and decode graphs, in plain ops.
//!
//! Per block: `RmsNorm -> q/k/v -> Rope(q, k) -> CacheWrite(k, v) ->
//! Attention -> o -> Add`, then `RmsNorm -> gate/up -> Silu(gate) * up ->
//! down -> Add`; then the final `RmsNorm` and the head. Linear layers are
//! `DequantMatMul` on packed weights (or `MatMul` on float weights, either
//! followed by an `Add` of the bias where the weights have one), with
//! the activation precision of [`LlamaWeights::activations`]. When
//! the weights hold merged projections ([`LlamaWeights::merge_projections`]),
//! q/k/v come from one `DequantMatMul` split with `Narrow` (in decode, q and
//! k are roped together before the split), and gate/up from
//! one `DequantMatMul` feeding `FusedSwiGLU { packed: true }`.
//!
//! Inputs:
//! - prefill (`S` tokens at positions `0..S`): `ids` i64 `[1, S]`, `pos`
//!   i64 `[S]` (`0..S`). Attention is causal over the fresh k/v; the k/v
//!   rows are also written into the caches at position 0. Only the last
//!   position goes through the head (`Narrow` before the final norm).
//! - decode (one token at position `p`): `ids` i64 `[1, 1]`, `pos` i64 `[1]`
//!   (`[p]`), `kv_mask` f32 `[1, ctx]` (1 for positions `<= p`, else 0).
//!   The new k/v rows are written at `p`, and attention reads the updated
//!   caches with the `Custom` keep-mask.
//! - extend (`S` more tokens at positions `p..p+S` after `p` cached ones: a
//!   later prompt chunk or chat turn): `ids` `[1, S]`, `pos` `[S]`
//!   (`p..p+S`), `start` i64 `[1]` (`[p]`), `kv_bias` f32 `[1, 1, S, ctx]`
//!   ([`extend_bias`]: 0 where key `j <= p + i`, else -inf). The new rows
//!   are written at `p`, and attention reads the updated caches with the
//!   `Bias` mask, causal within the chunk.
//!
//! - batched decode (one token for each of `N` sequences, each at its own
//!   position `p_b` over its own cache): `ids` i64 `[N, 1]`, `pos` i64
//!   `[N, 1]`, `kv_mask` f32 `[N, ctx]` (row `b`: 1 for positions `<= p_b`).
//!   The embedding, norms, projections, FFN and head run on the `[N, 1, d]`
//!   activations (each weight read once per step for all `N` rows), rope
//!   rotates row `b` by `p_b`, and per sequence `b` the graph takes row `b`
//!   of q/k/v and of the mask (`Narrow` on axis 0: views, no copies),
//!   writes k/v into that sequence's own caches at `p_b`, and runs the same
//!   one-query `Attention` as the decode graph; the `N` attention outputs
//!   are concatenated back into `[N, 1, d]` for the output projection.
//!
//! The caches are params `cache.k.{l}` / `cache.v.{l}`, f32 `[1, ctx, kv_dim]`
//! (k after rope), updated in place by `CacheWrite`; in the batched decode
//! graph sequence `b` has its own pair [`batch_cache_names`]`(l, b)`, so each
//! sequence's cache stays in its own buffers. The single output is the
//! logits f32 `[1, 1, vocab]` of the last position (`[N, 1, vocab]`, one row
//! per sequence, for the batched decode).

use super::weights::{bias_name, gate_up_name, qkv_name, EMBED_TABLE, ROPE_FREQS};
use super::{FfnAct, Linear, LlamaError, LlamaWeights};
use rlx_ir::{Activation, BinaryOp, DType, Graph, MaskKind, NodeId, Op, Shape, Tensor};
use std::collections::HashMap;

/// Which graph to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `seq_len` prompt tokens at positions `0..seq_len`.
    Prefill {
        /// Prompt length S (1 ..= ctx).
        seq_len: usize,
    },
    /// One token at a runtime position.
    Decode,
    /// `seq_len` tokens at runtime positions `p..p + seq_len`, after the
    /// `p` tokens already in the cache.
    Extend {
        /// Chunk length S (1 ..= ctx).
        seq_len: usize,
    },
    /// One token for each of `batch` sequences, each at its own runtime
    /// position over its own caches ([`batch_cache_names`]).
    DecodeBatch {
        /// Sequences per step N (>= 1).
        batch: usize,
    },
}

/// The `kv_bias` input of [`Phase::Extend`]: `[1, 1, seq_len, ctx_len]`,
/// row `i` is 0 for keys `j <= start + i` and -inf after.
pub fn extend_bias(start: usize, seq_len: usize, ctx_len: usize) -> Vec<f32> {
    let mut b = vec![f32::NEG_INFINITY; seq_len * ctx_len];
    for (i, row) in b.chunks_exact_mut(ctx_len.max(1)).enumerate() {
        let visible = (start + i + 1).min(ctx_len);
        row[..visible].fill(0.0);
    }
    b
}

/// The name of the sliding-window layers' variant of mask input `name`
/// (`kv_mask` -> `kv_mask_swa`, `kv_bias` -> `kv_bias_swa`): present only in
/// graphs of models with sliding-window layers, where it keeps the last
/// `sliding_window` positions of each query (see [`swa_keep`]).
pub fn swa_input(name: &str) -> String {
    format!("{name}_swa")
}

/// Whether a query at position `q` sees the key at position `k` under a
/// sliding window `w`: `k <= q` and `q - k < w`.
pub fn swa_keep(q: usize, k: usize, w: usize) -> bool {
    k <= q && q - k < w
}

/// Names of the k and v cache params of layer `l`.
pub fn cache_names(l: usize) -> (String, String) {
    (format!("cache.k.{l}"), format!("cache.v.{l}"))
}

/// Names of the k and v cache params of layer `l` for sequence `b` of the
/// batched decode graph ([`Phase::DecodeBatch`]).
pub fn batch_cache_names(l: usize, b: usize) -> (String, String) {
    (format!("cache.k.{l}.b{b}"), format!("cache.v.{l}.b{b}"))
}

/// Declares each param once.
struct Builder<'a> {
    g: Graph,
    w: &'a LlamaWeights,
    params: HashMap<String, NodeId>,
}

impl Builder<'_> {
    fn param(&mut self, name: &str) -> Result<NodeId, LlamaError> {
        if let Some(&id) = self.params.get(name) {
            return Ok(id);
        }
        let t = self
            .w
            .tensors
            .get(name)
            .ok_or_else(|| LlamaError::MissingTensor {
                name: name.into(),
                expected: "a loaded weight".into(),
            })?;
        let id = self.g.param(name, t.shape.clone());
        self.params.insert(name.into(), id);
        Ok(id)
    }

    fn linear(&mut self, x: NodeId, name: &str) -> Result<NodeId, LlamaError> {
        let lin = *self
            .w
            .linears
            .get(name)
            .ok_or_else(|| LlamaError::MissingTensor {
                name: name.into(),
                expected: "a loaded linear weight".into(),
            })?;
        let w = self.param(name)?;
        let y = match lin {
            Linear::Quant { scheme, .. } => self.g.push(
                Op::DequantMatMul {
                    scheme,
                    activations: self.w.activations,
                },
                vec![x, w],
            )?,
            Linear::Dense { .. } => self.g.push(Op::MatMul, vec![x, w])?,
        };
        let bias = bias_name(name);
        if !self.w.tensors.contains_key(&bias) {
            return Ok(y);
        }
        let b = self.param(&bias)?;
        Ok(self.g.push(Op::Binary(BinaryOp::Add), vec![y, b])?)
    }

    /// Columns `start..start + len` of the last axis (2) of a `[B, S, N]` value.
    fn narrow(&mut self, x: NodeId, start: usize, len: usize) -> Result<NodeId, LlamaError> {
        self.narrow_on(x, 2, start, len)
    }

    /// `start..start + len` along `axis`.
    fn narrow_on(
        &mut self,
        x: NodeId,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Result<NodeId, LlamaError> {
        Ok(self.g.push(Op::Narrow { axis, start, len }, vec![x])?)
    }

    /// RMSNorm of every head of `x [n, s, heads * head_dim]` with weight
    /// `name [head_dim]` (q/k norms).
    fn head_norm(
        &mut self,
        x: NodeId,
        name: &str,
        n: usize,
        s: usize,
        heads: usize,
    ) -> Result<NodeId, LlamaError> {
        let d = self.w.config.head_dim;
        let x = self.g.push(
            Op::Reshape {
                shape: vec![n, s, heads, d],
            },
            vec![x],
        )?;
        let x = self.rms_norm(x, name)?;
        Ok(self.g.push(
            Op::Reshape {
                shape: vec![n, s, heads * d],
            },
            vec![x],
        )?)
    }

    fn rms_norm(&mut self, x: NodeId, name: &str) -> Result<NodeId, LlamaError> {
        let gamma = self.param(name)?;
        let eps = self.w.config.rms_eps;
        Ok(self.g.push(Op::RmsNorm { axis: -1, eps }, vec![x, gamma])?)
    }
}

/// Build the prefill, decode, extend or batched decode graph for `weights`
/// with KV caches of `ctx_len` positions. Errors if `seq_len` is 0 or
/// exceeds `ctx_len`, a batch is 0 or over [`super::MAX_DECODE_BATCH`], or
/// a weight is missing from `weights`.
pub fn build_graph(
    weights: &LlamaWeights,
    phase: Phase,
    ctx_len: usize,
) -> Result<Graph, LlamaError> {
    let c = &weights.config;
    let (n, s, name) = match phase {
        Phase::Prefill { seq_len } => (1, seq_len, format!("llama.prefill.{seq_len}")),
        Phase::Decode => (1, 1, "llama.decode".to_string()),
        Phase::Extend { seq_len } => (1, seq_len, format!("llama.extend.{seq_len}")),
        Phase::DecodeBatch { batch } => (batch, 1, format!("llama.decode_batch.{batch}")),
    };
    if n == 0 || n > super::MAX_DECODE_BATCH {
        return Err(LlamaError::BatchSize {
            batch: n,
            max: super::MAX_DECODE_BATCH,
        });
    }
    if s == 0 {
        return Err(LlamaError::EmptyPrompt);
    }
    if s > ctx_len {
        return Err(LlamaError::ContextOverflow { needed: s, ctx_len });
    }
    c.check_ctx(ctx_len)?;
    let mut b = Builder {
        g: Graph::new(name),
        w: weights,
        params: HashMap::new(),
    };
    let batched = matches!(phase, Phase::DecodeBatch { .. });
    let ids = b.g.input("ids", Shape::new(&[n, s], DType::I64));
    let pos = if batched {
        b.g.input("pos", Shape::new(&[n, 1], DType::I64))
    } else {
        b.g.input("pos", Shape::new(&[s], DType::I64))
    };
    let (write_pos, kv_mask) = match phase {
        Phase::Prefill { .. } => (b.g.constant(Tensor::i64(&[1], vec![0])), None),
        Phase::Decode => {
            let m = b.g.input("kv_mask", Shape::f32(&[1, ctx_len]));
            (pos, Some((MaskKind::Custom, m)))
        }
        Phase::Extend { .. } => {
            let start = b.g.input("start", Shape::new(&[1], DType::I64));
            let m = b.g.input("kv_bias", Shape::f32(&[1, 1, s, ctx_len]));
            (start, Some((MaskKind::Bias, m)))
        }
        Phase::DecodeBatch { .. } => {
            let m = b.g.input("kv_mask", Shape::f32(&[n, ctx_len]));
            (pos, Some((MaskKind::Custom, m)))
        }
    };
    // The sliding-window layers' masks: the same inputs with `_swa`
    // appended, keeping only the last `sliding_window` positions.
    let has_swa = (0..c.n_layers).any(|l| c.block.is_swa(l));
    let kv_mask_swa = match (has_swa, kv_mask) {
        (true, Some((kind, _))) => {
            let m = match phase {
                Phase::Extend { .. } => {
                    b.g.input(&swa_input("kv_bias"), Shape::f32(&[1, 1, s, ctx_len]))
                }
                _ => b.g.input(&swa_input("kv_mask"), Shape::f32(&[n, ctx_len])),
            };
            Some((kind, m))
        }
        _ => kv_mask,
    };
    // Batched decode: per sequence, its write position `[1]` and mask row
    // `[1, ctx]`, both views of the batched inputs.
    let mut per_seq: Vec<(NodeId, NodeId)> = Vec::new();
    let mut per_seq_swa: Vec<(NodeId, NodeId)> = Vec::new();
    if let (true, Some((_, m)), Some((_, m_swa))) = (batched, kv_mask, kv_mask_swa) {
        for i in 0..n {
            let p = b.narrow_on(pos, 0, i, 1)?;
            let p = b.g.push(Op::Reshape { shape: vec![1] }, vec![p])?;
            per_seq.push((p, b.narrow_on(m, 0, i, 1)?));
            let ms = if m_swa == m {
                per_seq[i].1
            } else {
                b.narrow_on(m_swa, 0, i, 1)?
            };
            per_seq_swa.push((p, ms));
        }
    }
    let table = b.param(EMBED_TABLE)?;
    let mut x = b.g.push(Op::Gather { axis: 0 }, vec![table, ids])?;
    let blk = &c.block;
    let rope_op = |theta: f32| Op::Rope {
        head_dim: c.head_dim,
        n_rot: c.n_rot,
        theta,
        style: c.rope_style,
    };
    // Llama 3: the per-pair frequency divisors are Rope's third input.
    let freqs = if blk.rope_freqs {
        Some(b.param(ROPE_FREQS)?)
    } else {
        None
    };
    let kv_shape = Shape::f32(&[1, ctx_len, c.kv_dim()]);
    let (dq, dkv) = (c.q_dim(), c.kv_dim());
    for l in 0..c.n_layers {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        let swa = blk.is_swa(l);
        let rope = rope_op(if swa {
            blk.rope_theta_swa
        } else {
            c.rope_theta
        });
        let rope_in = |x: NodeId| match freqs {
            Some(f) => vec![x, pos, f],
            None => vec![x, pos],
        };
        let h = b.rms_norm(x, &p("attn_norm"))?;
        let (q, k, v) = if b.w.linears.contains_key(&qkv_name(l)) {
            let qkv = b.linear(h, &qkv_name(l))?;
            let v = b.narrow(qkv, dq + dkv, dkv)?;
            if s == 1 {
                // One token: q and k heads rotate by the same position, so
                // one Rope covers both (the narrows are views).
                let qk = b.narrow(qkv, 0, dq + dkv)?;
                let qk = b.g.push(rope.clone(), rope_in(qk))?;
                (b.narrow(qk, 0, dq)?, b.narrow(qk, dq, dkv)?, v)
            } else {
                let q = b.narrow(qkv, 0, dq)?;
                let k = b.narrow(qkv, dq, dkv)?;
                let q = b.g.push(rope.clone(), rope_in(q))?;
                (q, b.g.push(rope.clone(), rope_in(k))?, v)
            }
        } else {
            let mut q = b.linear(h, &p("attn_q"))?;
            let mut k = b.linear(h, &p("attn_k"))?;
            let v = b.linear(h, &p("attn_v"))?;
            if blk.qk_norm {
                q = b.head_norm(q, &p("attn_q_norm"), n, s, c.n_heads)?;
                k = b.head_norm(k, &p("attn_k_norm"), n, s, c.n_kv_heads)?;
            }
            let q = b.g.push(rope.clone(), rope_in(q))?;
            (q, b.g.push(rope.clone(), rope_in(k))?, v)
        };
        let attn = |mask_kind| Op::Attention {
            num_heads: c.n_heads,
            head_dim: c.head_dim,
            mask_kind,
            score_scale: blk.attn_scale,
            attn_logit_softcap: blk.attn_softcap,
        };
        // Local layers read the sliding-window masks (`*_swa` inputs).
        let (kv_mask, per_seq) = if swa {
            (kv_mask_swa, &per_seq_swa)
        } else {
            (kv_mask, &per_seq)
        };
        let a = if batched {
            // Per sequence: its row of q/k/v (`Narrow` on axis 0: a view,
            // no dispatch; the column narrows above run once for all rows,
            // in the rope's step of a hybrid plan); then it writes into and
            // attends over its own caches.
            let mut rows = Vec::with_capacity(n);
            for i in 0..n {
                rows.push((
                    b.narrow_on(q, 0, i, 1)?,
                    b.narrow_on(k, 0, i, 1)?,
                    b.narrow_on(v, 0, i, 1)?,
                ));
            }
            let mut outs = Vec::with_capacity(n);
            for (i, (&(wp, m), &(qi, ki, vi))) in per_seq.iter().zip(&rows).enumerate() {
                let (ck_name, cv_name) = batch_cache_names(l, i);
                let ck = b.g.param(&ck_name, kv_shape.clone());
                let cv = b.g.param(&cv_name, kv_shape.clone());
                let ck = b.g.push(Op::CacheWrite { axis: 1 }, vec![ck, ki, wp])?;
                let cv = b.g.push(Op::CacheWrite { axis: 1 }, vec![cv, vi, wp])?;
                outs.push(b.g.push(attn(MaskKind::Custom), vec![qi, ck, cv, m])?);
            }
            if outs.len() == 1 {
                outs[0]
            } else {
                b.g.push(Op::Concat { axis: 0 }, outs)?
            }
        } else {
            let (ck_name, cv_name) = cache_names(l);
            let ck = b.g.param(&ck_name, kv_shape.clone());
            let cv = b.g.param(&cv_name, kv_shape.clone());
            let ck =
                b.g.push(Op::CacheWrite { axis: 1 }, vec![ck, k, write_pos])?;
            let cv =
                b.g.push(Op::CacheWrite { axis: 1 }, vec![cv, v, write_pos])?;
            match kv_mask {
                None => {
                    let kind = match blk.sliding_window {
                        Some(w) if swa => MaskKind::SlidingWindow(w),
                        _ => MaskKind::Causal,
                    };
                    b.g.push(attn(kind), vec![q, k, v])?
                }
                Some((kind, m)) => b.g.push(attn(kind), vec![q, ck, cv, m])?,
            }
        };
        let mut o = b.linear(a, &p("attn_output"))?;
        if blk.post_norms {
            o = b.rms_norm(o, &p("post_attention_norm"))?;
        }
        x = b.g.push(Op::Binary(BinaryOp::Add), vec![x, o])?;
        let h = b.rms_norm(x, &p("ffn_norm"))?;
        let act = if b.w.linears.contains_key(&gate_up_name(l)) {
            let gu = b.linear(h, &gate_up_name(l))?;
            b.g.push(Op::FusedSwiGLU { packed: true }, vec![gu])?
        } else {
            let gate = b.linear(h, &p("ffn_gate"))?;
            let up = b.linear(h, &p("ffn_up"))?;
            let act = match blk.ffn_act {
                FfnAct::Silu => Activation::Silu,
                FfnAct::GeluTanh => Activation::GeluTanh,
            };
            let gate = b.g.push(Op::Activation(act), vec![gate])?;
            b.g.push(Op::Binary(BinaryOp::Mul), vec![gate, up])?
        };
        let mut down = b.linear(act, &p("ffn_down"))?;
        if blk.post_norms {
            down = b.rms_norm(down, &p("post_ffw_norm"))?;
        }
        x = b.g.push(Op::Binary(BinaryOp::Add), vec![x, down])?;
    }
    if s > 1 {
        x = b.g.push(
            Op::Narrow {
                axis: 1,
                start: s - 1,
                len: 1,
            },
            vec![x],
        )?;
    }
    let x = b.rms_norm(x, "output_norm.weight")?;
    let head = weights.head.clone();
    let mut logits = b.linear(x, &head)?;
    if let Some(cap) = blk.final_softcap {
        // cap * tanh(logits / cap)
        let inv = b.g.constant(Tensor::f32(&[1], vec![1.0 / cap]));
        let cap = b.g.constant(Tensor::f32(&[1], vec![cap]));
        let t = b.g.push(Op::Binary(BinaryOp::Mul), vec![logits, inv])?;
        let t = b.g.push(Op::Activation(Activation::Tanh), vec![t])?;
        logits = b.g.push(Op::Binary(BinaryOp::Mul), vec![t, cap])?;
    }
    b.g.set_outputs(vec![logits]);
    b.g.verify()?;
    Ok(b.g)
}
