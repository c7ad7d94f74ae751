//! `rlx bench`: time a BERT model at one shape.

use crate::checks;
use crate::plan::{graph_for, resolve_config};
use crate::{DeviceArg, Mode};
use clap::Args;
use rlx::cpu::{CpuModel, CpuOptions};
use rlx::models::bert::synthetic_params;
use rlx::models::{EmbedOptions, SentenceEmbedder};
use rlx::runtime::{Executable, TensorRef};
use std::time::Instant;

/// Arguments of `rlx bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// `bert6` (synthetic weights), `minilm`, or a BERT model directory.
    #[arg(long, default_value = "minilm")]
    model: String,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sequence length (every sentence full length).
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Execution mode.
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// Timed runs.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up runs.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Worker threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON line `{"median_ms", "times_ms", "dispatches"}`.
    #[arg(long)]
    json: bool,
    /// After timing, profile: time per op kind and per step, GFLOP/s and
    /// GB/s, against a GEMM peak measured now (printed to stderr).
    #[arg(long)]
    profile: bool,
    /// Where to run (`cuda` needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Arithmetic: f32 or bf16 (on the CPU: bf16 matmul operands, f32
    /// accumulation), on CUDA also tf32 and f16 (16-bit weights and
    /// activations, f32 accumulation).
    #[arg(long, default_value = "f32")]
    precision: rlx::Precision,
    /// CPU: store matmul weights as f16 (half the weight bytes; products
    /// accumulate in f32).
    #[arg(long)]
    f16_weights: bool,
}

/// Run `rlx bench`.
pub fn run(a: BenchArgs) -> Result<(), String> {
    crate::check_threads(a.threads)?;
    let hybrid = a.mode == Mode::Hybrid;
    let (cfg, _, dir) = resolve_config(&a.model)?;
    checks::positive("--batch", a.batch)?;
    checks::bert_seq("--seq", a.seq, cfg.max_position_embeddings)?;
    checks::positive("--iters", a.iters)?;
    let (b, s) = (a.batch, a.seq);
    if a.device == DeviceArg::Cuda && a.f16_weights {
        return Err("--f16-weights is a CPU option (on CUDA use --precision f16)".into());
    }
    if a.device == DeviceArg::Cuda {
        #[cfg(feature = "cuda")]
        return cuda::run(&a, &cfg, dir.as_deref());
        #[cfg(not(feature = "cuda"))]
        return Err("--device cuda: the CUDA backend is not part of this build".into());
    }
    if !matches!(a.precision, rlx::Precision::F32 | rlx::Precision::Bf16) {
        return Err(format!(
            "--precision {}: the CPU backend runs f32 or bf16 (use --device cuda)",
            a.precision
        ));
    }
    let bf16 = a.precision == rlx::Precision::Bf16;
    let mut synthetic;
    let mut loaded;
    let model: &mut CpuModel = match dir {
        None => {
            let (g, _) = graph_for(&cfg, true, b, s, true)?;
            synthetic = CpuModel::compile(
                g,
                &CpuOptions {
                    hybrid,
                    threads: a.threads,
                    f16_weights: a.f16_weights,
                    bf16,
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())?;
            for (name, v) in synthetic_params(&cfg, 1) {
                synthetic
                    .set_param(&name, TensorRef::F32(&v))
                    .map_err(|e| e.to_string())?;
            }
            &mut synthetic
        }
        Some(dir) => {
            if !dir.join("model.safetensors").exists() && a.model == "minilm" {
                crate::fetch("minilm")?;
            }
            loaded = SentenceEmbedder::load_with(
                &dir,
                EmbedOptions {
                    hybrid,
                    threads: a.threads,
                    optimize: true,
                    f16_weights: a.f16_weights,
                    bf16,
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())?;
            loaded.model_for(b, s, false).map_err(|e| e.to_string())?
        }
    };
    let mut state = 0x2545F4914F6CDD1Du64;
    let ids: Vec<i64> = (0..b * s)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            match i % s {
                0 => 101,
                x if x == s - 1 => 102,
                _ => 1000 + (state % 20000) as i64,
            }
        })
        .collect();
    let tt = vec![0i64; b * s];
    let mask = vec![1f32; b * s];
    let inputs = [
        ("input_ids", TensorRef::I64(&ids)),
        ("token_type_ids", TensorRef::I64(&tt)),
        ("attention_mask", TensorRef::F32(&mask)),
    ];
    for _ in 0..a.warmup {
        model.run(&inputs).map_err(|e| e.to_string())?;
    }
    let mut times = Vec::with_capacity(a.iters);
    for _ in 0..a.iters {
        let t = Instant::now();
        model.run(&inputs).map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    if a.profile {
        profile(model, &inputs, a.iters.clamp(1, 10), a.threads)?;
    }
    let mut sorted = times.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    let median = sorted[sorted.len() / 2];
    let dispatches = model.report().dispatches;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"median_ms": median, "times_ms": times, "dispatches": dispatches,
                "mode": format!("{:?}", a.mode).to_lowercase(), "batch": b, "seq": s,
                "isa": rlx::cpu::Isa::active().name(), "threads": a.threads.unwrap_or_else(rayon_threads)})
        );
    } else {
        println!(
            "{} {}x{} {:?}: median {:.3} ms over {} runs, {} dispatches",
            a.model,
            b,
            s,
            a.mode,
            median,
            times.len(),
            dispatches
        );
    }
    Ok(())
}

fn profile(
    model: &mut CpuModel,
    inputs: &[(&str, TensorRef<'_>)],
    runs: usize,
    threads: Option<usize>,
) -> Result<(), String> {
    let mut runs_seen = Vec::new();
    for _ in 0..runs {
        runs_seen.push(model.run_profiled(inputs).map_err(|e| e.to_string())?.1);
    }
    print_profile(&mean_profile(runs_seen), runs, threads);
    Ok(())
}

/// The mean per-dispatch time of profiles of the same plan.
pub fn mean_profile(runs: Vec<Vec<rlx::cpu::ProfileEntry>>) -> Vec<rlx::cpu::ProfileEntry> {
    let n = runs.len().max(1) as u64;
    let mut it = runs.into_iter();
    let mut acc = it.next().unwrap_or_default();
    for p in it {
        for (a, e) in acc.iter_mut().zip(p) {
            a.nanos += e.nanos;
        }
    }
    for e in &mut acc {
        e.nanos /= n;
    }
    acc
}

/// Print a profile (mean per-dispatch times of `runs` runs) to stderr: the
/// ISA and its measured peaks, time per op kind, then per step.
pub fn print_profile(steps: &[rlx::cpu::ProfileEntry], runs: usize, threads: Option<usize>) {
    use std::collections::BTreeMap;
    let (peak, gemm_peak) = rlx::cpu::measure_peaks(300, threads);
    let total: u64 = steps.iter().map(|e| e.nanos).sum();
    let total_flops: u64 = steps.iter().map(|e| e.flops).sum();
    let mut kinds: BTreeMap<&str, (u64, u64, u64, usize)> = BTreeMap::new();
    for e in steps {
        let k = kinds.entry(e.op).or_default();
        k.0 += e.nanos;
        k.1 += e.flops;
        k.2 += e.bytes;
        k.3 += 1;
    }
    let gf = |flops: u64, ns: u64| {
        if ns == 0 {
            0.0
        } else {
            flops as f64 / ns as f64
        }
    };
    let isa = rlx::cpu::Isa::active();
    eprintln!(
        "kernels: {isa} ({} f32 lanes; RLX_CPU_ISA=avx512|avx2|portable overrides); bf16 matmuls on {} \
         (RLX_CPU_AMX=0 turns tiles off); CPU: {}",
        isa.f32_lanes(),
        if rlx::cpu::isa::amx_bf16_active() {
            "AMX tiles"
        } else {
            "vector kernels"
        },
        rlx::cpu::CpuFeatures::get().names().join(" ")
    );
    eprintln!(
        "measured on {} threads: {isa} FMA peak (register loop) {peak:.1} GFLOP/s, \
         packed GEMM 256^3 in cache {gemm_peak:.1} GFLOP/s ({:.0}% of FMA peak)",
        threads.unwrap_or_else(rayon_threads),
        100.0 * gemm_peak / peak
    );
    eprintln!(
        "dispatch time {:.3} ms per run (mean of {runs}), {:.1} GFLOP/s = {:.0}% of FMA peak",
        total as f64 / 1e6,
        gf(total_flops, total),
        100.0 * gf(total_flops, total) / peak
    );
    eprintln!(
        "\n{:<20} {:>6} {:>10} {:>7} {:>9} {:>6} {:>8}",
        "op kind", "count", "ms", "%time", "GFLOP/s", "%peak", "GB/s"
    );
    let mut by_time: Vec<_> = kinds.into_iter().collect();
    by_time.sort_by_key(|(_, v)| std::cmp::Reverse(v.0));
    for (k, (ns, fl, by, c)) in by_time {
        eprintln!(
            "{:<20} {:>6} {:>10.3} {:>6.1}% {:>9.1} {:>5.0}% {:>8.2}",
            k,
            c,
            ns as f64 / 1e6,
            100.0 * ns as f64 / total.max(1) as f64,
            gf(fl, ns),
            100.0 * gf(fl, ns) / peak,
            by as f64 / ns.max(1) as f64
        );
    }
    eprintln!(
        "\n{:<34} {:>10} {:>9} {:>6} {:>8}",
        "step", "ms", "GFLOP/s", "%peak", "GB/s"
    );
    for e in steps {
        eprintln!(
            "{:<34} {:>10.3} {:>9.1} {:>5.0}% {:>8.2}",
            format!("{} {}", e.op, e.label),
            e.nanos as f64 / 1e6,
            gf(e.flops, e.nanos),
            100.0 * gf(e.flops, e.nanos) / peak,
            e.bytes as f64 / e.nanos.max(1) as f64
        );
    }
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(feature = "cuda")]
mod cuda {
    //! `rlx bench --device cuda`: the same graph and weights on the GPU.

    use super::BenchArgs;
    use crate::Mode;
    use rlx::models::bert::{build_graph, synthetic_params, BertConfig, BertOutputs};
    use rlx::models::{EmbedOptions, SentenceEmbedder};
    use rlx::runtime::{Executable, TensorRef};
    use rlx::{Device, ExecMode, Session};
    use std::path::Path;
    use std::time::Instant;

    /// Build the graph as `SentenceEmbedder` does (pooled output for a model
    /// directory, token output for `bert6`), compile it for cuda:0, time it.
    pub(super) fn run(a: &BenchArgs, cfg: &BertConfig, dir: Option<&Path>) -> Result<(), String> {
        let (b, s) = (a.batch, a.seq);
        let outs = BertOutputs {
            pooled: dir.is_some(),
            tokens: dir.is_none(),
        };
        let g = build_graph(cfg, b, s, outs).map_err(|e| e.to_string())?;
        let opt = rlx::opt::OptOptions {
            target: std::sync::Arc::new(|_: &rlx::ir::Op| true),
            ..Default::default()
        };
        let (g, _) = rlx::opt::optimize(&g, &opt).map_err(|e| e.to_string())?;
        let mode = if a.mode == Mode::Hybrid {
            ExecMode::Hybrid
        } else {
            ExecMode::Thunks
        };
        let t0 = Instant::now();
        let mut model = Session::new(Device::Cuda(0))
            .mode(mode)
            .precision(a.precision)
            .compile(g)
            .map_err(|e| e.to_string())?;
        match dir {
            None => {
                for (name, v) in synthetic_params(cfg, 1) {
                    model.set_param(&name, &v).map_err(|e| e.to_string())?;
                }
            }
            Some(dir) => {
                // The embedder loads (and transposes) the weights; take them from its CPU model.
                let opts = EmbedOptions {
                    hybrid: false,
                    threads: None,
                    optimize: false,
                    ..Default::default()
                };
                let mut emb = SentenceEmbedder::load_with(dir, opts).map_err(|e| e.to_string())?;
                let cpu = emb.model_for(1, 1, false).map_err(|e| e.to_string())?;
                for (name, _, _) in cfg.params() {
                    let t = cpu
                        .take_param(&name)
                        .ok_or_else(|| format!("weight {name} missing"))?;
                    let v = t
                        .as_f32()
                        .ok_or_else(|| format!("weight {name} is not f32"))?;
                    model.set_param(&name, v).map_err(|e| e.to_string())?;
                }
            }
        }
        let mut state = 0x2545F4914F6CDD1Du64;
        let ids: Vec<i64> = (0..b * s)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match i % s {
                    0 => 101,
                    x if x == s - 1 => 102,
                    _ => 1000 + (state % 20000) as i64,
                }
            })
            .collect();
        let tt = vec![0i64; b * s];
        let mask = vec![1f32; b * s];
        let inputs = [
            ("input_ids", TensorRef::I64(&ids)),
            ("token_type_ids", TensorRef::I64(&tt)),
            ("attention_mask", TensorRef::F32(&mask)),
        ];
        model.run_typed(&inputs).map_err(|e| e.to_string())?;
        let first_ms = t0.elapsed().as_secs_f64() * 1e3;
        for _ in 0..a.warmup {
            model.run_typed(&inputs).map_err(|e| e.to_string())?;
        }
        let mut times = Vec::with_capacity(a.iters);
        for _ in 0..a.iters.max(1) {
            let t = Instant::now();
            model.run_typed(&inputs).map_err(|e| e.to_string())?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut sorted = times.clone();
        sorted.sort_by(|x, y| x.total_cmp(y));
        let median = sorted[sorted.len() / 2];
        let st = model.plan_stats();
        if a.json {
            println!(
                "{}",
                serde_json::json!({"median_ms": median, "min_ms": sorted[0], "times_ms": times,
                    "dispatches": st.dispatches, "compiled_segments": st.compiled_segments,
                    "thunk_ranges": st.thunk_ranges, "compile_and_first_run_ms": first_ms,
                    "mode": format!("{:?}", a.mode).to_lowercase(), "batch": b, "seq": s, "device": "cuda",
                    "precision": a.precision.name()})
            );
        } else {
            println!(
                "{} {}x{} {:?} {} on cuda:0: median {:.3} ms over {} runs, {} dispatches",
                a.model,
                b,
                s,
                a.mode,
                a.precision,
                median,
                times.len(),
                st.dispatches
            );
        }
        Ok(())
    }
}
