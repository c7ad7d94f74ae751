//! The HTTP routes: request parsing and validation, OpenAI response
//! formats, SSE streaming, and per-request metrics.

use crate::batcher::EmbedJob;
use crate::chat::Message;
use crate::error::ApiError;
use crate::generation::{GenEvent, GenRequest, TokenLogprob};
use crate::{LlmState, State};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use rlx::models::sampling::{Sampler, SamplerConfig};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

type S = Arc<State>;

/// The endpoints, with metrics and a timeout backstop around them.
pub(crate) fn router(state: S) -> Router {
    let backstop = state.cfg.timeout + std::time::Duration::from_secs(5);
    Router::new()
        .route("/", get(page))
        .route("/v1/plans", get(plans))
        .route("/v1/embeddings", post(embeddings))
        .route("/rerank", post(rerank))
        .route("/v1/rerank", post(rerank))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            backstop,
        ))
        .with_state(state)
}

const ENDPOINTS: [&str; 12] = [
    "/",
    "/v1/plans",
    "/v1/embeddings",
    "/rerank",
    "/v1/rerank",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/health",
    "/metrics",
];

/// Count every request by endpoint and status, with its latency (to the
/// response head: for a stream, the time to its first byte).
async fn track(
    axum::extract::State(s): axum::extract::State<S>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_string();
    let endpoint = ENDPOINTS
        .iter()
        .find(|e| **e == path)
        .copied()
        .unwrap_or("other");
    let t = Instant::now();
    let r = next.run(req).await;
    if r.status() == StatusCode::TOO_MANY_REQUESTS {
        s.metrics.rejected();
    }
    s.metrics
        .request(endpoint, r.status().as_u16(), t.elapsed().as_secs_f64());
    r
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such endpoint",
    )
}

/// Read and parse a JSON body, with OpenAI-style 413/400 errors.
async fn parse<T: DeserializeOwned>(s: &State, body: Body) -> Result<T, ApiError> {
    let limit = s.cfg.max_body_bytes;
    let bytes: Bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a valid request: {e}")))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn request_id(prefix: &str) -> String {
    format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

fn ready(s: &State) -> Result<(), ApiError> {
    if s.ready.load(Ordering::SeqCst) {
        Ok(())
    } else {
        Err(ApiError::loading())
    }
}

/// The embedding model, or 404 when `model` names another / none is served.
fn embed_model<'a>(s: &'a State, model: Option<&str>) -> Result<&'a crate::EmbedState, ApiError> {
    ready(s)?;
    let e = s
        .embed
        .get()
        .ok_or_else(|| ApiError::unknown_model(model.unwrap_or("(embeddings)"), &loaded(s)))?;
    match model {
        Some(m) if !e.names.iter().any(|n| n == m) => Err(ApiError::unknown_model(m, &loaded(s))),
        _ => Ok(e),
    }
}

/// The language model, or 404 when `model` names another / none is served.
fn llm<'a>(s: &'a State, model: Option<&str>) -> Result<&'a LlmState, ApiError> {
    ready(s)?;
    let l = s
        .llm
        .get()
        .ok_or_else(|| ApiError::unknown_model(model.unwrap_or("(generation)"), &loaded(s)))?;
    match model {
        Some(m) if !l.names.iter().any(|n| n == m) => Err(ApiError::unknown_model(m, &loaded(s))),
        _ => Ok(l),
    }
}

fn loaded(s: &State) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(e) = s.embed.get() {
        v.extend(e.names.iter().cloned());
    }
    if let Some(r) = s.rerank.get() {
        v.extend(r.names.iter().cloned());
    }
    if let Some(l) = s.llm.get() {
        v.extend(l.names.iter().cloned());
    }
    v
}

async fn health(axum::extract::State(s): axum::extract::State<S>) -> Response {
    if s.ready.load(Ordering::SeqCst) {
        return (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response();
    }
    let err = s.load_error.lock().ok().and_then(|l| l.clone());
    let body = match err {
        Some(e) => json!({"status": "error", "message": e}),
        None => json!({"status": "loading"}),
    };
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
}

/// The OpenAPI 3.0 description of these endpoints (checked against the
/// server by schemathesis in scripts/schemathesis).
async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
        .into_response()
}

async fn metrics(axum::extract::State(s): axum::extract::State<S>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

/// The page at `/`: plain HTML and JS, no build step and nothing fetched
/// from elsewhere (a chat box that streams, an embedding-similarity box,
/// the loaded models' hybrid plans drawn from `GET /v1/plans`).
async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("page.html"),
    )
        .into_response()
}

/// One compiled graph's plan as JSON: the figures of `rlx plan --json`
/// (segments, thunk ranges with why each op stayed out, dispatches) plus
/// the schedule length they index.
fn plan_json(p: &rlx::models::CompiledPlan) -> Value {
    let r = &p.report;
    let mut v = rlx::models::plan_layout_json(r);
    if let Value::Object(o) = &mut v {
        o.insert("name".into(), json!(p.name));
        o.insert("nodes".into(), json!(p.nodes));
        o.insert("compiled_segments".into(), json!(r.compiled_segments));
        o.insert("thunk_ranges".into(), json!(r.thunk_ranges));
        o.insert("dispatches".into(), json!(r.dispatches));
        o.insert(
            "dispatches_thunks_only".into(),
            json!(r.dispatches_thunks_only),
        );
    }
    v
}

/// `GET /v1/plans`: each loaded model's kind (`embeddings` or
/// `generation`) and the hybrid plans of its compiled graphs; `ready` is
/// false while the models load (the list then holds those loaded so far).
async fn plans(axum::extract::State(s): axum::extract::State<S>) -> Response {
    let mut data = Vec::new();
    if let Some(e) = s.embed.get() {
        data.push(json!({"model": e.names[0], "kind": "embeddings",
            "plans": e.plans.iter().map(plan_json).collect::<Vec<_>>()}));
    }
    if let Some(l) = s.llm.get() {
        data.push(json!({"model": l.names[0], "kind": "generation",
            "plans": l.plans.iter().map(plan_json).collect::<Vec<_>>()}));
    }
    let ready = s.ready.load(Ordering::SeqCst);
    axum::Json(json!({"object": "list", "ready": ready, "data": data})).into_response()
}

async fn models(axum::extract::State(s): axum::extract::State<S>) -> Response {
    let data: Vec<Value> = loaded(&s)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "rlx"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

// ---------------------------------------------------------------- embeddings

#[derive(Deserialize)]
struct EmbeddingsRequest {
    input: Value,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    /// Inputs longer than the model's maximum: cut (true, the default, as
    /// sentence-transformers does) or refused with a 400 (false).
    truncate: Option<bool>,
}

/// The inputs of an embeddings request as rows of ids, and how many
/// leading ids of each row are the model's prompt's. Text gets the model's
/// default prompt (`default_prompt_name`) prepended, and is lower-cased
/// when the model says so, as `SentenceEmbedder::embed` does; token ids are
/// used as they are (no prompt). An input longer than the model's maximum
/// is cut to it when `truncate` (ids: the last one, the `[SEP]`, is kept,
/// as the tokenizer cuts text), refused otherwise.
fn embed_rows(
    e: &crate::EmbedState,
    input: &Value,
    max_items: usize,
    truncate: bool,
) -> Result<(Vec<Vec<i64>>, usize), ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(format!("input: {m}")));
    let (vocab, max_len) = (e.tokenizer.vocab_size() as i64, e.tokenizer.max_seq_len());
    let too_long = |what: String| {
        ApiError::bad_request(format!(
            "input: {what}; the model takes at most {max_len} tokens ([CLS] and [SEP] included) \
             and the request has \"truncate\": false"
        ))
    };
    let text = |t: &str| -> Result<Vec<i64>, ApiError> {
        if t.is_empty() {
            return Err(ApiError::bad_request(
                "input: an empty string; expected non-empty text",
            ));
        }
        let (ids, cut) = e
            .tokenizer
            .encode_checked(&e.st.input_text(&e.prompt, t))
            .map_err(|err| ApiError::bad_request(format!("input: {err}")))?;
        if cut && !truncate {
            let head: String = t.chars().take(32).collect();
            return Err(too_long(format!("the text starting {head:?} is longer")));
        }
        Ok(ids)
    };
    // Checked here, not in the batch: a bad row must not fail the other
    // clients' inputs batched with it.
    let ids = |v: &[Value]| -> Result<Vec<i64>, ApiError> {
        if v.len() > max_len && !truncate {
            return Err(too_long(format!("{} token ids", v.len())));
        }
        let mut row: Vec<i64> = v
            .iter()
            .map(|x| match x.as_i64() {
                Some(id) if (0..vocab).contains(&id) => Ok(id),
                _ => Err(ApiError::bad_request(format!(
                    "input: {x} is not a token id (an integer from 0 to {})",
                    vocab - 1
                ))),
            })
            .collect::<Result<_, _>>()?;
        if row.len() > max_len {
            let last = row[row.len() - 1];
            row.truncate(max_len - 1);
            row.push(last);
        }
        Ok(row)
    };
    let rows = match input {
        Value::String(t) => (vec![text(t)?], e.prompt_len),
        Value::Array(items) if items.is_empty() => return bad("an empty list; expected at least one input".into()),
        Value::Array(items) if items.len() > max_items => {
            return bad(format!("{} inputs; at most {max_items} per request", items.len()))
        }
        Value::Array(items) => match &items[0] {
            Value::String(_) => (
                items
                    .iter()
                    .map(|x| match x.as_str() {
                        Some(t) => text(t),
                        None => Err(ApiError::bad_request(format!(
                            "input: {x} in a list of strings; expected a string"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                e.prompt_len,
            ),
            Value::Number(_) => (vec![ids(items)?], 0),
            Value::Array(_) => (
                items
                    .iter()
                    .map(|x| match x.as_array() {
                        Some(a) if !a.is_empty() => ids(a),
                        _ => Err(ApiError::bad_request(format!(
                            "input: {x} in a list of token-id lists; expected a non-empty list of integers"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                0,
            ),
            other => return bad(format!("a list of {other}; expected strings or token ids")),
        },
        other => return bad(format!("{other}; expected a string, a list of strings or token ids")),
    };
    Ok(rows)
}

async fn embeddings(
    axum::extract::State(s): axum::extract::State<S>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: EmbeddingsRequest = parse(&s, body).await?;
    let e = embed_model(&s, req.model.as_deref())?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format: '{f}'; expected 'float' or 'base64'"
            )))
        }
    };
    let dims = match req.dimensions {
        None => e.dim,
        Some(d) if d >= 1 && d as usize <= e.dim => d as usize,
        Some(d) => {
            return Err(ApiError::bad_request(format!(
                "dimensions: {d}; expected 1 to {} (the model's dimension)",
                e.dim
            )))
        }
    };
    let (rows, prompt_len) =
        embed_rows(e, &req.input, s.cfg.max_items, req.truncate.unwrap_or(true))?;
    let tokens: usize = rows.iter().map(Vec::len).sum();
    let (tx, rx) = tokio::sync::oneshot::channel();
    e.handle
        .submit(EmbedJob {
            rows,
            prompt_len,
            reply: tx,
        })
        .map_err(|_| ApiError::queue_full("embeddings"))?;
    let vecs = match tokio::time::timeout(s.cfg.timeout, rx).await {
        Err(_) => return Err(ApiError::timeout(s.cfg.timeout.as_secs_f64())),
        Ok(Err(_)) => return Err(ApiError::internal("the embedding worker stopped")),
        Ok(Ok(Err(m))) => return Err(ApiError::bad_request(m)),
        Ok(Ok(Ok(v))) => v,
    };
    s.metrics.tokens_in(tokens);
    let data: Vec<Value> = vecs
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            if dims < v.len() {
                v.truncate(dims);
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if n > 0.0 {
                    v.iter_mut().for_each(|x| *x /= n);
                }
            }
            let emb = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": emb})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list", "data": data, "model": e.names[0],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    .into_response())
}

// ---------------------------------------------------------------- rerank

#[derive(Deserialize)]
struct RerankRequest {
    model: Option<String>,
    query: String,
    documents: Vec<Value>,
    top_n: Option<i64>,
    return_documents: Option<bool>,
}

/// `POST /rerank` (and `/v1/rerank`), the Cohere / Jina / TEI format:
/// `{"query", "documents": [text or {"text"}], "top_n"?, "return_documents"?}`
/// in, `{"results": [{"index", "relevance_score", "document"?: {"text"}}],
/// "model", "usage"}` out, best first.
async fn rerank(
    axum::extract::State(s): axum::extract::State<S>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: RerankRequest = parse(&s, body).await?;
    ready(&s)?;
    let r = s.rerank.get().ok_or_else(|| {
        ApiError::unknown_model(req.model.as_deref().unwrap_or("(rerank)"), &loaded(&s))
    })?;
    if let Some(m) = req.model.as_deref() {
        if !r.names.iter().any(|n| n == m) {
            return Err(ApiError::unknown_model(m, &loaded(&s)));
        }
    }
    if req.documents.is_empty() {
        return Err(ApiError::bad_request(
            "documents: empty; expected at least one document",
        ));
    }
    if req.documents.len() > s.cfg.max_items {
        return Err(ApiError::bad_request(format!(
            "documents: {} documents; expected at most {}",
            req.documents.len(),
            s.cfg.max_items
        )));
    }
    let docs: Vec<String> = req
        .documents
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(t) => Ok(t.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(t)) => Ok(t.clone()),
                _ => Err(ApiError::bad_request(format!(
                    "documents[{i}]: an object without a string \"text\"; expected a string or {{\"text\": string}}"
                ))),
            },
            other => Err(ApiError::bad_request(format!(
                "documents[{i}]: {other}; expected a string or {{\"text\": string}}"
            ))),
        })
        .collect::<Result<_, _>>()?;
    let top_n = match req.top_n {
        None => docs.len(),
        Some(n) if n >= 1 => (n as usize).min(docs.len()),
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "top_n: {n}; expected at least 1"
            )))
        }
    };
    let model = r.model.clone();
    let query = req.query;
    let job_docs = docs.clone();
    let job = tokio::task::spawn_blocking(move || {
        let mut m = model
            .lock()
            .map_err(|_| "the reranker is poisoned".to_string())?;
        let refs: Vec<&str> = job_docs.iter().map(String::as_str).collect();
        let pairs: Vec<(&str, &str)> = refs.iter().map(|d| (query.as_str(), *d)).collect();
        let tokens: usize = m
            .tokenizer()
            .encode_pairs(&pairs)
            .map_err(|e| e.to_string())?
            .lengths
            .iter()
            .sum();
        let ranked = m.rerank(&query, &refs).map_err(|e| e.to_string())?;
        Ok::<_, String>((ranked, tokens))
    });
    let (ranked, tokens) = match tokio::time::timeout(s.cfg.timeout, job).await {
        Err(_) => return Err(ApiError::timeout(s.cfg.timeout.as_secs_f64())),
        Ok(Err(_)) => return Err(ApiError::internal("the reranker task stopped")),
        Ok(Ok(Err(m))) => return Err(ApiError::bad_request(m)),
        Ok(Ok(Ok(v))) => v,
    };
    s.metrics.tokens_in(tokens);
    let with_docs = req.return_documents.unwrap_or(false);
    let results: Vec<Value> = ranked
        .iter()
        .take(top_n)
        .map(|x| {
            let mut v = json!({"index": x.index, "relevance_score": x.score});
            if with_docs {
                v["document"] = json!({"text": docs[x.index]});
            }
            v
        })
        .collect();
    Ok(axum::Json(json!({
        "id": request_id("rerank"),
        "results": results,
        "model": r.names[0],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    .into_response())
}

// ---------------------------------------------------------------- generation

/// Sampling and length fields shared by completions and chat.
#[derive(Deserialize)]
struct GenParams {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    repetition_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: Value,
    logprobs: Option<i64>,
    #[serde(flatten)]
    p: GenParams,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Value>,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    #[serde(flatten)]
    p: GenParams,
}

/// What a validated generation request needs besides its prompt.
struct Gen {
    max_tokens: Option<usize>,
    default_max: usize,
    sampler: SamplerConfig,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
}

fn gen_params(p: &GenParams, default_max: usize) -> Result<Gen, ApiError> {
    if let Some(n) = p.n {
        if n != 1 {
            return Err(ApiError::bad_request(format!(
                "n: {n}; only n = 1 is served"
            )));
        }
    }
    let max = p.max_completion_tokens.or(p.max_tokens);
    let max_tokens = match max {
        None => None,
        Some(m) if m >= 1 => Some(m as usize),
        Some(m) => {
            return Err(ApiError::bad_request(format!(
                "max_tokens: {m}; expected at least 1"
            )))
        }
    };
    let top_k = match p.top_k {
        None | Some(-1) => 0,
        Some(k) if k >= 0 => k as usize,
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "top_k: {k}; expected 0 (off), -1 (off) or more"
            )))
        }
    };
    let temperature = p.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(format!(
            "temperature: {temperature}; expected 0 to 2"
        )));
    }
    let seed = p.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let sampler = SamplerConfig {
        temperature,
        top_k,
        top_p: p.top_p.unwrap_or(1.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        seed,
    };
    Sampler::new(sampler).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let stop = match &p.stop {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad_request(format!("stop: {x}; expected strings")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "stop: {other}; expected a string or a list of at most 16 strings"
            )))
        }
    };
    Ok(Gen {
        max_tokens,
        default_max,
        sampler,
        stop,
        stream: p.stream.unwrap_or(false),
        include_usage: p
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

/// Check the prompt against the context and pick `max_tokens`.
fn fit(l: &LlmState, prompt: &[u32], g: &Gen) -> Result<usize, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt encodes to no tokens"));
    }
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= l.vocab) {
        return Err(ApiError::bad_request(format!(
            "prompt: token id {id}; expected 0 to {}",
            l.vocab - 1
        )));
    }
    if prompt.len() >= l.ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens; the context holds {} (room for at least one new token needed)",
            prompt.len(),
            l.ctx
        )));
    }
    let room = l.ctx - prompt.len() + 1;
    match g.max_tokens {
        Some(m) if m > room => Err(ApiError::bad_request(format!(
            "max_tokens: {m}; the {}-token prompt leaves room for {room} in the context of {}",
            prompt.len(),
            l.ctx
        ))),
        Some(m) => Ok(m),
        None => Ok(g.default_max.min(room)),
    }
}

/// One generated token, kept for the final answer.
struct Tok {
    id: u32,
    logprob: Option<TokenLogprob>,
}

/// What a finished generation produced.
struct Finished {
    text: String,
    tokens: Vec<Tok>,
    finish_reason: &'static str,
    prompt_tokens: usize,
    completion_tokens: usize,
}

async fn collect(s: &State, mut rx: UnboundedReceiver<GenEvent>) -> Result<Finished, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let work = async {
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Token {
                    id,
                    text: t,
                    logprob,
                } => {
                    text.push_str(&t);
                    tokens.push(Tok { id, logprob });
                }
                GenEvent::Done {
                    finish_reason,
                    text: t,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    text.push_str(&t);
                    return Ok((finish_reason, prompt_tokens, completion_tokens));
                }
                GenEvent::Error { timeout: true, .. } => {
                    return Err(ApiError::timeout(s.cfg.timeout.as_secs_f64()))
                }
                GenEvent::Error { message, .. } => return Err(ApiError::internal(message)),
            }
        }
        Err(ApiError::internal("the generation worker stopped"))
    };
    let (finish_reason, prompt_tokens, completion_tokens) =
        match tokio::time::timeout(s.cfg.timeout, work).await {
            Err(_) => return Err(ApiError::timeout(s.cfg.timeout.as_secs_f64())),
            Ok(r) => r?,
        };
    Ok(Finished {
        text,
        tokens,
        finish_reason,
        prompt_tokens,
        completion_tokens,
    })
}

fn submit(
    s: &State,
    l: &LlmState,
    prompt: Vec<u32>,
    max_tokens: usize,
    g: &Gen,
    logprobs: Option<usize>,
) -> Result<UnboundedReceiver<GenEvent>, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    l.handle
        .submit(GenRequest {
            prompt,
            max_tokens,
            sampler: g.sampler,
            stop: g.stop.clone(),
            logprobs,
            deadline: Instant::now() + s.cfg.timeout,
            events: tx,
        })
        .map_err(|_| ApiError::queue_full("generation"))?;
    Ok(rx)
}

fn token_str(l: &LlmState, id: u32) -> String {
    l.tok.decode(&[id]).unwrap_or_default()
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion})
}

/// A server-sent-events response from a stream of JSON events, ending
/// with `data: [DONE]`.
fn sse(rx: tokio::sync::mpsc::Receiver<Value>) -> Response {
    let stream = futures_util::stream::unfold((rx, false), |(mut rx, done)| async move {
        if done {
            return None;
        }
        match rx.recv().await {
            Some(v) => Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {v}\n\n"))),
                (rx, false),
            )),
            None => Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (rx, true))),
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| ApiError::internal("building the stream").into_response())
}

/// Forward generation events as chunks made by `chunk(text, finish, logprob)`;
/// stops (dropping the generation, which frees its slot) when the client
/// goes away.
fn stream_events(
    mut rx: UnboundedReceiver<GenEvent>,
    first: Option<Value>,
    include_usage: bool,
    usage_chunk: impl Fn(Value) -> Value + Send + 'static,
    chunk: impl Fn(&str, Option<&str>, Option<(u32, &TokenLogprob)>) -> Value + Send + 'static,
) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Value>(16);
    tokio::spawn(async move {
        if let Some(f) = first {
            if tx.send(f).await.is_err() {
                return;
            }
        }
        while let Some(ev) = rx.recv().await {
            let msg = match ev {
                GenEvent::Token { id, text, logprob } => {
                    if text.is_empty() && logprob.is_none() {
                        continue;
                    }
                    chunk(&text, None, logprob.as_ref().map(|l| (id, l)))
                }
                GenEvent::Done {
                    finish_reason,
                    text,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let _ = tx.send(chunk(&text, Some(finish_reason), None)).await;
                    if include_usage {
                        let _ = tx
                            .send(usage_chunk(usage(prompt_tokens, completion_tokens)))
                            .await;
                    }
                    return;
                }
                GenEvent::Error { timeout, message } => {
                    let e = if timeout {
                        ApiError::timeout(0.0)
                    } else {
                        ApiError::internal(message)
                    };
                    let _ = tx.send(e.body()).await;
                    return;
                }
            };
            if tx.send(msg).await.is_err() {
                return; // the client went away
            }
        }
    });
    sse(out)
}

fn completion_logprobs(l: &LlmState, toks: &[(u32, &TokenLogprob)]) -> Value {
    json!({
        "tokens": toks.iter().map(|(id, _)| token_str(l, *id)).collect::<Vec<_>>(),
        "token_logprobs": toks.iter().map(|(_, p)| p.logprob).collect::<Vec<_>>(),
        "top_logprobs": toks.iter().map(|(_, p)| {
            p.top.iter().map(|(i, v)| (token_str(l, *i), json!(v))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
    })
}

fn chat_logprobs(l: &LlmState, toks: &[(u32, &TokenLogprob)]) -> Value {
    let entry = |id: u32, lp: f32| {
        let t = token_str(l, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    json!({"content": toks.iter().map(|(id, p)| {
        let mut e = entry(*id, p.logprob);
        e["top_logprobs"] = Value::Array(p.top.iter().map(|(i, v)| entry(*i, *v)).collect());
        e
    }).collect::<Vec<_>>()})
}

async fn completions(
    axum::extract::State(s): axum::extract::State<S>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(&s, body).await?;
    let l = llm(&s, req.p.model.as_deref())?;
    let g = gen_params(&req.p, 16)?;
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=20).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "logprobs: {k}; expected 0 to 20"
            )))
        }
    };
    let prompt: Vec<u32> = match &req.prompt {
        Value::String(t) => l
            .tok
            .encode(t, l.tok.add_bos_default())
            .map_err(|e| ApiError::bad_request(format!("prompt: {e}")))?,
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            let t = a[0].as_str().unwrap_or_default();
            l.tok
                .encode(t, l.tok.add_bos_default())
                .map_err(|e| ApiError::bad_request(format!("prompt: {e}")))?
        }
        Value::Array(a) if a.iter().all(|x| x.is_u64()) => a
            .iter()
            .map(|x| u32::try_from(x.as_u64().unwrap_or(u64::MAX)).unwrap_or(u32::MAX))
            .collect(),
        other => {
            return Err(ApiError::bad_request(format!(
                "prompt: {}; expected a string, a list of one string, or a list of token ids",
                crate::api::short(other)
            )))
        }
    };
    let max = fit(l, &prompt, &g)?;
    let rx = submit(&s, l, prompt, max, &g, logprobs)?;
    let (id, model, created) = (request_id("cmpl"), l.names[0].clone(), now());
    if g.stream {
        let lc = s.clone();
        let (id2, model2) = (id.clone(), model.clone());
        return Ok(stream_events(
            rx,
            None,
            g.include_usage,
            move |u| json!({"id": id2, "object": "text_completion", "created": created, "model": model2, "choices": [], "usage": u}),
            move |text, finish, lp| {
                let l = lc.llm.get().expect("loaded: checked above");
                json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish,
                        "logprobs": lp.map(|t| completion_logprobs(l, &[t]))}]})
            },
        ));
    }
    let f = collect(&s, rx).await?;
    let lp = logprobs.map(|_| {
        let toks: Vec<(u32, &TokenLogprob)> = f
            .tokens
            .iter()
            .filter_map(|t| t.logprob.as_ref().map(|p| (t.id, p)))
            .collect();
        completion_logprobs(l, &toks)
    });
    Ok(axum::Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": f.text, "finish_reason": f.finish_reason, "logprobs": lp}],
        "usage": usage(f.prompt_tokens, f.completion_tokens)}))
    .into_response())
}

/// A short rendering of a JSON value for error messages.
pub(crate) fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        format!("{}...", &s[..s.floor_char_boundary_compat(80)])
    } else {
        s
    }
}

trait FloorBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorBoundary for String {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while i > 0 && !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

/// The text of a message's `content`: a string or a list of text parts.
fn content_text(c: &Option<Value>) -> Result<String, ApiError> {
    match c {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => Ok(t.to_string()),
                    _ => Err(ApiError::bad_request(format!(
                        "messages: content part {}; only text parts are served",
                        short(p)
                    ))),
                }
            })
            .collect(),
        Some(other) => Err(ApiError::bad_request(format!(
            "messages: content {}; expected a string or a list of text parts",
            short(other)
        ))),
    }
}

/// The chat prompt's token ids: the model's template, rendered.
fn chat_prompt(l: &LlmState, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages: empty; expected at least one message",
        ));
    }
    let msgs = messages
        .iter()
        .map(|m| {
            Ok(Message {
                role: m.role.clone(),
                content: content_text(&m.content)?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = l.template.render(&msgs).map_err(ApiError::bad_request)?;
    // The template writes the BOS text itself where the model wants one.
    l.tok
        .encode(&text, false)
        .map_err(|e| ApiError::bad_request(format!("messages: {e}")))
}

async fn chat_completions(
    axum::extract::State(s): axum::extract::State<S>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(&s, body).await?;
    let l = llm(&s, req.p.model.as_deref())?;
    let g = gen_params(&req.p, usize::MAX)?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, None) => None,
        (false, Some(_)) => return Err(ApiError::bad_request("top_logprobs needs logprobs: true")),
        (true, None) => Some(0),
        (true, Some(k)) if (0..=20).contains(&k) => Some(k as usize),
        (true, Some(k)) => {
            return Err(ApiError::bad_request(format!(
                "top_logprobs: {k}; expected 0 to 20"
            )))
        }
    };
    let prompt = chat_prompt(l, &req.messages)?;
    let max = fit(l, &prompt, &g)?;
    let rx = submit(&s, l, prompt, max, &g, logprobs)?;
    let (id, model, created) = (request_id("chatcmpl"), l.names[0].clone(), now());
    if g.stream {
        let lc = s.clone();
        let first = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
        let (id2, model2) = (id.clone(), model.clone());
        return Ok(stream_events(
            rx,
            Some(first),
            g.include_usage,
            move |u| json!({"id": id2, "object": "chat.completion.chunk", "created": created, "model": model2, "choices": [], "usage": u}),
            move |text, finish, lp| {
                let l = lc.llm.get().expect("loaded: checked above");
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                        "logprobs": lp.map(|t| chat_logprobs(l, &[t]))}]})
            },
        ));
    }
    let f = collect(&s, rx).await?;
    let lp = logprobs.map(|_| {
        let toks: Vec<(u32, &TokenLogprob)> = f
            .tokens
            .iter()
            .filter_map(|t| t.logprob.as_ref().map(|p| (t.id, p)))
            .collect();
        chat_logprobs(l, &toks)
    });
    Ok(axum::Json(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f.text},
            "finish_reason": f.finish_reason, "logprobs": lp}],
        "usage": usage(f.prompt_tokens, f.completion_tokens)}))
    .into_response())
}

// ---------------------------------------------------------------- tokenize

#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    add_special_tokens: Option<bool>,
}

async fn tokenize(
    axum::extract::State(s): axum::extract::State<S>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse(&s, body).await?;
    ready(&s)?;
    let want_embed = match req.model.as_deref() {
        Some(m) => s
            .embed
            .get()
            .is_some_and(|e| e.names.iter().any(|n| n == m)),
        None => s.llm.get().is_none(),
    };
    let (tokens, max_len): (Vec<i64>, usize) = if want_embed {
        let e = embed_model(&s, req.model.as_deref())?;
        let p = req
            .prompt
            .as_deref()
            .ok_or_else(|| ApiError::bad_request("prompt: missing; expected a string"))?;
        let ids = e
            .tokenizer
            .encode(p)
            .map_err(|err| ApiError::bad_request(format!("prompt: {err}")))?;
        (ids, e.tokenizer.max_seq_len())
    } else {
        let l = llm(&s, req.model.as_deref())?;
        let ids = match (&req.prompt, &req.messages) {
            (Some(p), None) => l
                .tok
                .encode(p, req.add_special_tokens.unwrap_or(l.tok.add_bos_default()))
                .map_err(|e| ApiError::bad_request(format!("prompt: {e}")))?,
            (None, Some(m)) => chat_prompt(l, m)?,
            _ => {
                return Err(ApiError::bad_request(
                    "give exactly one of prompt and messages",
                ))
            }
        };
        (ids.into_iter().map(i64::from).collect(), l.ctx)
    };
    Ok(
        axum::Json(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": max_len}))
            .into_response(),
    )
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

async fn detokenize(
    axum::extract::State(s): axum::extract::State<S>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse(&s, body).await?;
    let l = llm(&s, req.model.as_deref())?;
    let text = l
        .tok
        .decode(&req.tokens)
        .map_err(|e| ApiError::bad_request(format!("tokens: {e}")))?;
    Ok(axum::Json(json!({"prompt": text})).into_response())
}

#[cfg(test)]
mod tests {
    /// Every route of the router is in /openapi.json and nothing else is.
    #[test]
    fn the_openapi_document_describes_every_route() {
        let doc: serde_json::Value = serde_json::from_str(include_str!("openapi.json")).unwrap();
        let mut documented: Vec<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let src = include_str!("api.rs");
        let mut routed: Vec<&str> = src
            .split(".route(\"")
            .skip(1)
            .map(|s| &s[..s.find('"').unwrap()])
            .collect();
        documented.sort_unstable();
        routed.sort_unstable();
        assert_eq!(documented, routed);
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                assert!(
                    op["responses"]["200"].is_object(),
                    "{method} {path} documents no 200"
                );
            }
        }
    }
}
