//! The batched decode step ([`LlamaModel::decode_batch`]) against each
//! sequence's own single-row `decode`: several sequences with different
//! prompt lengths, one joining mid-way and one leaving, on synthetic
//! SmolLM2-shaped weights (always) and on the real SmolLM2 GGUF (when
//! fetched), in thunks and hybrid mode; and the typed errors of bad input.
//!
//! What is asserted, per step and per sequence: the batched row's logits
//! are bit-identical to that sequence's solo `decode` logits, and the greedy
//! ids equal, when the quantized matmuls run on panels
//! (`rlx_cpu::kernels::quant_panels::panels_wanted`: AVX2 or AVX-512 VNNI),
//! whose rows are bit for bit the one-row product for any row count up to
//! `F32_PANEL_MAX_ROWS` (32, above `MAX_DECODE_BATCH`); every other op of
//! the step computes each row alone (norms, rope, elementwise) or per
//! sequence at the shapes of the one-row decode (cache writes, attention).
//! Without panels (a portable build) the GGUF-layout kernel's many-row
//! path rounds differently from its one-row GEMV, so there the rows are
//! held to 1e-3 absolute and equal greedy ids. Every sequence is fed its own
//! solo greedy ids, so the rows stay comparable.

use rlx_cpu::kernels::quant_panels::panels_wanted;
use rlx_cpu::CpuOptions;
use rlx_ir::QuantScheme;
use rlx_models::llama::{
    argmax, KvCache, LlamaConfig, LlamaError, LlamaModel, LlamaWeights, MAX_DECODE_BATCH,
};
use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let p = dir.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        println!(
            "skipped: model not fetched ({} missing; run scripts/fetch_models.py smollm2)",
            p.display()
        );
        None
    }
}

/// SmolLM2's block shapes with fewer layers and a smaller vocabulary, so
/// the synthetic runs stay quick.
fn small_config() -> LlamaConfig {
    LlamaConfig {
        n_layers: 4,
        vocab: 2048,
        ..LlamaConfig::smollm2_135m()
    }
}

fn synthetic(hybrid: bool, ctx: usize) -> LlamaModel {
    let w =
        LlamaWeights::synthetic(&small_config(), QuantScheme::Q4_1, QuantScheme::Q8_0, 11).unwrap();
    LlamaModel::from_weights(w, ctx, opts(hybrid)).unwrap()
}

fn opts(hybrid: bool) -> CpuOptions {
    CpuOptions {
        hybrid,
        ..CpuOptions::default()
    }
}

fn prompt(len: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + salt * 101 + 5) % vocab as u32)
        .collect()
}

/// Prefill `ids` into a fresh cache of `m` and hand it back with the logits.
fn prefill(m: &mut LlamaModel, ids: &[u32]) -> (KvCache, Vec<f32>) {
    let old = m.swap_cache(m.new_cache()).unwrap();
    let logits = m.prefill(ids).unwrap();
    let cache = m.swap_cache(old).unwrap();
    (cache, logits)
}

/// A sequence's solo run: the logits after the prompt and after each of
/// `steps` greedy decode steps (`steps + 1` rows), and the greedy ids.
struct Solo {
    logits: Vec<Vec<f32>>,
    ids: Vec<u32>,
}

fn solo(m: &mut LlamaModel, p: &[u32], steps: usize) -> Solo {
    let (cache, first) = prefill(m, p);
    let old = m.swap_cache(cache).unwrap();
    let mut logits = vec![first];
    let mut ids = Vec::new();
    for _ in 0..steps {
        let id = argmax(logits.last().unwrap());
        ids.push(id);
        logits.push(m.decode(id).unwrap());
    }
    ids.push(argmax(logits.last().unwrap()));
    m.swap_cache(old).unwrap();
    Solo { logits, ids }
}

/// One sequence of a batched run: when it joins (step), how many steps it
/// runs, its prompt.
struct Plan {
    join: usize,
    steps: usize,
    prompt: Vec<u32>,
}

/// Run `plans` through `decode_batch` (sequences join at their step with a
/// prefill and leave after their steps) and compare every row against the
/// sequence's solo run. Returns (rows compared, rows bit-identical, largest
/// |diff|, largest batch).
fn check_batched(m: &mut LlamaModel, plans: &[Plan], what: &str) -> (usize, usize, f32, usize) {
    let solos: Vec<Solo> = plans.iter().map(|p| solo(m, &p.prompt, p.steps)).collect();
    let last = plans.iter().map(|p| p.join + p.steps).max().unwrap();
    // (plan index, cache, steps done)
    let mut live: Vec<(usize, KvCache, usize)> = Vec::new();
    let (mut rows, mut exact, mut worst, mut widest) = (0, 0, 0.0f32, 0);
    for step in 0..last {
        for (i, p) in plans.iter().enumerate() {
            if p.join == step {
                let (cache, logits) = prefill(m, &p.prompt);
                assert_eq!(
                    logits, solos[i].logits[0],
                    "{what}: seq {i} prefill differs from its solo prefill"
                );
                live.push((i, cache, 0));
            }
        }
        live.retain(|(i, _, done)| *done < plans[*i].steps);
        if live.is_empty() {
            continue;
        }
        let n = live.len();
        widest = widest.max(n);
        let mut batch: Vec<(&mut KvCache, u32)> = live
            .iter_mut()
            .map(|(i, c, done)| (c, solos[*i].ids[*done]))
            .collect();
        let out = m.decode_batch(&mut batch).unwrap();
        assert_eq!(out.len(), n);
        for ((i, c, done), got) in live.iter_mut().zip(&out) {
            *done += 1;
            let s = &solos[*i];
            assert_eq!(c.position(), plans[*i].prompt.len() + *done);
            let want = &s.logits[*done];
            let diff = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            rows += 1;
            let same_bits = got
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            exact += usize::from(same_bits);
            worst = worst.max(diff);
            if bit_exact() {
                assert!(
                    same_bits,
                    "{what}: step {step}, seq {i} (row of {n}): batched logits differ from solo decode (max |diff| {diff})"
                );
            } else {
                assert!(
                    diff <= 1e-3,
                    "{what}: step {step}, seq {i} (row of {n}): max |diff| {diff} > 1e-3"
                );
            }
            assert_eq!(
                argmax(got),
                s.ids[*done],
                "{what}: step {step}, seq {i}: greedy id differs"
            );
        }
    }
    println!(
        "{what}: {rows} rows, {exact} bit-identical, max |diff| {worst:e}, batches up to {widest}"
    );
    (rows, exact, worst, widest)
}

/// Whether batched rows must be bit-identical to the solo decode here: the
/// quantized matmuls of both weight formats run on panels.
fn bit_exact() -> bool {
    panels_wanted(QuantScheme::Q4_1) && panels_wanted(QuantScheme::Q8_0)
}

/// Five sequences of prompt lengths 3..20 over 24+ steps: one joins at step
/// 6, one leaves after 10 steps.
fn join_leave_plans(vocab: usize) -> Vec<Plan> {
    let lens = [3usize, 7, 12, 1, 20];
    lens.iter()
        .enumerate()
        .map(|(i, &len)| Plan {
            join: if i == 3 { 6 } else { 0 },
            steps: if i == 1 { 10 } else { 24 },
            prompt: prompt(len, i as u32, vocab),
        })
        .collect()
}

/// Sixteen sequences at once (`MAX_DECODE_BATCH`), 6 steps.
fn wide_plans(vocab: usize) -> Vec<Plan> {
    (0..16)
        .map(|i| Plan {
            join: 0,
            steps: 6,
            prompt: prompt(2 + i * 3, 50 + i as u32, vocab),
        })
        .collect()
}

#[test]
fn synthetic_batched_rows_equal_solo_decode() {
    for hybrid in [false, true] {
        let what = if hybrid {
            "synthetic hybrid"
        } else {
            "synthetic thunks"
        };
        let mut m = synthetic(hybrid, 64);
        let vocab = m.config().vocab;
        let (rows, exact, _, widest) = check_batched(&mut m, &join_leave_plans(vocab), what);
        assert_eq!((rows, widest), (4 * 24 + 10, 5));
        if bit_exact() {
            assert_eq!(rows, exact, "{what}: every row is bit-identical");
        }
        let (rows, exact, _, widest) = check_batched(&mut m, &wide_plans(vocab), what);
        assert_eq!((rows, widest), (96, 16));
        if bit_exact() {
            assert_eq!(rows, exact, "{what}: every row is bit-identical");
        }
    }
}

#[test]
fn smollm2_batched_rows_equal_solo_decode() {
    let Some(path) = model_path() else { return };
    for hybrid in [false, true] {
        let what = if hybrid {
            "SmolLM2 hybrid"
        } else {
            "SmolLM2 thunks"
        };
        let mut m = LlamaModel::load_with(&path, 96, opts(hybrid)).unwrap();
        let vocab = m.config().vocab;
        for plans in [join_leave_plans(vocab), wide_plans(vocab)] {
            let (rows, exact, _, _) = check_batched(&mut m, &plans, what);
            if bit_exact() {
                assert_eq!(rows, exact, "{what}: every row is bit-identical");
            }
        }
    }
}

#[test]
fn decode_batch_rejects_bad_input_and_changes_nothing() {
    let mut m = synthetic(false, 16);
    let vocab = m.config().vocab;
    let (mut a, _) = prefill(&mut m, &[1, 2, 3]);
    let (mut b, _) = prefill(&mut m, &[4, 5]);
    // No sequences.
    let err = m.decode_batch(&mut []).unwrap_err();
    assert!(
        matches!(err, LlamaError::BatchSize { batch: 0, max } if max == MAX_DECODE_BATCH),
        "{err}"
    );
    // Too many.
    let mut many: Vec<KvCache> = (0..=MAX_DECODE_BATCH).map(|_| m.new_cache()).collect();
    let mut steps: Vec<(&mut KvCache, u32)> = many.iter_mut().map(|c| (c, 1)).collect();
    let err = m.decode_batch(&mut steps).unwrap_err();
    assert!(
        matches!(err, LlamaError::BatchSize { batch, .. } if batch == MAX_DECODE_BATCH + 1),
        "{err}"
    );
    // An id out of range in sequence 1: nothing runs, no cache moves.
    let err = m
        .decode_batch(&mut [(&mut a, 7), (&mut b, vocab as u32)])
        .unwrap_err();
    match &err {
        LlamaError::BatchSequence { index: 1, source } => assert!(
            matches!(**source, LlamaError::TokenOutOfRange { id, position: 2, vocab: v } if id == vocab as u32 && v == vocab),
            "{err}"
        ),
        _ => panic!("wrong error: {err}"),
    }
    assert_eq!((a.position(), b.position()), (3, 2));
    // An empty cache (never prefilled).
    let mut fresh = m.new_cache();
    let err = m
        .decode_batch(&mut [(&mut a, 7), (&mut fresh, 1)])
        .unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 1, source } if matches!(**source, LlamaError::NoPrefill)),
        "{err}"
    );
    // A cache of another model (same shapes) and of another context.
    let mut other = synthetic(false, 16);
    let (mut foreign, _) = prefill(&mut other, &[1, 2]);
    let err = m
        .decode_batch(&mut [(&mut foreign, 1), (&mut a, 7)])
        .unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 0, source } if matches!(**source, LlamaError::ForeignCache { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("another model"), "{err}");
    let mut longer = synthetic(false, 32);
    let (mut wrong_ctx, _) = prefill(&mut longer, &[1, 2]);
    let err = m.decode_batch(&mut [(&mut wrong_ctx, 3)]).unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 0, source } if matches!(**source, LlamaError::ForeignCache { .. })),
        "{err}"
    );
    assert_eq!(wrong_ctx.position(), 2);
    // Its own model takes it.
    assert_eq!(
        longer
            .decode_batch(&mut [(&mut wrong_ctx, 3)])
            .unwrap()
            .len(),
        1
    );
    assert_eq!(wrong_ctx.position(), 3);
    // A full cache.
    let (mut full, _) = prefill(&mut m, &(0..16).collect::<Vec<u32>>());
    let err = m
        .decode_batch(&mut [(&mut a, 7), (&mut full, 1)])
        .unwrap_err();
    assert!(
        matches!(&err, LlamaError::BatchSequence { index: 1, source } if matches!(**source, LlamaError::ContextOverflow { needed: 17, ctx_len: 16 })),
        "{err}"
    );
    assert!(err.to_string().contains("sequence 1"), "{err}");
    // The good caches still work, and each advanced once.
    let out = m.decode_batch(&mut [(&mut a, 7), (&mut b, 8)]).unwrap();
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|l| l.len() == vocab));
    assert_eq!((a.position(), b.position()), (4, 3));
}

/// Aggregate decode tokens/s of `decode_batch` at 1, 4, 8 and 16
/// sequences against one stream's `decode`, on SmolLM2 (synthetic weights
/// of its shapes when the file is missing), hybrid mode (as `rlx serve`
/// runs it). The configurations take turns step by step (one `decode`, one
/// batched step of 1, of 4, ...), so a machine shared with other work
/// slows them alike; each reports its median step time. `RLX_BATCH_STEPS`
/// sets the timed steps (default 48), `RLX_THREADS` the worker threads,
/// `RLX_CTX` the KV context (default: what the steps need; `rlx serve`
/// runs 2048, which costs the same: attention reads the filled positions);
/// `RLX_INT8=1` rounds the quantized matmuls' activations to int8 blocks
/// (llama.cpp's scheme) instead of f32.
#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn batched_decode_tok_s() {
    let steps: usize = std::env::var("RLX_BATCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    let threads = std::env::var("RLX_THREADS")
        .ok()
        .and_then(|s| s.parse().ok());
    let prompt_len = 32;
    let ctx = std::env::var("RLX_CTX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0usize)
        .max(prompt_len + 2 + steps);
    let opts = CpuOptions {
        hybrid: true,
        threads,
        ..CpuOptions::default()
    };
    let int8 = std::env::var("RLX_INT8").is_ok_and(|v| v == "1");
    let (mut w, what) = match model_path() {
        Some(p) => {
            let f = rlx_formats::GgufFile::open(&p).unwrap();
            let c = LlamaConfig::from_gguf(&f).unwrap();
            (
                LlamaWeights::load(&f, &c).unwrap(),
                "SmolLM2-135M Q4_1 GGUF",
            )
        }
        None => (
            LlamaWeights::synthetic(
                &LlamaConfig::smollm2_135m(),
                QuantScheme::Q4_1,
                QuantScheme::Q8_0,
                7,
            )
            .unwrap(),
            "synthetic SmolLM2-shaped weights",
        ),
    };
    if int8 {
        w.activations = rlx_ir::ActivationPrecision::Int8;
    }
    let mut m = LlamaModel::from_weights(w, ctx, opts).unwrap();
    let vocab = m.config().vocab;
    let sizes = [1usize, 4, 8, 16];
    // The single stream lives in the model's own cache.
    let mut single_logits = m.prefill(&prompt(prompt_len, 0, vocab)).unwrap();
    let mut groups: Vec<Vec<(KvCache, u32)>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| {
                    let (c, l) = prefill(&mut m, &prompt(prompt_len, i as u32 + 1, vocab));
                    (c, argmax(&l))
                })
                .collect()
        })
        .collect();
    let step = |m: &mut LlamaModel, g: &mut Vec<(KvCache, u32)>| {
        let mut b: Vec<(&mut KvCache, u32)> = g.iter_mut().map(|(c, id)| (c, *id)).collect();
        let out = m.decode_batch(&mut b).unwrap();
        for ((_, id), l) in g.iter_mut().zip(&out) {
            *id = argmax(l);
        }
    };
    // The first step of each size compiles its graph: not timed.
    let mut first_ms = Vec::new();
    for g in groups.iter_mut() {
        let t = std::time::Instant::now();
        step(&mut m, g);
        first_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    single_logits = m.decode(argmax(&single_logits)).unwrap();
    let mut single_s = Vec::new();
    let mut group_s: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for _ in 0..steps {
        let t = std::time::Instant::now();
        single_logits = m.decode(argmax(&single_logits)).unwrap();
        single_s.push(t.elapsed().as_secs_f64());
        for (g, times) in groups.iter_mut().zip(group_s.iter_mut()) {
            let t = std::time::Instant::now();
            step(&mut m, g);
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let single = 1.0 / median(single_s);
    let acts = if int8 { "int8" } else { "f32" };
    println!(
        "model: {what}, {acts} activations, ctx {ctx}, hybrid, threads {threads:?}, {steps} interleaved steps per configuration"
    );
    println!("| sequences | step ms (median) | aggregate tok/s | vs one stream |");
    println!("|---|---|---|---|");
    println!(
        "| 1 (`decode`) | {:.2} | {single:.1} | 1.00x |",
        1e3 / single
    );
    for ((&n, times), first) in sizes.iter().zip(group_s).zip(first_ms) {
        let ms = median(times) * 1e3;
        let agg = n as f64 * 1e3 / ms;
        println!(
            "| {n} (`decode_batch`) | {ms:.2} | {agg:.1} | {:.2}x |",
            agg / single
        );
        eprintln!("  (first step of {n}, compile included: {first:.0} ms)");
    }
}
