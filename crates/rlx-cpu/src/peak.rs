//! Measuring what the machine can do, instead of assuming it.

use crate::kernels::matmul::gemm;
use rayon::prelude::*;
use std::time::Instant;

/// GFLOP/s of an in-cache f32 GEMM (256 x 256 x 256, repeated) running on
/// every thread of the current rayon pool at once: the practical FMA peak
/// that profiles report against. Takes about `millis` milliseconds.
pub fn measure_gemm_peak(millis: u64) -> f64 {
    const N: usize = 256;
    let threads = rayon::current_num_threads().max(1);
    let a = vec![0.5f32; N * N];
    let b = vec![0.25f32; N * N];
    let deadline = std::time::Duration::from_millis(millis.max(10));
    let t0 = Instant::now();
    let reps: usize = (0..threads)
        .into_par_iter()
        .map(|_| {
            let mut c = vec![0f32; N * N];
            let mut n = 0;
            while t0.elapsed() < deadline {
                if gemm(N, N, N, &a, N, &b, N, &mut c, N, false, false).is_err() {
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
