//! Shared test support: seeded data, the reference oracle, comparisons.
#![allow(dead_code)]

pub mod cases;
mod rng;
pub use rng::Rng;
#[path = "../../../rlx-models/tests/support/reference.rs"]
pub mod pytorch_reference;
mod random_graph;
#[allow(unused_imports)]
pub use random_graph::{every_kth, random_graph};

use rlx::ir::{DType, Graph, Op, Tensor};
use std::collections::HashMap;

/// Random values for every leaf Input/Param of `g`: f32 uniform in
/// `[-scale, scale]` (a leaf whose name starts with `keep` gets a `[B, S]`
/// keep-mask with gaps instead), integer leaves ids in range of the Gather
/// table they index (else `0..8`), u8 leaves of a `DequantMatMul` random
/// GGUF blocks, other u8/bool leaves 0/1.
pub fn random_bindings(g: &Graph, rng: &mut Rng, scale: f32) -> HashMap<String, Tensor> {
    let mut b = HashMap::new();
    for n in g.nodes() {
        let name = match &n.op {
            Op::Input { name } | Op::Param { name } => name.clone(),
            _ => continue,
        };
        let numel = n.shape.numel();
        let limit = g
            .users(n.id)
            .iter()
            .find_map(|&u| match g.node(u).op {
                Op::Gather { .. } if g.node(u).inputs[1] == n.id => {
                    Some(g.node(g.node(u).inputs[0]).shape.dims[0])
                }
                _ => None,
            })
            .unwrap_or(8);
        let packed_for = g.users(n.id).iter().find_map(|&u| match g.node(u).op {
            Op::DequantMatMul { scheme, .. } if g.node(u).inputs[1] == n.id => Some(scheme),
            _ => None,
        });
        let t = match (n.shape.dtype, packed_for) {
            (DType::F32, _) if name.starts_with("keep") => keep_mask(&n.shape.dims),
            (DType::U8, Some(scheme)) => packed_blocks(scheme, &n.shape.dims, rng),
            (DType::F32, _) => Tensor::f32(&n.shape.dims, rng.vec(numel, scale)),
            (DType::I64, _) => Tensor::i64(
                &n.shape.dims,
                (0..numel).map(|_| rng.below(limit) as i64).collect(),
            ),
            (DType::I32, _) => Tensor::i32(
                &n.shape.dims,
                (0..numel).map(|_| rng.below(limit) as i32).collect(),
            ),
            (DType::U8 | DType::Bool, _) => Tensor::u8(
                &n.shape.dims,
                (0..numel).map(|i| (i % 3 != 1) as u8).collect(),
            ),
            (d, _) => panic!("test helper has no generator for {d}"),
        };
        b.insert(name, t);
    }
    b
}

/// A `[B, S]` keep-mask with gaps and a different run of trailing zeros
/// per row (row b keeps nothing past `S - 3 - 2b`).
pub fn keep_mask(dims: &[usize]) -> Tensor {
    let s = *dims.last().unwrap();
    let v = (0..dims.iter().product::<usize>())
        .map(|i| {
            let (b, j) = (i / s, i % s);
            let last = s.saturating_sub(3 + 2 * b);
            (j <= last && j % 5 != 3) as u8 as f32
        })
        .collect();
    Tensor::f32(dims, v)
}

/// Random GGUF blocks of `scheme` for a `u8 [N, row_bytes]` weight, with
/// f16 scales (and minimums) of a few hundredths in the leading fields.
pub fn packed_blocks(scheme: rlx::ir::QuantScheme, dims: &[usize], rng: &mut Rng) -> Tensor {
    use rlx::ir::QuantScheme;
    // f16: 0.0100, 0.0500, -0.0188, 0.1000, -0.0300
    const SCALES: [u16; 5] = [0x211F, 0x2A66, 0xA4CD, 0x2E66, 0xA7AE];
    let mut bytes: Vec<u8> = (0..dims.iter().product::<usize>())
        .map(|_| rng.next_u64() as u8)
        .collect();
    // Byte offsets of the f16 scale fields (K-quants: d and dmin at the end
    // or start of the block, per ggml's layout).
    let fields: &[usize] = match scheme {
        QuantScheme::Q4_1 | QuantScheme::Q5_1 => &[0, 2],
        QuantScheme::Q4_0 | QuantScheme::Q5_0 | QuantScheme::Q8_0 => &[0],
        QuantScheme::Q2K => &[80, 82],
        QuantScheme::Q3K => &[108],
        QuantScheme::Q4K | QuantScheme::Q5K => &[0, 2],
        QuantScheme::Q6K => &[208],
        QuantScheme::Q8K => &[],
    };
    // K-quants scale their f16 super-block scales again by 6- or 8-bit
    // sub-block scales (up to 63 or 127): smaller super-scales keep their
    // weights the size a model's are (|w| of order 1), so the f32 sums of
    // the reference and the kernels compare within the f32 tolerance.
    // f16: 0.0010, 0.0020, -0.0015, 0.0005
    const K_SCALES: [u16; 4] = [0x1419, 0x1819, 0x9625, 0x1019];
    let super_block = scheme.block_elems() == 256;
    for blk in bytes.chunks_exact_mut(scheme.block_bytes()) {
        for &f in fields {
            let h = if super_block {
                K_SCALES[rng.below(K_SCALES.len())].to_le_bytes()
            } else {
                SCALES[rng.below(SCALES.len())].to_le_bytes()
            };
            blk[f..f + 2].copy_from_slice(&h);
        }
        if scheme == QuantScheme::Q8K {
            // An f32 scale first.
            blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
        }
    }
    Tensor::u8(dims, bytes)
}

/// Whether a CUDA device is usable. Prints "skipped: no CUDA device" and
/// returns false when not; with `RLX_REQUIRE_CUDA=1` (the GPU machine) a
/// missing device is a failure instead.
#[cfg(feature = "cuda")]
pub fn cuda_or_skip() -> bool {
    match rlx::cuda::cuda_available() {
        Ok(_) => true,
        Err(why) if std::env::var("RLX_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("RLX_REQUIRE_CUDA=1 but no CUDA device: {why}")
        }
        Err(why) => {
            println!("skipped: no CUDA device ({why})");
            false
        }
    }
}

/// The fetched all-MiniLM-L6-v2 directory (`RLX_MODELS_DIR`, default
/// `~/.cache/rlx/models`), if its weights are there.
pub fn minilm_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let root = std::env::var_os("RLX_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))?;
    let dir = root.join("all-minilm-l6-v2");
    dir.join("model.safetensors").exists().then_some(dir)
}

/// The PyTorch reference of all-MiniLM-L6-v2
/// (`crates/rlx-models/tests/data/minilm_embeddings.json`, read with the
/// parser the rlx-models parity tests use): sentences and embeddings.
pub fn minilm_reference() -> (Vec<String>, Vec<Vec<f32>>) {
    let rel = "crates/rlx-models/tests/data/minilm_embeddings.json";
    let here = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rlx-models/tests/data/minilm_embeddings.json"
    );
    let text = std::fs::read_to_string(here)
        .or_else(|_| std::fs::read_to_string(rel))
        .expect("reference embeddings file");
    let cases = pytorch_reference::parse_minilm_embeddings(&text).expect("reference embeddings");
    cases.into_iter().map(|c| (c.text, c.emb)).unzip()
}

/// Reference-interpreter outputs as f32 vectors.
pub fn reference(g: &Graph, b: &HashMap<String, Tensor>) -> Vec<Vec<f32>> {
    rlx_ref::run(g, b)
        .expect("reference interpreter")
        .into_iter()
        .map(|t| t.as_f32().expect("f32 output").to_vec())
        .collect()
}

/// Compile with `session`, bind everything in `b`, run, return f32 outputs.
pub fn run_session(
    session: &rlx::Session,
    g: &Graph,
    b: &HashMap<String, Tensor>,
) -> Vec<Vec<f32>> {
    let mut m = session.compile(g.clone()).expect("compile");
    run_compiled(&mut m, g, b)
}

pub fn run_compiled(
    m: &mut rlx::CompiledModel,
    g: &Graph,
    b: &HashMap<String, Tensor>,
) -> Vec<Vec<f32>> {
    let mut inputs: Vec<(&str, rlx::TensorRef<'_>)> = Vec::new();
    for n in g.nodes() {
        match &n.op {
            Op::Param { name } => m.set_param_typed(name, tref(&b[name])).expect("set_param"),
            Op::Input { name } => inputs.push((name.as_str(), tref(&b[name]))),
            _ => {}
        }
    }
    m.run_typed(&inputs)
        .expect("run")
        .into_iter()
        .map(|t| t.as_f32().expect("f32 output").to_vec())
        .collect()
}

pub fn tref(t: &Tensor) -> rlx::TensorRef<'_> {
    use rlx::ir::TensorData;
    match &*t.data {
        TensorData::F32(v) => rlx::TensorRef::F32(v),
        TensorData::I32(v) => rlx::TensorRef::I32(v),
        TensorData::I64(v) => rlx::TensorRef::I64(v),
        TensorData::U8(v) => rlx::TensorRef::U8(v),
    }
}

/// Assert `got` equals `want` within `rel` relative (with an equal absolute
/// floor), NaN matching NaN. Reports the worst element.
pub fn assert_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        if a.is_nan() && b.is_nan() || a == b {
            continue;
        }
        let err = (a - b).abs() / b.abs().max(1.0);
        assert!(!err.is_nan(), "{what}[{i}]: got {a}, want {b}");
        if err > worst.1 {
            worst = (i, err);
        }
    }
    assert!(
        worst.1 <= rel,
        "{what}: element {} got {} want {} (rel err {:e} > {:e})",
        worst.0,
        got[worst.0],
        want[worst.0],
        worst.1,
        rel
    );
}

/// Inputs and seeded synthetic weights for a BERT graph of `cfg` at batch
/// `b`, sequence `s`: random token ids, token type 0, and row `i` of the
/// attention mask keeping its first `lens[i]` positions.
pub fn bert_bindings(
    cfg: &rlx_models::bert::BertConfig,
    b: usize,
    s: usize,
    lens: &[usize],
) -> HashMap<String, Tensor> {
    let mut rng = Rng::new(11);
    let mut m: HashMap<String, Tensor> = rlx_models::bert::synthetic_params(cfg, 5)
        .into_iter()
        .map(|(n, v)| {
            let dims = cfg.params().into_iter().find(|p| p.0 == n).unwrap().1;
            (n, Tensor::f32(&dims, v))
        })
        .collect();
    let ids = (0..b * s)
        .map(|_| rng.below(cfg.vocab_size) as i64)
        .collect();
    m.insert("input_ids".into(), Tensor::i64(&[b, s], ids));
    m.insert(
        "token_type_ids".into(),
        Tensor::i64(&[b, s], vec![0; b * s]),
    );
    let mut mask = vec![0f32; b * s];
    for (i, &l) in lens.iter().enumerate() {
        mask[i * s..i * s + l].fill(1.0);
    }
    m.insert("attention_mask".into(), Tensor::f32(&[b, s], mask));
    m
}
