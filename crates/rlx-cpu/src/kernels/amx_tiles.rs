//! The AMX tile configuration shared by the tile kernels (bf16 in
//! `packed_gemm`, int8 in `quant_panels`): each kernel keeps its own
//! palette and loads it on the thread that runs it.

use std::arch::asm;

/// `ldtilecfg`'s 64-byte operand (palette 1: per tile, its rows and bytes
/// per row).
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    pub palette: u8,
    pub start_row: u8,
    pub reserved: [u8; 14],
    pub colsb: [u16; 16],
    pub rows: [u8; 16],
}

/// Configures the calling thread's tiles as `cfg` says.
///
/// # Safety
/// The CPU has AMX, the process holds the tile data
/// ([`crate::isa::tile_data_granted`]) and `cfg` is a valid palette-1
/// configuration.
pub(crate) unsafe fn load(cfg: &TileConfig) {
    // SAFETY: the caller's contract; `cfg` is 64 readable bytes.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) cfg as *const TileConfig, options(nostack, readonly));
    }
}

/// Returns the calling thread's tiles to their initial state (so that a
/// context switch saves no tile data for it).
///
/// # Safety
/// The CPU has AMX and the process holds the tile data.
pub(crate) unsafe fn release() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}
