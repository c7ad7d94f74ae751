//! A register-only FMA loop: the throughput ceiling every GEMM is measured
//! against. Twelve independent accumulator chains cover the FMA latency of
//! current x86 cores (4-5 cycles at two FMAs per cycle), and nothing touches
//! memory inside the loop.

use crate::isa::Isa;

/// Run `iters` iterations of 12 independent vector FMAs with the registers
/// of the active [`Isa`] (16 lanes for AVX-512, 8 for AVX2, a scalar loop of
/// the same shape for the portable kernels) and return the floating-point
/// operations done (2 per lane per FMA) together with a value derived from
/// the accumulators, so the loop cannot be optimized away.
pub fn fma_loop(iters: usize) -> (u64, f32) {
    #[cfg(target_arch = "x86_64")]
    match Isa::active() {
        Isa::Avx512 => {
            // SAFETY: the active ISA is one the CPU runs, and AVX-512F is
            // the only target feature `fma_loop_avx512` is compiled with.
            let sink = unsafe { fma_loop_avx512(iters) };
            return (iters as u64 * 12 * 16 * 2, sink);
        }
        Isa::Avx2 => {
            // SAFETY: as above, for AVX2 and FMA.
            let sink = unsafe { fma_loop_avx2(iters) };
            return (iters as u64 * 12 * 8 * 2, sink);
        }
        Isa::Portable => {}
    }
    let mut acc = [1.0f32; 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = *a * 0.999_999 + 1e-7;
        }
    }
    (iters as u64 * 12 * 2, acc.iter().sum())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mul = _mm256_set1_ps(0.999_999);
    let add = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, mul, add);
        }
    }
    let mut total = _mm256_setzero_ps();
    for a in acc {
        total = _mm256_add_ps(total, a);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), total);
    lanes.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mul = _mm512_set1_ps(0.999_999);
    let add = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, mul, add);
        }
    }
    let mut total = _mm512_setzero_ps();
    for a in acc {
        total = _mm512_add_ps(total, a);
    }
    _mm512_reduce_add_ps(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fma_loop_counts_flops_and_converges_to_the_fixed_point() {
        // x -> 0.999999 x + 1e-7 has its fixed point at 0.1; starting from
        // 1.0, after n steps x = 0.1 + 0.9 * 0.999999^n.
        let (flops, sink) = fma_loop(1000);
        let lanes = Isa::active().f32_lanes();
        assert_eq!(flops, 1000 * 12 * lanes as u64 * 2);
        let lanes = (12 * lanes) as f64;
        let expect = lanes * (0.1 + 0.9 * 0.999_999f64.powi(1000));
        assert!(
            (sink as f64 - expect).abs() < 1e-3 * expect,
            "{sink} vs {expect}"
        );
    }
}
