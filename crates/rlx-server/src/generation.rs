//! Generation on the CPU: one worker thread owns the [`LlamaModel`] and
//! serves up to `slots` sequences at once, each with its own KV cache and
//! position ([`LlamaModel::swap_cache`] moves a sequence's cache into the
//! model for its step). Each round the worker admits waiting requests into
//! free slots, runs at most one prefill, then one decode step for every
//! active sequence, so a new request joins at the next round and leaves at
//! EOS, a stop string, `max_tokens`, its deadline, or when its client goes
//! away (the slot is free at once).
//!
//! This is a slot scheduler that interleaves per-sequence decode steps, not
//! a batched decode graph: the model runs one sequence per step, so the
//! aggregate tokens/s is about one stream's, shared fairly.

pub use crate::batcher::QueueFull;
use crate::metrics::Metrics;
use crate::stop::{Step, StopText};
use rlx::models::gguf_tokenizer::{GgufTokenizer, StreamDecoder};
use rlx::models::llama::{KvCache, LlamaModel};
use rlx::models::sampling::{Sampler, SamplerConfig};
use std::sync::atomic::Ordering;
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
                self.metrics.gen_queue.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(QueueFull),
        }
    }
}

/// Start the worker with `slots` sequences and a queue of `queue` waiting
/// requests; it ends when every handle is dropped and the slots are done.
pub fn spawn(
    model: LlamaModel,
    tok: Arc<GgufTokenizer>,
    slots: usize,
    queue: usize,
    metrics: Arc<Metrics>,
) -> (GenHandle, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
    let m = metrics.clone();
    let join = std::thread::Builder::new()
        .name("rlx-generate".into())
        .spawn(move || Worker::new(model, &tok, slots.max(1), m).run(rx))
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
}

struct Worker<'t> {
    model: LlamaModel,
    tok: &'t GgufTokenizer,
    slots: Vec<Option<Slot<'t>>>,
    /// Each slot's cache while it is not in the model.
    caches: Vec<Option<KvCache>>,
    /// The slot whose cache is in the model.
    resident: Option<usize>,
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
    fn new(model: LlamaModel, tok: &'t GgufTokenizer, n: usize, m: Arc<Metrics>) -> Self {
        Worker {
            model,
            tok,
            slots: (0..n).map(|_| None).collect(),
            caches: (0..n).map(|_| None).collect(),
            resident: None,
            m,
        }
    }

    fn run(mut self, rx: Receiver<GenRequest>) {
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
                        self.m.gen_queue.fetch_sub(1, Ordering::Relaxed);
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
            self.m.gen_active.store(
                self.slots.iter().filter(|s| s.is_some()).count() as i64,
                Ordering::Relaxed,
            );
            let t = Instant::now();
            // One prefill per round, then one decode step per sequence.
            if let Some(i) = self
                .slots
                .iter()
                .position(|s| matches!(s, Some(s) if s.next.is_none()))
            {
                self.step(i);
            }
            for i in 0..self.slots.len() {
                if matches!(&self.slots[i], Some(s) if s.next.is_some()) {
                    self.step(i);
                }
            }
            self.m
                .gen_busy_us
                .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            // Before the next admission, which may block while idle.
            self.m.gen_active.store(
                self.slots.iter().filter(|s| s.is_some()).count() as i64,
                Ordering::Relaxed,
            );
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
        self.m
            .tokens_in
            .fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
        self.slots[i] = Some(Slot {
            sampler,
            history: req.prompt.clone(),
            decoder: self.tok.stream_decoder(),
            stop: StopText::new(req.stop.clone()),
            generated: 0,
            next: None,
            req,
        });
    }

    /// Move slot `i`'s cache into the model.
    fn activate(&mut self, i: usize) -> Result<(), String> {
        if self.resident == Some(i) {
            return Ok(());
        }
        let c = self.caches[i]
            .take()
            .unwrap_or_else(|| self.model.new_cache());
        let old = self.model.swap_cache(c).map_err(|e| e.to_string())?;
        if let Some(j) = self.resident {
            self.caches[j] = Some(old);
        }
        self.resident = Some(i);
        Ok(())
    }

    /// Prefill or decode slot `i` once, sample, and tell its client.
    fn step(&mut self, i: usize) {
        let Some(slot) = self.slots[i].as_ref() else {
            return;
        };
        if slot.req.events.is_closed() {
            self.m.disconnects.fetch_add(1, Ordering::Relaxed);
            self.slots[i] = None;
            return;
        }
        if Instant::now() > slot.req.deadline {
            self.fail(i, true, "the request ran past the server's timeout".into());
            return;
        }
        let next = slot.next;
        let prompt = (next.is_none()).then(|| slot.req.prompt.clone());
        if let Err(e) = self.activate(i) {
            self.fail(i, false, e);
            return;
        }
        let logits = match (prompt, next) {
            (Some(p), _) => self.model.prefill(&p),
            (None, Some(id)) => self.model.decode(id),
            (None, None) => return,
        };
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                self.fail(i, false, e.to_string());
                return;
            }
        };
        let ctx = self.model.ctx_len();
        let pos = self.model.position();
        let tok = self.tok;
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let id = match slot.sampler.sample(&logits, &slot.history) {
            Ok(id) => id,
            Err(e) => {
                self.fail(i, false, e.to_string());
                return;
            }
        };
        slot.generated += 1;
        self.m.tokens_out.fetch_add(1, Ordering::Relaxed);
        let lp = slot.req.logprobs.map(|k| logprobs(&logits, id, k));
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
