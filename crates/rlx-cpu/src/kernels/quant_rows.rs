//! Dequantization of GGUF weight rows to f32 for the `DequantMatMul`
//! kernels, with AVX2 block decoders for the common types (Q4_0, Q4_1,
//! Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) and `rlx_formats::quant::dequantize` for
//! the rest and for CPUs without AVX2.
//!
//! Bit-exact with `dequantize`: each element is formed with the same f32
//! operations in the same order (`d * q`, `d1 * q - m1`, `(d * s) * q`, no
//! fused multiply-add), only eight lanes at a time, so the model's numbers
//! do not depend on which decoder ran.

use crate::isa::Isa;
use rlx_formats::{quant::dequantize, GgmlType, QuantError};

/// Dequantize `n` elements of `ty` from `bytes` into `out` (whole blocks,
/// `out.len() == n`, as `dequantize` requires), with the AVX2 decoder of
/// `ty` when `isa` is AVX2 or above and the CPU has it.
pub fn dequant_rows(
    isa: Isa,
    ty: GgmlType,
    bytes: &[u8],
    n: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa.supported() && out.len() == n {
        if let Some((elems, size)) = x86::block_shape(ty) {
            if n.is_multiple_of(elems) && bytes.len() == n / elems * size {
                // SAFETY: AVX2, FMA and F16C are present (`isa.supported()`
                // for Avx2 or above), and `bytes` holds exactly the n / elems
                // blocks of `size` bytes whose elements fill `out` (checked
                // just above).
                unsafe { x86::dequant(ty, bytes, out) };
                return Ok(());
            }
        }
    }
    let _ = isa;
    dequantize(ty, bytes, n, out)
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K / Q5_K super-block
/// (`sc`: its 12 scale bytes). Plain Rust, so that the scalar int8 kernels
/// of `quant_q8k` (any target) share it with the AVX2 decoders.
///
/// # Safety
/// `sc` must point to 12 readable bytes and `j < 8`.
#[inline]
pub(crate) unsafe fn scale_min(sc: *const u8, j: usize) -> (u8, u8) {
    if j < 4 {
        (*sc.add(j) & 63, *sc.add(j + 4) & 63)
    } else {
        (
            (*sc.add(j + 4) & 0x0F) | ((*sc.add(j - 4) >> 6) << 4),
            (*sc.add(j + 4) >> 4) | ((*sc.add(j) >> 6) << 4),
        )
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    pub(crate) use super::scale_min;
    use rlx_formats::GgmlType;
    use std::arch::x86_64::*;

    /// (elements, bytes) of one block of the types with an AVX2 decoder.
    pub(super) fn block_shape(ty: GgmlType) -> Option<(usize, usize)> {
        Some(match ty {
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            _ => return None,
        })
    }

    /// Every block of `bytes` into `out`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `ty` has a
    /// [`block_shape`] `(elems, size)`, `bytes.len()` is a multiple of
    /// `size` and `out.len() == bytes.len() / size * elems`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dequant(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
        let Some((elems, size)) = block_shape(ty) else {
            return;
        };
        let blocks = bytes.len() / size;
        debug_assert_eq!(out.len(), blocks * elems);
        let (src, dst) = (bytes.as_ptr(), out.as_mut_ptr());
        for b in 0..blocks {
            // SAFETY: block b is bytes b*size..(b+1)*size of `bytes` and
            // elements b*elems..(b+1)*elems of `out`, in bounds by the
            // contract; each decoder touches only its block.
            let (p, o) = (src.add(b * size), dst.add(b * elems));
            match ty {
                GgmlType::Q4_0 => q4_0(p, o),
                GgmlType::Q4_1 => q4_1(p, o),
                GgmlType::Q5_0 => q5_0(p, o),
                GgmlType::Q8_0 => q8_0(p, o),
                GgmlType::Q4_K => q4_k(p, o),
                GgmlType::Q5_K => q5_k(p, o),
                GgmlType::Q6_K => q6_k(p, o),
                _ => {}
            }
        }
    }

    /// An f16 at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16(p: *const u8) -> f32 {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// Eight bytes at `p` widened to u32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn u8x8(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }

    /// Store `d * q` (q integer lanes) at `o`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_scaled(o: *mut f32, d: __m256, q: __m256i) {
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }

    /// Store `d * q - m` at `o`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_affine(o: *mut f32, d: __m256, m: __m256, q: __m256i) {
        let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        _mm256_storeu_ps(o, _mm256_sub_ps(v, m));
    }

    /// Q4_0: `(q - 8) * d`, low nibbles elements 0..16.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0(p: *const u8, o: *mut f32) {
        let d = _mm256_set1_ps(f16(p));
        let (mask, eight) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(8));
        for j in [0, 8] {
            let z = u8x8(p.add(2 + j));
            let lo = _mm256_sub_epi32(_mm256_and_si256(z, mask), eight);
            let hi = _mm256_sub_epi32(_mm256_srli_epi32(z, 4), eight);
            store_scaled(o.add(j), d, lo);
            store_scaled(o.add(16 + j), d, hi);
        }
    }

    /// Q4_1: `q * d + m` (the reference's order: the product, then + m).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_1(p: *const u8, o: *mut f32) {
        let d = _mm256_set1_ps(f16(p));
        let m = _mm256_set1_ps(f16(p.add(2)));
        let mask = _mm256_set1_epi32(0x0F);
        for j in [0, 8] {
            let z = u8x8(p.add(4 + j));
            let lo = _mm256_cvtepi32_ps(_mm256_and_si256(z, mask));
            let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(z, 4));
            _mm256_storeu_ps(o.add(j), _mm256_add_ps(_mm256_mul_ps(lo, d), m));
            _mm256_storeu_ps(o.add(16 + j), _mm256_add_ps(_mm256_mul_ps(hi, d), m));
        }
    }

    /// Q5_0: `((nibble | bit << 4) - 16) * d`; bit `i` of `qh` is bit 4
    /// of element `i`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q5_0(p: *const u8, o: *mut f32) {
        let d = _mm256_set1_ps(f16(p));
        let qh = _mm256_set1_epi32((p.add(2) as *const i32).read_unaligned());
        let (mask, one, sixteen) = (
            _mm256_set1_epi32(0x0F),
            _mm256_set1_epi32(1),
            _mm256_set1_epi32(16),
        );
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for j in [0, 8] {
            let z = u8x8(p.add(6 + j));
            let bit = |first: i32| {
                let s = _mm256_add_epi32(lanes, _mm256_set1_epi32(first));
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, s), one), 4)
            };
            let lo = _mm256_or_si256(_mm256_and_si256(z, mask), bit(j as i32));
            let hi = _mm256_or_si256(_mm256_srli_epi32(z, 4), bit(16 + j as i32));
            store_scaled(o.add(j), d, _mm256_sub_epi32(lo, sixteen));
            store_scaled(o.add(16 + j), d, _mm256_sub_epi32(hi, sixteen));
        }
    }

    /// Q8_0: `q * d`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_0(p: *const u8, o: *mut f32) {
        let d = _mm256_set1_ps(f16(p));
        for j in [0, 8, 16, 24] {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(2 + j) as *const __m128i));
            store_scaled(o.add(j), d, q);
        }
    }

    /// Q4_K: sub-block `s` (32 elements) is `d * scale_s * q - dmin * min_s`;
    /// chunk `c` of 32 bytes holds sub-blocks `2c` (low nibbles) and `2c + 1`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k(p: *const u8, o: *mut f32) {
        let (d, dmin) = (f16(p), f16(p.add(2)));
        let (sc, qs) = (p.add(4), p.add(16));
        let mask = _mm256_set1_epi32(0x0F);
        for c in 0..4 {
            let (s0, m0) = scale_min(sc, 2 * c);
            let (s1, m1) = scale_min(sc, 2 * c + 1);
            let (d0, mm0) = (
                _mm256_set1_ps(d * s0 as f32),
                _mm256_set1_ps(dmin * m0 as f32),
            );
            let (d1, mm1) = (
                _mm256_set1_ps(d * s1 as f32),
                _mm256_set1_ps(dmin * m1 as f32),
            );
            for g in [0, 8, 16, 24] {
                let z = u8x8(qs.add(32 * c + g));
                store_affine(o.add(64 * c + g), d0, mm0, _mm256_and_si256(z, mask));
                store_affine(o.add(64 * c + 32 + g), d1, mm1, _mm256_srli_epi32(z, 4));
            }
        }
    }

    /// Q5_K: Q4_K with bit `s` of `qh[l]` as bit 4 of element `l` of
    /// sub-block `s`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q5_k(p: *const u8, o: *mut f32) {
        let (d, dmin) = (f16(p), f16(p.add(2)));
        let (sc, qh, qs) = (p.add(4), p.add(16), p.add(48));
        let (mask, one) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(1));
        for c in 0..4 {
            let (s0, m0) = scale_min(sc, 2 * c);
            let (s1, m1) = scale_min(sc, 2 * c + 1);
            let (d0, mm0) = (
                _mm256_set1_ps(d * s0 as f32),
                _mm256_set1_ps(dmin * m0 as f32),
            );
            let (d1, mm1) = (
                _mm256_set1_ps(d * s1 as f32),
                _mm256_set1_ps(dmin * m1 as f32),
            );
            let (sh0, sh1) = (
                _mm_cvtsi32_si128(2 * c as i32),
                _mm_cvtsi32_si128(2 * c as i32 + 1),
            );
            for g in [0, 8, 16, 24] {
                let z = u8x8(qs.add(32 * c + g));
                let h = u8x8(qh.add(g));
                let h0 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, sh0), one), 4);
                let h1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, sh1), one), 4);
                let lo = _mm256_or_si256(_mm256_and_si256(z, mask), h0);
                let hi = _mm256_or_si256(_mm256_srli_epi32(z, 4), h1);
                store_affine(o.add(64 * c + g), d0, mm0, lo);
                store_affine(o.add(64 * c + 32 + g), d1, mm1, hi);
            }
        }
    }

    /// Q6_K: element `r` of half `h` is `(d * scale) * (q - 32)` with the
    /// low 4 bits from `ql[64h + r % 64] >> 4 (r / 64)` and the high 2 from
    /// `qh[32h + r % 32] >> 2 (r / 32)`; a scale per 16 elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_k(p: *const u8, o: *mut f32) {
        let d = f16(p.add(208));
        let scales = p.add(192) as *const i8;
        let (mask, three, off) = (
            _mm256_set1_epi32(0x0F),
            _mm256_set1_epi32(3),
            _mm256_set1_epi32(32),
        );
        for h in 0..2 {
            let (ql, qh) = (p.add(64 * h), p.add(128 + 32 * h));
            for r in (0..128).step_by(8) {
                let e = 128 * h + r;
                let ds = _mm256_set1_ps(d * *scales.add(e / 16) as f32);
                let lo =
                    _mm256_srl_epi32(u8x8(ql.add(r % 64)), _mm_cvtsi32_si128(4 * (r / 64) as i32));
                let hi =
                    _mm256_srl_epi32(u8x8(qh.add(r % 32)), _mm_cvtsi32_si128(2 * (r / 32) as i32));
                let q = _mm256_or_si256(
                    _mm256_and_si256(lo, mask),
                    _mm256_slli_epi32(_mm256_and_si256(hi, three), 4),
                );
                store_scaled(o.add(e), ds, _mm256_sub_epi32(q, off));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random blocks of `ty` (scales from random bytes too; f16 fields kept
    /// finite and moderate so every element is a normal float).
    fn blocks(ty: GgmlType, count: usize, seed: u64) -> Vec<u8> {
        let size = x86_block(ty).1;
        let mut s = seed | 1;
        let mut bytes: Vec<u8> = (0..count * size)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect();
        // f16 fields: 0x3000-0x37ff (0.125 .. 0.5), sign from the data.
        let f16_at: &[usize] = match ty {
            GgmlType::Q4_1 => &[0, 2],
            GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => &[0],
        };
        for b in bytes.chunks_exact_mut(size) {
            for &i in f16_at {
                b[i + 1] = 0x30 | (b[i + 1] & 0x87);
            }
        }
        bytes
    }

    fn x86_block(ty: GgmlType) -> (usize, usize) {
        match ty {
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            _ => (256, 210),
        }
    }

    #[test]
    fn every_decoder_is_bit_exact_with_the_reference() {
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            let (elems, _) = x86_block(ty);
            let n = elems * 12;
            let bytes = blocks(ty, 12, 0x5eed ^ elems as u64);
            let mut want = vec![0f32; n];
            dequantize(ty, &bytes, n, &mut want).unwrap();
            assert!(want.iter().any(|&v| v != 0.0), "{ty:?}: all zero");
            for isa in Isa::ALL.into_iter().filter(|i| i.supported()) {
                let mut got = vec![f32::NAN; n];
                dequant_rows(isa, ty, &bytes, n, &mut got).unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{ty:?} {isa:?} element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors_on_every_isa() {
        for isa in Isa::ALL.into_iter().filter(|i| i.supported()) {
            let mut out = vec![0f32; 256];
            let err = dequant_rows(isa, GgmlType::Q4_K, &[0u8; 143], 256, &mut out);
            assert!(err.is_err(), "{isa:?}");
            let err = dequant_rows(isa, GgmlType::Q6_K, &[0u8; 210], 255, &mut out[..255]);
            assert!(err.is_err(), "{isa:?}");
        }
    }
}
