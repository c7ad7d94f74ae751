//! f32 GEMM against a right-hand side packed once: `C = A x B (+ bias, act)`.
//!
//! Weights are constants, so packing them on every call (what a general
//! GEMM must do) is wasted memory traffic. [`PackedB`] stores `B [k, n]` as
//! column panels of [`NR`] = 16 floats, each panel `k` rows deep and
//! 64-byte aligned, so the micro-kernel streams one cache line per `k` step.
//! A is read in place (row-major with any row stride): the kernel broadcasts
//! one element per row, so packing A would buy nothing at the sizes of
//! transformer layers.
//!
//! Blocking follows the usual three levels: a `KC x 16` panel slice stays in
//! L1 while every 6-row tile of an `MC`-row block of A streams past it, and
//! that `MC x KC` block of A stays in L2 while the panels of one task go by.
//! Work is split into (panel group, row block) tasks ordered panel-group
//! major, so with two threads each thread owns half of the weight's columns
//! and reads the whole of A; with many rows the row blocks interleave.
//!
//! The bias and activation epilogue runs on each finished tile while it is
//! still in L1.

use super::elementwise::apply_activation;
use super::{bad_shape, exact_len, need_len, num_threads, KernelError};
use crate::isa::Isa;
use rayon::prelude::*;
use rlx_ir::Activation;

const OP: &str = "MatMul";

/// Columns per packed panel (two AVX2 vectors).
pub const NR: usize = 16;
/// Rows per micro-tile.
const MR: usize = 6;
/// Depth of one K block.
const KC: usize = 256;
/// Rows per task (a multiple of MR).
const MC: usize = 96;
/// Panels per task.
const PANELS_PER_TASK: usize = 8;
/// Below this many multiply-adds one thread does the whole product.
const PAR_MIN_MACS: usize = 1 << 17;

/// Rows ahead that a strided repack prefetches: attention reads one head's
/// columns out of rows a page or more apart (a packed QKV buffer), where
/// the hardware prefetchers do not follow.
const PREFETCH_ROWS: usize = 8;

/// Hint the caches to fetch the `len` floats at `p`. Only a hint: it never
/// faults and reads nothing, so any address may be passed.
#[inline(always)]
pub(crate) fn prefetch(p: *const f32, len: usize) {
    prefetch_hint::<{ HINT_T0 }>(p, len);
}

/// [`prefetch`] into L2 only (`prefetcht1`): data for work that starts
/// later, which should not push the running work's lines out of L1.
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const f32, len: usize) {
    prefetch_hint::<{ HINT_T1 }>(p, len);
}

#[cfg(target_arch = "x86_64")]
const HINT_T0: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const HINT_T1: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const HINT_T0: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const HINT_T1: i32 = 0;

/// One `_mm_prefetch` with `HINT` per cache line of the `len` floats at `p`.
#[inline(always)]
fn prefetch_hint<const HINT: i32>(p: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for e in (0..len).step_by(16) {
        // SAFETY: a prefetch is a hint that never faults, whatever the
        // address, and the SSE it needs is part of x86-64.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p.wrapping_add(e).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// That `B[p, j] = b[p * rs + j * cs]` for `p < k`, `j < n` lies inside `b`.
fn check_extent(b: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> Result<(), KernelError> {
    if k > 0 && n > 0 {
        let last = (k - 1)
            .checked_mul(rs)
            .and_then(|x| x.checked_add((n - 1).checked_mul(cs)?))
            .ok_or_else(|| bad_shape(OP, "B extent overflows"))?;
        need_len(OP, "B", b.len(), last + 1)?;
    }
    Ok(())
}

/// One 16-float panel row, aligned to a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PanelRow([f32; NR]);

// SAFETY: 16 f32 fill the 64 bytes exactly (no padding), and any bits are
// a valid value.
unsafe impl bytemuck::Zeroable for PanelRow {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl bytemuck::Pod for PanelRow {}

/// One panel row stored as 16 IEEE half floats (bit patterns), aligned to
/// half a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct PanelRowF16([u16; NR]);

/// Two consecutive rows (`k` and `k + 1`) of one panel as bf16, interleaved
/// per column (`[2j] = B[k, j]`, `[2j + 1] = B[k + 1, j]`): the operand
/// layout of `vdpbf16ps`. One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PanelPairBf16([u16; 2 * NR]);

/// A `[k, n]` right-hand side packed for [`gemm_packed`].
#[derive(Clone)]
pub struct PackedB {
    k: usize,
    n: usize,
    /// `rows[panel * k + p]` holds `B[p, panel * 16 .. panel * 16 + 16]`,
    /// zero past column `n`. Empty when the packing is f16.
    rows: Vec<PanelRow>,
    /// The same layout in f16 (see [`PackedB::to_f16`]); empty for f32.
    half: Vec<PanelRowF16>,
    /// Row pairs in bf16 (see [`PackedB::to_bf16`]):
    /// `pairs[panel * k.div_ceil(2) + q]` holds rows `2q, 2q + 1` (a zero
    /// row past `k`). Empty unless the packing is bf16.
    pairs: Vec<PanelPairBf16>,
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedB [{}, {}]", self.k, self.n)
    }
}

impl PackedB {
    /// Pack a row-major `[k, n]` matrix with row stride `ldb`.
    pub fn pack(b: &[f32], k: usize, n: usize, ldb: usize) -> Result<PackedB, KernelError> {
        if ldb < n {
            return Err(bad_shape(OP, format!("B row stride {ldb} < n {n}")));
        }
        let mut packed = PackedB::empty();
        packed.repack_strided(b, k, n, ldb, 1)?;
        Ok(packed)
    }

    /// Re-fill with `B[p, j] = b[p * rs + j * cs]` (`k x n`), reusing the
    /// allocation: e.g. `K^T` of one attention head is `rs = 1`, `cs` = the
    /// key row stride.
    pub fn repack_strided(
        &mut self,
        b: &[f32],
        k: usize,
        n: usize,
        rs: usize,
        cs: usize,
    ) -> Result<(), KernelError> {
        check_extent(b, k, n, rs, cs)?;
        let panels = n.div_ceil(NR);
        self.k = k;
        self.n = n;
        self.half.clear();
        self.pairs.clear();
        // Every lane below n is written below; only the last panel's pad
        // lanes need zeros (the old contents are not cleared: attention
        // repacks per head).
        self.rows.resize(panels * k, PanelRow([0.0; NR]));
        self.rows.truncate(panels * k);
        if !n.is_multiple_of(NR) {
            let (panel, w) = (panels - 1, n % NR);
            for row in &mut self.rows[panel * k..] {
                row.0[w..].fill(0.0);
            }
        }
        for panel in 0..panels {
            let j0 = panel * NR;
            let w = NR.min(n - j0);
            let dst = &mut self.rows[panel * k..(panel + 1) * k];
            if cs == 1 {
                for (p, row) in dst.iter_mut().enumerate() {
                    prefetch(b.as_ptr().wrapping_add((p + PREFETCH_ROWS) * rs + j0), w);
                    if w == NR {
                        // A whole panel row: a fixed-size copy, inlined
                        // (a memcpy call per row cost as much as the copy).
                        row.0 = b[p * rs + j0..p * rs + j0 + NR]
                            .try_into()
                            .expect("NR floats");
                    } else {
                        row.0[..w].copy_from_slice(&b[p * rs + j0..p * rs + j0 + w]);
                    }
                }
            } else if rs == 1 {
                // A transposed read (K^T of a head): column j is contiguous
                // in b, so walk it and scatter into lane j of each row.
                for j in 0..w {
                    prefetch(b.as_ptr().wrapping_add((j0 + j + PREFETCH_ROWS) * cs), k);
                    let col = &b[(j0 + j) * cs..(j0 + j) * cs + k];
                    for (row, &x) in dst.iter_mut().zip(col) {
                        row.0[j] = x;
                    }
                }
            } else {
                for (p, row) in dst.iter_mut().enumerate() {
                    for (j, x) in row.0[..w].iter_mut().enumerate() {
                        *x = b[p * rs + (j0 + j) * cs];
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Self::repack_strided`] straight into bf16 row pairs (the layout of
    /// [`Self::to_bf16`], every element rounded by [`bf16_bits`]), reusing
    /// the allocation: attention's `K^T` and `V` per head in bf16 mode.
    pub fn repack_strided_bf16(
        &mut self,
        b: &[f32],
        k: usize,
        n: usize,
        rs: usize,
        cs: usize,
    ) -> Result<(), KernelError> {
        check_extent(b, k, n, rs, cs)?;
        let (panels, kp) = (n.div_ceil(NR), k.div_ceil(2));
        self.k = k;
        self.n = n;
        self.rows.clear();
        self.half.clear();
        self.pairs.resize(panels * kp, PanelPairBf16([0; 2 * NR]));
        self.pairs.truncate(panels * kp);
        let at = |p: usize, j: usize| {
            if p < k && j < n {
                b[p * rs + j * cs]
            } else {
                0.0
            }
        };
        for panel in 0..panels {
            let j0 = panel * NR;
            let whole = j0 + NR <= n;
            let dst = &mut self.pairs[panel * kp..(panel + 1) * kp];
            if rs == 1 && whole {
                // K^T of a head: column j is key row j, whose elements
                // (2q, 2q + 1) are adjacent: one rounded dword per pair.
                let mut halves = [0u16; 128];
                for j in 0..NR {
                    prefetch(b.as_ptr().wrapping_add((j0 + j + PREFETCH_ROWS) * cs), k);
                    let col = &b[(j0 + j) * cs..(j0 + j) * cs + k];
                    for (q0, chunk) in col.chunks(128).enumerate() {
                        let got = chunk.len().div_ceil(2);
                        round_bf16(chunk, &mut halves[..2 * got]);
                        for (pair, two) in dst[q0 * 64..].iter_mut().zip(halves.chunks_exact(2)) {
                            pair.0[2 * j] = two[0];
                            pair.0[2 * j + 1] = two[1];
                        }
                    }
                }
                continue;
            }
            if cs == 1 && whole {
                // Row-major rows (V of a head): rows 2q and 2q + 1 give
                // one cache line of pairs.
                let zero = [0f32; NR];
                for (q, pair) in dst.iter_mut().enumerate() {
                    prefetch(
                        b.as_ptr().wrapping_add((2 * q + PREFETCH_ROWS) * rs + j0),
                        NR,
                    );
                    prefetch(
                        b.as_ptr()
                            .wrapping_add((2 * q + 1 + PREFETCH_ROWS) * rs + j0),
                        NR,
                    );
                    let row = |p: usize| -> &[f32] {
                        if p < k {
                            &b[p * rs + j0..p * rs + j0 + NR]
                        } else {
                            &zero
                        }
                    };
                    interleave_bf16(row(2 * q), row(2 * q + 1), &mut pair.0);
                }
                continue;
            }
            for (q, pair) in dst.iter_mut().enumerate() {
                for j in 0..NR {
                    pair.0[2 * j] = bf16_bits(at(2 * q, j0 + j));
                    pair.0[2 * j + 1] = bf16_bits(at(2 * q + 1, j0 + j));
                }
            }
        }
        Ok(())
    }

    /// Re-fill as an f32 packing of a `[k, n]` B written by `fill`, which
    /// gets the panels as floats, `B[p, 16 q + j]` at `(q * k + p) * 16 + j`,
    /// and must write every one of them (columns past `n` may hold any
    /// finite value: no product reads them into C). The allocation only
    /// grows, so a scratch packing refilled for products of different
    /// shapes stops allocating once it has held the largest.
    pub(crate) fn refill_f32(&mut self, k: usize, n: usize, fill: impl FnOnce(&mut [f32])) {
        self.half.clear();
        self.pairs.clear();
        let len = n.div_ceil(NR) * k;
        if self.rows.len() < len {
            self.rows.resize(len, PanelRow([0.0; NR]));
        }
        (self.k, self.n) = (k, n);
        fill(bytemuck::cast_slice_mut(&mut self.rows[..len]));
    }

    /// An empty packing to [`Self::repack_strided`] into.
    pub fn empty() -> PackedB {
        PackedB {
            k: 0,
            n: 0,
            rows: Vec::new(),
            half: Vec::new(),
            pairs: Vec::new(),
        }
    }

    /// The same matrix with every element rounded to IEEE f16 (round to
    /// nearest even; magnitudes beyond 65504 become infinite). Half the
    /// bytes: the micro-kernel widens each panel row back to f32 as it
    /// loads it, so products still accumulate in f32.
    pub fn to_f16(&self) -> PackedB {
        if self.is_f16() {
            return self.clone();
        }
        let half = self
            .rows
            .iter()
            .map(|r| PanelRowF16(r.0.map(|x| half::f16::from_f32(x).to_bits())))
            .collect();
        PackedB {
            k: self.k,
            n: self.n,
            rows: Vec::new(),
            half,
            pairs: Vec::new(),
        }
    }

    /// The same matrix in bf16 for [`gemm_packed`]'s bf16 mode: every
    /// weight rounded to bf16 (nearest even, subnormals to zero: what
    /// `vcvtneps2bf16` does), and the activations multiplied with it are
    /// rounded the same way per call. Products are exact in f32 and
    /// accumulate in f32 in `vdpbf16ps`'s order (see [`bf16_bits`] and
    /// `Job::block_bf16`). Half the f32 bytes. Made from an f32 packing (an
    /// f16 one is widened first).
    pub fn to_bf16(&self) -> PackedB {
        if self.is_bf16() {
            return self.clone();
        }
        let (k, kp, panels) = (self.k, self.k.div_ceil(2), self.n.div_ceil(NR));
        let row = |panel: usize, p: usize| -> [f32; NR] {
            if p >= k {
                [0.0; NR]
            } else if self.is_f16() {
                self.half[panel * k + p]
                    .0
                    .map(|h| half::f16::from_bits(h).to_f32())
            } else {
                self.rows[panel * k + p].0
            }
        };
        let mut pairs = Vec::with_capacity(panels * kp);
        for panel in 0..panels {
            for q in 0..kp {
                let (lo, hi) = (row(panel, 2 * q), row(panel, 2 * q + 1));
                let mut pair = [0u16; 2 * NR];
                for j in 0..NR {
                    pair[2 * j] = bf16_bits(lo[j]);
                    pair[2 * j + 1] = bf16_bits(hi[j]);
                }
                pairs.push(PanelPairBf16(pair));
            }
        }
        PackedB {
            k,
            n: self.n,
            rows: Vec::new(),
            half: Vec::new(),
            pairs,
        }
    }

    /// Whether the panels are stored as bf16 row pairs.
    pub fn is_bf16(&self) -> bool {
        !self.pairs.is_empty()
    }

    /// Whether the panels are stored as f16.
    pub fn is_f16(&self) -> bool {
        !self.half.is_empty()
    }

    /// Rows of B (the shared dimension).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of B.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Bytes held by the packed copy.
    pub fn bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<PanelRow>()
            + self.half.len() * std::mem::size_of::<PanelRowF16>()
            + self.pairs.len() * std::mem::size_of::<PanelPairBf16>()
    }

    /// Rows `p0..p0 + len` of one panel (f32 or f16 storage).
    fn panel_rows(&self, panel: usize, p0: usize, len: usize) -> Panel<'_> {
        let at = panel * self.k + p0;
        if self.is_f16() {
            Panel::F16(&self.half[at..at + len])
        } else {
            Panel::F32(&self.rows[at..at + len])
        }
    }
}

/// A slice of one panel's rows, in its storage type.
#[derive(Clone, Copy)]
enum Panel<'a> {
    F32(&'a [PanelRow]),
    F16(&'a [PanelRowF16]),
}

/// `C[m, n] = A[m, k] x B (+ bias) (then act)`, A row-major with row stride
/// `lda`, C row-major with row stride `ldc`. C's old contents are never read.
/// `parallel` lets the product use the rayon pool.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    bias: Option<&[f32]>,
    act: Option<Activation>,
    parallel: bool,
) -> Result<(), KernelError> {
    gemm_packed_with(Isa::active(), m, a, lda, b, c, ldc, bias, act, parallel)
}

/// [`gemm_packed`] with the micro-kernels of `isa` (tests and A/B runs). Every
/// variant computes each element with the same fused multiply-adds in the
/// same order (p ascending), so all give the same bits. An `isa` the CPU
/// cannot run falls back to the active one.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_with(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    bias: Option<&[f32]>,
    act: Option<Activation>,
    parallel: bool,
) -> Result<(), KernelError> {
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if ldc < n {
        return Err(bad_shape(OP, format!("C row stride {ldc} < n {n}")));
    }
    need_len(OP, "C", c.len(), (m - 1) * ldc + n)?;
    check_a_bias(m, a, lda, b, bias)?;
    let isa = if isa.supported() { isa } else { Isa::active() };
    let threads = if parallel && m * n * k.max(1) >= PAR_MIN_MACS {
        num_threads()
    } else {
        1
    };
    let win = Window {
        pan0: 0,
        n,
        c,
        ldc,
        bias,
    };
    if !b.is_bf16() || k == 0 {
        run_window(isa, m, a, lda, &[], b, win, act, threads);
        return Ok(());
    }
    with_rounded_a(m, a, lda, k, threads, |a16| {
        run_window(isa, m, a, lda, a16, b, win, act, threads)
    });
    Ok(())
}

/// `C[m, n] = A[m, k] x B` (C row-major, its old contents never read) for
/// a B made per call a chunk of columns at a time: the dequantized weights
/// of a quantized matmul. `make(j0, j1, packing, buf)` fills `packing` with
/// B's columns `j0..j1` (a multiple of 16 apart but for the last), `buf`
/// being float scratch it may use. C splits into [`PanelSplit`] tasks on
/// `threads` threads; each makes its columns `chunk` panels at a time into
/// this thread's scratch (reused across calls) and multiplies its rows
/// against them in place, so B is never whole in memory and C needs no
/// copy. The same bits as [`gemm_packed`] over the whole B.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_chunked_b(
    m: usize,
    a: &[f32],
    k: usize,
    n: usize,
    c: &mut [f32],
    threads: usize,
    chunk: usize,
    make: impl Fn(usize, usize, &mut PackedB, &mut Vec<f32>) -> Result<(), KernelError> + Sync,
) -> Result<(), KernelError> {
    exact_len(OP, "A", a.len(), m * k)?;
    exact_len(OP, "C", c.len(), m * n)?;
    let split = PanelSplit::new(m, n.div_ceil(NR), threads);
    let chunk = chunk.max(1);
    let cptr = SharedC(c.as_mut_ptr());
    split.run(|t| {
        let ((r0, r1), (p0, p1)) = split.task(t);
        for c0 in (p0..p1).step_by(chunk) {
            let (j0, j1) = (c0 * NR, ((c0 + chunk).min(p1) * NR).min(n));
            with_scratch(|b, buf| {
                make(j0, j1, b, buf)?;
                if (b.k, b.n) != (k, j1 - j0) {
                    return Err(bad_shape(OP, "a made chunk of B has the wrong shape"));
                }
                // SAFETY: tasks cover disjoint (row range, column range)
                // rectangles of C, so this one alone writes rows `r0..r1`,
                // columns `j0..j1`; C holds `m * n` floats (checked above)
                // and is borrowed exclusively for the call.
                unsafe {
                    gemm_packed_serial_into(
                        r1 - r0,
                        &a[r0 * k..r1 * k],
                        k,
                        b,
                        cptr.at(r0 * n + j0),
                        n,
                    )
                }
            })?;
        }
        Ok(())
    })
}

/// [`gemm_packed`] on the calling thread into a C given as a pointer, in
/// row blocks of [`MC`] rows (each block's A stays in L2 while the panels
/// go by), with no bias or activation: the same bits as [`gemm_packed`].
///
/// # Safety
/// `c` points at `m` rows `ldc >= b.n()` floats apart, each with `b.n()`
/// writable floats that no one else reads or writes while this runs.
unsafe fn gemm_packed_serial_into(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: *mut f32,
    ldc: usize,
) -> Result<(), KernelError> {
    if m == 0 || b.n == 0 {
        return Ok(());
    }
    check_a_bias(m, a, lda, b, None)?;
    if b.is_bf16() || ldc < b.n {
        return Err(bad_shape(
            OP,
            "a serial product takes f32 packings and ldc >= n",
        ));
    }
    let job = Job {
        m,
        k: b.k,
        k0: 0,
        pan0: 0,
        n: b.n,
        a,
        lda,
        a16: &[],
        b,
        ldc,
        bias: None,
        act: None,
        isa: Isa::active(),
    };
    for r0 in (0..m).step_by(MC) {
        // SAFETY: rows `r0..` of the caller's C, which the contract makes
        // this call's alone; A was checked above.
        unsafe { job.block(SharedC(c), r0, (r0 + MC).min(m), 0, b.n.div_ceil(NR)) };
    }
    Ok(())
}

/// How [`gemm_chunked_b`] splits C into tasks: one group of 16-column
/// panel pairs per thread, and when there are fewer groups than
/// threads (few columns, many threads) the rows into the number of blocks
/// whose equal tasks take the fewest rounds per unit of work.
#[derive(Debug, Clone, Copy)]
struct PanelSplit {
    m: usize,
    panels: usize,
    /// Panels per group (even, but for the last group).
    per: usize,
    row_blocks: usize,
    groups: usize,
}

impl PanelSplit {
    fn new(m: usize, panels: usize, threads: usize) -> PanelSplit {
        let pairs = panels.div_ceil(2);
        let per = pairs.div_ceil(threads.min(pairs).max(1)) * 2;
        let groups = panels.div_ceil(per);
        // At least 16 rows per block (a GEMM tile is up to 14).
        let most = (m / 16).max(1).min(threads.div_ceil(groups));
        let cost = |r: usize| (groups * r).div_ceil(threads) as f64 / r as f64;
        let row_blocks = (1..=most)
            .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
            .unwrap_or(1);
        PanelSplit {
            m,
            panels,
            per,
            row_blocks,
            groups,
        }
    }

    fn tasks(&self) -> usize {
        self.row_blocks * self.groups
    }

    /// `f(t)` for every task `t`, on the rayon pool when there are
    /// several; the first error.
    fn run(
        &self,
        f: impl Fn(usize) -> Result<(), KernelError> + Sync + Send,
    ) -> Result<(), KernelError> {
        if self.tasks() == 1 {
            f(0)
        } else {
            (0..self.tasks()).into_par_iter().try_for_each(f)
        }
    }

    /// Rows `r0..r1` and panels `p0..p1` of task `t`.
    fn task(&self, t: usize) -> ((usize, usize), (usize, usize)) {
        let (g, rb) = (t / self.row_blocks, t % self.row_blocks);
        let row = |b: usize| self.m * b / self.row_blocks;
        let p0 = g * self.per;
        (
            (row(rb), row(rb + 1)),
            (p0, (p0 + self.per).min(self.panels)),
        )
    }
}

thread_local! {
    /// The calling thread's scratch for products whose right-hand side is
    /// made per call (dequantized weights): a packing and a float buffer.
    static SCRATCH: std::cell::RefCell<(PackedB, Vec<f32>)> =
        std::cell::RefCell::new((PackedB::empty(), Vec::new()));
}

/// Run `f` on this thread's scratch packing and float buffer (both only
/// grow). A task stolen while this one waits inside `f` may call here
/// again on the same thread: it then gets scratch of its own.
fn with_scratch<R>(f: impl FnOnce(&mut PackedB, &mut Vec<f32>) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut own = (PackedB::empty(), Vec::new());
        let mut held = cell.try_borrow_mut();
        let (b, buf) = match held.as_mut() {
            Ok(s) => &mut **s,
            Err(_) => &mut own,
        };
        f(b, buf)
    })
}

/// The checks of a product's `m >= 1` rows of A and its bias.
fn check_a_bias(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    bias: Option<&[f32]>,
) -> Result<(), KernelError> {
    let (k, n) = (b.k, b.n);
    if lda < k {
        return Err(bad_shape(OP, format!("A row stride {lda} < k {k}")));
    }
    if k > 0 {
        need_len(OP, "A", a.len(), (m - 1) * lda + k)?;
    }
    match bias {
        Some(bias) if bias.len() != n => Err(bad_shape(
            OP,
            format!("bias has {} elements, expected n = {n}", bias.len()),
        )),
        _ => Ok(()),
    }
}

/// One output of [`gemm_packed_split`]: columns `col0..col0 + cols` of the
/// product, written to `c` with row stride `ldc`.
#[derive(Debug)]
pub struct ColumnSplit<'c> {
    /// First column of the product (a multiple of [`NR`]).
    pub col0: usize,
    /// Columns written.
    pub cols: usize,
    /// Destination rows.
    pub c: &'c mut [f32],
    /// Row stride of `c` (at least `cols`).
    pub ldc: usize,
}

/// [`gemm_packed`] whose output columns go to separate buffers, one per
/// [`ColumnSplit`], instead of one `[m, n]` C: a fused QKV projection
/// writes q, k and v straight into their own tensors (no copy of three
/// column windows afterwards). Columns no split names are not computed.
/// `bias` (n values) and `act` apply per column as in [`gemm_packed`], so
/// every element has the bits [`gemm_packed`] gives it; bf16 packings
/// round A once for all splits.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_split(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    splits: &mut [ColumnSplit<'_>],
    bias: Option<&[f32]>,
    act: Option<Activation>,
    parallel: bool,
) -> Result<(), KernelError> {
    let (k, n) = (b.k, b.n);
    if m == 0 {
        return Ok(());
    }
    check_a_bias(m, a, lda, b, bias)?;
    for s in splits.iter() {
        if !s.col0.is_multiple_of(NR) || s.col0 + s.cols > n {
            return Err(bad_shape(
                OP,
                format!(
                    "split columns {}+{} outside n = {n} or not on a {NR}-column panel",
                    s.col0, s.cols
                ),
            ));
        }
        if s.cols > 0 {
            if s.ldc < s.cols {
                return Err(bad_shape(
                    OP,
                    format!("split C row stride {} < its {} columns", s.ldc, s.cols),
                ));
            }
            need_len(OP, "split C", s.c.len(), (m - 1) * s.ldc + s.cols)?;
        }
    }
    let isa = Isa::active();
    let cols: usize = splits.iter().map(|s| s.cols).sum();
    let threads = if parallel && m * cols * k.max(1) >= PAR_MIN_MACS {
        num_threads()
    } else {
        1
    };
    let mut run_all = |a16: &[u16]| {
        for s in splits.iter_mut().filter(|s| s.cols > 0) {
            let win = Window {
                pan0: s.col0 / NR,
                n: s.cols,
                c: &mut *s.c,
                ldc: s.ldc,
                bias: bias.map(|v| &v[s.col0..s.col0 + s.cols]),
            };
            run_window(isa, m, a, lda, a16, b, win, act, threads);
        }
    };
    if !b.is_bf16() || k == 0 {
        run_all(&[]);
    } else {
        with_rounded_a(m, a, lda, k, threads, |a16| run_all(a16));
    }
    Ok(())
}

/// Columns `pan0 * NR..pan0 * NR + n` of a product and where they go.
struct Window<'c, 'b> {
    pan0: usize,
    n: usize,
    c: &'c mut [f32],
    ldc: usize,
    /// The window's own `n` bias values.
    bias: Option<&'b [f32]>,
}

/// The tasks of one checked window, on `threads` threads.
#[allow(clippy::too_many_arguments)]
fn run_window(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    a16: &[u16],
    b: &PackedB,
    win: Window<'_, '_>,
    act: Option<Activation>,
    threads: usize,
) {
    let (k, n) = (b.k, win.n);
    if n == 0 {
        return;
    }
    // AMX tiles take whole 16-row blocks (32 at best): row blocks on
    // 32-row boundaries leave no rows to the slower `vdpbf16ps` tiles.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    let granule = if b.is_bf16() && isa == Isa::Avx512 && k.is_multiple_of(32) && amx::usable() {
        32
    } else {
        f32_granule(isa, b)
    };
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    let granule = f32_granule(isa, b);
    let part = Partition::new(m, n.div_ceil(NR), threads, granule);
    let cptr = SharedC(win.c.as_mut_ptr());
    let job = Job {
        m,
        k,
        k0: 0,
        pan0: win.pan0,
        n,
        a,
        lda,
        a16,
        b,
        ldc: win.ldc,
        bias: win.bias,
        act,
        isa,
    };
    let run = |t: usize| {
        let ((r0, r1), (p0, p1)) = part.task(t);
        // SAFETY: tasks cover disjoint (row range, column range)
        // rectangles of the window's C, all inside the extent the caller
        // checked, so no two threads write the same element and nothing
        // else borrows `c` meanwhile (`win` holds it mutably).
        // With rayon's splitting a thread takes consecutive tasks, so task
        // t + 1 is what this thread most likely runs next.
        let then = (t + 1 < part.tasks()).then(|| part.task(t + 1).1 .0);
        unsafe { job.block_then(cptr, r0, r1, p0, p1, then) };
    };
    let tasks = part.tasks();
    if threads > 1 && tasks > 1 {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// Rows a task's row block is a multiple of, outside AMX: the tallest
/// micro-tile, so that only a product's last block has a short tile (on
/// 6-row boundaries, most 12-row AVX-512 blocks ended in a 6-row tile at
/// half the FMA rate).
fn f32_granule(isa: Isa, b: &PackedB) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && !b.is_bf16() {
        return avx512::mr();
    }
    let _ = (isa, b);
    MR
}

/// bf16 products: `f` gets A rounded once per call (a zero pad element for
/// odd k), in this thread's buffer.
fn with_rounded_a(
    m: usize,
    a: &[f32],
    lda: usize,
    k: usize,
    threads: usize,
    f: impl FnOnce(&[u16]),
) {
    with_a16(m, k, |buf| {
        let row16 = 2 * k.div_ceil(2);
        let round = |(r, dst): (usize, &mut [u16])| round_bf16(&a[r * lda..r * lda + k], dst);
        if threads > 1 {
            buf.par_chunks_mut(row16).enumerate().for_each(round);
        } else {
            buf.chunks_mut(row16).enumerate().for_each(round);
        }
        f(buf);
    });
}

/// How C splits into (row block, panel group) tasks.
///
/// Row blocks hold at most [`MC`] rows and panel groups at most
/// [`PANELS_PER_TASK`] panels. With several threads there are at least
/// [`TASKS_PER_THREAD`] tasks per thread and the task count is a multiple
/// of the thread count; rows and panels are spread evenly (block sizes
/// differ by at most one micro-tile or one panel unit), so every thread
/// gets the same work instead of one thread finishing a short row block
/// early.
///
/// AMX jobs split in units of 32 rows and of panel pairs: a tile block is
/// 32 x 32, and a group holding one panel of a pair would run it on the
/// `vdpbf16ps` tiles instead. When the columns run out of pairs before
/// every thread has its tasks, the rows split further (down to one
/// granule per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Partition {
    m: usize,
    /// Row blocks start on multiples of this (the micro-tile height).
    granule: usize,
    panels: usize,
    /// Panel groups start on multiples of this many panels.
    panel_unit: usize,
    row_blocks: usize,
    groups: usize,
}

/// Tasks per thread a parallel product aims for (slack for work stealing).
const TASKS_PER_THREAD: usize = 4;

impl Partition {
    fn new(m: usize, panels: usize, threads: usize, granule: usize) -> Partition {
        let panel_unit = if granule == 32 { 2 } else { 1 };
        let units = panels.div_ceil(panel_unit).max(1);
        let mut row_blocks = m.div_ceil(MC).max(1);
        let mut groups = panels.div_ceil(PANELS_PER_TASK).max(1).min(units);
        if threads > 1 {
            let want = threads * TASKS_PER_THREAD;
            groups = groups.max(want.div_ceil(row_blocks)).min(units);
            if panel_unit > 1 && row_blocks * groups < want {
                row_blocks = want
                    .div_ceil(groups)
                    .min(m.div_ceil(granule))
                    .max(row_blocks);
            }
            while !(row_blocks * groups).is_multiple_of(threads) && groups < units {
                groups += 1;
            }
        }
        Partition {
            m,
            granule,
            panels,
            panel_unit,
            row_blocks,
            groups,
        }
    }

    fn tasks(&self) -> usize {
        self.row_blocks * self.groups
    }

    /// Rows `r0..r1` and panels `p0..p1` of task `t` (panel-group major).
    fn task(&self, t: usize) -> ((usize, usize), (usize, usize)) {
        let (g, rb) = (t / self.row_blocks, t % self.row_blocks);
        let unit = self.granule;
        let tiles = self.m.div_ceil(unit);
        let row = |b: usize| (tiles * b / self.row_blocks * unit).min(self.m);
        let units = self.panels.div_ceil(self.panel_unit);
        let panel = |g: usize| (units * g / self.groups * self.panel_unit).min(self.panels);
        ((row(rb), row(rb + 1)), (panel(g), panel(g + 1)))
    }
}

/// Serial product against a window of a packed B:
/// `C[m, cols] = A[m, k1 - k0] x B[k0..k1, col0..col0 + cols]`, where
/// `col0` is a multiple of [`NR`] and C's row stride is `ldc`. Attention uses
/// it to read only the visible keys of a head packed once.
///
/// With a bf16 packing, A's rows are rounded to bf16 first, as
/// [`gemm_packed`] does, and `k0` must be even (B is stored in row pairs).
/// An odd depth pairs A's last element with a zero, so row `k1` of B (when
/// it exists) is multiplied by zero: it must be finite.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_window(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    (k0, k1): (usize, usize),
    (col0, cols): (usize, usize),
    c: &mut [f32],
    ldc: usize,
) -> Result<(), KernelError> {
    check_window(m, b, (k0, k1), (col0, cols), c.len(), ldc)?;
    let k = k1 - k0;
    if m == 0 || cols == 0 {
        return Ok(());
    }
    if lda < k {
        return Err(bad_shape(OP, format!("A row stride {lda} below k {k}")));
    }
    if k > 0 {
        need_len(OP, "A", a.len(), (m - 1) * lda + k)?;
    }
    if b.is_bf16() && k > 0 {
        with_a16(m, k, |buf| {
            for (r, dst) in buf.chunks_mut(2 * k.div_ceil(2)).enumerate() {
                round_bf16(&a[r * lda..r * lda + k], dst);
            }
            window_job(m, a, lda, buf, b, (k0, k1), (col0, cols), c, ldc);
        });
    } else {
        window_job(m, a, lda, &[], b, (k0, k1), (col0, cols), c, ldc);
    }
    Ok(())
}

/// [`gemm_packed_window`] against a bf16 packing with A already in bf16:
/// row `r` of A at `a16[r * 2 * (k1 - k0).div_ceil(2)..]`, an odd depth's
/// pad element zero (as [`round_bf16`] leaves it). Attention's
/// probabilities take this form, rounded while they are hot.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_window_a16(
    m: usize,
    a16: &[u16],
    b: &PackedB,
    (k0, k1): (usize, usize),
    (col0, cols): (usize, usize),
    c: &mut [f32],
    ldc: usize,
) -> Result<(), KernelError> {
    if !b.is_bf16() {
        return Err(bad_shape(OP, "bf16 activations against an f32 packing"));
    }
    check_window(m, b, (k0, k1), (col0, cols), c.len(), ldc)?;
    let k = k1 - k0;
    if m == 0 || cols == 0 {
        return Ok(());
    }
    need_len(OP, "bf16 A", a16.len(), m * 2 * k.div_ceil(2))?;
    window_job(m, &[], 0, a16, b, (k0, k1), (col0, cols), c, ldc);
    Ok(())
}

/// The checks of a window product that do not concern A.
fn check_window(
    m: usize,
    b: &PackedB,
    (k0, k1): (usize, usize),
    (col0, cols): (usize, usize),
    c_len: usize,
    ldc: usize,
) -> Result<(), KernelError> {
    if b.is_bf16() && k0 % 2 != 0 {
        return Err(bad_shape(
            OP,
            format!("a bf16 window starts on an even row (row pairs), not {k0}"),
        ));
    }
    if k0 > k1 || k1 > b.k || col0 % NR != 0 || col0 + cols > b.n {
        return Err(bad_shape(
            OP,
            format!(
                "window rows {k0}..{k1}, columns {col0}+{cols} outside packed [{}, {}]",
                b.k, b.n
            ),
        ));
    }
    if m == 0 || cols == 0 {
        return Ok(());
    }
    if ldc < cols {
        return Err(bad_shape(
            OP,
            format!("C row stride {ldc} below columns {cols}"),
        ));
    }
    need_len(OP, "C", c_len, (m - 1) * ldc + cols)
}

/// One serial job over all of a checked window's C.
#[allow(clippy::too_many_arguments)]
fn window_job(
    m: usize,
    a: &[f32],
    lda: usize,
    a16: &[u16],
    b: &PackedB,
    (k0, k1): (usize, usize),
    (col0, cols): (usize, usize),
    c: &mut [f32],
    ldc: usize,
) {
    let job = Job {
        m,
        k: k1 - k0,
        k0,
        pan0: col0 / NR,
        n: cols,
        a,
        lda,
        a16,
        b,
        ldc,
        bias: None,
        act: None,
        isa: Isa::active(),
    };
    // SAFETY: one task covering all of C, whose extent the caller checked
    // (`check_window`) and which the `&mut` borrow makes exclusive; A (f32
    // or bf16, whichever the packing reads) was checked by the caller too.
    unsafe { job.block(SharedC(c.as_mut_ptr()), 0, m, 0, cols.div_ceil(NR)) };
}

/// Run `f` on this thread's buffer for `m` rows of `k` activations in
/// bf16, row `r` at `r * 2 * k.div_ceil(2)` (whole 64-byte lines, so that
/// rows of a multiple of 32 elements start on line boundaries, as AMX tile
/// loads read 64-byte rows). A task stolen while this one waits inside `f`
/// may call here again on the same thread: it then uses a buffer of its
/// own.
fn with_a16(m: usize, k: usize, f: impl FnOnce(&mut [u16])) {
    A16.with(|cell| {
        let mut own = Vec::new();
        let mut held = cell.try_borrow_mut();
        let lines = match held.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut own,
        };
        let row16 = 2 * k.div_ceil(2);
        // Grown, never cleared: every caller rounds every element of its
        // rows (pad included) before reading them, and zeroing 400 KB per
        // product on the calling thread cost ~4% of a bf16 MiniLM run.
        let need = (m * row16).div_ceil(32);
        if lines.len() < need {
            lines.resize(need, A16Line([0; 32]));
        }
        f(&mut bytemuck::cast_slice_mut::<A16Line, u16>(lines)[..m * row16]);
    });
}

/// C's base pointer, shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SharedC(*mut f32);
// SAFETY: only used by `gemm_packed_with` and `gemm_chunked_b`, whose tasks
// write disjoint elements of one exclusively borrowed slice.
unsafe impl Send for SharedC {}
// SAFETY: as above.
unsafe impl Sync for SharedC {}

impl SharedC {
    /// The pointer `floats` past the start (closures capture the whole
    /// value through this, not its raw field).
    fn at(self, floats: usize) -> *mut f32 {
        self.0.wrapping_add(floats)
    }
}

struct Job<'a> {
    m: usize,
    /// Depth of the product: B rows `k0..k0 + k`.
    k: usize,
    k0: usize,
    /// C column 0 is B column `pan0 * NR`.
    pan0: usize,
    /// Columns of C.
    n: usize,
    a: &'a [f32],
    lda: usize,
    /// bf16 jobs: A rounded to bf16, row `r` at `r * 2 * k.div_ceil(2)`.
    a16: &'a [u16],
    b: &'a PackedB,
    ldc: usize,
    bias: Option<&'a [f32]>,
    act: Option<Activation>,
    /// Which micro-kernels run (one the CPU supports).
    isa: Isa,
}

impl Job<'_> {
    /// Rows `r0..r1` by panels `p0..p1` of C.
    ///
    /// # Safety
    /// `c` points at a C of the extent checked by `gemm_packed_with`, and no
    /// other thread touches this rectangle while the call runs.
    unsafe fn block(&self, c: SharedC, r0: usize, r1: usize, p0: usize, p1: usize) {
        self.block_then(c, r0, r1, p0, p1, None);
    }

    /// [`Job::block`], where `then` is the first panel of the block this
    /// thread most likely runs next (the next task's): the last panel
    /// pair hints its weights into L2.
    ///
    /// # Safety
    /// As for [`Job::block`].
    unsafe fn block_then(
        &self,
        c: SharedC,
        r0: usize,
        r1: usize,
        p0: usize,
        p1: usize,
        then: Option<usize>,
    ) {
        let k = self.k;
        debug_assert!(r1 <= self.m);
        if k == 0 {
            for panel in p0..p1 {
                let cols = NR.min(self.n - panel * NR);
                for r in r0..r1 {
                    let cp = c.0.add(r * self.ldc + panel * NR);
                    std::slice::from_raw_parts_mut(cp, cols).fill(0.0);
                }
            }
            self.epilogue(c, r0, r1, p0, p1);
            return;
        }
        if self.b.is_bf16() {
            self.block_bf16(c, r0, r1, p0, p1);
            self.epilogue(c, r0, r1, p0, p1);
            return;
        }
        // K blocks of near-equal depth (no thin last block); a depth up to
        // 1.5 KC stays one block.
        let blocks = if k <= KC * 3 / 2 { 1 } else { k.div_ceil(KC) };
        let step = k.div_ceil(blocks);
        let mut pc = 0;
        while pc < k {
            let kc = step.min(k - pc);
            let first = pc == 0;
            let mut panel = p0;
            while panel < p1 {
                #[cfg(target_arch = "x86_64")]
                if self.isa == Isa::Avx512 && panel + 1 < p1 {
                    // The pair after this one in loop order: the next two
                    // panels, else the first two of the next K block, else
                    // those of the next block of work.
                    let next = if panel + 3 < p1 {
                        Some((panel + 2, 2, pc, kc))
                    } else if panel + 2 < p1 {
                        Some((panel + 2, 1, pc, kc))
                    } else if pc + kc < k {
                        Some((p0, 2.min(p1 - p0), pc + kc, step.min(k - pc - kc)))
                    } else {
                        then.map(|t| (t, 2, 0, step.min(k)))
                    };
                    self.pair(c, r0, r1, panel, next, pc, kc, !first);
                    panel += 2;
                    continue;
                }
                let bp = self.b.panel_rows(self.pan0 + panel, self.k0 + pc, kc);
                let cols = NR.min(self.n - panel * NR);
                let mr = self.tile_max_rows();
                let mut r = r0;
                while r < r1 {
                    let rows = tile_rows(r1 - r, mr);
                    let ap = self.a.as_ptr().add(r * self.lda + pc);
                    let cp = c.0.add(r * self.ldc + panel * NR);
                    self.tile(rows, kc, ap, bp, cp, cols, !first);
                    r += rows;
                }
                panel += 1;
            }
            pc += kc;
        }
        self.epilogue(c, r0, r1, p0, p1);
    }

    /// Bias and activation on the finished rows `r0..r1` x panels
    /// `p0..p1` of C, one contiguous row segment at a time (the block is
    /// still in L2, and long rows keep the vectorized activation busy:
    /// per 16-float tile row it ran ~40% slower).
    ///
    /// # Safety
    /// As for [`Job::block`]: the rectangle is this task's alone.
    unsafe fn epilogue(&self, c: SharedC, r0: usize, r1: usize, p0: usize, p1: usize) {
        if self.bias.is_none() && self.act.is_none() {
            return;
        }
        let col0 = p0 * NR;
        let cols = (p1 * NR).min(self.n) - col0;
        for r in r0..r1 {
            let row = std::slice::from_raw_parts_mut(c.0.add(r * self.ldc + col0), cols);
            if let Some(bias) = self.bias {
                for (x, b) in row.iter_mut().zip(&bias[col0..col0 + cols]) {
                    *x += b;
                }
            }
            if let Some(act) = self.act {
                apply_activation(act, row);
            }
        }
    }

    /// [`Job::block`] against bf16 row pairs, reading the activations that
    /// [`gemm_packed_with`] rounded to bf16 once per call (`self.a16`).
    /// Per output element and row pair `(2q, 2q + 1)`, pairs ascending:
    /// `acc += a[2q+1] b[2q+1]`, then `acc += a[2q] b[2q]`, each product
    /// exact in f32 and each sum rounded once: `vdpbf16ps`'s definition
    /// (Intel SDM), which the portable kernel follows, so the two agree bit
    /// for bit except where a sum is subnormal (the instruction flushes it).
    ///
    /// # Safety
    /// As for [`Job::block`]; `self.k0` is even and `a16` holds the
    /// rounded rows (as [`gemm_packed_with`] and [`gemm_packed_window`]
    /// build bf16 jobs).
    unsafe fn block_bf16(&self, c: SharedC, r0: usize, r1: usize, p0: usize, p1: usize) {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if self.isa == Isa::Avx512 && self.k.is_multiple_of(32) && amx::usable() {
            // SAFETY: as for this function; `amx::usable` granted the tile
            // state, and `block_amx` reads and writes what this call may.
            unsafe { self.block_amx(c, r0, r1, p0, p1) };
            return;
        }
        self.block_bf16_vec(c, r0, r1, p0, p1);
    }

    /// [`Job::block_bf16`] on AMX tiles: 32 x 32 (or 16 x 32) blocks of C
    /// over whole panel pairs, the full K in one pass (`tdpbf16ps`: per
    /// output the same exact bf16 products, summed in f32 in the order of
    /// the tile unit, so the bits may differ from `vdpbf16ps`'s in the
    /// last place). Rows past the last whole 16 and a trailing odd or
    /// partial panel take [`Job::block_bf16_vec`].
    ///
    /// # Safety
    /// As [`Job::block_bf16`]; `amx::usable()` is true and `k % 32 == 0`.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    unsafe fn block_amx(&self, c: SharedC, r0: usize, r1: usize, p0: usize, p1: usize) {
        let kp = self.k / 2;
        let lda16 = 2 * kp;
        amx::configure();
        let mut panel = p0;
        while panel + 2 <= p1 && (panel + 2) * NR <= self.n {
            let b0 = self.b.pairs[self.pair_at(panel)..].as_ptr().cast::<u8>();
            let b1 = self.b.pairs[self.pair_at(panel + 1)..]
                .as_ptr()
                .cast::<u8>();
            let mut r = r0;
            while r + 16 <= r1 {
                let tall = r + 32 <= r1;
                let ap = self.a16.as_ptr().add(r * lda16).cast::<u8>();
                let cp = c.0.add(r * self.ldc + panel * NR);
                amx::block(tall, kp, ap, lda16 * 2, b0, b1, cp, self.ldc * 4);
                r += if tall { 32 } else { 16 };
            }
            if r < r1 {
                self.block_bf16_vec(c, r, r1, panel, panel + 2);
            }
            panel += 2;
        }
        amx::release();
        if panel < p1 {
            self.block_bf16_vec(c, r0, r1, panel, p1);
        }
    }

    /// [`Job::block_bf16`] on `vdpbf16ps` tiles (or the portable kernel).
    ///
    /// # Safety
    /// As [`Job::block_bf16`].
    unsafe fn block_bf16_vec(&self, c: SharedC, r0: usize, r1: usize, p0: usize, p1: usize) {
        let kp = self.k.div_ceil(2);
        let blocks = if kp <= KC * 3 / 4 {
            1
        } else {
            kp.div_ceil(KC / 2)
        };
        let step = kp.div_ceil(blocks);
        let lda16 = 2 * kp;
        #[cfg(target_arch = "x86_64")]
        let bf16_hw = self.isa == Isa::Avx512 && crate::isa::CpuFeatures::get().avx512bf16;
        let mut pc = 0;
        while pc < kp {
            let kc2 = step.min(kp - pc);
            let mut panel = p0;
            while panel < p1 {
                let two = panel + 1 < p1;
                let cols = (if two { 2 * NR } else { NR }).min(self.n - panel * NR);
                let b0 = self.b.pairs[self.pair_at(panel) + pc..]
                    .as_ptr()
                    .cast::<u16>();
                let b1 = if two {
                    self.b.pairs[self.pair_at(panel + 1) + pc..]
                        .as_ptr()
                        .cast::<u16>()
                } else {
                    b0
                };
                let mut r = r0;
                while r < r1 {
                    let tr = tile_rows(r1 - r, BF16_MR);
                    let ap = self.a16.as_ptr().add(r * lda16 + 2 * pc);
                    let cp = c.0.add(r * self.ldc + panel * NR);
                    let acc = pc > 0;
                    #[cfg(target_arch = "x86_64")]
                    if bf16_hw {
                        avx512bf16::TILE[tr - 1](kc2, ap, lda16, b0, b1, cp, self.ldc, cols, acc);
                        r += tr;
                        continue;
                    }
                    bf16_tile(tr, kc2, ap, lda16, b0, b1, cp, self.ldc, cols, acc);
                    r += tr;
                }
                panel += if two { 2 } else { 1 };
            }
            pc += kc2;
        }
    }

    /// Index into `self.b.pairs` of this job's first row pair (B row
    /// `k0`, an even row) of C panel `panel`.
    fn pair_at(&self, panel: usize) -> usize {
        (self.pan0 + panel) * self.b.k.div_ceil(2) + self.k0 / 2
    }

    /// Rows of the tallest micro-tile of this ISA.
    fn tile_max_rows(&self) -> usize {
        if self.isa == Isa::Avx512 {
            avx512::mr()
        } else {
            MR
        }
    }

    /// Panels `panel` and `panel + 1` (both inside this task) for rows
    /// `r0..r1` and K slice `pc..pc + kc`, as AVX-512 `R x 32` tiles.
    ///
    /// # Safety
    /// As for [`Job::block`], and the CPU runs AVX-512 (`self.isa`).
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pair(
        &self,
        c: SharedC,
        r0: usize,
        r1: usize,
        panel: usize,
        next: Option<(usize, usize, usize, usize)>,
        pc: usize,
        kc: usize,
        accumulate: bool,
    ) {
        let (b0, b1, table) = match (
            self.b.panel_rows(self.pan0 + panel, self.k0 + pc, kc),
            self.b.panel_rows(self.pan0 + panel + 1, self.k0 + pc, kc),
        ) {
            (Panel::F32(x), Panel::F32(y)) => (
                x.as_ptr().cast::<u8>(),
                y.as_ptr().cast::<u8>(),
                &avx512::PAIR,
            ),
            (Panel::F16(x), Panel::F16(y)) => (
                x.as_ptr().cast::<u8>(),
                y.as_ptr().cast::<u8>(),
                &avx512::PAIR_F16,
            ),
            // One PackedB stores one element type; nothing else is built.
            _ => return,
        };
        let cols = (2 * NR).min(self.n - panel * NR);
        // The next pair's K slice, fetched into L2 a share per row tile:
        // a weight too big for L2 comes from memory, and without this the
        // first tile of every pair waits on it (a MiniLM FFN GEMM with cold
        // weights ran at 57% of its warm speed on 2 threads of a Xeon).
        // `next` is (first panel, panels, K start, K depth) of that pair.
        let mut ahead_at = [std::ptr::null::<u8>(); 2];
        let mut lines = 0;
        let panels = self.b.n.div_ceil(NR);
        if let Some((np, count, npc, nkc)) = next {
            for (slot, p) in ahead_at.iter_mut().zip(np..np + count) {
                if self.pan0 + p >= panels {
                    break;
                }
                let (at, bytes) = match self.b.panel_rows(self.pan0 + p, self.k0 + npc, nkc) {
                    Panel::F32(x) => (x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)),
                    Panel::F16(x) => (x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)),
                };
                *slot = at;
                lines = bytes.div_ceil(64);
            }
        }
        if ahead_at[1].is_null() {
            ahead_at[1] = ahead_at[0];
        }
        let next = ahead_at;
        let tiles = (r1 - r0).div_ceil(avx512::mr()).max(1);
        let mut r = r0;
        let mut tile = 0;
        while r < r1 {
            let rows = tile_rows(r1 - r, avx512::mr());
            let (l0, l1) = (
                lines * tile / tiles,
                (lines * (tile + 1) / tiles).min(lines),
            );
            let ahead = avx512::Ahead {
                p0: next[0].wrapping_add(64 * l0),
                p1: next[1].wrapping_add(64 * l0),
                lines: l1.saturating_sub(l0),
            };
            let ap = self.a.as_ptr().add(r * self.lda + pc);
            let cp = c.0.add(r * self.ldc + panel * NR);
            table[rows - 1](
                kc, ap, self.lda, b0, b1, cp, self.ldc, cols, accumulate, ahead,
            );
            r += rows;
            tile += 1;
        }
    }

    /// One micro-tile: `C[rows, cols] (+)= A[rows, kc] x Bpanel[kc, 16]`.
    ///
    /// # Safety
    /// `ap` addresses `rows` rows of `kc` floats with stride `lda`; `bp`
    /// holds `kc` panel rows; `cp` addresses `rows` rows of `cols <= 16`
    /// floats with stride `ldc`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        &self,
        rows: usize,
        kc: usize,
        ap: *const f32,
        bp: Panel<'_>,
        cp: *mut f32,
        cols: usize,
        accumulate: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let (b, f16) = match bp {
                Panel::F32(b) => (b.as_ptr().cast::<u8>(), false),
                Panel::F16(b) => (b.as_ptr().cast::<u8>(), true),
            };
            let f = match (self.isa, f16) {
                (Isa::Avx512, false) => Some(avx512::TILE[rows.clamp(1, avx512::MAX_MR) - 1]),
                (Isa::Avx512, true) => Some(avx512::TILE_F16[rows.clamp(1, avx512::MAX_MR) - 1]),
                (Isa::Avx2, false) => Some(avx2::TILE[rows.clamp(1, MR) - 1]),
                (Isa::Avx2, true) => Some(avx2::TILE_F16[rows.clamp(1, MR) - 1]),
                (Isa::Portable, _) => None,
            };
            if let Some(f) = f {
                return f(kc, ap, self.lda, b, cp, self.ldc, cols, accumulate);
            }
        }
        match bp {
            Panel::F32(b) => scalar_tile(
                rows,
                kc,
                ap,
                self.lda,
                b,
                |r| r.0,
                cp,
                self.ldc,
                cols,
                accumulate,
            ),
            Panel::F16(b) => scalar_tile(
                rows,
                kc,
                ap,
                self.lda,
                b,
                |r| r.0.map(|h| half::f16::from_bits(h).to_f32()),
                cp,
                self.ldc,
                cols,
                accumulate,
            ),
        }
    }
}

/// Portable micro-kernel with the same per-element summation order as the
/// AVX2 one (p ascending, one fused multiply-add per step). `load` widens
/// one stored panel row to f32.
///
/// # Safety
/// As [`Job::tile`], with `b` holding at least `kc` panel rows.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_tile<T>(
    rows: usize,
    kc: usize,
    ap: *const f32,
    lda: usize,
    b: &[T],
    load: impl Fn(&T) -> [f32; NR],
    cp: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    for r in 0..rows {
        let mut acc = [0f32; NR];
        for (p, brow) in b[..kc].iter().enumerate() {
            let av = *ap.add(r * lda + p);
            for (x, bv) in acc.iter_mut().zip(load(brow)) {
                *x = av.mul_add(bv, *x);
            }
        }
        let crow = cp.add(r * ldc);
        for (j, x) in acc.iter().enumerate().take(cols) {
            let dst = crow.add(j);
            *dst = if accumulate { *dst + x } else { *x };
        }
    }
}

/// Rows of the tallest bf16 micro-tile (`R x 32`: 2R accumulators).
const BF16_MR: usize = 12;

/// 32 bf16 activations: one cache line of [`A16`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct A16Line([u16; 32]);
// SAFETY: 32 u16 fill the 64 bytes exactly (no padding), and any bits are
// a valid value.
unsafe impl bytemuck::Zeroable for A16Line {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl bytemuck::Pod for A16Line {}

thread_local! {
    /// The calling thread's buffer of bf16 activations (bf16 products).
    static A16: std::cell::RefCell<Vec<A16Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `dst[i] = bf16(a[i])` ([`bf16_bits`]); elements of `dst` past
/// `a.len()` are set to zero. `vcvtne2ps2bf16` where the CPU has
/// AVX512-BF16 (the same rounding), else [`round_bf16_lanes`].
pub(crate) fn round_bf16(a: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx512 && crate::isa::CpuFeatures::get().avx512bf16 {
        // SAFETY: the CPU has AVX-512 F/BW and BF16 (checked just above).
        unsafe { avx512bf16::round(a, dst) };
        return;
    }
    round_bf16_lanes(a, dst);
}

super::simd::simd_dispatch! {
    /// [`round_bf16`] lane by lane.
    fn round_bf16_lanes(a: &[f32], dst: &mut [u16]) {
        for (d, &x) in dst.iter_mut().zip(a) {
            *d = bf16_bits(x);
        }
        for d in dst.iter_mut().skip(a.len()) {
            *d = 0;
        }
    }
}

super::simd::simd_dispatch! {
    /// One row pair of a panel: `dst[2j] = bf16(lo[j])`,
    /// `dst[2j + 1] = bf16(hi[j])` for the panel's 16 columns.
    fn interleave_bf16(lo: &[f32], hi: &[f32], dst: &mut [u16; 2 * NR]) {
        let mut words = [0u32; NR];
        for ((w, &l), &h) in words.iter_mut().zip(lo).zip(hi) {
            *w = u32::from(bf16_bits(l)) | u32::from(bf16_bits(h)) << 16;
        }
        for (j, w) in words.iter().enumerate() {
            dst[2 * j] = *w as u16;
            dst[2 * j + 1] = (*w >> 16) as u16;
        }
    }
}

/// Portable bf16 micro-kernel (`rows x cols`, `cols <= 32` over the panels
/// at `b0` and `b1`), in the order of [`Job::block_bf16`].
///
/// # Safety
/// `ap` addresses `rows` rows of `2 * kc2` bf16 activations with stride
/// `lda16`; `b0` (and `b1` when `cols > 16`) hold `kc2` panel pairs; `cp`
/// addresses `rows` rows of `cols` floats with stride `ldc`.
#[allow(clippy::too_many_arguments)]
unsafe fn bf16_tile(
    rows: usize,
    kc2: usize,
    ap: *const u16,
    lda16: usize,
    b0: *const u16,
    b1: *const u16,
    cp: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    let panels = if cols > NR { 2 } else { 1 };
    let b0 = std::slice::from_raw_parts(b0, kc2 * 2 * NR);
    let b1 = std::slice::from_raw_parts(b1, kc2 * 2 * NR);
    let mut acc = [0f32; 2 * NR];
    for r in 0..rows {
        let a = std::slice::from_raw_parts(ap.add(r * lda16), 2 * kc2);
        bf16_row(a, b0, b1, panels, &mut acc);
        let crow = cp.add(r * ldc);
        for (j, x) in acc.iter().enumerate().take(cols) {
            let dst = crow.add(j);
            *dst = if accumulate { *dst + x } else { *x };
        }
    }
}

super::simd::simd_dispatch! {
    /// One output row of [`bf16_tile`] into `acc` (`16 * panels` values).
    /// Plain multiplies and adds (each product is exact in f32), so every
    /// compiled copy gives the same bits.
    fn bf16_row(a: &[u16], b0: &[u16], b1: &[u16], panels: usize, acc: &mut [f32; 2 * NR]) {
        let wide = |h: u16| f32::from_bits(u32::from(h) << 16);
        *acc = [0.0; 2 * NR];
        for (h, b) in [b0, b1].into_iter().enumerate().take(panels) {
            let out: &mut [f32; NR] = (&mut acc[h * NR..(h + 1) * NR]).try_into().unwrap();
            for (ap, pair) in a.chunks_exact(2).zip(b.chunks_exact(2 * NR)) {
                let (lo, hi) = (wide(ap[0]), wide(ap[1]));
                let Ok(pair) = <&[u16; 2 * NR]>::try_from(pair) else {
                    continue;
                };
                // Split the interleaved pair first: the lane loops below
                // then vectorize.
                let mut even = [0f32; NR];
                let mut odd = [0f32; NR];
                for j in 0..NR {
                    even[j] = wide(pair[2 * j]);
                    odd[j] = wide(pair[2 * j + 1]);
                }
                for j in 0..NR {
                    out[j] += hi * odd[j];
                    out[j] += lo * even[j];
                }
            }
        }
    }
}

/// `x` rounded to bf16 (the upper 16 bits of an f32): nearest even,
/// subnormal inputs to signed zero, NaN stays NaN (quiet). The rounding of
/// `vcvtneps2bf16`, written so that LLVM vectorizes it.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        ((b >> 16) | 0x40) as u16
    } else if b & 0x7f80_0000 == 0 {
        ((b >> 16) & 0x8000) as u16
    } else {
        ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
    }
}

/// Rows of the next micro-tile when `rem` rows are left and tiles hold at
/// most `mr`: `mr`, except that a last `mr + 1 .. 2 mr - 1` rows split into
/// two near-equal tiles. A 1- or 2-row tile has too few accumulator chains
/// to cover the FMA latency and runs at a quarter or half speed; 4+4 beats
/// 6+2.
fn tile_rows(rem: usize, mr: usize) -> usize {
    if rem > mr && rem < 2 * mr {
        rem.div_ceil(2)
    } else {
        mr.min(rem)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::NR;
    use std::arch::x86_64::*;

    /// Defines an `R x 16` micro-kernel over panel rows of type `$elem`:
    /// 2R accumulators, one panel row (two f32 vectors, produced by
    /// `$load`) and R broadcasts per k step.
    macro_rules! micro_kernel {
        ($(#[$m:meta])* $name:ident, $features:literal, $elem:ty, $load:expr) => {
            $(#[$m])*
            ///
            /// # Safety
            /// The CPU supports the enabled target features (checked by the
            /// caller), and the pointers satisfy [`super::Job::tile`]'s
            /// contract, `bp` pointing at `kc` aligned panel rows of this
            /// kernel's element type.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name<const R: usize>(
                kc: usize,
                ap: *const f32,
                lda: usize,
                bp: *const u8,
                cp: *mut f32,
                ldc: usize,
                cols: usize,
                accumulate: bool,
            ) {
                let bp = bp.cast::<$elem>();
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                let mut arow = [ap; R];
                for (r, p) in arow.iter_mut().enumerate() {
                    *p = ap.add(r * lda);
                }
                let mut b = bp;
                for _ in 0..kc {
                    let (b0, b1) = $load(b);
                    for r in 0..R {
                        let av = _mm256_broadcast_ss(&*arow[r]);
                        acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
                        arow[r] = arow[r].add(1);
                    }
                    b = b.add(NR);
                }
                store(&acc, cp, ldc, cols, accumulate);
            }
        };
    }

    /// A micro-kernel: `(kc, ap, lda, bp, cp, ldc, cols, accumulate)`.
    pub type Tile = unsafe fn(usize, *const f32, usize, *const u8, *mut f32, usize, usize, bool);

    /// [`tile`] for 1..=6 rows.
    pub const TILE: [Tile; 6] = [
        tile::<1>, tile::<2>, tile::<3>, tile::<4>, tile::<5>, tile::<6>,
    ];

    /// [`tile_f16`] for 1..=6 rows.
    pub const TILE_F16: [Tile; 6] = [
        tile_f16::<1>,
        tile_f16::<2>,
        tile_f16::<3>,
        tile_f16::<4>,
        tile_f16::<5>,
        tile_f16::<6>,
    ];

    micro_kernel!(
        /// f32 panel rows (one 64-byte line per k step).
        tile,
        "avx2,fma",
        f32,
        |b: *const f32| (_mm256_load_ps(b), _mm256_load_ps(b.add(8)))
    );

    micro_kernel!(
        /// f16 panel rows (32 bytes per k step), widened with F16C.
        tile_f16,
        "avx2,fma,f16c",
        u16,
        |b: *const u16| {
            let b = b.cast::<__m128i>();
            (_mm256_cvtph_ps(_mm_load_si128(b)), _mm256_cvtph_ps(_mm_load_si128(b.add(1))))
        }
    );

    /// Write (or add) the accumulators of an `R x 16` tile into C, the
    /// first `cols` columns only.
    ///
    /// # Safety
    /// `cp` addresses `R` rows of `cols <= 16` floats with stride `ldc`.
    #[inline(always)]
    unsafe fn store<const R: usize>(
        acc: &[[__m256; 2]; R],
        cp: *mut f32,
        ldc: usize,
        cols: usize,
        accumulate: bool,
    ) {
        if cols == NR {
            for (r, a) in acc.iter().enumerate() {
                let c = cp.add(r * ldc);
                let (mut v0, mut v1) = (a[0], a[1]);
                if accumulate {
                    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
                    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c.add(8)));
                }
                _mm256_storeu_ps(c, v0);
                _mm256_storeu_ps(c.add(8), v1);
            }
        } else {
            let mut buf = [0f32; NR];
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(buf.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(buf.as_mut_ptr().add(8), a[1]);
                let c = cp.add(r * ldc);
                for (j, x) in buf.iter().enumerate().take(cols) {
                    let dst = c.add(j);
                    *dst = if accumulate { *dst + x } else { *x };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::NR;
    use std::arch::x86_64::*;

    /// Rows of the tallest AVX-512 micro-tile the tables hold.
    pub const MAX_MR: usize = 14;

    /// Rows of the tallest AVX-512 micro-tile used: 12 (24 accumulators,
    /// two panel rows and a broadcast in the 32 zmm registers), or
    /// `RLX_AVX512_MR` (1..=14) for A/B runs.
    pub fn mr() -> usize {
        static MR: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *MR.get_or_init(|| {
            std::env::var("RLX_AVX512_MR")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .map_or(12, |v| v.clamp(1, MAX_MR))
        })
    }

    /// `[f::<1>, ..., f::<14>]`.
    macro_rules! by_rows {
        ($f:ident) => {
            [
                $f::<1>, $f::<2>, $f::<3>, $f::<4>, $f::<5>, $f::<6>, $f::<7>, $f::<8>, $f::<9>,
                $f::<10>, $f::<11>, $f::<12>, $f::<13>, $f::<14>,
            ]
        };
    }

    /// A pair micro-kernel: `(kc, ap, lda, b0, b1, cp, ldc, cols,
    /// accumulate, ahead)`, `b0`/`b1` the two panels' rows, `ahead` the
    /// lines to hint into L2 while it runs ([`Ahead`]).
    pub type Pair = unsafe fn(
        usize,
        *const f32,
        usize,
        *const u8,
        *const u8,
        *mut f32,
        usize,
        usize,
        bool,
        Ahead,
    );

    /// Two runs of `lines` cache lines, from `p0` and from `p1`, that a
    /// kernel hints into L2 one line of each per k step (the weight panels
    /// the next kernel call reads). Only hints: any address may be given.
    #[derive(Clone, Copy)]
    pub struct Ahead {
        /// First line of the first run.
        pub p0: *const u8,
        /// First line of the second run.
        pub p1: *const u8,
        /// Lines per run.
        pub lines: usize,
    }

    impl Ahead {
        /// Hint line `i` of both runs.
        #[inline(always)]
        fn fetch(self, i: usize) {
            // SAFETY: a prefetch is a hint that never faults, whatever the
            // address, and the SSE it needs is part of x86-64.
            unsafe {
                _mm_prefetch::<_MM_HINT_T1>(self.p0.wrapping_add(64 * i).cast());
                _mm_prefetch::<_MM_HINT_T1>(self.p1.wrapping_add(64 * i).cast());
            }
        }
    }

    /// Defines `R x 32` (two panels, `$pair`) and `R x 16` (`$one`)
    /// micro-kernels over panel rows of type `$elem`, one zmm register per
    /// panel row produced by `$load`; `2R` or `R` accumulators, one
    /// broadcast of A per row and k step.
    macro_rules! micro_kernels {
        ($elem:ty, $load:expr, $pair:ident, $one:ident, $doc:literal) => {
            #[doc = concat!("`R x 32` tile over two panels of ", $doc, ".")]
            ///
            /// # Safety
            /// The CPU runs AVX-512F/BW/VL/DQ (the active ISA), the pointers
            /// satisfy [`super::Job::tile`]'s contract for `cols <= 32`
            /// columns, and `b0`, `b1` point at `kc` aligned panel rows of
            /// this kernel's element type.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $pair<const R: usize>(
                kc: usize,
                ap: *const f32,
                lda: usize,
                b0: *const u8,
                b1: *const u8,
                cp: *mut f32,
                ldc: usize,
                cols: usize,
                accumulate: bool,
                ahead: Ahead,
            ) {
                let (b0, b1) = (b0.cast::<$elem>(), b1.cast::<$elem>());
                let mut acc = [[_mm512_setzero_ps(); 2]; R];
                let step = |p: usize, acc: &mut [[__m512; 2]; R]| {
                    let v0 = $load(b0.add(p * NR));
                    let v1 = $load(b1.add(p * NR));
                    for (r, a) in acc.iter_mut().enumerate() {
                        let av = _mm512_set1_ps(*ap.add(r * lda + p));
                        a[0] = _mm512_fmadd_ps(av, v0, a[0]);
                        a[1] = _mm512_fmadd_ps(av, v1, a[1]);
                    }
                };
                let hinted = ahead.lines.min(kc);
                for p in 0..hinted {
                    ahead.fetch(p);
                    step(p, &mut acc);
                }
                for p in hinted..kc {
                    step(p, &mut acc);
                }
                for i in hinted..ahead.lines {
                    ahead.fetch(i);
                }
                for (r, a) in acc.iter().enumerate() {
                    let c = cp.add(r * ldc);
                    store(a[0], c, cols.min(NR), accumulate);
                    if cols > NR {
                        store(a[1], c.add(NR), cols - NR, accumulate);
                    }
                }
            }

            #[doc = concat!("`R x 16` tile over one panel of ", $doc, ".")]
            ///
            /// # Safety
            /// As for the pair kernel, with one panel and `cols <= 16`.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $one<const R: usize>(
                kc: usize,
                ap: *const f32,
                lda: usize,
                bp: *const u8,
                cp: *mut f32,
                ldc: usize,
                cols: usize,
                accumulate: bool,
            ) {
                let bp = bp.cast::<$elem>();
                let mut acc = [_mm512_setzero_ps(); R];
                for p in 0..kc {
                    let v = $load(bp.add(p * NR));
                    for (r, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*ap.add(r * lda + p)), v, *a);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    store(*a, cp.add(r * ldc), cols, accumulate);
                }
            }
        };
    }

    micro_kernels!(
        f32,
        |b: *const f32| _mm512_load_ps(b),
        pair,
        one,
        "f32 panel rows (one 64-byte line per k step)"
    );
    micro_kernels!(
        u16,
        |b: *const u16| _mm512_cvtph_ps(_mm256_load_si256(b.cast::<__m256i>())),
        pair_f16,
        one_f16,
        "f16 panel rows (32 bytes per k step, widened as loaded)"
    );

    /// One k step of [`pair12`] at byte offset `$b` into the panel rows
    /// and `$a` into the A rows: 2 panel rows, 12 broadcasts, 24 FMAs
    /// (an `asm!` template fragment, no pointer bumps).
    macro_rules! pair12_k {
        ($b:literal, $a:literal) => {
            concat!(
                "vmovaps zmm24, zmmword ptr [{b0} + ",
                $b,
                "]\n",
                "vmovaps zmm25, zmmword ptr [{b1} + ",
                $b,
                "]\n",
                "vbroadcastss zmm26, dword ptr [{a0} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm0, zmm26, zmm24\n",
                "vfmadd231ps zmm1, zmm26, zmm25\n",
                "vbroadcastss zmm27, dword ptr [{a0} + {ld} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm2, zmm27, zmm24\n",
                "vfmadd231ps zmm3, zmm27, zmm25\n",
                "vbroadcastss zmm28, dword ptr [{a0} + {ld}*2 + ",
                $a,
                "]\n",
                "vfmadd231ps zmm4, zmm28, zmm24\n",
                "vfmadd231ps zmm5, zmm28, zmm25\n",
                "vbroadcastss zmm29, dword ptr [{a0} + {ld3} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm6, zmm29, zmm24\n",
                "vfmadd231ps zmm7, zmm29, zmm25\n",
                "vbroadcastss zmm30, dword ptr [{a4} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm8, zmm30, zmm24\n",
                "vfmadd231ps zmm9, zmm30, zmm25\n",
                "vbroadcastss zmm31, dword ptr [{a4} + {ld} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm10, zmm31, zmm24\n",
                "vfmadd231ps zmm11, zmm31, zmm25\n",
                "vbroadcastss zmm26, dword ptr [{a4} + {ld}*2 + ",
                $a,
                "]\n",
                "vfmadd231ps zmm12, zmm26, zmm24\n",
                "vfmadd231ps zmm13, zmm26, zmm25\n",
                "vbroadcastss zmm27, dword ptr [{a4} + {ld3} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm14, zmm27, zmm24\n",
                "vfmadd231ps zmm15, zmm27, zmm25\n",
                "vbroadcastss zmm28, dword ptr [{a8} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm16, zmm28, zmm24\n",
                "vfmadd231ps zmm17, zmm28, zmm25\n",
                "vbroadcastss zmm29, dword ptr [{a8} + {ld} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm18, zmm29, zmm24\n",
                "vfmadd231ps zmm19, zmm29, zmm25\n",
                "vbroadcastss zmm30, dword ptr [{a8} + {ld}*2 + ",
                $a,
                "]\n",
                "vfmadd231ps zmm20, zmm30, zmm24\n",
                "vfmadd231ps zmm21, zmm30, zmm25\n",
                "vbroadcastss zmm31, dword ptr [{a8} + {ld3} + ",
                $a,
                "]\n",
                "vfmadd231ps zmm22, zmm31, zmm24\n",
                "vfmadd231ps zmm23, zmm31, zmm25\n",
            )
        };
    }

    /// Four k steps of [`pair12`], then the pointer bumps: five adds per
    /// four steps instead of per step (scalar adds may issue on the FMA
    /// ports). From L1 on the dev Xeon it moved the kernel from 176 to 178
    /// GFLOP/s of a 211 register-loop peak, about the noise; the loads
    /// alone cap it: 24 FMAs beside the 2 panel loads and 12 broadcasts at
    /// fixed addresses ran at 89% of that peak, without the loads at 100%.
    macro_rules! pair12_step4 {
        () => {
            concat!(
                pair12_k!("0", "0"),
                pair12_k!("64", "4"),
                pair12_k!("128", "8"),
                pair12_k!("192", "12"),
                "add {b0}, 256\n",
                "add {b1}, 256\n",
                "add {a0}, 16\n",
                "add {a4}, 16\n",
                "add {a8}, 16\n",
            )
        };
    }

    /// One k step of [`pair12`] and its pointer bumps.
    macro_rules! pair12_step {
        () => {
            concat!(
                pair12_k!("0", "0"),
                "add {b0}, 64\n",
                "add {b1}, 64\n",
                "add {a0}, 4\n",
                "add {a4}, 4\n",
                "add {a8}, 4\n",
            )
        };
    }

    /// [`pair`] for 12 rows (the tile every full row block uses) in
    /// assembly: the same FMAs in the same order, so the same bits. LLVM
    /// computes each row's address with its own scalar add or lea (about
    /// ten per k step beside the 24 FMAs, on the ports the FMAs use); here
    /// three row pointers (rows 0, 4, 8) take their group's rows at 0, 1,
    /// 2 and 3 strides in the addressing mode, five adds per k step.
    ///
    /// # Safety
    /// As for [`pair`] with `R = 12`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub unsafe fn pair12(
        kc: usize,
        ap: *const f32,
        lda: usize,
        b0: *const u8,
        b1: *const u8,
        cp: *mut f32,
        ldc: usize,
        cols: usize,
        accumulate: bool,
        ahead: Ahead,
    ) {
        let ld = lda * 4;
        // Lines hinted four per group of four k steps (up to three lines
        // of a run not a multiple of four go unhinted: only hints).
        let hinted = ahead.lines.min(kc);
        let (
            c0,
            c1,
            c2,
            c3,
            c4,
            c5,
            c6,
            c7,
            c8,
            c9,
            c10,
            c11,
            c12,
            c13,
            c14,
            c15,
            c16,
            c17,
            c18,
            c19,
            c20,
            c21,
            c22,
            c23,
        ): (
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
            __m512,
        );
        // SAFETY: the caller's contract: `ap` holds 12 rows of `kc` floats
        // `lda` apart, `b0` and `b1` hold `kc` 64-byte panel rows; the
        // prefetches are hints at any address. Only zmm24..31 and the
        // named registers are clobbered; nothing is written to memory.
        std::arch::asm!(
            "vxorps xmm0, xmm0, xmm0", "vxorps xmm1, xmm1, xmm1", "vxorps xmm2, xmm2, xmm2",
            "vxorps xmm3, xmm3, xmm3", "vxorps xmm4, xmm4, xmm4", "vxorps xmm5, xmm5, xmm5",
            "vxorps xmm6, xmm6, xmm6", "vxorps xmm7, xmm7, xmm7", "vxorps xmm8, xmm8, xmm8",
            "vxorps xmm9, xmm9, xmm9", "vxorps xmm10, xmm10, xmm10", "vxorps xmm11, xmm11, xmm11",
            "vxorps xmm12, xmm12, xmm12", "vxorps xmm13, xmm13, xmm13", "vxorps xmm14, xmm14, xmm14",
            "vxorps xmm15, xmm15, xmm15", "vpxord zmm16, zmm16, zmm16", "vpxord zmm17, zmm17, zmm17",
            "vpxord zmm18, zmm18, zmm18", "vpxord zmm19, zmm19, zmm19", "vpxord zmm20, zmm20, zmm20",
            "vpxord zmm21, zmm21, zmm21", "vpxord zmm22, zmm22, zmm22", "vpxord zmm23, zmm23, zmm23",
            "test {n1}, {n1}",
            "jz 3f",
            "2:",
                "prefetcht1 byte ptr [{pf0}]",
                "prefetcht1 byte ptr [{pf1}]",
                "prefetcht1 byte ptr [{pf0} + 64]",
                "prefetcht1 byte ptr [{pf1} + 64]",
                "prefetcht1 byte ptr [{pf0} + 128]",
                "prefetcht1 byte ptr [{pf1} + 128]",
                "prefetcht1 byte ptr [{pf0} + 192]",
                "prefetcht1 byte ptr [{pf1} + 192]",
                "add {pf0}, 256",
                "add {pf1}, 256",
                pair12_step4!(),
            "dec {n1}",
            "jnz 2b",
            "3:",
            "test {n2}, {n2}",
            "jz 5f",
            "4:",
                pair12_step4!(),
            "dec {n2}",
            "jnz 4b",
            "5:",
            "test {n3}, {n3}",
            "jz 7f",
            "6:",
                pair12_step!(),
            "dec {n3}",
            "jnz 6b",
            "7:",
            a0 = inout(reg) ap => _,
            a4 = inout(reg) ap.wrapping_add(4 * lda) => _,
            a8 = inout(reg) ap.wrapping_add(8 * lda) => _,
            ld = in(reg) ld,
            ld3 = in(reg) 3 * ld,
            b0 = inout(reg) b0 => _,
            b1 = inout(reg) b1 => _,
            pf0 = inout(reg) ahead.p0 => _,
            pf1 = inout(reg) ahead.p1 => _,
            n1 = inout(reg) hinted / 4 => _,
            n2 = inout(reg) (kc - hinted / 4 * 4) / 4 => _,
            n3 = inout(reg) kc % 4 => _,
            out("zmm0") c0,
            out("zmm1") c1,
            out("zmm2") c2,
            out("zmm3") c3,
            out("zmm4") c4,
            out("zmm5") c5,
            out("zmm6") c6,
            out("zmm7") c7,
            out("zmm8") c8,
            out("zmm9") c9,
            out("zmm10") c10,
            out("zmm11") c11,
            out("zmm12") c12,
            out("zmm13") c13,
            out("zmm14") c14,
            out("zmm15") c15,
            out("zmm16") c16,
            out("zmm17") c17,
            out("zmm18") c18,
            out("zmm19") c19,
            out("zmm20") c20,
            out("zmm21") c21,
            out("zmm22") c22,
            out("zmm23") c23,
            out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
            out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
            options(nostack, readonly),
        );
        let acc = [
            [c0, c1],
            [c2, c3],
            [c4, c5],
            [c6, c7],
            [c8, c9],
            [c10, c11],
            [c12, c13],
            [c14, c15],
            [c16, c17],
            [c18, c19],
            [c20, c21],
            [c22, c23],
        ];
        for (r, a) in acc.iter().enumerate() {
            let c = cp.add(r * ldc);
            store(a[0], c, cols.min(NR), accumulate);
            if cols > NR {
                store(a[1], c.add(NR), cols - NR, accumulate);
            }
        }
    }

    /// [`pair`] for 1..=MAX_MR rows ([`pair12`] for 12).
    pub const PAIR: [Pair; MAX_MR] = {
        let mut t: [Pair; MAX_MR] = by_rows!(pair);
        t[11] = pair12;
        t
    };
    /// [`pair`] alone, for the tests that compare [`pair12`] with it.
    #[cfg(test)]
    pub const PAIR_INTRINSICS: [Pair; MAX_MR] = by_rows!(pair);
    /// [`pair_f16`] for 1..=MAX_MR rows.
    pub const PAIR_F16: [Pair; MAX_MR] = by_rows!(pair_f16);
    /// [`one`] for 1..=MAX_MR rows.
    pub const TILE: [super::avx2::Tile; MAX_MR] = by_rows!(one);
    /// [`one_f16`] for 1..=MAX_MR rows.
    pub const TILE_F16: [super::avx2::Tile; MAX_MR] = by_rows!(one_f16);

    /// Write (or add) the first `cols <= 16` lanes of `v` at `c`.
    ///
    /// # Safety
    /// `c` addresses `cols` floats; AVX-512F is enabled in the caller.
    #[inline(always)]
    pub(super) unsafe fn store(v: __m512, c: *mut f32, cols: usize, accumulate: bool) {
        let mask: __mmask16 = if cols >= NR {
            0xffff
        } else {
            (1u16 << cols) - 1
        };
        let v = if accumulate {
            _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, c))
        } else {
            v
        };
        _mm512_mask_storeu_ps(c, mask, v);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512bf16 {
    use super::avx512::store;
    use super::NR;
    use std::arch::x86_64::*;

    /// A bf16 micro-kernel: `(kc2, ap, lda16, b0, b1, cp, ldc, cols,
    /// accumulate)` as [`super::bf16_tile`].
    pub type Tile =
        unsafe fn(usize, *const u16, usize, *const u16, *const u16, *mut f32, usize, usize, bool);

    /// `R x 32` tile (`R x 16` when `cols <= 16`): one `vdpbf16ps` per row
    /// and panel per row pair.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F/BW/VL and BF16, and the pointers satisfy
    /// [`super::bf16_tile`]'s contract.
    #[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile<const R: usize>(
        kc2: usize,
        ap: *const u16,
        lda16: usize,
        b0: *const u16,
        b1: *const u16,
        cp: *mut f32,
        ldc: usize,
        cols: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let two = cols > NR;
        for q in 0..kc2 {
            let v0: __m512bh = std::mem::transmute(_mm512_load_si512(b0.add(q * 2 * NR).cast()));
            if two {
                let v1: __m512bh =
                    std::mem::transmute(_mm512_load_si512(b1.add(q * 2 * NR).cast()));
                for (r, a) in acc.iter_mut().enumerate() {
                    // The pair (2q, 2q + 1) as one little-endian dword.
                    let pair = ap.add(r * lda16 + 2 * q).cast::<i32>().read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    a[0] = _mm512_dpbf16_ps(a[0], av, v0);
                    a[1] = _mm512_dpbf16_ps(a[1], av, v1);
                }
            } else {
                for (r, a) in acc.iter_mut().enumerate() {
                    // The pair (2q, 2q + 1) as one little-endian dword.
                    let pair = ap.add(r * lda16 + 2 * q).cast::<i32>().read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    a[0] = _mm512_dpbf16_ps(a[0], av, v0);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let c = cp.add(r * ldc);
            store(a[0], c, cols.min(NR), accumulate);
            if two {
                store(a[1], c.add(NR), cols - NR, accumulate);
            }
        }
    }

    /// [`super::round_bf16`] with `vcvtne2ps2bf16`, 32 elements a step.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F/BW and BF16.
    #[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma")]
    pub unsafe fn round(a: &[f32], dst: &mut [u16]) {
        let n = a.len().min(dst.len());
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: i + 32 <= n bounds both reads and the write.
            let lo = _mm512_loadu_ps(a.as_ptr().add(i));
            let hi = _mm512_loadu_ps(a.as_ptr().add(i + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), v);
            i += 32;
        }
        if i < n {
            let m = (1u32 << (n - i).min(16)) - 1;
            let m = m as u16;
            let lo = _mm512_maskz_loadu_ps(m, a.as_ptr().add(i));
            let rest = n - i;
            let m2 = if rest > 16 {
                ((1u32 << (rest - 16)) - 1) as u16
            } else {
                0
            };
            let hi = _mm512_maskz_loadu_ps(m2, a.as_ptr().add(i + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            let mask = if rest == 32 {
                u32::MAX
            } else {
                (1u32 << rest) - 1
            };
            _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), mask, v);
        }
        for d in &mut dst[n..] {
            *d = 0;
        }
    }

    /// [`tile`] for 1..=12 rows.
    pub const TILE: [Tile; super::BF16_MR] = [
        tile::<1>, tile::<2>, tile::<3>, tile::<4>, tile::<5>, tile::<6>, tile::<7>, tile::<8>,
        tile::<9>, tile::<10>, tile::<11>, tile::<12>,
    ];
}

/// Whether bf16 products may run on AMX tiles here (see
/// [`crate::isa::amx_bf16_active`]).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn amx_usable() -> bool {
    amx::usable()
}

/// AMX bf16 tiles (`tdpbf16ps`) for [`Job::block_amx`], through inline
/// assembly (the AMX intrinsics are not stable Rust). The tile registers
/// are invisible to the compiler, which never uses them itself: they keep
/// their contents between the `asm!` blocks of one [`block`] call on one
/// thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx {
    use std::arch::asm;
    use std::sync::OnceLock;

    use crate::kernels::amx_tiles::TileConfig;

    /// Palette 1: tiles 0-3 are C (16 rows of 16 f32), 4-5 A (16 rows of 32
    /// bf16), 6-7 B (16 pair rows of 16 columns); every row 64 bytes.
    static CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
    };

    /// Whether the bf16 products run on AMX: the CPU has AMX-BF16 with
    /// the tile state enabled in XCR0, Linux granted this process the tile
    /// data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), and
    /// `RLX_CPU_AMX` is not `0` (for A/B runs against `vdpbf16ps`).
    pub fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            if crate::isa::amx_disabled() {
                return false;
            }
            let f = crate::isa::CpuFeatures::get();
            f.amx_bf16 && f.avx512bf16 && crate::isa::tile_data_granted()
        })
    }

    /// Configures the calling thread's tiles.
    ///
    /// # Safety
    /// [`usable`] returned true.
    pub unsafe fn configure() {
        // SAFETY: the CPU has AMX and the process holds the tile state
        // (caller); CONFIG is a valid palette-1 configuration.
        unsafe { crate::kernels::amx_tiles::load(&CONFIG) }
    }

    /// Returns the calling thread's tiles to their initial state (so that
    /// context switches do not save 8 KiB of tile data for it).
    ///
    /// # Safety
    /// [`usable`] returned true.
    pub unsafe fn release() {
        // SAFETY: as for `configure`.
        unsafe { crate::kernels::amx_tiles::release() }
    }

    /// `C[0..R, 0..32] = A[0..R, 0..2kp] · B` for `R` = 32 (`tall`) or 16:
    /// `a` the first A row (bf16, rows `a_stride` bytes apart), `b0`/`b1`
    /// the pair rows of two panels (64 bytes each, consecutive), `c` the
    /// first C element (rows `c_stride` bytes apart). Overwrites C.
    ///
    /// # Safety
    /// [`configure`] ran on this thread; `kp % 16 == 0`; the A rows hold
    /// `2 kp` bf16, each panel `kp` pair rows, and C's `R` rows 32 floats.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn block(
        tall: bool,
        kp: usize,
        a: *const u8,
        a_stride: usize,
        b0: *const u8,
        b1: *const u8,
        c: *mut f32,
        c_stride: usize,
    ) {
        // SAFETY (every block below): tile loads read 16 rows of 64 bytes
        // at the given stride, inside A and the panels (caller); stores
        // write 16 rows of 16 floats inside C (caller).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            let a1 = a.add(16 * a_stride);
            let mut q = 0;
            while q < kp {
                if tall {
                    asm!(
                        "tileloadd tmm4, [{a0} + {sa} * 1]",
                        "tileloadd tmm6, [{b0} + {sb} * 1]",
                        "tileloadd tmm7, [{b1} + {sb} * 1]",
                        "tileloadd tmm5, [{a1} + {sa} * 1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a.add(4 * q),
                        a1 = in(reg) a1.add(4 * q),
                        b0 = in(reg) b0.add(64 * q),
                        b1 = in(reg) b1.add(64 * q),
                        sa = in(reg) a_stride,
                        sb = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                } else {
                    asm!(
                        "tileloadd tmm4, [{a0} + {sa} * 1]",
                        "tileloadd tmm6, [{b0} + {sb} * 1]",
                        "tileloadd tmm7, [{b1} + {sb} * 1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        a0 = in(reg) a.add(4 * q),
                        b0 = in(reg) b0.add(64 * q),
                        b1 = in(reg) b1.add(64 * q),
                        sa = in(reg) a_stride,
                        sb = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                }
                q += 16;
            }
            let c = c.cast::<u8>();
            asm!(
                "tilestored [{c0} + {sc} * 1], tmm0",
                "tilestored [{c1} + {sc} * 1], tmm1",
                c0 = in(reg) c,
                c1 = in(reg) c.add(64),
                sc = in(reg) c_stride,
                options(nostack),
            );
            if tall {
                let c2 = c.add(16 * c_stride);
                asm!(
                    "tilestored [{c2} + {sc} * 1], tmm2",
                    "tilestored [{c3} + {sc} * 1], tmm3",
                    c2 = in(reg) c2,
                    c3 = in(reg) c2.add(64),
                    sc = in(reg) c_stride,
                    options(nostack),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, k: usize, n: usize, a: &[f32], lda: usize, b: &[f32]) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * lda + p] as f64 * b[p * n + j] as f64)
                    .sum();
            }
        }
        c
    }

    fn fill(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_assembly_12_row_pair_kernel_has_the_bits_of_the_intrinsics_one() {
        if !Isa::Avx512.supported() {
            eprintln!("skipped: no AVX-512");
            return;
        }
        for (kc, lda, ldc, cols, accumulate, lines) in [
            (1, 1, 32, 32, false, 0),
            (7, 9, 40, 32, true, 3),
            (256, 300, 32, 20, false, 256),
            (384, 384, 33, 17, true, 100),
            (33, 40, 64, 16, false, 40),
        ] {
            let a = fill(12 * lda, kc as u32);
            let b: Vec<PanelRow> = fill(2 * kc * NR, 7 + kc as u32)
                .chunks_exact(NR)
                .map(|c| PanelRow(c.try_into().unwrap()))
                .collect();
            let (b0, b1) = (b.as_ptr().cast::<u8>(), b[kc..].as_ptr().cast::<u8>());
            let start = fill(12 * ldc, 99);
            let ahead = avx512::Ahead {
                p0: b0,
                p1: b1,
                lines,
            };
            let run = |f: avx512::Pair| {
                let mut c = start.clone();
                // SAFETY: AVX-512 checked above; `a` holds 12 rows of `kc`
                // floats `lda` apart, `b0`/`b1` `kc` panel rows each, `c`
                // 12 rows of `cols <= 32` floats `ldc` apart.
                unsafe {
                    f(
                        kc,
                        a.as_ptr(),
                        lda,
                        b0,
                        b1,
                        c.as_mut_ptr(),
                        ldc,
                        cols,
                        accumulate,
                        ahead,
                    )
                };
                c
            };
            let (asm, intr) = (run(avx512::pair12), run(avx512::PAIR_INTRINSICS[11]));
            assert!(
                asm.iter()
                    .zip(&intr)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "kc {kc} lda {lda} cols {cols} accumulate {accumulate}"
            );
            assert_ne!(asm, start, "kc {kc}: the kernel wrote nothing");
        }
    }

    #[test]
    fn split_outputs_have_the_bits_of_the_whole_product() {
        // Windows of a QKV-like product (three equal windows), a window
        // ending mid-panel, an uncovered column range, f32 and bf16
        // packings, with bias and GELU, serial and on the pool.
        let (m, k, n) = (37, 40, 3 * 48 + 8);
        let a = fill(m * (k + 3), 7);
        let b = fill(k * n, 8);
        let bias = fill(n, 9);
        let lda = k + 3;
        for bf in [false, true] {
            let mut p = PackedB::pack(&b, k, n, n).unwrap();
            if bf {
                p = p.to_bf16();
            }
            for parallel in [false, true] {
                let act = Some(Activation::Gelu);
                let mut whole = vec![0f32; m * n];
                gemm_packed(m, &a, lda, &p, &mut whole, n, Some(&bias), act, parallel).unwrap();
                let windows = [(0, 48), (48, 48), (96, 40), (144, 8)];
                let mut bufs: Vec<Vec<f32>> = windows
                    .iter()
                    .map(|&(_, w)| vec![f32::NAN; m * w])
                    .collect();
                let mut splits: Vec<ColumnSplit<'_>> = windows
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(&(col0, cols), c)| ColumnSplit {
                        col0,
                        cols,
                        c,
                        ldc: cols,
                    })
                    .collect();
                gemm_packed_split(m, &a, lda, &p, &mut splits, Some(&bias), act, parallel).unwrap();
                for (&(col0, cols), c) in windows.iter().zip(&bufs) {
                    for r in 0..m {
                        for j in 0..cols {
                            assert_eq!(
                                c[r * cols + j].to_bits(),
                                whole[r * n + col0 + j].to_bits(),
                                "bf16 {bf} parallel {parallel} row {r} column {}",
                                col0 + j
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_splits_are_errors() {
        let (m, k, n) = (4, 8, 32);
        let p = PackedB::pack(&fill(k * n, 1), k, n, n).unwrap();
        let a = fill(m * k, 2);
        let mut c = vec![0f32; m * 16];
        let run = |col0: usize, cols: usize, ldc: usize, c: &mut [f32]| {
            let mut s = [ColumnSplit { col0, cols, c, ldc }];
            gemm_packed_split(m, &a, k, &p, &mut s, None, None, false).map_err(|e| e.to_string())
        };
        assert!(run(8, 16, 16, &mut c).unwrap_err().contains("panel"));
        assert!(run(16, 32, 32, &mut c).unwrap_err().contains("outside"));
        assert!(run(0, 16, 8, &mut c).unwrap_err().contains("row stride"));
        assert!(run(0, 16, 16, &mut c[..30]).is_err());
        assert!(run(16, 16, 16, &mut c).is_ok());
    }

    #[test]
    fn partition_tiles_c_exactly_once_and_evenly() {
        for threads in [1, 2, 3, 4, 16] {
            for m in [1, 5, 6, 16, 97, 128, 200, 512, 4096] {
                for (panels, granule) in [1, 2, 3, 24, 72, 96]
                    .into_iter()
                    .flat_map(|p| [(p, MR), (p, 32)])
                {
                    let p = Partition::new(m, panels, threads, granule);
                    let mut seen = vec![0u8; m * panels];
                    let mut sizes = Vec::new();
                    for t in 0..p.tasks() {
                        let ((r0, r1), (p0, p1)) = p.task(t);
                        assert!(r0 < r1 && p0 < p1, "{p:?} task {t} is empty");
                        // Row blocks start on micro-tile boundaries.
                        assert_eq!(r0 % granule, 0, "{p:?}");
                        sizes.push((r1 - r0) * (p1 - p0));
                        for r in r0..r1 {
                            for q in p0..p1 {
                                seen[r * panels + q] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&x| x == 1), "{p:?} misses or repeats");
                    if threads > 1 && p.groups < panels.div_ceil(p.panel_unit) {
                        assert_eq!(p.tasks() % threads, 0, "{p:?} threads {threads}");
                    }
                    if granule == 32 {
                        // AMX groups hold whole panel pairs (bar a trailing odd panel).
                        for t in 0..p.tasks() {
                            let (_, (p0, p1)) = p.task(t);
                            assert!(p0 % 2 == 0 && ((p1 - p0) % 2 == 0 || p1 == panels), "{p:?}");
                        }
                    }
                    if threads > 1 && m >= 16 && panels >= 24 {
                        let most = p.row_blocks * panels.div_ceil(p.panel_unit);
                        assert!(p.tasks() >= (threads * TASKS_PER_THREAD).min(most), "{p:?}");
                        // Every task within one micro-tile row block and one panel of the largest.
                        let big = sizes.iter().max().unwrap();
                        let small = sizes.iter().min().unwrap();
                        let slack = (granule + MC.min(m)) * (panels / p.groups + p.panel_unit);
                        assert!(big - small <= slack, "{p:?}: {small}..{big}");
                    }
                }
            }
        }
    }

    fn check(kernel: Isa, m: usize, k: usize, n: usize, lda: usize, parallel: bool) {
        let a = fill(m * lda, 1 + m as u32);
        let b = fill(k * n, 7 + n as u32);
        let bias = fill(n, 3);
        let packed = PackedB::pack(&b, k, n, n).unwrap();
        let ldc = n + 3;
        let mut c = vec![f32::NAN; m * ldc];
        gemm_packed_with(
            kernel,
            m,
            &a,
            lda,
            &packed,
            &mut c,
            ldc,
            Some(&bias),
            None,
            parallel,
        )
        .unwrap();
        let want = naive(m, k, n, &a, lda, &b);
        for i in 0..m {
            for j in 0..n {
                let w = want[i * n + j] + bias[j] as f64;
                let got = c[i * ldc + j] as f64;
                assert!(
                    (got - w).abs() <= 1e-4 * (1.0 + w.abs()) * (k as f64).sqrt(),
                    "{kernel:?} m{m} k{k} n{n} at ({i},{j}): {got} vs {w}"
                );
            }
            assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|x| x.is_nan()));
        }
    }

    #[test]
    fn matches_naive_on_edge_sizes() {
        for kernel in Isa::available() {
            for &(m, k, n) in &[
                (1, 1, 1),
                (1, 7, 17),
                (5, 13, 15),
                (6, 16, 16),
                (7, 33, 31),
                (13, 300, 40),
                (97, 385, 130),
                (200, 600, 48),
                (3, 0, 5),
            ] {
                check(kernel, m, k, n, k + 2, false);
                check(kernel, m, k, n, k, true);
            }
        }
    }

    #[test]
    fn f16_panels_multiply_the_rounded_weights() {
        for &(m, k, n) in &[(1, 7, 17), (7, 33, 31), (97, 385, 130), (16, 384, 64)] {
            let a = fill(m * k, 11);
            let b = fill(k * n, 12);
            // What an f16 packing must multiply: B rounded to f16.
            let b16: Vec<f32> = b.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
            let packed = PackedB::pack(&b, k, n, n).unwrap().to_f16();
            assert!(packed.is_f16());
            assert_eq!(packed.bytes(), n.div_ceil(NR) * k * 32);
            let want = naive(m, k, n, &a, k, &b16);
            let mut out = Vec::new();
            for kernel in Isa::available() {
                let mut c = vec![f32::NAN; m * n];
                let act = Some(Activation::Relu);
                gemm_packed_with(kernel, m, &a, k, &packed, &mut c, n, None, act, true).unwrap();
                for (i, (&got, &w)) in c.iter().zip(&want).enumerate() {
                    let w = w.max(0.0);
                    assert!(
                        (got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()) * (k as f64).sqrt(),
                        "{kernel:?} m{m} k{k} n{n} at {i}: {got} vs {w}"
                    );
                }
                out.push(c);
            }
            // Same summation order in both kernels: identical results.
            assert_eq!(out[0], out[1], "m{m} k{k} n{n}");
        }
    }

    #[test]
    fn every_isa_gives_the_portable_bits() {
        // Odd panel counts (a single-panel tail after AVX-512 pairs), ragged
        // columns, every tile height, several K blocks, f32 and f16 panels.
        for &(m, k, n) in &[(50, 777, 70), (13, 40, 48), (9, 300, 33), (128, 384, 1536)] {
            let a = fill(m * k, 9);
            let b = fill(k * n, 10);
            let f32p = PackedB::pack(&b, k, n, n).unwrap();
            for packed in [f32p.clone(), f32p.to_f16()] {
                let run = |isa: Isa, parallel: bool| {
                    let mut c = vec![0f32; m * n];
                    gemm_packed_with(isa, m, &a, k, &packed, &mut c, n, None, None, parallel)
                        .unwrap();
                    c
                };
                let want = run(Isa::Portable, false);
                for isa in Isa::available() {
                    for parallel in [false, true] {
                        // Same fused multiply-adds in the same order per
                        // element: bit-identical.
                        assert!(
                            run(isa, parallel) == want,
                            "{isa} m{m} k{k} n{n} f16 {} parallel {parallel}",
                            packed.is_f16()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_packing_multiplies_the_rounded_operands_on_every_isa() {
        let round = |x: f32| f32::from_bits(u32::from(bf16_bits(x)) << 16);
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(-2.5), 0xc020);
        // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_bits(f32::MAX), 0x7f80, "rounds up to infinity");
        assert_eq!(bf16_bits(1e-40), 0, "subnormals flush");
        assert_eq!(bf16_bits(-1e-40), 0x8000);
        assert!(round(f32::NAN).is_nan());
        // Odd k (a zero pad row), odd panel counts, ragged columns, tile
        // heights around 12, several K blocks.
        // With AMX: 32- and 16-row blocks, leftover rows, a partial panel.
        for &(m, k, n) in &[
            (1, 7, 17),
            (13, 33, 48),
            (29, 385, 70),
            (64, 1536, 40),
            (56, 384, 96),
            (16, 64, 33),
        ] {
            let a = fill(m * k, 21);
            let b = fill(k * n, 22);
            let bias = fill(n, 23);
            let packed = PackedB::pack(&b, k, n, n).unwrap().to_bf16();
            assert!(packed.is_bf16() && packed.k() == k && packed.n() == n);
            assert_eq!(packed.bytes(), n.div_ceil(NR) * k.div_ceil(2) * 64);
            let ar: Vec<f32> = a.iter().map(|&x| round(x)).collect();
            let br: Vec<f32> = b.iter().map(|&x| round(x)).collect();
            let want = naive(m, k, n, &ar, k, &br);
            let mut outs = Vec::new();
            for isa in Isa::available() {
                for parallel in [false, true] {
                    let mut c = vec![f32::NAN; m * n];
                    let act = Some(Activation::Relu);
                    gemm_packed_with(
                        isa,
                        m,
                        &a,
                        k,
                        &packed,
                        &mut c,
                        n,
                        Some(&bias),
                        act,
                        parallel,
                    )
                    .unwrap();
                    for (i, (&got, &w)) in c.iter().zip(&want).enumerate() {
                        let w = (w + bias[i % n] as f64).max(0.0);
                        assert!(
                            (got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()) * (k as f64).sqrt(),
                            "{isa} m{m} k{k} n{n} at {i}: {got} vs {w}"
                        );
                    }
                    outs.push((isa, c));
                }
            }
            // vdpbf16ps and the portable kernel add in the same order (AMX
            // tiles sum in their own: within the tolerance above).
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            if amx::usable() {
                println!("bf16 on AMX tiles checked: m{m} k{k} n{n}");
                outs.retain(|(isa, _)| *isa != Isa::Avx512);
            }
            for (isa, c) in &outs {
                assert!(
                    c == &outs[0].1,
                    "{isa} m{m} k{k} n{n}: bits differ from portable"
                );
            }
        }
        let packed = PackedB::pack(&fill(12, 1), 3, 4, 4).unwrap().to_bf16();
        let mut c = vec![0f32; 8];
        let window = gemm_packed_window(2, &[0.0; 6], 3, &packed, (1, 3), (0, 4), &mut c, 4);
        assert!(window.is_err(), "a bf16 window must start on a row pair");
    }

    #[test]
    fn strided_bf16_repack_equals_the_rounded_f32_packing() {
        // K^T of a head (rs = 1) and V (cs = 1) as attention packs them,
        // plus a general stride, with ragged panels and odd depths.
        for &(k, n, rs, cs) in &[
            (32, 128, 1, 1152),
            (64, 37, 1, 200),
            (33, 48, 1, 40),
            (128, 32, 1152, 1),
            (37, 40, 50, 1),
            (9, 20, 3, 31),
        ] {
            let b = fill((k - 1) * rs + (n - 1) * cs + 1, (k + n) as u32);
            let mut f32p = PackedB::empty();
            f32p.repack_strided(&b, k, n, rs, cs).unwrap();
            let want = f32p.to_bf16();
            // Reuse an allocation holding other contents, as attention does.
            let mut got = PackedB::pack(&fill(300, 9), 10, 30, 30).unwrap().to_bf16();
            got.repack_strided_bf16(&b, k, n, rs, cs).unwrap();
            assert!(got.is_bf16() && !got.is_f16() && (got.k(), got.n()) == (k, n));
            assert!(
                got.pairs.iter().zip(&want.pairs).all(|(x, y)| x.0 == y.0)
                    && got.pairs.len() == want.pairs.len(),
                "k{k} n{n} rs{rs} cs{cs}: bits differ from to_bf16"
            );
        }
        let mut p = PackedB::empty();
        assert!(p.repack_strided_bf16(&[0.0; 10], 4, 4, 1, 4).is_err());
    }

    #[test]
    fn bf16_window_matches_the_rounded_product() {
        // Attention's two products in bf16: scores = Q x K^T over a key
        // window, then P x V over a row window starting on a panel.
        let round = |x: f32| f32::from_bits(u32::from(bf16_bits(x)) << 16);
        let (keys, dims, ks) = (70, 32, 100);
        let kmat = fill(keys * ks, 31);
        let mut kt = PackedB::empty();
        kt.repack_strided_bf16(&kmat, dims, keys, 1, ks).unwrap();
        let mut v = PackedB::empty();
        v.repack_strided_bf16(&kmat, keys, dims, ks, 1).unwrap();
        let m = 19;
        let a = fill(m * ks, 32);
        let kt_at = |p: usize, j: usize| kmat[j * ks + p];
        let v_at = |p: usize, j: usize| kmat[p * ks + j];
        type Case<'a> = (
            &'a PackedB,
            usize,
            usize,
            usize,
            usize,
            &'a dyn Fn(usize, usize) -> f32,
        );
        let cases: [Case; 2] = [(&kt, 0, dims, 16, 54, &kt_at), (&v, 16, 69, 0, dims, &v_at)];
        for (bt, k0, k1, col0, cols, at) in cases {
            let k = k1 - k0;
            let mut c = vec![f32::NAN; m * cols];
            gemm_packed_window(m, &a, ks, bt, (k0, k1), (col0, cols), &mut c, cols).unwrap();
            for i in 0..m {
                for j in 0..cols {
                    let want: f64 = (0..k)
                        .map(|p| round(a[i * ks + p]) as f64 * round(at(k0 + p, col0 + j)) as f64)
                        .sum();
                    let got = c[i * cols + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "k {k0}..{k1} cols {col0}+{cols} ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn bf16_products_do_not_see_an_earlier_products_activations() {
        // The thread's bf16 activation buffer is reused without clearing:
        // a product after a larger one (odd k: a pad element per row) must
        // give the bits it gives on a fresh thread.
        // The larger product's activations round to bf16 infinity, so a
        // stale element read as the pad (times B's zero pad row) gives NaN.
        let run = |m: usize, k: usize, n: usize, seed: u32, parallel: bool| {
            let a = match seed {
                0 => vec![f32::MAX; m * k],
                _ => fill(m * k, seed),
            };
            let b = PackedB::pack(&fill(k * n, seed + 1), k, n, n)
                .unwrap()
                .to_bf16();
            let mut c = vec![f32::NAN; m * n];
            gemm_packed(m, &a, k, &b, &mut c, n, None, None, parallel).unwrap();
            c
        };
        for parallel in [false, true] {
            let fresh = std::thread::spawn(move || run(13, 33, 40, 7, parallel))
                .join()
                .unwrap();
            let after = std::thread::spawn(move || {
                run(64, 1536, 48, 0, parallel);
                run(13, 33, 40, 7, parallel)
            })
            .join()
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fresh), bits(&after), "parallel = {parallel}");
        }
    }

    #[test]
    fn window_over_bf16_activations_gives_the_rounding_windows_bits() {
        // Attention hands its probabilities over already in bf16: the
        // product must be the one the f32 entry point gives after rounding
        // them itself, odd depths (a zero pad per row) included.
        let (keys, dims, ks) = (70, 32, 100);
        let vmat = fill(keys * ks, 41);
        let mut v = PackedB::empty();
        v.repack_strided_bf16(&vmat, keys, dims, ks, 1).unwrap();
        for (m, k0, k1) in [(19, 16, 69), (64, 0, 70), (1, 2, 3), (5, 0, 0)] {
            let k = k1 - k0;
            let a = fill(m * k.max(1), 42);
            let mut a16 = vec![u16::MAX; m * 2 * k.div_ceil(2)];
            for (r, dst) in a16.chunks_mut(2 * k.div_ceil(2).max(1)).enumerate() {
                round_bf16(&a[r * k..r * k + k], dst);
            }
            let mut want = vec![f32::NAN; m * dims];
            gemm_packed_window(m, &a, k.max(1), &v, (k0, k1), (0, dims), &mut want, dims).unwrap();
            let mut got = vec![f32::NAN; m * dims];
            gemm_packed_window_a16(m, &a16, &v, (k0, k1), (0, dims), &mut got, dims).unwrap();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "m {m} rows {k0}..{k1}");
        }
        let mut c = vec![0f32; 4 * dims];
        let short = vec![0u16; 4 * 8 - 1];
        let err = gemm_packed_window_a16(4, &short, &v, (0, 8), (0, dims), &mut c, dims);
        assert!(err.unwrap_err().to_string().contains("bf16 A"));
        let f32_packed = PackedB::pack(&vmat, keys, dims, ks).unwrap();
        let err = gemm_packed_window_a16(4, &[0; 32], &f32_packed, (0, 8), (0, dims), &mut c, dims);
        assert!(err.unwrap_err().to_string().contains("f32 packing"));
        let err = gemm_packed_window_a16(4, &[0; 32], &v, (1, 9), (0, dims), &mut c, dims);
        assert!(err.unwrap_err().to_string().contains("even row"));
    }

    #[test]
    fn activation_epilogue_applies_after_bias() {
        let (m, k, n) = (9, 20, 35);
        let a = fill(m * k, 4);
        let b = fill(k * n, 5);
        let bias = fill(n, 6);
        let packed = PackedB::pack(&b, k, n, n).unwrap();
        let mut c = vec![0f32; m * n];
        gemm_packed(
            m,
            &a,
            k,
            &packed,
            &mut c,
            n,
            Some(&bias),
            Some(Activation::Relu),
            true,
        )
        .unwrap();
        let want = naive(m, k, n, &a, k, &b);
        for i in 0..m {
            for j in 0..n {
                let w = (want[i * n + j] + bias[j] as f64).max(0.0);
                assert!((c[i * n + j] as f64 - w).abs() < 1e-4, "({i},{j})");
            }
        }
    }

    #[test]
    fn window_of_a_strided_packing_matches_naive() {
        // B = K^T for K [n=40 keys, k=24 dims] with key row stride 30.
        let (keys, dims, ks) = (40, 24, 30);
        let kmat = fill(keys * ks, 11);
        let mut packed = PackedB::empty();
        packed.repack_strided(&kmat, dims, keys, 1, ks).unwrap();
        let m = 7;
        let a = fill(m * dims, 12);
        // Keys 16..37, dims 3..20.
        let (k0, k1, col0, cols) = (3, 20, 16, 21);
        let mut c = vec![f32::NAN; m * cols];
        gemm_packed_window(
            m,
            &a[k0..],
            dims,
            &packed,
            (k0, k1),
            (col0, cols),
            &mut c,
            cols,
        )
        .unwrap();
        for i in 0..m {
            for j in 0..cols {
                let want: f64 = (k0..k1)
                    .map(|p| a[i * dims + p] as f64 * kmat[(col0 + j) * ks + p] as f64)
                    .sum();
                assert!((c[i * cols + j] as f64 - want).abs() < 1e-4, "({i},{j})");
            }
        }
        let bad = gemm_packed_window(m, &a, dims, &packed, (0, 25), (0, 8), &mut c, cols);
        assert!(bad.is_err());
        let bad = gemm_packed_window(m, &a, dims, &packed, (0, 5), (8, 8), &mut c, cols);
        assert!(bad.is_err());
    }

    #[test]
    fn bad_strides_and_lengths_are_errors() {
        let packed = PackedB::pack(&[1.0; 12], 3, 4, 4).unwrap();
        let mut c = vec![0f32; 8];
        assert!(gemm_packed(2, &[0.0; 6], 2, &packed, &mut c, 4, None, None, false).is_err());
        assert!(gemm_packed(2, &[0.0; 6], 3, &packed, &mut c, 3, None, None, false).is_err());
        assert!(gemm_packed(3, &[0.0; 9], 3, &packed, &mut c, 4, None, None, false).is_err());
        assert!(gemm_packed(
            2,
            &[0.0; 6],
            3,
            &packed,
            &mut c,
            4,
            Some(&[0.0; 3]),
            None,
            false
        )
        .is_err());
        assert!(PackedB::pack(&[1.0; 11], 3, 4, 4).is_err());
        assert!(PackedB::pack(&[1.0; 12], 3, 4, 3).is_err());
    }
}
