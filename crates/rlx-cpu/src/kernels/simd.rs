//! Vectorizable scalar math (exp, tanh, erfc-based GELU) and small
//! reductions written so LLVM turns them into SIMD, plus a macro that
//! compiles a hot function twice (baseline and AVX2+FMA) and picks one at
//! run time.
//!
//! Every function here is `#[inline(always)]` so it is compiled inside the
//! caller's target features.

/// Define a function whose body is compiled for the baseline target and, on
/// x86_64, twice more: with AVX2+FMA+F16C and with AVX-512 (F/BW/VL/DQ) on
/// top. The copy that runs is [`crate::isa::Isa::active`]'s. Signatures may
/// not be generic. Inside the body the type `M` implements [`Fma`]:
/// `M::fma(a, b, c)` is a fused multiply-add in the vector copies and
/// `a * b + c` in the baseline copy, and the `*_m::<M>` math functions use
/// it. The AVX2 and AVX-512 copies run the same operations in the same
/// order (LLVM only widens the vectors), so they agree bit for bit.
#[macro_export]
#[doc(hidden)]
macro_rules! simd_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments, clippy::extra_unused_type_parameters, unused)]
            fn body<M: $crate::kernels::simd::Fma>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body::<$crate::kernels::simd::HwFma>($($arg),*)
                }
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body::<$crate::kernels::simd::HwFma>($($arg),*)
                }
                match $crate::isa::Isa::active() {
                    // SAFETY: `avx512` only differs from `body` by its target
                    // features, and the active ISA is one the CPU supports.
                    $crate::isa::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above, for AVX2, FMA and F16C.
                    $crate::isa::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::isa::Isa::Portable => {}
                }
            }
            body::<$crate::kernels::simd::NoFma>($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// How `a * b + c` is evaluated inside a [`simd_dispatch!`] body.
pub trait Fma {
    /// `a * b + c`, fused or not.
    fn fma(a: f32, b: f32, c: f32) -> f32;

    /// [`sum`] (the same additions in the same order).
    #[inline(always)]
    fn sum(x: &[f32]) -> f32 {
        sum(x)
    }

    /// The largest element ignoring NaNs (`f32::max` semantics), `-inf`
    /// for an empty or all-NaN slice.
    #[inline(always)]
    fn max_num(x: &[f32]) -> f32 {
        x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
    }

    /// [`dot`] (the same products and additions in the same order).
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot(a, b)
    }

    /// [`weighted_rows`] (the same products and additions in the same
    /// order).
    #[inline(always)]
    fn weighted_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        weighted_rows(w, rows, stride, out)
    }

    /// [`dot_rows`] (each the same bits as [`dot`]).
    #[inline(always)]
    fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        dot_rows(q, rows, stride, out)
    }
}

/// Hardware fused multiply-add; only for code compiled with the `fma`
/// target feature (elsewhere it is a slow libm call).
#[derive(Debug, Clone, Copy)]
pub struct HwFma;

/// Separate multiply and add (baseline targets).
#[derive(Debug, Clone, Copy)]
pub struct NoFma;

impl Fma for HwFma {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    // LLVM vectorizes the portable reductions in [`sum`] and [`max_slice`]
    // with 128-bit shuffles inside dispatched bodies; these use 8-lane
    // AVX registers directly.
    #[inline(always)]
    fn sum(x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            return unsafe { avx::sum(x) };
        }
        sum(x)
    }

    #[inline(always)]
    fn max_num(x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            return unsafe { avx::max_num(x) };
        }
        x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
    }

    // Inside dispatched bodies LLVM turned [`dot`]'s 8 accumulators into
    // 128-bit halves and shuffles (decode attention spent ~36 ns per
    // 64-dim key on Zen 3); this keeps them in one 8-lane register.
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            return unsafe { avx::dot(a, b) };
        }
        dot(a, b)
    }

    // One `dot` at a time is a chain of dependent adds per key; four keys
    // at a time keep four chains in flight and reduce them together.
    #[inline(always)]
    fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            return unsafe { avx::dot_rows(q, rows, stride, out) };
        }
        dot_rows(q, rows, stride, out)
    }

    // The portable loop adds into `out` in memory once per row; this keeps
    // 64-column strips of `out` in registers across the rows. One-query
    // attention's head loop got 25-30 % faster on Zen 3 (AVX2 kernels).
    // Under the AVX-512 kernels too: there the portable loop's 16-lane
    // adds go to `out = slot[2..]`, 8 bytes off a line, so every store
    // splits a cache line and the next row's load waits on it (SmolLM2
    // decode on Zen 4, 2 threads: attention 1.26 -> 0.94-1.09 ms a step).
    #[inline(always)]
    fn weighted_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            return unsafe { avx::weighted_rows(w, rows, stride, out) };
        }
        weighted_rows(w, rows, stride, out)
    }
}

/// `out += Σ_j w[j] · rows[j * stride..j * stride + out.len()]`, row by
/// row in order, skipping rows whose weight is 0 (multiply, then add).
///
/// # Panics
/// If `rows` is shorter than the last weighted row needs.
#[inline(always)]
pub fn weighted_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let d = out.len();
    for (j, &wj) in w.iter().enumerate() {
        if wj != 0.0 {
            axpy(wj, &rows[j * stride..j * stride + d], out);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// [`super::sum`] on 8-lane registers: lane `i` accumulates elements
    /// `i, i + 8, ...`, then `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 +
    /// a7))`, then the tail in order.
    ///
    /// # Safety
    /// The CPU supports AVX.
    #[target_feature(enable = "avx")]
    #[inline]
    pub unsafe fn sum(x: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut chunks = x.chunks_exact(8);
        for c in &mut chunks {
            acc = _mm256_add_ps(acc, _mm256_loadu_ps(c.as_ptr()));
        }
        let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let mut l = [0f32; 4];
        _mm_storeu_ps(l.as_mut_ptr(), h);
        let mut s = (l[0] + l[1]) + (l[2] + l[3]);
        for &v in chunks.remainder() {
            s += v;
        }
        s
    }

    /// [`super::dot`] on 8-lane registers: lane `i` accumulates the
    /// products of elements `i, i + 8, ...` (multiply, then add), then
    /// `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`, then the tail
    /// in order: the same bits as the portable loop.
    ///
    /// # Safety
    /// The CPU supports AVX.
    #[target_feature(enable = "avx")]
    #[inline]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = _mm256_setzero_ps();
        let mut ca = a.chunks_exact(8);
        let mut cb = b.chunks_exact(8);
        for (x, y) in (&mut ca).zip(&mut cb) {
            let p = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
            acc = _mm256_add_ps(acc, p);
        }
        let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let mut l = [0f32; 4];
        _mm_storeu_ps(l.as_mut_ptr(), h);
        let mut s = (l[0] + l[1]) + (l[2] + l[3]);
        for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
            s += x * y;
        }
        s
    }

    /// [`super::dot_rows`]: four rows at a time, each accumulated as
    /// [`dot`] does (lane `i` sums the products of elements `i, i + 8,
    /// ...`, multiply then add), the four reduced together by two rounds of
    /// `hadd` (`(l0 + l1) + (l2 + l3)` of the halves' sums, as [`dot`]),
    /// then the tail in order: the same bits as one [`dot`] per row.
    ///
    /// # Safety
    /// The CPU supports AVX.
    #[target_feature(enable = "avx")]
    #[inline]
    pub unsafe fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let (d, n) = (q.len(), out.len());
        if n == 0 {
            return;
        }
        // Every row read below lies inside `rows` (the portable loop would
        // panic on the same input).
        assert!(
            (n - 1) * stride + d <= rows.len(),
            "dot_rows: rows too short"
        );
        let d8 = d / 8 * 8;
        let (qp, rp) = (q.as_ptr(), rows.as_ptr());
        let mut j = 0;
        while j + 4 <= n {
            let r = [0, 1, 2, 3].map(|i| rp.add((j + i) * stride));
            // Rows eight ahead: a decode step's KV cache comes from L3 or
            // memory in strided rows that the hardware prefetchers run
            // behind on (a hint; addresses past the end are never read).
            for i in 0..4 {
                let ahead = rp.wrapping_add((j + 8 + i) * stride);
                for e in (0..d).step_by(16) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(e) as *const i8);
                }
            }
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut e = 0;
            while e < d8 {
                let x = _mm256_loadu_ps(qp.add(e));
                for (a, row) in acc.iter_mut().zip(&r) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(x, _mm256_loadu_ps(row.add(e))));
                }
                e += 8;
            }
            let h = acc.map(|a| _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
            let s = _mm_hadd_ps(_mm_hadd_ps(h[0], h[1]), _mm_hadd_ps(h[2], h[3]));
            if d8 == d {
                _mm_storeu_ps(out.as_mut_ptr().add(j), s);
            } else {
                let mut l = [0f32; 4];
                _mm_storeu_ps(l.as_mut_ptr(), s);
                for ((o, row), &li) in out[j..j + 4].iter_mut().zip(&r).zip(&l) {
                    let mut t = li;
                    for e in d8..d {
                        t += *qp.add(e) * *row.add(e);
                    }
                    *o = t;
                }
            }
            j += 4;
        }
        for (jj, o) in out.iter_mut().enumerate().skip(j) {
            *o = dot(q, &rows[jj * stride..jj * stride + d]);
        }
    }

    /// [`super::weighted_rows`] with each 64-column strip of `out` (then a
    /// 32-column one, then the rest scalar) held in registers over all
    /// rows: per element the same `out + w_j * x` sequence in row order,
    /// so the same bits.
    ///
    /// # Safety
    /// The CPU supports AVX.
    #[target_feature(enable = "avx")]
    #[inline]
    pub unsafe fn weighted_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let d = out.len();
        if w.is_empty() || d == 0 {
            return;
        }
        // Every row read below lies inside `rows` (the portable loop would
        // panic on the same input).
        assert!(
            (w.len() - 1) * stride + d <= rows.len(),
            "weighted_rows: rows too short"
        );
        let mut c0 = 0;
        while c0 + 64 <= d {
            strip::<8>(w, rows, stride, &mut out[c0..c0 + 64], c0);
            c0 += 64;
        }
        if c0 + 32 <= d {
            strip::<4>(w, rows, stride, &mut out[c0..c0 + 32], c0);
            c0 += 32;
        }
        if c0 < d {
            for (j, &wj) in w.iter().enumerate() {
                if wj != 0.0 {
                    let row = &rows[j * stride + c0..j * stride + d];
                    for (o, &x) in out[c0..].iter_mut().zip(row) {
                        *o += wj * x;
                    }
                }
            }
        }
    }

    /// Columns `c0..c0 + 8 * NV` of every weighted row, added into `out`.
    ///
    /// # Safety
    /// AVX; `out` holds `8 * NV` floats and each row `j` of `w` has them at
    /// `rows[j * stride + c0..]` (checked by the caller).
    #[target_feature(enable = "avx")]
    #[inline]
    unsafe fn strip<const NV: usize>(
        w: &[f32],
        rows: &[f32],
        stride: usize,
        out: &mut [f32],
        c0: usize,
    ) {
        let mut acc = [_mm256_setzero_ps(); NV];
        for (c, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(out.as_ptr().add(8 * c));
        }
        let base = rows.as_ptr().add(c0);
        for (j, &wj) in w.iter().enumerate() {
            if wj != 0.0 {
                let b = _mm256_set1_ps(wj);
                let row = base.add(j * stride);
                for (c, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(b, _mm256_loadu_ps(row.add(8 * c))));
                }
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *a);
        }
    }

    /// The largest non-NaN element (`-inf` if none).
    ///
    /// # Safety
    /// The CPU supports AVX.
    #[target_feature(enable = "avx")]
    #[inline]
    pub unsafe fn max_num(x: &[f32]) -> f32 {
        // vmaxps returns its second operand when either is NaN: keeping
        // the accumulator second skips NaN elements.
        let mut acc = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut chunks = x.chunks_exact(8);
        for c in &mut chunks {
            acc = _mm256_max_ps(_mm256_loadu_ps(c.as_ptr()), acc);
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        l.iter()
            .chain(chunks.remainder())
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v))
    }
}

impl Fma for NoFma {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `k * LN2_HI` is exact for |k| <= 256 (Cephes).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding and subtracting it rounds to the nearest integer.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// The shared core of the exponentials: for `xc` (the clamped `hi + lo`),
/// `k = round(xc / ln 2)` and `p = e^(hi + lo - k ln 2)`, so that
/// `e^(hi + lo) = p * 2^k`. The range reduction keeps `lo`'s bits that
/// `hi + lo` would round away.
#[inline(always)]
fn exp_reduce<M: Fma>(xc: f32, hi: f32, lo: f32) -> (f32, i32) {
    let shifted = M::fma(xc, LOG2E, ROUND_MAGIC);
    let kf = shifted - ROUND_MAGIC;
    let r = M::fma(-kf, LN2_LO, M::fma(-kf, LN2_HI, hi) + lo);
    // exp(r) for |r| <= ~0.35: Taylor to degree 7 (error < 6e-9), in
    // Estrin form for a short dependency chain.
    let r2 = r * r;
    let r4 = r2 * r2;
    let p01 = 1.0 + r;
    let p23 = M::fma(r, 1.0 / 6.0, 0.5);
    let p45 = M::fma(r, 1.0 / 120.0, 1.0 / 24.0);
    let p67 = M::fma(r, 1.0 / 5040.0, 1.0 / 720.0);
    let p03 = M::fma(r2, p23, p01);
    let p47 = M::fma(r2, p67, p45);
    let p = M::fma(r4, p47, p03);
    // The integer k sits in the low mantissa bits of `shifted` (|k| < 2^22);
    // reading it from the bits avoids a saturating float->int conversion,
    // which blocks vectorization. For NaN, k is garbage but p is NaN.
    let k = (shifted.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    (p, k)
}

/// `e^(hi + lo)` where `hi` carries the magnitude and `lo` a correction.
#[inline(always)]
fn exp_hilo<M: Fma>(hi: f32, lo: f32) -> f32 {
    let x = hi + lo;
    // Clamp (NaN passes through).
    let (p, k) = exp_reduce::<M>(x.clamp(-104.0, 88.8), hi, lo);
    // Two scales: 2^k alone leaves the normal range for |k| > 126.
    let k1 = k >> 1;
    let k2 = k.wrapping_sub(k1);
    let s1 = f32::from_bits((k1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((k2.wrapping_add(127) as u32) << 23);
    let y = p * s1 * s2;
    if x > 88.8 {
        f32::INFINITY
    } else if x < -104.0 {
        0.0
    } else {
        y
    }
}

/// [`exp_hilo`] for `hi + lo <= 0` whose result may flush to 0 once it
/// leaves the normal range (below e^-87.3): one power-of-two scale instead
/// of two and no overflow check.
#[inline(always)]
fn exp_hilo_nonpos<M: Fma>(hi: f32, lo: f32) -> f32 {
    let x = hi + lo;
    let (p, k) = exp_reduce::<M>(if x < -87.0 { -87.0 } else { x }, hi, lo);
    // k in [-126, 0]: 2^k is one normal float.
    let y = p * f32::from_bits((k.wrapping_add(127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else {
        y
    }
}

/// `e^x` for `x <= 0` (softmax after subtracting the maximum, and small
/// positive rounding slop): as accurate as [`exp_m`] down to e^-87, 0
/// below; NaN propagates. One power-of-two scale and no overflow check.
#[inline(always)]
pub fn exp_nonpos_m<M: Fma>(x: f32) -> f32 {
    exp_hilo_nonpos::<M>(x, 0.0)
}

/// `e^x` in f32, about 1 ulp, NaN-propagating, branch-free (vectorizes).
#[inline(always)]
pub fn exp_m<M: Fma>(x: f32) -> f32 {
    exp_hilo::<M>(x, 0.0)
}

/// `tanh(x)`: an odd Taylor polynomial near 0, `1 - 2 / (e^{2|x|} + 1)` elsewhere.
#[inline(always)]
pub fn tanh_m<M: Fma>(x: f32) -> f32 {
    let ax = x.abs();
    let x2 = x * x;
    let mut p = -1382.0 / 155_925.0;
    p = M::fma(p, x2, 62.0 / 2835.0);
    p = M::fma(p, x2, -17.0 / 315.0);
    p = M::fma(p, x2, 2.0 / 15.0);
    p = M::fma(p, x2, -1.0 / 3.0);
    let small = M::fma(x * x2, p, x);
    let e = exp_m::<M>(2.0 * ax);
    let big = 1.0 - 2.0 / (e + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if ax < 0.3 {
        small
    } else if x.is_nan() {
        x
    } else {
        big
    }
}

/// Logistic sigmoid `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid_m<M: Fma>(x: f32) -> f32 {
    1.0 / (1.0 + exp_m::<M>(-x))
}

/// SiLU `x / (1 + e^-x)`.
#[inline(always)]
pub fn silu_m<M: Fma>(x: f32) -> f32 {
    x / (1.0 + exp_m::<M>(-x))
}

/// Standard normal CDF Φ(x), relative error below 4e-7 (measured) on both tails.
///
/// Uses `erfc(z) = t * exp(-z^2 + P(t))`, `t = 1 / (1 + z/2)` (Numerical
/// Recipes' Chebyshev fit, fractional error < 1.2e-7 for all z >= 0), with
/// `z^2 = x^2 / 2` formed exactly from a 12-bit head of |x|, so the
/// exponent keeps full precision on the far tails. Φ is then
/// `1 - erfc/2` or `erfc/2`, never a cancelling `1 + erf`.
#[inline(always)]
#[allow(clippy::excessive_precision)]
pub fn normal_cdf_m<M: Fma>(x: f32) -> f32 {
    // Φ is exactly 0 or 1 in f32 beyond |x| = 20; clamping keeps inf out
    // of the exponent split (NaN passes through).
    let ax = x.abs();
    let ax = if ax > 20.0 { 20.0 } else { ax };
    let z = ax * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / M::fma(0.5, z, 1.0);
    // Estrin's scheme: a dependency chain of 5 operations instead of
    // Horner's 9 (the loop is latency-bound, not throughput-bound).
    let t2 = t * t;
    let t4 = t2 * t2;
    let t8 = t4 * t4;
    let a01 = M::fma(1.000_023_7, t, -1.265_512_2);
    let a23 = M::fma(0.096_784_18, t, 0.374_091_96);
    let a45 = M::fma(0.278_868_07, t, -0.186_288_06);
    let a67 = M::fma(1.488_515_87, t, -1.135_203_98);
    let a89 = M::fma(0.170_872_77, t, -0.822_152_23);
    let b03 = M::fma(a23, t2, a01);
    let b47 = M::fma(a67, t2, a45);
    let poly = M::fma(a89, t8, M::fma(b47, t4, b03));
    let xh = f32::from_bits(ax.to_bits() & 0xffff_f000);
    let hi = -0.5 * (xh * xh);
    let lo = M::fma(-0.5 * (ax - xh), ax + xh, poly);
    let erfc = t * exp_hilo_nonpos::<M>(hi, lo);
    if x >= 0.0 {
        M::fma(-0.5, erfc, 1.0)
    } else {
        0.5 * erfc
    }
}

/// Exact (erf) GELU `x * Φ(x)`.
#[inline(always)]
pub fn gelu_m<M: Fma>(x: f32) -> f32 {
    x * normal_cdf_m::<M>(x)
}

/// Tanh-approximated GELU, `0.5 x (1 + tanh(u))` computed as `x * sigmoid(2u)`
/// (the same value without the cancellation of `1 + tanh(u)` for u << 0).
#[inline(always)]
pub fn gelu_tanh_m<M: Fma>(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    let u = C * M::fma(0.044_715 * x, x * x, x);
    x / (1.0 + exp_m::<M>(-2.0 * u))
}

/// [`exp_m`] without FMA (for scalar callers outside dispatched bodies).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_m::<NoFma>(x)
}

/// [`tanh_m`] without FMA.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    tanh_m::<NoFma>(x)
}

/// [`sigmoid_m`] without FMA.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    sigmoid_m::<NoFma>(x)
}

/// [`silu_m`] without FMA.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    silu_m::<NoFma>(x)
}

/// [`normal_cdf_m`] without FMA.
#[inline(always)]
pub fn normal_cdf(x: f32) -> f32 {
    normal_cdf_m::<NoFma>(x)
}

/// [`gelu_m`] without FMA.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    gelu_m::<NoFma>(x)
}

/// [`gelu_tanh_m`] without FMA.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    gelu_tanh_m::<NoFma>(x)
}

/// NaN-propagating maximum.
#[inline(always)]
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum.
#[inline(always)]
pub fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Sum with 8 independent accumulators (vectorizes).
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in rem {
        s += v;
    }
    s
}

/// Dot product with 8 independent accumulators (vectorizes).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `out[j] = dot(q, rows[j * stride..j * stride + q.len()])` for every
/// `j < out.len()`.
///
/// # Panics
/// If `rows` is shorter than the last row needs.
#[inline(always)]
pub fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let d = q.len();
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot(q, &rows[j * stride..j * stride + d]);
    }
}

/// Sum of squared deviations from `mean`, 8 accumulators.
#[inline(always)]
pub fn sum_sq_dev(x: &[f32], mean: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            let d = c[i] - mean;
            acc[i] += d * d;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in rem {
        let d = v - mean;
        s += d * d;
    }
    s
}

/// NaN-propagating maximum of a slice (`-inf` when empty), 8 lanes.
#[inline(always)]
pub fn max_slice(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] = max_nan(c[i], acc[i]);
        }
    }
    // A tree over the lanes (vectorizes to shuffles), then the tail.
    let h = [
        max_nan(acc[0], acc[4]),
        max_nan(acc[1], acc[5]),
        max_nan(acc[2], acc[6]),
        max_nan(acc[3], acc[7]),
    ];
    let mut m = max_nan(max_nan(h[0], h[2]), max_nan(h[1], h[3]));
    for &v in rem {
        m = max_nan(v, m);
    }
    m
}

/// `y += a * x`.
#[inline(always)]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erfc in f64: power series below 2, Lentz continued fraction above.
    fn erfc64(z: f64) -> f64 {
        if z < 0.0 {
            return 2.0 - erfc64(-z);
        }
        if z < 2.0 {
            let mut term = z;
            let mut s = z;
            let mut n = 0.0;
            loop {
                n += 1.0;
                term *= -z * z / n;
                let add = term / (2.0 * n + 1.0);
                s += add;
                if add.abs() < 1e-18 {
                    break;
                }
            }
            1.0 - s * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(z) = exp(-z^2)/sqrt(pi) * 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + ...))))
            let tiny = 1e-300;
            let mut f = z;
            let mut c = z;
            let mut d = 0.0;
            for i in 1..300 {
                let a = i as f64 / 2.0;
                d = z + a * d;
                if d == 0.0 {
                    d = tiny;
                }
                c = z + a / c;
                if c == 0.0 {
                    c = tiny;
                }
                d = 1.0 / d;
                let delta = c * d;
                f *= delta;
                if (delta - 1.0).abs() < 1e-16 {
                    break;
                }
            }
            (-z * z).exp() / std::f64::consts::PI.sqrt() / f
        }
    }

    fn rel(a: f32, b: f64) -> f64 {
        if b == 0.0 {
            (a as f64).abs()
        } else {
            ((a as f64 - b) / b).abs()
        }
    }

    #[test]
    fn exp_matches_f64() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            worst = worst.max(rel(exp(x), (x as f64).exp()));
            worst = worst.max(rel(exp_m::<HwFma>(x), (x as f64).exp()));
            x += 0.0137;
        }
        assert!(worst < 2e-7, "worst exp rel error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn exp_nonpos_matches_f64_and_flushes_below_the_normal_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 0.5 {
            worst = worst.max(rel(exp_nonpos_m::<NoFma>(x), (x as f64).exp()));
            worst = worst.max(rel(exp_nonpos_m::<HwFma>(x), (x as f64).exp()));
            x += 0.00731;
        }
        assert!(worst < 2e-7, "worst exp_nonpos rel error {worst}");
        assert_eq!(exp_nonpos_m::<NoFma>(0.0), 1.0);
        assert_eq!(exp_nonpos_m::<NoFma>(-90.0), 0.0);
        assert_eq!(exp_nonpos_m::<NoFma>(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpos_m::<NoFma>(f32::NAN).is_nan());
        assert_eq!(
            max_slice(&[1.0, 5.0, -2.0, 3.0, 4.0, 0.0, 2.0, 4.5, 7.0, 6.0]),
            7.0
        );
        assert!(max_slice(&[1.0, f32::NAN, 2.0, 3.0, 4.0, 0.0, 2.0, 4.5]).is_nan());
        assert_eq!(max_slice(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn vector_reductions_match_the_portable_ones() {
        for n in [0usize, 1, 7, 8, 9, 16, 100, 128, 131] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
                .collect();
            assert_eq!(HwFma::sum(&x).to_bits(), sum(&x).to_bits(), "sum of {n}");
            assert_eq!(
                HwFma::sum(&x).to_bits(),
                NoFma::sum(&x).to_bits(),
                "sum of {n}"
            );
            let z: Vec<f32> = (0..n)
                .map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.29)
                .collect();
            assert_eq!(
                HwFma::dot(&x, &z).to_bits(),
                dot(&x, &z).to_bits(),
                "dot of {n}"
            );
            assert_eq!(
                HwFma::dot(&x, &z[..n / 2]).to_bits(),
                dot(&x, &z[..n / 2]).to_bits()
            );
            for d in [1usize, 8, 32, 64, 72, 100, 128] {
                let rows: Vec<f32> = (0..n * 131 + d)
                    .map(|i| ((i * 29 % 31) as f32 - 15.0) * 0.13)
                    .collect();
                let mut w = z.clone();
                if n > 2 {
                    w[2] = 0.0;
                }
                let mut a: Vec<f32> = (0..d).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
                let mut b = a.clone();
                HwFma::weighted_rows(&w, &rows, 131, &mut a);
                weighted_rows(&w, &rows, 131, &mut b);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "weighted_rows n={n} d={d}");
                // n rows of d (the query is the first d of `a`'s source).
                let q: Vec<f32> = (0..d).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.21).collect();
                let mut a = vec![f32::NAN; n];
                let mut b = vec![0.0; n];
                HwFma::dot_rows(&q, &rows, 131, &mut a);
                for (j, o) in b.iter_mut().enumerate() {
                    *o = dot(&q, &rows[j * 131..j * 131 + d]);
                }
                assert_eq!(bits(&a), bits(&b), "dot_rows n={n} d={d}");
            }
            let want = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            assert_eq!(HwFma::max_num(&x), want, "max of {n}");
            let mut y = x.clone();
            if n > 3 {
                y[3] = f32::NAN;
                let want = y.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                assert_eq!(HwFma::max_num(&y), want, "max of {n} with a NaN");
                assert_eq!(NoFma::max_num(&y), want);
            }
        }
        assert_eq!(HwFma::max_num(&[f32::NAN; 9]), f32::NEG_INFINITY);
    }

    #[test]
    fn gelu_matches_exact_erf() {
        let mut worst = 0.0f64;
        let mut x = -12.0f32;
        while x < 12.0 {
            let xd = x as f64;
            let exact = xd * 0.5 * erfc64(-xd / std::f64::consts::SQRT_2);
            worst = worst.max(rel(gelu(x), exact));
            worst = worst.max(rel(gelu_m::<HwFma>(x), exact));
            x += 0.00731;
        }
        assert!(worst < 4e-7, "worst gelu rel error {worst}");
        assert!(gelu(f32::NAN).is_nan());
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu(0.0), 0.0);
    }

    #[test]
    fn tanh_sigmoid_match_f64() {
        let mut worst = 0.0f64;
        let mut worst_gt = 0.0f64;
        let mut x = -20.0f32;
        while x < 20.0 {
            worst = worst.max(rel(tanh(x), (x as f64).tanh()));
            worst = worst.max(rel(tanh_m::<HwFma>(x), (x as f64).tanh()));
            worst = worst.max(rel(sigmoid(x), 1.0 / (1.0 + (-(x as f64)).exp())));
            let xd = x as f64;
            // On the negative tail the result is e^(2u) and inherits u's
            // f32 rounding (relative error ~|2u| * 6e-8); check |x| < 4.
            if x.abs() < 4.0 {
                worst_gt = worst_gt.max(rel(gelu_tanh(x), {
                    0.5 * xd
                        * (1.0
                            + ((2.0 / std::f64::consts::PI).sqrt()
                                * (xd + 0.044715 * xd * xd * xd))
                                .tanh())
                }));
            }
            x += 0.00513;
        }
        assert!(worst < 5e-7, "worst tanh/sigmoid rel error {worst}");
        assert!(worst_gt < 2e-6, "worst gelu_tanh rel error {worst_gt}");
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    }
}
