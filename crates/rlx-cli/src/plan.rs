//! `rlx plan`.

use crate::checks;
use crate::{DeviceArg, Mode};
use clap::Args;
use rlx::cpu::{CpuModel, CpuOptions};
use rlx::hybrid::PlanReport;
use rlx::models::bert::{build_graph, BertConfig, BertOutputs};
use rlx::runtime::{Executable, MemoryStats};
use serde_json::json;
use std::path::PathBuf;

/// Arguments of `rlx plan`.
#[derive(Args)]
pub struct PlanArgs {
    /// `bert6` (the BERT-6 encoder, token outputs), `minilm` (the fetched
    /// model's full embedding graph; `mpnet` likewise), `gdn-hybrid` (GatedDeltaNet and
    /// attention layers 3:1, synthetic dims), a BERT model directory, or a
    /// llama-architecture `.gguf` file (`smollm2`: the fetched SmolLM2),
    /// planned as its prefill graph of `--seq` tokens (`--seq 1`: the
    /// decode graph), or an HF directory of a Qwen3-Next / Qwen3.5 text
    /// model (`config.json` + `model.safetensors`), planned as its step
    /// graph of `--seq` tokens over a KV cache of `--ctx` positions.
    #[arg(long, default_value = "bert6")]
    model: String,
    /// GGUF models: KV cache positions.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// GGUF models: quantized matmuls round their activations to 8-bit
    /// blocks (llama.cpp's arithmetic; looser numerics, faster).
    #[arg(long)]
    int8_activations: bool,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sequence length.
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Execution mode to plan.
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// Skip the graph optimizer.
    #[arg(long)]
    no_opt: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also print the graph, one line per node.
    #[arg(long)]
    dump: bool,
    /// Plan for this device. `cuda` shows the CUDA segment plan (what
    /// becomes one CUDA graph, what stays on thunks and why) and the
    /// storage plan; it needs a build with `--features cuda` but no GPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// CPU: plan for this many worker threads (segment chunking depends on
    /// it; default: one per core). May exceed this machine's cores, to see
    /// another machine's plan (at most 512).
    #[arg(long)]
    threads: Option<usize>,
    /// Arithmetic to plan for (CUDA: f32, tf32, bf16, f16).
    #[arg(long, default_value = "f32")]
    precision: rlx::Precision,
}

/// The plan of one device: report, arena figures, device-specific lines
/// and JSON fields.
struct Planned {
    report: PlanReport,
    memory: MemoryStats,
    lines: Vec<String>,
    extra: serde_json::Value,
}

fn plan_cpu(g: &rlx::ir::Graph, a: &PlanArgs) -> Result<Planned, String> {
    if !matches!(a.precision, rlx::Precision::F32 | rlx::Precision::Bf16) {
        return Err(format!(
            "--precision {}: the CPU backend runs f32 or bf16 (use --device cuda)",
            a.precision
        ));
    }
    // Planning for another machine's thread count is allowed (the pool's
    // threads stay idle), within a bound.
    if let Some(t) = a.threads.filter(|&t| t == 0 || t > MAX_PLAN_THREADS) {
        return Err(format!("--threads {t}: expected 1..={MAX_PLAN_THREADS}"));
    }
    let model = compile(g, a.mode == Mode::Hybrid, a.threads)?;
    let isa = rlx::cpu::Isa::active();
    let bf16_hw = rlx::cpu::CpuFeatures::get().avx512bf16 && isa == rlx::cpu::Isa::Avx512;
    let mut lines = vec![format!(
        "cpu kernels: {isa} on {} threads{}",
        a.threads.unwrap_or_else(rayon_threads),
        match a.precision {
            rlx::Precision::Bf16 if bf16_hw => ", bf16 matmuls with AVX512-BF16",
            rlx::Precision::Bf16 => ", bf16 matmuls on the portable kernel (no AVX512-BF16 here)",
            _ => "",
        }
    )];
    for (first, last, layout) in model.segment_layouts() {
        lines.push(format!("  segment {first}..={last}: {layout}"));
    }
    Ok(Planned {
        report: model.report().clone(),
        memory: model.memory(),
        lines,
        extra: json!({"isa": isa.name()}),
    })
}

/// The most threads `rlx plan --threads` plans for.
const MAX_PLAN_THREADS: usize = 512;

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(feature = "cuda")]
fn plan_cuda(g: &rlx::ir::Graph, a: &PlanArgs) -> Result<Planned, String> {
    let opts = rlx::cuda::CudaOptions {
        hybrid: a.mode == Mode::Hybrid,
        precision: a.precision,
        ..Default::default()
    };
    let p = rlx::cuda::plan(g.clone(), &opts).map_err(|e| e.to_string())?;
    Ok(Planned {
        lines: vec![
            format!(
                "cuda storage ({}): {} tensors in 16 bits, {} matmul weights stored [out, in], {} narrows read in place by attention",
                a.precision, p.half_tensors, p.transposed_weights, p.folded_narrows
            ),
            format!(
                "cuda fusion: {} elementwise chains ({} ops) become one generated kernel each; {} quantized GEMVs absorb {} norm / SwiGLU / Add ops; {} ropes do {} cache writes; {} reductions absorb their Binary; {} mean poolings run as one kernel; {} LayerNorms compute their matmul; {} norms absorb their Add; {} gathers are read by their norm",
                p.fused_chains, p.fused_nodes, p.fused_gemvs, p.gemv_absorbed, p.fused_ropes, p.rope_writes,
                p.fused_reduces, p.fused_pools, p.fused_gemm_norms, p.fused_norm_adds, p.fused_norm_gathers
            ),
        ],
        extra: json!({"half_tensors": p.half_tensors, "transposed_weights": p.transposed_weights,
            "folded_narrows": p.folded_narrows, "fused_chains": p.fused_chains,
            "fused_nodes": p.fused_nodes, "fused_gemvs": p.fused_gemvs,
            "gemv_absorbed": p.gemv_absorbed, "fused_ropes": p.fused_ropes,
            "rope_writes": p.rope_writes, "fused_reduces": p.fused_reduces, "fused_pools": p.fused_pools,
            "fused_gemm_norms": p.fused_gemm_norms, "fused_norm_adds": p.fused_norm_adds, "fused_norm_gathers": p.fused_norm_gathers}),
        report: p.report,
        memory: p.memory,
    })
}

#[cfg(not(feature = "cuda"))]
fn plan_cuda(_: &rlx::ir::Graph, _: &PlanArgs) -> Result<Planned, String> {
    Err("--device cuda: the CUDA backend is not part of this build".into())
}

/// Resolve a `--model` value to a config and whether the graph pools.
pub fn resolve_config(model: &str) -> Result<(BertConfig, bool, Option<PathBuf>), String> {
    match model {
        "bert6" => Ok((BertConfig::minilm_l6(), false, None)),
        other => {
            let dir = if std::path::Path::new(other).exists() {
                PathBuf::from(other)
            } else {
                crate::embed_model_dir(other)?
            };
            let (cfg, _) = rlx::models::bert::load_dir_config(&dir).map_err(|e| e.to_string())?;
            Ok((cfg, true, Some(dir)))
        }
    }
}

/// Build (and optimize) the graph for a config and shape.
pub fn graph_for(
    cfg: &BertConfig,
    pooled: bool,
    batch: usize,
    seq: usize,
    optimize: bool,
) -> Result<(rlx::ir::Graph, Option<rlx::opt::OptReport>), String> {
    let g = build_graph(
        cfg,
        batch,
        seq,
        BertOutputs {
            pooled,
            tokens: !pooled,
        },
    )
    .map_err(|e| e.to_string())?;
    if !optimize {
        return Ok((g, None));
    }
    let (g, r) = rlx::opt::optimize(&g, &Default::default()).map_err(|e| e.to_string())?;
    Ok((g, Some(r)))
}

fn compile(g: &rlx::ir::Graph, hybrid: bool, threads: Option<usize>) -> Result<CpuModel, String> {
    CpuModel::compile(
        g.clone(),
        &CpuOptions {
            hybrid,
            threads,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

/// The llama graph of a GGUF file: decode for `seq == 1`, else prefill.
fn gguf_graph(a: &PlanArgs) -> Result<rlx::ir::Graph, String> {
    use rlx::models::llama::{build_graph, LlamaConfig, LlamaWeights, Phase};
    let path = if a.model == "smollm2" {
        crate::default_smollm2()
    } else {
        PathBuf::from(&a.model)
    };
    let f = rlx::formats::GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cfg = LlamaConfig::from_gguf(&f).map_err(|e| e.to_string())?;
    checks::ctx("--ctx", a.ctx, cfg.context_length, &cfg.arch)?;
    checks::in_range("--seq", a.seq, 1, a.ctx, "--ctx")?;
    cfg.check_ctx(a.ctx)
        .map_err(|e| format!("--ctx {}: {e}", a.ctx))?;
    let mut w = LlamaWeights::load(&f, &cfg).map_err(|e| e.to_string())?;
    if a.int8_activations {
        w.activations = rlx::ir::ActivationPrecision::Int8;
    }
    let phase = if a.seq > 1 {
        Phase::Prefill { seq_len: a.seq }
    } else {
        Phase::Decode
    };
    build_graph(&w, phase, a.ctx).map_err(|e| e.to_string())
}

/// The step graph of a Qwen3-Next-family HF directory (`--seq` tokens,
/// `--ctx` KV cache positions), as `Qwen3NextModel` compiles it.
fn qwen3_next_graph(a: &PlanArgs) -> Result<rlx::ir::Graph, String> {
    use rlx::models::qwen3_next::{build_graph, Qwen3NextConfig, Qwen3NextWeights};
    let dir = PathBuf::from(&a.model);
    let cfg = Qwen3NextConfig::from_dir(&dir).map_err(|e| e.to_string())?;
    checks::in_range("--seq", a.seq, 1, a.ctx, "--ctx")?;
    let w = Qwen3NextWeights::load(&dir, &cfg).map_err(|e| e.to_string())?;
    build_graph(&w, a.seq, a.ctx).map_err(|e| e.to_string())
}

/// `DequantMatMul` nodes by activation precision, e.g. `{"int8": 91}`.
fn dequant_activations(g: &rlx::ir::Graph) -> std::collections::BTreeMap<&'static str, usize> {
    let mut m = std::collections::BTreeMap::new();
    for n in g.nodes() {
        if let rlx::ir::Op::DequantMatMul { activations, .. } = n.op {
            *m.entry(activations.name()).or_insert(0) += 1;
        }
    }
    m
}

/// Run `rlx plan`.
pub fn run(a: PlanArgs) -> Result<(), String> {
    let gguf = a.model == "smollm2" || a.model.ends_with(".gguf");
    checks::positive("--batch", a.batch)?;
    checks::positive("--seq", a.seq)?;
    let (g, passes) = if gguf {
        (gguf_graph(&a)?, None)
    } else if rlx::models::qwen3_next::is_supported_dir(std::path::Path::new(&a.model)) {
        (qwen3_next_graph(&a)?, None)
    } else if a.model == "gdn-hybrid" {
        use rlx::models::recurrent::{hybrid_graph, HybridConfig};
        let g = hybrid_graph(&HybridConfig::small(), a.batch, a.seq).map_err(|e| e.to_string())?;
        if a.no_opt {
            (g, None)
        } else {
            let (g, r) = rlx::opt::optimize(&g, &Default::default()).map_err(|e| e.to_string())?;
            (g, Some(r))
        }
    } else {
        let (cfg, pooled, _) = resolve_config(&a.model)?;
        checks::bert_seq("--seq", a.seq, cfg.max_position_embeddings)?;
        graph_for(&cfg, pooled, a.batch, a.seq, !a.no_opt)?
    };
    let planned = match a.device {
        DeviceArg::Cpu => plan_cpu(&g, &a)?,
        DeviceArg::Cuda => plan_cuda(&g, &a)?,
    };
    let r = &planned.report;
    let mem = planned.memory;
    let ops = g.op_counts();
    if a.json {
        let mut v = json!({
            "graph": g.name,
            "mode": format!("{:?}", a.mode).to_lowercase(),
            "device": format!("{:?}", a.device).to_lowercase(),
            "precision": a.precision.name(),
            "compiled_segments": r.compiled_segments,
            "thunk_ranges": r.thunk_ranges,
            "dispatches": r.dispatches,
            "dispatches_thunks_only": r.dispatches_thunks_only,
            "arena_bytes": mem.arena_bytes,
            "naive_bytes": mem.naive_bytes,
            "scratch_bytes": mem.scratch_bytes,
            "ops": ops,
            "dequant_activations": dequant_activations(&g),
            "passes": passes.as_ref().map(|p| json!(p.passes)).unwrap_or(json!({})),
        });
        if let (Some(obj), serde_json::Value::Object(extra)) =
            (v.as_object_mut(), rlx::models::plan_layout_json(r))
        {
            obj.extend(extra);
        }
        if let (Some(obj), serde_json::Value::Object(extra)) = (v.as_object_mut(), planned.extra) {
            obj.extend(extra);
        }
        println!("{v}");
        return Ok(());
    }
    if a.dump {
        print!("{g}");
    }
    println!(
        "plan for {} ({} nodes), mode {:?}, device {:?}",
        g.name,
        g.len(),
        a.mode,
        a.device
    );
    let mut si = 0;
    let mut ri = 0;
    // Steps in order: interleave segments and ranges by their first node.
    loop {
        let s = r.segments.get(si);
        let t = r.ranges.get(ri);
        match (s, t) {
            (Some(s), Some(t)) if s.first.index() < t.start => {
                print_segment(s);
                si += 1;
            }
            (Some(s), None) => {
                print_segment(s);
                si += 1;
            }
            (_, Some(t)) => {
                println!("  thunks [{}..{}):", t.start, t.end);
                for o in &t.ops {
                    println!("    {} {:<20} {}", o.node, o.op, o.reason);
                }
                ri += 1;
            }
            (None, None) => break,
        }
    }
    for (n, why) in &r.split {
        println!("  split: the segment from {n} was declined whole ({why}); compiled as the pieces above");
    }
    println!(
        "compiled segments {}, thunk ranges {}, dispatches {} (thunks only: {})",
        r.compiled_segments, r.thunk_ranges, r.dispatches, r.dispatches_thunks_only
    );
    println!(
        "arena {} bytes (naive sum {} bytes), segment scratch {} bytes",
        mem.arena_bytes, mem.naive_bytes, mem.scratch_bytes
    );
    for l in &planned.lines {
        println!("{l}");
    }
    let ops: Vec<String> = ops.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("ops: {}", ops.join(" "));
    let acts = dequant_activations(&g);
    if !acts.is_empty() {
        let acts: Vec<String> = acts.iter().map(|(k, v)| format!("{k} x{v}")).collect();
        println!("DequantMatMul activations: {}", acts.join(", "));
    }
    if let Some(p) = passes {
        for (pass, pats) in &p.passes {
            if !pats.is_empty() {
                let pats: Vec<String> = pats.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                println!("pass {pass}: {}", pats.join(", "));
            }
        }
    }
    Ok(())
}

fn print_segment(s: &rlx::hybrid::SegmentReport) {
    let ids = |v: &[rlx::ir::NodeId]| {
        v.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "  compiled {}..={} ({} ops) in: [{}] out: [{}]",
        s.first,
        s.last,
        s.nodes,
        ids(&s.boundary_inputs),
        ids(&s.boundary_outputs)
    );
}
