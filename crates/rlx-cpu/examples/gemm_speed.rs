//! Packed GEMM speed, f32 and bf16 weights, at MiniLM's shapes: best of
//! three timed loops per shape, in GFLOP/s. `THREADS` (default 1) sizes the
//! pool; `RLX_CPU_AMX=0` and `RLX_CPU_ISA` select the kernels for A/B runs;
//! `PEAK=1` prints the FMA peak of the pool first, `ONLY_F32=1` skips bf16.
//! `COPIES=n` (default 1) cycles through n distinct packed weights, so that
//! with n large enough B comes from L3 or memory, as a model's layers do.
//!
//!     THREADS=2 cargo run --release -p rlx-cpu --example gemm_speed
use rlx_cpu::kernels::packed_gemm::{gemm_packed, PackedB};
use std::time::Instant;
fn main() {
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    if std::env::var_os("PEAK").is_some() {
        let peak = pool.install(|| rlx_cpu::peak::measure_fma_peak(300));
        println!("t{threads} FMA peak {peak:.1} GFLOP/s");
    }
    let only_f32 = std::env::var_os("ONLY_F32").is_some();
    let copies: usize = std::env::var("COPIES")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1)
        .max(1);
    for (m, k, n) in [
        (128, 384, 384),
        (128, 384, 1536),
        (128, 1536, 384),
        (512, 384, 1536),
        (4096, 384, 1536),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        for bf in [false, true] {
            if bf && only_f32 {
                continue;
            }
            let ps: Vec<PackedB> = (0..copies)
                .map(|_| {
                    let p = PackedB::pack(&b, k, n, n).unwrap();
                    if bf {
                        p.to_bf16()
                    } else {
                        p
                    }
                })
                .collect();
            let mut c = vec![0f32; m * n];
            let reps = (2_000_000_000 / (m * n * k)).clamp(3, 2000);
            let mut best = f64::MAX;
            pool.install(|| {
                for _ in 0..3 {
                    let t = Instant::now();
                    for i in 0..reps {
                        let p = &ps[i % copies];
                        gemm_packed(m, &a, k, p, &mut c, n, None, None, threads > 1).unwrap();
                    }
                    best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                }
            });
            println!(
                "t{threads} {m}x{k}x{n} {} x{copies}: {:.1} us, {:.0} GFLOP/s",
                if bf { "bf16" } else { "f32 " },
                best * 1e6,
                2.0 * (m * n * k) as f64 / best / 1e9
            );
        }
    }
}
