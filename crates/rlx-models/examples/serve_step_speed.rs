//! Timing aid for `rlx serve`'s generation worker: the cost of a prefill
//! (each new length compiles its graph, sharing the decode model's packed
//! weights) and of one `decode_batch` step at 1, 2, 4, 8 and 16 sequences
//! (median and min of `STEPS`, default 16), on SmolLM2-135M
//! Q4_1 (`RLX_GGUF` or the fetched file), hybrid mode, `THREADS` workers
//! (default 2), `CTX` positions (default 2048, as `rlx serve`). Asserts
//! nothing.
use rlx_cpu::CpuOptions;
use rlx_models::llama::{argmax, KvCache, LlamaModel};
use std::time::Instant;

fn main() {
    let path = std::env::var("RLX_GGUF").unwrap_or_else(|_| {
        format!(
            "{}/.cache/rlx/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
            std::env::var("HOME").unwrap()
        )
    });
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let threads = env("THREADS", 2);
    let ctx = env("CTX", 2048);
    let steps = env("STEPS", 16);
    let opts = CpuOptions {
        hybrid: true,
        threads: Some(threads),
        ..CpuOptions::default()
    };
    let t = Instant::now();
    let mut m = LlamaModel::load_with(&path, ctx, opts).unwrap();
    println!(
        "load + compile decode: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    m.prepare_decode_batch(16).unwrap();
    println!(
        "prepare_decode_batch(16): {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let vocab = m.config().vocab as u32;
    let prompt = |len: usize, salt: u32| -> Vec<u32> {
        (0..len as u32)
            .map(|i| (i * 37 + salt * 101 + 5) % vocab)
            .collect()
    };
    let prefill = |m: &mut LlamaModel, ids: &[u32]| -> (KvCache, u32, f64) {
        let t = Instant::now();
        let old = m.swap_cache(m.new_cache()).unwrap();
        let l = m.prefill(ids).unwrap();
        let c = m.swap_cache(old).unwrap();
        (c, argmax(&l), t.elapsed().as_secs_f64() * 1e3)
    };
    for len in [30usize, 36, 48, 30, 36, 48] {
        let (_, _, ms) = prefill(&mut m, &prompt(len, 1));
        println!("prefill {len} tokens: {ms:.1} ms");
    }
    let mut seqs: Vec<(KvCache, u32)> = (0..16)
        .map(|i| {
            let (c, id, _) = prefill(&mut m, &prompt(36, i));
            (c, id)
        })
        .collect();
    for n in [1usize, 2, 4, 8, 16] {
        let mut times = Vec::new();
        for _ in 0..steps {
            let t = Instant::now();
            let mut b: Vec<(&mut KvCache, u32)> =
                seqs[..n].iter_mut().map(|(c, id)| (c, *id)).collect();
            let out = m.decode_batch(&mut b).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            for ((_, id), l) in seqs[..n].iter_mut().zip(&out) {
                *id = argmax(l);
            }
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!(
            "decode_batch {n:2}: median {med:.1} ms, min {:.1} ms, {:.1} tok/s ({:.2} ms/row)",
            times[0],
            n as f64 * 1e3 / med,
            med / n as f64
        );
    }
}
