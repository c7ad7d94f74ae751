//! Q4_0/Q4_1/Q8_0 weights repacked into 16-row panels: the `DequantMatMul`
//! kernels (`Int8` and `F32` activations) on CPUs with AVX-512 and VNNI,
//! and on AVX2 CPUs.
//!
//! The GGUF layout stores one weight row's blocks one after another, so a
//! kernel over it forms one 32-element dot product per instruction group
//! and reduces it across lanes ([`super::quant_q8`]). Here 16 output rows
//! are interleaved instead: for each block of 32 elements a panel holds
//!
//! - the integers as 64-byte vectors of 16 rows x 4 bytes: for the 4-bit
//!   formats 4 vectors, where row `r`'s bytes in vector `j` are its block
//!   bytes `4j..4j + 4` (low nibbles: elements `4j..4j + 4`, high nibbles:
//!   elements `16 + 4j..`), for Q8_0 8 vectors of 4 elements each;
//! - the 16 scales as f16 (one `vcvtph2ps` makes them 16 f32 lanes);
//! - Q4_1: the 16 mins as f16; Q8_0: `Σ w` per row, as i16.
//!
//! One `vpdpbusd` then multiplies 4 elements of 16 rows with 4 broadcast
//! activation bytes and accumulates into 16 lanes, one per output column:
//! no reduction across lanes, and each unpacked weight vector serves up to
//! eight activation rows. `vpdpbusd` multiplies unsigned by signed bytes:
//! the 4-bit formats pass their unsigned nibbles (Q4_0's `- 8` becomes
//! `- 8 Σ q_x` per block), Q8_0 passes the activations plus 128 (and
//! subtracts `128 Σ w`). Every integer sum is exact; per block,
//! `y += (d_w d_x) · isum` (+ `m_w s_x` for Q4_1) in f32, in that order, in
//! both the vector kernel and the scalar definition here, which the tests
//! compare bit for bit.
//!
//! `F32` activations (the exact default) use the same panels: each
//! 4-element group is widened to 16 f32 lanes (shift and mask, or
//! sign-extend, then convert) once per tile and multiplied with up to eight
//! broadcast activations by FMA; per block `y += d_w (Σ q_w x - 8 Σ x)`
//! (Q4_0) or `d_w Σ q_w x + m_w Σ x` (Q4_1). This is the dequantized
//! product up to f32 rounding, never rounding the activations.
//!
//! A panel block takes whole cache lines: 5 (Q4_0, Q4_1) or 9 (Q8_0) for
//! 16 x 32 weights, 0.625 or 1.125 bytes per weight (GGUF: 0.5625 Q4_0,
//! 0.625 Q4_1, 1.0625 Q8_0). Decode streams every weight once per token,
//! so these bytes are what bounds it on few cores. The panels are a second
//! copy of the weights (the GGUF bytes stay for the other consumers);
//! [`crate::CpuModel`] makes them on CPUs with AVX512-VNNI or AVX2 (see
//! [`panels_wanted`]).
//!
//! On AVX2 ([`PanelPath::Avx2`]) a 64-byte line is two 256-bit halves,
//! rows 0-7 and rows 8-15: the kernel runs the whole panel for one half,
//! then again for the other (the second pass reads the panel from L1/L2).
//! Int8 products use `vpmaddubsw`: unsigned nibbles times signed
//! activation bytes for the 4-bit formats, `|w|` times `sign(w) x` for
//! Q8_0 (so its activations are not shifted by 128); the integer sums are
//! the same exact integers as above, so all paths agree bit for bit.

use super::quant_q8::QK;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
use super::packed_gemm::gemm_chunked_b;
use super::{bad_shape, KernelError};
use crate::isa::{CpuFeatures, Isa};
use rayon::prelude::*;
use rlx_ir::{ActivationPrecision, QuantScheme};

const OP: &str = "DequantMatMul";

/// Output rows (weight rows) per panel: one AVX-512 register of i32 or f32.
pub const PANEL: usize = 16;

/// One cache line; panels are stored as whole lines, 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Weight formats with a panel layout.
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

    /// Bytes of one GGUF block, and where its integers start.
    fn gguf_block(self) -> (usize, usize) {
        match self {
            Kind::Q4_0 => (18, 2),
            Kind::Q4_1 => (20, 4),
            Kind::Q8_0 => (34, 2),
        }
    }

    /// Bytes of the integers of one panel block (16 rows).
    fn qs_bytes(self) -> usize {
        match self {
            Kind::Q4_0 | Kind::Q4_1 => 256,
            Kind::Q8_0 => 512,
        }
    }

    /// Lines of one panel block: the integers, then one line with the
    /// 16 f16 scales and the 16 f16 mins (Q4_1) or i16 `Σ w` (Q8_0).
    fn lines(self) -> usize {
        self.qs_bytes() / 64 + 1
    }
}

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// Which kernel runs over the panels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanelPath {
    /// Plain Rust: the definition (slow; tests, and `RLX_CPU_QUANT_PANELS=1`
    /// on CPUs without VNNI).
    Scalar,
    /// AVX-512 F/BW + VNNI on 512-bit registers.
    Vnni512,
    /// [`PanelPath::Vnni512`], with the `Int8` products of 16 or more
    /// activation rows on AMX-INT8 tiles (bit for bit the same outputs;
    /// opt-in, see [`crate::isa::amx_int8_active`]).
    Amx,
    /// AVX2 + FMA + F16C on 256-bit registers: each record line's two
    /// halves (rows 0-7, 8-15) in two passes over the panel (the second
    /// from L1/L2); int8 products by `vpmaddubsw`.
    Avx2,
}

impl PanelPath {
    /// The fastest path this CPU runs under the active [`Isa`].
    pub fn active() -> PanelPath {
        match Isa::active() {
            Isa::Avx512 if crate::isa::amx_int8_active() => PanelPath::Amx,
            Isa::Avx512 if CpuFeatures::get().avx512vnni => PanelPath::Vnni512,
            Isa::Avx512 | Isa::Avx2 => PanelPath::Avx2,
            Isa::Portable => PanelPath::Scalar,
        }
    }

    /// Every path this CPU runs (tests compare them).
    pub fn available() -> Vec<PanelPath> {
        let mut v = vec![PanelPath::Scalar];
        if Isa::Avx2.supported() {
            v.push(PanelPath::Avx2);
        }
        if Isa::Avx512.supported() && CpuFeatures::get().avx512vnni {
            v.push(PanelPath::Vnni512);
        }
        if crate::isa::amx_int8_supported() {
            v.push(PanelPath::Amx);
        }
        v
    }
}

/// The most `F32` activation rows [`QuantPanels::matmul`] runs on the
/// panel kernels; more rows dequantize the panels for the f32 GEMM
/// ([`QuantPanels::matmul_dequant`]). The batched decode steps of
/// `LlamaModel::decode_batch` (up to 16 rows) so stay on panels, whose rows
/// are bit for bit the one-row product. Measured, SmolLM2-135M Q4_1
/// prefill of 128 tokens, 2 threads, 2-vCPU AMD EPYC Zen 4, tok/s, 4
/// interleaved rounds: under `RLX_CPU_ISA=avx2` the GGUF-layout tile
/// kernel (this path's predecessor on AVX2, dequantized tiles into the
/// `gemm` crate and a transpose) 485-592 against 565-667 dequantized
/// panels; on AVX-512 the panel kernel already ran at about 86% of the FMA
/// peak on Zen 4, where the two are level (586-815 against 673-842), while
/// on the 16-core Xeon it reached about 36% (the widening shifts and
/// permutes share ports 0 and 5 with the FMAs there).
pub const F32_PANEL_MAX_ROWS: usize = 32;

/// Dequantized panels one task of [`QuantPanels::matmul_dequant`] holds at
/// a time: an L2-sized share, so that the f32 GEMM reads them from L2 for
/// every row block of the activations.
const DEQUANT_CHUNK_BYTES: usize = 256 * 1024;

/// Whether `DequantMatMul`s over `scheme` weights should run on panels
/// here: the scheme has a panel layout and either the CPU runs a vector
/// panel kernel (VNNI or AVX2) under the active ISA, or
/// `RLX_CPU_QUANT_PANELS=1` forces panels (`0` turns them off, for A/B
/// runs).
pub fn panels_wanted(scheme: QuantScheme) -> bool {
    if Kind::of(scheme).is_none() {
        return false;
    }
    match std::env::var("RLX_CPU_QUANT_PANELS")
        .as_deref()
        .map(str::trim)
    {
        Ok("0") | Ok("off") => false,
        Ok("1") | Ok("on") => true,
        _ => PanelPath::active() != PanelPath::Scalar,
    }
}

/// A quantized `[n, k]` weight matrix (the right-hand side `W^T` of
/// `DequantMatMul`) in 16-row panels; see the module docs.
pub struct QuantPanels {
    kind: Kind,
    n: usize,
    k: usize,
    /// Blocks of 32 per row.
    nb: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for QuantPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantPanels")
            .field("kind", &self.kind)
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

impl QuantPanels {
    /// Repack `w`, `n` rows of `k` elements in `scheme`'s GGUF layout.
    pub fn pack(scheme: QuantScheme, w: &[u8], n: usize, k: usize) -> Result<Self, KernelError> {
        let kind = Kind::of(scheme).ok_or_else(|| KernelError::Unsupported {
            op: OP,
            what: format!("{} weights in panels", scheme.name()),
        })?;
        if n == 0 || k == 0 || !k.is_multiple_of(QK) {
            return Err(bad_shape(
                OP,
                format!("panels need n > 0 and K a positive multiple of {QK}, got [{n}, {k}]"),
            ));
        }
        let (bb, qoff) = kind.gguf_block();
        let nb = k / QK;
        let rb = nb * bb;
        if n.checked_mul(rb) != Some(w.len()) {
            return Err(bad_shape(
                OP,
                format!(
                    "packed {} W has {} bytes, expected {n} rows x {rb}",
                    scheme.name(),
                    w.len()
                ),
            ));
        }
        let np = n.div_ceil(PANEL);
        let per_block = kind.lines();
        let total = np
            .checked_mul(nb)
            .and_then(|v| v.checked_mul(per_block))
            .ok_or_else(|| bad_shape(OP, "panel size overflows"))?;
        let mut lines = vec![Line([0; 64]); total];
        let qb = kind.qs_bytes();
        for p in 0..np {
            for b in 0..nb {
                let rec = &mut lines[(p * nb + b) * per_block..][..per_block];
                // SAFETY: `Line` is 64 plain bytes, so `per_block` lines are
                // `per_block * 64` initialized bytes with no padding.
                let bytes: &mut [u8] = unsafe {
                    std::slice::from_raw_parts_mut(rec.as_mut_ptr().cast::<u8>(), per_block * 64)
                };
                for r in 0..PANEL.min(n - p * PANEL) {
                    let row = p * PANEL + r;
                    let blk = &w[row * rb + b * bb..][..bb];
                    let q = &blk[qoff..];
                    for j in 0..qb / 64 {
                        bytes[j * 64 + r * 4..][..4].copy_from_slice(&q[4 * j..4 * j + 4]);
                    }
                    bytes[qb + 2 * r..][..2].copy_from_slice(&blk[..2]);
                    let extra = match kind {
                        Kind::Q4_0 => continue,
                        Kind::Q4_1 => [blk[2], blk[3]],
                        Kind::Q8_0 => {
                            // |Σ w| <= 32 * 128 fits an i16.
                            let s: i32 = q[..QK].iter().map(|&v| i32::from(v as i8)).sum();
                            (s as i16).to_le_bytes()
                        }
                    };
                    bytes[qb + 32 + 2 * r..][..2].copy_from_slice(&extra);
                }
            }
        }
        Ok(QuantPanels {
            kind,
            n,
            k,
            nb,
            lines,
        })
    }

    /// Output columns (weight rows).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Elements per weight row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// `out [m, n] = x̂ [m, k] x W^T` with the fastest path here. `Int8`:
    /// `x̂` is `x` rounded to Q8 blocks (the numbers of [`super::quant_q8`]
    /// up to the order of the f32 additions). `F32`: `x̂ = x`, and per block
    /// `y += d_w Σ q_w x` (`- 8 Σ x` inside for Q4_0) `+ m_w Σ x` (Q4_1),
    /// the products formed in f32 (the dequantized product up to f32
    /// rounding), up to [`F32_PANEL_MAX_ROWS`] rows; more `F32` rows run
    /// [`QuantPanels::matmul_dequant`] (but on the scalar path).
    pub fn matmul(
        &self,
        activations: ActivationPrecision,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        parallel: bool,
    ) -> Result<(), KernelError> {
        let path = PanelPath::active();
        if activations == ActivationPrecision::F32
            && m > F32_PANEL_MAX_ROWS
            && path != PanelPath::Scalar
        {
            return self.matmul_dequant(x, m, out, parallel);
        }
        self.matmul_path(activations, x, m, out, parallel, path)
    }

    /// `out [m, n] = x [m, k] x Ŵ^T` for `F32` activations with `Ŵ` the
    /// dequantized weights, exactly as `rlx_formats::quant::dequantize`
    /// gives them (the padding rows of the last panel may give -0): each
    /// task dequantizes its share of the panels, an
    /// L2-sized chunk at a time, into an f32 packing (one per thread,
    /// reused) and runs the f32 GEMM of [`super::packed_gemm`] over every
    /// row against it, so the result has the bits of `gemm_packed` over the
    /// packed dequantized matrix. What [`QuantPanels::matmul`] runs past
    /// [`F32_PANEL_MAX_ROWS`] rows on AVX2 and AVX-512: the panel kernel
    /// widens every weight again for each 8 rows, where this pays one
    /// widening per weight for all rows.
    pub fn matmul_dequant(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        parallel: bool,
    ) -> Result<(), KernelError> {
        self.check_sizes(x, m, out)?;
        if m == 0 {
            return Ok(());
        }
        let k = self.k;
        let threads = if parallel && m * self.n * k >= 1 << 18 {
            super::team::threads()
        } else {
            1
        };
        // Chunks of whole panel pairs: the AVX-512 GEMM runs two panels at
        // a time.
        let chunk = (DEQUANT_CHUNK_BYTES / (k * 4 * PANEL) / 2 * 2).max(2);
        gemm_chunked_b(m, x, k, self.n, out, threads, chunk, |j0, j1, b, _| {
            b.refill_f32(k, j1 - j0, |f| {
                for (p, dst) in (j0 / PANEL..).zip(f.chunks_exact_mut(k * PANEL)) {
                    self.dequant_panel(p, dst);
                }
            });
            Ok(())
        })
    }

    /// Panel `p` dequantized into `dst` (`k x 16` floats, element `e` of
    /// weight row `16 p + j` at `e * 16 + j`), with the arithmetic of
    /// `rlx_formats::quant::dequantize`; rows past `n` give zeros (Q4_0:
    /// -0).
    fn dequant_panel(&self, p: usize, dst: &mut [f32]) {
        self.dequant_panel_isa(Isa::active(), p, dst)
    }

    /// [`QuantPanels::dequant_panel`] with the kernel of `isa`, which the
    /// CPU supports; every kernel gives the same bits.
    fn dequant_panel_isa(&self, isa: Isa, p: usize, dst: &mut [f32]) {
        assert_eq!(dst.len(), self.k * PANEL, "dequantized panel size");
        assert!(isa.supported(), "{isa:?} on this CPU");
        #[cfg(target_arch = "x86_64")]
        match isa {
            // SAFETY: a supported AVX-512 (asserted) has AVX-512 F/BW;
            // `dst` holds the panel's `k * 16` floats (asserted).
            Isa::Avx512 => return unsafe { vnni::dequant_panel(self, p, dst.as_mut_ptr()) },
            // SAFETY: a supported AVX2 has AVX2, FMA and F16C; `dst` as
            // above.
            Isa::Avx2 => return unsafe { avx2::dequant_panel(self, p, dst.as_mut_ptr()) },
            Isa::Portable => {}
        }
        self.dequant_panel_scalar(p, dst);
    }

    /// [`QuantPanels::dequant_panel`] one element at a time.
    fn dequant_panel_scalar(&self, p: usize, dst: &mut [f32]) {
        let qb = self.kind.qs_bytes();
        for b in 0..self.nb {
            let rec = self.record(p, b);
            for r in 0..PANEL {
                let d = f16_at(&rec[qb + 2 * r..]);
                for e in 0..QK {
                    let v = match self.kind {
                        Kind::Q8_0 => f32::from(rec[(e / 4) * 64 + r * 4 + e % 4] as i8) * d,
                        kind => {
                            let byte = rec[(e % 16 / 4) * 64 + r * 4 + e % 4];
                            let q = if e < 16 { byte & 0x0F } else { byte >> 4 };
                            if kind == Kind::Q4_0 {
                                (i32::from(q) - 8) as f32 * d
                            } else {
                                f32::from(q) * d + f16_at(&rec[qb + 32 + 2 * r..])
                            }
                        }
                    };
                    dst[(b * QK + e) * PANEL + r] = v;
                }
            }
        }
    }

    /// That `x` holds `m` rows of `k` and `out` `m` rows of `n`.
    fn check_sizes(&self, x: &[f32], m: usize, out: &[f32]) -> Result<(), KernelError> {
        if m.checked_mul(self.k) != Some(x.len()) || m.checked_mul(self.n) != Some(out.len()) {
            return Err(bad_shape(
                OP,
                format!(
                    "x has {} floats and out {} for m = {m} rows against panels [{}, {}]",
                    x.len(),
                    out.len(),
                    self.n,
                    self.k
                ),
            ));
        }
        Ok(())
    }

    /// [`QuantPanels::matmul`] with a chosen kernel.
    pub fn matmul_path(
        &self,
        activations: ActivationPrecision,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        parallel: bool,
        path: PanelPath,
    ) -> Result<(), KernelError> {
        let path = match path {
            PanelPath::Scalar => PanelPath::Scalar,
            p if !PanelPath::available().contains(&p) => PanelPath::Scalar,
            p => p,
        };
        self.check_sizes(x, m, out)?;
        if m == 0 {
            return Ok(());
        }
        let acts = match activations {
            ActivationPrecision::Int8 => {
                // The AVX2 kernel multiplies |w| by sign(w) x; the others
                // take x + 128 for Q8_0 weights.
                let shift = self.kind == Kind::Q8_0 && path != PanelPath::Avx2;
                let mut acts = Int8Acts::new(x, m, self.k, shift);
                if path == PanelPath::Amx {
                    acts.tile_rows(self.k);
                }
                Acts::Int8(acts)
            }
            ActivationPrecision::F32 => Acts::F32 {
                m,
                x,
                sums: x.chunks_exact(QK).map(|b| b.iter().sum()).collect(),
            },
        };
        let np = self.n.div_ceil(PANEL);
        let threads = if parallel { super::team::threads() } else { 1 };
        // At least ~64K multiply-adds per task: a smaller one costs more in
        // wake-ups than it saves.
        let min_panels = (65536 / (PANEL * self.k * m)).max(1);
        let per = np.div_ceil(threads).max(min_panels);
        let dst = OutPtr(out.as_mut_ptr());
        let run = |p0: usize| {
            let p1 = (p0 + per).min(np);
            // SAFETY: tasks cover disjoint panel ranges, so each writes
            // disjoint output columns `p * 16..` of every row; `out` holds
            // `m * n` floats (checked above) and outlives the tasks.
            unsafe { self.panels(&acts, p0, p1, dst, path) };
        };
        if threads == 1 || per >= np {
            run(0);
        } else {
            let tasks = np.div_ceil(per);
            if m <= super::team::MAX_ROWS {
                super::team::for_each(tasks, |t| run(t * per));
            } else {
                (0..tasks).into_par_iter().for_each(|t| run(t * per));
            }
        }
        Ok(())
    }

    /// Panels `p0..p1` against every activation row, into `out`.
    ///
    /// # Safety
    /// `out` points at `acts.m * self.n` floats that no one else writes in
    /// columns `p0 * 16..p1 * 16` while this runs.
    unsafe fn panels(&self, acts: &Acts, p0: usize, p1: usize, out: OutPtr, path: PanelPath) {
        let mut p = p0;
        // One row of `F32` activations (decode) on AVX-512: several full
        // panels side by side, so that their block sums form independent
        // FMA chains (one chain waits on the FMA latency: 32 dependent FMAs
        // per block). Each output column's arithmetic is that of the
        // one-panel kernels. Measured on the 16-core Xeon (SmolLM2's decode
        // matmuls, 2 threads): 18.5 -> 22-28 GB/s. Not for `Int8`, which
        // already streams at about 40 GB/s there, nor on AVX2, whose two
        // panel halves are two chains already, and where four measured
        // slower on Zen 3 (the widening, not the latency, bounds it).
        #[cfg(target_arch = "x86_64")]
        let vnni = matches!(path, PanelPath::Vnni512 | PanelPath::Amx);
        #[cfg(target_arch = "x86_64")]
        if vnni && matches!(acts, Acts::F32 { m: 1, .. }) {
            let full = (self.n / PANEL).min(p1);
            while p + vnni::ROW_PANELS <= full {
                // SAFETY: as for `vnni::panel` below, for the full panels
                // `p..p + ROW_PANELS`, all inside `p0..p1`.
                unsafe { vnni::row_panels(self, acts, p, out.0) };
                p += vnni::ROW_PANELS;
            }
        }
        // Prefill with Int8 activations: whole groups of 16 rows on tiles,
        // the rest on VNNI.
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let (PanelPath::Amx, Acts::Int8(i)) = (path, acts) {
            let m16 = i.m / 16 * 16;
            if m16 > 0 {
                let mut scratch = amx::Scratch::default();
                // SAFETY: `Amx` is used only when `amx_int8_supported()` (see
                // `matmul_path`), which includes AVX-512 F/BW and VNNI; the
                // tiles are configured on this thread before the panels and
                // released after them; reads and writes as for
                // `vnni::panel` below (rows `0..m16` by tiles, `m16..` by
                // VNNI).
                unsafe {
                    amx::configure();
                    for p in p..p1 {
                        amx::panel(self, acts, p, out.0, m16, &mut scratch);
                        vnni::panel(self, acts, p, out.0, m16);
                    }
                    amx::release();
                }
                return;
            }
        }
        for p in p..p1 {
            match path {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Vnni512` and `Amx` are used only when the CPU has
                // AVX-512 VNNI (see `matmul_path`); the kernel's reads are
                // within this panel's lines and `acts`, its writes as above.
                PanelPath::Vnni512 | PanelPath::Amx => unsafe {
                    vnni::panel(self, acts, p, out.0, 0)
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Avx2` is used only when the CPU has AVX2, FMA
                // and F16C (see `matmul_path`); reads and writes as above.
                PanelPath::Avx2 => unsafe { avx2::panel(self, acts, p, out.0) },
                _ => match acts {
                    Acts::Int8(a) => self.panel_scalar(a, p, out.0),
                    Acts::F32 { m, x, sums } => self.panel_scalar_f32(*m, x, sums, p, out.0),
                },
            }
        }
    }

    /// Panel `p`'s first block record and the bytes between records.
    #[cfg(target_arch = "x86_64")]
    fn panel_records(&self, p: usize) -> (*const u8, usize) {
        let per = self.kind.lines() * 64;
        (
            self.lines[p * self.nb * self.kind.lines()..]
                .as_ptr()
                .cast(),
            per,
        )
    }

    fn record(&self, p: usize, b: usize) -> &[u8] {
        let per = self.kind.lines();
        let rec = &self.lines[(p * self.nb + b) * per..][..per];
        // SAFETY: `Line` is 64 plain bytes (see `pack`).
        unsafe { std::slice::from_raw_parts(rec.as_ptr().cast::<u8>(), per * 64) }
    }

    /// The `F32` definition the vector kernels match bit for bit: per
    /// block, the products fused into two sums in group order, the low
    /// nibbles' and the high nibbles' (Q8_0: even and odd 4-element
    /// groups), then added: two dependency chains instead of one, which
    /// one activation row (decode) otherwise waits on.
    fn panel_scalar_f32(&self, m: usize, x: &[f32], sums: &[f32], p: usize, out: *mut f32) {
        let qb = self.kind.qs_bytes();
        let half = |bytes: &[u8], i: usize| f16_at(&bytes[i..]);
        for c in 0..m {
            let mut acc = [0.0f32; PANEL];
            for b in 0..self.nb {
                let rec = self.record(p, b);
                let xb = &x[(c * self.nb + b) * QK..][..QK];
                let sx = sums[c * self.nb + b];
                for (r, a) in acc.iter_mut().enumerate() {
                    // Two chains (low / high nibbles; Q8_0: even / odd
                    // groups), added at the end of the block.
                    let mut s = [0.0f32; 2];
                    for j in 0..qb / 64 {
                        for t in 0..4 {
                            let byte = rec[j * 64 + r * 4 + t];
                            if self.kind == Kind::Q8_0 {
                                s[j % 2] = f32::from(byte as i8).mul_add(xb[4 * j + t], s[j % 2]);
                            } else {
                                s[0] = f32::from(byte & 15).mul_add(xb[4 * j + t], s[0]);
                                s[1] = f32::from(byte >> 4).mul_add(xb[16 + 4 * j + t], s[1]);
                            }
                        }
                    }
                    let mut bs = s[0] + s[1];
                    if self.kind == Kind::Q4_0 {
                        bs -= 8.0 * sx;
                    }
                    *a = half(rec, qb + 2 * r).mul_add(bs, *a);
                    if self.kind == Kind::Q4_1 {
                        *a = half(rec, qb + 32 + 2 * r).mul_add(sx, *a);
                    }
                }
            }
            for (r, &v) in acc.iter().enumerate().take(self.n - p * PANEL) {
                // SAFETY: as in `panel_scalar`.
                unsafe { *out.add(c * self.n + p * PANEL + r) = v };
            }
        }
    }

    /// The `Int8` definition the vector kernel matches bit for bit.
    fn panel_scalar(&self, acts: &Int8Acts, p: usize, out: *mut f32) {
        let qb = self.kind.qs_bytes();
        let half = |bytes: &[u8], i: usize| f16_at(&bytes[i..]);
        let int16 = |bytes: &[u8], i: usize| i16::from_le_bytes([bytes[i], bytes[i + 1]]);
        for c in 0..acts.m {
            let mut acc = [0.0f32; PANEL];
            for b in 0..self.nb {
                let rec = self.record(p, b);
                let blk = c * self.nb + b;
                let (dx, sx, sum) = (acts.d[blk], acts.s[blk], acts.sum[blk]);
                let xq = &acts.q[blk * QK..][..QK];
                for (r, a) in acc.iter_mut().enumerate() {
                    let mut isum = 0i32;
                    for j in 0..qb / 64 {
                        for t in 0..4 {
                            let byte = rec[j * 64 + r * 4 + t];
                            isum += match self.kind {
                                Kind::Q8_0 => {
                                    i32::from(xq[4 * j + t] as u8) * i32::from(byte as i8)
                                }
                                _ => {
                                    i32::from(byte & 15) * i32::from(xq[4 * j + t])
                                        + i32::from(byte >> 4) * i32::from(xq[16 + 4 * j + t])
                                }
                            };
                        }
                    }
                    match self.kind {
                        Kind::Q4_0 => isum -= 8 * sum,
                        Kind::Q8_0 => isum -= 128 * i32::from(int16(rec, qb + 32 + 2 * r)),
                        Kind::Q4_1 => {}
                    }
                    let d = half(rec, qb + 2 * r);
                    *a = (d * dx).mul_add(isum as f32, *a);
                    if self.kind == Kind::Q4_1 {
                        *a = half(rec, qb + 32 + 2 * r).mul_add(sx, *a);
                    }
                }
            }
            for (r, &v) in acc.iter().enumerate().take(self.n - p * PANEL) {
                // SAFETY: the caller's contract: row `c` column `p*16 + r`
                // is inside `out` and only this task writes it.
                unsafe { *out.add(c * self.n + p * PANEL + r) = v };
            }
        }
    }
}

/// The output pointer shared by the tasks of one call (disjoint columns).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements through it (see `matmul_path`).
unsafe impl Send for OutPtr {}
// SAFETY: as above; no task reads what another writes.
unsafe impl Sync for OutPtr {}

/// The activations of one call.
enum Acts<'a> {
    /// Rounded to Q8 blocks.
    Int8(Int8Acts),
    /// As they are, with the sum of each block of 32.
    F32 {
        m: usize,
        x: &'a [f32],
        sums: Vec<f32>,
    },
}

/// Activations rounded to Q8 blocks: the bytes (plus 128 as unsigned when
/// `shift`), and per block `d`, `d Σ q` and `Σ q`.
struct Int8Acts {
    m: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    sum: Vec<i32>,
    /// For the AMX path: the first `m / 16 * 16` rows of `q` as tiles,
    /// `[m / 16][k / 32]` blocks of 16 rows x 32 bytes (one tile load each
    /// reads 8 consecutive cache lines); empty otherwise.
    tiles: Vec<i8>,
}

impl Int8Acts {
    /// Fills [`Int8Acts::tiles`] (rows of `k` bytes).
    fn tile_rows(&mut self, k: usize) {
        let (groups, nb) = (self.m / 16, k / QK);
        self.tiles.resize(groups * nb * 16 * QK, 0);
        for (t, tile) in self.tiles.chunks_exact_mut(16 * QK).enumerate() {
            let (g, b) = (t / nb, t % nb);
            for (r, dst) in tile.chunks_exact_mut(QK).enumerate() {
                dst.copy_from_slice(&self.q[(16 * g + r) * k + b * QK..][..QK]);
            }
        }
    }

    /// `x` (`m` rows of `k`) rounded to Q8 blocks, each block as
    /// [`super::quant_q8::quantize_rows`] rounds it. Rows split over the
    /// pool when there are many: serial, the rounding was a tenth of a
    /// 1-thread prefill's matmul time and a fifth on 2 threads (SmolLM2's
    /// matmuls, 128 rows: 68.8 -> 54.4 ms). Each row is rounded alone, so
    /// the split changes no bits.
    fn new(x: &[f32], m: usize, k: usize, shift: bool) -> Int8Acts {
        let nb = k / QK;
        let mut a = Int8Acts {
            m,
            q: vec![0; m * k],
            d: vec![0.0; m * nb],
            s: vec![0.0; m * nb],
            sum: vec![0; m * nb],
            tiles: Vec::new(),
        };
        let avx2 = super::quant_q8::has_avx2();
        let rows = |x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32], sum: &mut [i32]| {
            let blocks = x
                .chunks_exact(QK)
                .zip(q.chunks_exact_mut(QK))
                .zip(d.iter_mut().zip(s.iter_mut()).zip(sum.iter_mut()));
            for ((xb, qb), ((d, s), sum)) in blocks {
                let (dv, isum) = super::quant_q8::quantize_block(xb, qb, avx2);
                (*d, *s, *sum) = (dv, dv * isum as f32, isum);
                if shift {
                    // q + 128 as an unsigned byte (the bits of q with the
                    // sign flipped).
                    qb.iter_mut().for_each(|v| *v = (*v as u8 ^ 0x80) as i8);
                }
            }
        };
        // Rows per task: at least 16K elements, about two tasks a thread.
        let per = (16384 / k.max(1))
            .max(m.div_ceil(2 * rayon::current_num_threads()))
            .max(1);
        if per >= m {
            rows(x, &mut a.q, &mut a.d, &mut a.s, &mut a.sum);
        } else {
            x.par_chunks(per * k)
                .zip(a.q.par_chunks_mut(per * k))
                .zip(a.d.par_chunks_mut(per * nb))
                .zip(a.s.par_chunks_mut(per * nb))
                .zip(a.sum.par_chunks_mut(per * nb))
                .for_each(|((((x, q), d), s), sum)| rows(x, q, d, s, sum));
        }
        a
    }
}

/// Raw views of one panel and the activations, for the vector kernels.
#[cfg(target_arch = "x86_64")]
struct Args {
    /// The panel's first block record; records are `per` bytes apart.
    w: *const u8,
    nb: usize,
    per: usize,
    /// Int8: the rounded activations.
    q: *const i8,
    /// Int8 on AMX: [`Int8Acts::tiles`].
    tiles: *const i8,
    /// F32: the activations.
    x: *const f32,
    d: *const f32,
    /// Int8: `d Σ q` per block; F32: `Σ x` per block.
    s: *const f32,
    sum: *const i32,
    /// Column `p * 16` of output row 0; rows are `n` apart.
    out: *mut f32,
    n: usize,
    /// Columns of this panel that exist (16 but for the last panel).
    valid: usize,
    /// Few activation rows (a decode step): the kernel is bound by the
    /// weight stream, and prefetches far ahead.
    stream: bool,
}

#[cfg(target_arch = "x86_64")]
impl Args {
    /// The views of panel `p` of `w` and of `acts`, with the activation
    /// row count.
    ///
    /// # Safety
    /// `out` holds `m * w.n` floats (`m` the rows of `acts`) and `p` is a
    /// panel of `w`.
    unsafe fn new(w: &QuantPanels, acts: &Acts, p: usize, out: *mut f32) -> (Args, usize) {
        let mut a = Args {
            w: w.lines
                .as_ptr()
                .cast::<u8>()
                .add(p * w.nb * w.kind.lines() * 64),
            nb: w.nb,
            per: w.kind.lines() * 64,
            q: std::ptr::null(),
            tiles: std::ptr::null(),
            x: std::ptr::null(),
            d: std::ptr::null(),
            s: std::ptr::null(),
            sum: std::ptr::null(),
            out: out.add(p * PANEL),
            n: w.n,
            valid: (w.n - p * PANEL).min(PANEL),
            stream: false,
        };
        let m = match acts {
            Acts::Int8(i) => {
                (a.q, a.d, a.s, a.sum) = (i.q.as_ptr(), i.d.as_ptr(), i.s.as_ptr(), i.sum.as_ptr());
                a.tiles = i.tiles.as_ptr();
                i.m
            }
            Acts::F32 { m, x, sums } => {
                (a.x, a.s) = (x.as_ptr(), sums.as_ptr());
                *m
            }
        };
        a.stream = m <= super::team::MAX_ROWS;
        (a, m)
    }
}

/// How many records (about 20 KiB) ahead a panel's first pass also hints
/// into L2 when few rows make the kernel stream-bound ([`Args::stream`]),
/// in the AVX-512 and the AVX2 kernels. The L1 hints alone keep only as
/// many lines in flight as the core has fill buffers, too few to cover
/// memory latency. `panel_decode_speed` (SmolLM2's matmuls, one row, 2
/// threads of the dev Xeon, interleaved): `F32` 4.8 -> 3.4 ms, `Int8`
/// 3.3 -> 2.65 ms per step (16 and 32 records: 4.3 and 4.2 ms `F32`;
/// 128 and 256: 3.5 and 3.9 ms).
#[cfg(target_arch = "x86_64")]
const PF_FAR: usize = 64;

#[cfg(target_arch = "x86_64")]
// Register tiles are indexed [c] by loops over their const sizes.
#[allow(clippy::needless_range_loop)]
mod vnni {
    use super::{Acts, Args, Kind, QuantPanels, PANEL, PF_FAR, Q4_0, Q4_1, Q8_0, QK};
    use std::arch::x86_64::*;

    /// Panel `p` against activation rows `c0..` of `acts`, 8, 4, 2 or 1
    /// rows at a time.
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI; `out` holds `acts.m * w.n` floats.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn panel(w: &QuantPanels, acts: &Acts, p: usize, out: *mut f32, c0: usize) {
        let (a, m) = Args::new(w, acts, p, out);
        let f32_acts = matches!(acts, Acts::F32 { .. });
        let mut c = c0;
        macro_rules! tiles {
            ($tile:ident, $code:expr) => {{
                while c + 8 <= m {
                    $tile::<{ $code }, 8>(&a, c);
                    c += 8;
                }
                if c + 4 <= m {
                    $tile::<{ $code }, 4>(&a, c);
                    c += 4;
                }
                if c + 2 <= m {
                    $tile::<{ $code }, 2>(&a, c);
                    c += 2;
                }
                if c < m {
                    $tile::<{ $code }, 1>(&a, c);
                }
            }};
        }
        match (w.kind, f32_acts) {
            (Kind::Q4_0, false) => tiles!(tile, Q4_0),
            (Kind::Q4_1, false) => tiles!(tile, Q4_1),
            (Kind::Q8_0, false) => tiles!(tile, Q8_0),
            (Kind::Q4_0, true) => tiles!(tile_f32, Q4_0),
            (Kind::Q4_1, true) => tiles!(tile_f32, Q4_1),
            (Kind::Q8_0, true) => tiles!(tile_f32, Q8_0),
        }
    }

    /// How many records (about 2.5 KiB for the 4-bit formats) ahead a
    /// block prefetches: decode streams the panels once per token from L3
    /// or memory, and the hardware prefetcher alone keeps too few lines in
    /// flight on one core.
    const PF_RECORDS: usize = 8;

    /// Four activation bytes (elements `e..e + 4` of row `row`) in every
    /// 32-bit lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bcast4(a: &Args, row: usize, e: usize) -> __m512i {
        _mm512_set1_epi32(a.q.add(row * a.nb * QK + e).cast::<i32>().read_unaligned())
    }

    /// Activation rows `c0..c0 + C` against the panel.
    ///
    /// # Safety
    /// As [`panel`]; rows `c0..c0 + C` exist.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const KIND: u8, const C: usize>(a: &Args, c0: usize) {
        let qb = if KIND == Q8_0 { 512 } else { 256 };
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..a.nb {
            let rec = a.w.add(b * a.per);
            // The first tile of a panel reads it from L3 or memory, the
            // others from L1; many rows (prefill) are bound by the
            // arithmetic, where the far hints cost a little.
            prefetch(a, rec, qb / 64 + 1, c0 == 0 && a.stream);
            let mut isum = [_mm512_setzero_si512(); C];
            if KIND == Q8_0 {
                for j in 0..8 {
                    let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                    for c in 0..C {
                        let xb = bcast4(a, c0 + c, b * QK + 4 * j);
                        isum[c] = _mm512_dpbusd_epi32(isum[c], xb, v);
                    }
                }
            } else {
                for j in 0..4 {
                    let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                    let lo = _mm512_and_si512(v, low);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                    for c in 0..C {
                        let xl = bcast4(a, c0 + c, b * QK + 4 * j);
                        let xh = bcast4(a, c0 + c, b * QK + 16 + 4 * j);
                        isum[c] = _mm512_dpbusd_epi32(isum[c], lo, xl);
                        isum[c] = _mm512_dpbusd_epi32(isum[c], hi, xh);
                    }
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb) as *const __m256i));
            let extra = _mm256_load_si256(rec.add(qb + 32) as *const __m256i);
            for c in 0..C {
                let blk = (c0 + c) * a.nb + b;
                let mut is = isum[c];
                if KIND == Q4_0 {
                    is = _mm512_sub_epi32(is, _mm512_set1_epi32(8 * *a.sum.add(blk)));
                }
                if KIND == Q8_0 {
                    let wsum = _mm512_slli_epi32::<7>(_mm512_cvtepi16_epi32(extra));
                    is = _mm512_sub_epi32(is, wsum);
                }
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.add(blk)));
                acc[c] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(is), acc[c]);
                if KIND == Q4_1 {
                    let mw = _mm512_cvtph_ps(extra);
                    acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*a.s.add(blk)), acc[c]);
                }
            }
        }
        let mask: __mmask16 = if a.valid == PANEL {
            0xFFFF
        } else {
            (1u16 << a.valid) - 1
        };
        for c in 0..C {
            _mm512_mask_storeu_ps(a.out.add((c0 + c) * a.n), mask, acc[c]);
        }
    }

    /// Panel `p` of `w` dequantized into `dst`, as
    /// [`QuantPanels::dequant_panel`] says: per element `q * d (+ m)` with
    /// a separate multiply and add, the arithmetic of
    /// `rlx_formats::quant::dequantize`.
    ///
    /// # Safety
    /// AVX-512 F/BW; `p` is a panel of `w`; `dst` holds `w.k * 16` floats.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn dequant_panel(w: &QuantPanels, p: usize, dst: *mut f32) {
        let (rec0, per) = w.panel_records(p);
        let qb = if w.kind == Kind::Q8_0 { 512 } else { 256 };
        let table = nibble_table();
        let eight = _mm512_set1_ps(8.0);
        for b in 0..w.nb {
            let rec = rec0.add(b * per);
            let out = dst.add(b * QK * PANEL);
            let dw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb) as *const __m256i));
            if w.kind == Kind::Q8_0 {
                for j in 0..8 {
                    let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                    for t in 0..4 {
                        let up = _mm512_sllv_epi32(v, _mm512_set1_epi32(24 - 8 * t as i32));
                        let q = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(up));
                        _mm512_storeu_ps(out.add((4 * j + t) * PANEL), _mm512_mul_ps(q, dw));
                    }
                }
                continue;
            }
            let mw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb + 32) as *const __m256i));
            for j in 0..4 {
                let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                for t in 0..4 {
                    for (half, shift) in [(0, 8 * t as i32), (16, 8 * t as i32 + 4)] {
                        let q = _mm512_permutexvar_ps(
                            _mm512_srlv_epi32(v, _mm512_set1_epi32(shift)),
                            table,
                        );
                        // Q4_0: q - 8 is exact, as ggml's integer subtraction.
                        let y = if w.kind == Kind::Q4_0 {
                            _mm512_mul_ps(_mm512_sub_ps(q, eight), dw)
                        } else {
                            _mm512_add_ps(_mm512_mul_ps(q, dw), mw)
                        };
                        _mm512_storeu_ps(out.add((half + 4 * j + t) * PANEL), y);
                    }
                }
            }
        }
    }

    /// Full panels that [`row_panels`] takes at once: four FMA chains.
    pub(super) const ROW_PANELS: usize = 4;

    /// `F32` activation row 0 against the full panels `p..p + ROW_PANELS`,
    /// in the arithmetic of [`tile_f32`] for each output column.
    ///
    /// # Safety
    /// AVX-512 F/BW; `acts` is one row of `F32` activations; the panels
    /// exist and are full; `out` holds `w.n` floats.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn row_panels(w: &QuantPanels, acts: &Acts, p: usize, out: *mut f32) {
        let (a, _) = Args::new(w, acts, p, out);
        match w.kind {
            Kind::Q4_0 => row_tile_f32::<Q4_0, ROW_PANELS>(&a),
            Kind::Q4_1 => row_tile_f32::<Q4_1, ROW_PANELS>(&a),
            Kind::Q8_0 => row_tile_f32::<Q8_0, ROW_PANELS>(&a),
        }
    }

    /// Prefetches the `lines` lines of the record `PF_RECORDS` after `rec`
    /// into L1 and, with `far`, those of the record `PF_FAR` after it into
    /// L2 (panels are contiguous, so both run on into the next panels).
    /// Only hints: past the end of the panels is harmless.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn prefetch(a: &Args, rec: *const u8, lines: usize, far: bool) {
        let ahead = rec.wrapping_add(a.per * PF_RECORDS);
        for l in 0..lines {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
        }
        if far {
            let far = rec.wrapping_add(a.per * PF_FAR);
            for l in 0..lines {
                _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(64 * l) as *const i8);
            }
        }
    }

    /// The 16 integers 0..15 as f32: `vpermps` with a nibble index (it
    /// reads the low 4 bits of each lane) widens 16 nibbles in one step.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn nibble_table() -> __m512 {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }

    /// [`tile_f32`] for one activation row over `P` full panels side by
    /// side.
    ///
    /// # Safety
    /// As [`row_panels`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn row_tile_f32<const KIND: u8, const P: usize>(a: &Args) {
        let qb = if KIND == Q8_0 { 512 } else { 256 };
        let table = nibble_table();
        let stride = a.nb * a.per;
        let mut acc = [_mm512_setzero_ps(); P];
        for b in 0..a.nb {
            let rec0 = a.w.add(b * a.per);
            for q in 0..P {
                prefetch(a, rec0.add(q * stride), qb / 64 + 1, true);
            }
            let x = a.x.add(b * QK);
            let mut bs = [[_mm512_setzero_ps(); 2]; P];
            if KIND == Q8_0 {
                for j in 0..8 {
                    let mut v = [_mm512_setzero_si512(); P];
                    for q in 0..P {
                        v[q] = _mm512_load_si512(rec0.add(q * stride + 64 * j) as *const _);
                    }
                    for t in 0..4u32 {
                        let xv = _mm512_set1_ps(*x.add(4 * j + t as usize));
                        for q in 0..P {
                            let up = _mm512_sllv_epi32(v[q], _mm512_set1_epi32(24 - 8 * t as i32));
                            let wv = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(up));
                            bs[q][j % 2] = _mm512_fmadd_ps(wv, xv, bs[q][j % 2]);
                        }
                    }
                }
            } else {
                for j in 0..4 {
                    let mut v = [_mm512_setzero_si512(); P];
                    for q in 0..P {
                        v[q] = _mm512_load_si512(rec0.add(q * stride + 64 * j) as *const _);
                    }
                    for t in 0..4u32 {
                        let xl = _mm512_set1_ps(*x.add(4 * j + t as usize));
                        let xh = _mm512_set1_ps(*x.add(16 + 4 * j + t as usize));
                        for q in 0..P {
                            let sl = _mm512_srlv_epi32(v[q], _mm512_set1_epi32(8 * t as i32));
                            let sh = _mm512_srlv_epi32(v[q], _mm512_set1_epi32(8 * t as i32 + 4));
                            let lo = _mm512_permutexvar_ps(sl, table);
                            let hi = _mm512_permutexvar_ps(sh, table);
                            bs[q][0] = _mm512_fmadd_ps(lo, xl, bs[q][0]);
                            bs[q][1] = _mm512_fmadd_ps(hi, xh, bs[q][1]);
                        }
                    }
                }
            }
            let sx = *a.s.add(b);
            for q in 0..P {
                let rec = rec0.add(q * stride);
                let dw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb) as *const __m256i));
                let mut v = _mm512_add_ps(bs[q][0], bs[q][1]);
                if KIND == Q4_0 {
                    v = _mm512_sub_ps(v, _mm512_set1_ps(8.0 * sx));
                }
                acc[q] = _mm512_fmadd_ps(dw, v, acc[q]);
                if KIND == Q4_1 {
                    let mw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb + 32) as *const __m256i));
                    acc[q] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[q]);
                }
            }
        }
        for q in 0..P {
            _mm512_storeu_ps(a.out.add(q * PANEL), acc[q]);
        }
    }

    /// [`tile`] for `F32` activations: each 4-element group's weights are
    /// widened to f32 (shift, mask or sign-extend, convert) once and
    /// multiplied with every activation row of the tile.
    ///
    /// # Safety
    /// As [`tile`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn tile_f32<const KIND: u8, const C: usize>(a: &Args, c0: usize) {
        let qb = if KIND == Q8_0 { 512 } else { 256 };
        let table = nibble_table();
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..a.nb {
            let rec = a.w.add(b * a.per);
            // As in `tile`.
            prefetch(a, rec, qb / 64 + 1, c0 == 0 && a.stream);
            let xat = |c: usize, e: usize| _mm512_set1_ps(*a.x.add(((c0 + c) * a.nb + b) * QK + e));
            let mut bs = [[_mm512_setzero_ps(); 2]; C];
            if KIND == Q8_0 {
                for j in 0..8 {
                    let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                    for t in 0..4u32 {
                        let up = _mm512_sllv_epi32(v, _mm512_set1_epi32(24 - 8 * t as i32));
                        let wv = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(up));
                        for c in 0..C {
                            bs[c][j % 2] =
                                _mm512_fmadd_ps(wv, xat(c, 4 * j + t as usize), bs[c][j % 2]);
                        }
                    }
                }
            } else {
                for j in 0..4 {
                    let v = _mm512_load_si512(rec.add(64 * j) as *const _);
                    for t in 0..4u32 {
                        let sl = _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * t as i32));
                        let sh = _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * t as i32 + 4));
                        let lo = _mm512_permutexvar_ps(sl, table);
                        let hi = _mm512_permutexvar_ps(sh, table);
                        for c in 0..C {
                            bs[c][0] = _mm512_fmadd_ps(lo, xat(c, 4 * j + t as usize), bs[c][0]);
                            bs[c][1] =
                                _mm512_fmadd_ps(hi, xat(c, 16 + 4 * j + t as usize), bs[c][1]);
                        }
                    }
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb) as *const __m256i));
            for c in 0..C {
                let sx = *a.s.add((c0 + c) * a.nb + b);
                let mut v = _mm512_add_ps(bs[c][0], bs[c][1]);
                if KIND == Q4_0 {
                    v = _mm512_sub_ps(v, _mm512_set1_ps(8.0 * sx));
                }
                acc[c] = _mm512_fmadd_ps(dw, v, acc[c]);
                if KIND == Q4_1 {
                    let mw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(qb + 32) as *const __m256i));
                    acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[c]);
                }
            }
        }
        let mask: __mmask16 = if a.valid == PANEL {
            0xFFFF
        } else {
            (1u16 << a.valid) - 1
        };
        for c in 0..C {
            _mm512_mask_storeu_ps(a.out.add((c0 + c) * a.n), mask, acc[c]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Register tiles are indexed [c] by loops over their const sizes.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use super::{Acts, Args, Kind, QuantPanels, Q4_0, Q4_1, Q8_0, QK};
    use std::arch::x86_64::*;

    /// Panel `p` against every activation row of `acts`, 4, 2 or 1 rows at
    /// a time, rows 0-7 of the panel and then rows 8-15.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `out` holds `acts.m * w.n` floats; for `Int8`
    /// activations over Q8_0 weights, `acts` holds the bytes unshifted.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel(w: &QuantPanels, acts: &Acts, p: usize, out: *mut f32) {
        let (a, m) = Args::new(w, acts, p, out);
        let f32_acts = matches!(acts, Acts::F32 { .. });
        macro_rules! tiles {
            ($tile:ident, $code:expr, $hn:expr, $h:expr) => {{
                let mut c = 0;
                while c + 4 <= m {
                    $tile::<{ $code }, 4, { $hn }>(&a, c, $h);
                    c += 4;
                }
                if c + 2 <= m {
                    $tile::<{ $code }, 2, { $hn }>(&a, c, $h);
                    c += 2;
                }
                if c < m {
                    $tile::<{ $code }, 1, { $hn }>(&a, c, $h);
                }
            }};
        }
        macro_rules! kinds {
            ($hn:expr, $h:expr) => {
                match (w.kind, f32_acts) {
                    (Kind::Q4_0, false) => tiles!(tile, Q4_0, $hn, $h),
                    (Kind::Q4_1, false) => tiles!(tile, Q4_1, $hn, $h),
                    (Kind::Q8_0, false) => tiles!(tile, Q8_0, $hn, $h),
                    (Kind::Q4_0, true) => tiles!(tile_f32, Q4_0, $hn, $h),
                    (Kind::Q4_1, true) => tiles!(tile_f32, Q4_1, $hn, $h),
                    (Kind::Q8_0, true) => tiles!(tile_f32, Q8_0, $hn, $h),
                }
            };
        }
        // Decode (one or two rows): both halves in one pass, one stream
        // over the panel. More rows: a pass per half, so that a tile of
        // four rows fits the 16 registers.
        if m <= 2 {
            kinds!(2, 0);
        } else {
            kinds!(1, 0);
            kinds!(1, 1);
        }
    }

    /// Records ahead that the first pass (`h == 0`) prefetches; the second
    /// pass reads the same lines again from L1/L2 (a panel of K = 1536 is
    /// 15 KiB).
    const PF_RECORDS: usize = 8;

    /// Four activation bytes (elements `e..e + 4` of row `row`) in every
    /// 32-bit lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bcast4(a: &Args, row: usize, e: usize) -> __m256i {
        _mm256_set1_epi32(a.q.add(row * a.nb * QK + e).cast::<i32>().read_unaligned())
    }

    /// Prefetches the record `PF_RECORDS` after `rec` on the first pass,
    /// and for few rows also the record [`PF_FAR`] after it into L2
    /// (as the AVX-512 kernels do).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn prefetch(a: &Args, rec: *const u8, h: usize, lines: usize) {
        if h == 0 {
            // Hints only: past the end of the panels is harmless.
            let ahead = rec.wrapping_add(a.per * PF_RECORDS);
            for l in 0..lines {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
            }
            if a.stream {
                let far = rec.wrapping_add(a.per * super::PF_FAR);
                for l in 0..lines {
                    _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(64 * l) as *const i8);
                }
            }
        }
    }

    /// Eight f16 of the record at byte `at` (rows `8h..8h + 8`) as f32.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn halves(rec: *const u8, at: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(rec.add(at) as *const __m128i))
    }

    /// Panel `p` of `w` dequantized into `dst`, as the AVX-512 kernel of
    /// the same name does, one half (rows `8h..8h + 8`) at a time.
    ///
    /// # Safety
    /// AVX2 and F16C; `p` is a panel of `w`; `dst` holds `w.k * 16` floats.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn dequant_panel(w: &QuantPanels, p: usize, dst: *mut f32) {
        let (rec0, per) = w.panel_records(p);
        let qb = if w.kind == Kind::Q8_0 { 512 } else { 256 };
        let nib = _mm256_set1_epi32(0x0F);
        let eight = _mm256_set1_ps(8.0);
        for b in 0..w.nb {
            let rec = rec0.add(b * per);
            let out = dst.add(b * QK * 16);
            for h in 0..2 {
                let dw = halves(rec, qb + 16 * h);
                let at = |e: usize| out.add(e * 16 + 8 * h);
                if w.kind == Kind::Q8_0 {
                    for j in 0..8 {
                        let v = _mm256_loadu_si256(rec.add(64 * j + 32 * h) as *const __m256i);
                        for t in 0..4 {
                            let up = _mm256_sllv_epi32(v, _mm256_set1_epi32(24 - 8 * t as i32));
                            let q = _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(up));
                            _mm256_storeu_ps(at(4 * j + t), _mm256_mul_ps(q, dw));
                        }
                    }
                    continue;
                }
                let mw = halves(rec, qb + 32 + 16 * h);
                for j in 0..4 {
                    let v = _mm256_loadu_si256(rec.add(64 * j + 32 * h) as *const __m256i);
                    for t in 0..4 {
                        for (half, shift) in [(0, 8 * t as i32), (16, 8 * t as i32 + 4)] {
                            let qi = _mm256_and_si256(
                                _mm256_srlv_epi32(v, _mm256_set1_epi32(shift)),
                                nib,
                            );
                            let q = _mm256_cvtepi32_ps(qi);
                            let y = if w.kind == Kind::Q4_0 {
                                _mm256_mul_ps(_mm256_sub_ps(q, eight), dw)
                            } else {
                                _mm256_add_ps(_mm256_mul_ps(q, dw), mw)
                            };
                            _mm256_storeu_ps(at(half + 4 * j + t), y);
                        }
                    }
                }
            }
        }
    }

    /// Stores rows `c0..c0 + C` of half `h` (columns `8h..8h + 8`, fewer
    /// at the last panel).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store<const C: usize>(a: &Args, c0: usize, h: usize, acc: &[__m256; C]) {
        let cols = a.valid.saturating_sub(8 * h).min(8);
        for c in 0..C {
            let dst = a.out.add((c0 + c) * a.n + 8 * h);
            if cols == 8 {
                _mm256_storeu_ps(dst, acc[c]);
            } else {
                let mut tmp = [0.0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), acc[c]);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, cols);
            }
        }
    }

    /// Activation rows `c0..c0 + C` against rows `8h..8h + 8` of the panel,
    /// `Int8` activations. Q4: `vpmaddubsw` of the unsigned nibbles and the
    /// signed bytes; the eight products of a block (at most 8 x 2 x 15 x
    /// 128 = 30720) add up in i16 and `vpmaddwd` widens once. Q8_0:
    /// `vpmaddubsw(|w|, sign(w) x)` (at most 2 x 128 x 127), widened per
    /// group. Every integer sum is exact, as in the scalar definition.
    ///
    /// # Safety
    /// As [`panel`]; rows `c0..c0 + C` exist; `h` is 0 or 1.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const KIND: u8, const C: usize, const HN: usize>(
        a: &Args,
        c0: usize,
        h0: usize,
    ) {
        let qb = if KIND == Q8_0 { 512 } else { 256 };
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut accs = [[_mm256_setzero_ps(); C]; HN];
        for b in 0..a.nb {
            let rec = a.w.add(b * a.per);
            prefetch(a, rec, h0, qb / 64 + 1);
            for (hh, acc) in accs.iter_mut().enumerate() {
                let h = h0 + hh;
                let mut isum = [_mm256_setzero_si256(); C];
                if KIND == Q8_0 {
                    for j in 0..8 {
                        let v = _mm256_load_si256(rec.add(64 * j + 32 * h) as *const __m256i);
                        let av = _mm256_abs_epi8(v);
                        for c in 0..C {
                            let xb = _mm256_sign_epi8(bcast4(a, c0 + c, b * QK + 4 * j), v);
                            let p16 = _mm256_maddubs_epi16(av, xb);
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p16, ones));
                        }
                    }
                } else {
                    let mut s16 = [_mm256_setzero_si256(); C];
                    for j in 0..4 {
                        let v = _mm256_load_si256(rec.add(64 * j + 32 * h) as *const __m256i);
                        let lo = _mm256_and_si256(v, low);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                        for c in 0..C {
                            let xl = bcast4(a, c0 + c, b * QK + 4 * j);
                            let xh = bcast4(a, c0 + c, b * QK + 16 + 4 * j);
                            s16[c] = _mm256_add_epi16(s16[c], _mm256_maddubs_epi16(lo, xl));
                            s16[c] = _mm256_add_epi16(s16[c], _mm256_maddubs_epi16(hi, xh));
                        }
                    }
                    for c in 0..C {
                        isum[c] = _mm256_madd_epi16(s16[c], ones);
                    }
                }
                let dw = halves(rec, qb + 16 * h);
                for c in 0..C {
                    let blk = (c0 + c) * a.nb + b;
                    let mut is = isum[c];
                    if KIND == Q4_0 {
                        is = _mm256_sub_epi32(is, _mm256_set1_epi32(8 * *a.sum.add(blk)));
                    }
                    let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.add(blk)));
                    acc[c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(is), acc[c]);
                    if KIND == Q4_1 {
                        let mw = halves(rec, qb + 32 + 16 * h);
                        acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*a.s.add(blk)), acc[c]);
                    }
                }
            }
        }
        for (hh, acc) in accs.iter().enumerate() {
            store::<C>(a, c0, h0 + hh, acc);
        }
    }

    /// [`tile`] for `F32` activations: each 4-element group's weights are
    /// widened to f32 once and multiplied with every activation row of the
    /// tile, in the order of the scalar definition.
    ///
    /// # Safety
    /// As [`tile`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_f32<const KIND: u8, const C: usize, const HN: usize>(
        a: &Args,
        c0: usize,
        h0: usize,
    ) {
        let qb = if KIND == Q8_0 { 512 } else { 256 };
        let low = _mm256_set1_epi32(0x0F);
        let mut accs = [[_mm256_setzero_ps(); C]; HN];
        for b in 0..a.nb {
            let rec = a.w.add(b * a.per);
            prefetch(a, rec, h0, qb / 64 + 1);
            for (hh, acc) in accs.iter_mut().enumerate() {
                let h = h0 + hh;
                let xat =
                    |c: usize, e: usize| _mm256_set1_ps(*a.x.add(((c0 + c) * a.nb + b) * QK + e));
                let mut bs = [[_mm256_setzero_ps(); 2]; C];
                if KIND == Q8_0 {
                    for j in 0..8 {
                        let v = _mm256_load_si256(rec.add(64 * j + 32 * h) as *const __m256i);
                        for t in 0..4u32 {
                            let up = _mm256_sllv_epi32(v, _mm256_set1_epi32(24 - 8 * t as i32));
                            let wv = _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(up));
                            for c in 0..C {
                                bs[c][j % 2] =
                                    _mm256_fmadd_ps(wv, xat(c, 4 * j + t as usize), bs[c][j % 2]);
                            }
                        }
                    }
                } else {
                    for j in 0..4 {
                        let v = _mm256_load_si256(rec.add(64 * j + 32 * h) as *const __m256i);
                        for t in 0..4u32 {
                            let sh = _mm256_srlv_epi32(v, _mm256_set1_epi32(8 * t as i32));
                            let lo = _mm256_cvtepi32_ps(_mm256_and_si256(sh, low));
                            let hi = _mm256_cvtepi32_ps(_mm256_and_si256(
                                _mm256_srli_epi32::<4>(sh),
                                low,
                            ));
                            for c in 0..C {
                                bs[c][0] =
                                    _mm256_fmadd_ps(lo, xat(c, 4 * j + t as usize), bs[c][0]);
                                bs[c][1] =
                                    _mm256_fmadd_ps(hi, xat(c, 16 + 4 * j + t as usize), bs[c][1]);
                            }
                        }
                    }
                }
                let dw = halves(rec, qb + 16 * h);
                for c in 0..C {
                    let sx = *a.s.add((c0 + c) * a.nb + b);
                    let mut v = _mm256_add_ps(bs[c][0], bs[c][1]);
                    if KIND == Q4_0 {
                        v = _mm256_sub_ps(v, _mm256_set1_ps(8.0 * sx));
                    }
                    acc[c] = _mm256_fmadd_ps(dw, v, acc[c]);
                    if KIND == Q4_1 {
                        let mw = halves(rec, qb + 32 + 16 * h);
                        acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), acc[c]);
                    }
                }
            }
        }
        for (hh, acc) in accs.iter().enumerate() {
            store::<C>(a, c0, h0 + hh, acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant_q8::quantize_rows;
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

    /// Random rows with small random f16 scales (and negative mins).
    fn random_w(scheme: QuantScheme, n: usize, k: usize, rng: &mut Lcg) -> Vec<u8> {
        let rb = scheme.row_bytes(k).unwrap();
        let mut w: Vec<u8> = (0..n * rb).map(|_| rng.next() as u8).collect();
        for blk in w.chunks_exact_mut(scheme.block_bytes()) {
            let v = 0.001 + (rng.next() % 1000) as f32 * 6e-5;
            blk[..2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            if scheme == QuantScheme::Q4_1 {
                blk[2..4].copy_from_slice(&half::f16::from_f32(-4.0 * v).to_bits().to_le_bytes());
            }
        }
        w
    }

    /// The exact product of the activations (rounded for `Int8`) and the
    /// dequantized weights, in f64.
    fn exact(
        scheme: QuantScheme,
        act: ActivationPrecision,
        x: &[f32],
        m: usize,
        w: &[u8],
        n: usize,
    ) -> Vec<f64> {
        let k = x.len() / m;
        let xh = match act {
            ActivationPrecision::Int8 => quantize_rows(x, m, k, false).dequantize(),
            ActivationPrecision::F32 => x.to_vec(),
        };
        let rb = scheme.row_bytes(k).unwrap();
        let mut wf = vec![0.0f32; k];
        let mut want = vec![0.0f64; m * n];
        for j in 0..n {
            dequantize(GgmlType::from(scheme), &w[j * rb..(j + 1) * rb], k, &mut wf).unwrap();
            for i in 0..m {
                want[i * n + j] = (0..k)
                    .map(|e| f64::from(xh[i * k + e]) * f64::from(wf[e]))
                    .sum();
            }
        }
        want
    }

    #[test]
    fn every_path_matches_the_exact_product_and_the_scalar_bits() {
        let mut rng = Lcg(17);
        let paths = PanelPath::available();
        println!("panel kernels checked on this CPU: {paths:?}");
        for scheme in SCHEMES {
            for (m, n, k) in [
                (1, 16, 32),
                (1, 37, 576),
                (1, 100, 96),
                (1, 64, 64),
                (2, 24, 64),
                (3, 50, 96),
                (8, 16, 64),
                (13, 33, 160),
                (16, 40, 96),
                (37, 50, 160),
                (48, 33, 64),
            ] {
                let w = random_w(scheme, n, k, &mut rng);
                let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 2.0).collect();
                let panels = QuantPanels::pack(scheme, &w, n, k).unwrap();
                for act in [ActivationPrecision::Int8, ActivationPrecision::F32] {
                    let want = exact(scheme, act, &x, m, &w, n);
                    let mut first: Option<Vec<u32>> = None;
                    for &path in &paths {
                        for parallel in [false, true] {
                            let mut out = vec![f32::NAN; m * n];
                            panels
                                .matmul_path(act, &x, m, &mut out, parallel, path)
                                .unwrap();
                            for (i, (&g, &e)) in out.iter().zip(&want).enumerate() {
                                let tol = 1e-4 * (1.0 + e.abs());
                                assert!(
                                (f64::from(g) - e).abs() <= tol,
                                "{scheme:?} {act:?} m={m} n={n} k={k} {path:?} [{i}]: {g} vs {e}"
                            );
                            }
                            let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                            match &first {
                                None => first = Some(bits),
                                Some(f) => {
                                    assert_eq!(f, &bits, "{scheme:?} {act:?} {path:?} m={m} n={n}")
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Within f32 rounding of the row-at-a-time integer kernels.
    #[test]
    fn agrees_with_the_gguf_layout_kernels() {
        let mut rng = Lcg(3);
        for scheme in SCHEMES {
            let (m, n, k) = (5, 40, 192);
            let w = random_w(scheme, n, k, &mut rng);
            let x: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
            let mut a = vec![0.0f32; m * n];
            let mut b = vec![0.0f32; m * n];
            QuantPanels::pack(scheme, &w, n, k)
                .unwrap()
                .matmul(ActivationPrecision::Int8, &x, m, &mut a, true)
                .unwrap();
            crate::kernels::quant::dequant_matmul_act(
                scheme,
                rlx_ir::ActivationPrecision::Int8,
                &x,
                m,
                k,
                &w,
                n,
                &mut b,
                true,
            )
            .unwrap();
            for (i, (u, v)) in a.iter().zip(&b).enumerate() {
                assert!(
                    (u - v).abs() <= 1e-4 * (1.0 + v.abs()),
                    "{scheme:?} [{i}] {u} vs {v}"
                );
            }
        }
    }

    /// The dequantizing prefill path is `gemm_packed` over the GGUF
    /// weights dequantized by `rlx_formats`, bit for bit: every panel's
    /// floats (vector and scalar), and the product over shapes with a
    /// ragged last panel, several chunks per task, a K split into blocks
    /// and more rows than one row block.
    #[test]
    fn dequantized_prefill_has_the_bits_of_the_f32_gemm_over_dequantized_weights() {
        use crate::kernels::packed_gemm::{gemm_packed, PackedB};
        let mut rng = Lcg(29);
        for scheme in SCHEMES {
            for (m, n, k) in [(33, 40, 96), (40, 200, 576), (130, 72, 1024), (97, 16, 64)] {
                let w = random_w(scheme, n, k, &mut rng);
                let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 2.0).collect();
                let panels = QuantPanels::pack(scheme, &w, n, k).unwrap();
                let mut wf = vec![0.0f32; n * k];
                dequantize(GgmlType::from(scheme), &w, n * k, &mut wf).unwrap();
                for p in 0..n.div_ceil(PANEL) {
                    for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                        if !isa.supported() {
                            continue;
                        }
                        let mut got = vec![f32::NAN; k * PANEL];
                        panels.dequant_panel_isa(isa, p, &mut got);
                        for (i, v) in got.iter().enumerate() {
                            let (e, j) = (i / PANEL, p * PANEL + i % PANEL);
                            let at = format!("{scheme:?} {isa:?} panel {p} [{i}]");
                            if j >= n {
                                // Padding rows: zero scales give (-)0.
                                assert!(*v == 0.0, "{at}");
                            } else {
                                assert_eq!(v.to_bits(), wf[j * k + e].to_bits(), "{at}");
                            }
                        }
                    }
                }
                let mut b = PackedB::empty();
                b.repack_strided(&wf, k, n, 1, k).unwrap();
                let mut want = vec![0.0f32; m * n];
                gemm_packed(m, &x, k, &b, &mut want, n, None, None, false).unwrap();
                for parallel in [false, true] {
                    let mut got = vec![f32::NAN; m * n];
                    panels.matmul_dequant(&x, m, &mut got, parallel).unwrap();
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{scheme:?} m={m} n={n} k={k} [{i}]"
                        );
                    }
                }
                let mut short = vec![0.0f32; m * n - 1];
                assert!(panels.matmul_dequant(&x, m, &mut short, true).is_err());
            }
        }
    }

    #[test]
    fn activations_rounded_in_parallel_have_the_bits_of_quantize_rows() {
        let mut rng = Lcg(11);
        for (m, k) in [(1, 576), (37, 1536), (128, 576)] {
            let mut x: Vec<f32> = (0..m * k).map(|_| rng.f() * 2.0).collect();
            x[(m - 1) * k + 3] = f32::NAN;
            let want = quantize_rows(&x, m, k, crate::kernels::quant_q8::has_avx2());
            for shift in [false, true] {
                let got = Int8Acts::new(&x, m, k, shift);
                let q: Vec<i8> = if shift {
                    want.qs.iter().map(|&v| (v as u8 ^ 0x80) as i8).collect()
                } else {
                    want.qs.clone()
                };
                assert_eq!(got.q, q, "m {m} k {k} shift {shift}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.d), bits(&want.d));
                assert_eq!(bits(&got.s), bits(&want.s));
                let sums: Vec<i32> = want
                    .qs
                    .chunks_exact(QK)
                    .map(|b| b.iter().map(|&v| i32::from(v)).sum())
                    .collect();
                assert_eq!(got.sum, sums);
            }
        }
    }

    #[test]
    fn a_nan_activation_block_gives_nan_and_bad_sizes_are_errors() {
        let mut rng = Lcg(9);
        let (n, k) = (20, 64);
        let w = random_w(QuantScheme::Q4_1, n, k, &mut rng);
        let p = QuantPanels::pack(QuantScheme::Q4_1, &w, n, k).unwrap();
        let mut x = vec![0.5f32; 2 * k];
        x[k + 40] = f32::NAN;
        for path in PanelPath::available() {
            let mut out = vec![0.0f32; 2 * n];
            p.matmul_path(ActivationPrecision::Int8, &x, 2, &mut out, false, path)
                .unwrap();
            assert!(out[..n].iter().all(|v| v.is_finite()));
            assert!(out[n..].iter().all(|v| v.is_nan()), "{path:?}");
        }
        let mut out = vec![0.0f32; n];
        assert!(p
            .matmul(ActivationPrecision::F32, &x, 1, &mut out, false)
            .is_err());
        assert!(QuantPanels::pack(QuantScheme::Q4_1, &w[1..], n, k).is_err());
        assert!(QuantPanels::pack(QuantScheme::Q6K, &w, n, k).is_err());
        assert!(QuantPanels::pack(QuantScheme::Q4_1, &w, n, 48).is_err());
    }
}
