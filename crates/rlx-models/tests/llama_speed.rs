//! Decode speed of SmolLM2-135M (Q4_1): 32 greedy decode steps after a
//! ~96-token prompt, context 136. Prints ms/token; asserts only that the
//! steps produce finite logits. Ignored by default; run it in release:
//! `cargo test --release -p rlx-models --test llama_speed -- --ignored --nocapture`.
//! Without the model file (or with `RLX_SYNTHETIC=1`) it times random
//! weights of the same shapes and formats. `RLX_SPEED_STEPS` sets the steps.

use rlx_cpu::CpuOptions;
use rlx_ir::QuantScheme;
use rlx_models::llama::{argmax, LlamaConfig, LlamaModel, LlamaWeights};
use std::path::PathBuf;
use std::time::Instant;

fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let p = dir.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        println!("skipped: model not fetched ({} missing)", p.display());
        None
    }
}

/// The real model, or (when it is missing or `RLX_SYNTHETIC=1`) random
/// weights of SmolLM2-135M's shapes and formats (Q4_1, Q8_0 tied head).
fn load(ctx: usize, opts: CpuOptions) -> (LlamaModel, &'static str) {
    let synthetic = std::env::var("RLX_SYNTHETIC").is_ok_and(|v| v == "1");
    if !synthetic {
        if let Some(path) = model_path() {
            return (
                LlamaModel::load_with(&path, ctx, opts).unwrap(),
                "SmolLM2 GGUF",
            );
        }
    }
    let w = LlamaWeights::synthetic(
        &LlamaConfig::smollm2_135m(),
        QuantScheme::Q4_1,
        QuantScheme::Q8_0,
        7,
    )
    .unwrap();
    (
        LlamaModel::from_weights(w, ctx, opts).unwrap(),
        "synthetic SmolLM2-shaped weights",
    )
}

#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn decode_ms_per_token() {
    let base = [
        6403u32, 1980, 253, 655, 28, 665, 436, 253, 1838, 8085, 617, 761,
    ];
    let prompt: Vec<u32> = base.iter().cycle().take(96).copied().collect();
    // RLX_SPEED_STEPS overrides the number of timed steps (e.g. for perf).
    let steps: usize = std::env::var("RLX_SPEED_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    for hybrid in [false, true] {
        let opts = CpuOptions {
            hybrid,
            ..CpuOptions::default()
        };
        // RLX_SPEED_CTX overrides the context length (the decode attention
        // spans the whole cache under a keep-mask).
        let ctx = std::env::var("RLX_SPEED_CTX")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(97 + steps + 8);
        let (mut m, what) = load(ctx, opts);
        // The first prefill of a length also compiles its graph.
        let t0 = Instant::now();
        m.prefill(&prompt).unwrap();
        let first = t0.elapsed();
        let t0 = Instant::now();
        let mut logits = m.prefill(&prompt).unwrap();
        let prefill = t0.elapsed();
        // Warm-up step, then 32 timed steps.
        logits = m.decode(argmax(&logits)).unwrap();
        let t1 = Instant::now();
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let t = Instant::now();
            logits = m.decode(argmax(&logits)).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            assert!(logits.iter().all(|v| v.is_finite()));
        }
        let per = t1.elapsed().as_secs_f64() * 1000.0 / steps as f64;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{what}, {}: prefill {} tokens {:.1} ms (first, with compile: {:.1} ms); decode mean {per:.2} \
             ms/token, median {median:.2}, min {:.2} at context {}..{} of {ctx} ({} threads)",
            if hybrid { "hybrid" } else { "thunks" },
            prompt.len(),
            prefill.as_secs_f64() * 1000.0,
            first.as_secs_f64() * 1000.0,
            times[0],
            prompt.len() + 1,
            m.position(),
            rayon_threads(),
        );
    }
}

/// Rayon's thread count: `RAYON_NUM_THREADS`, else the available cores.
fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
