//! The GGUF reader: header, metadata (every typed getter on every key),
//! tensor infos, and dequantization of every tensor, whole and by row.
//! Inputs that do not start with the GGUF magic are also dequantized raw:
//! byte 0 is the ggml type id, the rest the blocks.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rlx_formats::{quant, GgmlType, GgufFile};

fn raw_dequant(data: &[u8]) {
    let Some((&id, bytes)) = data.split_first() else {
        return;
    };
    let Some(ty) = GgmlType::from_id(id as u32) else {
        return;
    };
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let _ = ty.row_bytes(bytes.len());
    let _ = (ty.name(), ty.can_dequantize(), ty.quant_scheme());
    if be == 0 || bb == 0 {
        return;
    }
    let blocks = bytes.len() / bb;
    let whole = &bytes[..blocks * bb];
    let n = blocks * be;
    if let Ok(v) = quant::dequantize_to_vec(ty, whole, n) {
        assert_eq!(v.len(), n);
    }
    // Mismatched sizes must be errors.
    let _ = quant::dequantize_to_vec(ty, bytes, n + 1);
    let _ = quant::dequantize_to_vec(ty, whole, n.saturating_sub(1));
    let mut short = vec![0f32; n / 2];
    let _ = quant::dequantize(ty, whole, n, &mut short);
}

fn file(f: &GgufFile) {
    let _ = (f.version(), f.alignment(), f.data_offset(), f.path());
    for (key, v) in f.metadata_entries() {
        let _ = (v.type_description(), v.as_u64(), v.as_i64(), v.as_f64());
        let _ = f.get_usize(key);
        let _ = f.get_float(key);
        let _ = f.get_str(key);
        let _ = f.get_array(key);
        let _ = f.get_str_array(key);
        let _ = f.get_i32_array(key);
        let _ = f.get_u32_array(key);
        let _ = f.get_f32_array(key);
        let _ = (f.get_u8(key), f.get_i8(key), f.get_u16(key), f.get_i16(key));
        let _ = (
            f.get_u32(key),
            f.get_i32(key),
            f.get_u64(key),
            f.get_i64(key),
        );
        let _ = (f.get_f32(key), f.get_f64(key), f.get_bool(key));
    }
    let _ = f.require("missing.key");
    let _ = f.tensor_f32("missing.tensor");
    for t in f.tensors() {
        let _ = (t.shape(), t.row_len(), t.row_bytes());
        let rows = t.n_rows();
        let _ = f.tensor_bytes(&t.name).expect("validated tensor has bytes");
        if let Ok(v) = f.tensor_f32(&t.name) {
            assert_eq!(v.len() as u64, t.n_elements);
        }
        for row in [0, rows / 2, rows.saturating_sub(1), rows] {
            if let Ok(v) = f.tensor_row_f32(&t.name, row) {
                assert_eq!(v.len(), t.row_len());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if !data.starts_with(b"GGUF") {
        raw_dequant(data);
    }
    let path = common::write_scratch("t.gguf", data);
    if let Ok(f) = GgufFile::open(&path) {
        file(&f);
    }
});
