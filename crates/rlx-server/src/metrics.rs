//! Prometheus text-format metrics, kept by hand (no exporter crate): request
//! counts by endpoint and status, latency histograms, queue depth, batch
//! sizes, tokens in and out, generation time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Latency buckets in seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Batch-size buckets (inputs per embedding batch, sequences per decode step).
const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// A cumulative histogram.
#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (c, b) in self.counts.iter_mut().zip(bounds) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.n += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in bounds.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.n);
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.n);
    }
}

/// Every metric the server keeps.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    batch_sizes: Mutex<Histogram>,
    decode_batches: Mutex<Histogram>,
    /// Embedding requests waiting for the batcher.
    pub embed_queue: AtomicI64,
    /// Generation requests waiting for a slot.
    pub gen_queue: AtomicI64,
    /// Generation slots in use.
    pub gen_active: AtomicI64,
    /// Prompt / input tokens taken in.
    pub tokens_in: AtomicU64,
    /// Tokens generated.
    pub tokens_out: AtomicU64,
    /// Microseconds the generation worker spent in prefill and decode.
    pub gen_busy_us: AtomicU64,
    /// Requests refused with 429.
    pub rejected: AtomicU64,
    /// Generations stopped because the client went away.
    pub disconnects: AtomicU64,
}

impl Metrics {
    /// Count one finished request.
    pub fn request(&self, endpoint: &str, status: u16, seconds: f64) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((endpoint.to_string(), status)).or_default() += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            l.entry(endpoint.to_string())
                .or_default()
                .observe(&LATENCY_BUCKETS, seconds);
        }
    }

    /// Record one embedding batch of `n` inputs.
    pub fn batch(&self, n: usize) {
        if let Ok(mut b) = self.batch_sizes.lock() {
            b.observe(&BATCH_BUCKETS, n as f64);
        }
    }

    /// Record one batched decode step over `n` sequences.
    pub fn decode_batch(&self, n: usize) {
        if let Ok(mut b) = self.decode_batches.lock() {
            b.observe(&BATCH_BUCKETS, n as f64);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::new();
        o.push_str("# HELP rlx_requests_total HTTP requests by endpoint and status.\n");
        o.push_str("# TYPE rlx_requests_total counter\n");
        if let Ok(r) = self.requests.lock() {
            for ((e, s), n) in r.iter() {
                let _ = writeln!(
                    o,
                    "rlx_requests_total{{endpoint=\"{e}\",status=\"{s}\"}} {n}"
                );
            }
        }
        o.push_str("# HELP rlx_request_duration_seconds Request latency (to the last byte).\n");
        o.push_str("# TYPE rlx_request_duration_seconds histogram\n");
        if let Ok(l) = self.latency.lock() {
            for (e, h) in l.iter() {
                h.render(
                    &mut o,
                    "rlx_request_duration_seconds",
                    &format!("endpoint=\"{e}\""),
                    &LATENCY_BUCKETS,
                );
            }
        }
        o.push_str("# HELP rlx_embed_batch_size Inputs per embedding batch.\n");
        o.push_str("# TYPE rlx_embed_batch_size histogram\n");
        if let Ok(b) = self.batch_sizes.lock() {
            b.render(&mut o, "rlx_embed_batch_size", "", &BATCH_BUCKETS);
        }
        o.push_str(
            "# HELP rlx_decode_batch_size Sequences per batched decode step of generation.\n",
        );
        o.push_str("# TYPE rlx_decode_batch_size histogram\n");
        if let Ok(b) = self.decode_batches.lock() {
            b.render(&mut o, "rlx_decode_batch_size", "", &BATCH_BUCKETS);
        }
        let gauges = [
            (
                "rlx_queue_depth{queue=\"embeddings\"}",
                self.embed_queue.load(Ordering::Relaxed),
            ),
            (
                "rlx_queue_depth{queue=\"generation\"}",
                self.gen_queue.load(Ordering::Relaxed),
            ),
        ];
        o.push_str("# HELP rlx_queue_depth Requests waiting.\n# TYPE rlx_queue_depth gauge\n");
        for (n, v) in gauges {
            let _ = writeln!(o, "{n} {v}");
        }
        let _ = writeln!(
            o,
            "# HELP rlx_generation_active_slots Sequences being generated.\n\
             # TYPE rlx_generation_active_slots gauge\nrlx_generation_active_slots {}",
            self.gen_active.load(Ordering::Relaxed)
        );
        let counters = [
            ("rlx_tokens_in_total", "Prompt and input tokens.", self.tokens_in.load(Ordering::Relaxed) as f64),
            ("rlx_tokens_out_total", "Generated tokens.", self.tokens_out.load(Ordering::Relaxed) as f64),
            (
                "rlx_generation_busy_seconds_total",
                "Time the generation worker spent in prefill and decode (tok/s = rate(tokens_out) / rate(this)).",
                self.gen_busy_us.load(Ordering::Relaxed) as f64 / 1e6,
            ),
            ("rlx_rejected_total", "Requests refused with 429 (queue full).", self.rejected.load(Ordering::Relaxed) as f64),
            ("rlx_disconnects_total", "Generations stopped because the client went away.", self.disconnects.load(Ordering::Relaxed) as f64),
        ];
        for (n, help, v) in counters {
            let _ = writeln!(o, "# HELP {n} {help}\n# TYPE {n} counter\n{n} {v}");
        }
        o
    }
}
