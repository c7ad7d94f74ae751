//! Dequantization against vectors produced by the PyPI `gguf` package
//! (`scripts/gen_quant_vectors.py`; provenance is in each file's `producer`).

use std::path::PathBuf;

use rlx_formats::quant::{dequantize, dequantize_to_vec};
use rlx_formats::GgmlType;

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

struct Vector {
    ty: GgmlType,
    n_elems: usize,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn load(name: &str) -> Vector {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quant")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["type"].as_str(), Some(name));
    let ty = GgmlType::from_id(v["type_id"].as_u64().expect("type_id") as u32).expect("known type");
    assert_eq!(ty.name(), name);
    let values: Vec<f32> = hex(v["values"].as_str().expect("values"))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let n_elems = v["n_elems"].as_u64().expect("n_elems") as usize;
    assert_eq!(values.len(), n_elems);
    Vector {
        ty,
        n_elems,
        bytes: hex(v["bytes"].as_str().expect("bytes")),
        values,
    }
}

const TYPES: [&str; 14] = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "BF16",
    "F16", "F32",
];

#[test]
fn all_types_match_gguf_py_bit_exactly() {
    for name in TYPES {
        let v = load(name);
        let got = dequantize_to_vec(v.ty, &v.bytes, v.n_elems).unwrap();
        let mut max_rel = 0.0f64;
        let mut mismatched_bits = 0;
        for (i, (&g, &w)) in got.iter().zip(&v.values).enumerate() {
            assert!(g.is_finite() && w.is_finite(), "{name}[{i}]: {g} vs {w}");
            let rel = ((g as f64 - w as f64).abs()) / (w.abs() as f64).max(1e-30);
            if g != w {
                max_rel = max_rel.max(rel);
            }
            assert!(
                (g as f64 - w as f64).abs() <= 1e-6 * (w.abs() as f64) + f32::MIN_POSITIVE as f64,
                "{name}[{i}]: got {g:e}, expected {w:e}"
            );
            if g.to_bits() != w.to_bits() {
                mismatched_bits += 1;
            }
        }
        // The arithmetic order matches ggml / gguf-py for every type.
        assert_eq!(
            mismatched_bits, 0,
            "{name}: {mismatched_bits} values differ in bits (max rel {max_rel:e})"
        );
        // Vectors must contain non-trivial data.
        assert!(
            v.values.iter().any(|&x| x != 0.0),
            "{name}: all-zero vector"
        );
    }
}

#[test]
fn per_row_dequantization_equals_whole_buffer() {
    for name in TYPES {
        let v = load(name);
        let be = v.ty.block_elems();
        let bb = v.ty.block_bytes();
        // Dequantize block by block into a shared buffer.
        let mut out = vec![f32::NAN; v.n_elems];
        for (blk, o) in v.bytes.chunks(bb).zip(out.chunks_mut(be)) {
            dequantize(v.ty, blk, be, o).unwrap();
        }
        assert!(
            out.iter()
                .zip(&v.values)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: per-block results differ"
        );
    }
}

#[test]
fn truncated_buffers_are_errors() {
    for name in TYPES {
        let v = load(name);
        let mut out = vec![0.0; v.n_elems];
        assert!(dequantize(v.ty, &v.bytes[..v.bytes.len() - 1], v.n_elems, &mut out).is_err());
        assert!(dequantize(v.ty, &v.bytes, v.n_elems, &mut out[1..]).is_err());
    }
}
