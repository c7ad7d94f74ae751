//! Dynamic batching for embeddings: one worker thread owns the
//! [`SentenceEmbedder`]; requests from any number of clients wait in a
//! bounded queue, and the worker takes every request that arrives within a
//! short wait (or until the token budget is reached), sorts their inputs
//! into sequence-length buckets (the embedder's padding bucket, so an
//! input is padded to the same length whatever it is batched with), runs
//! each bucket in chunks of at most `max_batch_tokens` padded tokens, and
//! hands each caller its vectors in its own order.

use crate::metrics::Metrics;
use rlx::models::SentenceEmbedder;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A request refused because its queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// The vectors of one request, or why it failed.
pub type EmbedResult = Result<Vec<Vec<f32>>, String>;

/// One request: rows of token ids (special tokens included).
pub struct EmbedJob {
    /// The inputs, tokenized.
    pub rows: Vec<Vec<i64>>,
    /// Where the vectors go.
    pub reply: oneshot::Sender<EmbedResult>,
}

/// The handlers' side of the batcher.
#[derive(Clone)]
pub struct EmbedHandle {
    tx: SyncSender<EmbedJob>,
    metrics: Arc<Metrics>,
}

impl EmbedHandle {
    /// Queue a job; `Err` when the queue is full (or the worker stopped).
    pub fn submit(&self, job: EmbedJob) -> Result<(), QueueFull> {
        match self.tx.try_send(job) {
            Ok(()) => {
                self.metrics.embed_queued(1);
                Ok(())
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(QueueFull),
        }
    }
}

/// Batching settings.
#[derive(Clone, Copy, Debug)]
pub struct BatchConfig {
    /// Most padded tokens (`rows x padded length`) in one model run.
    pub max_batch_tokens: usize,
    /// How long the first request of a batch waits for others.
    pub wait: Duration,
    /// Requests that may wait in the queue.
    pub queue: usize,
    /// The embedder's sequence-length padding bucket.
    pub seq_bucket: usize,
}

/// Start the worker thread; it ends when every handle is dropped.
pub fn spawn(
    embedder: SentenceEmbedder,
    cfg: BatchConfig,
    metrics: Arc<Metrics>,
) -> (EmbedHandle, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::sync_channel(cfg.queue.max(1));
    let m = metrics.clone();
    let join = std::thread::Builder::new()
        .name("rlx-embed".into())
        .spawn(move || run(embedder, rx, cfg, m))
        .expect("spawning the embedding worker thread");
    (EmbedHandle { tx, metrics }, join)
}

fn run(mut e: SentenceEmbedder, rx: Receiver<EmbedJob>, cfg: BatchConfig, m: Arc<Metrics>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let mut tokens: usize = jobs[0].rows.iter().map(Vec::len).sum();
        let deadline = Instant::now() + cfg.wait;
        while tokens < cfg.max_batch_tokens {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(j) => {
                    tokens += j.rows.iter().map(Vec::len).sum::<usize>();
                    jobs.push(j);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        m.embed_queued(-(jobs.len() as i64));
        run_jobs(&mut e, jobs, &cfg, &m);
    }
}

/// Embed every row of `jobs`, bucketed by padded length, and answer each job.
fn run_jobs(e: &mut SentenceEmbedder, jobs: Vec<EmbedJob>, cfg: &BatchConfig, m: &Metrics) {
    let bucket = cfg.seq_bucket.max(1);
    // (padded length, job, row) for every live row, sorted by length.
    let mut items: Vec<(usize, usize, usize)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        if job.reply.is_closed() {
            continue; // the client went away
        }
        for (r, row) in job.rows.iter().enumerate() {
            items.push((row.len().div_ceil(bucket) * bucket, j, r));
        }
    }
    items.sort();
    let mut out: Vec<Vec<Option<Vec<f32>>>> =
        jobs.iter().map(|j| vec![None; j.rows.len()]).collect();
    let mut failed: Vec<Option<String>> = vec![None; jobs.len()];
    let mut i = 0;
    while i < items.len() {
        let len = items[i].0;
        let per_chunk = (cfg.max_batch_tokens / len.max(1)).max(1);
        let mut end = i;
        while end < items.len() && items[end].0 == len && end - i < per_chunk {
            end += 1;
        }
        let chunk = &items[i..end];
        let rows: Vec<Vec<i64>> = chunk
            .iter()
            .map(|&(_, j, r)| jobs[j].rows[r].clone())
            .collect();
        m.batch(rows.len());
        match e.embed_ids(&rows) {
            Ok(vecs) => {
                for (&(_, j, r), v) in chunk.iter().zip(vecs) {
                    out[j][r] = Some(v);
                }
            }
            Err(err) => {
                for &(_, j, _) in chunk {
                    failed[j] = Some(err.to_string());
                }
            }
        }
        i = end;
    }
    for ((job, vecs), fail) in jobs.into_iter().zip(out).zip(failed) {
        let res = match fail {
            Some(msg) => Err(msg),
            None => vecs
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| "an input was not embedded".to_string()),
        };
        let _ = job.reply.send(res);
    }
}
