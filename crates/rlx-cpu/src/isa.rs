//! Which instruction set the CPU kernels run with, chosen once at run time.
//!
//! One binary serves every x86-64 CPU: the hot kernels are compiled several
//! times with different target features (no `-C target-cpu=native`) and the
//! variant to run is picked from what the CPU reports:
//!
//! - [`Isa::Avx512`]: AVX-512F/BW/VL/DQ (16 f32 lanes) plus AVX2, FMA, F16C;
//! - [`Isa::Avx2`]: AVX2, FMA and F16C (8 lanes);
//! - [`Isa::Portable`]: plain Rust for any target (what LLVM makes of it at
//!   the baseline, SSE2 on x86-64), the definition every variant is tested
//!   against.
//!
//! `RLX_CPU_ISA=avx512|avx2|portable` forces a variant for A/B runs; a
//! variant the CPU lacks falls back to the best one it has, with a warning
//! on stderr (running AVX-512 code on a CPU without it would fault).
//!
//! [`CpuFeatures`] also records the low-precision extensions that optional
//! kernels use (AVX512-BF16, AVX512-FP16, AVX512-VNNI) and reports AMX.
//!
//! ## AMX (bf16 products)
//! Sapphire Rapids and later Xeons have AMX: eight 1 KiB tile registers and
//! a tile multiply (`tdpbf16ps`, `tdpbusd`) that does a 16x32 by 32x16 bf16
//! or int8 block product per instruction. `vdpbf16ps` does 32 bf16
//! products per instruction but issues at half the rate of the f32 FMA on
//! these cores, so it gains nothing over f32 in compute; the tiles do.
//! The opt-in bf16 matmuls (`Precision::Bf16` on the CPU, packed as bf16
//! row pairs, which is the B layout `tdpbf16ps` reads) run on tiles when
//! [`CpuFeatures::amx_bf16`] holds, the AVX-512 kernels are active, K is a
//! multiple of 32, and Linux grants the process the tile data
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once):
//! a 2x2 block of C tiles (32 rows x 32 columns) stays in registers over
//! the whole K while A tiles stream from the rounded activations (see
//! `kernels::packed_gemm`). Rows past the last whole 16 and a partial last
//! panel use `vdpbf16ps`. [`amx_bf16_active`] says whether tiles run;
//! `RLX_CPU_AMX=0` turns them off for A/B runs.
//!
//! ## AMX (int8 products)
//! With `Int8` activations, quantized Q4_0/Q4_1/Q8_0 weights repacked in
//! 16-row panels (`kernels::quant_panels`) are already laid out as the B
//! operand of `tdpbssd`/`tdpbusd`: one panel block of 32 elements is 8
//! rows of 16 x 4 bytes. Prefill (16 or more activation rows) multiplies
//! one block per tile instruction (16 activation rows x 32 bytes by 32 x
//! 16 weights), stores the 16 x 16 exact integer sums and scales them in
//! AVX-512 registers with the same f32 operations as the VNNI kernel, so
//! the outputs are bit for bit those of `vpdpbusd`. Opt-in
//! (`RLX_CPU_AMX_INT8=1`, see [`amx_int8_active`]): measured no faster
//! than VNNI end to end. Decode (one row) stays on VNNI: it is bound by
//! memory, not by the dot products.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A family of kernel variants (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, any target.
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ (with AVX2, FMA, F16C).
    Avx512,
}

impl Isa {
    /// Every variant, weakest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The name `RLX_CPU_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parse an `RLX_CPU_ISA` value.
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// f32 lanes of one vector register.
    pub fn f32_lanes(self) -> usize {
        match self {
            Isa::Portable => 1,
            Isa::Avx2 => 8,
            Isa::Avx512 => 16,
        }
    }

    /// Whether this CPU can run the variant.
    pub fn supported(self) -> bool {
        self <= CpuFeatures::get().best()
    }

    /// The variants this CPU can run, weakest first (tests run them all).
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.supported()).collect()
    }

    /// The variant the kernels use now.
    #[inline]
    pub fn active() -> Isa {
        match ACTIVE.load(Ordering::Relaxed) {
            0 => Isa::Portable,
            1 => Isa::Avx2,
            2 => Isa::Avx512,
            _ => init(),
        }
    }

    /// Make `isa` the active variant for every kernel of this process.
    /// Errors, changing nothing, when the CPU cannot run it. Kernels already
    /// running finish on the variant they started with; all variants give
    /// the same results within the tolerances the ISA tests state.
    pub fn set_active(isa: Isa) -> Result<(), String> {
        if !isa.supported() {
            return Err(format!(
                "this CPU cannot run the {} kernels (it supports {})",
                isa.name(),
                CpuFeatures::get().best().name()
            ));
        }
        ACTIVE.store(isa as u8, Ordering::Relaxed);
        Ok(())
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 0..=2: an [`Isa`]; 255: not chosen yet.
static ACTIVE: AtomicU8 = AtomicU8::new(255);

#[cold]
fn init() -> Isa {
    let best = CpuFeatures::get().best();
    let chosen = match std::env::var("RLX_CPU_ISA") {
        Ok(v) if !v.trim().is_empty() && !v.eq_ignore_ascii_case("auto") => match Isa::parse(&v) {
            Some(want) if want <= best => want,
            Some(want) => {
                eprintln!(
                    "rlx: RLX_CPU_ISA={v}: this CPU cannot run the {want} kernels; using {best}"
                );
                best
            }
            None => {
                eprintln!(
                    "rlx: RLX_CPU_ISA={v} is not one of avx512, avx2, portable, auto; using {best}"
                );
                best
            }
        },
        _ => best,
    };
    // Another thread may have chosen first: both read the same environment.
    let _ = ACTIVE.compare_exchange(255, chosen as u8, Ordering::Relaxed, Ordering::Relaxed);
    match ACTIVE.load(Ordering::Relaxed) {
        0 => Isa::Portable,
        1 => Isa::Avx2,
        _ => Isa::Avx512,
    }
}

/// What the CPU reports, read once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 (256-bit integer and float SIMD).
    pub avx2: bool,
    /// FMA3 (fused multiply-add on 128/256-bit vectors).
    pub fma: bool,
    /// F16C (f16 <-> f32 conversion).
    pub f16c: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 byte/word ops.
    pub avx512bw: bool,
    /// AVX-512 on 128/256-bit registers.
    pub avx512vl: bool,
    /// AVX-512 doubleword/quadword ops.
    pub avx512dq: bool,
    /// AVX-512 int8 dot products (`vpdpbusd`).
    pub avx512vnni: bool,
    /// AVX-512 bf16 dot products (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// AVX-512 half-precision arithmetic.
    pub avx512fp16: bool,
    /// AVX-VNNI (the VEX-encoded int8 dot product of AVX2-class cores).
    pub avxvnni: bool,
    /// AMX bf16 tiles with the tile state enabled by the OS (see the
    /// module docs and [`amx_bf16_active`]).
    pub amx_bf16: bool,
    /// AMX int8 tiles (reported, not used).
    pub amx_int8: bool,
}

impl CpuFeatures {
    /// The features of this CPU (detected on first call).
    pub fn get() -> CpuFeatures {
        static F: OnceLock<CpuFeatures> = OnceLock::new();
        *F.get_or_init(CpuFeatures::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> CpuFeatures {
        use std::arch::x86_64::__cpuid_count;
        // AMX has no stable `is_x86_feature_detected!` name: CPUID leaf 7
        // sub-leaf 0, EDX bits 22 (AMX-BF16) and 25 (AMX-INT8), plus the OS
        // enabling the tile state in XCR0 (bits 17 and 18).
        // Leaf 7 is only read when the maximum leaf (leaf 0's EAX) reaches it.
        let (amx_bf16, amx_int8) = if __cpuid_count(0, 0).eax >= 7 {
            let edx = __cpuid_count(7, 0).edx;
            (edx & (1 << 22) != 0, edx & (1 << 25) != 0)
        } else {
            (false, false)
        };
        let tiles = (amx_bf16 || amx_int8) && os_enables_tiles();
        CpuFeatures {
            avx2: std::is_x86_feature_detected!("avx2"),
            fma: std::is_x86_feature_detected!("fma"),
            f16c: std::is_x86_feature_detected!("f16c"),
            avx512f: std::is_x86_feature_detected!("avx512f"),
            avx512bw: std::is_x86_feature_detected!("avx512bw"),
            avx512vl: std::is_x86_feature_detected!("avx512vl"),
            avx512dq: std::is_x86_feature_detected!("avx512dq"),
            avx512vnni: std::is_x86_feature_detected!("avx512vnni"),
            avx512bf16: std::is_x86_feature_detected!("avx512bf16"),
            avx512fp16: std::is_x86_feature_detected!("avx512fp16"),
            avxvnni: std::is_x86_feature_detected!("avxvnni"),
            amx_bf16: amx_bf16 && tiles,
            amx_int8: amx_int8 && tiles,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> CpuFeatures {
        CpuFeatures::default()
    }

    /// The strongest [`Isa`] this CPU runs.
    pub fn best(&self) -> Isa {
        let avx2 = self.avx2 && self.fma && self.f16c;
        if avx2 && self.avx512f && self.avx512bw && self.avx512vl && self.avx512dq {
            Isa::Avx512
        } else if avx2 {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// The extensions present, as lower-case names (for reports).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.avx2, "avx2"),
            (self.fma, "fma"),
            (self.f16c, "f16c"),
            (self.avx512f, "avx512f"),
            (self.avx512bw, "avx512bw"),
            (self.avx512vl, "avx512vl"),
            (self.avx512dq, "avx512dq"),
            (self.avx512vnni, "avx512vnni"),
            (self.avx512bf16, "avx512bf16"),
            (self.avx512fp16, "avx512fp16"),
            (self.avxvnni, "avxvnni"),
            (self.amx_bf16, "amx_bf16"),
            (self.amx_int8, "amx_int8"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// Whether the OS saves the AMX tile state (XCR0 bits 17 and 18).
#[cfg(target_arch = "x86_64")]
fn os_enables_tiles() -> bool {
    if !std::is_x86_feature_detected!("xsave") {
        return false;
    }
    // SAFETY: XGETBV with ECX = 0 is valid whenever the CPU has XSAVE and
    // the OS set CR4.OSXSAVE, which `is_x86_feature_detected!("xsave")`
    // implies on Linux (the std detection checks OSXSAVE).
    let xcr0 = unsafe { xgetbv0() };
    xcr0 & (0b11 << 17) == 0b11 << 17
}

/// XCR0.
///
/// # Safety
/// The CPU has XSAVE and the OS enabled it (OSXSAVE).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

/// Whether Linux granted this process the AMX tile data
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once; the
/// bf16 and the int8 tile kernels share the answer).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn tile_data_granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain syscall with integer arguments; on success the
        // kernel lets this process's threads use tile data.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        rc == 0
    })
}

/// Whether `RLX_CPU_AMX=0` turned the tile kernels off (A/B runs).
pub(crate) fn amx_disabled() -> bool {
    std::env::var("RLX_CPU_AMX").is_ok_and(|v| v.trim() == "0")
}

/// Whether the AMX-INT8 panel kernel can run here: the CPU and OS have the
/// tiles, the AVX-512 kernels with VNNI are active, Linux granted the tile
/// data and `RLX_CPU_AMX` is not `0` (tests run it whenever this holds).
pub fn amx_int8_supported() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if Isa::active() == Isa::Avx512 {
        let f = CpuFeatures::get();
        return f.amx_int8 && f.avx512vnni && !amx_disabled() && tile_data_granted();
    }
    false
}

/// Whether the `Int8`-activation products of quantized weights in panels
/// (`kernels::quant_panels`, Q4_0/Q4_1/Q8_0, 16 or more activation rows:
/// prefill) run on AMX-INT8 tiles: [`amx_int8_supported`] and the opt-in
/// `RLX_CPU_AMX_INT8=1`. Off by default: on the 16-core Xeon (2026-12-05,
/// SmolLM2 prefill of 128 tokens, 2 threads, three interleaved rounds)
/// it measured level with `vpdpbusd` (999-1041 against 965-1039 tok/s):
/// each block's 16 x 16 sums go through a tile store and are scaled in
/// AVX-512 registers, and that scaling, not the dot products, bounds it.
pub fn amx_int8_active() -> bool {
    amx_int8_supported() && std::env::var("RLX_CPU_AMX_INT8").is_ok_and(|v| v.trim() == "1")
}

/// Whether the bf16 matmuls run on AMX tiles in this process (see the
/// module docs): the CPU and OS have them, the AVX-512 kernels are active
/// and `RLX_CPU_AMX` is not `0`.
pub fn amx_bf16_active() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if Isa::active() == Isa::Avx512 {
        return crate::kernels::packed_gemm::amx_usable();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_order_by_strength() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
            assert_eq!(Isa::parse(&isa.name().to_uppercase()), Some(isa));
        }
        assert_eq!(Isa::parse("sse9"), None);
        assert!(Isa::Portable < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
    }

    #[test]
    fn the_portable_variant_runs_everywhere_and_the_best_is_available() {
        let f = CpuFeatures::get();
        let avail = Isa::available();
        assert_eq!(avail.first(), Some(&Isa::Portable));
        assert_eq!(avail.last(), Some(&f.best()));
        assert!(Isa::active() <= f.best());
        if f.best() == Isa::Avx512 {
            assert!(f.names().contains(&"avx512f"));
        }
    }

    #[test]
    fn an_unsupported_variant_is_refused() {
        let best = CpuFeatures::get().best();
        if best < Isa::Avx512 {
            let e = Isa::set_active(Isa::Avx512).unwrap_err();
            assert!(e.contains("avx512"), "{e}");
        }
        assert!(Isa::set_active(Isa::active()).is_ok());
    }
}
