//! `rlx generate` and `rlx bench-llm`.

use crate::{checks, models_dir, DeviceArg, Mode};
use clap::Args;
use rlx::cpu::CpuOptions;
use rlx::ir::ActivationPrecision;
use rlx::models::gguf_tokenizer::GgufTokenizer;
use rlx::models::llama::{LlamaConfig, LlamaDevice, LlamaModel, LlamaWeights};
use rlx::models::sampling::{Sampler, SamplerConfig};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

fn default_gguf() -> PathBuf {
    models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn resolve_model(model: &Option<PathBuf>) -> Result<PathBuf, String> {
    match model {
        Some(p) if p.is_dir() => Err(format!(
            "--model {}: is a directory; expected a .gguf file",
            p.display()
        )),
        Some(p) => Ok(p.clone()),
        None => {
            let p = default_gguf();
            if !p.exists() {
                eprintln!("fetching SmolLM2-135M-Instruct into {}", p.display());
                crate::fetch("smollm2")?;
            }
            Ok(p)
        }
    }
}

/// The backend for `device`: on CUDA, hybrid mode captures the whole
/// decode step into one CUDA graph.
fn llama_device(
    device: DeviceArg,
    mode: Mode,
    threads: Option<usize>,
) -> Result<LlamaDevice, String> {
    let threads = crate::check_threads(threads)?;
    match device {
        DeviceArg::Cpu => Ok(LlamaDevice::Cpu(CpuOptions {
            hybrid: mode == Mode::Hybrid,
            threads,
            ..Default::default()
        })),
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda => {
            rlx::cuda::cuda_available().map_err(|e| format!("--device cuda: {e}"))?;
            Ok(LlamaDevice::Cuda(rlx::cuda::CudaOptions {
                hybrid: mode == Mode::Hybrid,
                ..Default::default()
            }))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceArg::Cuda => Err("--device cuda: the CUDA backend is not part of this build".into()),
    }
}

/// The activation precision for `--int8-activations`.
fn activations(int8: bool) -> ActivationPrecision {
    if int8 {
        ActivationPrecision::Int8
    } else {
        ActivationPrecision::F32
    }
}

fn load(
    path: &PathBuf,
    ctx_flag: &str,
    ctx: usize,
    device: LlamaDevice,
    act: ActivationPrecision,
) -> Result<(LlamaModel, GgufTokenizer), String> {
    let (model, tok) = load_model(path, ctx_flag, ctx, device, act, true)?;
    Ok((model, tok?))
}

/// [`load`]; unless `need_tok`, the tokenizer's error is handed back
/// beside the model (a model run from token ids needs no tokenizer).
fn load_model(
    path: &PathBuf,
    ctx_flag: &str,
    ctx: usize,
    device: LlamaDevice,
    act: ActivationPrecision,
    need_tok: bool,
) -> Result<(LlamaModel, Result<GgufTokenizer, String>), String> {
    let f = rlx::formats::GgufFile::open(path).map_err(|e| e.to_string())?;
    let tok = GgufTokenizer::from_gguf(&f).map_err(|e| e.to_string());
    if need_tok {
        if let Err(e) = &tok {
            return Err(e.clone());
        }
    }
    let cfg = LlamaConfig::from_gguf(&f).map_err(|e| e.to_string())?;
    checks::ctx(ctx_flag, ctx, cfg.context_length, &cfg.arch)?;
    cfg.check_ctx(ctx)
        .map_err(|e| format!("{ctx_flag} {ctx}: {e}"))?;
    let mut w = LlamaWeights::load(&f, &cfg).map_err(|e| e.to_string())?;
    w.activations = act;
    let model = LlamaModel::from_weights_on(w, ctx, device).map_err(|e| e.to_string())?;
    Ok((model, tok))
}

/// Arguments of `rlx generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// The prompt (no chat template is applied unless `--chat`).
    #[arg(required_unless_present = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated (e.g. `5,17,200`), fed to
    /// the model as they are: no tokenizer is needed (`text` is empty in
    /// `--json` when the file has none) and none is applied.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["prompt", "chat"])]
    prompt_ids: Option<Vec<u32>>,
    /// A GGUF file of a supported decoder (llama, qwen2, qwen3, gemma3), or
    /// an HF directory (`config.json` + `model.safetensors`) of Qwen3-Next /
    /// Qwen3.5 text, which takes `--prompt-ids` (default: the fetched
    /// SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Most new tokens.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus threshold.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Context length (KV cache positions).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Execution mode.
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// Worker threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Round the activations of quantized matmuls to 8-bit blocks of 32,
    /// as llama.cpp does (integer dot products): faster, looser numerics.
    /// Default: f32 activations.
    #[arg(long)]
    int8_activations: bool,
    /// Where to run (`cuda` needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Print one JSON object `{prompt_ids, ids, text, top_logits}` instead
    /// of streaming text (`ids` include a final end-of-generation token).
    #[arg(long)]
    json: bool,
    /// With `--json`: how many of the largest logits (`[id, logit]` pairs,
    /// largest first) to report for each generated token.
    #[arg(long, default_value_t = 5)]
    top_logits: usize,
    /// Apply the model's chat template (the GGUF's
    /// `tokenizer.chat_template`) to the prompt as one user turn.
    #[arg(long)]
    chat: bool,
}

/// The `k` largest logits as `[id, logit]`, largest first (lower id on ties).
fn top_logits(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx.into_iter().map(|i| (i, logits[i as usize])).collect()
}

/// Run `rlx generate`, streaming text to stdout.
pub fn run(a: GenerateArgs) -> Result<(), String> {
    checks::positive("--ctx", a.ctx)?;
    checks::in_range(
        "--max-tokens",
        a.max_tokens,
        1,
        a.ctx - 1,
        "--ctx minus a prompt of at least 1 token",
    )?;
    if let Some(dir) = a.model.as_ref().filter(|p| p.is_dir()) {
        return run_hf_dir(&a, dir);
    }
    let path = resolve_model(&a.model)?;
    let device = llama_device(a.device, a.mode, a.threads)?;
    let (mut model, tok) = if a.prompt_ids.is_some() {
        // Token ids need no tokenizer: use the file's when it has one.
        let (m, t) = load_model(
            &path,
            "--ctx",
            a.ctx,
            device,
            activations(a.int8_activations),
            false,
        )?;
        (m, t.ok())
    } else {
        let (m, t) = load(
            &path,
            "--ctx",
            a.ctx,
            device,
            activations(a.int8_activations),
        )?;
        (m, Some(t))
    };
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        repetition_penalty: a.repeat_penalty,
        seed: a.seed,
    })
    .map_err(|e| e.to_string())?;
    let prompt = match (&a.prompt_ids, &tok, &a.prompt) {
        (Some(ids), _, _) => {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= model.config().vocab) {
                return Err(format!(
                    "--prompt-ids: token id {id} is out of range for a vocabulary of {}",
                    model.config().vocab
                ));
            }
            ids.clone()
        }
        (None, Some(tok), Some(text)) if a.chat => {
            let f = rlx::formats::GgufFile::open(&path).map_err(|e| e.to_string())?;
            let t = rlx_server::chat::ChatTemplate::from_gguf(&f, tok)?;
            let text = t.render(&[rlx_server::chat::Message {
                role: "user".into(),
                content: text.clone(),
            }])?;
            // The template writes the BOS text itself where the model wants one.
            tok.encode(&text, false).map_err(|e| e.to_string())?
        }
        (None, Some(tok), Some(text)) => tok
            .encode(text, tok.add_bos_default())
            .map_err(|e| e.to_string())?,
        _ => return Err("give a prompt or --prompt-ids".into()),
    };
    if prompt.is_empty() {
        return Err("the prompt encodes to no tokens (or --prompt-ids is empty)".into());
    }
    checks::max_tokens(a.max_tokens, prompt.len(), a.ctx)?;
    let mut history = prompt.clone();
    let mut stream = tok.as_ref().map(|t| t.stream_decoder());
    let mut out = std::io::stdout().lock();
    let t0 = Instant::now();
    let mut logits = model.prefill(&prompt).map_err(|e| e.to_string())?;
    let t_prefill = t0.elapsed();
    let mut n = 0;
    let t1 = Instant::now();
    let (mut ids, mut tops, mut text) = (Vec::new(), Vec::new(), String::new());
    while n < a.max_tokens {
        let id = sampler
            .sample(&logits, &history)
            .map_err(|e| e.to_string())?;
        n += 1;
        if a.json {
            ids.push(id);
            tops.push(top_logits(&logits, a.top_logits));
        }
        if tok.as_ref().is_some_and(|t| t.is_end_of_generation(id)) {
            break;
        }
        history.push(id);
        let piece = match stream.as_mut() {
            Some(s) => s.push(id).map_err(|e| e.to_string())?,
            None => None,
        };
        if let Some(piece) = piece {
            if a.json {
                text.push_str(&piece);
            } else {
                write!(out, "{piece}").map_err(|e| e.to_string())?;
                out.flush().ok();
            }
        }
        if n == a.max_tokens {
            break;
        }
        logits = model.decode(id).map_err(|e| e.to_string())?;
    }
    let rest = stream
        .map(|mut s| s.finish().unwrap_or_default())
        .unwrap_or_default();
    if a.json {
        text.push_str(&rest);
        let obj = serde_json::json!({"prompt_ids": prompt, "ids": ids, "text": text,
            "top_logits": tops});
        writeln!(out, "{obj}").map_err(|e| e.to_string())?;
    } else {
        write!(out, "{rest}").map_err(|e| e.to_string())?;
        writeln!(out).ok();
    }
    eprintln!(
        "[{} prompt tokens in {:.1} ms ({:.1} tok/s prefill), {} new tokens at {:.1} tok/s decode]",
        prompt.len(),
        t_prefill.as_secs_f64() * 1e3,
        prompt.len() as f64 / t_prefill.as_secs_f64().max(1e-9),
        n,
        n as f64 / t1.elapsed().as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// `rlx generate --model DIR`: a Qwen3-Next / Qwen3.5 text HF directory
/// (no tokenizer: `--prompt-ids`), on the CPU, sampled as the GGUF path
/// samples; `--json` prints the same object with an empty `text`.
fn run_hf_dir(a: &GenerateArgs, dir: &std::path::Path) -> Result<(), String> {
    use rlx::models::qwen3_next::{self, Qwen3NextModel};
    if !qwen3_next::is_supported_dir(dir) {
        let found = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|j| {
                j.get("model_type")
                    .and_then(|v| v.as_str())
                    .map(String::from)
            })
            .unwrap_or_else(|| "no readable config.json model_type".into());
        return Err(format!(
            "--model {}: a directory of model_type '{found}'; directories run model_type {} \
             (decoders in GGUF files run llama, qwen2, qwen3, gemma3)",
            dir.display(),
            qwen3_next::SUPPORTED_MODEL_TYPES.join(", ")
        ));
    }
    if !matches!(a.device, DeviceArg::Cpu) {
        return Err(format!(
            "--model {}: Qwen3-Next / Qwen3.5 directories run on the CPU only",
            dir.display()
        ));
    }
    let Some(prompt) = a.prompt_ids.clone() else {
        return Err(format!(
            "--model {}: this directory has no tokenizer rlx reads; give --prompt-ids",
            dir.display()
        ));
    };
    if prompt.is_empty() {
        return Err("--prompt-ids is empty".into());
    }
    checks::max_tokens(a.max_tokens, prompt.len(), a.ctx)?;
    let threads = crate::check_threads(a.threads)?;
    let opts = CpuOptions {
        hybrid: a.mode == Mode::Hybrid,
        threads,
        ..Default::default()
    };
    let mut model = Qwen3NextModel::load(dir, a.ctx, opts).map_err(|e| e.to_string())?;
    let vocab = model.config().vocab;
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(format!(
            "--prompt-ids: token id {id} is out of range for a vocabulary of {vocab}"
        ));
    }
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        repetition_penalty: a.repeat_penalty,
        seed: a.seed,
    })
    .map_err(|e| e.to_string())?;
    let all = model.prefill(&prompt).map_err(|e| e.to_string())?;
    let mut logits = all[all.len() - vocab..].to_vec();
    let mut history = prompt.clone();
    let (mut ids, mut tops) = (Vec::new(), Vec::new());
    for n in 1..=a.max_tokens {
        let id = sampler
            .sample(&logits, &history)
            .map_err(|e| e.to_string())?;
        ids.push(id);
        tops.push(top_logits(&logits, a.top_logits));
        history.push(id);
        if n < a.max_tokens {
            logits = model.forward(&[id]).map_err(|e| e.to_string())?;
        }
    }
    if a.json {
        let obj = serde_json::json!({"prompt_ids": prompt, "ids": ids, "text": "",
            "top_logits": tops});
        println!("{obj}");
    } else {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", s.join(","));
    }
    Ok(())
}

/// Arguments of `rlx bench-llm`.
#[derive(Args)]
pub struct BenchLlmArgs {
    /// GGUF file (default: the fetched SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt tokens to prefill.
    #[arg(long, default_value_t = 128)]
    prefill: usize,
    /// Tokens to decode after the prompt.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Worker threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Round the activations of quantized matmuls to 8-bit blocks of 32,
    /// as llama.cpp does (integer dot products): faster, looser numerics.
    /// Default: f32 activations.
    #[arg(long)]
    int8_activations: bool,
    /// Execution mode.
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// One JSON line `{"prefill_tok_s", "decode_tok_s"}`.
    #[arg(long)]
    json: bool,
    /// Where to run (`cuda` needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Random weights of the model's shapes (Q4_1 layers, Q8_0 head), no
    /// file needed: speed is the same, the text is noise.
    #[arg(long)]
    synthetic: bool,
    /// After timing, profile the prefill and decode steps on the CPU: time per op kind and
    /// per step, GFLOP/s and GB/s (on stderr).
    #[arg(long)]
    profile: bool,
}

/// Run `rlx bench-llm`.
pub fn bench(a: BenchLlmArgs) -> Result<(), String> {
    checks::positive("--prefill", a.prefill)?;
    checks::positive("--reps", a.reps)?;
    let ctx = a
        .prefill
        .checked_add(a.decode)
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| format!("--prefill {} + --decode {}: too large", a.prefill, a.decode))?;
    let device = llama_device(a.device, a.mode, a.threads)?;
    let (mut model, prompt) = if a.synthetic {
        let cfg = rlx::models::llama::LlamaConfig::smollm2_135m();
        checks::ctx(
            "--prefill + --decode + 1",
            ctx,
            cfg.context_length,
            &cfg.arch,
        )?;
        let mut w = rlx::models::llama::LlamaWeights::synthetic(
            &cfg,
            rlx::ir::QuantScheme::Q4_1,
            rlx::ir::QuantScheme::Q8_0,
            7,
        )
        .map_err(|e| e.to_string())?;
        w.activations = activations(a.int8_activations);
        let m = LlamaModel::from_weights_on(w, ctx, device).map_err(|e| e.to_string())?;
        let prompt: Vec<u32> = (0..a.prefill as u32).map(|i| 1 + i * 37 % 1000).collect();
        (m, prompt)
    } else {
        let path = resolve_model(&a.model)?;
        let (m, tok) = load_model(
            &path,
            "--prefill + --decode + 1",
            ctx,
            device,
            activations(a.int8_activations),
            false,
        )?;
        let prompt = match tok {
            Ok(tok) => {
                let text = "The history of computing is a story of people, machines and ideas. "
                    .repeat(64);
                let mut prompt = tok.encode(&text, false).map_err(|e| e.to_string())?;
                prompt.truncate(a.prefill);
                if prompt.len() < a.prefill {
                    return Err("could not build a long enough prompt".into());
                }
                prompt
            }
            // Speed does not depend on which ids: time a GGUF whose
            // tokenizer rlx does not read on spread-out ids.
            Err(e) => {
                eprintln!("no tokenizer ({e}): prompting with ids 1 + 37 i mod 1000");
                (0..a.prefill as u32).map(|i| 1 + i * 37 % 1000).collect()
            }
        };
        (m, prompt)
    };
    let mut pre = Vec::new();
    let mut dec = Vec::new();
    for _ in 0..a.reps.max(1) {
        let t = Instant::now();
        let mut logits = model.prefill(&prompt).map_err(|e| e.to_string())?;
        pre.push(prompt.len() as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..a.decode {
            let id = rlx::models::llama::argmax(&logits);
            logits = model.decode(id).map_err(|e| e.to_string())?;
        }
        dec.push(a.decode as f64 / t.elapsed().as_secs_f64());
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    let (p, d) = (med(&mut pre), med(&mut dec));
    if a.profile {
        profile_decode(&mut model, &prompt, a.decode.clamp(1, 32), a.threads)?;
    }
    let dispatches = model.decode_model().report().dispatches;
    let device_ops = model.decode_device_ops();
    eprintln!(
        "prefill {} tokens: {p:.1} tok/s; decode {} tokens: {d:.1} tok/s ({:.3} ms/token); \
         {dispatches} dispatches per decode step{}",
        a.prefill,
        a.decode,
        1e3 / d,
        device_ops
            .map(|n| format!(" ({n} device ops)"))
            .unwrap_or_default()
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({"prefill_tok_s": p, "decode_tok_s": d,
                "mode": format!("{:?}", a.mode).to_lowercase(),
                "device": format!("{:?}", a.device).to_lowercase(),
                "decode_dispatches": dispatches, "decode_device_ops": device_ops,
                "prefill_tokens": a.prefill, "decode_tokens": a.decode,
                "synthetic": a.synthetic,
                "activations": activations(a.int8_activations).name()})
        );
    } else {
        println!(
            "prefill {} tokens: {p:.1} tok/s; decode {} tokens: {d:.1} tok/s ({:.2} ms/token)",
            a.prefill,
            a.decode,
            1e3 / d
        );
    }
    Ok(())
}

/// Profile the prefill of `prompt` (one run), then `steps` decode steps
/// (mean per dispatch).
fn profile_decode(
    model: &mut LlamaModel,
    prompt: &[u32],
    steps: usize,
    threads: Option<usize>,
) -> Result<(), String> {
    let (mut logits, prefill) = model.prefill_profiled(prompt).map_err(|e| e.to_string())?;
    if !prefill.is_empty() {
        eprintln!("\nprefill profile ({} tokens, one run):", prompt.len());
        crate::bench::print_profile(&prefill, 1, threads);
    }
    let mut runs = Vec::new();
    let t = std::time::Instant::now();
    for _ in 0..steps {
        let id = rlx::models::llama::argmax(&logits);
        let (l, p) = model.decode_profiled(id).map_err(|e| e.to_string())?;
        logits = l;
        if p.is_empty() {
            return Err("--profile: decode profiles run on the CPU only".into());
        }
        runs.push(p);
    }
    let wall_ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let acc = crate::bench::mean_profile(runs);
    eprintln!(
        "\ndecode step profile (mean of {steps} steps after a {}-token prefill; \
         {wall_ms:.3} ms per step wall, the dispatches below included):",
        prompt.len()
    );
    crate::bench::print_profile(&acc, steps, threads);
    Ok(())
}
