//! `DequantMatMul` on packed GGUF blocks: `y [M, N] = x [M, K] x W^T` with
//! `W` a `u8 [N, row_bytes]` param, uploaded once in its packed form.
//!
//! - `M == 1` (decode): `dq_gemv_*`, one warp per output feature; each lane
//!   dequantizes 8 weights at a time in registers and dots them with `x`.
//! - `M > 1` (prefill): `dq_gemm_*`, 32 x 64 output tiles; each step
//!   dequantizes one block column (32 weights of 64 rows) into shared
//!   memory. The whole of `W` is never expanded.
//!
//! Schemes: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (32-weight blocks), Q4_K, Q5_K
//! and Q6_K (256-weight super-blocks: what `Q4_K_M` / `Q5_K_M` files hold).
//! Weights dequantize exactly as ggml does (`q * d + m` with f16 `d`, `m`;
//! the K-quants' 6-bit or 8-bit sub-block scales applied in f32, as
//! `rlx_formats::quant::dequantize` does); sums are in f32, so results
//! differ from the CPU backend only by rounding order. Q2_K, Q3_K and Q8_K
//! have no kernel: lowering one is an error naming the scheme.

use crate::launch::{Arg, Launch};
use rlx_ir::QuantScheme;

/// Names of every kernel in `cu/quant.cu`.
pub(crate) const KERNELS: &[&str] = &[
    "dq_gemv_q4_0",
    "dq_gemv_q4_1",
    "dq_gemv_q8_0",
    "dq_gemv_q4_0_r4",
    "dq_gemv_q4_1_r4",
    "dq_gemv_q8_0_r4",
    "dq_gemm_q4_0",
    "dq_gemm_q4_1",
    "dq_gemm_q8_0",
    "dq_gemv_q5_0",
    "dq_gemv_q5_1",
    "dq_gemv_q4_k",
    "dq_gemv_q5_k",
    "dq_gemv_q6_k",
    "dq_gemv_q5_0_r4",
    "dq_gemv_q5_1_r4",
    "dq_gemv_q4_k_r4",
    "dq_gemv_q5_k_r4",
    "dq_gemv_q6_k_r4",
    "dq_gemm_q5_0",
    "dq_gemm_q5_1",
    "dq_gemm_q4_k",
    "dq_gemm_q5_k",
    "dq_gemm_q6_k",
];

/// Kernel names (one output per warp, four per warp, tiled) and the weight
/// alignment their loads need, by scheme.
fn kernels(scheme: QuantScheme) -> Option<(&'static str, &'static str, &'static str, u64)> {
    use QuantScheme as Q;
    match scheme {
        Q::Q4_0 => Some(("dq_gemv_q4_0", "dq_gemv_q4_0_r4", "dq_gemm_q4_0", 2)),
        Q::Q4_1 => Some(("dq_gemv_q4_1", "dq_gemv_q4_1_r4", "dq_gemm_q4_1", 4)),
        Q::Q8_0 => Some(("dq_gemv_q8_0", "dq_gemv_q8_0_r4", "dq_gemm_q8_0", 2)),
        Q::Q5_0 => Some(("dq_gemv_q5_0", "dq_gemv_q5_0_r4", "dq_gemm_q5_0", 2)),
        Q::Q5_1 => Some(("dq_gemv_q5_1", "dq_gemv_q5_1_r4", "dq_gemm_q5_1", 4)),
        Q::Q4K => Some(("dq_gemv_q4_k", "dq_gemv_q4_k_r4", "dq_gemm_q4_k", 4)),
        Q::Q5K => Some(("dq_gemv_q5_k", "dq_gemv_q5_k_r4", "dq_gemm_q5_k", 4)),
        Q::Q6K => Some(("dq_gemv_q6_k", "dq_gemv_q6_k_r4", "dq_gemm_q6_k", 2)),
        Q::Q2K | Q::Q3K | Q::Q8K => None,
    }
}

/// Whether `scheme` has CUDA kernels (see the module docs).
pub(crate) fn has_kernels(scheme: QuantScheme) -> bool {
    kernels(scheme).is_some()
}

/// Outputs from which a warp computes four outputs (sharing its activation
/// loads): a vocabulary head, not a layer's projection, which needs the
/// blocks to spread over the SMs.
const WIDE_N: usize = 8192;

/// Rows up to which the GEMV runs, fused or plain (one grid row per matrix
/// row; the rows re-read the weights from L2): the largest batched decode
/// step (`MAX_DECODE_BATCH` in rlx-models). The tiled GEMM launches one
/// block per 64 outputs and 32 rows, 9 blocks for a 576-wide projection on
/// 132 SMs, each looping over all of K: at 9-16 rows it took most of a
/// batched decode step.
pub(crate) const FUSED_ROWS_MAX: usize = 16;

/// What a fused GEMV does around the product (a compiled segment's
/// `fuse::gemv` fusion): a prologue on the activations and an
/// added operand.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct GemvExtra {
    /// The prologue on `x`.
    pub pro: Prologue,
    /// A tensor added to the product (0: none): element `(m * N + n) %
    /// add_n`, so a bias `[N]` or a residual `[M, N]`.
    pub add: u64,
    /// Elements of `add`.
    pub add_n: usize,
}

/// The prologue of a fused GEMV, applied to activations as they load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) enum Prologue {
    /// `x` as it is.
    #[default]
    None,
    /// RMS norm over each row of `x`, scaled by `gamma [K]`.
    RmsNorm { gamma: u64, eps: f32 },
    /// `silu(gate) * up` of rows `[gate | up]` of `2K` values.
    SwiGlu,
}

impl GemvExtra {
    fn plain(&self) -> bool {
        *self == GemvExtra::default()
    }
}

/// Lower `y [m, n] = x [m, k] x W^T` (`W` packed in `scheme`, `n` rows of
/// `row_bytes`), with `extra` fused around it. `y`, `x`, `w` are device
/// addresses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dequant_matmul(
    scheme: QuantScheme,
    y: u64,
    x: u64,
    w: u64,
    m: usize,
    n: usize,
    k: usize,
    extra: GemvExtra,
) -> Result<Vec<Launch>, String> {
    let (gemv, gemv4, gemm, align) = kernels(scheme).ok_or_else(|| {
        format!(
            "no CUDA kernel for DequantMatMul {} (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K have one)",
            scheme.name()
        )
    })?;
    let block = scheme.block_elems();
    if !k.is_multiple_of(block) {
        return Err(format!(
            "K = {k} is not a whole number of {block}-weight {} blocks",
            scheme.name()
        ));
    }
    if !w.is_multiple_of(align) {
        return Err(format!(
            "packed weights at {w:#x} are not {align}-byte aligned"
        ));
    }
    if !x.is_multiple_of(4) || !y.is_multiple_of(4) {
        return Err("activations are not 4-byte aligned".into());
    }
    let int = |v: usize, what: &str| {
        i32::try_from(v).map_err(|_| format!("{what} = {v} does not fit a 32-bit int"))
    };
    let (mi, ni, ki) = (int(m, "M")?, int(n, "N")?, int(k, "K")?);
    if m == 0 || n == 0 {
        return Ok(vec![]);
    }
    if !extra.plain() && (m > FUSED_ROWS_MAX || k == 0) {
        return Err(format!(
            "a fused GEMV takes 1..={FUSED_ROWS_MAX} rows and K > 0 (M = {m}, K = {k})"
        ));
    }
    if k == 0 {
        return Ok(vec![Launch::Zero {
            dst: y,
            bytes: m * n * 4,
        }]);
    }
    // Both kernels start with these; the GEMV adds its fused work.
    let mut args = vec![
        Arg::P(y),
        Arg::P(x),
        Arg::P(w),
        Arg::I(mi),
        Arg::I(ni),
        Arg::I(ki),
    ];
    if m <= FUSED_ROWS_MAX || !extra.plain() {
        let (pro, gamma, eps) = match extra.pro {
            Prologue::None => (0, 0, 0.0),
            Prologue::RmsNorm { gamma, eps } => (1, gamma, eps),
            Prologue::SwiGlu => (2, 0, 0.0),
        };
        let (name, per_warp) = if n >= WIDE_N { (gemv4, 4) } else { (gemv, 1) };
        args.extend([
            Arg::I(pro),
            Arg::P(gamma),
            Arg::F(eps),
            Arg::P(extra.add),
            Arg::L(extra.add_n.max(1) as i64),
        ]);
        return Ok(vec![Launch::Kernel {
            name,
            grid: [int(n.div_ceil(4 * per_warp), "N / 4")? as u32, m as u32, 1],
            block: 128,
            smem: 0,
            args,
        }]);
    }
    if m.div_ceil(32) > 65535 {
        return Err(format!("M = {m} rows: grid too large"));
    }
    Ok(vec![Launch::Kernel {
        name: gemm,
        grid: [
            int(n.div_ceil(64), "N / 64")? as u32,
            m.div_ceil(32) as u32,
            1,
        ],
        block: 256,
        smem: 0,
        args,
    }])
}

#[cfg(test)]
mod tests {
    use crate::launch::Launch;
    use crate::lower::lower;
    use rlx_ir::{ActivationPrecision, DType, Graph, MaskKind, NodeId, Op, QuantScheme, Shape};

    fn addr(id: NodeId) -> Option<u64> {
        Some(0x10_0000 * (id.0 as u64 + 1))
    }

    fn kernel_names(g: &Graph, id: NodeId) -> Result<Vec<&'static str>, String> {
        Ok(lower(g, g.node(id), &addr, &mut Vec::new())?
            .iter()
            .map(|l| match l {
                Launch::Kernel { name, .. } => *name,
                _ => "other",
            })
            .collect())
    }

    #[test]
    fn up_to_sixteen_rows_are_a_gemv_and_more_rows_a_tiled_kernel() {
        for (rows, want) in [
            (1, "dq_gemv_q4_1"),
            (7, "dq_gemv_q4_1"),
            (16, "dq_gemv_q4_1"),
            (17, "dq_gemm_q4_1"),
        ] {
            let mut g = Graph::new("dq");
            let x = g.input("x", Shape::f32(&[1, rows, 64]));
            let w = g.param("w", Shape::new(&[10, 40], DType::U8));
            let op = Op::DequantMatMul {
                scheme: QuantScheme::Q4_1,
                activations: ActivationPrecision::F32,
            };
            let y = g.push(op, vec![x, w]).unwrap();
            assert_eq!(kernel_names(&g, y).unwrap(), vec![want]);
        }
    }

    /// Each scheme with kernels lowers to its own GEMV (up to 16 rows; the
    /// four-outputs-a-warp form for a vocabulary-wide N) and tiled kernel,
    /// and a K that is not whole blocks of the scheme is refused.
    #[test]
    fn every_scheme_with_kernels_lowers_to_its_own() {
        use QuantScheme as Q;
        for (scheme, tag) in [
            (Q::Q4_0, "q4_0"),
            (Q::Q4_1, "q4_1"),
            (Q::Q5_0, "q5_0"),
            (Q::Q5_1, "q5_1"),
            (Q::Q8_0, "q8_0"),
            (Q::Q4K, "q4_k"),
            (Q::Q5K, "q5_k"),
            (Q::Q6K, "q6_k"),
        ] {
            let k = 512;
            for (rows, n, want) in [
                (1, 10, format!("dq_gemv_{tag}")),
                (1, 9000, format!("dq_gemv_{tag}_r4")),
                (9, 10, format!("dq_gemv_{tag}")),
                (17, 10, format!("dq_gemm_{tag}")),
            ] {
                let mut g = Graph::new("dq");
                let x = g.input("x", Shape::f32(&[rows, k]));
                let rb = scheme.row_bytes(k).unwrap();
                let w = g.param("w", Shape::new(&[n, rb], DType::U8));
                let op = Op::DequantMatMul {
                    scheme,
                    activations: ActivationPrecision::F32,
                };
                let y = g.push(op, vec![x, w]).unwrap();
                assert_eq!(kernel_names(&g, y).unwrap(), vec![want.as_str()]);
                assert!(super::KERNELS.contains(&want.as_str()), "{want}");
            }
        }
        let e = super::dequant_matmul(Q::Q4K, 0, 0, 0, 1, 4, 96, Default::default()).unwrap_err();
        assert!(e.contains("256-weight Q4_K"), "{e}");
    }

    #[test]
    fn unsupported_schemes_and_int8_activations_are_reported() {
        let mut g = Graph::new("dq");
        let x = g.input("x", Shape::f32(&[1, 256]));
        let w = g.param("w", Shape::new(&[4, 110], DType::U8));
        let op = Op::DequantMatMul {
            scheme: QuantScheme::Q3K,
            activations: ActivationPrecision::F32,
        };
        let y = g.push(op, vec![x, w]).unwrap();
        let e = kernel_names(&g, y).unwrap_err();
        assert!(e.contains("no CUDA kernel") && e.contains("Q3_K"), "{e}");
        let w8 = g.param("w8", Shape::new(&[4, 272], DType::U8));
        let op = Op::DequantMatMul {
            scheme: QuantScheme::Q8_0,
            activations: ActivationPrecision::Int8,
        };
        let y = g.push(op, vec![x, w8]).unwrap();
        let e = kernel_names(&g, y).unwrap_err();
        assert!(e.contains("int8"), "{e}");
    }

    #[test]
    fn cache_writes_need_a_param_and_decode_attention_reads_rows() {
        let mut g = Graph::new("kv");
        let cache = g.param("cache", Shape::f32(&[1, 8, 4]));
        let not_param = g.input("c", Shape::f32(&[1, 8, 4]));
        let rows = g.input("rows", Shape::f32(&[1, 1, 4]));
        let pos = g.input("pos", Shape::new(&[1], DType::I64));
        let ok = g
            .push(Op::CacheWrite { axis: 1 }, vec![cache, rows, pos])
            .unwrap();
        // Distinct addresses: the update, then a copy to the output.
        assert_eq!(kernel_names(&g, ok).unwrap(), vec!["cache_write", "other"]);
        let bad = g
            .push(Op::CacheWrite { axis: 1 }, vec![not_param, rows, pos])
            .unwrap();
        assert!(kernel_names(&g, bad).unwrap_err().contains("Param"));
        let q = g.input("q", Shape::f32(&[1, 1, 8]));
        let keep = g.input("keep", Shape::f32(&[1, 8]));
        let op = Op::Attention {
            num_heads: 2,
            head_dim: 4,
            mask_kind: MaskKind::Custom,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let a = g.push(op, vec![q, ok, ok, keep]).unwrap();
        assert_eq!(kernel_names(&g, a).unwrap(), vec!["attention_rows"]);
    }
}
