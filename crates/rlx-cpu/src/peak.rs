//! Measuring what the machine can do, instead of assuming it.

use crate::kernels::fma_peak::fma_loop;
use crate::kernels::packed_gemm::{gemm_packed, PackedB};
use rayon::prelude::*;
use std::time::{Duration, Instant};

/// GFLOP/s of a register-only FMA loop (AVX2+FMA when present) running on
/// every thread of the current rayon pool at once: the machine's FMA peak,
/// the ceiling profiles report against. Takes about `millis` milliseconds.
pub fn measure_fma_peak(millis: u64) -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let deadline = Duration::from_millis(millis.max(10));
    let t0 = Instant::now();
    let (flops, sink): (u64, f32) = (0..threads)
        .into_par_iter()
        .map(|_| {
            let (mut flops, mut sink) = (0u64, 0f32);
            while t0.elapsed() < deadline {
                let (f, s) = fma_loop(100_000);
                flops += f;
                sink += s;
            }
            (flops, sink)
        })
        .reduce(|| (0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    flops as f64 / secs / 1e9
}

/// GFLOP/s of rlx's packed GEMM on an in-cache problem (256 x 256 x 256,
/// weights packed once) running on every thread of the current rayon pool
/// at once: the best the matmul kernel reaches on this machine. Takes about
/// `millis` milliseconds.
pub fn measure_gemm_peak(millis: u64) -> f64 {
    const N: usize = 256;
    let threads = rayon::current_num_threads().max(1);
    let a = vec![0.5f32; N * N];
    let b = match PackedB::pack(&vec![0.25f32; N * N], N, N, N) {
        Ok(b) => b,
        Err(_) => return 0.0,
    };
    let deadline = Duration::from_millis(millis.max(10));
    let t0 = Instant::now();
    let reps: usize = (0..threads)
        .into_par_iter()
        .map(|_| {
            let mut c = vec![0f32; N * N];
            let mut n = 0;
            while t0.elapsed() < deadline {
                if gemm_packed(N, &a, N, &b, &mut c, N, None, None, false).is_err() {
                    break;
                }
                n += 1;
            }
            n
        })
        .sum();
    let secs = t0.elapsed().as_secs_f64();
    reps as f64 * 2.0 * (N * N * N) as f64 / secs / 1e9
}

/// [`measure_fma_peak`] and [`measure_gemm_peak`] on `threads` threads
/// (a pool of that size; `None`: the current pool), as a model compiled
/// with that many threads runs: `(fma, gemm)` GFLOP/s.
pub fn measure_peaks(millis: u64, threads: Option<usize>) -> (f64, f64) {
    let both = || (measure_fma_peak(millis), measure_gemm_peak(millis));
    match threads.map(|t| rayon::ThreadPoolBuilder::new().num_threads(t).build()) {
        Some(Ok(pool)) => pool.install(both),
        _ => both(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fma_peak_bounds_the_gemm_peak() {
        // A GEMM that streams memory cannot beat a loop that never leaves
        // registers (allow noise from a shared machine). Other tests of
        // this binary run beside this one and can take the cores during
        // either measurement, so a failing pair is measured again, up to
        // five times: a GEMM really faster than the FMA loop fails all.
        let mut seen = Vec::new();
        for _ in 0..5 {
            let fma = measure_fma_peak(50);
            let gemm = measure_gemm_peak(50);
            assert!(fma > 0.0 && gemm > 0.0, "fma {fma} gemm {gemm}");
            if gemm < fma * 1.3 {
                return;
            }
            seen.push((gemm, fma));
        }
        panic!("gemm vs fma GFLOP/s, every try: {seen:?}");
    }
}
