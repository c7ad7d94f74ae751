//! Prometheus metrics, kept with the `metrics` crate and rendered as
//! Prometheus text by `metrics-exporter-prometheus`: request counts by
//! endpoint and status, latency histograms, queue depth, batch sizes,
//! tokens in and out, generation time and tok/s.
//!
//! Each server has its own recorder (not the process-global one), so
//! several servers in one process keep separate figures. The handles of
//! the unlabelled metrics are registered once; the per-endpoint ones are
//! looked up in this recorder at each request
//! ([`metrics::with_local_recorder`]).

use metrics::{Counter, Gauge, Histogram, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// Latency buckets in seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Batch-size buckets (inputs per embedding batch, sequences per decode
/// step, prompts prefilled per generation round).
const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

const REQUESTS: &str = "rlx_requests_total";
const LATENCY: &str = "rlx_request_duration_seconds";
const EMBED_BATCH: &str = "rlx_embed_batch_size";
const DECODE_BATCH: &str = "rlx_decode_batch_size";
const PREFILL_BATCH: &str = "rlx_prefill_batch_size";
const QUEUE: &str = "rlx_queue_depth";
const ACTIVE: &str = "rlx_generation_active_slots";
const TOKENS_IN: &str = "rlx_tokens_in_total";
const TOKENS_OUT: &str = "rlx_tokens_out_total";
const BUSY: &str = "rlx_generation_busy_seconds_total";
const TOK_S: &str = "rlx_generation_tokens_per_second";
const REJECTED: &str = "rlx_rejected_total";
const DISCONNECTS: &str = "rlx_disconnects_total";
const EMBED_SHAPES: &str = "rlx_embed_shapes_compiled_total";

/// Every metric the server keeps, in its own recorder.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    h: Handles,
    /// Generated tokens and generation-busy microseconds, for tok/s.
    out_n: AtomicU64,
    busy_us: AtomicU64,
}

/// The unlabelled metrics (and the queue gauges), registered once.
struct Handles {
    embed_batch: Histogram,
    decode_batch: Histogram,
    prefill_batch: Histogram,
    embed_queue: Gauge,
    gen_queue: Gauge,
    gen_active: Gauge,
    tokens_in: Counter,
    tokens_out: Counter,
    busy: Gauge,
    tok_s: Gauge,
    rejected: Counter,
    disconnects: Counter,
    embed_shapes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh recorder with every metric described and at zero.
    pub fn new() -> Metrics {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(LATENCY.into()), &LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(EMBED_BATCH.into()), &BATCH_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(DECODE_BATCH.into()), &BATCH_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(PREFILL_BATCH.into()), &BATCH_BUCKETS)
            });
        // The bucket lists are non-empty constants: this cannot fail, but
        // falls back to summaries rather than panic.
        let recorder = builder
            .unwrap_or_else(|_| PrometheusBuilder::new())
            .build_recorder();
        let handle = recorder.handle();
        let h = metrics::with_local_recorder(&recorder, || {
            use metrics::{describe_counter, describe_gauge, describe_histogram};
            describe_counter!(REQUESTS, "HTTP requests by endpoint and status.");
            describe_histogram!(
                LATENCY,
                Unit::Seconds,
                "Request latency (to the response head; for a stream, its first byte)."
            );
            describe_histogram!(EMBED_BATCH, "Inputs per embedding batch.");
            describe_histogram!(
                DECODE_BATCH,
                "Sequences per batched decode step of generation."
            );
            describe_histogram!(
                PREFILL_BATCH,
                "Prompts prefilled in one round of generation (before its decode step)."
            );
            describe_gauge!(QUEUE, "Requests waiting.");
            describe_gauge!(ACTIVE, "Sequences being generated.");
            describe_counter!(TOKENS_IN, "Prompt and input tokens.");
            describe_counter!(TOKENS_OUT, "Generated tokens.");
            describe_gauge!(
                BUSY,
                Unit::Seconds,
                "Time the generation worker spent in prefill and decode (only grows; tok/s = rate(rlx_tokens_out_total) / rate(this))."
            );
            describe_gauge!(
                TOK_S,
                "Generated tokens per second of generation work since the start (rlx_tokens_out_total / rlx_generation_busy_seconds_total)."
            );
            describe_counter!(REJECTED, "Requests refused with 429 (queue full).");
            describe_counter!(
                DISCONNECTS,
                "Generations stopped because the client went away."
            );
            describe_gauge!(
                EMBED_SHAPES,
                "Batch shapes (rows x padded length) the embedding model compiled since the start (a new shape costs a compile of a few ms)."
            );
            Handles {
                embed_shapes: metrics::gauge!(EMBED_SHAPES),
                embed_batch: metrics::histogram!(EMBED_BATCH),
                decode_batch: metrics::histogram!(DECODE_BATCH),
                prefill_batch: metrics::histogram!(PREFILL_BATCH),
                embed_queue: metrics::gauge!(QUEUE, "queue" => "embeddings"),
                gen_queue: metrics::gauge!(QUEUE, "queue" => "generation"),
                gen_active: metrics::gauge!(ACTIVE),
                tokens_in: metrics::counter!(TOKENS_IN),
                tokens_out: metrics::counter!(TOKENS_OUT),
                busy: metrics::gauge!(BUSY),
                tok_s: metrics::gauge!(TOK_S),
                rejected: metrics::counter!(REJECTED),
                disconnects: metrics::counter!(DISCONNECTS),
            }
        });
        Metrics {
            recorder,
            handle,
            h,
            out_n: AtomicU64::new(0),
            busy_us: AtomicU64::new(0),
        }
    }

    /// Count one finished request.
    pub fn request(&self, endpoint: &'static str, status: u16, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || {
            metrics::counter!(REQUESTS, "endpoint" => endpoint, "status" => status.to_string())
                .increment(1);
            metrics::histogram!(LATENCY, "endpoint" => endpoint).record(seconds);
        });
    }

    /// Record one embedding batch of `n` inputs.
    pub fn batch(&self, n: usize) {
        self.h.embed_batch.record(n as f64);
    }

    /// The embedding model has compiled `n` batch shapes so far.
    pub fn embed_shapes(&self, n: usize) {
        self.h.embed_shapes.set(n as f64);
    }

    /// Record one batched decode step over `n` sequences.
    pub fn decode_batch(&self, n: usize) {
        self.h.decode_batch.record(n as f64);
    }

    /// Record one generation round that prefilled `n` prompts.
    pub fn prefill_batch(&self, n: usize) {
        self.h.prefill_batch.record(n as f64);
    }

    /// `n` more (or, negative, fewer) embedding requests waiting.
    pub fn embed_queued(&self, n: i64) {
        self.h.embed_queue.increment(n as f64);
    }

    /// `n` more (or, negative, fewer) generation requests waiting.
    pub fn gen_queued(&self, n: i64) {
        self.h.gen_queue.increment(n as f64);
    }

    /// Generation slots in use now.
    pub fn set_active(&self, n: usize) {
        self.h.gen_active.set(n as f64);
    }

    /// `n` prompt / input tokens taken in.
    pub fn tokens_in(&self, n: usize) {
        self.h.tokens_in.increment(n as u64);
    }

    /// One token generated.
    pub fn token_out(&self) {
        self.h.tokens_out.increment(1);
        self.out_n.fetch_add(1, Ordering::Relaxed);
    }

    /// The generation worker spent `us` microseconds in prefill and decode.
    pub fn busy(&self, us: u64) {
        self.h.busy.increment(us as f64 / 1e6);
        let total = self.busy_us.fetch_add(us, Ordering::Relaxed) + us;
        if total > 0 {
            let n = self.out_n.load(Ordering::Relaxed);
            self.h.tok_s.set(n as f64 / (total as f64 / 1e6));
        }
    }

    /// One request refused with 429.
    pub fn rejected(&self) {
        self.h.rejected.increment(1);
    }

    /// One generation stopped because its client went away.
    pub fn disconnect(&self) {
        self.h.disconnects.increment(1);
    }

    /// Drain the histograms' recent samples into their buckets (bounds the
    /// memory they hold between scrapes; the server calls it every few
    /// seconds).
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;

    /// The value of the line starting with `name` (labels included).
    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn two_recorders_keep_separate_figures_in_prometheus_text() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.request("/health", 200, 0.003);
        a.request("/health", 200, 0.2);
        a.request("/v1/embeddings", 400, 0.02);
        b.request("/health", 503, 1.0);
        a.batch(3);
        a.decode_batch(1);
        a.decode_batch(4);
        a.embed_queued(2);
        a.embed_queued(-1);
        a.gen_queued(1);
        a.set_active(3);
        a.tokens_in(7);
        a.token_out();
        a.token_out();
        a.busy(500_000);
        a.rejected();
        a.disconnect();
        let t = a.render();
        let u = b.render();
        assert_eq!(
            value(
                &t,
                "rlx_requests_total{endpoint=\"/health\",status=\"200\"} "
            ),
            2.0
        );
        assert_eq!(
            value(
                &t,
                "rlx_requests_total{endpoint=\"/v1/embeddings\",status=\"400\"} "
            ),
            1.0
        );
        assert!(!t.contains("status=\"503\""), "{t}");
        assert_eq!(
            value(
                &u,
                "rlx_requests_total{endpoint=\"/health\",status=\"503\"} "
            ),
            1.0
        );
        assert!(!u.contains("status=\"200\""), "{u}");
        // Latency histogram: 0.003 <= 0.005; 0.2 <= 0.25.
        let h = "rlx_request_duration_seconds_bucket{endpoint=\"/health\",le=";
        assert_eq!(value(&t, &format!("{h}\"0.005\"}} ")), 1.0);
        assert_eq!(value(&t, &format!("{h}\"0.1\"}} ")), 1.0);
        assert_eq!(value(&t, &format!("{h}\"0.25\"}} ")), 2.0);
        assert_eq!(value(&t, &format!("{h}\"+Inf\"}} ")), 2.0);
        assert_eq!(
            value(
                &t,
                "rlx_request_duration_seconds_count{endpoint=\"/health\"} "
            ),
            2.0
        );
        assert!(
            (value(
                &t,
                "rlx_request_duration_seconds_sum{endpoint=\"/health\"} "
            ) - 0.203)
                .abs()
                < 1e-12
        );
        assert_eq!(value(&t, "rlx_embed_batch_size_bucket{le=\"2\"} "), 0.0);
        assert_eq!(value(&t, "rlx_embed_batch_size_bucket{le=\"4\"} "), 1.0);
        assert_eq!(value(&t, "rlx_decode_batch_size_bucket{le=\"1\"} "), 1.0);
        assert_eq!(value(&t, "rlx_decode_batch_size_count "), 2.0);
        assert_eq!(value(&t, "rlx_decode_batch_size_sum "), 5.0);
        assert_eq!(value(&t, "rlx_queue_depth{queue=\"embeddings\"} "), 1.0);
        assert_eq!(value(&t, "rlx_queue_depth{queue=\"generation\"} "), 1.0);
        assert_eq!(value(&t, "rlx_generation_active_slots "), 3.0);
        assert_eq!(value(&t, "rlx_tokens_in_total "), 7.0);
        assert_eq!(value(&t, "rlx_tokens_out_total "), 2.0);
        assert_eq!(value(&t, "rlx_generation_busy_seconds_total "), 0.5);
        assert_eq!(value(&t, "rlx_generation_tokens_per_second "), 4.0);
        assert_eq!(value(&t, "rlx_rejected_total "), 1.0);
        assert_eq!(value(&t, "rlx_disconnects_total "), 1.0);
        assert!(t.contains("# TYPE rlx_requests_total counter"), "{t}");
        assert!(
            t.contains("# TYPE rlx_request_duration_seconds histogram"),
            "{t}"
        );
        assert!(
            t.contains("# HELP rlx_queue_depth Requests waiting."),
            "{t}"
        );
        // The other server's figures are untouched by these.
        assert_eq!(value(&u, "rlx_tokens_out_total "), 0.0);
        assert_eq!(value(&u, "rlx_queue_depth{queue=\"embeddings\"} "), 0.0);
    }
}
