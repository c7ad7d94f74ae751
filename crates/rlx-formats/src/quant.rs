//! Dequantization of ggml block formats to f32.
//!
//! Layouts and arithmetic follow ggml's reference `dequantize_row_*`
//! functions (and the `gguf` Python package, which mirrors them): every
//! product is computed in f32 in the same order, so results are bit-exact
//! against those references. Block layouts (little-endian):
//!
//! | type | elems | bytes | layout |
//! |---|---|---|---|
//! | Q4_0 | 32 | 18 | `d: f16, qs[16]` — `x = (q - 8) * d`, low nibbles are elements 0..16 |
//! | Q4_1 | 32 | 20 | `d: f16, m: f16, qs[16]` — `x = q * d + m` |
//! | Q5_0 | 32 | 22 | `d: f16, qh: u32, qs[16]` — bit `i` of `qh` is bit 4 of element `i`; `x = (q - 16) * d` |
//! | Q5_1 | 32 | 24 | `d: f16, m: f16, qh: u32, qs[16]` — `x = q * d + m` |
//! | Q8_0 | 32 | 34 | `d: f16, qs: i8[32]` — `x = q * d` |
//! | Q2_K | 256 | 84 | `scales[16], qs[64], d: f16, dmin: f16` |
//! | Q3_K | 256 | 110 | `hmask[32], qs[64], scales[12], d: f16` |
//! | Q4_K | 256 | 144 | `d: f16, dmin: f16, scales[12], qs[128]` |
//! | Q5_K | 256 | 176 | `d: f16, dmin: f16, scales[12], qh[32], qs[128]` |
//! | Q6_K | 256 | 210 | `ql[128], qh[64], scales: i8[16], d: f16` |
//! | Q8_K | 256 | 292 | `d: f32, qs: i8[256], bsums: i16[16]` — `x = d * q` |

use half::{bf16, f16};

use crate::error::QuantError;
use crate::ggml_type::GgmlType;

/// Dequantizes `n_elems` elements of type `ty` from `bytes` into `out`.
///
/// `n_elems` must be a whole number of blocks, `bytes` must hold exactly
/// those blocks, and `out.len()` must equal `n_elems`. Works on one row or
/// on any run of consecutive blocks (a whole tensor). Supported: F32, F16,
/// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K
/// (see [`GgmlType::can_dequantize`]).
pub fn dequantize(
    ty: GgmlType,
    bytes: &[u8],
    n_elems: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_sizes(ty, bytes.len(), n_elems)?;
    let be = ty.block_elems();
    let bb = ty.block_bytes();
    if out.len() != n_elems {
        return Err(QuantError::OutLength {
            ty,
            expected: n_elems,
            found: out.len(),
        });
    }
    let block_fn: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return Ok(());
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
            return Ok(());
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
            return Ok(());
        }
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q2_K => block_q2_k,
        GgmlType::Q3_K => block_q3_k,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
        GgmlType::Q8_K => block_q8_k,
        _ => return Err(QuantError::Unsupported { ty }),
    };
    for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        block_fn(blk, o);
    }
    Ok(())
}

/// Dequantizes `n_elems` elements into a new vector (see [`dequantize`]).
///
/// All sizes are validated before allocating, so the allocation is bounded
/// by the byte buffer the caller already holds.
pub fn dequantize_to_vec(
    ty: GgmlType,
    bytes: &[u8],
    n_elems: usize,
) -> Result<Vec<f32>, QuantError> {
    check_sizes(ty, bytes.len(), n_elems)?;
    let mut out = vec![0.0f32; n_elems];
    dequantize(ty, bytes, n_elems, &mut out)?;
    Ok(out)
}

/// Checks support, block multiple and byte length.
fn check_sizes(ty: GgmlType, n_bytes: usize, n_elems: usize) -> Result<(), QuantError> {
    if !ty.can_dequantize() {
        return Err(QuantError::Unsupported { ty });
    }
    let be = ty.block_elems();
    if n_elems % be != 0 {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n_elems,
            block_elems: be,
        });
    }
    let expected = (n_elems / be).saturating_mul(ty.block_bytes());
    if n_bytes != expected {
        return Err(QuantError::ByteLength {
            ty,
            n_elems,
            expected,
            found: n_bytes,
        });
    }
    Ok(())
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

fn block_q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        o[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        o[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn block_q4_1(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        o[j] = (qs[j] & 0x0F) as f32 * d + m;
        o[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

fn block_q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as u8;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
        o[j] = (((qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
        o[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn block_q5_1(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as u8;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
        o[j] = ((qs[j] & 0x0F) | h0) as f32 * d + m;
        o[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

fn block_q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (x, &q) in o.iter_mut().zip(&b[2..34]) {
        *x = (q as i8) as f32 * d;
    }
}

fn block_q2_k(b: &[u8], o: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for half in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let e = half * 128 + j * 32 + l;
                let sc = scales[e / 16];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let q = (qs[half * 32 + l] >> (2 * j)) & 3;
                o[e] = dl * q as f32 - ml;
            }
        }
    }
}

fn block_q3_k(b: &[u8], o: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_at(b, 108);
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 { sc[i] & 0x0F } else { sc[i - 8] >> 4 };
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    for k in 0..8 {
        let (half, j) = (k / 4, k % 4);
        for l in 0..32 {
            let e = k * 32 + l;
            let dl = d * scales[e / 16] as f32;
            let low = ((qs[half * 32 + l] >> (2 * j)) & 3) as i32;
            let q = low - if hmask[l] & (1 << k) != 0 { 0 } else { 4 };
            o[e] = dl * q as f32;
        }
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K / Q5_K super-block.
#[inline]
fn k_scale_min(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        (
            (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4),
            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
        )
    }
}

fn block_q4_k(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = &b[4..16];
    let qs = &b[16..144];
    for sub in 0..8 {
        let (s, m) = k_scale_min(sc, sub);
        let d1 = d * s as f32;
        let m1 = dmin * m as f32;
        let (chunk, shift) = (sub / 2, 4 * (sub % 2));
        for l in 0..32 {
            let q = (qs[chunk * 32 + l] >> shift) & 0x0F;
            o[sub * 32 + l] = d1 * q as f32 - m1;
        }
    }
}

fn block_q5_k(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let sc = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for sub in 0..8 {
        let (s, m) = k_scale_min(sc, sub);
        let d1 = d * s as f32;
        let m1 = dmin * m as f32;
        let (chunk, shift) = (sub / 2, 4 * (sub % 2));
        for l in 0..32 {
            let low = (qs[chunk * 32 + l] >> shift) & 0x0F;
            let high = ((qh[l] >> sub) & 1) << 4;
            o[sub * 32 + l] = d1 * (low | high) as f32 - m1;
        }
    }
}

fn block_q6_k(b: &[u8], o: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for half in 0..2 {
        for r in 0..128 {
            let e = half * 128 + r;
            let low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
            let high = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
            let q = (low | (high << 4)) as i32 - 32;
            let s = scales[e / 16] as i8;
            o[e] = d * s as f32 * q as f32;
        }
    }
}

fn block_q8_k(b: &[u8], o: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (x, &q) in o.iter_mut().zip(&b[4..260]) {
        *x = d * (q as i8) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_errors_are_reported() {
        let mut out = vec![0.0; 32];
        assert_eq!(
            dequantize(GgmlType::Q4_0, &[0; 18], 31, &mut out[..31]),
            Err(QuantError::NotBlockMultiple {
                ty: GgmlType::Q4_0,
                n_elems: 31,
                block_elems: 32
            })
        );
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0; 17], 32, &mut out),
            Err(QuantError::ByteLength {
                expected: 18,
                found: 17,
                ..
            })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0; 18], 32, &mut out[..16]),
            Err(QuantError::OutLength {
                expected: 32,
                found: 16,
                ..
            })
        ));
        assert_eq!(
            dequantize(GgmlType::IQ2_XS, &[0; 74], 256, &mut vec![0.0; 256]),
            Err(QuantError::Unsupported {
                ty: GgmlType::IQ2_XS
            })
        );
        assert!(dequantize_to_vec(GgmlType::Q8_0, &[0; 34], 1 << 40).is_err());
    }

    #[test]
    fn q4_0_hand_block() {
        // d = 0.5 (f16 0x3800); byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut b = vec![0x00, 0x38];
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let v = dequantize_to_vec(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(v[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    #[test]
    fn q8_0_hand_block() {
        // d = 2.0 (f16 0x4000), q = -16..16.
        let mut b = vec![0x00, 0x40];
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let v = dequantize_to_vec(GgmlType::Q8_0, &b, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 2.0).collect();
        assert_eq!(v, want);
    }
}
