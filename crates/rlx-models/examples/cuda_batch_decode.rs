//! Aggregate decode throughput of `LlamaModel::decode_batch` on a CUDA GPU
//! at 1, 4, 8 and 16 sequences against single-stream `decode`, on
//! SmolLM2-135M-Instruct Q4_1 (`RLX_GGUF`, else the fetched file), or,
//! when neither file is there, on random weights of SmolLM2-135M's
//! dimensions (all 30 layers; Q4_1 projections, Q8_0 embedding / head),
//! which cost the same per step. Hybrid mode (each step one CUDA graph;
//! `HYBRID=0` for thunks), `CTX` positions (default 2048, as `rlx serve`),
//! prompts of 36 tokens, `STEPS` timed steps (default 64) after 4 warm-up
//! steps per size; median step time. Asserts nothing.
//!
//! `cargo run --release -p rlx-models --features cuda --example cuda_batch_decode`
use rlx_cuda::CudaOptions;
use rlx_models::llama::{argmax, KvCache, LlamaConfig, LlamaDevice, LlamaModel, LlamaWeights};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let ctx = env("CTX", 2048);
    let steps = env("STEPS", 64).max(1);
    let hybrid = env("HYBRID", 1) != 0;
    let opts = CudaOptions {
        hybrid,
        ..CudaOptions::default()
    };
    let path = std::env::var("RLX_GGUF").unwrap_or_else(|_| {
        format!(
            "{}/.cache/rlx/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let t = Instant::now();
    let (mut m, what) = if std::path::Path::new(&path).exists() {
        let m = LlamaModel::load_on(&path, ctx, LlamaDevice::Cuda(opts)).unwrap();
        (m, format!("SmolLM2-135M-Instruct Q4_1 ({path})"))
    } else {
        use rlx_ir::QuantScheme;
        let cfg = LlamaConfig::smollm2_135m();
        let w = LlamaWeights::synthetic(&cfg, QuantScheme::Q4_1, QuantScheme::Q8_0, 7).unwrap();
        let m = LlamaModel::from_weights_on(w, ctx, LlamaDevice::Cuda(opts)).unwrap();
        (
            m,
            format!(
                "random weights of SmolLM2-135M's dims ({} layers, Q4_1, Q8_0 head; {path} not found)",
                cfg.n_layers
            ),
        )
    };
    println!(
        "model: {what}; ctx {ctx}, {} mode",
        if hybrid {
            "hybrid (CUDA graphs)"
        } else {
            "thunks"
        }
    );
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
    let prompt = |salt: u32| -> Vec<u32> {
        (0..36u32)
            .map(|i| (i * 37 + salt * 101 + 5) % vocab)
            .collect()
    };
    // Single stream: the model's own cache, one `decode` per token.
    let mut id = argmax(&m.prefill(&prompt(99)).unwrap());
    for _ in 0..4 {
        id = argmax(&m.decode(id).unwrap());
    }
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        let l = m.decode(id).unwrap();
        times.push(t.elapsed().as_secs_f64());
        id = argmax(&l);
    }
    let solo = median(times);
    let solo_tps = 1.0 / solo;
    println!(
        "decode (single stream): median {:.3} ms/token, {solo_tps:.0} tok/s",
        solo * 1e3
    );
    // 16 sequences, each prefilled into its own cache.
    let mut seqs: Vec<(KvCache, u32)> = (0..16)
        .map(|i| {
            let parked = m.swap_cache(m.new_cache()).unwrap();
            let l = m.prefill(&prompt(i)).unwrap();
            let c = m.swap_cache(parked).unwrap();
            (c, argmax(&l))
        })
        .collect();
    println!("| streams | step ms (median) | aggregate tok/s | x single stream |");
    println!("|---:|---:|---:|---:|");
    for n in [1usize, 4, 8, 16] {
        let mut times = Vec::with_capacity(steps);
        for s in 0..steps + 4 {
            let t = Instant::now();
            let mut b: Vec<(&mut KvCache, u32)> =
                seqs[..n].iter_mut().map(|(c, id)| (c, *id)).collect();
            let out = m.decode_batch(&mut b).unwrap();
            if s >= 4 {
                times.push(t.elapsed().as_secs_f64());
            }
            for ((_, id), l) in seqs[..n].iter_mut().zip(&out) {
                *id = argmax(l);
            }
        }
        let step = median(times);
        let tps = n as f64 / step;
        println!(
            "| {n} | {:.3} | {tps:.0} | {:.2}x |",
            step * 1e3,
            tps / solo_tps
        );
    }
}
