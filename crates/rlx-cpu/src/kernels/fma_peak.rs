//! A register-only FMA loop: the throughput ceiling every GEMM is measured
//! against. Twelve independent accumulator chains cover the FMA latency of
//! current x86 cores (4-5 cycles at two FMAs per cycle), and nothing touches
//! memory inside the loop.

/// Run `iters` iterations of 12 independent vector FMAs and return the
/// floating-point operations done (2 per lane per FMA) together with a value
/// derived from the accumulators, so the loop cannot be optimized away.
/// Uses AVX2+FMA when the CPU has them, otherwise a scalar loop of the same
/// shape (which measures what the portable kernels can reach).
pub fn fma_loop(iters: usize) -> (u64, f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above), the
            // only target features `fma_loop_avx2` is compiled with.
            let sink = unsafe { fma_loop_avx2(iters) };
            return (iters as u64 * 12 * 8 * 2, sink);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fma_loop_counts_flops_and_converges_to_the_fixed_point() {
        // x -> 0.999999 x + 1e-7 has its fixed point at 0.1; starting from
        // 1.0, after n steps x = 0.1 + 0.9 * 0.999999^n.
        let (flops, sink) = fma_loop(1000);
        let lanes = if flops == 1000 * 12 * 8 * 2 {
            96.0
        } else {
            12.0
        };
        assert!(flops == 1000 * 12 * 8 * 2 || flops == 1000 * 12 * 2);
        let expect = lanes * (0.1 + 0.9 * 0.999_999f64.powi(1000));
        assert!(
            (sink as f64 - expect).abs() < 1e-3 * expect,
            "{sink} vs {expect}"
        );
    }
}
