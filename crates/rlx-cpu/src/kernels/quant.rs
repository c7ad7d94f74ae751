//! `DequantMatMul`: `y [m, n] = x [m, k] x W^T` with `W` packed as GGUF
//! blocks, `u8 [n, row_bytes]`, one row of `k` elements per output feature.
//!
//! - `m == 1` (decode): a fused GEMV. Every weight row is dequantized block
//!   by block into registers and dotted with `x`; the whole of `W` is never
//!   expanded. Q4_1 and Q8_0 have hand-written AVX2+FMA+F16C paths; other
//!   schemes (and CPUs without AVX2) dequantize one row at a time into a
//!   small scratch buffer ([`super::quant_rows::dequant_rows`]: AVX2 block
//!   decoders for Q4_0, Q5_0, Q4_K, Q5_K and Q6_K, bit-exact with
//!   `rlx_formats::quant::dequantize`) and dot it.
//!   Rows are split over the rayon pool in chunks.
//! - `m > 1` (prefill): the output splits into (row block, column group)
//!   tasks; each dequantizes [`tile_rows`] weight rows at a time
//!   (`dequant_rows`), packs them as `W^T` panels and runs the packed f32
//!   GEMM of [`super::packed_gemm`] over its rows, writing `y` in place.
//!
//! Numerics: weights dequantize exactly as ggml does (`x = q * d + m` in f32
//! for the scalar paths); the fused Q4_1 path factors the block as
//! `d * Σ q x + m * Σ x`, which differs from the dequantize-then-dot result
//! only by f32 rounding (relative to `Σ |x| |w|`).

use super::packed_gemm::{gemm_chunked_b, NR};
use super::quant_rows::dequant_rows;
use super::{bad_shape, exact_len, num_threads, simd, KernelError, PAR_MIN_ELEMS};
use crate::isa::Isa;
use rlx_formats::GgmlType;
use rlx_ir::{ActivationPrecision, QuantScheme};

const OP: &str = "DequantMatMul";

/// Fewest multiply-adds a parallel GEMV hands one task. Measured on the
/// 16-core Xeon (SmolLM2 decode, 16 threads): 128K per task was 20% slower
/// than 32K; four-row f32 dot kernels were also tried there and were 21%
/// slower at one thread (the int8 ones gain 17-19%, see `quant_q8`).
pub(crate) const GEMV_MIN_CHUNK: usize = 1 << 15;

/// Up to this many activation rows, Q4_1 and Q8_0 weights (AVX2 and up)
/// run one GEMV per row instead of dequantizing tiles for a GEMM: the dot
/// kernels read the packed blocks directly, which is faster at these sizes
/// (1 thread, Zen 3, 1536 x 576 Q4_1: 4 rows 0.25 ms vs 0.73 ms tiled).
pub(crate) const GEMV_MAX_ROWS: usize = 8;

/// Weight rows dequantized per chunk in the `m > 1` path for rows of `k`
/// elements: about 256 KiB of f32 (16 to 256 rows, whole panels), so that a
/// chunk's packing stays in L2 while every row block of the activations
/// goes by.
pub fn tile_rows(k: usize) -> usize {
    (65_536 / k.max(1)).clamp(16, 256) / 16 * 16
}

/// [`dequant_matmul`] with the activations rounded as `activations` says:
/// `Int8` runs the integer kernels of [`super::quant_q8`].
#[allow(clippy::too_many_arguments)]
pub fn dequant_matmul_act(
    scheme: QuantScheme,
    activations: ActivationPrecision,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    n: usize,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    match activations {
        ActivationPrecision::F32 => dequant_matmul(scheme, x, m, k, w, n, out, parallel),
        ActivationPrecision::Int8 => {
            let Some(rb) = check_sizes(scheme, x, m, k, w, n, out)? else {
                return Ok(());
            };
            let work = n.saturating_mul(k).saturating_mul(m);
            let parallel = parallel && num_threads() > 1 && work >= PAR_MIN_ELEMS;
            super::quant_q8::matmul_int8(scheme, x, m, k, w, rb, n, out, parallel)
        }
    }
}

/// Checks every buffer length; `Ok(None)` when there is nothing to compute
/// (`out` is then already final), else the packed row size.
fn check_sizes(
    scheme: QuantScheme,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    n: usize,
    out: &mut [f32],
) -> Result<Option<usize>, KernelError> {
    let rb = scheme.row_bytes(k).ok_or_else(|| {
        bad_shape(
            OP,
            format!(
                "K = {k} is not a multiple of the {} block size {}",
                scheme.name(),
                scheme.block_elems()
            ),
        )
    })?;
    let x_len = m
        .checked_mul(k)
        .ok_or_else(|| bad_shape(OP, "x extent overflows"))?;
    let w_len = n
        .checked_mul(rb)
        .ok_or_else(|| bad_shape(OP, "W extent overflows"))?;
    let o_len = m
        .checked_mul(n)
        .ok_or_else(|| bad_shape(OP, "output extent overflows"))?;
    exact_len(OP, "x", x.len(), x_len)?;
    exact_len(OP, &format!("packed {} W", scheme.name()), w.len(), w_len)?;
    exact_len(OP, "output", out.len(), o_len)?;
    if m == 0 || n == 0 {
        return Ok(None);
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(None);
    }
    Ok(Some(rb))
}

/// `out [m, n] = x [m, k] x W^T` where `w` holds `n` packed rows of `k`
/// elements in `scheme`. `parallel` lets the kernel use the rayon pool.
///
/// Errors when `k` is not a whole number of blocks or a buffer length does
/// not match `m`, `n`, `k`.
#[allow(clippy::too_many_arguments)]
pub fn dequant_matmul(
    scheme: QuantScheme,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    n: usize,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    let Some(rb) = check_sizes(scheme, x, m, k, w, n, out)? else {
        return Ok(());
    };
    let work = n.saturating_mul(k).saturating_mul(m);
    let parallel = parallel && num_threads() > 1 && work >= PAR_MIN_ELEMS;
    let fast_dots =
        matches!(scheme, QuantScheme::Q4_1 | QuantScheme::Q8_0) && Isa::active() >= Isa::Avx2;
    if m == 1 {
        gemv(scheme, x, k, w, rb, out, parallel)
    } else if m <= GEMV_MAX_ROWS && fast_dots {
        x.chunks_exact(k)
            .zip(out.chunks_exact_mut(n))
            .try_for_each(|(xr, or)| gemv(scheme, xr, k, w, rb, or, parallel))
    } else {
        gemm_tiled(scheme, x, m, k, w, rb, n, out, parallel)
    }
}

/// Per-call data shared by every row of a GEMV.
struct GemvCtx<'a> {
    scheme: QuantScheme,
    x: &'a [f32],
    k: usize,
    rb: usize,
    /// Σ x over each 32-element block (Q4_1's min term).
    xsum: Vec<f32>,
    /// Which dot kernels run (one the CPU supports).
    isa: Isa,
}

fn gemv(
    scheme: QuantScheme,
    x: &[f32],
    k: usize,
    w: &[u8],
    rb: usize,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    gemv_with(Isa::active(), scheme, x, k, w, rb, out, parallel)
}

/// [`gemv`] with the dot kernels of `isa` (tests compare them); an `isa`
/// the CPU cannot run falls back to the active one.
#[allow(clippy::too_many_arguments)]
fn gemv_with(
    isa: Isa,
    scheme: QuantScheme,
    x: &[f32],
    k: usize,
    w: &[u8],
    rb: usize,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    let isa = if isa.supported() { isa } else { Isa::active() };
    let with_mins = matches!(
        scheme,
        QuantScheme::Q4_1 | QuantScheme::Q4K | QuantScheme::Q5K
    );
    let xsum = if with_mins && isa >= Isa::Avx2 {
        x.chunks_exact(32).map(simd::sum).collect()
    } else {
        Vec::new()
    };
    let ctx = GemvCtx {
        scheme,
        x,
        k,
        rb,
        xsum,
        isa,
    };
    let n = out.len();
    if !parallel {
        return gemv_rows(&ctx, w, out);
    }
    // A few chunks per thread, each at least GEMV_MIN_CHUNK multiply-adds.
    let rows_per_chunk = n
        .div_ceil(super::team::threads() * 4)
        .max(GEMV_MIN_CHUNK / k.max(1))
        .max(1);
    super::team::try_for_each_chunk_mut(out, rows_per_chunk, |i, o| {
        gemv_rows(&ctx, &w[i * rows_per_chunk * rb..][..o.len() * rb], o)
    })
}

/// `out[r] = dot(x, dequant(w row r))` for the rows of one chunk.
fn gemv_rows(ctx: &GemvCtx<'_>, w: &[u8], out: &mut [f32]) -> Result<(), KernelError> {
    // Under AVX-512 too: a 16-lane version of these dots (two zmm per
    // block) measured slower than the AVX2 ones in SmolLM2 decode on the
    // 16-core Xeon (2 threads, synthetic weights: 60 vs 78 tok/s).
    #[cfg(target_arch = "x86_64")]
    if ctx.isa >= Isa::Avx2 {
        match ctx.scheme {
            QuantScheme::Q4_1 => {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(ctx.rb)) {
                    // SAFETY: `avx2` is set only when the CPU has AVX2, FMA
                    // and F16C. `row` holds k/32 blocks of 20 bytes and `x`
                    // and `xsum` hold k and k/32 elements (checked by the
                    // caller: row_bytes(k) == rb, x.len() == k).
                    *o = unsafe { x86::q4_1_dot(row, ctx.x, &ctx.xsum) };
                }
                return Ok(());
            }
            QuantScheme::Q8_0 => {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(ctx.rb)) {
                    // SAFETY: as above; `row` holds k/32 blocks of 34 bytes.
                    *o = unsafe { x86::q8_0_dot(row, ctx.x) };
                }
                return Ok(());
            }
            QuantScheme::Q5_0 => {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(ctx.rb)) {
                    // SAFETY: as above; `row` holds k/32 blocks of 22 bytes.
                    *o = unsafe { x86::q5_0_dot(row, ctx.x) };
                }
                return Ok(());
            }
            QuantScheme::Q4K | QuantScheme::Q5K => {
                let five = ctx.scheme == QuantScheme::Q5K;
                for (o, row) in out.iter_mut().zip(w.chunks_exact(ctx.rb)) {
                    // SAFETY: as above; `row` holds k/256 super-blocks of 144
                    // (Q4_K) or 176 (Q5_K) bytes, `xsum` k/32 sums.
                    *o = unsafe { x86::q45_k_dot(row, ctx.x, &ctx.xsum, five) };
                }
                return Ok(());
            }
            QuantScheme::Q6K => {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(ctx.rb)) {
                    // SAFETY: as above; `row` holds k/256 super-blocks of 210 bytes.
                    *o = unsafe { x86::q6_k_dot(row, ctx.x) };
                }
                return Ok(());
            }
            _ => {}
        }
    }
    let ty = GgmlType::from(ctx.scheme);
    let mut buf = vec![0.0f32; ctx.k];
    for (o, row) in out.iter_mut().zip(w.chunks_exact(ctx.rb)) {
        dequant_rows(ctx.isa, ty, row, ctx.k, &mut buf)
            .map_err(|e| bad_shape(OP, format!("dequantizing a weight row: {e}")))?;
        *o = dot(&buf, ctx.x);
    }
    Ok(())
}

simd::simd_dispatch! {
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        simd::dot(a, b)
    }
}

/// `m > 1`: dequantize chunks of W rows and multiply with the packed GEMM.
#[allow(clippy::too_many_arguments)]
fn gemm_tiled(
    scheme: QuantScheme,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    rb: usize,
    n: usize,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    gemm_tiled_with(scheme, x, m, k, w, rb, n, out, parallel, tile_rows(k))
}

/// [`gemm_tiled`] with chunks of `t` weight rows (rounded up to whole
/// 16-column panels): each chunk of W's rows is dequantized
/// ([`dequant_rows`]) and packed as `W^T` panels for
/// [`gemm_chunked_b`], which writes `out` in place.
#[allow(clippy::too_many_arguments)]
fn gemm_tiled_with(
    scheme: QuantScheme,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    rb: usize,
    n: usize,
    out: &mut [f32],
    parallel: bool,
    t: usize,
) -> Result<(), KernelError> {
    let ty = GgmlType::from(scheme);
    let isa = Isa::active();
    let threads = if parallel { num_threads() } else { 1 };
    gemm_chunked_b(
        m,
        x,
        k,
        n,
        out,
        threads,
        t.div_ceil(NR),
        |j0, j1, b, buf| {
            let need = (j1 - j0) * k;
            if buf.len() < need {
                buf.resize(need, 0.0);
            }
            let wf = &mut buf[..need];
            dequant_rows(isa, ty, &w[j0 * rb..j1 * rb], need, wf)
                .map_err(|e| bad_shape(OP, format!("dequantizing weight rows {j0}..{j1}: {e}")))?;
            // B [k, cols] = W^T: element (p, j) at wf[j * k + p].
            b.repack_strided(wf, k, j1 - j0, 1, k)
        },
    )
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::quant_rows::x86::scale_min;
    use std::arch::x86_64::*;

    /// Bytes ahead of the current block that the dot kernels prefetch.
    const PF_DIST: usize = 1024;

    /// Horizontal sum of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Two f16 values at `p` (little-endian) as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16x2(p: *const u8) -> (f32, f32) {
        let bits = (p as *const i32).read_unaligned();
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// One f16 at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16x1(p: *const u8) -> f32 {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// `Σ_b d_b Σ_i q_bi x_bi + m_b xsum_b` over the Q4_1 blocks of `row`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x.len() >= 32 * nb` and
    /// `xsum.len() >= nb` where `nb = row.len() / 20`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_dot(row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        let nb = row.len() / 20;
        debug_assert!(x.len() >= nb * 32 && xsum.len() >= nb);
        let mask = _mm256_set1_epi32(0x0F);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut macc = 0.0f32;
        let rp = row.as_ptr();
        let xp = x.as_ptr();
        for b in 0..nb {
            // SAFETY (all reads): block b spans bytes 20b..20b+20 of `row`
            // and elements 32b..32b+32 of `x`, within bounds by the contract.
            let blk = rp.add(b * 20);
            // A hint only: prefetching past the end of `row` is harmless.
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST) as *const i8);
            let (d, mn) = f16x2(blk);
            // Bytes 0..8 and 8..16 widened to i32 lanes: the low nibbles are
            // elements 0..16, the high nibbles elements 16..32.
            let z0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(4) as *const __m128i));
            let z1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(12) as *const __m128i));
            let q0 = _mm256_cvtepi32_ps(_mm256_and_si256(z0, mask));
            let q1 = _mm256_cvtepi32_ps(_mm256_and_si256(z1, mask));
            let q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(z0, 4));
            let q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(z1, 4));
            let xb = xp.add(b * 32);
            let t0 = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
            let t1 = _mm256_mul_ps(q1, _mm256_loadu_ps(xb.add(8)));
            let t0 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb.add(16)), t0);
            let t1 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb.add(24)), t1);
            let t = _mm256_add_ps(t0, t1);
            if b % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc1);
            }
            macc += mn * *xsum.get_unchecked(b);
        }
        hsum(_mm256_add_ps(acc0, acc1)) + macc
    }

    /// `Σ_b d_b Σ_i q_bi x_bi` over the Q8_0 blocks of `row`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x.len() >= 32 * nb` where
    /// `nb = row.len() / 34`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_dot(row: &[u8], x: &[f32]) -> f32 {
        let nb = row.len() / 34;
        debug_assert!(x.len() >= nb * 32);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let rp = row.as_ptr();
        let xp = x.as_ptr();
        for b in 0..nb {
            // SAFETY (all reads): block b spans bytes 34b..34b+34 of `row`
            // and elements 32b..32b+32 of `x`, within bounds by the contract.
            let blk = rp.add(b * 34);
            // A hint only: prefetching past the end of `row` is harmless.
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST) as *const i8);
            let d = f16x1(blk);
            let qp = blk.add(2);
            macro_rules! ld {
                ($o:expr) => {
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        qp.add($o) as *const __m128i
                    )))
                };
            }
            let (q0, q1, q2, q3) = (ld!(0), ld!(8), ld!(16), ld!(24));
            let xb = xp.add(b * 32);
            let t0 = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
            let t1 = _mm256_mul_ps(q1, _mm256_loadu_ps(xb.add(8)));
            let t0 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb.add(16)), t0);
            let t1 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb.add(24)), t1);
            let t = _mm256_add_ps(t0, t1);
            if b % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc1);
            }
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// Eight bytes at `p` widened to u32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn u8x8(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }

    /// `Σ_b d_b Σ_i (q_bi - 16) x_bi` over the Q5_0 blocks of `row`
    /// (bit `i` of the block's `qh` is bit 4 of element `i`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x.len() >= 32 * nb` where
    /// `nb = row.len() / 22`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_dot(row: &[u8], x: &[f32]) -> f32 {
        let nb = row.len() / 22;
        debug_assert!(x.len() >= nb * 32);
        let (mask, one, sixteen) = (
            _mm256_set1_epi32(0x0F),
            _mm256_set1_epi32(1),
            _mm256_set1_epi32(16),
        );
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let (rp, xp) = (row.as_ptr(), x.as_ptr());
        for b in 0..nb {
            // SAFETY (all reads): block b spans bytes 22b..22b+22 of `row`
            // and elements 32b..32b+32 of `x`, within bounds by the contract.
            let blk = rp.add(b * 22);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST) as *const i8);
            let d = f16x1(blk);
            let qh = _mm256_set1_epi32((blk.add(2) as *const i32).read_unaligned());
            let xb = xp.add(b * 32);
            let mut t = _mm256_setzero_ps();
            for j in [0usize, 8] {
                let z = u8x8(blk.add(6 + j));
                let bit = |first: i32| {
                    let s = _mm256_add_epi32(lanes, _mm256_set1_epi32(first));
                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, s), one), 4)
                };
                let lo = _mm256_or_si256(_mm256_and_si256(z, mask), bit(j as i32));
                let hi = _mm256_or_si256(_mm256_srli_epi32(z, 4), bit(16 + j as i32));
                let lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, sixteen));
                let hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, sixteen));
                t = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xb.add(j)), t);
                t = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xb.add(16 + j)), t);
            }
            if b % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc1);
            }
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// [`scale_min`] as f32.
    #[inline]
    unsafe fn k_scale_min(sc: *const u8, j: usize) -> (f32, f32) {
        // SAFETY: the caller passes a super-block's 12 scale bytes and j < 8.
        let (s, m) = unsafe { scale_min(sc, j) };
        (s as f32, m as f32)
    }

    /// `Σ_s d sc_s Σ_i q_si x_si - dmin m_s xsum_s` over the 32-element
    /// sub-blocks `s` of the Q4_K (or, with `five`, Q5_K) super-blocks of
    /// `row`; `xsum[s]` is the sum of sub-block `s`'s elements of `x`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; with `bs` = 144 (Q4_K) or
    /// 176 (Q5_K) and `nb = row.len() / bs`: `x.len() >= 256 * nb` and
    /// `xsum.len() >= 8 * nb`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q45_k_dot(row: &[u8], x: &[f32], xsum: &[f32], five: bool) -> f32 {
        let bs = if five { 176 } else { 144 };
        let nb = row.len() / bs;
        debug_assert!(x.len() >= nb * 256 && xsum.len() >= nb * 8);
        let (mask, one) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(1));
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut macc = 0.0f32;
        let (rp, xp) = (row.as_ptr(), x.as_ptr());
        for b in 0..nb {
            // SAFETY (all reads): super-block b spans bytes bs*b..bs*(b+1) of
            // `row`, elements 256b..256b+256 of `x` and 8b..8b+8 of `xsum`.
            let blk = rp.add(b * bs);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST + 64) as *const i8);
            let (d, dmin) = f16x2(blk);
            let sc = blk.add(4);
            let (qh, qs) = if five {
                (blk.add(16), blk.add(48))
            } else {
                (blk, blk.add(16))
            };
            for c in 0..4 {
                let (s0, m0) = k_scale_min(sc, 2 * c);
                let (s1, m1) = k_scale_min(sc, 2 * c + 1);
                let xb = xp.add(b * 256 + 64 * c);
                let (sh0, sh1) = (
                    _mm_cvtsi32_si128(2 * c as i32),
                    _mm_cvtsi32_si128(2 * c as i32 + 1),
                );
                let mut t0 = _mm256_setzero_ps();
                let mut t1 = _mm256_setzero_ps();
                for g in [0usize, 8, 16, 24] {
                    let z = u8x8(qs.add(32 * c + g));
                    let mut lo = _mm256_and_si256(z, mask);
                    let mut hi = _mm256_srli_epi32(z, 4);
                    if five {
                        let h = u8x8(qh.add(g));
                        let h0 = _mm256_and_si256(_mm256_srl_epi32(h, sh0), one);
                        let h1 = _mm256_and_si256(_mm256_srl_epi32(h, sh1), one);
                        lo = _mm256_or_si256(lo, _mm256_slli_epi32(h0, 4));
                        hi = _mm256_or_si256(hi, _mm256_slli_epi32(h1, 4));
                    }
                    t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_loadu_ps(xb.add(g)), t0);
                    t1 = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(hi),
                        _mm256_loadu_ps(xb.add(32 + g)),
                        t1,
                    );
                }
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * s0), t0, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * s1), t1, acc1);
                let xs = xsum.as_ptr().add(b * 8 + 2 * c);
                macc += dmin * m0 * *xs + dmin * m1 * *xs.add(1);
            }
        }
        hsum(_mm256_add_ps(acc0, acc1)) - macc
    }

    /// `Σ_g d sc_g Σ_i (q_gi - 32) x_gi` over the 16-element groups `g` of
    /// the Q6_K super-blocks of `row` (element `r` of half `h`: low 4 bits
    /// from `ql[64h + r % 64] >> 4 (r / 64)`, high 2 from
    /// `qh[32h + r % 32] >> 2 (r / 32)`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x.len() >= 256 * nb` where
    /// `nb = row.len() / 210`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k_dot(row: &[u8], x: &[f32]) -> f32 {
        let nb = row.len() / 210;
        debug_assert!(x.len() >= nb * 256);
        let (mask, three, off) = (
            _mm256_set1_epi32(0x0F),
            _mm256_set1_epi32(3),
            _mm256_set1_epi32(32),
        );
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let (rp, xp) = (row.as_ptr(), x.as_ptr());
        for b in 0..nb {
            // SAFETY (all reads): super-block b spans bytes 210b..210b+210
            // of `row` and elements 256b..256b+256 of `x`.
            let blk = rp.add(b * 210);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_DIST + 128) as *const i8);
            let d = f16x1(blk.add(208));
            let scales = blk.add(192) as *const i8;
            for h in 0..2 {
                let (ql, qh) = (blk.add(64 * h), blk.add(128 + 32 * h));
                // Elements 32 q + l of this half (q = 0..4) take their low
                // bits from ql[l] (q = 0, 1: low nibble; 2, 3: high) or
                // ql[32 + l] and their high bits from qh[l] >> 2q: one load
                // of each serves four quarters. Scales go by 16 elements.
                for lg in [0usize, 16] {
                    let mut t = [_mm256_setzero_ps(); 4];
                    for l in [lg, lg + 8] {
                        let (a, a2, hb) = (u8x8(ql.add(l)), u8x8(ql.add(32 + l)), u8x8(qh.add(l)));
                        let qs = [
                            _mm256_or_si256(
                                _mm256_and_si256(a, mask),
                                _mm256_slli_epi32(_mm256_and_si256(hb, three), 4),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(a2, mask),
                                _mm256_slli_epi32(
                                    _mm256_and_si256(_mm256_srli_epi32(hb, 2), three),
                                    4,
                                ),
                            ),
                            _mm256_or_si256(
                                _mm256_srli_epi32(a, 4),
                                _mm256_slli_epi32(
                                    _mm256_and_si256(_mm256_srli_epi32(hb, 4), three),
                                    4,
                                ),
                            ),
                            _mm256_or_si256(
                                _mm256_srli_epi32(a2, 4),
                                _mm256_slli_epi32(_mm256_srli_epi32(hb, 6), 4),
                            ),
                        ];
                        for (q, (tq, v)) in t.iter_mut().zip(qs).enumerate() {
                            let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(v, off));
                            let xv = _mm256_loadu_ps(xp.add(b * 256 + 128 * h + 32 * q + l));
                            *tq = _mm256_fmadd_ps(v, xv, *tq);
                        }
                    }
                    for (q, tq) in t.into_iter().enumerate() {
                        let ds = _mm256_set1_ps(d * *scales.add(8 * h + 2 * q + lg / 16) as f32);
                        if q % 2 == 0 {
                            acc0 = _mm256_fmadd_ps(ds, tq, acc0);
                        } else {
                            acc1 = _mm256_fmadd_ps(ds, tq, acc1);
                        }
                    }
                }
            }
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_formats::quant::dequantize;

    /// A deterministic pseudo-random stream.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        fn f(&mut self) -> f32 {
            self.next() as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
        }
    }

    /// Random packed rows whose f16 scale fields hold small finite values.
    fn random_rows(scheme: QuantScheme, n: usize, k: usize, rng: &mut Lcg) -> Vec<u8> {
        let rb = scheme.row_bytes(k).unwrap();
        let mut w: Vec<u8> = (0..n * rb).map(|_| rng.next() as u8).collect();
        // Overwrite every f16 scale with a value in [0.001, 0.06].
        let bb = scheme.block_bytes();
        let scale_offsets: &[usize] = match scheme {
            QuantScheme::Q4_0 | QuantScheme::Q5_0 | QuantScheme::Q8_0 => &[0],
            QuantScheme::Q4_1 | QuantScheme::Q5_1 => &[0, 2],
            QuantScheme::Q2K => &[80, 82],
            QuantScheme::Q3K => &[108],
            QuantScheme::Q4K | QuantScheme::Q5K => &[0, 2],
            QuantScheme::Q6K => &[208],
            QuantScheme::Q8K => &[],
        };
        for blk in w.chunks_exact_mut(bb) {
            for &o in scale_offsets {
                let v = half::f16::from_f32(0.001 + (rng.next() % 1000) as f32 * 6e-5);
                let v = if scheme == QuantScheme::Q4_1 && o == 2 {
                    -v
                } else {
                    v
                };
                blk[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
            if scheme == QuantScheme::Q8K {
                blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
            }
        }
        w
    }

    fn check(scheme: QuantScheme, m: usize, n: usize, k: usize, parallel: bool) {
        let mut rng = Lcg(m as u64 * 1000 + n as u64 * 7 + k as u64);
        let w = random_rows(scheme, n, k, &mut rng);
        let x: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
        let mut out = vec![f32::NAN; m * n];
        dequant_matmul(scheme, &x, m, k, &w, n, &mut out, parallel).unwrap();
        let ty = GgmlType::from(scheme);
        let rb = scheme.row_bytes(k).unwrap();
        let mut wf = vec![0.0f32; k];
        for j in 0..n {
            dequantize(ty, &w[j * rb..(j + 1) * rb], k, &mut wf).unwrap();
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                let want: f64 = xr.iter().zip(&wf).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = xr
                    .iter()
                    .zip(&wf)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = out[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-30,
                    "{scheme:?} m={m} n={n} k={k} [{i},{j}]: {got} vs {want} (mag {mag})"
                );
            }
        }
    }

    #[test]
    fn every_scheme_matches_dequantize_then_dot() {
        for scheme in QuantScheme::ALL {
            let k = scheme.block_elems() * 3;
            for &m in &[1, 3] {
                check(scheme, m, 37, k, false);
                check(scheme, m, 37, k, true);
            }
        }
    }

    #[test]
    fn every_isa_gemv_matches_the_exact_product() {
        for scheme in [
            QuantScheme::Q4_1,
            QuantScheme::Q8_0,
            QuantScheme::Q4_0,
            QuantScheme::Q5_0,
            QuantScheme::Q4K,
            QuantScheme::Q5K,
            QuantScheme::Q6K,
        ] {
            let (n, k) = (67, 768);
            let mut rng = Lcg(99);
            let w = random_rows(scheme, n, k, &mut rng);
            let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
            let rb = scheme.row_bytes(k).unwrap();
            let mut wf = vec![0.0f32; k];
            for isa in Isa::available() {
                let mut out = vec![f32::NAN; n];
                gemv_with(isa, scheme, &x, k, &w, rb, &mut out, true).unwrap();
                for (j, &got) in out.iter().enumerate() {
                    dequantize(GgmlType::from(scheme), &w[j * rb..(j + 1) * rb], k, &mut wf)
                        .unwrap();
                    let want: f64 = x.iter().zip(&wf).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = x
                        .iter()
                        .zip(&wf)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * mag + 1e-30,
                        "{isa} {scheme:?} row {j}: {got} vs {want}"
                    );
                    // Each row gets the bits it gets alone, whatever the chunking.
                    let mut one = [f32::NAN];
                    let wr = &w[j * rb..(j + 1) * rb];
                    gemv_with(isa, scheme, &x, k, wr, rb, &mut one, false).unwrap();
                    assert_eq!(got.to_bits(), one[0].to_bits(), "{isa} {scheme:?} row {j}");
                }
            }
        }
    }

    #[test]
    fn fast_paths_at_model_sizes() {
        for scheme in [QuantScheme::Q4_1, QuantScheme::Q8_0] {
            check(scheme, 1, 300, 576, true);
            check(scheme, 5, 200, 1536, true);
            check(scheme, 70, 130, 576, true);
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let s = QuantScheme::Q8_0;
        let mut out = vec![0.0; 2];
        assert!(dequant_matmul(s, &[0.0; 31], 1, 31, &[0; 68], 2, &mut out, false).is_err());
        assert!(dequant_matmul(s, &[0.0; 32], 1, 32, &[0; 67], 2, &mut out, false).is_err());
        assert!(dequant_matmul(s, &[0.0; 32], 1, 32, &[0; 68], 2, &mut out[..1], false).is_err());
        assert!(dequant_matmul(s, &[0.0; 32], 1, 32, &[0; 68], 2, &mut out, false).is_ok());
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    /// Tile heights for the m > 1 path, interleaved in one process.
    #[test]
    #[ignore = "timing aid, not a test: run with --release -- --ignored --nocapture"]
    fn tile_timing() {
        let (scheme, m) = (QuantScheme::Q4_1, 96);
        for (n, k) in [(1536, 576), (576, 1536), (576, 576)] {
            let rb = scheme.row_bytes(k).unwrap();
            let mut w = vec![0x11u8; n * rb];
            for blk in w.chunks_exact_mut(scheme.block_bytes()) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
            let x = vec![0.5f32; k * m];
            let mut out = vec![0.0f32; n * m];
            let tiles = [16, 32, 64, 128, 144, 192, 256, 512];
            let mut best = [f64::INFINITY; 8];
            for _ in 0..8 {
                for (i, &t) in tiles.iter().enumerate() {
                    let s = Instant::now();
                    gemm_tiled_with(scheme, &x, m, k, &w, rb, n, &mut out, true, t).unwrap();
                    best[i] = best[i].min(s.elapsed().as_secs_f64() * 1e6);
                }
            }
            let row: Vec<String> = tiles
                .iter()
                .zip(&best)
                .map(|(t, b)| format!("{t}:{b:.0}us"))
                .collect();
            println!("n={n} k={k} (default {}): {}", tile_rows(k), row.join(" "));
        }
    }

    /// Timing aid: `cargo test -p rlx-cpu --release quant::bench -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing aid, not a test: run with --release -- --ignored --nocapture"]
    fn gemv_timing() {
        for (scheme, n, k) in [
            (QuantScheme::Q4_1, 1536, 576),
            (QuantScheme::Q4_1, 576, 1536),
            (QuantScheme::Q4_1, 576, 576),
            (QuantScheme::Q8_0, 49152, 576),
            // Gemma-3-270M Q4_K_M's layer matmuls (ffn_up, attn_output, ffn_down).
            (QuantScheme::Q5_0, 2048, 640),
            (QuantScheme::Q4K, 640, 1024),
            (QuantScheme::Q6K, 640, 2048),
        ] {
            let rb = scheme.row_bytes(k).unwrap();
            let mut w = vec![0x11u8; n * rb];
            for blk in w.chunks_exact_mut(scheme.block_bytes()) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
            let x = vec![0.5f32; k * 96];
            let mut out = vec![0.0f32; n * 96];
            for (m, par) in [(1, false), (1, true), (96, true)] {
                let (x, out) = (&x[..m * k], &mut out[..m * n]);
                // Minimum over repetitions: the machine may be shared.
                let mut us = f64::INFINITY;
                for _ in 0..if m == 1 { 200 } else { 10 } {
                    let t = Instant::now();
                    dequant_matmul(scheme, x, m, k, &w, n, out, par).unwrap();
                    us = us.min(t.elapsed().as_secs_f64() * 1e6);
                }
                let gbs = (n * rb) as f64 / us / 1e3;
                let gf = (m * n * k) as f64 * 2.0 / us / 1e3;
                println!(
                    "{scheme:?} m={m} n={n} k={k} parallel={par}: {us:.1} us \
                     ({gbs:.1} GB/s of weights, {gf:.1} GFLOP/s)"
                );
            }
        }
    }
}
