//! Throughput of the activation kernels, on long rows and on the 16-float
//! tile rows of the GEMM epilogue (a timing aid; asserts nothing).
use rlx_cpu::kernels::elementwise::apply_activation;
use rlx_ir::Activation;
use std::time::Instant;

fn main() {
    let n = 1 << 20;
    let mut x: Vec<f32> = (0..n)
        .map(|i| ((i % 1000) as f32 - 500.0) / 100.0)
        .collect();
    for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
        for width in [n, 16] {
            let t0 = Instant::now();
            for _ in 0..10 {
                for row in x.chunks_mut(width) {
                    apply_activation(act, row);
                }
            }
            let ns = t0.elapsed().as_secs_f64() * 1e9 / (10 * n) as f64;
            println!("{act:?} rows of {width}: {ns:.3} ns/element");
        }
    }
    std::hint::black_box(&x);
    direct();
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_direct(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = rlx_cpu::kernels::simd::gelu_m::<rlx_cpu::kernels::simd::HwFma>(*v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_direct(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = rlx_cpu::kernels::simd::exp_m::<rlx_cpu::kernels::simd::HwFma>(*v);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
pub fn direct() {
    let n = 1 << 20;
    let mut x: Vec<f32> = (0..n)
        .map(|i| ((i % 1000) as f32 - 500.0) / 100.0)
        .collect();
    let t0 = Instant::now();
    for _ in 0..10 {
        unsafe { gelu_direct(&mut x) };
    }
    println!(
        "gelu direct {:.3} ns/el",
        t0.elapsed().as_secs_f64() * 1e9 / (10 * n) as f64
    );
    let t0 = Instant::now();
    for _ in 0..10 {
        x.iter_mut().for_each(|v| *v = (*v).clamp(-5.0, 5.0));
        unsafe { exp_direct(&mut x) };
    }
    println!(
        "exp direct {:.3} ns/el",
        t0.elapsed().as_secs_f64() * 1e9 / (10 * n) as f64
    );
}
