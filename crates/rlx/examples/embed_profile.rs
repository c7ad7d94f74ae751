//! Profile of all-MiniLM-L6-v2 embedding by batch shape on the CPU: per
//! (batch, padded length), the compile time of a new shape, its first run,
//! and the best / mean wall and CPU time per run, row and token (CPU time
//! from /proc, so a machine shared with other jobs still gives the work
//! done); then tokenizer time.
//!
//! ```text
//! cargo run --release -p rlx --example embed_profile -- [THREADS] [SEQ_BUCKET]
//! ```
use rlx::models::SentenceEmbedder;
use std::time::Instant;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Process CPU time (user + system) in ms.
fn cpu_ms() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    let (u, k): (f64, f64) = (f[11].parse().unwrap(), f[12].parse().unwrap());
    (u + k) * 10.0
}

fn main() {
    let dir = format!(
        "{}/.cache/rlx/models/all-minilm-l6-v2",
        std::env::var("HOME").unwrap()
    );
    let threads: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    let seqb: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(16);
    let t = Instant::now();
    let mut e = SentenceEmbedder::load_with(
        &dir,
        rlx::models::EmbedOptions {
            threads: Some(threads),
            seq_bucket: seqb,
            ..Default::default()
        },
    )
    .unwrap();
    println!("load {:.1} ms", ms(t));
    let t = Instant::now();
    e.model_for(1, 16, false).unwrap();
    println!("first compile 1x16 (weights, packing): {:.1} ms", ms(t));
    let words: Vec<&str> = "the quick brown fox jumps over lazy dog rust language systems program capital france guitar stage playing man".split(' ').collect();
    let sent = |n: usize, k: usize| -> String {
        (0..n)
            .map(|i| words[(i * 7 + k) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    for &(b, s) in &[
        (1usize, 16usize),
        (1, 32),
        (2, 16),
        (4, 16),
        (8, 16),
        (16, 16),
        (32, 16),
        (64, 16),
        (8, 32),
        (32, 32),
        (64, 32),
        (128, 16),
    ] {
        let t = Instant::now();
        e.model_for(b, s, false).unwrap();
        let c = ms(t);
        // words so that the tokenized length pads to s: s-2 tokens ~ (s-2) words of these
        let wn = s - 3;
        let texts: Vec<String> = (0..b).map(|k| sent(wn, k)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let c1 = cpu_ms();
        let t = Instant::now();
        e.embed(&refs).unwrap();
        let first = ms(t);
        let first_cpu = cpu_ms() - c1;
        let mut best = f64::MAX;
        let reps = (1024 / (b * s / 16)).clamp(3, 40);
        let c0 = cpu_ms();
        let t0 = Instant::now();
        for _ in 0..reps {
            let t = Instant::now();
            e.embed(&refs).unwrap();
            best = best.min(ms(t));
        }
        let cpu = (cpu_ms() - c0) / reps as f64;
        let wall = ms(t0) / reps as f64;
        println!("{b}x{s}: compile {c:.1} ms, first run {first:.1} (cpu {first_cpu:.1}), best {best:.2} ms = {:.3} ms/row, {:.1} us/token; mean wall {wall:.2} cpu {cpu:.2} ms = {:.1} cpu-us/token", best / b as f64, best * 1e3 / (b * s) as f64, cpu * 1e3 / (b * s) as f64);
    }
    let texts: Vec<String> = (0..1000).map(|k| sent(15, k)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let t = Instant::now();
    let b = e.tokenizer().encode_batch(&refs).unwrap();
    println!("tokenize 1000 x 15 words: {:.2} ms (seq {})", ms(t), b.seq);
    println!("{:?}", e.cache_stats());
}
