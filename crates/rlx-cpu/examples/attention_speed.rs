//! Time of one MiniLM-sized attention call (q/k/v read out of a packed QKV
//! buffer, all-ones keep-mask), single- and multi-threaded, in f32 and bf16;
//! the batch is the first argument (default 1), `f32` or `bf16` as the
//! second runs only that one. `SHAPE=smollm2` instead times SmolLM2-135M's
//! prefill attention (9 query heads on 3 kv heads of 64 dims, causal, q/k/v
//! out of one packed buffer). A timing aid; asserts nothing.
use rlx_cpu::kernels::attention::{attention, AttentionParams, AttnMask};
use rlx_ir::MaskKind;
use std::time::Instant;

fn main() {
    let b: usize = std::env::args().nth(1).map_or(1, |a| a.parse().unwrap());
    let smol = std::env::var("SHAPE").as_deref() == Ok("smollm2");
    let (s, h, hkv, d) = if smol {
        (128usize, 9usize, 3usize, 64usize)
    } else {
        (128, 12, 12, 32)
    };
    let w = h * d;
    let kw = hkv * d;
    let row = w + 2 * kw;
    let qkv: Vec<f32> = (0..b * s * row)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let mask = vec![1f32; b * s];
    let mut out = vec![0f32; b * s * w];
    let mut p = AttentionParams {
        batch: b,
        seq_q: s,
        seq_k: s,
        num_heads: h,
        num_kv_heads: hkv,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: None,
        mask_kind: if smol {
            MaskKind::Causal
        } else {
            MaskKind::Custom
        },
        q_row_stride: row,
        k_row_stride: row,
        v_row_stride: row,
        out_row_stride: w,
        bf16: false,
    };
    let only = std::env::args().nth(2);
    for (parallel, bf16) in [(false, false), (true, false), (false, true), (true, true)] {
        if only
            .as_deref()
            .is_some_and(|o| o != if bf16 { "bf16" } else { "f32" })
        {
            continue;
        }
        p.bf16 = bf16;
        let mut times = Vec::new();
        for _ in 0..200 {
            let t0 = Instant::now();
            attention(
                &p,
                &qkv,
                &qkv[w..],
                &qkv[w + kw..],
                if smol {
                    AttnMask::None
                } else {
                    AttnMask::KeepF32(&mask)
                },
                &mut out,
                parallel,
            )
            .unwrap();
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let flops = 4.0 * (b * h * s * s * d) as f64;
        let med = times[times.len() / 2];
        println!(
            "parallel={parallel} bf16={bf16}: median {med:.4} ms, {:.1} GFLOP/s",
            flops / med / 1e6
        );
    }
}
