//! Time of a decode step's quantized matmuls (one activation row) on the
//! weight panels: SmolLM2-135M's 30 layers of Q4_1 projections
//! (q, k, v, o, gate, up, down) and a Q8_0 head of 49152 rows, about
//! 90 MB, so each step streams them from memory as a real decode does.
//! Runs in a rayon pool of `THREADS` (default 2) workers, its loops on a
//! thread team of as many threads (`RLX_CPU_TEAM=0`: on the pool, as
//! fork-joins); `ACT=int8` for
//! 8-bit activations (default f32); `ROWS` activation rows (default 1: a
//! decode step; more: a batched decode step); `HEAD=0` leaves the head out (a prefill runs it on one
//! row only); `VIA=panels` keeps many `F32` rows on the panel kernel
//! instead of the dequantizing GEMM that `matmul` picks for them. A timing aid; asserts
//! nothing. `LAYERS` (default 30) sets how many layers' weights there are:
//! with one, they stay in L2 between steps.
use rlx_cpu::kernels::quant_panels::{PanelPath, QuantPanels};
use rlx_ir::{ActivationPrecision, QuantScheme};
use std::time::Instant;

fn main() {
    let threads = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let act = match std::env::var("ACT").as_deref() {
        Ok("int8") => ActivationPrecision::Int8,
        _ => ActivationPrecision::F32,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let team = rlx_cpu::kernels::team::shared_team(threads);
    pool.install(|| rlx_cpu::kernels::team::with_team(team.as_ref(), || run(act)));
}

/// Random GGUF blocks of `scheme` for an `[n, k]` weight (f16 scales of
/// about 0.01).
fn gguf(scheme: QuantScheme, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let (block, qs, extra) = match scheme {
        QuantScheme::Q4_1 => (20, 16, true),
        _ => (34, 32, false),
    };
    let mut s = seed;
    let mut out = Vec::with_capacity(n * k / 32 * block);
    for _ in 0..n * k / 32 {
        out.extend_from_slice(&0x211Eu16.to_le_bytes());
        if extra {
            out.extend_from_slice(&0xA11Eu16.to_le_bytes());
        }
        for _ in 0..qs {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            out.push((s >> 56) as u8);
        }
    }
    out
}

fn run(act: ActivationPrecision) {
    let (d, ff, kv, vocab) = (576usize, 1536usize, 192usize, 49152usize);
    let layers: usize = std::env::var("LAYERS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(30);
    let mut mats = Vec::new();
    for l in 0..layers as u64 {
        for (i, (n, k)) in [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)]
            .into_iter()
            .enumerate()
        {
            let w = gguf(QuantScheme::Q4_1, n, k, l * 8 + i as u64);
            mats.push(QuantPanels::pack(QuantScheme::Q4_1, &w, n, k).unwrap());
        }
    }
    if std::env::var("HEAD").as_deref() != Ok("0") {
        let head = gguf(QuantScheme::Q8_0, vocab, d, 99);
        mats.push(QuantPanels::pack(QuantScheme::Q8_0, &head, vocab, d).unwrap());
    }
    let bytes: usize = mats.iter().map(|m| m.bytes()).sum();
    let rows: usize = std::env::var("ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let x: Vec<f32> = (0..rows * ff)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let mut out = vec![0f32; rows * vocab];
    let on_panels = std::env::var("VIA").as_deref() == Ok("panels");
    let mut times = Vec::new();
    for _ in 0..30 {
        let t0 = Instant::now();
        for m in &mats {
            let (x, o) = (&x[..rows * m.k()], &mut out[..rows * m.n()]);
            if on_panels {
                m.matmul_path(act, x, rows, o, true, PanelPath::active())
            } else {
                m.matmul(act, x, rows, o, true)
            }
            .unwrap();
        }
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let med = times[times.len() / 2];
    println!(
        "{act:?} x {rows} rows: {} matmuls, {:.1} MB of panels: median {med:.3} ms per step ({:.1} GB/s), min {:.3} (out[0] {:.4})",
        mats.len(),
        bytes as f64 / 1e6,
        bytes as f64 / med / 1e6,
        times[0],
        out[0]
    );
}
