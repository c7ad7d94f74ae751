//! The `rlx` command-line tool.

mod bench;
mod checks;
mod embed;
mod generate;
mod plan;
mod rerank;
mod serve;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// rlx: an ML compiler and runtime for transformer inference.
#[derive(Parser)]
#[command(name = "rlx", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Execution mode on the command line.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    /// One dispatch per op.
    Thunks,
    /// Compiled segments between thunk ranges.
    Hybrid,
}

/// Where to run.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DeviceArg {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU (needs a build with `--features cuda`).
    Cuda,
}

#[derive(Subcommand)]
enum Cmd {
    /// Download and verify model files (calls pip; see scripts/fetch_models.py).
    Fetch {
        /// minilm, smollm2, qwen2, gemma3 or mpnet (the last three not in
        /// all) or all.
        #[arg(default_value = "all")]
        which: String,
    },
    /// Sentence embeddings as JSON lines (or .npy).
    Embed(embed::EmbedArgs),
    /// Score documents against a query with a cross-encoder reranker.
    Rerank(rerank::RerankArgs),
    /// Print the execution plan of a model graph.
    Plan(plan::PlanArgs),
    /// Time a model, printing one JSON line with --json.
    Bench(bench::BenchArgs),
    /// Generate text with a llama-architecture GGUF model, streaming to stdout.
    Generate(generate::GenerateArgs),
    /// Time LLM prefill and decode (tokens/s).
    BenchLlm(generate::BenchLlmArgs),
    /// Serve models over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
}

/// The default model cache: `$RLX_MODELS_DIR` or `~/.cache/rlx/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RLX_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/rlx/models")
}

/// The fetched MiniLM directory.
pub fn default_minilm() -> PathBuf {
    models_dir().join("all-minilm-l6-v2")
}

/// The sentence-transformers models a short name stands for: (name,
/// directory under [`models_dir`]). `rlx fetch NAME` downloads each.
pub const EMBED_MODELS: [(&str, &str); 2] = [
    ("minilm", "all-minilm-l6-v2"),
    ("mpnet", "all-mpnet-base-v2"),
];

/// An embedding model argument: a short name of [`EMBED_MODELS`] (fetched
/// first when its weights are missing), else a directory path.
pub fn embed_model_dir(arg: &str) -> Result<PathBuf, String> {
    let Some((name, dir)) = EMBED_MODELS.iter().find(|(n, _)| *n == arg) else {
        return Ok(PathBuf::from(arg));
    };
    let d = models_dir().join(dir);
    if !d.join("model.safetensors").exists() {
        eprintln!("fetching {name} into {}", d.display());
        fetch(name)?;
    }
    Ok(d)
}

/// The fetched SmolLM2-135M-Instruct GGUF (Q4_1).
pub fn default_smollm2() -> PathBuf {
    models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Run the fetch script for `which`. Its progress (and pip's) goes to
/// stderr: stdout carries only a command's data (e.g. `rlx embed`'s JSON lines).
pub fn fetch(which: &str) -> Result<(), String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch_models.py");
    let status = std::process::Command::new("python3")
        .arg(script)
        .arg(which)
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| format!("could not start python3 to fetch models: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "fetching '{which}' failed (see the messages above)"
        ))
    }
}

/// Validate a `--threads` value: at least 1, and at most the cores this
/// process may run on (`std::thread::available_parallelism`), since more
/// workers than cores only contend. `None` (the flag not given) is rayon's
/// default, one worker per core.
pub fn check_threads(threads: Option<usize>) -> Result<Option<usize>, String> {
    let Some(t) = threads else {
        return Ok(None);
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if t == 0 || t > cores {
        return Err(format!(
            "--threads {t}: expected 1 to {cores} (the cores available to this process)"
        ));
    }
    Ok(Some(t))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Fetch { which } => fetch(&which),
        Cmd::Embed(a) => embed::run(a),
        Cmd::Rerank(a) => rerank::run(a),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Generate(a) => generate::run(a),
        Cmd::BenchLlm(a) => generate::bench(a),
        Cmd::Serve(a) => serve::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
