//! `rlx serve`: the OpenAI-compatible server of the `rlx-server` crate.

use crate::DeviceArg;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `rlx serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// A sentence-embedding model directory, or `minilm` / `mpnet`
    /// (all-MiniLM-L6-v2 / all-mpnet-base-v2, fetched if missing).
    #[arg(long)]
    embed_model: Option<String>,
    /// A cross-encoder reranker directory (BertForSequenceClassification
    /// with one label), served at `POST /rerank`.
    #[arg(long)]
    rerank_model: Option<std::path::PathBuf>,
    /// A llama-architecture GGUF file, or `smollm2` (the fetched
    /// SmolLM2-135M-Instruct Q4_1, fetched if missing).
    #[arg(long)]
    llm: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free port, printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Where the language model (--llm) and the embedding model
    /// (--embed-model) run: `cpu`, or `cuda` (GPU 0, a build with
    /// `--features cuda`; hybrid mode: for the LLM the KV caches in device
    /// memory and each batched decode step one CUDA graph per batch size,
    /// for embeddings one model re-targeted to each batch shape). The
    /// reranker runs on the CPU either way.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Worker threads per model (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Most padded tokens in one embedding batch.
    #[arg(long, default_value_t = 8192)]
    max_batch_tokens: usize,
    /// Most milliseconds an embedding request waits for others to join its
    /// batch: only while requests overlap, and only until as many have come
    /// as the last batch held; requests already queued join without waiting.
    #[arg(long, default_value_t = 5.0)]
    batch_wait_ms: f64,
    /// Sequences generated at once (slots, each with its own KV cache).
    #[arg(long, default_value_t = 4)]
    max_concurrent: usize,
    /// Most prompt tokens prefilled per generation round while other
    /// sequences decode (at least one prompt per round; all waiting
    /// prompts when none decodes).
    #[arg(long, default_value_t = 256)]
    max_prefill_tokens: usize,
    /// Requests that may wait per model; beyond it, 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Context length of the language model (KV cache positions per slot).
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
}

/// `minilm` / `smollm2` name the fetched models (fetched when missing).
fn resolve(
    arg: &Option<String>,
    alias: &str,
    path: PathBuf,
    fetch: &str,
) -> Result<Option<PathBuf>, String> {
    match arg.as_deref() {
        None => Ok(None),
        Some(a) if a == alias => {
            if !path.exists() {
                eprintln!("fetching {fetch} into {}", path.display());
                crate::fetch(fetch)?;
            }
            Ok(Some(path))
        }
        Some(a) => Ok(Some(PathBuf::from(a))),
    }
}

/// Run `rlx serve` until SIGTERM or Ctrl-C.
pub fn run(a: ServeArgs) -> Result<(), String> {
    let device = match a.device {
        DeviceArg::Cpu => rlx_server::LlmDevice::Cpu,
        #[cfg(not(feature = "cuda"))]
        DeviceArg::Cuda => {
            return Err(
                "--device cuda: the CUDA backend is not part of this build (build rlx with --features cuda)"
                    .into(),
            )
        }
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda => {
            if a.llm.is_none() && a.embed_model.is_none() {
                return Err(
                    "--device cuda: the language model (--llm) and the embedding model (--embed-model) run on CUDA; the reranker runs on the CPU (give --llm or --embed-model, or leave --device out)"
                        .into(),
                );
            }
            if a.rerank_model.is_some() {
                eprintln!("rlx serve: --device cuda runs --llm and --embed-model on the GPU; the reranker runs on the CPU");
            }
            rlx_server::LlmDevice::Cuda(0)
        }
    };
    let threads = crate::check_threads(a.threads)?;
    if !(0.0..=10_000.0).contains(&a.batch_wait_ms) {
        return Err(format!(
            "--batch-wait-ms {}: expected 0 to 10000 milliseconds",
            a.batch_wait_ms
        ));
    }
    let embed_model = match &a.embed_model {
        Some(m) if !std::path::Path::new(m).exists() => Some(crate::embed_model_dir(m)?),
        m => m.as_ref().map(PathBuf::from),
    };
    let llm = resolve(&a.llm, "smollm2", crate::default_smollm2(), "smollm2")?;
    let cfg = rlx_server::ServerConfig {
        embed_model,
        rerank_model: a.rerank_model,
        llm,
        host: a.host,
        port: a.port,
        threads,
        max_batch_tokens: a.max_batch_tokens,
        batch_wait: Duration::from_secs_f64(a.batch_wait_ms / 1e3),
        max_concurrent: a.max_concurrent,
        max_prefill_tokens: a.max_prefill_tokens,
        queue: a.queue,
        timeout: Duration::from_secs(a.timeout),
        ctx: a.ctx,
        llm_device: device,
        embed_device: device,
        handle_signals: true,
        ..Default::default()
    };
    let server = rlx_server::Server::start(cfg)?;
    eprintln!("rlx serve: listening on http://{}", server.addr());
    server.wait()
}
