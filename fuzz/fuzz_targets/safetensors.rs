//! The safetensors reader: open (header JSON, offsets, sizes), then read
//! every tensor as f32 and i64 with its own and a wrong shape.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rlx_formats::SafeTensorsFile;

fuzz_target!(|data: &[u8]| {
    let path = common::write_scratch("t.safetensors", data);
    let Ok(f) = SafeTensorsFile::open(&path) else {
        return;
    };
    let _ = (f.len(), f.is_empty(), f.contains("missing"));
    let _ = f.tensor_bytes("missing");
    for name in f.names() {
        let _ = f.dtype_name(name);
        let _ = f.tensor_bytes(name).expect("listed tensor has bytes");
        let shape = match f.info(name) {
            Some((_, shape)) => shape,
            None => continue,
        };
        let _ = f.tensor_f32(name, &shape);
        let _ = f.tensor_i64(name, &shape);
        let _ = f.tensor_f32(name, &[1]);
    }
});
