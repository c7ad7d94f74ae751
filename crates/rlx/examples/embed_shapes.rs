//! Profile: what meeting a new (batch, padded length) shape costs the CPU
//! embedder (graph build and optimize, compile, first run) against a run of
//! a cached shape, in CPU time, over 30 shapes of 1-10 rows x 12-20 tokens.
//!
//! ```text
//! cargo run --release -p rlx --example embed_shapes -- [THREADS]
//! ```
use rlx::models::SentenceEmbedder;

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
    let mut e = SentenceEmbedder::load_with(
        &dir,
        rlx::models::EmbedOptions {
            threads: Some(threads),
            ..Default::default()
        },
    )
    .unwrap();
    let rows = |b: usize, s: usize| -> Vec<Vec<i64>> {
        (0..b)
            .map(|k| {
                let mut r = vec![101i64];
                r.extend((0..s - 2).map(|i| 1000 + ((i * 7 + k) % 500) as i64));
                r.push(102);
                r
            })
            .collect()
    };
    e.embed_ids(&rows(1, 8)).unwrap();
    let shapes: Vec<(usize, usize)> = (1..=10)
        .flat_map(|b| [12usize, 16, 20].map(|s| (b, s)))
        .collect();
    let c0 = cpu_ms();
    for &(b, s) in &shapes {
        e.graph_for(b, s, false).unwrap();
    }
    let graphs = cpu_ms() - c0;
    let c0 = cpu_ms();
    for &(b, s) in &shapes {
        e.model_for(b, s, false).unwrap();
    }
    let compile = cpu_ms() - c0;
    let c0 = cpu_ms();
    for &(b, s) in &shapes {
        e.embed_ids(&rows(b, s)).unwrap();
    }
    let first = cpu_ms() - c0;
    println!(
        "graph build+optimize {:.2} cpu-ms/shape, model_for (graph + compile) {:.2} cpu-ms/shape",
        graphs / shapes.len() as f64,
        compile / shapes.len() as f64
    );
    let c0 = cpu_ms();
    let reps = 5;
    for _ in 0..reps {
        for &(b, s) in &shapes {
            e.embed_ids(&rows(b, s)).unwrap();
        }
    }
    let steady = (cpu_ms() - c0) / reps as f64;
    println!("{} new shapes: first pass {first:.0} cpu-ms, cached pass {steady:.0} cpu-ms -> {:.2} cpu-ms per new shape", shapes.len(), (first - steady) / shapes.len() as f64);
}
