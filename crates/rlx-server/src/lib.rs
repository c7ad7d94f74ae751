//! `rlx serve`: an OpenAI-compatible HTTP server for rlx models.
//!
//! - `POST /v1/embeddings` (a sentence-embedding model, e.g. MiniLM),
//!   dynamically batched across clients ([`batcher`]);
//! - `POST /v1/completions` and `POST /v1/chat/completions` (a Llama-family
//!   GGUF; chat prompts from the file's own template), with SSE streaming,
//!   served by a slot scheduler over per-sequence KV caches
//!   ([`generation`]);
//! - `GET /v1/models`, `POST /tokenize`, `POST /detokenize`, `GET /health`
//!   (200 once the models are loaded and warmed up), `GET /metrics`
//!   (Prometheus text).
//!
//! Models run on dedicated threads; tokio only carries the HTTP side, and
//! stays out of the library crates. Start one with [`Server::start`]; the
//! CLI's `rlx serve` is [`Server::start`] then [`Server::wait`] (SIGTERM or
//! Ctrl-C stops accepting, finishes the requests in flight, then returns).

#![deny(missing_docs)]

mod api;
pub mod batcher;
/// The chat template (shared with the Python package, in rlx-models).
pub use rlx::models::chat_template as chat;
mod error;
pub mod generation;
mod metrics;
use rlx::models::stop;

pub use error::ApiError;

use crate::batcher::{BatchConfig, EmbedHandle, EmbedJob};
use crate::chat::ChatTemplate;
use crate::generation::{GenEvent, GenHandle, GenRequest};
use crate::metrics::Metrics;
use rlx::cpu::CpuOptions;
use rlx::models::gguf_tokenizer::GgufTokenizer;
use rlx::models::llama::MAX_DECODE_BATCH;
use rlx::models::llama::{LlamaConfig, LlamaDevice, LlamaModel, LlamaWeights};
use rlx::models::sampling::SamplerConfig;
use rlx::models::tokenizer::BertTokenizer;
use rlx::models::{CompiledPlan, EmbedDevice, EmbedOptions, SentenceEmbedder};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to serve and how.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// A sentence-embedding model directory (`config.json`,
    /// `tokenizer.json`, `model.safetensors`).
    pub embed_model: Option<PathBuf>,
    /// A cross-encoder reranker directory (`BertForSequenceClassification`
    /// with one label), served at `POST /rerank`.
    pub rerank_model: Option<PathBuf>,
    /// A Llama-family GGUF file.
    pub llm: Option<PathBuf>,
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free port; see [`Server::addr`]).
    pub port: u16,
    /// Worker threads per model (`None`: one per core).
    pub threads: Option<usize>,
    /// Most padded tokens in one embedding batch.
    pub max_batch_tokens: usize,
    /// How long an embedding request waits for others to join its batch.
    pub batch_wait: Duration,
    /// Sequences generated at once (generation slots, each with its own
    /// KV cache).
    pub max_concurrent: usize,
    /// Most prompt tokens prefilled per generation round while other
    /// sequences decode (at least one prompt per round; every waiting
    /// prompt when none decodes).
    pub max_prefill_tokens: usize,
    /// Requests that may wait per model; beyond it, 429.
    pub queue: usize,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Context length of the language model (KV cache positions).
    pub ctx: usize,
    /// Where the language model runs.
    pub llm_device: LlmDevice,
    /// Where the embedding model runs: the CPU, or a CUDA device (one
    /// compiled model, re-targeted to each batch shape; the same batching
    /// and endpoints). The reranker runs on the CPU in any case.
    pub embed_device: LlmDevice,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Most inputs in one embeddings request (400 beyond).
    pub max_items: usize,
    /// Stop on SIGTERM / Ctrl-C (the CLI); tests stop with [`Server::shutdown`].
    pub handle_signals: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            embed_model: None,
            rerank_model: None,
            llm: None,
            host: "127.0.0.1".into(),
            port: 8080,
            threads: None,
            max_batch_tokens: 8192,
            batch_wait: Duration::from_millis(5),
            max_concurrent: 4,
            max_prefill_tokens: 256,
            queue: 64,
            timeout: Duration::from_secs(120),
            ctx: 2048,
            llm_device: LlmDevice::Cpu,
            embed_device: LlmDevice::Cpu,
            max_body_bytes: 2 << 20,
            max_items: 2048,
            handle_signals: false,
        }
    }
}

/// Where [`ServerConfig::llm`] (or, as [`ServerConfig::embed_device`], the
/// embedding model) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LlmDevice {
    /// The CPU backend in hybrid mode with [`ServerConfig::threads`].
    #[default]
    Cpu,
    /// CUDA device `n` in hybrid mode: each batched decode step of `N`
    /// sequences replays one CUDA graph (one per `N`), the KV caches stay
    /// in device memory. Needs the `cuda` feature; without it loading the
    /// model fails with a message saying so.
    Cuda(usize),
}

/// The backend `d` asks for.
fn llama_device(d: LlmDevice, threads: Option<usize>) -> Result<LlamaDevice, String> {
    match d {
        LlmDevice::Cpu => Ok(LlamaDevice::Cpu(CpuOptions {
            hybrid: true,
            threads,
            ..Default::default()
        })),
        #[cfg(feature = "cuda")]
        LlmDevice::Cuda(device) => Ok(LlamaDevice::Cuda(cuda_options(device)?)),
        #[cfg(not(feature = "cuda"))]
        LlmDevice::Cuda(_) => Err(NO_CUDA.into()),
    }
}

/// Why `--device cuda` fails in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
const NO_CUDA: &str =
    "--device cuda: the CUDA backend is not part of this build (build with --features cuda)";

/// Hybrid-mode options on CUDA device `device`, once a device is usable.
#[cfg(feature = "cuda")]
fn cuda_options(device: usize) -> Result<rlx::cuda::CudaOptions, String> {
    rlx::cuda::cuda_available().map_err(|e| format!("--device cuda: {e}"))?;
    Ok(rlx::cuda::CudaOptions {
        device,
        hybrid: true,
        ..Default::default()
    })
}

/// The embedding backend `d` asks for (`mode` hybrid on both).
fn embed_device(d: LlmDevice) -> Result<EmbedDevice, String> {
    match d {
        LlmDevice::Cpu => Ok(EmbedDevice::Cpu),
        #[cfg(feature = "cuda")]
        LlmDevice::Cuda(device) => Ok(EmbedDevice::Cuda(cuda_options(device)?)),
        #[cfg(not(feature = "cuda"))]
        LlmDevice::Cuda(_) => Err(NO_CUDA.into()),
    }
}

/// The loaded embedding model, as the handlers see it.
pub(crate) struct EmbedState {
    pub names: Vec<String>,
    pub handle: EmbedHandle,
    pub tokenizer: BertTokenizer,
    /// The sentence-transformers config (prompts, lower-casing).
    pub st: rlx::models::StConfig,
    /// The default prompt (`default_prompt_name`; `""` for none),
    /// prepended to every text input as `SentenceEmbedder::embed` does...
    pub prompt: String,
    /// ...and its length in tokens, left out of pooling when the model's
    /// Pooling module says so.
    pub prompt_len: usize,
    pub dim: usize,
    /// The hybrid plan of the compiled shape the warm-up ran.
    pub plans: Vec<CompiledPlan>,
}

/// The loaded reranker, as the handlers see it (one request scores at a
/// time, on a blocking thread).
pub(crate) struct RerankState {
    pub names: Vec<String>,
    pub model: Arc<Mutex<rlx::Reranker>>,
}

/// The loaded language model, as the handlers see it.
pub(crate) struct LlmState {
    pub names: Vec<String>,
    pub handle: GenHandle,
    pub tok: Arc<GgufTokenizer>,
    pub template: ChatTemplate,
    pub ctx: usize,
    pub vocab: usize,
    /// The hybrid plans of the decode graphs (one sequence and the
    /// batched ones the slots use), compiled before serving.
    pub plans: Vec<CompiledPlan>,
}

/// Everything the handlers share.
pub(crate) struct State {
    pub cfg: ServerConfig,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub load_error: Mutex<Option<String>>,
    pub embed: OnceLock<EmbedState>,
    pub rerank: OnceLock<RerankState>,
    pub llm: OnceLock<LlmState>,
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<JoinHandle<Result<(), String>>>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// The served name of a model path: the directory's or file's name
/// without `.gguf`.
fn model_name(p: &std::path::Path) -> String {
    let n = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string());
    n.strip_suffix(".gguf").map(str::to_string).unwrap_or(n)
}

/// Load the reranker and score one pair (the warm-up compiles its first shape).
fn load_rerank(cfg: &ServerConfig, dir: &std::path::Path) -> Result<RerankState, String> {
    let opts = EmbedOptions {
        threads: cfg.threads,
        ..Default::default()
    };
    let mut m = rlx::Reranker::load_with(dir, opts)
        .map_err(|e| format!("--rerank-model {}: {e}", dir.display()))?;
    m.score(&[("warm-up", "warm-up")])
        .map_err(|e| format!("--rerank-model {}: warm-up failed: {e}", dir.display()))?;
    Ok(RerankState {
        names: vec![model_name(dir)],
        model: Arc::new(Mutex::new(m)),
    })
}

/// Embedding shapes compiled at load: 1 to this many rows...
const WARM_ROWS: usize = 16;
/// ...at every padded length up to this many tokens.
const WARM_LEN: usize = 32;

fn load_embed(
    cfg: &ServerConfig,
    dir: &std::path::Path,
    metrics: &Arc<Metrics>,
) -> Result<(EmbedState, JoinHandle<()>), String> {
    let opts = EmbedOptions {
        threads: cfg.threads,
        ..Default::default()
    };
    let seq_bucket = opts.seq_bucket;
    let device = embed_device(cfg.embed_device)?;
    let mut e = SentenceEmbedder::load_on(dir, opts, device)
        .map_err(|e| format!("--embed-model {}: {e}", dir.display()))?;
    // The plan of one short input (the warm-up's shape: padded to the
    // least padded length), compiled here and then reused by the warm-up.
    let seq = rlx::models::padded_len(1, seq_bucket, e.config().max_seq().max(1));
    let plans = vec![e
        .plan_for(1, seq)
        .map_err(|err| format!("--embed-model {}: {err}", dir.display()))?];
    // The shapes of short inputs in small groups, compiled now rather than
    // inside the first requests (~0.3 s at load for MiniLM on 2 cores).
    e.warm(WARM_ROWS, WARM_LEN)
        .map_err(|err| format!("--embed-model {}: {err}", dir.display()))?;
    let tokenizer = e.tokenizer().clone();
    let dim = e.dim();
    let st = e.st_config().clone();
    let prompt = st
        .prompt(None)
        .map_err(|err| format!("--embed-model {}: {err}", dir.display()))?
        .to_string();
    let prompt_len = e
        .prompt_len(&prompt)
        .map_err(|err| format!("--embed-model {}: {err}", dir.display()))?;
    let (handle, join) = batcher::spawn(
        e,
        BatchConfig {
            max_batch_tokens: cfg.max_batch_tokens,
            wait: cfg.batch_wait,
            queue: cfg.queue,
            seq_bucket,
        },
        metrics.clone(),
    );
    // Warm up: one embedding through the batcher.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let rows = vec![tokenizer
        .encode(&st.input_text(&prompt, "warm up"))
        .map_err(|e| e.to_string())?];
    handle
        .submit(EmbedJob {
            rows,
            prompt_len,
            reply: tx,
        })
        .map_err(|_| "warm-up: the embedding queue refused the job".to_string())?;
    rx.blocking_recv()
        .map_err(|_| "warm-up: the embedding worker stopped".to_string())?
        .map_err(|e| format!("warm-up embedding failed: {e}"))?;
    let names = vec![model_name(dir)];
    Ok((
        EmbedState {
            names,
            handle,
            tokenizer,
            st,
            prompt,
            prompt_len,
            dim,
            plans,
        },
        join,
    ))
}

fn load_llm(
    cfg: &ServerConfig,
    path: &std::path::Path,
    metrics: &Arc<Metrics>,
) -> Result<(LlmState, JoinHandle<()>), String> {
    let ctx_err = |e: String| format!("--llm {}: {e}", path.display());
    let f = rlx::formats::GgufFile::open(path).map_err(|e| ctx_err(e.to_string()))?;
    let tok = GgufTokenizer::from_gguf(&f).map_err(|e| ctx_err(e.to_string()))?;
    let config = LlamaConfig::from_gguf(&f).map_err(|e| ctx_err(e.to_string()))?;
    let ctx = config
        .context_length
        .map_or(cfg.ctx, |c| cfg.ctx.min(c.max(1)));
    config.check_ctx(ctx).map_err(|e| ctx_err(e.to_string()))?;
    let template = ChatTemplate::from_gguf(&f, &tok).map_err(ctx_err)?;
    let w = LlamaWeights::load(&f, &config).map_err(|e| ctx_err(e.to_string()))?;
    drop(f);
    let device = llama_device(cfg.llm_device, cfg.threads)?;
    let mut model =
        LlamaModel::from_weights_on(w, ctx, device).map_err(|e| ctx_err(e.to_string()))?;
    // The batched decode graphs the slots use, compiled now (the worker
    // would compile them first thing anyway) so that their plans can be
    // shown (GET /v1/plans).
    // A failure shows again, as a request error, at the first
    // `decode_batch` of that size (as when the worker compiles them).
    let _ = model.prepare_decode_batch(cfg.max_concurrent.min(MAX_DECODE_BATCH));
    let plans = model.compiled_plans();
    let vocab = config.vocab;
    let tok = Arc::new(tok);
    let (handle, join) = generation::spawn(
        model,
        tok.clone(),
        cfg.max_concurrent,
        cfg.queue,
        cfg.max_prefill_tokens,
        metrics.clone(),
    );
    // Warm up: two greedy tokens through the scheduler.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt = tok
        .encode("Hello", true)
        .or_else(|_| tok.encode("Hello", false));
    let prompt = prompt.map_err(|e| ctx_err(e.to_string()))?;
    let req = GenRequest {
        prompt,
        max_tokens: 2,
        sampler: SamplerConfig::greedy(),
        stop: vec![],
        logprobs: None,
        deadline: Instant::now() + Duration::from_secs(600),
        events: tx,
    };
    handle
        .submit(req)
        .map_err(|_| "warm-up: the generation queue refused the request".to_string())?;
    loop {
        match rx.blocking_recv() {
            Some(GenEvent::Done { .. }) => break,
            Some(GenEvent::Error { message, .. }) => {
                return Err(format!("warm-up generation failed: {message}"))
            }
            Some(GenEvent::Token { .. }) => {}
            None => return Err("warm-up: the generation worker stopped".into()),
        }
    }
    Ok((
        LlmState {
            names: vec![model_name(path)],
            handle,
            tok,
            template,
            ctx,
            vocab,
            plans,
        },
        join,
    ))
}

impl Server {
    /// Bind `host:port`, start serving (every model endpoint answers 503
    /// until the models are loaded and warmed up) and load the models in
    /// the background. Errors when the address cannot be bound or no model
    /// is given.
    pub fn start(cfg: ServerConfig) -> Result<Server, String> {
        if cfg.embed_model.is_none() && cfg.llm.is_none() && cfg.rerank_model.is_none() {
            return Err(
                "nothing to serve: give --embed-model, --rerank-model, --llm or several".into(),
            );
        }
        let check = |flag: &str, v: usize| {
            if v == 0 {
                Err(format!("{flag} 0: expected at least 1"))
            } else {
                Ok(())
            }
        };
        check("--max-batch-tokens", cfg.max_batch_tokens)?;
        check("--max-concurrent", cfg.max_concurrent)?;
        check("--max-prefill-tokens", cfg.max_prefill_tokens)?;
        check("--queue", cfg.queue)?;
        check("--ctx", cfg.ctx)?;
        if cfg.timeout.is_zero() {
            return Err("--timeout 0: expected at least 1 second".into());
        }
        let listener = std::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
            .map_err(|e| format!("binding {}:{}: {e}", cfg.host, cfg.port))?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let metrics = Arc::new(Metrics::new());
        let state = Arc::new(State {
            cfg: cfg.clone(),
            metrics: metrics.clone(),
            ready: AtomicBool::new(false),
            load_error: Mutex::new(None),
            embed: OnceLock::new(),
            rerank: OnceLock::new(),
            llm: OnceLock::new(),
        });
        let workers = Arc::new(Mutex::new(Vec::new()));
        // Load in the background.
        {
            let state = state.clone();
            let workers = workers.clone();
            std::thread::Builder::new()
                .name("rlx-load".into())
                .spawn(move || {
                    let res = (|| -> Result<(), String> {
                        if let Some(dir) = &state.cfg.embed_model {
                            let (s, j) = load_embed(&state.cfg, dir, &state.metrics)?;
                            workers.lock().map_err(|e| e.to_string())?.push(j);
                            let _ = state.embed.set(s);
                        }
                        if let Some(dir) = &state.cfg.rerank_model {
                            let _ = state.rerank.set(load_rerank(&state.cfg, dir)?);
                        }
                        if let Some(p) = &state.cfg.llm {
                            let (s, j) = load_llm(&state.cfg, p, &state.metrics)?;
                            workers.lock().map_err(|e| e.to_string())?.push(j);
                            let _ = state.llm.set(s);
                        }
                        Ok(())
                    })();
                    match res {
                        Ok(()) => state.ready.store(true, Ordering::SeqCst),
                        Err(e) => {
                            // Reported by `wait` / `wait_ready` and GET /health.
                            if let Ok(mut l) = state.load_error.lock() {
                                *l = Some(e);
                            }
                        }
                    }
                })
                .map_err(|e| e.to_string())?;
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = api::router(state.clone());
        let signals = cfg.handle_signals;
        let upkeep = metrics.clone();
        let http = std::thread::Builder::new()
            .name("rlx-http".into())
            .spawn(move || -> Result<(), String> {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
                    // Histogram samples are drained into their buckets at
                    // each scrape; this bounds them when nobody scrapes.
                    tokio::spawn(async move {
                        let mut every = tokio::time::interval(Duration::from_secs(5));
                        loop {
                            every.tick().await;
                            upkeep.upkeep();
                        }
                    });
                    axum::serve(listener, app)
                        .with_graceful_shutdown(stop_signal(stop_rx, signals))
                        .await
                        .map_err(|e| e.to_string())
                })
            })
            .map_err(|e| e.to_string())?;
        Ok(Server {
            addr,
            state,
            stop: Some(stop_tx),
            http: Some(http),
            workers,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait until the models are loaded and warmed up (`Ok`), loading
    /// failed (`Err` with why) or `timeout` passed (`Err`).
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let t = Instant::now();
        loop {
            if self.state.ready.load(Ordering::SeqCst) {
                return Ok(());
            }
            if let Some(e) = self.state.load_error.lock().ok().and_then(|l| l.clone()) {
                return Err(e);
            }
            if t.elapsed() > timeout {
                return Err(format!("the models were not ready after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop accepting connections, finish the requests in flight, stop the
    /// model workers and return.
    pub fn shutdown(mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.wait_inner()
    }

    /// Block until the server stops (SIGTERM / Ctrl-C with
    /// [`ServerConfig::handle_signals`]), draining requests in flight.
    /// If loading a model fails, the server stops and this returns why.
    pub fn wait(mut self) -> Result<(), String> {
        loop {
            if self.http.as_ref().is_none_or(|h| h.is_finished()) {
                return self.wait_inner();
            }
            if let Some(e) = self.state.load_error.lock().ok().and_then(|l| l.clone()) {
                if let Some(s) = self.stop.take() {
                    let _ = s.send(());
                }
                self.wait_inner()?;
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_inner(&mut self) -> Result<(), String> {
        let res = match self.http.take() {
            Some(h) => h
                .join()
                .map_err(|_| "the HTTP thread panicked".to_string())?,
            None => Ok(()),
        };
        // The handlers are gone; dropping the last state closes the model
        // queues, and each worker ends after its sequences.
        let state = std::mem::replace(
            &mut self.state,
            Arc::new(State {
                cfg: ServerConfig::default(),
                metrics: Arc::new(Metrics::new()),
                ready: AtomicBool::new(false),
                load_error: Mutex::new(None),
                embed: OnceLock::new(),
                rerank: OnceLock::new(),
                llm: OnceLock::new(),
            }),
        );
        drop(state);
        let joins: Vec<_> = self
            .workers
            .lock()
            .map(|mut w| w.drain(..).collect())
            .unwrap_or_default();
        for j in joins {
            let _ = j.join();
        }
        res
    }
}

/// Resolves on `stop` or, with `signals`, on SIGTERM or Ctrl-C.
async fn stop_signal(stop: tokio::sync::oneshot::Receiver<()>, signals: bool) {
    if !signals {
        let _ = stop.await;
        return;
    }
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = stop => {}
                    _ = term.recv() => eprintln!("rlx serve: SIGTERM: draining requests in flight"),
                    _ = tokio::signal::ctrl_c() => eprintln!("rlx serve: Ctrl-C: draining requests in flight"),
                }
            }
            Err(_) => {
                tokio::select! {
                    _ = stop => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
        }
    }
    #[cfg(not(unix))]
    tokio::select! {
        _ = stop => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
