//! `rlx embed`.

use crate::{default_minilm, DeviceArg, Mode};
use clap::{Args, ValueEnum};
use rlx::models::{EmbedDevice, EmbedOptions, SentenceEmbedder};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Output format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// One JSON array per line, in input order.
    Jsonl,
    /// One float32 .npy matrix `[n, dim]`.
    Npy,
}

/// Arguments of `rlx embed`.
#[derive(Args)]
pub struct EmbedArgs {
    /// Texts to embed. Without texts or --file, lines are read from stdin.
    texts: Vec<String>,
    /// Read one text per line from this file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// A sentence-transformers BERT directory (default: the fetched all-MiniLM-L6-v2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Texts per forward pass.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Execution mode (hybrid is faster and equally exact).
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
    /// Write here instead of stdout (required for npy).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Worker threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Device (`cuda` needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Arithmetic: f32 or bf16 (CPU: bf16 matmuls with f32 accumulation,
    /// AVX512-BF16 where present; not faster than f32 there), on CUDA also
    /// tf32 and f16.
    #[arg(long, default_value = "f32")]
    precision: rlx::Precision,
    /// CPU: store matmul weights as f16 (faster on short inputs, where
    /// streaming the weights dominates; embeddings within ~1e-4 of f32).
    #[arg(long)]
    f16_weights: bool,
}

/// The embedder's device for the arguments.
fn embed_device(a: &EmbedArgs) -> Result<EmbedDevice, String> {
    match a.device {
        DeviceArg::Cpu if !matches!(a.precision, rlx::Precision::F32 | rlx::Precision::Bf16) => {
            Err(format!(
                "--precision {}: the CPU backend runs f32 or bf16 (use --device cuda)",
                a.precision
            ))
        }
        DeviceArg::Cpu => Ok(EmbedDevice::Cpu),
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda if a.f16_weights => {
            Err("--f16-weights is a CPU option (on CUDA use --precision f16)".into())
        }
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda => {
            rlx::cuda::cuda_available().map_err(|e| format!("--device cuda: {e}"))?;
            Ok(EmbedDevice::Cuda(rlx::cuda::CudaOptions {
                hybrid: a.mode == Mode::Hybrid,
                precision: a.precision,
                ..Default::default()
            }))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceArg::Cuda => Err("--device cuda: the CUDA backend is not part of this build".into()),
    }
}

fn read_lines(r: impl BufRead, what: &str) -> Result<Vec<String>, String> {
    r.lines()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("reading {what}: {e}"))
}

/// Run `rlx embed`.
pub fn run(a: EmbedArgs) -> Result<(), String> {
    let device = embed_device(&a)?;
    if a.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    let texts = if let Some(f) = &a.file {
        let file = std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let lines = read_lines(std::io::BufReader::new(file), &f.display().to_string())?;
        if lines.is_empty() {
            return Err(format!("{}: the input file is empty", f.display()));
        }
        lines
    } else if !a.texts.is_empty() {
        a.texts.clone()
    } else {
        let lines = read_lines(std::io::stdin().lock(), "stdin")?;
        if lines.is_empty() {
            return Err("no input: give texts as arguments, --file, or lines on stdin".into());
        }
        lines
    };
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => {
            let d = default_minilm();
            if !d.join("model.safetensors").exists() {
                eprintln!("fetching all-MiniLM-L6-v2 into {}", d.display());
                crate::fetch("minilm")?;
            }
            d
        }
    };
    let opts = EmbedOptions {
        hybrid: a.mode == Mode::Hybrid,
        threads: a.threads,
        optimize: true,
        f16_weights: a.f16_weights,
        bf16: a.device == DeviceArg::Cpu && a.precision == rlx::Precision::Bf16,
    };
    let mut model = SentenceEmbedder::load_on(&dir, opts, device).map_err(|e| e.to_string())?;
    let bar = (texts.len() > 300).then(|| {
        let b = indicatif::ProgressBar::new(texts.len() as u64);
        b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        b
    });
    let mut all: Vec<Vec<f32>> = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(a.batch_size) {
        let refs: Vec<&str> = chunk.iter().map(|s| s.as_str()).collect();
        all.extend(model.embed(&refs).map_err(|e| e.to_string())?);
        if let Some(b) = &bar {
            b.inc(chunk.len() as u64);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match a.format {
        Format::Jsonl => {
            let mut out: Box<dyn Write> = match &a.output {
                Some(p) => {
                    Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?)
                }
                None => Box::new(std::io::stdout().lock()),
            };
            for e in &all {
                let line = serde_json::to_string(e).map_err(|e| e.to_string())?;
                writeln!(out, "{line}").map_err(|e| e.to_string())?;
            }
        }
        Format::Npy => {
            let p = a
                .output
                .as_ref()
                .ok_or("--format npy needs --output FILE")?;
            std::fs::write(p, npy(&all, model.dim()))
                .map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    Ok(())
}

/// A little-endian float32 .npy file of shape `[rows.len(), dim]`.
fn npy(rows: &[Vec<f32>], dim: usize) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        rows.len(),
        dim
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    for r in rows {
        for v in r {
            out.extend(v.to_le_bytes());
        }
    }
    out
}
