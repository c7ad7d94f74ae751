//! The `gemm` crate against rlx's packed-weight GEMM on MiniLM's matmul
//! shapes, interleaved in one run (medians of the rounds, GFLOP/s).
//!
//! `cargo run --release -p rlx-cpu --example gemm_shapes [rounds]`

use rlx_cpu::kernels::matmul::gemm;
use rlx_cpu::kernels::packed_gemm::{gemm_packed, PackedB};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let peak = rlx_cpu::peak::measure_fma_peak(300);
    println!(
        "measured FMA peak {peak:.1} GFLOP/s on {} threads",
        rayon::current_num_threads()
    );
    println!(
        "{:>5} {:>5} {:>5} | {:>9} {:>9} {:>9} | {:>6}",
        "m", "k", "n", "gemm GF/s", "packed", "+gelu", "ratio"
    );
    for &(m, k, n) in &[
        (16, 384, 1152),
        (16, 384, 1536),
        (128, 384, 1152),
        (128, 384, 384),
        (128, 384, 1536),
        (128, 1536, 384),
        (1024, 384, 1536),
        (1024, 1536, 384),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i % 89) as f32 - 44.0) / 89.0)
            .collect();
        let bias = vec![0.1f32; n];
        let packed = PackedB::pack(&b, k, n, n).unwrap();
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        let reps = ((2e8 / flops) as usize).max(1);
        let (mut t_gemm, mut t_packed, mut t_gelu) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t0 = Instant::now();
            for _ in 0..reps {
                gemm(m, n, k, &a, k, &b, n, &mut c, n, false, true).unwrap();
                rlx_cpu::kernels::matmul::bias_act_rows(&mut c, &bias, None);
            }
            t_gemm.push(t0.elapsed().as_secs_f64() / reps as f64);
            let t0 = Instant::now();
            for _ in 0..reps {
                gemm_packed(m, &a, k, &packed, &mut c, n, Some(&bias), None, true).unwrap();
            }
            t_packed.push(t0.elapsed().as_secs_f64() / reps as f64);
            let t0 = Instant::now();
            for _ in 0..reps {
                let act = Some(rlx_ir::Activation::Gelu);
                gemm_packed(m, &a, k, &packed, &mut c, n, Some(&bias), act, true).unwrap();
            }
            t_gelu.push(t0.elapsed().as_secs_f64() / reps as f64);
        }
        let (g, p, e) = (median(t_gemm), median(t_packed), median(t_gelu));
        println!(
            "{m:>5} {k:>5} {n:>5} | {:>9.1} {:>9.1} {:>9.1} | {:>6.2}",
            flops / g / 1e9,
            flops / p / 1e9,
            flops / e / 1e9,
            p / g
        );
    }
}
