//! `Int8`-activation panel products on AMX-INT8 tiles (see
//! [`crate::isa::amx_int8_active`]).
//!
//! A panel block (16 weight rows x 32 elements) is, as stored, the B
//! operand of a tile dot product: B row `t` holds elements `4t..4t + 4` of
//! all 16 weight rows, 4 bytes each. For the 4-bit formats the rows are the
//! unpacked nibbles (`0..=15`, valid signed bytes): low nibbles of the four
//! integer lines give rows 0-3, high nibbles rows 4-7, unpacked once per
//! panel into a scratch buffer; Q8_0's eight integer lines are the B rows
//! as they are. The A operand is 16 activation rows x the block's 32
//! bytes, read in place (rows `k` bytes apart). One `tdpbssd` (4-bit
//! formats: signed activations, non-negative nibbles) or `tdpbusd` (Q8_0:
//! activations plus 128, as the VNNI kernel takes them) forms the 16 x 16
//! exact integer sums of one block. They are stored, then every activation
//! row gets the VNNI kernel's per-block f32 operations in the same order
//! (`- 8 Σ q_x` for Q4_0 and `- 128 Σ w` for Q8_0 in integers, then
//! `y += (d_w d_x) · isum`, then `+ m_w s_x` for Q4_1), so the outputs
//! equal that kernel's bit for bit.
//!
//! The tile registers are invisible to the compiler: they keep their
//! contents between the `asm!` blocks of one [`panel`] call.

use super::{Args, Kind, QuantPanels, PANEL, QK};
use crate::kernels::amx_tiles::TileConfig;
use std::arch::asm;
use std::arch::x86_64::*;

/// Palette 1: tmm0-3 = C (16 activation rows x 16 i32: the sums of up
/// to four consecutive blocks), tmm4-5 = A (16 activation rows x 32
/// bytes), tmm6-7 = B (8 rows x 64 bytes).
static CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 32, 32, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Configures the calling thread's tiles for [`panel`].
///
/// # Safety
/// [`crate::isa::amx_int8_supported`] returned true.
pub(super) unsafe fn configure() {
    // SAFETY: the CPU has AMX-INT8 and the process holds the tile data
    // (caller); CONFIG is a valid palette-1 configuration.
    unsafe { crate::kernels::amx_tiles::load(&CONFIG) }
}

/// Returns the calling thread's tiles to their initial state (so that a
/// context switch saves no tile data for it).
///
/// # Safety
/// [`crate::isa::amx_int8_supported`] returned true.
pub(super) unsafe fn release() {
    // SAFETY: as for `configure`.
    unsafe { crate::kernels::amx_tiles::release() }
}

/// The 16 x 16 integer sums of `G` (4 or 1) consecutive blocks into `c`
/// (`G` x 16 rows of 64 bytes): `C_g = A_g · B_g` with A_g 16 rows of 32
/// bytes `sa` apart at `a[g]`, B_g 8 rows of 64 bytes at `b[g]`. The four
/// products go to four C tiles, so they overlap instead of each waiting for
/// the previous store.
///
/// # Safety
/// [`configure`] ran on this thread; the operands are readable and `c`
/// writable over those extents.
#[inline(always)]
unsafe fn block_sums<const UNSIGNED_A: bool, const G: usize>(
    a: [*const i8; 4],
    sa: usize,
    b: [*const u8; 4],
    c: *mut i32,
) {
    macro_rules! four {
        ($dp:literal) => {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "tileloadd tmm4, [{a0} + {sa} * 1]",
                "tileloadd tmm6, [{b0} + {sb} * 1]",
                concat!($dp, " tmm0, tmm4, tmm6"),
                "tileloadd tmm5, [{a1} + {sa} * 1]",
                "tileloadd tmm7, [{b1} + {sb} * 1]",
                concat!($dp, " tmm1, tmm5, tmm7"),
                "tileloadd tmm4, [{a2} + {sa} * 1]",
                "tileloadd tmm6, [{b2} + {sb} * 1]",
                concat!($dp, " tmm2, tmm4, tmm6"),
                "tileloadd tmm5, [{a3} + {sa} * 1]",
                "tileloadd tmm7, [{b3} + {sb} * 1]",
                concat!($dp, " tmm3, tmm5, tmm7"),
                "tilestored [{c0} + {sb} * 1], tmm0",
                "tilestored [{c1} + {sb} * 1], tmm1",
                "tilestored [{c2} + {sb} * 1], tmm2",
                "tilestored [{c3} + {sb} * 1], tmm3",
                a0 = in(reg) a[0],
                a1 = in(reg) a[1],
                a2 = in(reg) a[2],
                a3 = in(reg) a[3],
                sa = in(reg) sa,
                b0 = in(reg) b[0],
                b1 = in(reg) b[1],
                b2 = in(reg) b[2],
                b3 = in(reg) b[3],
                sb = in(reg) 64usize,
                c0 = in(reg) c,
                c1 = in(reg) c.add(256),
                c2 = in(reg) c.add(512),
                c3 = in(reg) c.add(768),
                options(nostack),
            )
        };
    }
    macro_rules! one {
        ($dp:literal) => {
            asm!(
                "tilezero tmm0",
                "tileloadd tmm4, [{a0} + {sa} * 1]",
                "tileloadd tmm6, [{b0} + {sb} * 1]",
                concat!($dp, " tmm0, tmm4, tmm6"),
                "tilestored [{c0} + {sb} * 1], tmm0",
                a0 = in(reg) a[0],
                sa = in(reg) sa,
                b0 = in(reg) b[0],
                sb = in(reg) 64usize,
                c0 = in(reg) c,
                options(nostack),
            )
        };
    }
    // SAFETY: the tile loads read 16 rows of 32 bytes at stride `sa` and 8
    // rows of 64 bytes per block, the stores write 16 rows of 64 bytes per
    // block (caller).
    unsafe {
        match (UNSIGNED_A, G) {
            (true, 4) => four!("tdpbusd"),
            (false, 4) => four!("tdpbssd"),
            (true, _) => one!("tdpbusd"),
            (false, _) => one!("tdpbssd"),
        }
    }
}

/// One block's unpacked B operand: 8 rows of 64 bytes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Lines8([u8; 512]);

/// Activation rows `0..m16` (a multiple of 16, at most the call's rows)
/// against panel `p`. `scratch` is reused between calls.
///
/// # Safety
/// [`configure`] ran on this thread; AVX-512 F/BW; `acts` are `Int8`
/// activations of at least `m16` rows with their tiles made
/// (`Int8Acts::tile_rows`); `out` holds `m * w.n` floats of
/// which this call alone writes columns `p * 16..` of rows `0..m16`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn panel(
    w: &QuantPanels,
    acts: &super::Acts,
    p: usize,
    out: *mut f32,
    m16: usize,
    scratch: &mut Scratch,
) {
    // SAFETY: `p` is a panel of `w` and `out` is large enough (caller).
    let (a, _) = unsafe { Args::new(w, acts, p, out) };
    match w.kind {
        Kind::Q4_0 => unsafe { rows::<{ super::Q4_0 }>(&a, m16, scratch) },
        Kind::Q4_1 => unsafe { rows::<{ super::Q4_1 }>(&a, m16, scratch) },
        Kind::Q8_0 => unsafe { rows::<{ super::Q8_0 }>(&a, m16, scratch) },
    }
}

/// Buffers reused by the [`panel`] calls of one task.
#[derive(Default)]
pub(super) struct Scratch {
    /// The unpacked B operands of the 4-bit formats, one per block.
    b: Vec<Lines8>,
    /// One group of rows' integer sums, one per block.
    sums: Vec<Lines16>,
    /// Per block: the 16 weight scales.
    dw: Vec<__m512>,
    /// Per block: the 16 mins (Q4_1) or `128 Σ w` as i32 bits (Q8_0).
    extra: Vec<__m512>,
}

/// [`panel`] for one weight format.
///
/// # Safety
/// As [`panel`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn rows<const KIND: u8>(a: &Args, m16: usize, scr: &mut Scratch) {
    let Scratch {
        b: scratch,
        sums,
        dw,
        extra,
    } = scr;
    let q8 = KIND == super::Q8_0;
    let qb = if q8 { 512 } else { 256 };
    // SAFETY (all raw reads below): block `b`'s record spans `a.per`
    // bytes from `a.w + b * a.per`, inside the panel; the activation tiles
    // hold `m16 / 16 * nb` tiles of 512 bytes from `a.tiles`, and row
    // `r`'s per-block scalars `nb` entries from `r * nb`, for every
    // `r < m16` (caller).
    unsafe {
        if !q8 {
            scratch.resize(a.nb, Lines8([0; 512]));
            let low = _mm512_set1_epi8(0x0F);
            for (b, s) in scratch.iter_mut().enumerate() {
                let rec = a.w.add(b * a.per);
                let dst = s.0.as_mut_ptr();
                for j in 0..4 {
                    let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                    let lo = _mm512_and_si512(v, low);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                    _mm512_store_si512(dst.add(64 * j) as *mut _, lo);
                    _mm512_store_si512(dst.add(256 + 64 * j) as *mut _, hi);
                }
            }
        }
        // Per block: the scales, the mins (Q4_1) or 128 Σ w (Q8_0) as
        // vectors, and (per group of 16 rows) the integer sums of every
        // block, so that the scaling runs row by row over all blocks with
        // one accumulator in a register.
        let nb = a.nb;
        sums.resize(nb, Lines16([0; 256]));
        dw.clear();
        extra.clear();
        for b in 0..nb {
            let rec = a.w.add(b * a.per);
            dw.push(_mm512_cvtph_ps(_mm256_load_si256(
                rec.add(qb) as *const __m256i
            )));
            let e = _mm256_load_si256(rec.add(qb + 32) as *const __m256i);
            extra.push(if q8 {
                _mm512_castsi512_ps(_mm512_slli_epi32::<7>(_mm512_cvtepi16_epi32(e)))
            } else {
                _mm512_cvtph_ps(e)
            });
        }
        let mask: __mmask16 = if a.valid == PANEL {
            0xFFFF
        } else {
            (1u16 << a.valid) - 1
        };
        let mut r0 = 0;
        while r0 < m16 {
            let mut b0 = 0;
            while b0 < nb {
                let g = if b0 + 4 <= nb { 4 } else { 1 };
                let mut at = [std::ptr::null(); 4];
                let mut bt = [std::ptr::null(); 4];
                for i in 0..g {
                    let b = b0 + i;
                    at[i] = a.tiles.add(((r0 / 16) * nb + b) * 16 * QK);
                    bt[i] = if q8 {
                        a.w.add(b * a.per)
                    } else {
                        scratch[b].0.as_ptr()
                    };
                }
                // Four consecutive blocks' sums are four consecutive
                // `Lines16` (1 KiB apart), as `block_sums` writes them.
                let cp = sums[b0].0.as_mut_ptr();
                match (q8, g) {
                    (true, 4) => block_sums::<true, 4>(at, QK, bt, cp),
                    (false, 4) => block_sums::<false, 4>(at, QK, bt, cp),
                    (true, _) => block_sums::<true, 1>(at, QK, bt, cp),
                    (false, _) => block_sums::<false, 1>(at, QK, bt, cp),
                }
                b0 += g;
            }
            // Each row's blocks in order: the VNNI kernel's operations on
            // its accumulator.
            for r in 0..16 {
                let row = (r0 + r) * nb;
                let mut acc = _mm512_setzero_ps();
                for b in 0..nb {
                    let blk = row + b;
                    let mut is = _mm512_load_si512(sums[b].0.as_ptr().add(16 * r) as *const _);
                    if KIND == super::Q4_0 {
                        is = _mm512_sub_epi32(is, _mm512_set1_epi32(8 * *a.sum.add(blk)));
                    }
                    if q8 {
                        is = _mm512_sub_epi32(is, _mm512_castps_si512(extra[b]));
                    }
                    let scale = _mm512_mul_ps(dw[b], _mm512_set1_ps(*a.d.add(blk)));
                    acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(is), acc);
                    if KIND == super::Q4_1 {
                        acc = _mm512_fmadd_ps(extra[b], _mm512_set1_ps(*a.s.add(blk)), acc);
                    }
                }
                _mm512_mask_storeu_ps(a.out.add((r0 + r) * a.n), mask, acc);
            }
            r0 += 16;
        }
    }
}

/// The 16 x 16 integer sums of one block, 64-byte aligned for the tile
/// stores and the vector loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Lines16([i32; 256]);
