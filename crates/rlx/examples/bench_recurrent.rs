//! Benchmark: one Qwen3-Next-style GatedDeltaNet block on the CPU, prefill
//! `1 x 512` and one decode step (S = 1 with carried conv and recurrent
//! state), hybrid against thunks.
//!
//! ```text
//! cargo run --release --example bench_recurrent -- [--runs 20] [--prefill 512] [--out bench/results] [--small]
//! ```
//!
//! Each measurement is the median wall time of `--runs` runs (after 3
//! warm-up runs), thunks and hybrid interleaved. Results go to
//! `<out>/recurrent_cpu.json` and `<out>/recurrent_cpu.md`.

use rlx::ir::{Graph, Op, Tensor, TensorData};
use rlx::{CompiledModel, Device, ExecMode, Session, TensorRef};
use rlx_models::recurrent::{gdn_block_graph, synthetic_weights, GdnConfig};
use std::collections::HashMap;
use std::time::Instant;

struct Args {
    runs: usize,
    prefill: usize,
    out: String,
    small: bool,
    diag: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        runs: 20,
        prefill: 512,
        out: "bench/results".into(),
        small: false,
        diag: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = |f: &str| it.next().ok_or(format!("{f} needs a value"));
        match flag.as_str() {
            "--runs" => a.runs = val("--runs")?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--prefill" => {
                a.prefill = val("--prefill")?
                    .parse()
                    .map_err(|e| format!("--prefill: {e}"))?
            }
            "--out" => a.out = val("--out")?,
            "--small" => a.small = true,
            "--diag" => a.diag = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.runs == 0 || a.prefill == 0 {
        return Err("--runs and --prefill must be at least 1".into());
    }
    Ok(a)
}

/// Deterministic inputs: x uniform in [-1, 1), conv state in [-1, 1),
/// recurrent state in [-0.2, 0.2).
fn inputs(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut m = HashMap::new();
    for n in g.nodes() {
        if let Op::Input { name } = &n.op {
            let scale = if name == "ssm_state" { 0.2 } else { 1.0 };
            let data = (0..n.shape.numel()).map(|_| next() * scale).collect();
            m.insert(name.clone(), Tensor::f32(&n.shape.dims, data));
        }
    }
    m
}

fn f32s(t: &Tensor) -> &[f32] {
    match &*t.data {
        TensorData::F32(v) => v,
        _ => panic!("f32 tensors only"),
    }
}

fn compile(
    g: &Graph,
    mode: ExecMode,
    w: &HashMap<String, Tensor>,
) -> Result<CompiledModel, rlx::Error> {
    let mut m = Session::new(Device::Cpu).mode(mode).compile(g.clone())?;
    for (name, t) in w {
        m.set_param(name, f32s(t))?;
    }
    Ok(m)
}

fn run_once(
    m: &mut CompiledModel,
    x: &HashMap<String, Tensor>,
) -> Result<(f64, Vec<Tensor>), rlx::Error> {
    let ins: Vec<(&str, TensorRef<'_>)> = x
        .iter()
        .map(|(k, v)| (k.as_str(), TensorRef::F32(f32s(v))))
        .collect();
    let t0 = Instant::now();
    let out = m.run_typed(&ins)?;
    Ok((t0.elapsed().as_secs_f64() * 1e3, out))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

struct Row {
    name: String,
    seq: usize,
    thunks_ms: f64,
    hybrid_ms: f64,
    thunks_min: f64,
    hybrid_min: f64,
    compiled_segments: usize,
    dispatches_hybrid: usize,
    dispatches_thunks: usize,
    bit_exact: bool,
}

fn bench(
    cfg: &GdnConfig,
    name: &str,
    seq: usize,
    runs: usize,
) -> Result<Row, Box<dyn std::error::Error>> {
    let g = gdn_block_graph(cfg, 1, seq)?;
    let w = synthetic_weights(&g, 7);
    let x = inputs(&g, 11);
    let mut th = compile(&g, ExecMode::Thunks, &w)?;
    let mut hy = compile(&g, ExecMode::Hybrid, &w)?;
    let (_, a) = run_once(&mut th, &x)?;
    let (_, b) = run_once(&mut hy, &x)?;
    let bit_exact = a.iter().zip(&b).all(|(p, q)| f32s(p) == f32s(q));
    for _ in 0..2 {
        run_once(&mut th, &x)?;
        run_once(&mut hy, &x)?;
    }
    let (mut tt, mut ht) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        tt.push(run_once(&mut th, &x)?.0);
        ht.push(run_once(&mut hy, &x)?.0);
    }
    let st = hy.plan_stats();
    let rep = hy.plan_report();
    Ok(Row {
        name: name.into(),
        seq,
        thunks_min: tt.iter().copied().fold(f64::INFINITY, f64::min),
        hybrid_min: ht.iter().copied().fold(f64::INFINITY, f64::min),
        thunks_ms: median(&mut tt),
        hybrid_ms: median(&mut ht),
        compiled_segments: st.compiled_segments,
        dispatches_hybrid: st.dispatches,
        dispatches_thunks: rep.dispatches_thunks_only,
        bit_exact,
    })
}

/// Median ms of the GatedDeltaNet kernel alone on `[1, seq, Hv, n]`, in the
/// recurrent and the chunked (64) form, and their max relative difference.
fn bench_gdn_forms(
    cfg: &GdnConfig,
    seq: usize,
    runs: usize,
) -> Result<(f64, f64, f32), Box<dyn std::error::Error>> {
    use rlx::cpu::kernels::recurrent::{gated_delta_net, GdnDims, GdnForm};
    let d = GdnDims {
        batch: 1,
        seq,
        heads: cfg.num_v_heads,
        n: cfg.head_dim,
    };
    let act = seq * d.heads * d.n;
    let mut s = 99u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut unit = |len: usize| {
        let mut v: Vec<f32> = (0..len).map(|_| next()).collect();
        for row in v.chunks_exact_mut(d.n) {
            let nrm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x /= nrm);
        }
        v
    };
    let (q, k, v) = (unit(act), unit(act), unit(act));
    let g = vec![-0.1f32; seq * d.heads];
    let beta = vec![0.7f32; seq * d.heads];
    let st = vec![0.0f32; d.heads * d.n * d.n];
    let mut out_r = vec![0.0f32; (seq + d.n) * d.heads * d.n];
    let mut out_c = out_r.clone();
    let (mut tr, mut tc) = (Vec::new(), Vec::new());
    for i in 0..runs + 2 {
        let t0 = Instant::now();
        gated_delta_net(
            &d,
            &q,
            &k,
            &v,
            &g,
            &beta,
            Some(&st),
            GdnForm::Recurrent,
            &mut out_r,
        )?;
        let t1 = Instant::now();
        gated_delta_net(
            &d,
            &q,
            &k,
            &v,
            &g,
            &beta,
            Some(&st),
            GdnForm::Chunked(64),
            &mut out_c,
        )?;
        let t2 = Instant::now();
        if i >= 2 {
            tr.push((t1 - t0).as_secs_f64() * 1e3);
            tc.push((t2 - t1).as_secs_f64() * 1e3);
        }
    }
    let diff = out_r
        .iter()
        .zip(&out_c)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0f32, f32::max);
    Ok((median(&mut tr), median(&mut tc), diff))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let cfg = if args.small {
        GdnConfig {
            hidden: 256,
            num_k_heads: 2,
            num_v_heads: 4,
            head_dim: 64,
            conv_kernel: 4,
            norm_eps: 1e-6,
        }
    } else {
        GdnConfig::qwen3_next()
    };
    if args.diag {
        return diagnose(&cfg, args.prefill);
    }
    let threads = rayon_threads();
    eprintln!("GDN block {cfg:?}, {threads} threads, {} runs", args.runs);
    let rows = [
        bench(
            &cfg,
            &format!("prefill 1x{}", args.prefill),
            args.prefill,
            args.runs,
        )?,
        bench(&cfg, "decode 1x1", 1, args.runs)?,
    ];
    let (rec_ms, chunk_ms, forms_diff) = bench_gdn_forms(&cfg, args.prefill, args.runs)?;
    eprintln!("GDN op alone, S {}: recurrent {rec_ms:.3} ms, chunked(64) {chunk_ms:.3} ms, max rel diff {forms_diff:e}", args.prefill);
    let mut md = String::new();
    md.push_str("# GatedDeltaNet block on the CPU: hybrid vs thunks\n\n");
    md.push_str(&format!(
        "One Qwen3-Next-style GDN block (`rlx_models::recurrent::gdn_block_graph`): D {}, {} key heads, {} value heads, head dim {}, conv kernel {}; synthetic seeded weights. \
         Median of {} runs after 3 warm-ups, thunks and hybrid interleaved. CPU: {}, {} rayon threads.\n\n",
        cfg.hidden, cfg.num_k_heads, cfg.num_v_heads, cfg.head_dim, cfg.conv_kernel, args.runs, cpu_model(), threads
    ));
    md.push_str("Command: `cargo run --release --example bench_recurrent`\n\n");
    md.push_str("| case | thunks median (ms) | hybrid median (ms) | thunks / hybrid | min thunks / hybrid (ms) | compiled segments | dispatches hybrid / thunks | hybrid == thunks bit-exact |\n");
    md.push_str("|---|---|---|---|---|---|---|---|\n");
    let mut js = Vec::new();
    for r in &rows {
        let ratio = r.thunks_ms / r.hybrid_ms;
        eprintln!(
            "{}: thunks {:.3} ms, hybrid {:.3} ms, ratio {:.3}, segments {}, bit-exact {}",
            r.name, r.thunks_ms, r.hybrid_ms, ratio, r.compiled_segments, r.bit_exact
        );
        md.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} / {:.3} | {} | {} / {} | {} |\n",
            r.name,
            r.thunks_ms,
            r.hybrid_ms,
            ratio,
            r.thunks_min,
            r.hybrid_min,
            r.compiled_segments,
            r.dispatches_hybrid,
            r.dispatches_thunks,
            r.bit_exact
        ));
        js.push(serde_json::json!({
            "case": r.name,
            "batch": 1,
            "seq": r.seq,
            "thunks_median_ms": r.thunks_ms,
            "hybrid_median_ms": r.hybrid_ms,
            "thunks_over_hybrid": ratio,
            "thunks_min_ms": r.thunks_min,
            "hybrid_min_ms": r.hybrid_min,
            "compiled_segments": r.compiled_segments,
            "dispatches_hybrid": r.dispatches_hybrid,
            "dispatches_thunks": r.dispatches_thunks,
            "hybrid_equals_thunks_bitwise": r.bit_exact,
        }));
    }
    md.push_str(&format!(
        "\nThe GatedDeltaNet kernel alone on `[1, {0}, {1}, {2}]` (thunk kernel, both forms): recurrent {rec_ms:.3} ms, chunked (C = 64, WY/UT) {chunk_ms:.3} ms; the forms differ by at most {forms_diff:e} (relative, floor 1).\n",
        args.prefill, cfg.num_v_heads, cfg.head_dim
    ));
    let doc = serde_json::json!({
        "benchmark": "GatedDeltaNet block, CPU, hybrid vs thunks",
        "command": "cargo run --release --example bench_recurrent",
        "config": {
            "hidden": cfg.hidden,
            "num_k_heads": cfg.num_k_heads,
            "num_v_heads": cfg.num_v_heads,
            "head_dim": cfg.head_dim,
            "conv_kernel": cfg.conv_kernel,
        },
        "runs": args.runs,
        "warmup": 3,
        "cpu": cpu_model(),
        "threads": threads,
        "results": js,
        "gdn_kernel_only": {
            "seq": args.prefill,
            "recurrent_median_ms": rec_ms,
            "chunked64_median_ms": chunk_ms,
            "max_rel_diff": forms_diff,
        },
    });
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(
        format!("{}/recurrent_cpu.json", args.out),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    std::fs::write(format!("{}/recurrent_cpu.md", args.out), md)?;
    eprintln!(
        "wrote {0}/recurrent_cpu.json and {0}/recurrent_cpu.md",
        args.out
    );
    Ok(())
}

/// Worker threads of the global rayon pool (as the CPU backend sees them).
fn rayon_threads() -> usize {
    rlx::cpu::kernels::num_threads()
}

/// Compare hybrid and thunks on every compiled segment's boundary output
/// (made graph outputs) and print the nodes whose values differ.
fn diagnose(cfg: &GdnConfig, seq: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut g = gdn_block_graph(cfg, 1, seq)?;
    let w = synthetic_weights(&g, 7);
    let x = inputs(&g, 11);
    let hy = compile(&g, ExecMode::Hybrid, &w)?;
    let mut outs = g.outputs.clone();
    for sg in &hy.plan_report().segments {
        outs.extend(sg.boundary_outputs.iter().copied());
    }
    outs.sort();
    outs.dedup();
    g.set_outputs(outs.clone());
    let mut th = compile(&g, ExecMode::Thunks, &w)?;
    let mut hy = compile(&g, ExecMode::Hybrid, &w)?;
    let (_, a) = run_once(&mut th, &x)?;
    let (_, b) = run_once(&mut hy, &x)?;
    for (i, id) in outs.iter().enumerate() {
        let (p, q) = (f32s(&a[i]), f32s(&b[i]));
        let diff = p
            .iter()
            .zip(q)
            .filter(|(u, v)| u.to_bits() != v.to_bits())
            .count();
        let worst = p
            .iter()
            .zip(q)
            .map(|(u, v)| (u - v).abs() / v.abs().max(1.0))
            .fold(0.0f32, f32::max);
        println!(
            "node {:4} {:40} {:?}: {diff} differ, max rel {worst:e}",
            id.index(),
            g.node(*id).op.describe(),
            g.node(*id).shape.dims
        );
    }
    Ok(())
}
