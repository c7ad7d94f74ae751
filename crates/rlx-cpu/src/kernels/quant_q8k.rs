//! `DequantMatMul` with `Int8` activations for Q5_0, Q4_K, Q5_K and Q6_K
//! weights: exact integer dot products of the weight integers with the Q8
//! activation blocks of 32 of [`super::quant_q8`] (the activation format is
//! the same for every weight type: `d_x`, 32 x i8 and `s_x = d_x Σ q_x` per
//! block). A 256-element K-quant super-block covers 8 activation blocks.
//!
//! Every 32-element block `j` contributes `F_j I_j - M_j s_x[j]`, `I_j` an
//! exact integer sum formed in i8/i16/i32 arithmetic, the factors in f32:
//!
//! | weights | `I_j` | `F_j` | `M_j` |
//! |---|---|---|---|
//! | Q5_0 | `Σ (q - 16) q_x`, `q` in `0..=31` | `d d_x` | 0 |
//! | Q4_K | `Σ q q_x`, `q` in `0..=15` | `(d sc_j) d_x` | `dmin m_j` |
//! | Q5_K | `Σ q q_x`, `q` in `0..=31` | `(d sc_j) d_x` | `dmin m_j` |
//! | Q6_K | `sc_2j Σ_16 (q - 32) q_x + sc_2j+1 Σ_16 (q - 32) q_x`, `q` in `0..=63` | `d d_x` | 0 |
//!
//! (`sc_j`, `m_j`: the 6-bit scale and min of a Q4_K/Q5_K sub-block, decoded
//! by `quant_rows::scale_min`; Q6_K's `sc` are its 16 i8 scales, one per 16
//! elements, combined with the two halves' sums in integers.)
//!
//! Ranges (`|q_x| <= 127`; nothing saturates or overflows):
//! - u8 x i8 pair sums (`maddubs`, i16): Q4_K `2*15*127 = 3810`, Q5_0/Q5_K
//!   `2*31*127 = 7874`, Q6_K `2*63*127 = 16002`, all below 32767; the
//!   offsets `16 q_x` / `32 q_x` are pair sums of at most 4064 / 8128, and
//!   Q6_K's difference `Σ_pair (q - 32) q_x` lies in `[-8128, 8128]`.
//! - Q6_K's scaled pairs (`madd` with the i16 scale, `-128..=127`): at most
//!   `2 * 8128 * 128 = 2_080_768` per i32 lane.
//! - `|I_j|`: Q5_0 `32*16*127 = 65_024`, Q4_K `32*15*127 = 60_960`, Q5_K
//!   `32*31*127 = 125_984`, Q6_K `32*32*127*128 = 16_646_144`; all below
//!   2^24, so every partial sum (and `I_j`) converts to f32 exactly.
//!
//! The f32 factors are the same numbers in every path: `d sc_j` is rounded
//! as `rlx_formats::quant::dequantize` rounds it, then multiplied by `d_x`.
//! The scalar path adds `F_j I_j` block by block; the AVX2 and VNNI paths
//! keep the integer sums in 8 lanes (4 elements each), convert them and
//! fuse-multiply-add them with `F_j`, so they agree with each other bit for
//! bit (the same integers, the same f32 operations in the same order) and
//! with the scalar path up to f32 rounding of the accumulation.
//!
//! Decode (`m == 1`) runs 4 weight rows at a time (one activation load per
//! block for all four, four independent accumulator chains), prefetching
//! the same block of the next 4 rows; up to [`super::quant_q8::INT_MAX_ROWS`]
//! rows (Q5_0: [`Q5_0_MAX_ROWS`]) run 2 x 4 tiles (each weight block
//! unpacked once per 4 activation rows) into `y^T`; more rows take the f32
//! kernels on the rounded activations. Weight rows are split over the rayon
//! pool in chunks.
//!
//! AVX2 forms the u8 x i8 sums with `maddubs` + `madd`, VNNI with one
//! `vpdpbusd` (256-bit registers). Q6_K uses `maddubs` + `madd` with the
//! i16 scales on both: `vpdpbusd` would need a 32-bit multiply (2 uops)
//! for the per-16 scales afterwards.

use super::quant_q8::{quantize_rows, round_rows, run_chunks, Int8Path, Q8Rows, QK};
use super::quant_rows::scale_min;
use super::{bad_shape, exact_len, KernelError};
use rlx_ir::QuantScheme;

const OP: &str = "DequantMatMul";

/// Most activation rows for which Q5_0 weights take the integer kernel;
/// past it the rounded activations go through the f32 kernels (same
/// numbers up to f32 rounding). Measured without this limit on a 2-vCPU
/// Xeon under load (1 thread, 1024 and 2048 x 640, the Gemma-3-270M
/// shapes; `bench` below), int8 over f32 time, VNNI / AVX2 paths:
/// 0.27 / 0.33-0.36 at 4 rows,
/// 0.57 / 0.74-0.77 at 8, 0.8-1.0 / 0.95-1.2 at 16, 0.97-1.24 / 1.44-1.51
/// at 48: unpacking the fifth bit per weight block and activation tile
/// costs more than the f32 path's once-per-tile dequantization once many
/// rows share it. The K-quants stay on the integer kernels up to
/// `INT_MAX_ROWS` (int8 over f32 time 0.6-0.9 at 16 rows, 0.75-1.1 at 48).
pub const Q5_0_MAX_ROWS: usize = 16;

/// Weight formats with an integer kernel here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Q5_0,
    Q4K,
    Q5K,
    Q6K,
}

impl Kind {
    fn of(scheme: QuantScheme) -> Option<Kind> {
        match scheme {
            QuantScheme::Q5_0 => Some(Kind::Q5_0),
            QuantScheme::Q4K => Some(Kind::Q4K),
            QuantScheme::Q5K => Some(Kind::Q5K),
            QuantScheme::Q6K => Some(Kind::Q6K),
            _ => None,
        }
    }

    fn scheme(self) -> QuantScheme {
        match self {
            Kind::Q5_0 => QuantScheme::Q5_0,
            Kind::Q4K => QuantScheme::Q4K,
            Kind::Q5K => QuantScheme::Q5K,
            Kind::Q6K => QuantScheme::Q6K,
        }
    }

    /// Bytes per weight block.
    fn bytes(self) -> usize {
        self.scheme().block_bytes()
    }

    /// Elements per weight block (32 or 256).
    fn elems(self) -> usize {
        self.scheme().block_elems()
    }
}

/// Whether `scheme` has an integer kernel in this module (Q5_0, Q4_K, Q5_K,
/// Q6_K).
pub fn has_kernel(scheme: QuantScheme) -> bool {
    Kind::of(scheme).is_some()
}

/// `out [m, n] = x̂ [m, k] x W^T` where `x̂` is `x` rounded to Q8 blocks and
/// `W` holds `n` packed rows of `rb` bytes in `scheme` (one of
/// [`has_kernel`]'s), with the integer kernels of `path` (a path this CPU
/// lacks falls back to [`Int8Path::active`]). Errors name the mismatching
/// size; nothing here panics on bad sizes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_int8(
    scheme: QuantScheme,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    rb: usize,
    n: usize,
    out: &mut [f32],
    parallel: bool,
    path: Int8Path,
) -> Result<(), KernelError> {
    let Some(kind) = Kind::of(scheme) else {
        return Err(bad_shape(
            OP,
            format!("no integer kernel for {} weights here", scheme.name()),
        ));
    };
    let path = if Int8Path::available().contains(&path) {
        path
    } else {
        Int8Path::active()
    };
    if !k.is_multiple_of(kind.elems()) {
        return Err(bad_shape(
            OP,
            format!(
                "int8 activations with {} weights need K ({k}) to be a multiple of {}",
                scheme.name(),
                kind.elems()
            ),
        ));
    }
    let want_rb = k / kind.elems() * kind.bytes();
    if rb != want_rb {
        return Err(bad_shape(
            OP,
            format!(
                "row bytes {rb} for K = {k}: {} rows of K = {k} take {want_rb}",
                scheme.name()
            ),
        ));
    }
    let len = |a: usize, b: usize, what: &str| {
        a.checked_mul(b)
            .ok_or_else(|| bad_shape(OP, format!("{what} extent overflows")))
    };
    exact_len(OP, "x", x.len(), len(m, k, "x")?)?;
    exact_len(
        OP,
        &format!("packed {} W", scheme.name()),
        w.len(),
        len(n, rb, "W")?,
    )?;
    exact_len(OP, "output", out.len(), len(m, n, "output")?)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    if kind == Kind::Q5_0 && m > Q5_0_MAX_ROWS {
        let xh = round_rows(x, path != Int8Path::Scalar);
        return super::quant::dequant_matmul(scheme, &xh, m, k, w, n, out, parallel);
    }
    let xq = quantize_rows(x, m, k, path != Int8Path::Scalar);
    run_chunks(&xq, w, rb, n, out, parallel, |wc, o| {
        rows(kind, wc, rb, &xq, o, path)
    });
    Ok(())
}

/// `yt [rows, m] = W rows x x̂^T` for the `rows = w.len() / rb` weight rows
/// of one chunk.
fn rows(kind: Kind, w: &[u8], rb: usize, x: &Q8Rows, yt: &mut [f32], path: Int8Path) {
    let nrows = w.len() / rb;
    assert!(
        w.len() == nrows * rb
            && yt.len() == nrows * x.m
            && x.qs.len() == x.m * x.k
            && rb == x.k / kind.elems() * kind.bytes(),
        "quant_q8k::rows: inconsistent chunk sizes"
    );
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: `matmul_int8` passes `Avx2` only when the CPU has AVX2,
        // FMA and F16C (`Int8Path::available`); the sizes the kernel reads
        // and writes were checked just above.
        Int8Path::Avx2 => return unsafe { x86::rows(kind, w, rb, x, yt) },
        // SAFETY: as above, `Vnni` only with AVX-512 F/BW/VL and VNNI.
        Int8Path::Vnni => return unsafe { vnni::rows(kind, w, rb, x, yt) },
        Int8Path::Scalar => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    for (j, wr) in w.chunks_exact(rb).enumerate() {
        for i in 0..x.m {
            yt[j * x.m + i] = dot_scalar(kind, wr, x, i);
        }
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// One weight block against its activation integers: for each of its `n`
/// 32-element blocks `j` (1 for Q5_0, 8 for the K-quants) the exact integer
/// sum `isum[j]` (`I_j` of the module docs), the factor `scale[j]` of
/// `d_x[j] * isum[j]` and the factor `min[j]` of `s_x[j]` (subtracted).
#[derive(Debug, Clone, Copy, PartialEq)]
struct BlockSums {
    n: usize,
    isum: [i32; 8],
    scale: [f32; 8],
    min: [f32; 8],
}

/// The scalar definition of one weight block's integer sums (`blk`: one
/// block of `kind`, `q`: its `kind.elems()` activation integers).
fn block_sums(kind: Kind, blk: &[u8], q: &[i8]) -> BlockSums {
    debug_assert!(blk.len() == kind.bytes() && q.len() == kind.elems());
    let mut s = BlockSums {
        n: 8,
        isum: [0; 8],
        scale: [0.0; 8],
        min: [0.0; 8],
    };
    let qx = |e: usize| i32::from(q[e]);
    match kind {
        Kind::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let qs = &blk[6..22];
            s.n = 1;
            s.scale[0] = f16_at(blk, 0);
            s.isum[0] = (0..32)
                .map(|e| {
                    let nib = if e < 16 {
                        qs[e] & 0x0F
                    } else {
                        qs[e - 16] >> 4
                    };
                    let wq = i32::from(nib) | (((qh >> e) & 1) as i32) << 4;
                    (wq - 16) * qx(e)
                })
                .sum();
        }
        Kind::Q4K | Kind::Q5K => {
            let five = kind == Kind::Q5K;
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (qh, qs) = if five {
                (&blk[16..48], &blk[48..176])
            } else {
                (&blk[..0], &blk[16..144])
            };
            for j in 0..8 {
                // SAFETY: blk[4..16] are the super-block's 12 scale bytes and
                // j < 8.
                let (sc, mn) = unsafe { scale_min(blk[4..16].as_ptr(), j) };
                s.scale[j] = d * f32::from(sc);
                s.min[j] = dmin * f32::from(mn);
                s.isum[j] = (0..32)
                    .map(|l| {
                        let mut wq = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
                        if five {
                            wq |= ((qh[l] >> j) & 1) << 4;
                        }
                        i32::from(wq) * qx(32 * j + l)
                    })
                    .sum();
            }
        }
        Kind::Q6K => {
            let d = f16_at(blk, 208);
            for j in 0..8 {
                // Block j = 4h + g: elements 128h + 32g + l; low bits from
                // ql[64h + 32(g % 2) + l] >> 4(g / 2), high bits from
                // qh[32h + l] >> 2g; scale 2j for l < 16, 2j + 1 after.
                let (h, g) = (j / 4, j % 4);
                let mut halves = [0i32; 2];
                for l in 0..32 {
                    let low = (blk[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0F;
                    let high = (blk[128 + 32 * h + l] >> (2 * g)) & 3;
                    halves[l / 16] += (i32::from(low | (high << 4)) - 32) * qx(32 * j + l);
                }
                s.isum[j] = i32::from(blk[192 + 2 * j] as i8) * halves[0]
                    + i32::from(blk[193 + 2 * j] as i8) * halves[1];
                s.scale[j] = d;
            }
        }
    }
    s
}

/// The scalar kernel: one weight row against activation row `i`.
fn dot_scalar(kind: Kind, wr: &[u8], x: &Q8Rows, i: usize) -> f32 {
    let nb = x.k / QK;
    let (xq, xd, xs) = (
        &x.qs[i * x.k..(i + 1) * x.k],
        &x.d[i * nb..(i + 1) * nb],
        &x.s[i * nb..(i + 1) * nb],
    );
    let e = kind.elems();
    let mut acc = 0.0f32;
    let mut macc = 0.0f32;
    for (b, blk) in wr.chunks_exact(kind.bytes()).enumerate() {
        let s = block_sums(kind, blk, &xq[b * e..(b + 1) * e]);
        let first = b * e / QK;
        for j in 0..s.n {
            acc += (s.scale[j] * xd[first + j]) * s.isum[j] as f32;
            if kind == Kind::Q4K || kind == Kind::Q5K {
                macc += s.min[j] * xs[first + j];
            }
        }
    }
    acc - macc
}

/// Defines the x86 integer kernels as module `$name`, compiled with
/// `$features`: `dp4(acc, u, s)` (`$dp4`) adds the 4-byte dot products
/// (u8 x i8, summed into i32 lanes; exact for the ranges of the module
/// docs) to `acc`, and `bits16(qh)` (`$bits`) spreads the 32 bits of a
/// Q5_0 `qh` to bytes of `0x10` (bit set) or 0.
macro_rules! k_int8_kernels {
    (
        $(#[$m:meta])* $name:ident,
        $features:literal,
        |$acc:ident, $u:ident, $s:ident| $dp4:expr,
        |$qh:ident| $bits:expr
    ) => {
        $(#[$m])*
        #[cfg(target_arch = "x86_64")]
        // Register tiles are indexed [r][c] by loops over their const sizes.
        #[allow(clippy::needless_range_loop)]
        mod $name {
    use super::super::quant_rows::scale_min;
    use super::{Kind, Q8Rows, QK};
    use std::arch::x86_64::*;

    /// Bytes ahead of the current block that a one-row GEMV prefetches.
    const PF_DIST: usize = 1024;

    const Q5_0: u8 = 0;
    const Q4K: u8 = 1;
    const Q5K: u8 = 2;
    const Q6K: u8 = 3;

    /// Shuffle masks for Q6_K block `j`: bytes `2j` (x8) then `2j + 1` (x8)
    /// of the 16 scales, i.e. the scale of each element pair's i16 lane.
    const PAIR_MASKS: [[u8; 16]; 8] = {
        let mut t = [[0u8; 16]; 8];
        let mut j = 0;
        while j < 8 {
            let mut i = 0;
            while i < 16 {
                t[j][i] = (2 * j + i / 8) as u8;
                i += 1;
            }
            j += 1;
        }
        t
    };

    /// `acc` plus eight lanes of `Σ u_i s_i` over four consecutive bytes
    /// each, `u` unsigned and `s` signed bytes.
    ///
    /// # Safety
    /// The CPU supports this module's target features.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn dp4($acc: __m256i, $u: __m256i, $s: __m256i) -> __m256i {
        $dp4
    }

    /// Eight lanes of `Σ u_i s_i` over four consecutive bytes each.
    ///
    /// # Safety
    /// As [`dp4`].
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn isum4(u: __m256i, s: __m256i) -> __m256i {
        dp4(_mm256_setzero_si256(), u, s)
    }

    /// Bit `i` of `qh` as byte `i`: `0x10` where set, else 0.
    ///
    /// # Safety
    /// As [`dp4`].
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn bits16($qh: u32) -> __m256i {
        $bits
    }

    /// Eight f16 values `stride` bytes apart from `p`, as f32 lanes.
    ///
    /// # Safety
    /// This module's target features; the 8 values are readable.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
        let (mut lo, mut hi) = (0u64, 0u64);
        for t in 0..4 {
            lo |= u64::from((p.add(stride * t) as *const u16).read_unaligned()) << (16 * t);
            hi |= u64::from((p.add(stride * (t + 4)) as *const u16).read_unaligned()) << (16 * t);
        }
        _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
    }

    /// Horizontal sum of 8 lanes.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// One f16 at `p` as f32.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// The Q5_0 block at `p` as 32 unsigned bytes `q = w + 16` (`0..=31`)
    /// in element order: nibbles (low: elements 0..16) with bit `i` of
    /// `qh` as bit 4 of element `i`.
    ///
    /// # Safety
    /// This module's target features; `p` points at 22 readable bytes.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn q5_0_bytes(p: *const u8) -> __m256i {
        // The 16 bytes in both halves; the high half shifted by 4 bits
        // (each byte's high nibble to its low one; the neighbour's low
        // nibble that moves in is masked off).
        let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(6) as *const __m128i));
        let nib = _mm256_and_si256(
            _mm256_srlv_epi64(b, _mm256_set_epi64x(4, 4, 0, 0)),
            _mm256_set1_epi8(0x0F),
        );
        let qh = (p.add(2) as *const u32).read_unaligned();
        _mm256_or_si256(nib, bits16(qh))
    }

    /// The weights of 32-element block `j` of the K-quant super-block at
    /// `p` as unsigned bytes: Q4_K `0..=15`, Q5_K `0..=31`, Q6_K `q + 32`
    /// in `0..=63`.
    ///
    /// # Safety
    /// This module's target features; `p` points at one whole super-block
    /// of `KIND`; `j < 8`.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn k_bytes<const KIND: u8>(p: *const u8, j: usize) -> __m256i {
        let m4 = _mm256_set1_epi8(0x0F);
        if KIND == Q6K {
            let (h, g) = (j / 4, j % 4);
            let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (g % 2)) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            // Bits 2g, 2g + 1 of each qh byte moved to bits 4, 5 (16-bit
            // shifts: what crosses into the neighbour byte is masked off).
            let m2 = _mm256_set1_epi8(0x30);
            let (lo, hi) = match g {
                0 => (
                    _mm256_and_si256(ql, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m2),
                ),
                1 => (
                    _mm256_and_si256(ql, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m2),
                ),
                2 => (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4),
                    _mm256_and_si256(qh, m2),
                ),
                _ => (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2),
                ),
            };
            return _mm256_or_si256(lo, hi);
        }
        let qs = p.add(if KIND == Q5K { 48 } else { 16 } + 32 * (j / 2));
        let v = _mm256_loadu_si256(qs as *const __m256i);
        let lo = if j % 2 == 0 {
            _mm256_and_si256(v, m4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4)
        };
        if KIND != Q5K {
            return lo;
        }
        // Bit j of qh[l] is bit 4 of element l (a 16-bit shift by j < 8
        // keeps each byte's bit j in its own byte's bit 0).
        let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
        let h = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)),
            _mm256_set1_epi8(1),
        );
        _mm256_or_si256(lo, _mm256_slli_epi16::<4>(h))
    }

    /// The 8 scales and 8 mins of a Q4_K/Q5_K super-block (`sc`: its 12
    /// scale bytes) as f32 lanes.
    ///
    /// # Safety
    /// This module's target features; `sc` points at 12 readable bytes.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn k_scales(sc: *const u8) -> (__m256, __m256) {
        let (mut s, mut m) = (0u64, 0u64);
        for j in 0..8 {
            let (a, b) = scale_min(sc, j);
            s |= u64::from(a) << (8 * j);
            m |= u64::from(b) << (8 * j);
        }
        let v = _mm_set_epi64x(m as i64, s as i64);
        (
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v))),
        )
    }

    /// Raw views of one chunk's operands.
    struct Args {
        /// First weight row; rows are `rb` bytes apart.
        w: *const u8,
        rb: usize,
        xq: *const i8,
        xd: *const f32,
        xs: *const f32,
        k: usize,
        /// Activation blocks per row (`k / 32`).
        nb: usize,
        /// `yt[r * m + c]`.
        out: *mut f32,
        m: usize,
    }

    /// Q5_0 weight rows `r0..r0 + R` against activation rows `c0..c0 + C`.
    ///
    /// # Safety
    /// This module's target features; `r0 + R` weight rows and `c0 + C`
    /// activation rows exist in `a`'s buffers.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn tile_q5_0<const R: usize, const C: usize>(a: &Args, r0: usize, c0: usize) {
        let off = _mm256_set1_epi8(16);
        // One row: PF_DIST ahead in the stream. Several rows side by side:
        // the same block of the next tile's rows. A hint only: past the end
        // of `w` is harmless.
        let ahead = if R == 1 { PF_DIST } else { R * a.rb };
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // f[r][c][t]: F = d_w d_x of block g0 + t (groups of 8 blocks; read
        // back one lane at a time by broadcasts).
        let mut f = [[[0.0f32; 8]; C]; R];
        let mut g0 = 0;
        while g0 < a.nb {
            let cnt = (a.nb - g0).min(8);
            for r in 0..R {
                let p = a.w.add((r0 + r) * a.rb + 22 * g0);
                if cnt == 8 {
                    let dw = f16x8(p, 22);
                    for c in 0..C {
                        let dx = _mm256_loadu_ps(a.xd.add((c0 + c) * a.nb + g0));
                        _mm256_storeu_ps(f[r][c].as_mut_ptr(), _mm256_mul_ps(dw, dx));
                    }
                } else {
                    for t in 0..cnt {
                        let dw = f16_at(p.add(22 * t));
                        for c in 0..C {
                            f[r][c][t] = dw * *a.xd.add((c0 + c) * a.nb + g0 + t);
                        }
                    }
                }
            }
            for t in 0..cnt {
                let b = g0 + t;
                let mut wq = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let blk = a.w.add((r0 + r) * a.rb + 22 * b);
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(ahead) as *const i8);
                    wq[r] = q5_0_bytes(blk);
                }
                for c in 0..C {
                    let row = c0 + c;
                    let xv = _mm256_loadu_si256(a.xq.add(row * a.k + QK * b) as *const __m256i);
                    // -Σ 16 q_x per lane, the weights' offset, shared by the
                    // rows: the sum starts there.
                    let o = _mm256_sub_epi32(_mm256_setzero_si256(), isum4(off, xv));
                    for r in 0..R {
                        acc[r][c] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(dp4(o, wq[r], xv)),
                            _mm256_broadcast_ss(&f[r][c][t]),
                            acc[r][c],
                        );
                    }
                }
            }
            g0 += cnt;
        }
        for r in 0..R {
            for c in 0..C {
                *a.out.add((r0 + r) * a.m + c0 + c) = hsum(acc[r][c]);
            }
        }
    }

    /// K-quant (`KIND`) weight rows `r0..r0 + R` against activation rows
    /// `c0..c0 + C`.
    ///
    /// # Safety
    /// As [`tile_q5_0`].
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn tile_k<const KIND: u8, const R: usize, const C: usize>(
        a: &Args,
        r0: usize,
        c0: usize,
    ) {
        let bs = match KIND {
            Q4K => 144,
            Q5K => 176,
            _ => 210,
        };
        let ahead = if R == 1 { PF_DIST } else { R * a.rb };
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut macc = [[_mm256_setzero_ps(); C]; R];
        // f[r][c][j]: F_j of this super-block for weight row r and
        // activation row c (read back one lane at a time by broadcasts).
        let mut f = [[[0.0f32; 8]; C]; R];
        let mut sc6 = [_mm_setzero_si128(); R];
        let mut blk = [std::ptr::null::<u8>(); R];
        for sb in 0..a.k / 256 {
            for r in 0..R {
                let p = a.w.add((r0 + r) * a.rb + bs * sb);
                blk[r] = p;
                let pf = p.wrapping_add(ahead);
                let mut o = 0;
                while o < bs {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(o) as *const i8);
                    o += 64;
                }
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(bs - 1) as *const i8);
                // s: the per-block weight scale (d sc_j, or d for Q6_K);
                // mn: dmin m_j.
                let (s, mn) = if KIND == Q6K {
                    sc6[r] = _mm_loadu_si128(p.add(192) as *const __m128i);
                    (_mm256_set1_ps(f16_at(p.add(208))), _mm256_setzero_ps())
                } else {
                    let (scv, mnv) = k_scales(p.add(4));
                    (
                        _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), scv),
                        _mm256_mul_ps(_mm256_set1_ps(f16_at(p.add(2))), mnv),
                    )
                };
                for c in 0..C {
                    let row = c0 + c;
                    let dx = _mm256_loadu_ps(a.xd.add(row * a.nb + 8 * sb));
                    _mm256_storeu_ps(f[r][c].as_mut_ptr(), _mm256_mul_ps(s, dx));
                    if KIND != Q6K {
                        let sx = _mm256_loadu_ps(a.xs.add(row * a.nb + 8 * sb));
                        macc[r][c] = _mm256_fmadd_ps(mn, sx, macc[r][c]);
                    }
                }
            }
            for j in 0..8 {
                let mut wq = [_mm256_setzero_si256(); R];
                let mut sc16 = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    wq[r] = k_bytes::<KIND>(blk[r], j);
                    if KIND == Q6K {
                        let mask = _mm_loadu_si128(PAIR_MASKS[j].as_ptr() as *const __m128i);
                        sc16[r] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc6[r], mask));
                    }
                }
                for c in 0..C {
                    let row = c0 + c;
                    let xv = _mm256_loadu_si256(
                        a.xq.add(row * a.k + 256 * sb + QK * j) as *const __m256i
                    );
                    // Q6_K: Σ_pair 32 q_x, the weights' offset, shared by
                    // the rows.
                    let m32 = if KIND == Q6K {
                        _mm256_maddubs_epi16(_mm256_set1_epi8(32), xv)
                    } else {
                        _mm256_setzero_si256()
                    };
                    for r in 0..R {
                        let i = if KIND == Q6K {
                            _mm256_madd_epi16(
                                _mm256_sub_epi16(_mm256_maddubs_epi16(wq[r], xv), m32),
                                sc16[r],
                            )
                        } else {
                            isum4(wq[r], xv)
                        };
                        acc[r][c] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(i),
                            _mm256_broadcast_ss(&f[r][c][j]),
                            acc[r][c],
                        );
                    }
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                let mut y = hsum(acc[r][c]);
                if KIND != Q6K {
                    y -= hsum(macc[r][c]);
                }
                *a.out.add((r0 + r) * a.m + c0 + c) = y;
            }
        }
    }

    /// One tile of `KIND`.
    ///
    /// # Safety
    /// As [`tile_q5_0`].
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn tile<const KIND: u8, const R: usize, const C: usize>(
        a: &Args,
        r0: usize,
        c0: usize,
    ) {
        if KIND == Q5_0 {
            tile_q5_0::<R, C>(a, r0, c0)
        } else {
            tile_k::<KIND, R, C>(a, r0, c0)
        }
    }

    /// Every (weight row, activation row) pair of one chunk.
    ///
    /// # Safety
    /// This module's target features; `a` covers `rows` weight rows and
    /// `a.m` activation rows.
    #[target_feature(enable = $features)]
    unsafe fn rows_k<const KIND: u8>(a: &Args, rows: usize) {
        if a.m == 1 {
            let mut r = 0;
            while r + 4 <= rows {
                tile::<KIND, 4, 1>(a, r, 0);
                r += 4;
            }
            while r < rows {
                tile::<KIND, 1, 1>(a, r, 0);
                r += 1;
            }
            return;
        }
        let mut r = 0;
        while r < rows {
            let two = r + 2 <= rows;
            let mut c = 0;
            while c + 4 <= a.m {
                if two {
                    tile::<KIND, 2, 4>(a, r, c);
                } else {
                    tile::<KIND, 1, 4>(a, r, c);
                }
                c += 4;
            }
            while c < a.m {
                if two {
                    tile::<KIND, 2, 1>(a, r, c);
                } else {
                    tile::<KIND, 1, 1>(a, r, c);
                }
                c += 1;
            }
            r += if two { 2 } else { 1 };
        }
    }

    /// [`super::rows`] with this module's instructions.
    ///
    /// # Safety
    /// This module's target features; `w.len()` is a multiple of `rb`, `rb`
    /// is the row size of `x.k` elements in `kind`, and
    /// `yt.len() == rows * x.m`.
    pub(super) unsafe fn rows(kind: Kind, w: &[u8], rb: usize, x: &Q8Rows, yt: &mut [f32]) {
        let a = Args {
            w: w.as_ptr(),
            rb,
            xq: x.qs.as_ptr(),
            xd: x.d.as_ptr(),
            xs: x.s.as_ptr(),
            k: x.k,
            nb: x.k / QK,
            out: yt.as_mut_ptr(),
            m: x.m,
        };
        let nrows = w.len() / rb;
        match kind {
            Kind::Q5_0 => rows_k::<Q5_0>(&a, nrows),
            Kind::Q4K => rows_k::<Q4K>(&a, nrows),
            Kind::Q5K => rows_k::<Q5K>(&a, nrows),
            Kind::Q6K => rows_k::<Q6K>(&a, nrows),
        }
    }
}
    };
}

k_int8_kernels!(
    /// AVX2: `maddubs` (u8 x i8 pairs to i16) then `madd` with ones (to
    /// i32); Q5_0's high bits spread with a byte shuffle and a compare.
    x86,
    "avx2,fma,f16c",
    |acc, u, s| _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    ),
    |qh| {
        // Byte i takes byte i / 8 of qh; OR-ing every bit but i % 8 makes
        // it all ones exactly when bit i of qh is set.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let set = _mm256_cmpeq_epi8(
            _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
            _mm256_set1_epi8(-1),
        );
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
);

k_int8_kernels!(
    /// AVX512-VNNI on 256-bit registers: one `vpdpbusd` per 4-byte group
    /// (accumulating), the same integers as the AVX2 pair (so the same
    /// results, bit for bit); Q5_0's high bits as an AVX512-BW byte mask.
    vnni,
    "avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c",
    |acc, u, s| _mm256_dpbusd_epi32(acc, u, s),
    |qh| _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant_q8::round_rows;
    use rlx_formats::{quant::dequantize, GgmlType};
    use rlx_ir::ActivationPrecision;

    const KINDS: [Kind; 4] = [Kind::Q5_0, Kind::Q4K, Kind::Q5K, Kind::Q6K];

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

    fn paths() -> Vec<Int8Path> {
        let v = Int8Path::available();
        println!("integer kernels checked on this CPU: {v:?}");
        v
    }

    fn set_f16_bits(blk: &mut [u8], at: usize, bits: u16) {
        blk[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    }

    fn set_f16(blk: &mut [u8], at: usize, v: f32) {
        set_f16_bits(blk, at, half::f16::from_f32(v).to_bits());
    }

    /// Offsets of a block's f16 fields: the scale, then (Q4_K/Q5_K) dmin.
    fn f16_fields(kind: Kind) -> &'static [usize] {
        match kind {
            Kind::Q5_0 => &[0],
            Kind::Q4K | Kind::Q5K => &[0, 2],
            Kind::Q6K => &[208],
        }
    }

    /// One random block of `kind`; `mode` picks extremes: f16 scales 0:
    /// the largest f16 (65504), 1: the smallest subnormal (2^-24), 2: zero,
    /// else random in [0.001, 0.06]; 3 to 5: the largest integer scales
    /// (6-bit 63, Q6_K's i8 -128); 4: every weight at its most negative
    /// value, 5: at its largest.
    fn random_block(kind: Kind, mode: u32, rng: &mut Lcg) -> Vec<u8> {
        let mut b: Vec<u8> = (0..kind.bytes()).map(|_| rng.next() as u8).collect();
        for &o in f16_fields(kind) {
            match mode {
                0 => set_f16_bits(&mut b, o, 0x7BFF),
                1 => set_f16_bits(&mut b, o, 0x0001),
                2 => set_f16_bits(&mut b, o, 0),
                _ => set_f16(&mut b, o, 0.001 + (rng.next() % 1000) as f32 * 6e-5),
            }
        }
        let (qs, scales): (std::ops::Range<usize>, std::ops::Range<usize>) = match kind {
            Kind::Q5_0 => (2..22, 0..0),
            Kind::Q4K => (16..144, 4..16),
            Kind::Q5K => (16..176, 4..16),
            Kind::Q6K => (0..192, 192..208),
        };
        if (3..=5).contains(&mode) {
            b[scales].fill(if kind == Kind::Q6K { 0x80 } else { 0xFF });
        }
        // All-zero bits are each format's most negative weight (Q5_0:
        // -16, Q6_K: -32) and all-one bits its largest.
        if mode == 4 || mode == 5 {
            b[qs].fill(if mode == 4 { 0 } else { 0xFF });
        }
        b
    }

    fn random_w(kind: Kind, n: usize, k: usize, rng: &mut Lcg) -> Vec<u8> {
        let mut w = Vec::with_capacity(n * k / kind.elems() * kind.bytes());
        for _ in 0..n * k / kind.elems() {
            let mode = rng.next() % 10;
            w.extend(random_block(kind, mode, rng));
        }
        w
    }

    /// Activations whose 32-blocks span magnitudes 1e-6 .. 1e3, some all
    /// zero.
    fn random_x(len: usize, rng: &mut Lcg) -> Vec<f32> {
        let mut x = vec![0.0f32; len];
        for blk in x.chunks_exact_mut(32) {
            let e = rng.next() % 11;
            if e == 10 {
                continue;
            }
            let scale = 10f32.powi(e as i32 - 6);
            for v in blk.iter_mut() {
                *v = rng.f() * scale;
            }
        }
        x
    }

    fn dequant(kind: Kind, blk: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0f32; kind.elems()];
        dequantize(GgmlType::from(kind.scheme()), blk, kind.elems(), &mut out).unwrap();
        out
    }

    /// `blk` with its f16 fields set to `vals` (scale, then dmin).
    fn with_f16(kind: Kind, blk: &[u8], vals: &[f32]) -> Vec<u8> {
        let mut b = blk.to_vec();
        for (&o, &v) in f16_fields(kind).iter().zip(vals) {
            set_f16(&mut b, o, v);
        }
        b
    }

    /// The scalar integer sums against an i64 reference built from
    /// `rlx_formats::quant::dequantize` (an independent decoder): with the
    /// weight scale set to 1 (and Q4_K/Q5_K's sub-block scales to 1, mins
    /// to 0) every dequantized weight is its exact integer, so
    /// `Σ w q_x` in i64 is `I_j`; the f32 factors are the block's `d sc_j`
    /// and `dmin m_j` with `sc_j`, `m_j` read back through the reference
    /// decoder too. The extreme blocks reach the bounds of the module docs.
    #[test]
    fn integer_sums_are_exact() {
        let mut rng = Lcg(17);
        for kind in KINDS {
            let mut largest = 0i64;
            for trial in 0..600 {
                let blk = random_block(kind, trial % 8, &mut rng);
                let q: Vec<i8> = (0..kind.elems())
                    .map(|_| match trial % 3 {
                        0 => (rng.next() % 255) as i32 - 127,
                        1 => 127,
                        _ => -127,
                    } as i8)
                    .collect();
                let s = block_sums(kind, &blk, &q);
                assert_eq!(s.n, kind.elems() / 32);
                // Integer weights: scale 1, and for Q4_K/Q5_K sub-block
                // scales 1 and mins 0 (bytes 0..4 = 1, 4..8 = 0, 8..12 = 1).
                let mut ints = with_f16(kind, &blk, &[1.0, 0.0]);
                if matches!(kind, Kind::Q4K | Kind::Q5K) {
                    ints[4..16].copy_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
                }
                let wi = dequant(kind, &ints);
                for j in 0..s.n {
                    let want: i64 = (32 * j..32 * j + 32)
                        .map(|e| {
                            assert_eq!(wi[e].fract(), 0.0);
                            wi[e] as i64 * i64::from(q[e])
                        })
                        .sum();
                    assert_eq!(
                        i64::from(s.isum[j]),
                        want,
                        "{kind:?} trial {trial} block {j}"
                    );
                    largest = largest.max(want.abs());
                    assert!(want.abs() < 1 << 24, "{kind:?}: |I| = {want}");
                }
                let d = f16_at(&blk, f16_fields(kind)[0]);
                match kind {
                    Kind::Q5_0 | Kind::Q6K => {
                        assert!(s.scale[..s.n].iter().all(|v| v.to_bits() == d.to_bits()));
                        assert!(s.min.iter().all(|&v| v == 0.0));
                    }
                    Kind::Q4K | Kind::Q5K => {
                        let dmin = f16_at(&blk, 2);
                        // Every weight 1 and d = 1, dmin = 0: element 32j is
                        // sc_j; d = 0, dmin = 1: it is -m_j.
                        let mut ones = with_f16(kind, &blk, &[1.0, 0.0]);
                        let qs = if kind == Kind::Q5K { 48..176 } else { 16..144 };
                        ones[qs].fill(0x11);
                        if kind == Kind::Q5K {
                            ones[16..48].fill(0);
                        }
                        let sc = dequant(kind, &ones);
                        let mn = dequant(kind, &with_f16(kind, &ones, &[0.0, 1.0]));
                        for j in 0..8 {
                            assert_eq!(s.scale[j].to_bits(), (d * sc[32 * j]).to_bits());
                            // == (not bits): a zero min reads back as -0.
                            assert_eq!(s.min[j], dmin * -mn[32 * j]);
                        }
                    }
                }
            }
            let bound = match kind {
                Kind::Q5_0 => 32 * 16 * 127,
                Kind::Q4K => 32 * 15 * 127,
                Kind::Q5K => 32 * 31 * 127,
                Kind::Q6K => 32 * 32 * 127 * 128,
            };
            assert_eq!(largest, bound, "{kind:?}: the extremes reach the bound");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        kind: Kind,
        x: &[f32],
        m: usize,
        k: usize,
        w: &[u8],
        n: usize,
        path: Int8Path,
        parallel: bool,
    ) -> Vec<f32> {
        let rb = kind.scheme().row_bytes(k).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_int8(kind.scheme(), x, m, k, w, rb, n, &mut out, parallel, path).unwrap();
        out
    }

    /// Random rows with extreme blocks: every path against the scalar path
    /// and against the rounded activations times the dequantized weights
    /// (`round_rows` + `dequantize`, products and sums in f64), both within
    /// `1e-5 * mag`, `mag = Σ |x̂_i| (|w_i| + 2 |dmin m_i|)`.
    ///
    /// Why 1e-5: all paths use the same exact `I_j` and the same f32
    /// factors, each within 2 roundings (`u = 2^-24`) of the exact `d sc_j
    /// d_x`; `s_x` is one rounding off `d_x Σ q_x`. The f32 sums add at most
    /// 64 blocks per lane (K = 2048) plus an 8-lane reduction and the min
    /// term: under `75 u ≈ 4.5e-6` of `mag`. The reference's own `w_i`
    /// (`fl(fl(d sc) q - fl(dmin m))`) is within `2 u (|d sc q| + |dmin m|)`,
    /// covered by the `2 |dmin m|` in `mag`. The AVX2 and VNNI paths form
    /// the same integers and add in the same order: equal bit for bit; and
    /// a row's result does not depend on the chunking (bit for bit).
    #[test]
    fn every_path_matches_scalar_and_rounded_reference() {
        let mut rng = Lcg(5);
        let paths = paths();
        for kind in KINDS {
            let ks: &[usize] = if kind == Kind::Q5_0 {
                &[64, 256, 512, 640, 2048]
            } else {
                &[256, 512, 2048]
            };
            for &k in ks {
                let mut shapes = vec![(1, 37), (3, 37), (5, 37)];
                if k == 256 {
                    shapes.extend([(1, 300), (16, 21), (48, 21)]);
                }
                for (m, n) in shapes {
                    let w = random_w(kind, n, k, &mut rng);
                    let x = random_x(m * k, &mut rng);
                    let xh = round_rows(&x, false);
                    let rb = kind.scheme().row_bytes(k).unwrap();
                    // Reference products and magnitudes, [m, n].
                    let mut want = vec![0.0f64; m * n];
                    let mut mag = vec![0.0f64; m * n];
                    for j in 0..n {
                        let row = &w[j * rb..(j + 1) * rb];
                        let mut wf = Vec::with_capacity(k);
                        let mut mins = Vec::with_capacity(k);
                        for blk in row.chunks_exact(kind.bytes()) {
                            wf.extend(dequant(kind, blk));
                            let d0 = with_f16(kind, blk, &[0.0]);
                            mins.extend(dequant(kind, &d0));
                        }
                        for i in 0..m {
                            let hr = &xh[i * k..(i + 1) * k];
                            for e in 0..k {
                                let (a, b) = (hr[e] as f64, wf[e] as f64);
                                want[i * n + j] += a * b;
                                mag[i * n + j] +=
                                    a.abs() * (b.abs() + 2.0 * (mins[e] as f64).abs());
                            }
                        }
                    }
                    let scalar = run(kind, &x, m, k, &w, n, Int8Path::Scalar, false);
                    let mut vector: Option<Vec<f32>> = None;
                    for &path in &paths {
                        let got = run(kind, &x, m, k, &w, n, path, false);
                        let par = run(kind, &x, m, k, &w, n, path, true);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&par),
                            "{kind:?} k={k} m={m} {path:?}: chunking"
                        );
                        if path != Int8Path::Scalar {
                            match &vector {
                                None => vector = Some(got.clone()),
                                Some(v) => assert_eq!(
                                    bits(v),
                                    bits(&got),
                                    "{kind:?} k={k} m={m}: {path:?} vs the first vector path"
                                ),
                            }
                        }
                        for idx in 0..m * n {
                            let (g, tol) = (got[idx] as f64, 1e-5 * mag[idx]);
                            assert!(
                                (g - want[idx]).abs() <= tol,
                                "{kind:?} k={k} m={m} [{}, {}] {path:?}: {g} vs reference {} (mag {})",
                                idx / n,
                                idx % n,
                                want[idx],
                                mag[idx]
                            );
                            assert!(
                                (g - scalar[idx] as f64).abs() <= tol,
                                "{kind:?} k={k} m={m} [{}, {}] {path:?}: {g} vs scalar {}",
                                idx / n,
                                idx % n,
                                scalar[idx]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_activations_give_nan_rows() {
        let (m, n) = (3, 6);
        let mut rng = Lcg(9);
        for kind in KINDS {
            let k = kind.elems().max(64);
            let w: Vec<u8> = (0..n * k / kind.elems())
                .flat_map(|_| random_block(kind, 9, &mut rng))
                .collect();
            for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                let mut x: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
                x[k + 40] = bad;
                for path in paths() {
                    let got = run(kind, &x, m, k, &w, n, path, false);
                    for i in 0..m {
                        for j in 0..n {
                            let v = got[i * n + j];
                            assert_eq!(v.is_nan(), i == 1, "{kind:?} {path:?} [{i},{j}] = {v}");
                            assert!(i == 1 || v.is_finite());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let path = Int8Path::active();
        let mut out = vec![0.0f32; 2];
        for kind in KINDS {
            let s = kind.scheme();
            let e = kind.elems();
            let rb = kind.bytes();
            let x = vec![0.5f32; e];
            let w = vec![0u8; 2 * rb];
            let f = |x: &[f32], k: usize, w: &[u8], rb: usize, out: &mut [f32]| {
                matmul_int8(s, x, 1, k, w, rb, 2, out, false, path)
            };
            assert!(f(&x, e, &w, rb, &mut out).is_ok());
            // K not a whole number of weight blocks, wrong row bytes, short
            // or long buffers.
            assert!(
                f(&x[..e - 32], e - 32, &w, rb, &mut out).is_err(),
                "{kind:?}"
            );
            assert!(f(&x, e, &w, rb - 1, &mut out).is_err(), "{kind:?}");
            assert!(
                f(&x, e, &w[..2 * rb - 1], rb, &mut out).is_err(),
                "{kind:?}"
            );
            assert!(f(&x[..e - 1], e, &w, rb, &mut out).is_err(), "{kind:?}");
            assert!(f(&x, e, &w, rb, &mut out[..1]).is_err(), "{kind:?}");
            // The same through the public entry point.
            let act = ActivationPrecision::Int8;
            let g = super::super::quant::dequant_matmul_act;
            assert!(g(s, act, &x, 1, e, &w, 2, &mut out, false).is_ok());
            assert!(g(s, act, &x[..e - 32], 1, e - 32, &w, 2, &mut out, false).is_err());
            assert!(g(s, act, &x, 1, e, &w[..2 * rb - 1], 2, &mut out, false).is_err());
            assert!(g(s, act, &x, 1, e, &w, 2, &mut out[..1], false).is_err());
        }
        let err = matmul_int8(
            QuantScheme::Q4_1,
            &[0.0; 32],
            1,
            32,
            &[0; 20],
            20,
            1,
            &mut out[..1],
            false,
            path,
        );
        assert!(err.is_err());
    }

    /// The active path's integer kernels (`rows`) on `x`, whatever `m`.
    fn integer_kernels(kind: Kind, x: &[f32], m: usize, k: usize, w: &[u8], n: usize) -> Vec<f32> {
        let path = Int8Path::active();
        let rb = kind.scheme().row_bytes(k).unwrap();
        let xq = quantize_rows(x, m, k, path != Int8Path::Scalar);
        let mut yt = vec![f32::NAN; n * m];
        rows(kind, w, rb, &xq, &mut yt, path);
        (0..m * n).map(|e| yt[(e % n) * m + e / n]).collect()
    }

    /// `DequantMatMul` with `Int8` activations reaches these kernels for
    /// these schemes (the f32 fallback would round differently), up to
    /// `INT_MAX_ROWS` activation rows (Q5_0: [`Q5_0_MAX_ROWS`], then the
    /// f32 kernels on the rounded activations).
    #[test]
    fn int8_dequant_matmul_runs_these_kernels() {
        let mut rng = Lcg(21);
        for kind in KINDS {
            let s = kind.scheme();
            assert!(super::super::quant_q8::has_integer_kernel(s));
            let (k, n) = (512, 40);
            for m in [
                1,
                4,
                Q5_0_MAX_ROWS,
                17,
                super::super::quant_q8::INT_MAX_ROWS,
            ] {
                let w = random_w(kind, n, k, &mut rng);
                let x = random_x(m * k, &mut rng);
                let mut out = vec![0.0f32; m * n];
                super::super::quant::dequant_matmul_act(
                    s,
                    ActivationPrecision::Int8,
                    &x,
                    m,
                    k,
                    &w,
                    n,
                    &mut out,
                    true,
                )
                .unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let xh = round_rows(&x, false);
                let mut f32_out = vec![0.0f32; m * n];
                super::super::quant::dequant_matmul(s, &xh, m, k, &w, n, &mut f32_out, true)
                    .unwrap();
                if kind == Kind::Q5_0 && m > Q5_0_MAX_ROWS {
                    assert_eq!(
                        bits(&out),
                        bits(&f32_out),
                        "{kind:?} m={m}: the f32 kernels"
                    );
                    continue;
                }
                let want = integer_kernels(kind, &x, m, k, &w, n);
                assert_eq!(bits(&out), bits(&want), "{kind:?} m={m}");
                assert_ne!(
                    bits(&out),
                    bits(&f32_out),
                    "{kind:?} m={m}: the f32 kernels ran"
                );
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use rlx_ir::ActivationPrecision;
    use std::time::Instant;

    /// Timing aid: `cargo test -p rlx-cpu --release quant_q8k::bench --
    /// --ignored --nocapture`. Gemma-3-270M Q4_K_M's layer matmuls, f32
    /// and int8 activations interleaved, minimum wall time over
    /// repetitions (robust on a shared machine), one thread and the pool.
    #[test]
    #[ignore = "timing aid, not a test: run with --release -- --ignored --nocapture"]
    fn int8_vs_f32_timing() {
        for (scheme, n, k) in [
            (QuantScheme::Q5_0, 1024, 640),
            (QuantScheme::Q5_0, 2048, 640),
            (QuantScheme::Q4K, 640, 1024),
            (QuantScheme::Q4K, 640, 2048),
            (QuantScheme::Q6K, 640, 2048),
            (QuantScheme::Q5K, 640, 2048),
        ] {
            let rb = scheme.row_bytes(k).unwrap();
            let mut w: Vec<u8> = (0..n * rb).map(|i| (i * 7 + 3) as u8).collect();
            for blk in w.chunks_exact_mut(scheme.block_bytes()) {
                let at = if scheme == QuantScheme::Q6K { 208 } else { 0 };
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
            let x: Vec<f32> = (0..k * 48)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            let mut out = vec![0.0f32; n * 48];
            for (m, parallel) in [
                (1, false),
                (1, true),
                (4, false),
                (8, false),
                (16, false),
                (48, false),
            ] {
                let (x, out) = (&x[..m * k], &mut out[..m * n]);
                let mut best = [f64::INFINITY; 2];
                for _ in 0..if m == 1 { 300 } else { 30 } {
                    for (i, act) in [ActivationPrecision::F32, ActivationPrecision::Int8]
                        .into_iter()
                        .enumerate()
                    {
                        let t = Instant::now();
                        super::super::quant::dequant_matmul_act(
                            scheme, act, x, m, k, &w, n, out, parallel,
                        )
                        .unwrap();
                        best[i] = best[i].min(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
                println!(
                    "{scheme:?} m={m} n={n} k={k} parallel={parallel}: f32 {:.1} us, int8 {:.1} us ({:.2}x; int8 {:.1} GB/s of weights)",
                    best[0],
                    best[1],
                    best[0] / best[1],
                    (n * rb) as f64 / best[1] / 1e3
                );
            }
        }
    }
}
