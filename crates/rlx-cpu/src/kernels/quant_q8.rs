//! `DequantMatMul` with `Int8` activations (llama.cpp's arithmetic): every
//! row of x is rounded to Q8 blocks of 32 (`d`, 32 x i8; see `rlx_ir::op`),
//! and each block's dot product with a weight block is an exact integer sum.
//!
//! - Q4_0, Q4_1 and Q8_0 weights have integer kernels: a block contributes
//!   `(d_w d_x) Σ q_w q_x` (+ `m_w (d_x Σ q_x)` for Q4_1), the integer sums
//!   formed with AVX2 `maddubs`/`madd` (unsigned x signed bytes; Q4_0 and
//!   Q8_0 use the sign trick `|w| * sign(x, w)`), or in plain Rust on CPUs
//!   without AVX2. Only the f32 accumulation of the per-block terms differs
//!   between the two (order of additions).
//! - Q5_0, Q4_K, Q5_K and Q6_K weights have the integer kernels of
//!   [`super::quant_q8k`] (same activation blocks; Q5_0 up to
//!   [`super::quant_q8k::Q5_0_MAX_ROWS`] rows).
//! - Other schemes multiply the rounded activations `x̂ = d q` (as f32) with
//!   the f32-activation kernels of [`super::quant`]: same numbers up to f32
//!   rounding, no speed-up.
//!
//! Decode (`m == 1`) runs one weight row at a time, a single stream with a
//! software prefetch 1 KiB ahead (measured in the SmolLM2 decode step: 4-row
//! tiles are faster on weights in cache but slower once they stream from
//! memory, 3.5 vs 2.5 ms for the 30 MB Q8_0 head); up to
//! [`INT_MAX_ROWS`] rows run 2 x 4 tiles (each pair of weight rows unpacked
//! once) into `y^T`, which is then transposed. Weight rows are split over
//! the rayon pool in chunks. Past [`INT_MAX_ROWS`] rows the rounded
//! activations go through the f32 tiled GEMM instead: on AVX2 without VNNI
//! an integer block product costs 5 vector ops per 32 multiply-adds against
//! 4 FMAs in f32, and the f32 GEMM's register blocking wins (measured 15-30%
//! faster at 128 rows, 10-60% slower at 16-32). The numbers are the same up
//! to f32 rounding either way.

use super::{bad_shape, KernelError};
use crate::isa::Isa;
use rayon::prelude::*;
use rlx_ir::QuantScheme;

const OP: &str = "DequantMatMul";

/// Elements per activation block.
pub const QK: usize = 32;

/// Most activation rows the integer kernels take (see the module docs).
pub const INT_MAX_ROWS: usize = 48;

/// A matrix of activations rounded to Q8 blocks of 32 (row-major `[m, k]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Q8Rows {
    /// Number of rows (the `m` of `[m, k]`).
    pub m: usize,
    /// Elements per row (a multiple of [`QK`]).
    pub k: usize,
    /// The integer parts, `m * k`, each in `-127..=127`.
    pub qs: Vec<i8>,
    /// Per-block scale `d`, `m * k / 32`; NaN for a block with a NaN or an
    /// infinity (its `qs` are 0).
    pub d: Vec<f32>,
    /// Per-block `d * Σ q` (for weight formats with a min).
    pub s: Vec<f32>,
}

impl Q8Rows {
    /// The rounded values `d * q` as f32, row-major `[m, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs
            .chunks_exact(QK)
            .zip(&self.d)
            .flat_map(|(q, &d)| q.iter().map(move |&v| d * f32::from(v)))
            .collect()
    }
}

/// Round one block of 32 activations: writes `q` and returns `(d, Σ q)`.
/// This is the definition the AVX2 version must match bit for bit.
pub fn quantize_block_scalar(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    debug_assert!(x.len() == QK && q.len() == QK);
    if x.iter().any(|v| !v.is_finite()) {
        q.fill(0);
        return (f32::NAN, 0);
    }
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    if d < f32::MIN_POSITIVE {
        q.fill(0);
        return (0.0, 0);
    }
    let id = 1.0 / d;
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        // |v * id| <= 127 up to rounding, so the cast never saturates.
        let r = (v * id).round_ties_even() as i8;
        *o = r;
        sum += i32::from(r);
    }
    (d, sum)
}

/// Round the rows of `x` (`m * k` elements, `k` a multiple of 32) to Q8
/// blocks, with AVX2 when `avx2` is set (identical results).
pub fn quantize_rows(x: &[f32], m: usize, k: usize, avx2: bool) -> Q8Rows {
    debug_assert!(k.is_multiple_of(QK) && x.len() == m * k);
    let nb = x.len() / QK;
    let mut r = Q8Rows {
        m,
        k,
        qs: vec![0; x.len()],
        d: vec![0.0; nb],
        s: vec![0.0; nb],
    };
    let blocks = x
        .chunks_exact(QK)
        .zip(r.qs.chunks_exact_mut(QK))
        .zip(r.d.iter_mut().zip(r.s.iter_mut()));
    for ((xb, qb), (d, s)) in blocks {
        let (dv, sum) = quantize_block(xb, qb, avx2);
        *d = dv;
        *s = dv * sum as f32;
    }
    r
}

/// One block of 32 rounded into `q`: returns `(d, Σ q)`, with the AVX2
/// kernel when `avx2` (the same bits as the scalar one).
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8], avx2: bool) -> (f32, i32) {
    assert!(x.len() == QK && q.len() == QK, "a Q8 block holds {QK}");
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is set only when the CPU has AVX2, FMA and F16C
        // (see `has_avx2`); both blocks hold 32 elements (asserted).
        return unsafe { x86::quantize_block(x, q) };
    }
    let _ = avx2;
    quantize_block_scalar(x, q)
}

/// `x` (a whole number of 32-blocks) replaced by its rounded values `d * q`
/// in one pass; equal to `quantize_rows(..).dequantize()`, bit for bit.
pub fn round_rows(x: &[f32], avx2: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    let mut q = [0i8; QK];
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(QK)) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: `avx2` is set only when the CPU has AVX2, FMA and F16C;
            // `xb`, `ob` and `q` hold 32 elements.
            unsafe {
                let (d, _) = x86::quantize_block(xb, &mut q);
                x86::scale_block(&q, d, ob);
            }
            continue;
        }
        let (d, _) = quantize_block_scalar(xb, &mut q);
        for (o, &v) in ob.iter_mut().zip(&q) {
            *o = d * f32::from(v);
        }
    }
    out
}

/// Weight formats with an integer kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl Kind {
    fn of(scheme: QuantScheme) -> Option<Kind> {
        match scheme {
            QuantScheme::Q4_0 => Some(Kind::Q4_0),
            QuantScheme::Q4_1 => Some(Kind::Q4_1),
            QuantScheme::Q8_0 => Some(Kind::Q8_0),
            _ => None,
        }
    }

    /// Bytes per block.
    fn bb(self) -> usize {
        match self {
            Kind::Q4_0 => 18,
            Kind::Q4_1 => 20,
            Kind::Q8_0 => 34,
        }
    }
}

/// Whether this CPU can run the AVX2 + FMA + F16C kernels (tests compare
/// them with the scalar ones).
pub fn has_avx2() -> bool {
    Isa::Avx2.supported()
}

/// Which integer kernels form the block dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Path {
    /// Plain Rust.
    Scalar,
    /// AVX2 `maddubs` + `madd`.
    Avx2,
    /// AVX512-VNNI `vpdpbusd` (on 256-bit registers).
    Vnni,
}

impl Int8Path {
    /// The kernels for the active [`Isa`] (`RLX_CPU_ISA`): VNNI under
    /// AVX-512 when the CPU has it, AVX2 under AVX2 or AVX-512, else scalar.
    pub fn active() -> Int8Path {
        match Isa::active() {
            Isa::Avx512 if crate::isa::CpuFeatures::get().avx512vnni => Int8Path::Vnni,
            Isa::Avx512 | Isa::Avx2 => Int8Path::Avx2,
            Isa::Portable => Int8Path::Scalar,
        }
    }

    /// Every path this CPU runs (tests compare them).
    pub fn available() -> Vec<Int8Path> {
        let mut v = vec![Int8Path::Scalar];
        if Isa::Avx2.supported() {
            v.push(Int8Path::Avx2);
        }
        if Isa::Avx512.supported() && crate::isa::CpuFeatures::get().avx512vnni {
            v.push(Int8Path::Vnni);
        }
        v
    }
}

/// Whether `scheme` has an integer kernel here (else `Int8` activations
/// are rounded and then multiplied in f32).
pub fn has_integer_kernel(scheme: QuantScheme) -> bool {
    Kind::of(scheme).is_some() || super::quant_q8k::has_kernel(scheme)
}

/// `out [m, n] = x̂ [m, k] x W^T` where `x̂` is `x` rounded to Q8 blocks.
/// The caller has checked every length: `x` is `m * k`, `w` is `n * rb`
/// with `rb == scheme.row_bytes(k)`, `out` is `m * n`, and `m, n, k > 0`.
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
) -> Result<(), KernelError> {
    matmul_int8_isa(scheme, x, m, k, w, rb, n, out, parallel, Int8Path::active())
}

#[allow(clippy::too_many_arguments)]
fn matmul_int8_isa(
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
    let avx2 = path != Int8Path::Scalar;
    if !k.is_multiple_of(QK) {
        return Err(bad_shape(
            OP,
            format!("int8 activations need K ({k}) to be a multiple of {QK}"),
        ));
    }
    if m <= INT_MAX_ROWS && super::quant_q8k::has_kernel(scheme) {
        return super::quant_q8k::matmul_int8(scheme, x, m, k, w, rb, n, out, parallel, path);
    }
    let Some(kind) = Kind::of(scheme).filter(|_| m <= INT_MAX_ROWS) else {
        let xh = round_rows(x, avx2);
        return super::quant::dequant_matmul(scheme, &xh, m, k, w, n, out, parallel);
    };
    let xq = quantize_rows(x, m, k, avx2);
    if kind.bb() * (k / QK) != rb {
        return Err(bad_shape(OP, format!("row bytes {rb} for K = {k}")));
    }
    run_chunks(&xq, w, rb, n, out, parallel, |wc, o| {
        rows(kind, wc, rb, &xq, o, path)
    });
    Ok(())
}

/// `out [m, n] = x̂ W^T` through `rows(weight rows, yt)`, which fills `yt`
/// (`[rows, m]`, weight row major) for one chunk of weight rows: split
/// over the rayon pool when `parallel`, then transposed into `out`. One
/// activation row (decode) writes `out` directly, in chunks of a multiple
/// of 4 rows holding at least `GEMV_MIN_CHUNK` multiply-adds; more rows
/// in chunks of at least 16.
pub(crate) fn run_chunks(
    x: &Q8Rows,
    w: &[u8],
    rb: usize,
    n: usize,
    out: &mut [f32],
    parallel: bool,
    rows: impl Fn(&[u8], &mut [f32]) + Sync,
) {
    let (m, k) = (x.m, x.k);
    let threads = if parallel { super::team::threads() } else { 1 };
    if m == 1 {
        let per = n
            .div_ceil(threads * 4)
            .max(super::quant::GEMV_MIN_CHUNK / k)
            .next_multiple_of(4);
        if threads == 1 || per >= n {
            rows(w, out);
        } else {
            super::team::for_each_chunk_mut(out, per, |i, o| {
                rows(&w[i * per * rb..][..o.len() * rb], o)
            });
        }
        return;
    }
    let mut yt = vec![0.0f32; n * m];
    let per = n.div_ceil(threads * 8).max(16).next_multiple_of(4);
    if threads == 1 || per >= n {
        rows(w, &mut yt);
    } else {
        yt.par_chunks_mut(per * m)
            .zip(w.par_chunks(per * rb))
            .for_each(|(o, wc)| rows(wc, o));
    }
    for (i, orow) in out.chunks_exact_mut(n).enumerate() {
        for (j, o) in orow.iter_mut().enumerate() {
            *o = yt[j * m + i];
        }
    }
}

/// `yt [rows, m] = W rows x x̂^T` for the `rows = w.len() / rb` weight rows
/// of one chunk.
fn rows(kind: Kind, w: &[u8], rb: usize, x: &Q8Rows, yt: &mut [f32], path: Int8Path) {
    let nrows = w.len() / rb;
    assert!(
        yt.len() == nrows * x.m && x.qs.len() == x.m * x.k && rb == kind.bb() * (x.k / QK),
        "quant_q8::rows: inconsistent chunk sizes"
    );
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: `Avx2` is chosen only when the CPU has AVX2, FMA and F16C
        // (see `Int8Path::supported`); the sizes the kernel reads and writes
        // were checked just above.
        Int8Path::Avx2 => return unsafe { x86::rows(kind, w, rb, x, yt) },
        // SAFETY: as above, `Vnni` only with AVX-512 F/BW/VL and VNNI.
        Int8Path::Vnni => return unsafe { vnni::rows(kind, w, rb, x, yt) },
        Int8Path::Scalar => {}
    }
    for (j, wr) in w.chunks_exact(rb).enumerate() {
        for i in 0..x.m {
            yt[j * x.m + i] = dot_scalar(kind, wr, x, i);
        }
    }
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// The scalar kernel: one weight row against activation row `i`.
fn dot_scalar(kind: Kind, wr: &[u8], x: &Q8Rows, i: usize) -> f32 {
    let nb = x.k / QK;
    let (xq, xd, xs) = (
        &x.qs[i * x.k..(i + 1) * x.k],
        &x.d[i * nb..(i + 1) * nb],
        &x.s[i * nb..(i + 1) * nb],
    );
    let mut acc = 0.0f32;
    let mut macc = 0.0f32;
    for (b, blk) in wr.chunks_exact(kind.bb()).enumerate() {
        let q = &xq[b * QK..(b + 1) * QK];
        let (isum, d, mn) = block_isum(kind, blk, q);
        acc += (d * xd[b]) * isum as f32;
        if kind == Kind::Q4_1 {
            macc += mn * xs[b];
        }
    }
    acc + macc
}

/// `(Σ q_w q_x, d_w, m_w)` of one weight block against 32 activation ints.
fn block_isum(kind: Kind, blk: &[u8], q: &[i8]) -> (i32, f32, f32) {
    let dot = |wq: &dyn Fn(usize) -> i32| -> i32 {
        q.iter()
            .enumerate()
            .map(|(e, &v)| wq(e) * i32::from(v))
            .sum()
    };
    // 4-bit formats: element e < 16 is the low nibble of byte e, element
    // e >= 16 the high nibble of byte e - 16.
    let nib = |qs: &[u8], e: usize| -> i32 {
        if e < 16 {
            i32::from(qs[e] & 0x0F)
        } else {
            i32::from(qs[e - 16] >> 4)
        }
    };
    match kind {
        Kind::Q8_0 => (dot(&|e| i32::from(blk[2 + e] as i8)), f16_at(blk), 0.0),
        Kind::Q4_0 => (dot(&|e| nib(&blk[2..18], e) - 8), f16_at(blk), 0.0),
        Kind::Q4_1 => (
            dot(&|e| nib(&blk[4..20], e)),
            f16_at(blk),
            f16_at(&blk[2..]),
        ),
    }
}

/// Defines the x86 integer kernels as module `$name`, compiled with
/// `$features`; `isum4(u, s)` (`$isum`) forms the 4-byte dot products.
macro_rules! int8_kernels {
    ($(#[$m:meta])* $name:ident, $features:literal, |$u:ident, $s:ident| $isum:expr) => {
        $(#[$m])*
        #[cfg(target_arch = "x86_64")]
        // Register tiles are indexed [r][c] by loops over their const sizes.
        #[allow(clippy::needless_range_loop, dead_code)]
        mod $name {
    use super::{Kind, Q8Rows, QK};
    use std::arch::x86_64::*;

    /// Bytes ahead of the current block that a one-row GEMV prefetches.
    const PF_DIST: usize = 1024;

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// Eight lanes of `Σ u_i s_i` over four consecutive bytes each, `u`
    /// unsigned and `s` signed bytes (exact: see the callers' bounds).
    ///
    /// # Safety
    /// The CPU supports this module's target features.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn isum4($u: __m256i, $s: __m256i) -> __m256i {
        $isum
    }

    /// [`super::quantize_block_scalar`] with AVX2, bit for bit.
    ///
    /// # Safety
    /// The CPU must support AVX2; `x` and `q` hold 32 elements.
    #[target_feature(enable = $features)]
    pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
        debug_assert!(x.len() == QK && q.len() == QK);
        let p = x.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let mut amax = _mm256_setzero_ps();
        // Lanes that are NaN or infinite: |v| is not < inf (unordered for NaN).
        let mut bad = _mm256_setzero_ps();
        let inf = _mm256_set1_ps(f32::INFINITY);
        for &vi in &v {
            let a = _mm256_andnot_ps(sign, vi);
            amax = _mm256_max_ps(amax, a);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
        }
        if _mm256_movemask_ps(bad) != 0 {
            q.fill(0);
            return (f32::NAN, 0);
        }
        let m = _mm_max_ps(
            _mm256_castps256_ps128(amax),
            _mm256_extractf128_ps::<1>(amax),
        );
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        let d = _mm_cvtss_f32(m) / 127.0;
        if d < f32::MIN_POSITIVE {
            q.fill(0);
            return (0.0, 0);
        }
        let id = _mm256_set1_ps(1.0 / d);
        let r = |vi: __m256| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(vi, id)))
        };
        let (i0, i1, i2, i3) = (r(v[0]), r(v[1]), r(v[2]), r(v[3]));
        let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        // packs work within 128-bit lanes; the permute restores the order.
        let i01 = _mm256_packs_epi32(i0, i1);
        let i23 = _mm256_packs_epi32(i2, i3);
        let b = _mm256_packs_epi16(i01, i23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `q` holds 32 bytes (the caller's contract).
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, b);
        (d, _mm_cvtsi128_si32(s))
    }

    /// `out = d * q` for one block of 32.
    ///
    /// # Safety
    /// The CPU must support AVX2; `q` and `out` hold 32 elements.
    #[target_feature(enable = $features)]
    pub(super) unsafe fn scale_block(q: &[i8], d: f32, out: &mut [f32]) {
        debug_assert!(q.len() == QK && out.len() == QK);
        let dv = _mm256_set1_ps(d);
        for i in 0..4 {
            let qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(8 * i) as *const __m128i));
            _mm256_storeu_ps(
                out.as_mut_ptr().add(8 * i),
                _mm256_mul_ps(_mm256_cvtepi32_ps(qi), dv),
            );
        }
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

    /// 16 bytes of packed nibbles as 32 bytes: low nibbles (elements
    /// 0..16), then high nibbles (elements 16..32).
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        let b = _mm_loadu_si128(p as *const __m128i);
        let v = _mm256_set_m128i(_mm_srli_epi16::<4>(b), b);
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }

    /// A weight block: its 32 integers (signed for Q4_0/Q8_0, unsigned for
    /// Q4_1), scale and min.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn load_w<const KIND: u8>(p: *const u8) -> (__m256i, f32, f32) {
        match KIND {
            Q4_0 => (
                _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)),
                f16_at(p),
                0.0,
            ),
            Q4_1 => (nibbles(p.add(4)), f16_at(p), f16_at(p.add(2))),
            _ => (
                _mm256_loadu_si256(p.add(2) as *const __m256i),
                f16_at(p),
                0.0,
            ),
        }
    }

    /// Raw views of one chunk's operands.
    struct Args {
        /// First weight row; rows are `rb` bytes apart.
        w: *const u8,
        rb: usize,
        /// Block bytes.
        bb: usize,
        xq: *const i8,
        xd: *const f32,
        xs: *const f32,
        k: usize,
        nb: usize,
        /// `yt[r * m + c]`.
        out: *mut f32,
        m: usize,
    }

    /// Weight rows `r0..r0 + R` against activation rows `c0..c0 + C`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `r0 + R` weight rows and `c0 + C` activation rows
    /// exist in `a`'s buffers.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn tile<const KIND: u8, const R: usize, const C: usize>(a: &Args, r0: usize, c0: usize) {
        let signed = KIND != Q4_1;
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut macc = [[0.0f32; C]; R];
        for b in 0..a.nb {
            let mut wv = [_mm256_setzero_si256(); R];
            let mut wa = [_mm256_setzero_si256(); R];
            let mut dw = [0.0f32; R];
            let mut mw = [0.0f32; R];
            for r in 0..R {
                let blk = a.w.add((r0 + r) * a.rb + b * a.bb);
                // One row: PF_DIST ahead in the stream. Several rows side by
                // side: the same block of the next tile's row, R rows on.
                // A hint only: past the end of `w` is harmless.
                let ahead = if R == 1 { PF_DIST } else { R * a.rb };
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(ahead) as *const i8);
                let (v, d, mn) = load_w::<KIND>(blk);
                wv[r] = v;
                dw[r] = d;
                mw[r] = mn;
                if signed {
                    wa[r] = _mm256_sign_epi8(v, v);
                }
            }
            for c in 0..C {
                let row = c0 + c;
                let xv = _mm256_loadu_si256(a.xq.add(row * a.k + b * QK) as *const __m256i);
                let dx = *a.xd.add(row * a.nb + b);
                let sx = if signed {
                    0.0
                } else {
                    *a.xs.add(row * a.nb + b)
                };
                for r in 0..R {
                    let p = _mm256_cvtepi32_ps(if signed {
                        isum4(wa[r], _mm256_sign_epi8(xv, wv[r]))
                    } else {
                        isum4(wv[r], xv)
                    });
                    acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dx), p, acc[r][c]);
                    if !signed {
                        macc[r][c] += mw[r] * sx;
                    }
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                *a.out.add((r0 + r) * a.m + c0 + c) = hsum(acc[r][c]) + macc[r][c];
            }
        }
    }

    /// Every (weight row, activation row) pair of one chunk.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `a` covers `rows` weight rows and `a.m`
    /// activation rows.
    #[target_feature(enable = $features)]
    unsafe fn rows_k<const KIND: u8>(a: &Args, rows: usize) {
        if a.m == 1 {
            // Four rows at a time: four independent accumulator chains and
            // one activation load per block for all four (SmolLM2 decode on
            // the 16-core Xeon, int8: +19% at 1 thread, +17% at 2).
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
        if rows >= 2 {
            sweep::<KIND, 2>(a, rows - rows % 2, 0);
        }
        if rows % 2 == 1 {
            sweep::<KIND, 1>(a, 1, rows - 1);
        }
    }

    /// `R` weight rows unpacked once for a sweep over every activation row:
    /// per block, the integers (and `|w|` for signed formats) and the
    /// scales; the mins row-major `[R, nb]`.
    struct Unpacked<const R: usize> {
        v: Vec<[__m256i; R]>,
        a: Vec<[__m256i; R]>,
        /// Scales, broadcast to 8 lanes.
        d: Vec<[__m256; R]>,
        mn: Vec<f32>,
    }

    /// Weight rows `r_first..r_first + rows` (`rows` a multiple of `R`),
    /// `R` at a time, each group unpacked once and run against all
    /// activation rows in tiles of 4.
    ///
    /// # Safety
    /// As [`rows_k`].
    #[target_feature(enable = $features)]
    unsafe fn sweep<const KIND: u8, const R: usize>(a: &Args, rows: usize, r_first: usize) {
        let nb = a.nb;
        let mut u = Unpacked::<R> {
            v: vec![[_mm256_setzero_si256(); R]; nb],
            a: vec![[_mm256_setzero_si256(); R]; nb],
            d: vec![[_mm256_setzero_ps(); R]; nb],
            mn: vec![0.0; R * nb],
        };
        let mut r0 = r_first;
        while r0 < r_first + rows {
            for b in 0..nb {
                for r in 0..R {
                    let (v, d, mn) = load_w::<KIND>(a.w.add((r0 + r) * a.rb + b * a.bb));
                    u.v[b][r] = v;
                    u.a[b][r] = _mm256_sign_epi8(v, v);
                    u.d[b][r] = _mm256_set1_ps(d);
                    u.mn[r * nb + b] = mn;
                }
            }
            let mut c = 0;
            while c + 4 <= a.m {
                tile_unpacked::<KIND, R, 4>(a, &u, r0, c);
                c += 4;
            }
            while c < a.m {
                tile_unpacked::<KIND, R, 1>(a, &u, r0, c);
                c += 1;
            }
            r0 += R;
        }
    }

    /// `Σ_i a_i b_i` over `n` floats (8 lanes, then the tail).
    ///
    /// # Safety
    /// AVX2 and FMA; `a` and `b` point at `n` floats.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc);
            i += 8;
        }
        let mut s = hsum(acc);
        while i < n {
            s += *a.add(i) * *b.add(i);
            i += 1;
        }
        s
    }

    /// [`tile`] over unpacked weight rows `r0..r0 + R`.
    ///
    /// # Safety
    /// As [`tile`]; `u` holds the unpacked rows `r0..r0 + R`.
    #[inline]
    #[target_feature(enable = $features)]
    unsafe fn tile_unpacked<const KIND: u8, const R: usize, const C: usize>(
        a: &Args,
        u: &Unpacked<R>,
        r0: usize,
        c0: usize,
    ) {
        let signed = KIND != Q4_1;
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..a.nb {
            let (wv, wa, dw) = (
                u.v.get_unchecked(b),
                u.a.get_unchecked(b),
                u.d.get_unchecked(b),
            );
            for c in 0..C {
                let row = c0 + c;
                let xv = _mm256_loadu_si256(a.xq.add(row * a.k + b * QK) as *const __m256i);
                let dx = _mm256_broadcast_ss(&*a.xd.add(row * a.nb + b));
                for r in 0..R {
                    let p = _mm256_cvtepi32_ps(if signed {
                        isum4(wa[r], _mm256_sign_epi8(xv, wv[r]))
                    } else {
                        isum4(wv[r], xv)
                    });
                    acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), p, acc[r][c]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                let row = c0 + c;
                let mut y = hsum(acc[r][c]);
                if !signed {
                    y += dot_f32(u.mn.as_ptr().add(r * a.nb), a.xs.add(row * a.nb), a.nb);
                }
                *a.out.add((r0 + r) * a.m + row) = y;
            }
        }
    }

    /// [`super::rows`] with this module's instructions.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `w.len()` is a multiple of `rb`, `rb` is the
    /// row size of `x.k` elements in `kind`, and `yt.len() == rows * x.m`.
    pub(super) unsafe fn rows(kind: Kind, w: &[u8], rb: usize, x: &Q8Rows, yt: &mut [f32]) {
        let a = Args {
            w: w.as_ptr(),
            rb,
            bb: kind.bb(),
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
            Kind::Q4_0 => rows_k::<Q4_0>(&a, nrows),
            Kind::Q4_1 => rows_k::<Q4_1>(&a, nrows),
            Kind::Q8_0 => rows_k::<Q8_0>(&a, nrows),
        }
    }
}
    };
}

int8_kernels!(
    /// AVX2: `maddubs` (u8 x i8 pairs to i16; the pair sums fit, see the
    /// tile comments) then `madd` with ones (to i32).
    x86,
    "avx2,fma,f16c",
    |u, s| _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
);

int8_kernels!(
    /// AVX512-VNNI on 256-bit registers: one `vpdpbusd` per 4-byte group,
    /// the same integers as the AVX2 pair (so the same results, bit for bit).
    vnni,
    "avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c",
    |u, s| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
);

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_formats::{quant::dequantize, GgmlType};

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

    const SCHEMES: [QuantScheme; 3] = [QuantScheme::Q4_0, QuantScheme::Q4_1, QuantScheme::Q8_0];

    /// The ISAs to compare: scalar always, AVX2 where the CPU has it.
    fn isas() -> Vec<Int8Path> {
        let v = Int8Path::available();
        println!("integer kernels checked on this CPU: {v:?}");
        v
    }

    fn set_f16(blk: &mut [u8], at: usize, v: f32) {
        blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
    }

    /// Random packed rows with small random f16 scales (and negative mins).
    fn random_w(scheme: QuantScheme, n: usize, k: usize, rng: &mut Lcg) -> Vec<u8> {
        let rb = scheme.row_bytes(k).unwrap();
        let mut w: Vec<u8> = (0..n * rb).map(|_| rng.next() as u8).collect();
        let fields: &[usize] = match scheme {
            QuantScheme::Q4_0 | QuantScheme::Q5_0 | QuantScheme::Q8_0 => &[0],
            QuantScheme::Q4_1 | QuantScheme::Q5_1 | QuantScheme::Q4K | QuantScheme::Q5K => &[0, 2],
            QuantScheme::Q2K => &[80, 82],
            QuantScheme::Q3K => &[108],
            QuantScheme::Q6K => &[208],
            QuantScheme::Q8K => &[],
        };
        let has_min = matches!(scheme, QuantScheme::Q4_1 | QuantScheme::Q5_1);
        for blk in w.chunks_exact_mut(scheme.block_bytes()) {
            for (i, &o) in fields.iter().enumerate() {
                let v = 0.001 + (rng.next() % 1000) as f32 * 6e-5;
                set_f16(blk, o, if i == 1 && has_min { -4.0 * v } else { v });
            }
            if scheme == QuantScheme::Q8K {
                blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
            }
        }
        w
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        scheme: QuantScheme,
        x: &[f32],
        m: usize,
        k: usize,
        w: &[u8],
        n: usize,
        avx2: Int8Path,
        parallel: bool,
    ) -> Vec<f32> {
        let rb = scheme.row_bytes(k).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_int8_isa(scheme, x, m, k, w, rb, n, &mut out, parallel, avx2).unwrap();
        out
    }

    #[test]
    fn rounding_follows_the_definition() {
        // amax 127 gives d = 1, so q = round_half_even(x): ties go to even.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = 3.5;
        x[3] = -2.5;
        x[4] = -0.5;
        x[5] = 0.49;
        x[6] = -126.6;
        let mut q = [0i8; 32];
        let (d, s) = quantize_block_scalar(&x, &mut q);
        assert_eq!(d, 1.0);
        assert_eq!(&q[..7], &[127, 2, 4, -2, 0, 0, -127]);
        assert_eq!(s, 127 + 2 + 4 - 2 - 127);
        // All zeros and a subnormal amax: zeros with d = 0.
        for v in [0.0f32, 1e-40] {
            let (d, s) = quantize_block_scalar(&[v; 32], &mut q);
            assert_eq!((d, s), (0.0, 0));
            assert!(q.iter().all(|&v| v == 0));
        }
        // NaN or an infinity anywhere: d is NaN.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = [0.5f32; 32];
            x[17] = bad;
            assert!(quantize_block_scalar(&x, &mut q).0.is_nan());
        }
    }

    #[test]
    fn avx2_rounding_is_bit_exact() {
        if !has_avx2() {
            println!("skipped: no AVX2");
            return;
        }
        let mut rng = Lcg(5);
        let mut x: Vec<f32> = (0..32 * 400).map(|_| rng.f() * 3.0).collect();
        // Special blocks: zeros, subnormal, NaN, infinity, integer ties,
        // one huge value, mixed magnitudes.
        x[..32].fill(0.0);
        x[32..64].fill(1e-41);
        x[64 + 3] = f32::NAN;
        x[96 + 31] = f32::NEG_INFINITY;
        for (i, v) in x[128..160].iter_mut().enumerate() {
            *v = i as f32 - 15.5;
        }
        x[160] = 3.0e38;
        for (i, v) in x[192..224].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 10f32.powi(i as i32 % 7 - 3);
        }
        let a = quantize_rows(&x, 400, 32, false);
        let b = quantize_rows(&x, 400, 32, true);
        assert_eq!(a.qs, b.qs);
        for (da, db) in a.d.iter().zip(&b.d).chain(a.s.iter().zip(&b.s)) {
            assert_eq!(da.to_bits(), db.to_bits());
        }
        assert!(a.d[2].is_nan() && a.d[3].is_nan() && a.d[0] == 0.0 && a.d[1] == 0.0);
        let want: Vec<u32> = a.dequantize().iter().map(|v| v.to_bits()).collect();
        for avx2 in [false, true] {
            let got: Vec<u32> = round_rows(&x, avx2).iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "round_rows kernels {avx2:?}");
        }
    }

    /// Integer-valued operands (weight scales 1, activation blocks with
    /// amax 127 so d_x = 1, sums below 2^24): every f32 step is exact, so
    /// each kernel must return the exact integer dot product, bit for bit.
    #[test]
    fn integer_sums_are_exact() {
        let mut rng = Lcg(11);
        let k = 576;
        for scheme in SCHEMES {
            for (m, n) in [(1, 7), (1, 64), (5, 7), (9, 10)] {
                let mut w = random_w(scheme, n, k, &mut rng);
                for blk in w.chunks_exact_mut(scheme.block_bytes()) {
                    set_f16(blk, 0, 1.0);
                    if scheme == QuantScheme::Q4_1 {
                        set_f16(blk, 2, -8.0);
                    }
                }
                let mut x: Vec<f32> = (0..m * k)
                    .map(|_| (rng.next() % 255) as f32 - 127.0)
                    .collect();
                for blk in x.chunks_exact_mut(32) {
                    blk[(rng.next() % 32) as usize] = if rng.next().is_multiple_of(2) {
                        127.0
                    } else {
                        -127.0
                    };
                }
                let rb = scheme.row_bytes(k).unwrap();
                let mut wf = vec![0.0f32; k];
                let mut want = vec![0.0f32; m * n];
                for j in 0..n {
                    dequantize(GgmlType::from(scheme), &w[j * rb..(j + 1) * rb], k, &mut wf)
                        .unwrap();
                    for i in 0..m {
                        let s: i64 = (0..k).map(|e| x[i * k + e] as i64 * wf[e] as i64).sum();
                        assert!(s.unsigned_abs() < 1 << 24);
                        want[i * n + j] = s as f32;
                    }
                }
                for avx2 in isas() {
                    for parallel in [false, true] {
                        let got = run(scheme, &x, m, k, &w, n, avx2, parallel);
                        assert_eq!(got, want, "{scheme:?} m={m} n={n} kernels {avx2:?}");
                    }
                }
            }
        }
    }

    /// Random operands: each kernel against the exact product of the
    /// rounded activations with the dequantized weights (f64), within f32
    /// rounding; and against the f32-activation kernel within the Q8
    /// rounding bound `Σ_b (d_b / 2) Σ_i |w_i|`.
    #[test]
    fn random_operands_match_the_rounded_product() {
        let mut rng = Lcg(3);
        for scheme in QuantScheme::ALL {
            let k = scheme.block_elems() * 3;
            for (m, n) in [(1, 37), (6, 37), (70, 9)] {
                let w = random_w(scheme, n, k, &mut rng);
                let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 2.0).collect();
                let xq = quantize_rows(&x, m, k, false);
                let xh = xq.dequantize();
                let rb = scheme.row_bytes(k).unwrap();
                let mut f32_out = vec![0.0f32; m * n];
                super::super::quant::dequant_matmul(scheme, &x, m, k, &w, n, &mut f32_out, false)
                    .unwrap();
                let mut wf = vec![0.0f32; k];
                for avx2 in isas() {
                    let got = run(scheme, &x, m, k, &w, n, avx2, true);
                    for j in 0..n {
                        dequantize(GgmlType::from(scheme), &w[j * rb..(j + 1) * rb], k, &mut wf)
                            .unwrap();
                        for i in 0..m {
                            let (xr, hr) = (&x[i * k..(i + 1) * k], &xh[i * k..(i + 1) * k]);
                            let want: f64 =
                                hr.iter().zip(&wf).map(|(&a, &b)| a as f64 * b as f64).sum();
                            let mag: f64 = hr
                                .iter()
                                .zip(&wf)
                                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                                .sum();
                            let g = got[i * n + j] as f64;
                            assert!(
                                (g - want).abs() <= 1e-5 * mag + 1e-12,
                                "{scheme:?} m={m} [{i},{j}] kernels {avx2:?}: {g} vs {want}"
                            );
                            let bound: f64 = (0..k / 32)
                                .map(|b| {
                                    let d = xq.d[i * k / 32 + b] as f64;
                                    d / 2.0
                                        * wf[b * 32..(b + 1) * 32]
                                            .iter()
                                            .map(|v| v.abs() as f64)
                                            .sum::<f64>()
                                })
                                .sum();
                            let fo = f32_out[i * n + j] as f64;
                            let fmag: f64 = xr
                                .iter()
                                .zip(&wf)
                                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                                .sum();
                            assert!(
                                (g - fo).abs() <= bound + 1e-5 * (mag + fmag),
                                "{scheme:?} [{i},{j}]: int8 {g} vs f32 {fo}, bound {bound}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_activations_give_nan_rows() {
        let (k, n, m) = (64, 6, 3);
        let mut rng = Lcg(9);
        for scheme in SCHEMES {
            let w = random_w(scheme, n, k, &mut rng);
            let mut x: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
            x[k + 40] = f32::INFINITY;
            for avx2 in isas() {
                let got = run(scheme, &x, m, k, &w, n, avx2, false);
                for i in 0..m {
                    for j in 0..n {
                        assert_eq!(got[i * n + j].is_nan(), i == 1, "{scheme:?} [{i},{j}]");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let mut out = vec![0.0; 2];
        let x = [0.0f32; 32];
        let act = rlx_ir::ActivationPrecision::Int8;
        let f = super::super::quant::dequant_matmul_act;
        assert!(f(
            QuantScheme::Q8_0,
            act,
            &x,
            1,
            32,
            &[0; 67],
            2,
            &mut out,
            false
        )
        .is_err());
        assert!(f(
            QuantScheme::Q8_0,
            act,
            &x[..31],
            1,
            31,
            &[0; 68],
            2,
            &mut out,
            false
        )
        .is_err());
        assert!(f(
            QuantScheme::Q8_0,
            act,
            &x,
            1,
            32,
            &[0; 68],
            2,
            &mut out[..1],
            false
        )
        .is_err());
        assert!(f(
            QuantScheme::Q8_0,
            act,
            &x,
            1,
            32,
            &[0; 68],
            2,
            &mut out,
            false
        )
        .is_ok());
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use rlx_ir::ActivationPrecision;

    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }

    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }

    /// This thread's CPU time in ns (`CLOCK_THREAD_CPUTIME_ID`): unlike
    /// wall time, it does not count time other processes held the core.
    #[cfg(target_os = "linux")]
    fn cpu_ns() -> u64 {
        let mut t = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `t` is a valid, writable timespec (two i64 on 64-bit
        // Linux); clock 3 is CLOCK_THREAD_CPUTIME_ID.
        unsafe { clock_gettime(3, &mut t) };
        t.sec as u64 * 1_000_000_000 + t.nsec as u64
    }

    /// Timing aid: decode GEMVs on the rayon pool (SmolLM2's shapes), f32
    /// and int8 activations interleaved, minimum wall time.
    #[test]
    #[ignore = "timing aid, not a test: run with --release -- --ignored --nocapture"]
    fn gemv_parallel_timing() {
        for (scheme, n, k) in [
            (QuantScheme::Q4_1, 960, 576),
            (QuantScheme::Q4_1, 3072, 576),
            (QuantScheme::Q4_1, 576, 1536),
            (QuantScheme::Q8_0, 49152, 576),
        ] {
            let rb = scheme.row_bytes(k).unwrap();
            let mut w: Vec<u8> = (0..n * rb).map(|i| (i * 7 + 3) as u8).collect();
            for blk in w.chunks_exact_mut(scheme.block_bytes()) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
            let x: Vec<f32> = (0..k).map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8).collect();
            let mut out = vec![0.0f32; n];
            let mut best = [f64::INFINITY; 2];
            for _ in 0..if n > 10000 { 60 } else { 400 } {
                for (i, act) in [ActivationPrecision::F32, ActivationPrecision::Int8]
                    .into_iter()
                    .enumerate()
                {
                    let t = std::time::Instant::now();
                    super::super::quant::dequant_matmul_act(
                        scheme, act, &x, 1, k, &w, n, &mut out, true,
                    )
                    .unwrap();
                    best[i] = best[i].min(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            println!(
                "{scheme:?} m=1 n={n} k={k}, pool: f32 {:.1} us, int8 {:.1} us ({:.1} / {:.1} GB/s of weights)",
                best[0],
                best[1],
                (n * rb) as f64 / best[0] / 1e3,
                (n * rb) as f64 / best[1] / 1e3
            );
        }
    }

    /// Timing aid: `cargo test -p rlx-cpu --release quant_q8::bench -- --ignored --nocapture`.
    /// One thread, f32 and int8 activations interleaved, minimum on-CPU
    /// time over repetitions (robust on a shared machine).
    #[test]
    #[ignore = "timing aid, not a test: run with --release -- --ignored --nocapture"]
    fn int8_vs_f32_timing() {
        for (scheme, n, k) in [
            (QuantScheme::Q4_1, 1536, 576),
            (QuantScheme::Q4_1, 3072, 576),
            (QuantScheme::Q4_1, 576, 1536),
            (QuantScheme::Q8_0, 8192, 576),
        ] {
            let rb = scheme.row_bytes(k).unwrap();
            let mut w: Vec<u8> = (0..n * rb).map(|i| (i * 7 + 3) as u8).collect();
            for blk in w.chunks_exact_mut(scheme.block_bytes()) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
            let x: Vec<f32> = (0..k * 128)
                .map(|i| ((i * 13) % 17) as f32 * 0.1 - 0.8)
                .collect();
            let mut out = vec![0.0f32; n * 128];
            for m in [1, 4, 16, 32, 128] {
                let (x, out) = (&x[..m * k], &mut out[..m * n]);
                let mut best = [u64::MAX; 2];
                for _ in 0..if m <= 4 { 100 } else { 8 } {
                    for (i, act) in [ActivationPrecision::F32, ActivationPrecision::Int8]
                        .into_iter()
                        .enumerate()
                    {
                        let t = cpu_ns();
                        super::super::quant::dequant_matmul_act(
                            scheme, act, x, m, k, &w, n, out, false,
                        )
                        .unwrap();
                        best[i] = best[i].min(cpu_ns() - t);
                    }
                }
                let gf = |ns: u64| (m * n * k) as f64 * 2.0 / ns as f64;
                println!(
                    "{scheme:?} m={m} n={n} k={k}, 1 thread: f32 {:.1} us ({:.1} GFLOP/s), int8 {:.1} us ({:.1} GOP/s)",
                    best[0] as f64 / 1e3,
                    gf(best[0]),
                    best[1] as f64 / 1e3,
                    gf(best[1])
                );
            }
        }
    }
}
