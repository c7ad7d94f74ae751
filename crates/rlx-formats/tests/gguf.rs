//! GGUF reader tests on hand-built valid and corrupt files.

mod common;

use common::tmp_file;
use rlx_formats::{FormatError, GgmlType, GgufFile, GgufLimits, GgufValue, GgufValueType};

/// Serialized metadata value: type id plus payload.
struct Val(u32, Vec<u8>);

fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

fn u32v(x: u32) -> Val {
    Val(4, x.to_le_bytes().to_vec())
}

fn strv(s: &str) -> Val {
    Val(8, gstr(s))
}

/// An array value of element type `elem` with pre-serialized elements.
fn arr(elem: u32, elems: &[Vec<u8>]) -> Val {
    let mut v = elem.to_le_bytes().to_vec();
    v.extend_from_slice(&(elems.len() as u64).to_le_bytes());
    for e in elems {
        v.extend_from_slice(e);
    }
    Val(9, v)
}

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

/// Builds a GGUF file. Tensor offsets are laid out aligned, in order.
struct Builder {
    magic: [u8; 4],
    version: u32,
    alignment: u64,
    kvs: Vec<(String, Val)>,
    tensors: Vec<Tensor>,
}

impl Builder {
    fn new() -> Self {
        Builder {
            magic: *b"GGUF",
            version: 3,
            alignment: 32,
            kvs: vec![],
            tensors: vec![],
        }
    }

    fn kv(mut self, key: &str, v: Val) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Returns the bytes and the offset of each tensor info's `offset` field.
    fn build_with_offsets(&self) -> (Vec<u8>, Vec<usize>) {
        let a = self.alignment as usize;
        let mut out = self.magic.to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, Val(t, payload)) in &self.kvs {
            out.extend_from_slice(&gstr(k));
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(payload);
        }
        let mut offset_fields = vec![];
        let mut off = 0usize;
        for t in &self.tensors {
            out.extend_from_slice(&gstr(&t.name));
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.to_le_bytes());
            offset_fields.push(out.len());
            out.extend_from_slice(&(off as u64).to_le_bytes());
            off = (off + t.data.len()).div_ceil(a) * a;
        }
        while out.len() % a != 0 {
            out.push(0);
        }
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            while out.len() % a != 0 {
                out.push(0);
            }
        }
        (out, offset_fields)
    }

    fn build(&self) -> Vec<u8> {
        self.build_with_offsets().0
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One Q8_0 block: d = 0.25, q = i - 16.
fn q8_0_block(shift: i32) -> Vec<u8> {
    let mut b = half::f16::from_f32(0.25).to_bits().to_le_bytes().to_vec();
    b.extend((0..32).map(|i| (i - 16 + shift) as i8 as u8));
    b
}

/// One Q4_1 block: d = 0.5, m = -1, q[j] = j % 16.
fn q4_1_block() -> Vec<u8> {
    let mut b = half::f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
    b.extend_from_slice(&half::f16::from_f32(-1.0).to_bits().to_le_bytes());
    b.extend((0..16u8).map(|j| j | (j << 4)));
    b
}

fn sample() -> Builder {
    let nested = arr(
        9,
        &[
            arr(
                4,
                &[1u32.to_le_bytes().to_vec(), 2u32.to_le_bytes().to_vec()],
            )
            .1,
            {
                let mut v = 8u32.to_le_bytes().to_vec();
                v.extend_from_slice(&1u64.to_le_bytes());
                v.extend_from_slice(&gstr("deep"));
                v
            },
        ],
    );
    Builder::new()
        .kv("general.architecture", strv("llama"))
        .kv("t.u8", Val(0, vec![200]))
        .kv("t.i8", Val(1, vec![0x80]))
        .kv("t.u16", Val(2, 60000u16.to_le_bytes().to_vec()))
        .kv("t.i16", Val(3, (-300i16).to_le_bytes().to_vec()))
        .kv("llama.block_count", u32v(30))
        .kv("t.i32", Val(5, (-5i32).to_le_bytes().to_vec()))
        .kv("t.f32", Val(6, 1e-5f32.to_le_bytes().to_vec()))
        .kv("t.bool", Val(7, vec![1]))
        .kv("t.u64", Val(10, (1u64 << 40).to_le_bytes().to_vec()))
        .kv("t.i64", Val(11, (-1i64 << 40).to_le_bytes().to_vec()))
        .kv("t.f64", Val(12, 0.125f64.to_le_bytes().to_vec()))
        .kv(
            "tok.tokens",
            arr(8, &[gstr("<unk>"), gstr("héllo"), gstr("")]),
        )
        .kv(
            "tok.types",
            arr(
                5,
                &[1i32.to_le_bytes().to_vec(), (-2i32).to_le_bytes().to_vec()],
            ),
        )
        .kv("tok.scores", arr(6, &[0.5f32.to_le_bytes().to_vec()]))
        .kv("t.nested", nested)
        .kv("t.empty", arr(10, &[]))
        // dims innermost-first: ne = [3, 2] is a 2 x 3 row-major matrix.
        .tensor("w", &[3, 2], 0, f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
        .tensor("emb", &[32, 2], 8, [q8_0_block(0), q8_0_block(1)].concat())
        .tensor("q41", &[32], 3, q4_1_block())
        .tensor(
            "h",
            &[2],
            1,
            [
                half::f16::from_f32(-1.5).to_bits().to_le_bytes(),
                half::f16::from_f32(2.0).to_bits().to_le_bytes(),
            ]
            .concat(),
        )
}

fn open(bytes: &[u8]) -> Result<GgufFile, FormatError> {
    let path = tmp_file("t.gguf", bytes);
    let r = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path);
    r
}

#[test]
fn parses_metadata_of_every_type() {
    let f = open(&sample().build()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.metadata_entries().len(), 17);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u8("t.u8").unwrap(), 200);
    assert_eq!(f.get_i8("t.i8").unwrap(), -128);
    assert_eq!(f.get_u16("t.u16").unwrap(), 60000);
    assert_eq!(f.get_i16("t.i16").unwrap(), -300);
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_usize("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_i32("t.i32").unwrap(), -5);
    assert_eq!(f.get_f32("t.f32").unwrap(), 1e-5);
    assert!(f.get_bool("t.bool").unwrap());
    assert_eq!(f.get_u64("t.u64").unwrap(), 1 << 40);
    assert_eq!(f.get_i64("t.i64").unwrap(), -1 << 40);
    assert_eq!(f.get_f64("t.f64").unwrap(), 0.125);
    assert_eq!(f.get_float("t.f32").unwrap(), 1e-5f32 as f64);
    assert_eq!(
        f.get_str_array("tok.tokens").unwrap(),
        vec!["<unk>", "héllo", ""]
    );
    assert_eq!(f.get_i32_array("tok.types").unwrap(), vec![1, -2]);
    assert_eq!(f.get_f32_array("tok.scores").unwrap(), vec![0.5]);
    let nested = f.get_array("t.nested").unwrap();
    assert_eq!(nested.elem_type, GgufValueType::Array);
    assert_eq!(nested.len(), 2);
    assert_eq!(
        nested.get(0).unwrap().as_array().unwrap().values(),
        vec![GgufValue::U32(1), GgufValue::U32(2)]
    );
    assert_eq!(
        nested
            .get(1)
            .unwrap()
            .as_array()
            .unwrap()
            .get(0)
            .unwrap()
            .as_str(),
        Some("deep")
    );
    assert_eq!(nested.get(2), None);
    let empty = f.get_array("t.empty").unwrap();
    assert_eq!((empty.elem_type, empty.len()), (GgufValueType::U64, 0));
    assert_eq!(f.metadata("t.i64").unwrap().as_i64(), Some(-1 << 40));
    assert!(f.metadata("nope").is_none());
}

#[test]
fn typed_getters_name_key_and_types() {
    let f = open(&sample().build()).unwrap();
    match f.get_f32("llama.block_count") {
        Err(FormatError::WrongValueType {
            key,
            expected,
            found,
            ..
        }) => {
            assert_eq!(key, "llama.block_count");
            assert_eq!(expected, "f32");
            assert_eq!(found, "u32");
        }
        other => panic!("expected WrongValueType, got {other:?}"),
    }
    let msg = f.get_str_array("tok.types").unwrap_err().to_string();
    assert!(
        msg.contains("tok.types")
            && msg.contains("array of i32")
            && msg.contains("array of string"),
        "{msg}"
    );
    assert!(matches!(
        f.get_usize("t.i32"),
        Err(FormatError::WrongValueType { .. })
    ));
    match f.get_u32("llama.missing") {
        Err(e @ FormatError::MissingKey { .. }) => assert!(e.to_string().contains("llama.missing")),
        other => panic!("expected MissingKey, got {other:?}"),
    }
}

#[test]
fn reads_and_dequantizes_tensors() {
    let f = open(&sample().build()).unwrap();
    let names: Vec<_> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["w", "emb", "q41", "h"]);
    let w = f.tensor_info("w").unwrap();
    assert_eq!(w.dims, vec![3, 2]);
    assert_eq!(w.shape(), vec![2, 3]);
    assert_eq!(
        (w.row_len(), w.n_rows(), w.n_elements, w.n_bytes),
        (3, 2, 6, 24)
    );
    assert_eq!(
        f.tensor_f32("w").unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(f.tensor_row_f32("w", 1).unwrap(), vec![4.0, 5.0, 6.0]);

    let emb = f.tensor_info("emb").unwrap();
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    assert_eq!(
        emb.ggml_type.quant_scheme(),
        Some(rlx_ir::QuantScheme::Q8_0)
    );
    assert_eq!(f.tensor_bytes("emb").unwrap().len(), 68);
    let all = f.tensor_f32("emb").unwrap();
    let row1 = f.tensor_row_f32("emb", 1).unwrap();
    let want1: Vec<f32> = (0..32).map(|i| (i - 15) as f32 * 0.25).collect();
    assert_eq!(row1, want1);
    assert_eq!(&all[32..], &want1[..]);
    assert_eq!(all[0], -4.0);
    match f.tensor_row_f32("emb", 2) {
        Err(FormatError::RowOutOfRange {
            row: 2, n_rows: 2, ..
        }) => {}
        other => panic!("expected RowOutOfRange, got {other:?}"),
    }
    let q = f.tensor_f32("q41").unwrap();
    for j in 0..16 {
        assert_eq!(q[j], j as f32 * 0.5 - 1.0);
        assert_eq!(q[j + 16], j as f32 * 0.5 - 1.0);
    }
    assert_eq!(f.tensor_f32("h").unwrap(), vec![-1.5, 2.0]);
    assert!(matches!(
        f.tensor_bytes("nope"),
        Err(FormatError::MissingTensor { .. })
    ));
}

#[test]
fn version_2_and_custom_alignment() {
    let mut b = sample();
    b.version = 2;
    b.alignment = 64;
    b.kvs.push(("general.alignment".into(), u32v(64)));
    let f = open(&b.build()).unwrap();
    assert_eq!((f.version(), f.alignment()), (2, 64));
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor_f32("h").unwrap(), vec![-1.5, 2.0]);

    for bad in [u32v(0), u32v(48), strv("32")] {
        let mut b = sample();
        b.kvs.push(("general.alignment".into(), bad));
        assert!(matches!(
            open(&b.build()),
            Err(FormatError::CorruptHeader { .. })
        ));
    }
}

#[test]
fn bad_magic_and_versions() {
    let mut b = sample();
    b.magic = *b"GGML";
    match open(&b.build()) {
        Err(FormatError::BadMagic { found, .. }) => assert_eq!(&found, b"GGML"),
        other => panic!("expected BadMagic, got {other:?}"),
    }
    for v in [0, 1, 4, 0x0300_0000] {
        let mut b = sample();
        b.version = v;
        match open(&b.build()) {
            Err(FormatError::UnsupportedVersion { version, .. }) => assert_eq!(version, v),
            other => panic!("version {v}: expected UnsupportedVersion, got {other:?}"),
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let full = sample().build();
    // The last tensor ("h", 4 bytes) is followed by alignment padding; any cut
    // before its data ends must fail.
    let data_end = full.len() - 28;
    for len in 0..data_end {
        let e = open(&full[..len]).expect_err("truncated file must not open");
        assert!(
            matches!(
                e,
                FormatError::Truncated { .. } | FormatError::TensorOutOfBounds { .. }
            ),
            "len {len}: {e:?}"
        );
    }
    // Header-level truncation is reported as such.
    assert!(matches!(
        open(&full[..30]),
        Err(FormatError::Truncated { .. })
    ));
}

#[test]
fn unknown_tensor_type_names_id_and_tensor() {
    let b = sample().tensor("blk.0.weird", &[32], 99, vec![0; 32]);
    match open(&b.build()) {
        Err(e @ FormatError::UnknownTensorType { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("99") && msg.contains("blk.0.weird"), "{msg}");
        }
        other => panic!("expected UnknownTensorType, got {other:?}"),
    }
}

#[test]
fn tensor_offset_past_end_is_an_error() {
    let b = sample();
    let (mut bytes, offs) = b.build_with_offsets();
    let at = offs[3];
    bytes[at..at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    match open(&bytes) {
        Err(FormatError::TensorOutOfBounds { name, .. }) => assert_eq!(name, "h"),
        other => panic!("expected TensorOutOfBounds, got {other:?}"),
    }
    // An offset near u64::MAX overflows rather than wrapping.
    bytes[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(open(&bytes), Err(FormatError::Overflow { .. })));
    // A misaligned offset.
    bytes[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
    assert!(matches!(
        open(&bytes),
        Err(FormatError::CorruptHeader { .. })
    ));
}

#[test]
fn huge_counts_do_not_allocate_or_panic() {
    // Array claiming 2^60 u8 elements.
    let mut huge = 0u32.to_le_bytes().to_vec();
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    huge.extend_from_slice(&[1, 2, 3]);
    let b = Builder::new().kv("a", Val(9, huge));
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::MetadataLimit { key, .. }) if key == "a"
    ));
    // Array claiming 2^60 strings / arrays.
    for elem in [8u32, 9] {
        let mut huge = elem.to_le_bytes().to_vec();
        huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let b = Builder::new().kv("a", Val(9, huge));
        assert!(matches!(
            open(&b.build()),
            Err(FormatError::MetadataLimit { key, .. }) if key == "a"
        ));
    }
    // Within the length limit but past the end of the file.
    for elem in [0u32, 8, 9] {
        let mut short = elem.to_le_bytes().to_vec();
        short.extend_from_slice(&1000u64.to_le_bytes());
        let b = Builder::new().kv("a", Val(9, short));
        assert!(matches!(
            open(&b.build()),
            Err(FormatError::Truncated { .. })
        ));
    }
    // String claiming 2^63 bytes.
    let b = Builder::new().kv("s", Val(8, (1u64 << 63).to_le_bytes().to_vec()));
    let err = open(&b.build()).unwrap_err();
    assert!(matches!(err, FormatError::MetadataLimit { .. }), "{err}");
    assert!(err.to_string().contains("`s`"), "{err}");
    // Header claiming 2^62 tensors and 2^62 metadata pairs.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 62).to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 62).to_le_bytes());
    bytes.extend_from_slice(&[0xff; 64]);
    assert!(matches!(
        open(&bytes),
        Err(FormatError::Truncated { .. } | FormatError::MetadataLimit { .. })
    ));
    // Dims whose product overflows.
    let b = Builder::new().tensor("big", &[1 << 40, 1 << 40], 0, vec![]);
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::Overflow { .. })
    ));
    // An empty tensor (a zero dim) whose rows would not fit in memory
    // (found by the gguf fuzzer: `row_bytes` overflowed).
    for (ty, row) in [(0u32, 1u64 << 62), (1, 1 << 63)] {
        let b = Builder::new().tensor("wide", &[row, 0], ty, vec![]);
        match open(&b.build()) {
            Err(e @ FormatError::Overflow { .. }) => {
                assert!(e.to_string().contains("wide"), "{e}")
            }
            other => panic!("expected Overflow, got {other:?}"),
        }
    }
    // Too many dims, and a row that is not a whole number of blocks.
    let b = Builder::new().tensor("r5", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::CorruptHeader { .. })
    ));
    let b = Builder::new().tensor("q", &[16], 8, vec![0; 34]);
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::CorruptHeader { .. })
    ));
}

#[test]
fn malformed_metadata_is_an_error() {
    // Unknown value type.
    let b = Builder::new().kv("k", Val(13, vec![0; 8]));
    match open(&b.build()) {
        Err(FormatError::UnknownValueType { key, type_id, .. }) => {
            assert_eq!((key.as_str(), type_id), ("k", 13))
        }
        other => panic!("expected UnknownValueType, got {other:?}"),
    }
    // Unknown array element type.
    let b = Builder::new().kv("k", arr(77, &[]));
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::UnknownValueType { .. })
    ));
    // Deeply nested arrays.
    let mut v = arr(0, &[]).1;
    for _ in 0..100 {
        let mut outer = 9u32.to_le_bytes().to_vec();
        outer.extend_from_slice(&1u64.to_le_bytes());
        outer.extend_from_slice(&v);
        v = outer;
    }
    let b = Builder::new().kv("deep", Val(9, v));
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::CorruptHeader { .. })
    ));
    // Duplicate keys and duplicate tensor names.
    let b = Builder::new().kv("k", u32v(1)).kv("k", u32v(2));
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::CorruptHeader { .. })
    ));
    let b = Builder::new()
        .tensor("t", &[1], 0, vec![0; 4])
        .tensor("t", &[1], 0, vec![0; 4]);
    assert!(matches!(
        open(&b.build()),
        Err(FormatError::CorruptHeader { .. })
    ));
}

#[test]
fn unsupported_dequant_is_an_error_not_a_panic() {
    // IQ2_XS (17) parses but has no dequantizer.
    let b = Builder::new().tensor("iq", &[256], 17, vec![0; 74]);
    let f = open(&b.build()).unwrap();
    assert_eq!(f.tensor_bytes("iq").unwrap().len(), 74);
    assert!(matches!(
        f.tensor_f32("iq"),
        Err(FormatError::Dequant { .. })
    ));
}

#[test]
fn byte_flips_never_panic() {
    let full = sample().build();
    for i in 0..full.len() {
        for mask in [0xffu8, 0x80, 0x01] {
            let mut bytes = full.clone();
            bytes[i] ^= mask;
            if let Ok(f) = open(&bytes) {
                for t in f.tensors().to_vec() {
                    let _ = f.tensor_f32(&t.name);
                    let _ = f.tensor_row_f32(&t.name, 0);
                }
            }
        }
    }
}

/// A u8 array of `n` elements (bytes `i % 251`).
fn u8_array(n: usize) -> Val {
    let mut v = 0u32.to_le_bytes().to_vec();
    v.extend_from_slice(&(n as u64).to_le_bytes());
    v.extend((0..n).map(|i| (i % 251) as u8));
    Val(9, v)
}

#[test]
fn big_scalar_arrays_are_views_of_the_file_not_copies() {
    // 64 MiB of u8 metadata: parsing keeps a view (O(1) memory), the
    // elements still read back, and the typed getters decode them.
    let n = 64 << 20;
    let bytes = Builder::new()
        .kv("big.u8", u8_array(n))
        .kv(
            "tok.types",
            arr(
                5,
                &[7i32.to_le_bytes().to_vec(), (-1i32).to_le_bytes().to_vec()],
            ),
        )
        .build();
    let range = bytes.as_ptr_range();
    let t = std::time::Instant::now();
    let f = GgufFile::from_bytes("mem.gguf", bytes, GgufLimits::default()).unwrap();
    let a = f.get_array("big.u8").unwrap();
    assert_eq!((a.elem_type, a.len()), (GgufValueType::U8, n));
    // The array's bytes are the caller's buffer itself: nothing was copied.
    let raw = a.raw_bytes();
    assert_eq!(raw.len(), n);
    assert!(range.contains(&raw.as_ptr()), "array bytes were copied");
    assert_eq!(a.get(0), Some(GgufValue::U8(0)));
    assert_eq!(a.get(1000), Some(GgufValue::U8((1000 % 251) as u8)));
    assert_eq!(a.get(n - 1), Some(GgufValue::U8(((n - 1) % 251) as u8)));
    assert_eq!(a.get(n), None);
    assert_eq!(a.iter().take(3).count(), 3);
    assert_eq!(f.get_i32_array("tok.types").unwrap(), vec![7, -1]);
    // Debug output is bounded, not 64 Mi entries.
    assert!(format!("{a:?}").len() < 400);
    assert!(t.elapsed().as_secs() < 5, "parse took {:?}", t.elapsed());
}

#[test]
fn metadata_limits_name_the_key() {
    let bytes = Builder::new()
        .kv("general.architecture", strv("llama"))
        .kv(
            "tokenizer.ggml.scores",
            arr(6, &vec![0.5f32.to_le_bytes().to_vec(); 100]),
        )
        .build();
    // Array length limit.
    let limits = GgufLimits {
        max_array_len: 50,
        ..Default::default()
    };
    let err = GgufFile::from_bytes("m.gguf", bytes.clone(), limits).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FormatError::MetadataLimit { .. }), "{msg}");
    assert!(msg.contains("tokenizer.ggml.scores"), "{msg}");
    assert!(msg.contains("100 elements"), "{msg}");
    assert!(msg.contains("at most 50"), "{msg}");
    // Total metadata size limit.
    let limits = GgufLimits {
        max_metadata_bytes: 200,
        ..Default::default()
    };
    let msg = GgufFile::from_bytes("m.gguf", bytes.clone(), limits)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("tokenizer.ggml.scores"), "{msg}");
    assert!(msg.contains("at most 200 bytes"), "{msg}");
    // Within the limits it parses.
    let f = GgufFile::from_bytes("m.gguf", bytes, GgufLimits::default()).unwrap();
    assert_eq!(f.get_f32_array("tokenizer.ggml.scores").unwrap().len(), 100);
}

#[test]
fn huge_in_memory_headers_fail_fast() {
    // Small in-memory images claiming huge counts: each must fail at once,
    // without allocating from the claimed count.
    let t = std::time::Instant::now();
    for (elem, count) in [
        (0u32, 1u64 << 40),
        (8, 1 << 28),
        (9, 1 << 28),
        (12, u64::MAX),
    ] {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend_from_slice(&count.to_le_bytes());
        v.extend_from_slice(&[0; 16]);
        let bytes = Builder::new().kv("claims.huge", Val(9, v)).build();
        let err = GgufFile::from_bytes("h.gguf", bytes, GgufLimits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::MetadataLimit { .. } | FormatError::Truncated { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("claims.huge"), "{err}");
    }
    assert!(t.elapsed().as_millis() < 2000);
}

#[test]
fn a_directory_is_named_as_one() {
    let dir = std::env::temp_dir();
    let msg = GgufFile::open(&dir).unwrap_err().to_string();
    assert!(msg.contains("is a directory"), "{msg}");
    assert!(msg.contains(".gguf file"), "{msg}");
}
