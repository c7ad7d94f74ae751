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
    /// How long the first request of a batch waits for others (only while
    /// requests overlap: the previous batch held more than one).
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
    // Whether requests overlap: the last batch held more than one. A lone
    // client's request runs at once instead of waiting out `cfg.wait` for
    // company that does not come (its next request waits for this answer);
    // jobs already queued join either way.
    let mut concurrent = false;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let mut tokens: usize = jobs[0].rows.iter().map(Vec::len).sum();
        let wait = if concurrent { cfg.wait } else { Duration::ZERO };
        let deadline = Instant::now() + wait;
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
        concurrent = jobs.len() > 1;
        run_jobs(&mut e, jobs, &cfg, &m);
        m.embed_shapes(e.cache_stats().compiled);
    }
}

/// Embed every row of `jobs`, grouped by padded length
/// ([`rlx::models::plan_runs`]: a row is padded as it would be alone, so
/// its vector is bit for bit the one it gets alone), and answer each job as
/// soon as its last row is done, not when the whole batch is.
fn run_jobs(e: &mut SentenceEmbedder, jobs: Vec<EmbedJob>, cfg: &BatchConfig, m: &Metrics) {
    // (job, row) of every live row.
    let mut items: Vec<(usize, usize)> = Vec::new();
    let mut left: Vec<usize> = vec![0; jobs.len()];
    for (j, job) in jobs.iter().enumerate() {
        if job.reply.is_closed() {
            continue; // the client went away
        }
        left[j] = job.rows.len();
        items.extend((0..job.rows.len()).map(|r| (j, r)));
    }
    let lengths: Vec<usize> = items.iter().map(|&(j, r)| jobs[j].rows[r].len()).collect();
    let runs = rlx::models::plan_runs(
        &lengths,
        cfg.seq_bucket.max(1),
        e.config().max_seq(),
        usize::MAX,
        cfg.max_batch_tokens,
    );
    let mut out: Vec<Vec<Option<Vec<f32>>>> =
        jobs.iter().map(|j| vec![None; j.rows.len()]).collect();
    let mut failed: Vec<Option<String>> = vec![None; jobs.len()];
    let mut replies: Vec<Option<oneshot::Sender<EmbedResult>>> =
        jobs.iter().map(|_| None).collect();
    let mut rows_of: Vec<Vec<Vec<i64>>> = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.into_iter().enumerate() {
        replies[j] = Some(job.reply);
        rows_of.push(job.rows);
    }
    for run in runs {
        let chunk: Vec<(usize, usize)> = run
            .iter()
            .map(|&k| items[k])
            .filter(|&(j, _)| replies[j].is_some())
            .collect();
        if chunk.is_empty() {
            continue;
        }
        let rows: Vec<Vec<i64>> = chunk
            .iter()
            .map(|&(j, r)| std::mem::take(&mut rows_of[j][r]))
            .collect();
        m.batch(rows.len());
        match e.embed_ids(&rows) {
            Ok(vecs) => {
                for (&(j, r), v) in chunk.iter().zip(vecs) {
                    out[j][r] = Some(v);
                    left[j] -= 1;
                }
            }
            Err(err) => {
                for &(j, _) in &chunk {
                    failed[j] = Some(err.to_string());
                    left[j] = 0;
                }
            }
        }
        // Answer the jobs this run finished (or failed): a job answered is
        // left out of later runs.
        for &(j, _) in &chunk {
            if left[j] == 0 {
                if let Some(reply) = replies[j].take() {
                    let res = match failed[j].take() {
                        Some(msg) => Err(msg),
                        None => std::mem::take(&mut out[j])
                            .into_iter()
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| "an input was not embedded".to_string()),
                    };
                    let _ = reply.send(res);
                }
            }
        }
    }
    // Jobs whose client went away (or with no rows) still get an answer.
    for (j, reply) in replies.into_iter().enumerate() {
        if let Some(reply) = reply {
            let res = std::mem::take(&mut out[j])
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| "an input was not embedded".to_string());
            let _ = reply.send(res);
        }
    }
}
