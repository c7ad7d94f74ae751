//! Generation with continuous batching (on the CPU, or on CUDA with
//! [`crate::LlmDevice::Cuda`], where the caches are device buffers and each
//! batched step replays one CUDA graph per batch size): one worker thread owns
//! the [`LlamaModel`] and serves up to `slots` sequences at once, each with
//! its own [`KvCache`] and position, kept outside the model.
//!
//! Each round the worker admits waiting requests into free slots, runs the
//! prefills of new sequences, oldest first, up to a budget of prompt
//! tokens per round (at least one; every waiting one when no sequence is
//! decoding, since then no running stream waits on them), each new
//! sequence's cache moved into the model for its prefill with
//! [`LlamaModel::swap_cache`] and back out after; then one batched decode
//! step ([`LlamaModel::decode_batch`]) for every active sequence together:
//! one graph execution over `N` rows (in groups of at most
//! [`MAX_DECODE_BATCH`]), so each weight is streamed once per step for all
//! of them rather than once per sequence. A burst of new requests so gets
//! its first tokens after a few rounds rather than one round each, while
//! the running streams still step between the prefills. A new request joins
//! the batch in the round of its prefill and leaves at EOS, a stop string,
//! `max_tokens`, its deadline, or when its client goes away (the slot is
//! free at once).
//!
//! Each sequence's logits are bit for bit those of its own single-sequence
//! decode wherever the quantized matmuls run on panels (AVX2, AVX-512
//! VNNI; see `decode_batch`), so greedy answers do not depend on what else
//! is running. The batched graphs of 1 to `slots` sequences (at most
//! [`MAX_DECODE_BATCH`]) are compiled when the worker starts, before the
//! first request (tens to a few hundred ms each, once).

pub use crate::batcher::QueueFull;
use crate::metrics::Metrics;
use crate::stop::{Step, StopText};
use rlx::models::gguf_tokenizer::{GgufTokenizer, StreamDecoder};
use rlx::models::llama::{KvCache, LlamaError, LlamaModel, MAX_DECODE_BATCH};
use rlx::models::sampling::{Sampler, SamplerConfig};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Log-probabilities of one generated token.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// What the worker tells a request.
#[derive(Debug)]
pub enum GenEvent {
    /// A token was generated; `text` is the text it releases (maybe empty:
    /// held back inside a character or as a possible stop string).
    Token {
        /// The token id.
        id: u32,
        /// Text to send now.
        text: String,
        /// Its log-probabilities, when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The end: `text` is the last text to send.
    Done {
        /// `stop` (EOS or a stop string) or `length`.
        finish_reason: &'static str,
        /// Remaining text.
        text: String,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (EOS included when picked).
        completion_tokens: usize,
    },
    /// The request failed (`timeout` or a model error).
    Error {
        /// Whether it ran past its deadline.
        timeout: bool,
        /// What went wrong.
        message: String,
    },
}

/// One generation request.
pub struct GenRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// `Some(k)`: report log-probabilities with the top `k` alternatives.
    pub logprobs: Option<usize>,
    /// When to give up.
    pub deadline: Instant,
    /// Where events go; a closed channel (the client left) frees the slot.
    pub events: UnboundedSender<GenEvent>,
}

/// The handlers' side of the worker.
#[derive(Clone)]
pub struct GenHandle {
    tx: SyncSender<GenRequest>,
    metrics: Arc<Metrics>,
}

impl GenHandle {
    /// Queue a request; `Err` when the queue is full (or the worker stopped).
    pub fn submit(&self, r: GenRequest) -> Result<(), QueueFull> {
        match self.tx.try_send(r) {
            Ok(()) => {
                self.metrics.gen_queued(1);
                Ok(())
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(QueueFull),
        }
    }
}

/// Start the worker with `slots` sequences, a queue of `queue` waiting
/// requests and a budget of `prefill_tokens` prompt tokens prefilled per
/// round while other sequences decode; it ends when every handle is
/// dropped and the slots are done.
pub fn spawn(
    model: LlamaModel,
    tok: Arc<GgufTokenizer>,
    slots: usize,
    queue: usize,
    prefill_tokens: usize,
    metrics: Arc<Metrics>,
) -> (GenHandle, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
    let m = metrics.clone();
    let join = std::thread::Builder::new()
        .name("rlx-generate".into())
        .spawn(move || Worker::new(model, &tok, slots.max(1), prefill_tokens, m).run(rx))
        .expect("spawning the generation worker thread");
    (GenHandle { tx, metrics }, join)
}

/// One sequence being generated.
struct Slot<'t> {
    req: GenRequest,
    sampler: Sampler,
    history: Vec<u32>,
    decoder: StreamDecoder<'t>,
    stop: StopText,
    generated: usize,
    /// `None` until prefilled; then the token to feed next.
    next: Option<u32>,
    /// Admission order (prefills run oldest first).
    order: u64,
}

struct Worker<'t> {
    model: LlamaModel,
    tok: &'t GgufTokenizer,
    slots: Vec<Option<Slot<'t>>>,
    /// Each slot's cache (kept for the slot's next request once made).
    caches: Vec<Option<KvCache>>,
    /// Prompt tokens prefilled per round while other sequences decode.
    prefill_tokens: usize,
    /// Requests admitted so far.
    admitted: u64,
    m: Arc<Metrics>,
}

/// Log-softmax of `logits` at `id` and the `k` best.
fn logprobs(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b as usize].total_cmp(&logits[a as usize])
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        top = idx
            .into_iter()
            .map(|i| (i, logits[i as usize] - lse))
            .collect();
    }
    TokenLogprob {
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&x| x - lse),
        top,
    }
}

impl<'t> Worker<'t> {
    fn new(
        model: LlamaModel,
        tok: &'t GgufTokenizer,
        n: usize,
        prefill_tokens: usize,
        m: Arc<Metrics>,
    ) -> Self {
        Worker {
            model,
            tok,
            slots: (0..n).map(|_| None).collect(),
            caches: (0..n).map(|_| None).collect(),
            prefill_tokens,
            admitted: 0,
            m,
        }
    }

    fn run(mut self, rx: Receiver<GenRequest>) {
        // Compile the batched decode graphs of every batch size the slots
        // can make before the first request (not in the middle of serving).
        // A failure here shows again, as a request error, at the first
        // `decode_batch` of that size.
        let _ = self
            .model
            .prepare_decode_batch(self.slots.len().min(MAX_DECODE_BATCH));
        let mut open = true;
        loop {
            // Admit waiting requests into free slots (block when idle).
            while let Some(free) = self.slots.iter().position(Option::is_none) {
                let idle = self.slots.iter().all(Option::is_none);
                let r = if idle && open {
                    rx.recv().map_err(|_| TryRecvError::Disconnected)
                } else if open {
                    rx.try_recv()
                } else {
                    Err(TryRecvError::Disconnected)
                };
                match r {
                    Ok(req) => {
                        self.m.gen_queued(-1);
                        self.admit(free, req);
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            if !open && self.slots.iter().all(Option::is_none) {
                return;
            }
            self.m
                .set_active(self.slots.iter().filter(|s| s.is_some()).count());
            let t = Instant::now();
            // The round's prefills, then one batched decode step for every
            // prefilled sequence (the new ones included).
            self.prefill_round();
            self.decode_round();
            self.m.busy(t.elapsed().as_micros() as u64);
            // Before the next admission, which may block while idle.
            self.m
                .set_active(self.slots.iter().filter(|s| s.is_some()).count());
        }
    }

    fn admit(&mut self, i: usize, req: GenRequest) {
        let sampler = match Sampler::new(req.sampler) {
            Ok(s) => s,
            Err(e) => {
                let _ = req.events.send(GenEvent::Error {
                    timeout: false,
                    message: e.to_string(),
                });
                return;
            }
        };
        self.m.tokens_in(req.prompt.len());
        self.slots[i] = Some(Slot {
            sampler,
            history: req.prompt.clone(),
            decoder: self.tok.stream_decoder(),
            stop: StopText::new(req.stop.clone()),
            generated: 0,
            next: None,
            order: self.admitted,
            req,
        });
        self.admitted += 1;
    }

    /// Prefill the sequences waiting for it, oldest first: while other
    /// sequences decode, as many as fit `prefill_tokens` prompt tokens (at
    /// least one), else all of them.
    fn prefill_round(&mut self) {
        let decoding = self
            .slots
            .iter()
            .any(|s| matches!(s, Some(s) if s.next.is_some()));
        let mut waiting: Vec<(u64, usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Some(s) if s.next.is_none() => Some((s.order, i, s.req.prompt.len())),
                _ => None,
            })
            .collect();
        waiting.sort_unstable();
        let mut used = 0usize;
        let mut ran = 0usize;
        for &(_, i, len) in &waiting {
            if decoding && ran > 0 && used + len > self.prefill_tokens {
                break;
            }
            used += len;
            ran += 1;
            self.prefill(i);
        }
        if ran > 0 {
            self.m.prefill_batch(ran);
        }
    }

    /// Whether slot `i` still has a client within its deadline; frees the
    /// slot (telling the client on a timeout) when not.
    fn still_wanted(&mut self, i: usize) -> bool {
        let Some(slot) = self.slots[i].as_ref() else {
            return false;
        };
        if slot.req.events.is_closed() {
            self.m.disconnect();
            self.slots[i] = None;
            return false;
        }
        if Instant::now() > slot.req.deadline {
            self.fail(i, true, "the request ran past the server's timeout".into());
            return false;
        }
        true
    }

    /// Prefill slot `i`'s prompt into its cache, sample, and tell its client.
    fn prefill(&mut self, i: usize) {
        if !self.still_wanted(i) {
            return;
        }
        let Some(prompt) = self.slots[i].as_ref().map(|s| s.req.prompt.clone()) else {
            return;
        };
        let cache = self.caches[i]
            .take()
            .unwrap_or_else(|| self.model.new_cache());
        let run = |model: &mut LlamaModel| -> Result<(Vec<f32>, KvCache), LlamaError> {
            let parked = model.swap_cache(cache)?;
            let logits = model.prefill(&prompt);
            // Park the model's own cache again, whatever the prefill did.
            let cache = model.swap_cache(parked)?;
            Ok((logits?, cache))
        };
        match run(&mut self.model) {
            Ok((logits, cache)) => {
                let pos = cache.position();
                self.caches[i] = Some(cache);
                self.emit(i, &logits, pos);
            }
            Err(e) => self.fail(i, false, e.to_string()),
        }
    }

    /// One batched decode step for every prefilled slot, then sample and
    /// tell each client.
    fn decode_round(&mut self) {
        let ready: Vec<usize> = (0..self.slots.len())
            .filter(|&i| matches!(&self.slots[i], Some(s) if s.next.is_some()))
            .collect();
        let ready: Vec<usize> = ready
            .into_iter()
            .filter(|&i| self.still_wanted(i))
            .collect();
        for group in ready.chunks(MAX_DECODE_BATCH) {
            self.decode_group(group);
        }
    }

    /// One `decode_batch` over `group` (prefilled slots with a token to feed).
    fn decode_group(&mut self, group: &[usize]) {
        let mut caches = Vec::with_capacity(group.len());
        let mut fed = Vec::with_capacity(group.len());
        for &i in group {
            let next = self.slots[i].as_ref().and_then(|s| s.next);
            match (self.caches[i].take(), next) {
                (Some(c), Some(id)) => {
                    caches.push(c);
                    fed.push((i, id));
                }
                (c, _) => {
                    self.caches[i] = c;
                    self.fail(
                        i,
                        false,
                        "internal: a decoding slot lost its KV cache".into(),
                    );
                }
            }
        }
        if fed.is_empty() {
            return;
        }
        let out = {
            let mut steps: Vec<(&mut KvCache, u32)> = caches
                .iter_mut()
                .zip(&fed)
                .map(|(c, &(_, id))| (c, id))
                .collect();
            self.model.decode_batch(&mut steps)
        };
        let positions: Vec<usize> = caches.iter().map(KvCache::position).collect();
        for (c, &(i, _)) in caches.into_iter().zip(&fed) {
            self.caches[i] = Some(c);
        }
        match out {
            Ok(rows) => {
                self.m.decode_batch(fed.len());
                for ((&(i, _), logits), pos) in fed.iter().zip(&rows).zip(positions) {
                    self.emit(i, logits, pos);
                }
            }
            // One bad sequence: it fails, the others step next round.
            Err(LlamaError::BatchSequence { index, source }) => {
                if let Some(&(i, _)) = fed.get(index) {
                    self.fail(i, false, source.to_string());
                }
            }
            Err(e) => {
                for &(i, _) in &fed {
                    self.fail(i, false, e.to_string());
                }
            }
        }
    }

    /// Sample slot `i`'s next token from `logits` (its cache now holds
    /// `pos` tokens), tell its client, and finish the slot when done.
    fn emit(&mut self, i: usize, logits: &[f32], pos: usize) {
        let ctx = self.model.ctx_len();
        let tok = self.tok;
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let id = match slot.sampler.sample(logits, &slot.history) {
            Ok(id) => id,
            Err(e) => {
                self.fail(i, false, e.to_string());
                return;
            }
        };
        slot.generated += 1;
        self.m.token_out();
        let lp = slot.req.logprobs.map(|k| logprobs(logits, id, k));
        let mut finish = None;
        let mut text = String::new();
        if tok.is_end_of_generation(id) {
            finish = Some("stop");
        } else {
            slot.history.push(id);
            let piece = match slot.decoder.push(id) {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => {
                    self.fail(i, false, e.to_string());
                    return;
                }
            };
            match slot.stop.push(&piece) {
                Step::Send(t) => text = t,
                Step::Stop(t) => {
                    text = t;
                    finish = Some("stop");
                }
            }
            if finish.is_none() && (slot.generated >= slot.req.max_tokens || pos >= ctx) {
                finish = Some("length");
            }
        }
        let _ = slot.req.events.send(GenEvent::Token {
            id,
            text: if finish.is_some() {
                String::new()
            } else {
                text.clone()
            },
            logprob: lp,
        });
        match finish {
            Some(reason) => {
                let mut rest = text;
                if reason == "length" || tok.is_end_of_generation(id) {
                    if let Some(t) = slot.decoder.finish() {
                        let (Step::Send(s) | Step::Stop(s)) = slot.stop.push(&t);
                        rest.push_str(&s);
                    }
                    rest.push_str(&slot.stop.finish());
                }
                let _ = slot.req.events.send(GenEvent::Done {
                    finish_reason: reason,
                    text: rest,
                    prompt_tokens: slot.req.prompt.len(),
                    completion_tokens: slot.generated,
                });
                self.slots[i] = None;
            }
            None => slot.next = Some(id),
        }
    }

    fn fail(&mut self, i: usize, timeout: bool, message: String) {
        if let Some(s) = self.slots[i].take() {
            let _ = s.req.events.send(GenEvent::Error { timeout, message });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx::cpu::CpuOptions;
    use std::path::PathBuf;
    use std::time::Duration;
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    fn smollm2() -> Option<PathBuf> {
        let dir = std::env::var_os("RLX_MODELS_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models"))
            })?;
        let p = dir.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
        if p.exists() {
            Some(p)
        } else {
            println!("skipped: SmolLM2 not fetched (run scripts/fetch_models.py smollm2)");
            None
        }
    }

    /// `rlx generate`'s greedy loop alone: prefill, then decode, every id
    /// the worker would send (the end-of-generation id included).
    fn solo_ids(m: &mut LlamaModel, tok: &GgufTokenizer, prompt: &[u32], max: usize) -> Vec<u32> {
        let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
        let mut history = prompt.to_vec();
        let mut logits = m.prefill(prompt).unwrap();
        let mut out = Vec::new();
        loop {
            let id = sampler.sample(&logits, &history).unwrap();
            out.push(id);
            if tok.is_end_of_generation(id) || out.len() == max {
                return out;
            }
            history.push(id);
            logits = m.decode(id).unwrap();
        }
    }

    fn request(prompt: Vec<u32>, max: usize) -> (GenRequest, UnboundedReceiver<GenEvent>) {
        let (tx, rx) = unbounded_channel();
        let r = GenRequest {
            prompt,
            max_tokens: max,
            sampler: SamplerConfig::greedy(),
            stop: Vec::new(),
            logprobs: None,
            deadline: Instant::now() + Duration::from_secs(300),
            events: tx,
        };
        (r, rx)
    }

    /// Every id a request got, until its `Done`.
    fn ids(mut rx: UnboundedReceiver<GenEvent>) -> Vec<u32> {
        let mut out = Vec::new();
        loop {
            match rx.blocking_recv() {
                Some(GenEvent::Token { id, .. }) => out.push(id),
                Some(GenEvent::Done { .. }) => return out,
                Some(GenEvent::Error { message, .. }) => panic!("request failed: {message}"),
                None => panic!("the worker dropped a request"),
            }
        }
    }

    /// Without the `cuda` feature, a CUDA language model is refused with a
    /// message that says why.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_needs_the_feature() {
        let err = crate::llama_device(crate::LlmDevice::Cuda(0), None).unwrap_err();
        assert!(err.contains("not part of this build"), "{err}");
    }

    /// The value of the Prometheus line starting with `name`.
    fn metric(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// A burst of requests queued before the worker's first round is
    /// prefilled in that round (nothing decodes yet), and requests arriving
    /// while others decode are prefilled several per round within the
    /// prompt-token budget; every request's greedy ids equal its own
    /// single-request run (`rlx generate`'s loop), whatever it was
    /// prefilled and decoded with.
    #[test]
    fn several_prefills_per_round_give_each_request_its_solo_greedy_ids() {
        let Some(path) = smollm2() else {
            return;
        };
        let f = rlx::formats::GgufFile::open(&path).unwrap();
        let tok = Arc::new(GgufTokenizer::from_gguf(&f).unwrap());
        drop(f);
        let opts = CpuOptions {
            hybrid: true,
            ..Default::default()
        };
        let mut model = LlamaModel::load_with(&path, 256, opts).unwrap();
        let texts = [
            "The capital of France is",
            "Write a haiku about the sea.",
            "List three prime numbers:",
            "Once upon a time, in a small village by the mountains, there lived",
            "def fibonacci(n):",
            "The three primary colours are",
            "Q: What is two plus two?\nA:",
            "A short poem about autumn leaves falling on a quiet street:",
        ];
        let max = 10;
        let prompts: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| tok.encode(t, tok.add_bos_default()).unwrap())
            .collect();
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| solo_ids(&mut model, &tok, p, max))
            .collect();
        let metrics = Arc::new(Metrics::new());
        // Budget: the two longest prompts fit one round, three never do.
        let mut lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        lens.sort_unstable();
        let budget = lens[lens.len() - 1] + lens[lens.len() - 2];
        let (h, join) = spawn(model, tok.clone(), 8, 16, budget, metrics.clone());
        // Five queued while the worker compiles its batched graphs: its
        // first round admits and prefills them together.
        let mut rxs = Vec::new();
        for p in &prompts[..5] {
            let (r, rx) = request(p.clone(), max);
            h.submit(r).unwrap_or_else(|_| panic!("queue full"));
            rxs.push(rx);
        }
        // Three more once the first has its first token (others decode).
        let mut first = rxs.remove(0);
        let mut got0 = Vec::new();
        match first.blocking_recv() {
            Some(GenEvent::Token { id, .. }) => got0.push(id),
            e => panic!("expected a token, got {e:?}"),
        }
        for p in &prompts[5..] {
            let (r, rx) = request(p.clone(), max);
            h.submit(r).unwrap_or_else(|_| panic!("queue full"));
            rxs.push(rx);
        }
        got0.extend(ids(first));
        let mut got = vec![got0];
        got.extend(rxs.into_iter().map(ids));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "request {i} ({:?})", texts[i]);
        }
        drop(h);
        join.join().unwrap();
        let m = metrics.render();
        let rounds = metric(&m, "rlx_prefill_batch_size_count ");
        let sum = metric(&m, "rlx_prefill_batch_size_sum ");
        let upto4 = metric(&m, "rlx_prefill_batch_size_bucket{le=\"4\"} ");
        assert_eq!(sum, 8.0, "every prompt prefilled once\n{m}");
        // The burst: one round of five. The three late ones: the budget
        // takes at most two per round while others decode.
        assert!(upto4 < rounds, "no round prefilled the burst together\n{m}");
        assert!(rounds >= 3.0, "the late prompts ignored the budget\n{m}");
    }
}
