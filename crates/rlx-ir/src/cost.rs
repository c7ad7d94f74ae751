//! Cost facts per op: floating-point work and bytes moved, from shapes.
//! Used by profilers to report GFLOP/s and bandwidth.

use crate::{Op, Shape};

/// Floating-point operations (a multiply-add counts 2) of `op` applied to
/// inputs of `ins` producing `out`.
pub fn flops(op: &Op, ins: &[&Shape], out: &Shape) -> u64 {
    let n = out.numel() as u64;
    match op {
        Op::MatMul | Op::FusedMatMulBiasAct { .. } => {
            let k = ins[0].last_dim() as u64;
            2 * n * k
        }
        Op::DequantMatMul { .. } => 2 * n * ins[0].last_dim() as u64,
        Op::Attention { .. } => {
            // QK^T and PV: 2 * 2 * S_q * S_k * (H * D) per batch.
            let (b, sq, hd) = (out.dims[0] as u64, out.dims[1] as u64, out.dims[2] as u64);
            let sk = ins[1].dims[1] as u64;
            4 * b * sq * sk * hd
        }
        Op::LayerNorm { .. } | Op::FusedResidualLN { .. } => 8 * n,
        Op::RmsNorm { .. } | Op::FusedResidualRmsNorm { .. } => 5 * n,
        Op::Activation(_) | Op::Binary(_) | Op::FusedSwiGLU { .. } => n,
        Op::Softmax { .. } => 4 * n,
        Op::Reduce { .. } => ins[0].numel() as u64,
        Op::GatedDeltaNet { state_size, .. } => 8 * n * *state_size as u64,
        Op::Lstm { hidden_size, .. } => {
            let h = *hidden_size as u64;
            2 * n * 4 * (ins[0].last_dim() as u64 + h)
        }
        // Movement, lookup and leaves: no arithmetic counted. Listed one by
        // one (no wildcard), so a new op must decide its cost here.
        Op::Input { .. }
        | Op::Param { .. }
        | Op::Constant { .. }
        | Op::Reshape { .. }
        | Op::Expand { .. }
        | Op::Cast { .. }
        | Op::Gather { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Rope { .. }
        | Op::CacheWrite { .. }
        | Op::Transpose { .. } => 0,
    }
}

/// Bytes read and written by `op`: every input once and the output once.
pub fn bytes(ins: &[&Shape], out: &Shape) -> u64 {
    (ins.iter().map(|s| s.size_bytes()).sum::<usize>() + out.size_bytes()) as u64
}
