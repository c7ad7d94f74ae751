//! Time of a decode step's attention (one query row, SmolLM2-135M heads:
//! 9 query heads over 3 KV heads of 64 dims, a KV cache of `ctx` rows of
//! which `pos` are kept) over 30 layers' caches, with a 3 MiB stream read
//! between layers as the weights of a real step would evict the caches.
//! Runs inside a rayon pool of `THREADS` (default 2) workers, as a model's
//! run does, and the stream read is parallel, as a quantized matmul is.
//! A timing aid; asserts nothing.
use rlx_cpu::kernels::attention::{attention, AttentionParams, AttnMask};
use rlx_ir::MaskKind;
use std::time::Instant;

fn main() {
    let threads = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(run);
}

fn run() {
    use rayon::prelude::*;
    let (hq, hkv, d, ctx, layers) = (9usize, 3usize, 64usize, 512usize, 30usize);
    let q: Vec<f32> = (0..hq * d)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let caches: Vec<(Vec<f32>, Vec<f32>)> = (0..layers)
        .map(|l| {
            let f = |i: usize| (((i + l) * 53 % 97) as f32 - 48.0) / 48.0;
            (
                (0..ctx * hkv * d).map(f).collect(),
                (0..ctx * hkv * d).map(|i| f(i + 7)).collect(),
            )
        })
        .collect();
    let stream = vec![
        1u8;
        std::env::var("STREAM_KB")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3072usize)
            << 10
    ];
    let mut out = vec![0f32; hq * d];
    let mut sink = 0u64;
    for pos in [64usize, 192, 448] {
        let mut mask = vec![0f32; ctx];
        mask[..pos].fill(1.0);
        let p = AttentionParams {
            batch: 1,
            seq_q: 1,
            seq_k: ctx,
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: None,
            mask_kind: MaskKind::Custom,
            q_row_stride: hq * d,
            k_row_stride: hkv * d,
            v_row_stride: hkv * d,
            out_row_stride: hq * d,
            bf16: false,
        };
        let mut times = Vec::new();
        for _ in 0..40 {
            let mut t = 0.0;
            for (k, v) in &caches {
                sink += stream
                    .par_chunks(1 << 16)
                    .map(|c| c.iter().step_by(64).map(|&b| b as u64).sum::<u64>())
                    .sum::<u64>();
                let t0 = Instant::now();
                attention(&p, &q, k, v, AttnMask::KeepF32(&mask), &mut out, true).unwrap();
                t += t0.elapsed().as_secs_f64();
            }
            times.push(t * 1e6 / layers as f64);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        println!(
            "pos {pos}: median {:.1} us per layer, min {:.1} (out[0] {:.6})",
            times[times.len() / 2],
            times[0],
            out[0]
        );
    }
    std::hint::black_box(sink);
}
