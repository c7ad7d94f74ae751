//! `rlx serve` on loopback, against the library on the real models (skipped
//! when they are not fetched): embeddings bit for bit (float and base64,
//! `dimensions`), greedy completions equal to the `rlx generate` loop, chat
//! and streaming, stop strings, logprobs, tokenize, error cases (each a
//! 4xx, the server staying up), 32 concurrent mixed clients each getting
//! its single-client answer, a client leaving mid-stream, the queue-full
//! 429 path and the drain on shutdown.
//!
//! The client is a few lines of HTTP/1.1 over `std::net::TcpStream`.

use base64::Engine as _;
use rlx::models::gguf_tokenizer::GgufTokenizer;
use rlx::models::llama::LlamaModel;
use rlx::models::sampling::{Sampler, SamplerConfig};
use rlx::models::SentenceEmbedder;
use rlx_server::{Server, ServerConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

const CTX: usize = 512;

fn models() -> PathBuf {
    std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))
        .unwrap_or_default()
}

fn minilm() -> PathBuf {
    models().join("all-minilm-l6-v2")
}

fn smollm2() -> PathBuf {
    models().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn have_models() -> bool {
    let ok = minilm().join("model.safetensors").exists() && smollm2().exists();
    if !ok {
        println!("skipped: models not fetched (run python3 scripts/fetch_models.py all)");
    }
    ok
}

fn config() -> ServerConfig {
    ServerConfig {
        embed_model: Some(minilm()),
        llm: Some(smollm2()),
        port: 0,
        ctx: CTX,
        max_concurrent: 4,
        queue: 64,
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

/// One server for the tests that share it.
fn shared() -> SocketAddr {
    static S: OnceLock<SocketAddr> = OnceLock::new();
    *S.get_or_init(|| {
        let s = Server::start(config()).expect("start");
        s.wait_ready(Duration::from_secs(120)).expect("ready");
        let a = s.addr();
        std::mem::forget(s); // lives until the test process ends
        a
    })
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading a huge body.
    let _ = s.write_all(body);
    s
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Resp {
    let mut s = send(addr, method, path, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn post(addr: SocketAddr, path: &str, v: &Value) -> Resp {
    request(addr, "POST", path, v.to_string().as_bytes())
}

fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, b"")
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The `rlx generate` loop (prefill, greedy sampler, stop at the end of
/// generation), as text.
/// The library's SmolLM2 (hybrid, CTX positions) and its tokenizer.
fn reference_llm() -> &'static std::sync::Mutex<(LlamaModel, GgufTokenizer)> {
    static M: OnceLock<std::sync::Mutex<(LlamaModel, GgufTokenizer)>> = OnceLock::new();
    M.get_or_init(|| {
        let f = rlx::formats::GgufFile::open(smollm2()).unwrap();
        let tok = GgufTokenizer::from_gguf(&f).unwrap();
        let opts = rlx::cpu::CpuOptions {
            hybrid: true,
            ..Default::default()
        };
        std::sync::Mutex::new((LlamaModel::load_with(smollm2(), CTX, opts).unwrap(), tok))
    })
}

fn reference_greedy(prompt: &str, max_tokens: usize) -> String {
    let mut g = reference_llm().lock().unwrap();
    let (model, tok) = &mut *g;
    let ids = tok.encode(prompt, tok.add_bos_default()).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let mut history = ids.clone();
    let mut logits = model.prefill(&ids).unwrap();
    let mut out = Vec::new();
    for n in 1..=max_tokens {
        let id = sampler.sample(&logits, &history).unwrap();
        if tok.is_end_of_generation(id) {
            break;
        }
        history.push(id);
        out.push(id);
        if n == max_tokens {
            break;
        }
        logits = model.decode(id).unwrap();
    }
    tok.decode(&out).unwrap()
}

fn library_embed(texts: &[&str]) -> Vec<Vec<f32>> {
    static E: OnceLock<std::sync::Mutex<SentenceEmbedder>> = OnceLock::new();
    E.get_or_init(|| std::sync::Mutex::new(SentenceEmbedder::load(minilm()).unwrap()))
        .lock()
        .unwrap()
        .embed(texts)
        .unwrap()
}

#[test]
fn embeddings_float_base64_and_dimensions_match_the_library() {
    if !have_models() {
        return;
    }
    let a = shared();
    let text = "The quick brown fox jumps over the lazy dog.";
    let want = library_embed(&[text]);
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"input": text, "model": "all-minilm-l6-v2"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(floats(&v["data"][0]["embedding"]), want[0], "bit for bit");
    assert_eq!(v["usage"]["prompt_tokens"], 12);
    // base64: little-endian f32, the same bits.
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"input": [text], "encoding_format": "base64"}),
    );
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let got: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want[0]);
    // dimensions: the first 64, re-normalized.
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"input": text, "dimensions": 64}),
    );
    let got = floats(&r.json()["data"][0]["embedding"]);
    assert_eq!(got.len(), 64);
    let n: f32 = want[0][..64].iter().map(|x| x * x).sum::<f32>().sqrt();
    for (g, w) in got.iter().zip(&want[0][..64]) {
        assert!((g - w / n).abs() < 1e-6, "{g} vs {}", w / n);
    }
    assert!((got.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
    // A list in order, and token ids (with [CLS]/[SEP]) as the text.
    let texts = [
        "first sentence",
        "a second, somewhat longer sentence here",
        "third",
    ];
    let r = post(a, "/v1/embeddings", &json!({"input": texts}));
    let v = r.json();
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(v["data"][i]["index"], i);
        assert_eq!(
            floats(&v["data"][i]["embedding"]),
            library_embed(&[t])[0],
            "input {i}"
        );
    }
    let ids = post(
        a,
        "/tokenize",
        &json!({"model": "all-minilm-l6-v2", "prompt": text}),
    )
    .json();
    let r = post(a, "/v1/embeddings", &json!({"input": ids["tokens"]}));
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), want[0]);
    // Longer than the model's maximum: cut as sentence-transformers cuts
    // (the default), for text and for ids alike, or refused with
    // "truncate": false.
    let long = "word ".repeat(700);
    let cut = post(
        a,
        "/tokenize",
        &json!({"model": "all-minilm-l6-v2", "prompt": long}),
    )
    .json();
    let cut: Vec<i64> = cut["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    let max = cut.len();
    assert!(max >= 128, "the tokenizer cut at {max}");
    let want_long = library_embed(&[&long])[0].clone();
    let r = post(a, "/v1/embeddings", &json!({"input": long}));
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), want_long);
    let mut long_ids = vec![cut[0]];
    long_ids.extend(std::iter::repeat_n(cut[1], 700));
    long_ids.push(cut[max - 1]);
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"input": long_ids, "truncate": true}),
    );
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), want_long);
    for input in [json!(long), json!([long_ids])] {
        let r = post(
            a,
            "/v1/embeddings",
            &json!({"input": input, "truncate": false}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        let m = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            m.contains(&format!("at most {max} tokens")) && m.contains("truncate"),
            "{m}"
        );
    }
    let r = post(
        a,
        "/v1/embeddings",
        &json!({"input": texts, "truncate": false}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn completions_are_greedy_ids_of_rlx_generate_with_stop_and_stream() {
    if !have_models() {
        return;
    }
    let a = shared();
    let prompt = "The history of computing is";
    let want = reference_greedy(prompt, 16);
    let req = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": prompt,
        "max_tokens": 16, "temperature": 0});
    let r = post(a, "/v1/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    // Streaming gives the same text in pieces, then [DONE].
    let mut s = req.clone();
    s["stream"] = json!(true);
    s["stream_options"] = json!({"include_usage": true});
    let r = post(a, "/v1/completions", &s);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let ev = events(&r.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, want);
    assert!(chunks.len() > 3, "streamed in pieces");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 16);
    // A stop string cuts the text before it.
    let words: Vec<&str> = want.split_inclusive(' ').collect();
    assert!(words.len() > 3, "{want:?}");
    let stop = words[2].trim();
    let cut = &want[..want.find(stop).unwrap()];
    let mut st = req.clone();
    st["stop"] = json!([stop]);
    let v = post(a, "/v1/completions", &st).json();
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    st["stream"] = json!(true);
    let r = post(a, "/v1/completions", &st);
    let text: String = events(&r.body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, cut);
    // Logprobs: greedy picks the top alternative; all are <= 0.
    let mut lp = req.clone();
    lp["logprobs"] = json!(3);
    lp["max_tokens"] = json!(4);
    let v = post(a, "/v1/completions", &lp).json();
    let l = &v["choices"][0]["logprobs"];
    for i in 0..4 {
        let chosen = l["token_logprobs"][i].as_f64().unwrap();
        let top: Vec<f64> = l["top_logprobs"][i]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(top.len(), 3);
        assert!(
            chosen <= 0.0 && top.iter().all(|&t| t <= chosen + 1e-6),
            "{chosen} {top:?}"
        );
    }
}

#[test]
fn chat_uses_the_gguf_template_and_streams_the_same_text() {
    if !have_models() {
        return;
    }
    let a = shared();
    let msgs = json!([{"role": "user", "content": "What is the capital of France?"}]);
    // The prompt is the template's: the model's own system turn, then ours.
    let t = post(a, "/tokenize", &json!({"messages": msgs})).json();
    let d = post(a, "/detokenize", &json!({"tokens": t["tokens"]})).json();
    let prompt = d["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n"), "{prompt}");
    assert!(prompt.ends_with(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ));
    let req = json!({"messages": msgs, "max_tokens": 24, "temperature": 0});
    let v = post(a, "/v1/chat/completions", &req).json();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(
        v["choices"][0]["finish_reason"], "stop",
        "ends at <|im_end|>"
    );
    assert_eq!(v["usage"]["prompt_tokens"], t["count"]);
    let mut s = req.clone();
    s["stream"] = json!(true);
    let r = post(a, "/v1/chat/completions", &s);
    let ev = events(&r.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    // Logprobs in chat form.
    let mut lp = req.clone();
    lp["logprobs"] = json!(true);
    lp["top_logprobs"] = json!(2);
    lp["max_tokens"] = json!(3);
    let v = post(a, "/v1/chat/completions", &lp).json();
    let c = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(c.as_array().unwrap().len(), 3);
    assert_eq!(
        c[0]["top_logprobs"][0]["logprob"], c[0]["logprob"],
        "greedy = top-1"
    );
}

#[test]
fn bad_requests_get_4xx_and_the_server_stays_up() {
    if !have_models() {
        return;
    }
    let a = shared();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("/v1/embeddings", b"{not json".to_vec(), 400),
        ("/v1/embeddings", br#"{"input": 5}"#.to_vec(), 400),
        ("/v1/embeddings", br#"{"input": ""}"#.to_vec(), 400),
        ("/v1/embeddings", br#"{"input": []}"#.to_vec(), 400),
        ("/v1/embeddings", br#"{"input": [[]]}"#.to_vec(), 400),
        (
            "/v1/embeddings",
            br#"{"input": [101, 99999999]}"#.to_vec(),
            400,
        ),
        ("/v1/embeddings", br#"{"input": [101, -1]}"#.to_vec(), 400),
        (
            "/v1/embeddings",
            format!("{{\"input\": {:?}, \"truncate\": false}}", vec![101; 600]).into_bytes(),
            400,
        ),
        (
            "/v1/embeddings",
            br#"{"input": "x", "model": "nope"}"#.to_vec(),
            404,
        ),
        (
            "/v1/embeddings",
            br#"{"input": "x", "dimensions": 0}"#.to_vec(),
            400,
        ),
        (
            "/v1/embeddings",
            br#"{"input": "x", "encoding_format": "hex"}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": -1}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": "ten"}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": 100000}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "temperature": -1}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"prompt": [1, 99999999]}"#.to_vec(),
            400,
        ),
        ("/v1/completions", br#"{"prompt": {"a": 1}}"#.to_vec(), 400),
        (
            "/v1/completions",
            br#"{"prompt": "x", "model": "gpt-4"}"#.to_vec(),
            404,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "n": 2}"#.to_vec(),
            400,
        ),
        ("/v1/chat/completions", br#"{"messages": []}"#.to_vec(), 400),
        (
            "/v1/chat/completions",
            br#"{"messages": "hi"}"#.to_vec(),
            400,
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": 3}]}"#.to_vec(),
            400,
        ),
        ("/v1/nope", b"{}".to_vec(), 404),
        ("/v1/embeddings", vec![b' '; 3 << 20], 413),
    ];
    for (path, body, want) in &cases {
        let r = request(a, "POST", path, body);
        assert_eq!(
            r.status,
            *want,
            "{path} {}: {}",
            String::from_utf8_lossy(&body[..body.len().min(60)]),
            r.body
        );
        let e = &r.json()["error"];
        assert!(
            e["message"].is_string() && e["type"].is_string() && e["code"].is_string(),
            "{}",
            r.body
        );
    }
    assert_eq!(get(a, "/health").status, 200);
    let m = get(a, "/metrics").body;
    assert!(
        m.contains("rlx_requests_total{endpoint=\"/v1/embeddings\",status=\"400\"}"),
        "{m}"
    );
}

#[test]
fn thirty_two_concurrent_mixed_clients_get_their_single_client_answers() {
    if !have_models() {
        return;
    }
    let a = shared();
    let texts: Vec<String> = (0..16)
        .map(|i| {
            format!(
                "sentence number {i} about {}",
                ["cats", "rust", "the sea", "music"][i % 4]
            )
            .repeat(1 + i % 3)
        })
        .collect();
    let questions: Vec<String> = (0..16)
        .map(|i| format!("Name a colour, please ({i})."))
        .collect();
    let chat = |q: &str| json!({"messages": [{"role": "user", "content": q}], "max_tokens": 6, "temperature": 0});
    // Single-client answers first, one at a time.
    let want_e: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| library_embed(&[t])[0].clone())
        .collect();
    let want_c: Vec<String> = questions
        .iter()
        .map(|q| {
            post(a, "/v1/chat/completions", &chat(q)).json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let hs: Vec<_> = (0..32)
        .map(|i| {
            let (t, q) = (texts[i / 2].clone(), questions[i / 2].clone());
            let body = if i % 2 == 0 {
                json!({"input": t})
            } else {
                chat(&q)
            };
            std::thread::spawn(move || {
                let path = if i % 2 == 0 {
                    "/v1/embeddings"
                } else {
                    "/v1/chat/completions"
                };
                post(a, path, &body)
            })
        })
        .collect();
    for (i, h) in hs.into_iter().enumerate() {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "client {i}: {}", r.body);
        if i % 2 == 0 {
            assert_eq!(
                floats(&r.json()["data"][0]["embedding"]),
                want_e[i / 2],
                "client {i}"
            );
        } else {
            assert_eq!(
                r.json()["choices"][0]["message"]["content"],
                want_c[i / 2].as_str(),
                "client {i}"
            );
        }
    }
    let m = get(a, "/metrics").body;
    let batches: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("rlx_embed_batch_size_count "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(batches >= 1.0);
    // The chats decoded together: some batched decode steps ran more than
    // one sequence (16 chats over 4 slots).
    let metric = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .trim()
            .parse()
            .unwrap()
    };
    let steps = metric("rlx_decode_batch_size_count ");
    let single = metric("rlx_decode_batch_size_bucket{le=\"1\"} ");
    assert!(
        steps > single,
        "every decode step ran one sequence ({steps} steps): no batching"
    );
}

/// A gauge from /metrics (`name` with its labels and a trailing space).
fn gauge(a: SocketAddr, name: &str) -> i64 {
    get(a, "/metrics")
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap()
        .parse()
        .unwrap()
}

/// The active-slot gauge from /metrics.
fn active(a: SocketAddr) -> i64 {
    gauge(a, "rlx_generation_active_slots ")
}

#[test]
fn queue_full_429_disconnect_frees_the_slot_and_shutdown_drains() {
    if !have_models() {
        return;
    }
    let s = Server::start(ServerConfig {
        max_concurrent: 1,
        queue: 1,
        embed_model: None,
        ..config()
    })
    .unwrap();
    s.wait_ready(Duration::from_secs(120)).unwrap();
    let a = s.addr();
    let long =
        json!({"prompt": "Write a long story about a dragon.", "max_tokens": 48, "temperature": 0});
    // One slot and a queue of one: of 6 at once, some are refused with 429.
    let hs: Vec<_> = (0..6)
        .map(|_| {
            let b = long.clone();
            std::thread::spawn(move || post(a, "/v1/completions", &b))
        })
        .collect();
    let rs: Vec<Resp> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let refused: Vec<&Resp> = rs.iter().filter(|r| r.status == 429).collect();
    assert!(
        !refused.is_empty(),
        "no 429 among {:?}",
        rs.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(rs.iter().all(|r| r.status == 200 || r.status == 429));
    assert_eq!(refused[0].header("retry-after"), Some("1"));
    assert_eq!(refused[0].json()["error"]["code"], "queue_full");
    // It recovers.
    let ok = post(
        a,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    // A client leaving mid-stream frees the slot at once.
    // (Counting goes on for all 400 tokens: no early end of generation.)
    let st =
        json!({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 400, "temperature": 0, "stream": true});
    let conn = send(a, "POST", "/v1/completions", st.to_string().as_bytes());
    let mut rd = BufReader::new(conn);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        rd.read_line(&mut line).unwrap();
    }
    assert_eq!(active(a), 1);
    drop(rd);
    let t = std::time::Instant::now();
    while active(a) != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the slot was not freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = get(a, "/metrics").body;
    assert!(m.contains("rlx_disconnects_total 1"), "{m}");
    // Shutdown with requests in flight: all of them complete. The first
    // is long so that it still holds the slot while the second waits in
    // the queue, however fast the machine.
    // (The counting prompt does not end early, as above.)
    let spawn = |n: u32| {
        let b = json!({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": n, "temperature": 0});
        std::thread::spawn(move || post(a, "/v1/completions", &b))
    };
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let first = spawn(96);
    wait_for("the first request did not start", &|| active(a) == 1);
    let second = spawn(12);
    wait_for("the second request was not queued", &|| {
        gauge(a, "rlx_queue_depth{queue=\"generation\"} ") == 1
    });
    s.shutdown().unwrap();
    for (h, n) in [(first, 96), (second, 12)] {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["usage"]["completion_tokens"], n);
    }
    assert!(
        TcpStream::connect(a).is_err(),
        "still accepting after shutdown"
    );
}

/// A plan from /v1/plans as the library's `CompiledPlan` figures: name,
/// schedule length, counts, and every segment and range.
type PlanFigures = (
    String,
    usize,
    usize,
    usize,
    usize,
    Vec<(u64, u64, u64)>,
    Vec<(u64, u64)>,
);

fn plan_figures(p: &Value) -> PlanFigures {
    let n = |v: &Value| v.as_u64().unwrap();
    (
        p["name"].as_str().unwrap().to_string(),
        n(&p["nodes"]) as usize,
        n(&p["compiled_segments"]) as usize,
        n(&p["thunk_ranges"]) as usize,
        n(&p["dispatches"]) as usize,
        p["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (n(&s["first"]), n(&s["last"]), n(&s["nodes"])))
            .collect(),
        p["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (n(&r["start"]), n(&r["end"])))
            .collect(),
    )
}

fn library_figures(p: &rlx::models::CompiledPlan) -> PlanFigures {
    let r = &p.report;
    (
        p.name.clone(),
        p.nodes,
        r.compiled_segments,
        r.thunk_ranges,
        r.dispatches,
        r.segments
            .iter()
            .map(|s| (s.first.0 as u64, s.last.0 as u64, s.nodes as u64))
            .collect(),
        r.ranges
            .iter()
            .map(|t| (t.start as u64, t.end as u64))
            .collect(),
    )
}

/// Segments and ranges lie inside the schedule, in order, without overlap,
/// and their counts are the plan's.
fn check_plan_shape(p: &PlanFigures) {
    let (name, nodes, segs, ranges, _, s, r) = p;
    assert_eq!(*segs, s.len(), "{name}");
    assert_eq!(*ranges, r.len(), "{name}");
    assert!(*segs >= 1, "{name}: no compiled segment in a hybrid plan");
    let mut spans: Vec<(u64, u64)> = s.iter().map(|&(f, l, _)| (f, l + 1)).collect();
    spans.extend(r.iter().copied());
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "{name}: {:?} overlaps {:?}", w[0], w[1]);
    }
    for &(a, b) in &spans {
        assert!(
            a < b && b as usize <= *nodes,
            "{name}: [{a}, {b}) in {nodes} nodes"
        );
    }
}

#[test]
fn the_page_is_served_and_the_plans_are_the_libraries() {
    if !have_models() {
        return;
    }
    let a = shared();
    let page = get(a, "/");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|c| c.starts_with("text/html")),
        "{:?}",
        page.headers
    );
    for id in [
        "chat-input",
        "chat-log",
        "sim-input",
        "sim-result",
        "plans",
        "/v1/plans",
    ] {
        assert!(page.body.contains(id), "the page has no {id}");
    }
    // Nothing fetched from elsewhere: the machine may be offline.
    for ext in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "href=\"//",
        "@import",
    ] {
        assert!(!page.body.contains(ext), "the page loads {ext}...");
    }
    let j = get(a, "/v1/plans").json();
    assert_eq!(j["ready"], true);
    let data = j["data"].as_array().unwrap();
    let kinds: Vec<&str> = data.iter().map(|m| m["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["embeddings", "generation"]);
    assert_eq!(data[0]["model"], "all-minilm-l6-v2");
    assert_eq!(data[1]["model"], "SmolLM2-135M-Instruct.Q4_1");
    // The embedding plan: one short input, padded as the library pads it
    // (to at least 8 tokens, a multiple of the 4-token bucket), as the
    // library compiles it.
    let short = rlx::models::padded_len(1, rlx::models::CPU_SEQ_BUCKET, 512);
    assert_eq!(short, 8);
    let want = SentenceEmbedder::load(minilm())
        .unwrap()
        .plan_for(1, short)
        .unwrap();
    let got: Vec<PlanFigures> = data[0]["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(plan_figures)
        .collect();
    assert_eq!(got, vec![library_figures(&want)]);
    check_plan_shape(&got[0]);
    // The decode plans: one sequence and the batched graphs of 1..=4
    // slots (config().max_concurrent), as the library compiles them.
    let want: Vec<PlanFigures> = {
        let mut g = reference_llm().lock().unwrap();
        g.0.prepare_decode_batch(4).unwrap();
        g.0.compiled_plans()
            .iter()
            .filter(|p| p.name.starts_with("decode"))
            .map(library_figures)
            .collect()
    };
    let got: Vec<PlanFigures> = data[1]["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(plan_figures)
        .collect();
    let names: Vec<&str> = got.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "decode",
            "decode_batch 1",
            "decode_batch 2",
            "decode_batch 3",
            "decode_batch 4"
        ]
    );
    assert_eq!(got, want);
    for p in &got {
        check_plan_shape(p);
    }
    // Attention stays on thunks in the decode graph: some range says why.
    let decode = &data[1]["plans"][0];
    assert!(
        decode["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["ops"].as_array().unwrap())
            .any(|o| o["op"] == "Attention" && !o["reason"].as_str().unwrap().is_empty()),
        "{decode}"
    );
}

#[test]
fn with_only_an_embedding_model_the_plans_list_only_it() {
    if !have_models() {
        return;
    }
    let s = Server::start(ServerConfig {
        llm: None,
        ..config()
    })
    .unwrap();
    s.wait_ready(Duration::from_secs(120)).unwrap();
    let a = s.addr();
    let j = get(a, "/v1/plans").json();
    assert_eq!(j["ready"], true);
    let data = j["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{j}");
    assert_eq!(data[0]["kind"], "embeddings");
    assert_eq!(get(a, "/").status, 200);
    let m = get(a, "/metrics").body;
    assert!(
        m.contains("rlx_requests_total{endpoint=\"/v1/plans\",status=\"200\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("rlx_requests_total{endpoint=\"/\",status=\"200\"} 1"),
        "{m}"
    );
    s.shutdown().unwrap();
}

/// The random-init cross-encoder of rlx-models' test data (no fetch needed).
fn reranker_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rlx-models/tests/data/families/reranker")
}

#[test]
fn rerank_scores_equal_cross_encoder_and_bad_requests_are_openai_errors() {
    let s = Server::start(ServerConfig {
        rerank_model: Some(reranker_dir()),
        port: 0,
        ..Default::default()
    })
    .expect("start");
    s.wait_ready(Duration::from_secs(60)).expect("ready");
    let a = s.addr();
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(reranker_dir().join("reference.json")).unwrap(),
    )
    .unwrap();
    let cases = r["cases"].as_array().unwrap();
    let query = cases[0]["query"].as_str().unwrap();
    let mine: Vec<&Value> = cases.iter().filter(|c| c["query"] == query).collect();
    let docs: Vec<&str> = mine
        .iter()
        .map(|c| c["document"].as_str().unwrap())
        .collect();
    for path in ["/rerank", "/v1/rerank"] {
        let resp = post(
            a,
            path,
            &json!({"query": query, "documents": docs, "return_documents": true}),
        );
        assert_eq!(resp.status, 200, "{}", resp.body);
        let v: Value = serde_json::from_str(&resp.body).unwrap();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), docs.len());
        let mut last = f64::INFINITY;
        for x in results {
            let i = x["index"].as_u64().unwrap() as usize;
            let got = x["relevance_score"].as_f64().unwrap();
            let want = mine[i]["score"].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 1e-4 * want.abs(),
                "doc {i}: {got} vs {want}"
            );
            assert_eq!(x["document"]["text"], docs[i]);
            assert!(got <= last, "not best first: {}", resp.body);
            last = got;
        }
        assert!(v["usage"]["total_tokens"].as_u64().unwrap() > docs.len() as u64);
        assert_eq!(v["model"], "reranker");
    }
    // top_n, documents as {"text"} objects, no documents echoed by default.
    let objs: Vec<Value> = docs.iter().map(|d| json!({"text": d})).collect();
    let resp = post(
        a,
        "/rerank",
        &json!({"query": query, "documents": objs, "top_n": 2}),
    );
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v: Value = serde_json::from_str(&resp.body).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert!(results[0].get("document").is_none());
    // Bad requests: 4xx with an OpenAI error body, the server staying up.
    for (body, status, needle) in [
        (
            json!({"query": "q", "documents": []}),
            400,
            "documents: empty",
        ),
        (json!({"query": "q", "documents": [3]}), 400, "documents[0]"),
        (
            json!({"query": "q", "documents": ["d"], "top_n": 0}),
            400,
            "top_n: 0",
        ),
        (json!({"documents": ["d"]}), 400, "query"),
        (
            json!({"query": "q", "documents": ["d"], "model": "nope"}),
            404,
            "nope",
        ),
    ] {
        let resp = post(a, "/rerank", &body);
        assert_eq!(resp.status, status, "{body}: {}", resp.body);
        let e: Value = serde_json::from_str(&resp.body).unwrap();
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
        assert!(e["error"]["type"].is_string() && e["error"]["code"].is_string());
    }
    // Embeddings are not served by this server: a 404 naming what is loaded.
    let resp = post(a, "/v1/embeddings", &json!({"input": "x"}));
    assert_eq!(resp.status, 404, "{}", resp.body);
    assert!(resp.body.contains("reranker"), "{}", resp.body);
    s.shutdown().unwrap();
}

/// A random-init embedder whose sentence-transformers config has a default
/// prompt (rlx-models' bert_max: `default_prompt_name` "query", pooling
/// without the prompt's tokens); no fetch needed.
fn prompted_embedder_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rlx-models/tests/data/families/bert_max")
}

#[test]
fn embeddings_of_text_get_the_models_default_prompt() {
    let dir = prompted_embedder_dir();
    let s = Server::start(ServerConfig {
        embed_model: Some(dir.clone()),
        port: 0,
        ..Default::default()
    })
    .expect("start");
    s.wait_ready(Duration::from_secs(60)).expect("ready");
    let a = s.addr();
    let mut lib = SentenceEmbedder::load(&dir).unwrap();
    assert_eq!(lib.default_prompt_name(), Some("query"));
    let prompt = lib.st_config().prompt(None).unwrap().to_string();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    // sentence-transformers' encode(texts) of the same model: the default
    // prompt applied (prompt_name None). The empty text is left out: the
    // server refuses empty strings.
    let cases: Vec<&Value> = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["prompt_name"].is_null() && c["text"] != "")
        .collect();
    assert!(cases.len() >= 9, "{} cases", cases.len());
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let resp = post(a, "/v1/embeddings", &json!({"input": texts}));
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v = resp.json();
    let mut tokens = 0;
    for (i, (t, c)) in texts.iter().zip(&cases).enumerate() {
        let got = floats(&v["data"][i]["embedding"]);
        // The library's embed (default prompt), bit for bit.
        assert_eq!(got, lib.embed(&[t]).unwrap()[0], "input {i}");
        let st = floats(&c["embedding"]);
        let scale = st.iter().fold(1f32, |m, x| m.max(x.abs()));
        let err = got
            .iter()
            .zip(&st)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err <= 1e-4 * scale,
            "input {i}: {err:e} from sentence-transformers"
        );
        // Without the prompt the vector is another one.
        let bare = lib.embed_with_prompt_text(&[t], "").unwrap().remove(0);
        let diff = got
            .iter()
            .zip(&bare)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            diff > 1e-3,
            "input {i}: the prompt changed nothing ({diff:e})"
        );
        tokens += c["ids"].as_array().unwrap().len();
    }
    // The prompt's tokens are counted (the reference ids include them).
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    // A single string, and "truncate": false counting the prompt's tokens.
    let resp = post(a, "/v1/embeddings", &json!({"input": texts[0]}));
    assert_eq!(
        floats(&resp.json()["data"][0]["embedding"]),
        lib.embed(&[texts[0]]).unwrap()[0]
    );
    let cut = |t: &str| lib.tokenizer().encode_checked(t).unwrap().1;
    let fits = (1..lib.tokenizer().max_seq_len())
        .map(|n| "x ".repeat(n))
        .take_while(|t| !cut(&format!("{prompt}{t}")))
        .last()
        .unwrap();
    let over = format!("{fits}x ");
    // `over` fits alone, not after the prompt.
    assert!(cut(&format!("{prompt}{over}")) && !cut(&over));
    for (input, status) in [(&fits, 200), (&over, 400)] {
        let resp = post(
            a,
            "/v1/embeddings",
            &json!({"input": input, "truncate": false}),
        );
        assert_eq!(resp.status, status, "{input:?}: {}", resp.body);
    }
    // Token ids are used as given: no prompt.
    let ids = lib.tokenizer().encode(texts[1]).unwrap();
    let resp = post(a, "/v1/embeddings", &json!({"input": ids}));
    assert_eq!(
        floats(&resp.json()["data"][0]["embedding"]),
        lib.embed_ids(&[ids]).unwrap()[0]
    );
    s.shutdown().unwrap();
}

/// The embedding model on CUDA (`--device cuda`): the server's vectors for
/// the sentence-transformers reference sentences, in one request of all of
/// them and in requests of one and of five (several batch shapes, the one
/// CUDA model re-targeted between them), equal the CPU library's within
/// 1e-4 and cos >= 0.99999. Skipped without a GPU (a failure with
/// `RLX_REQUIRE_CUDA=1`) or without the fetched MiniLM.
#[cfg(feature = "cuda")]
#[test]
fn cuda_embeddings_match_the_cpu_library() {
    match rlx::cuda::cuda_available() {
        Ok(_) => {}
        Err(why) if std::env::var("RLX_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("RLX_REQUIRE_CUDA=1 but no CUDA device: {why}")
        }
        Err(why) => {
            println!("skipped: no CUDA device ({why})");
            return;
        }
    }
    if !minilm().join("model.safetensors").exists() {
        println!("skipped: MiniLM not fetched (run python3 scripts/fetch_models.py all)");
        return;
    }
    let refs: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../rlx-models/tests/data/minilm_embeddings.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let sentences: Vec<&str> = refs["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        // The reference set holds an empty string, which the API refuses
        // (as OpenAI's does); the library embeds it, the server never sees it.
        .filter(|s| !s.is_empty())
        .collect();
    let want = library_embed(&sentences);
    let s = Server::start(ServerConfig {
        embed_model: Some(minilm()),
        embed_device: rlx_server::LlmDevice::Cuda(0),
        port: 0,
        ..Default::default()
    })
    .unwrap();
    s.wait_ready(Duration::from_secs(120)).unwrap();
    let a = s.addr();
    let check = |lo: usize, hi: usize| {
        let r = post(
            a,
            "/v1/embeddings",
            &json!({"model": "all-minilm-l6-v2", "input": &sentences[lo..hi]}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let j = r.json();
        let data = j["data"].as_array().unwrap();
        assert_eq!(data.len(), hi - lo);
        for (i, d) in data.iter().enumerate() {
            let (got, w) = (floats(&d["embedding"]), &want[lo + i]);
            assert_eq!(got.len(), w.len());
            let worst = got
                .iter()
                .zip(w)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            let dot: f32 = got.iter().zip(w).map(|(x, y)| x * y).sum();
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let cos = dot / (norm(&got) * norm(w));
            assert!(
                worst < 1e-4 && cos >= 0.99999,
                "sentence {}: max |diff| {worst}, cos {cos}",
                lo + i
            );
        }
    };
    check(0, sentences.len());
    check(0, 1);
    check(2, 7.min(sentences.len()));
    check(sentences.len() - 1, sentences.len());
    s.shutdown().unwrap();
}
