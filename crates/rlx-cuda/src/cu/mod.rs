//! The CUDA C sources, as files: `common.cuh` (the shared prelude),
//! `grid_dep.cuh` (programmatic dependent launch), `ops.cuh` (generated
//! op-code switches) and one `.cu` file per NVRTC module. They are built
//! into the crate with `include_str!` and compiled by NVRTC at run time, so
//! no CUDA toolkit is needed to build.
//!
//! NVRTC is given one self-contained source: [`expand`] replaces each
//! `#include "X"` of one of these headers with its text (`ops.cuh` with
//! [`crate::opcodes::ops_cuh`], generated from the op-code table, not the
//! checked-in copy). Other `#include`s are left for NVRTC.

use std::sync::OnceLock;

/// `cu/common.cuh`, the prelude of `kernels.cu`, `mixed.cu` and the
/// generated fused kernels.
pub(crate) const COMMON_CUH: &str = include_str!("common.cuh");
/// `cu/grid_dep.cuh`, prepended to every module (see
/// `device::with_grid_dep`).
pub(crate) const GRID_DEP_CUH: &str = include_str!("grid_dep.cuh");
/// The checked-in `cu/ops.cuh` (for nvcc builds; a test keeps it equal to
/// the generated text that rlx uses).
#[cfg(test)]
pub(crate) const OPS_CUH: &str = include_str!("ops.cuh");
/// `cu/kernels.cu`: the f32 kernels.
pub(crate) const KERNELS_CU: &str = include_str!("kernels.cu");
/// `cu/mixed.cu`: the mixed-precision kernels.
pub(crate) const MIXED_CU: &str = include_str!("mixed.cu");
/// `cu/quant.cu`: the packed-GGUF matmul kernels.
pub(crate) const QUANT_CU: &str = include_str!("quant.cu");
/// `cu/kv.cu`: the KV-cache kernels.
pub(crate) const KV_CU: &str = include_str!("kv.cu");

/// `source` with every `#include` of one of rlx's headers replaced by the
/// header's (expanded) text.
pub(crate) fn expand(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 8192);
    for line in source.split_inclusive('\n') {
        let header = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'));
        match header {
            Some("common.cuh") => out.push_str(&expand(COMMON_CUH)),
            Some("grid_dep.cuh") => out.push_str(GRID_DEP_CUH),
            Some("ops.cuh") => out.push_str(&crate::opcodes::ops_cuh()),
            _ => out.push_str(line),
        }
    }
    out
}

/// The expanded prelude (`common.cuh`), for generated kernels.
pub(crate) fn prelude() -> &'static str {
    static PRELUDE: OnceLock<String> = OnceLock::new();
    PRELUDE.get_or_init(|| expand(COMMON_CUH))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expansion leaves no rlx header behind, keeps each header's guard
    /// once, and splices the generated switches.
    #[test]
    fn expansion_inlines_the_headers() {
        for src in [KERNELS_CU, MIXED_CU] {
            let out = expand(src);
            assert!(
                !out.lines().any(|l| l.trim_start().starts_with("#include")),
                "an include is left"
            );
            assert_eq!(out.matches("#define RLX_COMMON_CUH").count(), 1);
            assert_eq!(out.matches("float act_apply(int kind, float x)").count(), 1);
            assert!(out.contains("#define RLX_BIN_MAX 4"));
        }
        assert!(prelude().contains("__device__ float block_sum(float v, float* sh)"));
    }
}
