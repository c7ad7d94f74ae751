//! Mixed-precision kernels (`cu/mixed.cu`, compiled once per process by
//! NVRTC) and the choice among their variants.
//!
//! Every float pointer comes with a type code (0 f32, 1 bf16, 2 f16, see
//! [`Dt::code`](crate::store::Dt::code)); values are converted to f32 on
//! load and rounded to nearest-even on store, and all arithmetic and every
//! accumulation is f32. The lowering uses these kernels only when some
//! operand is stored in 16 bits; f32-only nodes keep the kernels of
//! [`crate::kernels`]. No CUDA headers are needed: the conversions are
//! written out (bf16 by bit arithmetic, f16 by the `cvt` instruction).

/// Names of every `extern "C"` kernel in `cu/mixed.cu`.
pub const KERNELS: &[&str] = &[
    "binary_mod_x",
    "binary_bcast_x",
    "activation_x",
    "bias_act_x",
    "norm_rows_x",
    "gather_x",
    "reduce_warp_x",
    "reduce_block_x",
    "reduce_cols_x",
    "softmax_x",
    "strided_copy2",
    "attention_x_d32",
    "attention_x_d64",
    "attention_x_d128",
    "attention_x_d32_r2",
    "attention_x_d64_r2",
    "attention_x_d128_r2",
    "attention_x_d256",
    "attention_x_d256_r2",
    "attention_tc_d32_bf16",
    "attention_tc_d32_f16",
    "attention_tc_d64_bf16",
    "attention_tc_d64_f16",
    "norm_warp_f32_f32_4",
    "norm_warp_bf16_f32_4",
    "norm_warp_bf16_bf16_4",
    "norm_warp_f16_f32_4",
    "norm_warp_f16_f16_4",
    "norm_warp_f32_f32_8",
    "norm_warp_bf16_f32_8",
    "norm_warp_bf16_bf16_8",
    "norm_warp_f16_f32_8",
    "norm_warp_f16_f16_8",
    "norm_warp_f32_f32_4_g",
    "norm_warp_bf16_f32_4_g",
    "norm_warp_bf16_bf16_4_g",
    "norm_warp_f16_f32_4_g",
    "norm_warp_f16_f16_4_g",
    "norm_warp_f32_f32_8_g",
    "norm_warp_bf16_f32_8_g",
    "norm_warp_bf16_bf16_8_g",
    "norm_warp_f16_f32_8_g",
    "norm_warp_f16_f16_8_g",
    "gemm_ln_bf16",
    "gemm_ln_f16",
    "gather_rows_x",
    "pool_mean_x",
    "gemm_pf_bf16_16",
    "gemm_pf_bf16_32",
    "gemm_pf_bf16_64",
    "gemm_pf_f16_16",
    "gemm_pf_f16_32",
    "gemm_pf_f16_64",
];

/// Whether kernel `name` takes dynamic shared memory beyond the default
/// 48 KB (the loader raises its limit to [`GEMM_PF_SMEM_MAX`]).
pub(crate) fn needs_dynamic_smem(name: &str) -> bool {
    name.starts_with("gemm_pf_")
}

/// The most dynamic shared memory a `gemm_pf` launch asks for: 99 KB, what
/// every 16-bit tensor-core GPU from sm_80 on allows a block.
pub const GEMM_PF_SMEM_MAX: usize = 99 * 1024;

/// Bytes of dynamic shared memory of a `gemm_pf` block with `bn` columns
/// over `k` (the kernel's tiles, or its reduction area if larger).
pub(crate) fn gemm_pf_smem(bn: usize, k: usize) -> usize {
    ((bn + 16) * (k + 8) * 2).max(4 * 16 * (bn + 4) * 4)
}

/// The `gemm_pf` kernel for an `m x k x n` matmul in 16-bit type `dt`: the
/// widest column tile whose rows fit [`GEMM_PF_SMEM_MAX`] and that still
/// makes about one block per SM (fewer, wider tiles read the A rows fewer
/// times), and its width. `None` where no tile fits.
pub(crate) fn gemm_pf_kernel(
    dt: crate::store::Dt,
    m: usize,
    k: usize,
    n: usize,
) -> Option<(&'static str, usize)> {
    use crate::store::Dt;
    let fits = |bn: usize| n.is_multiple_of(bn) && gemm_pf_smem(bn, k) <= GEMM_PF_SMEM_MAX;
    let blocks = |bn: usize| (n / bn) * m.div_ceil(16);
    let bn = [64, 32, 16]
        .into_iter()
        .find(|&bn| fits(bn) && blocks(bn) >= 96)
        .or_else(|| [16, 32, 64].into_iter().rev().find(|&bn| fits(bn)))?;
    let name = match (dt, bn) {
        (Dt::Bf16, 16) => "gemm_pf_bf16_16",
        (Dt::Bf16, 32) => "gemm_pf_bf16_32",
        (Dt::Bf16, 64) => "gemm_pf_bf16_64",
        (Dt::F16, 16) => "gemm_pf_f16_16",
        (Dt::F16, 32) => "gemm_pf_f16_32",
        (Dt::F16, 64) => "gemm_pf_f16_64",
        _ => return None,
    };
    Some((name, bn))
}

/// The tensor-core attention kernel for 16-bit q/k/v of one type, if the
/// problem fits it: head_dim 32 or 64, no mask or a keep-mask, no softcap,
/// even row strides (pairs of elements are loaded as 32-bit words).
pub(crate) fn attention_tc_kernel(
    dt: crate::store::Dt,
    head_dim: usize,
    mkind: i32,
    softcap: bool,
    strides: [usize; 3],
) -> Option<&'static str> {
    use crate::store::Dt;
    if softcap || !matches!(mkind, 0 | 3 | 4) || strides.iter().any(|s| s % 2 != 0) {
        return None;
    }
    Some(match (head_dim, dt) {
        (32, Dt::Bf16) => "attention_tc_d32_bf16",
        (32, Dt::F16) => "attention_tc_d32_f16",
        (64, Dt::Bf16) => "attention_tc_d64_bf16",
        (64, Dt::F16) => "attention_tc_d64_f16",
        _ => return None,
    })
}

/// Warps per block of the tensor-core attention (16 query rows each; the
/// block's warps share each staged K/V chunk): two for small problems (more
/// blocks to spread), else four.
pub(crate) fn attention_tc_warps(batch_heads: usize, sq: usize) -> usize {
    if batch_heads * sq.div_ceil(64) >= 256 {
        4
    } else {
        2
    }
}

/// The mixed attention kernel for a problem (head_dim <= 256), and its
/// query rows per warp (the block has 4 warps). Many rows per warp share
/// each K/V tile loaded into shared memory; few rows per warp give small
/// problems enough blocks to fill the GPU. Above 128 dims the kernels take
/// tiles of 16 keys and at most 4 rows per warp, which fill the 48 KB of
/// static shared memory (see `attention_x_wide_body` in `cu/mixed.cu`).
pub(crate) fn attention_kernel(
    head_dim: usize,
    batch_heads: usize,
    sq: usize,
) -> (&'static str, usize) {
    let big = if head_dim > 64 { 4 } else { 8 };
    // Blocks with `big` rows per warp; below ~2 per SM, use 2 rows per warp.
    if batch_heads * sq.div_ceil(4 * big) >= 256 {
        let name = match head_dim {
            0..=32 => "attention_x_d32",
            33..=64 => "attention_x_d64",
            65..=128 => "attention_x_d128",
            _ => "attention_x_d256",
        };
        (name, big)
    } else {
        let name = match head_dim {
            0..=32 => "attention_x_d32_r2",
            33..=64 => "attention_x_d64_r2",
            65..=128 => "attention_x_d128_r2",
            _ => "attention_x_d256_r2",
        };
        (name, 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Dt;

    /// MiniLM's matmuls at 1x128 get the widest tile that keeps about one
    /// block per SM within the shared-memory cap; a K too long for any
    /// tile gets none (cuBLASLt).
    #[test]
    fn small_matmul_tiles_fit_the_shared_memory_cap() {
        let want = [
            ((128, 384, 1152), Some(("gemm_pf_bf16_64", 64))),
            ((128, 384, 1536), Some(("gemm_pf_bf16_64", 64))),
            ((128, 384, 384), Some(("gemm_pf_bf16_32", 32))),
            ((128, 1536, 384), Some(("gemm_pf_bf16_16", 16))),
            ((1, 64, 64), Some(("gemm_pf_bf16_64", 64))),
            ((200, 2048, 64), None),
            ((128, 384, 40), None),
        ];
        for ((m, k, n), w) in want {
            assert_eq!(gemm_pf_kernel(Dt::Bf16, m, k, n), w, "{m}x{k}x{n}");
            if let Some((_, bn)) = w {
                assert!(gemm_pf_smem(bn, k) <= GEMM_PF_SMEM_MAX);
            }
        }
        assert_eq!(
            gemm_pf_kernel(Dt::F16, 128, 1536, 384),
            Some(("gemm_pf_f16_16", 16))
        );
        assert_eq!(gemm_pf_kernel(Dt::F32, 128, 384, 384), None);
    }
}
