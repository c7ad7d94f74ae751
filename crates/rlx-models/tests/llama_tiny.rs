//! A tiny random Llama written as a GGUF file: `LlamaModel` (CPU, thunks
//! and hybrid) against the reference interpreter on the same graphs, for
//! prefill and for decode steps reading the KV cache; and the typed load
//! errors (unsupported architecture, missing tensor, bad shape,
//! unsupported block type). Needs no downloaded model.

use rlx_cpu::CpuOptions;
use rlx_formats::GgufFile;
use rlx_ir::{Op, Tensor};
use rlx_models::llama::{
    build_graph, cache_names, extend_bias, LlamaConfig, LlamaError, LlamaModel, LlamaWeights, Phase,
};
use std::collections::HashMap;
use std::path::PathBuf;

#[path = "support/gguf_writer.rs"]
mod gguf_writer;
use gguf_writer::{blocks, f32_bytes, Gguf, Rng, F32, IQ4_NL, Q4_1, Q8_0};

/// What to break in the tiny model.
#[derive(Clone, Copy, PartialEq)]
enum Flaw {
    None,
    Arch,
    MissingNorm,
    BadShape,
    UnsupportedType,
    /// Metadata key (without the arch prefix) written with this u32.
    MetaU32(&'static str, u32),
    /// Metadata key (without the arch prefix) written with this f32.
    MetaF32(&'static str, f32),
}

const D: usize = 64;
const FF: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const VOCAB: usize = 40;

fn tiny(flaw: Flaw, name: &str) -> PathBuf {
    tiny_arch("llama", flaw, name)
}

/// The tiny model under `arch`'s metadata keys. `qwen2` adds f32 biases to
/// q/k/v and stores v as Q4_1 like q and k, so the three merge (biases
/// included).
fn tiny_arch(arch: &str, flaw: Flaw, name: &str) -> PathBuf {
    let mut rng = Rng(42);
    let mut g = Gguf::default();
    let qwen2 = arch == "qwen2";
    g.kv_str(
        "general.architecture",
        if flaw == Flaw::Arch { "gpt2" } else { arch },
    );
    let key = |k: &str| format!("{arch}.{k}");
    let u32kv = |g: &mut Gguf, k: &str, v: u32| match flaw {
        Flaw::MetaU32(fk, fv) if fk == k => g.kv_u32(&key(k), fv),
        _ => g.kv_u32(&key(k), v),
    };
    let f32kv = |g: &mut Gguf, k: &str, v: f32| match flaw {
        Flaw::MetaF32(fk, fv) if fk == k => g.kv_f32(&key(k), fv),
        _ => g.kv_f32(&key(k), v),
    };
    u32kv(&mut g, "block_count", LAYERS as u32);
    u32kv(&mut g, "embedding_length", D as u32);
    u32kv(&mut g, "feed_forward_length", FF as u32);
    u32kv(&mut g, "attention.head_count", HEADS as u32);
    u32kv(&mut g, "attention.head_count_kv", KV_HEADS as u32);
    u32kv(&mut g, "rope.dimension_count", (D / HEADS) as u32);
    u32kv(&mut g, "context_length", 256);
    f32kv(&mut g, "rope.freq_base", if qwen2 { 1e6 } else { 10000.0 });
    f32kv(&mut g, "attention.layer_norm_rms_epsilon", 1e-5);
    let kv = KV_HEADS * D / HEADS;
    g.tensor(
        "token_embd.weight",
        &[VOCAB, D],
        Q8_0,
        blocks(Q8_0, VOCAB, D, &mut rng),
    );
    let norm = |rng: &mut Rng| -> Vec<u8> {
        f32_bytes(
            &(0..D)
                .map(|_| 0.5 + (rng.next() % 100) as f32 / 100.0)
                .collect::<Vec<_>>(),
        )
    };
    for l in 0..LAYERS {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        if !(flaw == Flaw::MissingNorm && l == 1) {
            let b = norm(&mut rng);
            g.tensor(&p("attn_norm"), &[D], F32, b);
        }
        let b = norm(&mut rng);
        g.tensor(&p("ffn_norm"), &[D], F32, b);
        let q_ty = if flaw == Flaw::UnsupportedType {
            IQ4_NL
        } else {
            Q4_1
        };
        g.tensor(&p("attn_q"), &[D, D], q_ty, blocks(q_ty, D, D, &mut rng));
        let k_rows = if flaw == Flaw::BadShape { kv + 32 } else { kv };
        g.tensor(
            &p("attn_k"),
            &[k_rows, D],
            Q4_1,
            blocks(Q4_1, k_rows, D, &mut rng),
        );
        let v_ty = if qwen2 { Q4_1 } else { Q8_0 };
        g.tensor(&p("attn_v"), &[kv, D], v_ty, blocks(v_ty, kv, D, &mut rng));
        if qwen2 {
            for (part, n) in [("attn_q", D), ("attn_k", kv), ("attn_v", kv)] {
                let b: Vec<f32> = (0..n)
                    .map(|_| (rng.next() % 200) as f32 / 100.0 - 1.0)
                    .collect();
                g.tensor(&format!("blk.{l}.{part}.bias"), &[n], F32, f32_bytes(&b));
            }
        }
        g.tensor(
            &p("attn_output"),
            &[D, D],
            Q4_1,
            blocks(Q4_1, D, D, &mut rng),
        );
        g.tensor(
            &p("ffn_gate"),
            &[FF, D],
            Q4_1,
            blocks(Q4_1, FF, D, &mut rng),
        );
        g.tensor(&p("ffn_up"), &[FF, D], Q4_1, blocks(Q4_1, FF, D, &mut rng));
        g.tensor(
            &p("ffn_down"),
            &[D, FF],
            Q8_0,
            blocks(Q8_0, D, FF, &mut rng),
        );
    }
    let b = norm(&mut rng);
    g.tensor("output_norm.weight", &[D], F32, b);
    g.write(name)
}

/// Run `graph` with the reference interpreter; returns the outputs and the
/// updated caches (the values of the CacheWrite nodes), by cache name.
fn reference(
    graph: &rlx_ir::Graph,
    w: &LlamaWeights,
    inputs: &[(&str, Tensor)],
    caches: &HashMap<String, Tensor>,
) -> (Vec<f32>, HashMap<String, Tensor>) {
    let mut b: HashMap<String, Tensor> = w.tensors.clone();
    b.extend(caches.clone());
    for (n, t) in inputs {
        b.insert(n.to_string(), t.clone());
    }
    let all = rlx_ref::run_all(graph, &b).unwrap();
    let mut new_caches = HashMap::new();
    for n in graph.nodes() {
        if let Op::CacheWrite { .. } = n.op {
            if let Op::Param { name } = &graph.node(n.inputs[0]).op {
                new_caches.insert(name.clone(), all[n.id.index()].clone());
            }
        }
    }
    let out = all[graph.outputs[0].index()].as_f32().unwrap().to_vec();
    (out, new_caches)
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale + 1e-6,
            "{what} [{i}]: got {g}, reference {w}"
        );
    }
}

#[test]
fn tiny_model_matches_reference_interpreter() {
    let path = tiny(Flaw::None, "ok.gguf");
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(
        (
            cfg.n_layers,
            cfg.d_model,
            cfg.n_kv_heads,
            cfg.head_dim,
            cfg.vocab
        ),
        (2, 64, 2, 16, VOCAB)
    );
    let ctx = 12;
    let prompt = [3u32, 17, 5, 39, 0];
    // Mixed Q4_1/Q8_0 q/k/v: not merged; gate/up (both Q4_1) merged.
    let w = LlamaWeights::load(&f, &cfg).unwrap();
    assert!(w.linears.contains_key("blk.0.attn_q.weight"));
    assert!(w.linears.contains_key("blk.0.ffn_gate_up.weight"));
    for hybrid in [false, true] {
        let opts = CpuOptions {
            hybrid,
            ..CpuOptions::default()
        };
        let mut m = LlamaModel::from_weights(w.clone(), ctx, opts).unwrap();
        let got = m.prefill(&prompt).unwrap();

        let g = build_graph(
            &w,
            Phase::Prefill {
                seq_len: prompt.len(),
            },
            ctx,
        )
        .unwrap();
        let kvd = cfg.kv_dim();
        let mut caches = HashMap::new();
        for l in 0..LAYERS {
            let (k, v) = cache_names(l);
            caches.insert(k, Tensor::f32(&[1, ctx, kvd], vec![0.0; ctx * kvd]));
            caches.insert(v, Tensor::f32(&[1, ctx, kvd], vec![0.0; ctx * kvd]));
        }
        let ids: Vec<i64> = prompt.iter().map(|&i| i as i64).collect();
        let inputs = [
            ("ids", Tensor::i64(&[1, prompt.len()], ids)),
            (
                "pos",
                Tensor::i64(&[prompt.len()], (0..prompt.len() as i64).collect()),
            ),
        ];
        let (want, mut caches) = reference(&g, &w, &inputs, &caches);
        assert_close(&got, &want, &format!("prefill (hybrid {hybrid})"));

        let dg = build_graph(&w, Phase::Decode, ctx).unwrap();
        for (step, &id) in [7u32, 21, 2].iter().enumerate() {
            let p = prompt.len() + step;
            let got = m.decode(id).unwrap();
            let mut mask = vec![0.0f32; ctx];
            mask[..=p].fill(1.0);
            let inputs = [
                ("ids", Tensor::i64(&[1, 1], vec![id as i64])),
                ("pos", Tensor::i64(&[1], vec![p as i64])),
                ("kv_mask", Tensor::f32(&[1, ctx], mask)),
            ];
            let (want, next) = reference(&dg, &w, &inputs, &caches);
            caches = next;
            assert_close(
                &got,
                &want,
                &format!("decode step {step} (hybrid {hybrid})"),
            );
        }
    }
}

/// `qwen2`: biases on the merged q/k/v, NeoX rope, θ from `qwen2.*`;
/// prefill and decode steps against the reference interpreter.
#[test]
fn tiny_qwen2_matches_reference_interpreter() {
    let path = tiny_arch("qwen2", Flaw::None, "qwen2.gguf");
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(cfg.arch, "qwen2");
    assert_eq!(cfg.rope_style, rlx_ir::RopeStyle::NeoX);
    assert_eq!(cfg.rope_theta, 1e6);
    let w = LlamaWeights::load(&f, &cfg).unwrap();
    assert!(w.tensors.contains_key("blk.0.attn_qkv.bias"));
    assert!(!w.tensors.contains_key("blk.0.attn_q.bias"));
    let unmerged = LlamaWeights::load_unmerged(&f, &cfg).unwrap();
    assert!(unmerged.tensors.contains_key("blk.1.attn_k.bias"));
    let ctx = 10;
    let prompt = [5u32, 1, 33, 12];
    for (w, hybrid) in [(&w, false), (&w, true), (&unmerged, false)] {
        let opts = CpuOptions {
            hybrid,
            ..CpuOptions::default()
        };
        let mut m = LlamaModel::from_weights(w.clone(), ctx, opts).unwrap();
        let got = m.prefill(&prompt).unwrap();
        let g = build_graph(
            w,
            Phase::Prefill {
                seq_len: prompt.len(),
            },
            ctx,
        )
        .unwrap();
        let adds = g
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Binary(rlx_ir::BinaryOp::Add)))
            .count();
        // Two residual adds per layer, plus one bias add per biased linear.
        let biased = if w.tensors.contains_key("blk.0.attn_qkv.bias") {
            1
        } else {
            3
        };
        assert_eq!(adds, LAYERS * (2 + biased));
        let kvd = cfg.kv_dim();
        let mut caches = HashMap::new();
        for l in 0..LAYERS {
            let (k, v) = cache_names(l);
            caches.insert(k, Tensor::f32(&[1, ctx, kvd], vec![0.0; ctx * kvd]));
            caches.insert(v, Tensor::f32(&[1, ctx, kvd], vec![0.0; ctx * kvd]));
        }
        let ids: Vec<i64> = prompt.iter().map(|&i| i as i64).collect();
        let inputs = [
            ("ids", Tensor::i64(&[1, prompt.len()], ids)),
            (
                "pos",
                Tensor::i64(&[prompt.len()], (0..prompt.len() as i64).collect()),
            ),
        ];
        let (want, mut caches) = reference(&g, w, &inputs, &caches);
        assert_close(&got, &want, &format!("qwen2 prefill (hybrid {hybrid})"));
        let dg = build_graph(w, Phase::Decode, ctx).unwrap();
        for (step, &id) in [9u32, 0].iter().enumerate() {
            let p = prompt.len() + step;
            let got = m.decode(id).unwrap();
            let mut mask = vec![0.0f32; ctx];
            mask[..=p].fill(1.0);
            let inputs = [
                ("ids", Tensor::i64(&[1, 1], vec![id as i64])),
                ("pos", Tensor::i64(&[1], vec![p as i64])),
                ("kv_mask", Tensor::f32(&[1, ctx], mask)),
            ];
            let (want, next) = reference(&dg, w, &inputs, &caches);
            caches = next;
            assert_close(
                &got,
                &want,
                &format!("qwen2 decode {step} (hybrid {hybrid})"),
            );
        }
    }
}

/// `prefill_continue` runs the extend graph (a chunk at a runtime start,
/// attention over the cache with a causal bias): against the reference
/// interpreter on the same graphs, after a 3-token prefill, for a 4-token
/// and then a 1-token chunk.
#[test]
fn tiny_extend_matches_reference_interpreter() {
    let path = tiny(Flaw::None, "extend.gguf");
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    let w = LlamaWeights::load(&f, &cfg).unwrap();
    let ctx = 12;
    let prompt = [3u32, 17, 5, 39, 0, 8, 21, 2];
    for hybrid in [false, true] {
        let opts = CpuOptions {
            hybrid,
            ..CpuOptions::default()
        };
        let mut m = LlamaModel::from_weights(w.clone(), ctx, opts).unwrap();
        m.prefill(&prompt[..3]).unwrap();
        let kvd = cfg.kv_dim();
        let mut caches = HashMap::new();
        for l in 0..LAYERS {
            let (k, v) = cache_names(l);
            caches.insert(k, Tensor::f32(&[1, ctx, kvd], vec![0.0; ctx * kvd]));
            caches.insert(v, Tensor::f32(&[1, ctx, kvd], vec![0.0; ctx * kvd]));
        }
        let ids = |r: &[u32]| r.iter().map(|&i| i as i64).collect::<Vec<_>>();
        let g = build_graph(&w, Phase::Prefill { seq_len: 3 }, ctx).unwrap();
        let inputs = [
            ("ids", Tensor::i64(&[1, 3], ids(&prompt[..3]))),
            ("pos", Tensor::i64(&[3], vec![0, 1, 2])),
        ];
        let (_, mut caches) = reference(&g, &w, &inputs, &caches);
        let mut p = 3;
        for len in [4, 1] {
            let got = m.prefill_continue(&prompt[p..p + len]).unwrap();
            let g = build_graph(&w, Phase::Extend { seq_len: len }, ctx).unwrap();
            let inputs = [
                ("ids", Tensor::i64(&[1, len], ids(&prompt[p..p + len]))),
                (
                    "pos",
                    Tensor::i64(&[len], (p as i64..(p + len) as i64).collect()),
                ),
                ("start", Tensor::i64(&[1], vec![p as i64])),
                (
                    "kv_bias",
                    Tensor::f32(&[1, 1, len, ctx], extend_bias(p, len, ctx)),
                ),
            ];
            let (want, next) = reference(&g, &w, &inputs, &caches);
            caches = next;
            assert_close(
                &got,
                &want,
                &format!("extend {len} at {p} (hybrid {hybrid})"),
            );
            p += len;
        }
        // The same logits as one prefill of all 8 tokens.
        let mut whole = LlamaModel::from_weights(w.clone(), ctx, CpuOptions::default()).unwrap();
        let want = whole.prefill(&prompt).unwrap();
        m.prefill(&prompt[..3]).unwrap();
        m.prefill_continue(&prompt[3..7]).unwrap();
        let got = m.prefill_continue(&prompt[7..]).unwrap();
        assert_close(
            &got,
            &want,
            &format!("chunks vs one prefill (hybrid {hybrid})"),
        );
    }
}

#[test]
fn load_errors_are_typed() {
    let err = LlamaModel::load(tiny(Flaw::Arch, "arch.gguf"), 8).unwrap_err();
    assert!(
        matches!(&err, LlamaError::UnsupportedArch { arch } if arch == "gpt2"),
        "{err}"
    );

    let err = LlamaModel::load(tiny(Flaw::MissingNorm, "missing.gguf"), 8).unwrap_err();
    assert!(
        matches!(&err, LlamaError::MissingTensor { name, expected } if name == "blk.1.attn_norm.weight" && expected.contains("[64]")),
        "{err}"
    );

    let err = LlamaModel::load(tiny(Flaw::BadShape, "shape.gguf"), 8).unwrap_err();
    assert!(
        matches!(&err, LlamaError::BadTensor { name, found, .. } if name == "blk.0.attn_k.weight" && found == &vec![64, 64]),
        "{err}"
    );
    assert!(err.to_string().contains("[32, 64]"), "{err}");

    let err = LlamaModel::load(tiny(Flaw::UnsupportedType, "iq.gguf"), 8).unwrap_err();
    assert!(
        matches!(&err, LlamaError::UnsupportedQuant { name, ty } if name == "blk.0.attn_q.weight" && ty.name() == "IQ4_NL"),
        "{err}"
    );
}

#[test]
fn bad_hyperparameters_name_key_value_and_expectation() {
    use Flaw::{MetaF32, MetaU32};
    let cases: [(Flaw, &str, &[&str]); 10] = [
        (
            MetaU32("attention.head_count", 0),
            "heads0",
            &[
                "llama.attention.head_count = 0",
                "positive divisor of embedding_length 64",
            ],
        ),
        (
            MetaU32("attention.head_count", 5),
            "heads5",
            &["llama.attention.head_count = 5", "embedding_length 64"],
        ),
        (
            MetaU32("attention.head_count_kv", 3),
            "kv3",
            &[
                "llama.attention.head_count_kv = 3",
                "divisor of attention.head_count 4",
            ],
        ),
        (
            MetaU32("block_count", 10_000_000),
            "layers",
            &[
                "llama.block_count = 10000000",
                "blk.N tensor groups in the file (2)",
            ],
        ),
        (
            MetaU32("block_count", 3),
            "layers3",
            &["llama.block_count = 3", "(2)"],
        ),
        (
            MetaF32("attention.layer_norm_rms_epsilon", -1.0),
            "eps",
            &[
                "llama.attention.layer_norm_rms_epsilon = -1",
                "positive finite",
            ],
        ),
        (
            MetaF32("rope.freq_base", f32::NAN),
            "theta",
            &["llama.rope.freq_base = NaN", "positive finite"],
        ),
        (
            MetaU32("rope.dimension_count", 7),
            "rot",
            &[
                "llama.rope.dimension_count = 7",
                "even positive integer <= head_dim 16",
            ],
        ),
        (
            MetaU32("embedding_length", 32),
            "width",
            &["llama.embedding_length = 32"],
        ),
        (
            MetaU32("context_length", 0),
            "ctx0",
            &["llama.context_length = 0", "positive integer"],
        ),
    ];
    for (flaw, name, wants) in cases {
        let t = std::time::Instant::now();
        let err = LlamaModel::load(tiny(flaw, &format!("{name}.gguf")), 8).unwrap_err();
        assert!(t.elapsed().as_secs() < 10, "{name}: took {:?}", t.elapsed());
        let msg = err.to_string();
        for w in wants {
            assert!(msg.contains(w), "{name}: {msg:?} lacks {w:?}");
        }
    }
}

#[test]
fn context_length_bounds_the_kv_cache() {
    let path = tiny(Flaw::None, "ctxbound.gguf");
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(cfg.context_length, Some(256));
    let w = LlamaWeights::load(&f, &cfg).unwrap();
    for ctx in [257, 1 << 62] {
        let err = LlamaModel::from_weights(w.clone(), ctx, CpuOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, LlamaError::ContextLength { max: 256, .. }),
            "{msg}"
        );
        assert!(
            msg.contains(&ctx.to_string()) && msg.contains("llama.context_length"),
            "{msg}"
        );
        // Graph building refuses it too, before any shape is sized by it.
        assert!(build_graph(&w, Phase::Decode, ctx).is_err());
    }
    // Without a context length in the file, a KV cache beyond memory is
    // refused before it is allocated, naming the size.
    let mut w2 = w.clone();
    w2.config.context_length = None;
    let err = LlamaModel::from_weights(w2, 1 << 40, CpuOptions::default()).unwrap_err();
    assert!(err.to_string().contains("KV caches"), "{err}");
    assert!(LlamaModel::from_weights(w, 256, CpuOptions::default()).is_ok());
}

/// The wide-head `gemma3` file of `gguf_writer::gemma3_wide` (the one the
/// CUDA test `cuda_llama.rs` compares with this backend): its config reads
/// as Gemma-3-270M's attention shape, CPU thunks and hybrid agree over a
/// prefill and 8 decode steps, and the window of the local layers is in
/// effect (a window of 4 and one of 64 give different logits once the
/// sequence is longer than 4).
#[test]
fn wide_head_gemma3_runs_on_the_cpu() {
    use rlx_models::llama::{argmax, LlamaDevice};
    let path = gguf_writer::gemma3_wide("gemma3_wide.gguf", 4);
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(
        (
            cfg.n_layers,
            cfg.d_model,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim
        ),
        (6, 256, 4, 1, 256)
    );
    assert_eq!(cfg.block.sliding_window, Some(4));
    assert_eq!(
        (0..6).map(|l| cfg.block.is_swa(l)).collect::<Vec<_>>(),
        [true, true, true, true, true, false]
    );
    let prompt = [3u32, 17, 5, 39, 0, 22, 8, 11, 30];
    let run = |path: &PathBuf, hybrid: bool| -> Vec<Vec<f32>> {
        let opts = CpuOptions {
            hybrid,
            ..CpuOptions::default()
        };
        let mut m = LlamaModel::load_on(path, 32, LlamaDevice::Cpu(opts)).unwrap();
        let mut out = vec![m.prefill(&prompt).unwrap()];
        for _ in 0..8 {
            let id = argmax(out.last().unwrap());
            out.push(m.decode(id).unwrap());
        }
        out
    };
    let thunks = run(&path, false);
    for (step, (h, t)) in run(&path, true).iter().zip(&thunks).enumerate() {
        assert!(t.iter().all(|v| v.is_finite()), "step {step}");
        let scale = t.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.1, "step {step}: logits up to {scale}");
        let d = h
            .iter()
            .zip(t)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            d <= 1e-4 * scale,
            "step {step}: hybrid vs thunks {d} (max |logit| {scale})"
        );
    }
    let wide = run(&gguf_writer::gemma3_wide("gemma3_wide_64.gguf", 64), false);
    let d = wide[0]
        .iter()
        .zip(&thunks[0])
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        d > 1e-3,
        "a window of 4 and of 64 give the same prefill logits ({d})"
    );
}
