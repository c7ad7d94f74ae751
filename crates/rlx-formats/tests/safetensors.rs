//! safetensors reader tests on hand-built files.

mod common;

use std::borrow::Cow;

use common::tmp_file;
use rlx_formats::{FormatError, SafeTensorsFile};
use rlx_ir::DType;

/// Builds a safetensors file: 8-byte LE header length, JSON header padded
/// with spaces to a multiple of 8 bytes, then `data`.
fn build(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A file with an aligned F32, an F16, a BF16, an I64, an I32 and an F64.
fn sample() -> Vec<u8> {
    let w: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let mut data = f32_bytes(&w); // 0..24
    for x in [1.0f32, -2.0, 0.5, 65504.0] {
        data.extend_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes());
        // 24..32
    }
    for x in [3.0f32, -0.15625] {
        data.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
        // 32..36
    }
    data.extend_from_slice(&[0; 4]); // pad 36..40 (part of a U8 tensor)
    for x in [0i64, 7, -3] {
        data.extend_from_slice(&x.to_le_bytes()); // 40..64
    }
    for x in [5i32, -6] {
        data.extend_from_slice(&x.to_le_bytes()); // 64..72
    }
    data.extend_from_slice(&1.5f64.to_le_bytes()); // 72..80
    let header = r#"{"__metadata__":{"format":"pt"},
        "w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},
        "h":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},
        "b":{"dtype":"BF16","shape":[2],"data_offsets":[32,36]},
        "pad":{"dtype":"U8","shape":[4],"data_offsets":[36,40]},
        "ids":{"dtype":"I64","shape":[1,3],"data_offsets":[40,64]},
        "i32":{"dtype":"I32","shape":[2],"data_offsets":[64,72]},
        "d":{"dtype":"F64","shape":[],"data_offsets":[72,80]}}"#;
    build(header, &data)
}

#[test]
fn reads_tensors_of_every_supported_dtype() {
    let path = tmp_file("sample.safetensors", &sample());
    let f = SafeTensorsFile::open(&path).unwrap();
    assert_eq!(f.names(), vec!["w", "h", "b", "pad", "ids", "i32", "d"]);
    assert_eq!(f.len(), 7);
    assert_eq!(f.info("w"), Some((DType::F32, vec![2, 3])));
    assert_eq!(f.info("ids"), Some((DType::I64, vec![1, 3])));
    assert_eq!(f.info("pad"), Some((DType::U8, vec![4])));
    assert_eq!(f.info("d"), None, "F64 has no rlx DType");
    assert_eq!(f.dtype_name("d").as_deref(), Some("F64"));
    assert_eq!(f.info("nope"), None);

    let w = f.tensor_f32("w", &[2, 3]).unwrap();
    assert!(
        matches!(w, Cow::Borrowed(_)),
        "aligned f32 must be zero-copy"
    );
    assert_eq!(&*w, &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
    assert_eq!(
        &*f.tensor_f32("h", &[4]).unwrap(),
        &[1.0, -2.0, 0.5, 65504.0]
    );
    assert_eq!(&*f.tensor_f32("b", &[2]).unwrap(), &[3.0, -0.15625]);
    let ids = f.tensor_i64("ids", &[1, 3]).unwrap();
    assert!(
        matches!(ids, Cow::Borrowed(_)),
        "aligned i64 must be zero-copy"
    );
    assert_eq!(&*ids, &[0, 7, -3]);
    assert_eq!(&*f.tensor_i64("i32", &[2]).unwrap(), &[5, -6]);
    assert_eq!(f.tensor_bytes("pad").unwrap(), &[0, 0, 0, 0]);
}

#[test]
fn unaligned_f32_is_copied_correctly() {
    let vals = [1.25f32, -7.5, 3.0];
    let mut data = vec![9u8];
    data.extend(f32_bytes(&vals));
    let header = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
        "y":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}}"#;
    let path = tmp_file("unaligned.safetensors", &build(header, &data));
    let f = SafeTensorsFile::open(&path).unwrap();
    let y = f.tensor_f32("y", &[3]).unwrap();
    assert!(matches!(y, Cow::Owned(_)));
    assert_eq!(&*y, &vals);
}

#[test]
fn wrong_shape_names_tensor_and_shapes() {
    let path = tmp_file("shape.safetensors", &sample());
    let f = SafeTensorsFile::open(&path).unwrap();
    match f.tensor_f32("w", &[3, 2]) {
        Err(FormatError::WrongShape {
            name,
            expected,
            found,
            ..
        }) => {
            assert_eq!(name, "w");
            assert_eq!(expected, vec![3, 2]);
            assert_eq!(found, vec![2, 3]);
        }
        other => panic!("expected WrongShape, got {other:?}"),
    }
    let msg = f.tensor_f32("w", &[6]).unwrap_err().to_string();
    assert!(
        msg.contains("shape.safetensors")
            && msg.contains("`w`")
            && msg.contains("[2, 3]")
            && msg.contains("[6]"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_and_wrong_dtype_are_errors() {
    let path = tmp_file("missing.safetensors", &sample());
    let f = SafeTensorsFile::open(&path).unwrap();
    let e = f.tensor_f32("encoder.nope", &[1]).unwrap_err();
    assert!(
        matches!(e, FormatError::MissingTensor { ref name, count: 7, .. } if name == "encoder.nope")
    );
    assert!(e.to_string().contains("encoder.nope"));
    match f.tensor_f32("ids", &[1, 3]) {
        Err(FormatError::WrongDtype { name, found, .. }) => {
            assert_eq!(name, "ids");
            assert_eq!(found, "I64");
        }
        other => panic!("expected WrongDtype, got {other:?}"),
    }
    assert!(matches!(
        f.tensor_i64("w", &[2, 3]),
        Err(FormatError::WrongDtype { .. })
    ));
    assert!(matches!(
        f.tensor_f32("d", &[]),
        Err(FormatError::WrongDtype { .. })
    ));
}

#[test]
fn truncated_files_are_errors() {
    let full = sample();
    // Every strict prefix must fail to open, without panicking.
    for len in 0..full.len() {
        let path = tmp_file("trunc.safetensors", &full[..len]);
        let e = SafeTensorsFile::open(&path).expect_err("prefix must not open");
        assert!(
            matches!(
                e,
                FormatError::Truncated { .. } | FormatError::CorruptHeader { .. }
            ),
            "len {len}: {e:?}"
        );
        let _ = std::fs::remove_file(&path);
    }
    // Cut inside the data section: reported as truncated with the declared size.
    let path = tmp_file("trunc-data.safetensors", &full[..full.len() - 1]);
    match SafeTensorsFile::open(&path) {
        Err(FormatError::Truncated {
            needed, file_len, ..
        }) => {
            assert_eq!(needed, 80);
            assert_eq!(file_len, full.len() as u64 - 1);
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    for bytes in [&[][..], &[1, 2, 3][..]] {
        let path = tmp_file("tiny.safetensors", bytes);
        assert!(matches!(
            SafeTensorsFile::open(&path),
            Err(FormatError::Truncated { .. })
        ));
    }
}

#[test]
fn header_length_larger_than_file_is_an_error() {
    for claimed in [100u64, u64::MAX, 1 << 40] {
        let mut bytes = claimed.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}      ");
        let path = tmp_file("hlen.safetensors", &bytes);
        match SafeTensorsFile::open(&path) {
            Err(FormatError::Truncated { needed, .. }) => assert_eq!(needed, claimed),
            other => panic!("claimed {claimed}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn garbage_and_inconsistent_headers_are_errors() {
    let cases: [(&str, &[u8]); 6] = [
        ("not json", &build("this is not json", &[])),
        ("binary", &{
            let mut b = 8u64.to_le_bytes().to_vec();
            b.extend_from_slice(&[0xff, 0xfe, 0, 1, 2, 3, 4, 5]);
            b
        }),
        (
            "bad dtype",
            &build(
                r#"{"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 4],
            ),
        ),
        (
            "size mismatch",
            &build(
                r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                &[0; 4],
            ),
        ),
        (
            "gap",
            &build(
                r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "trailing bytes",
            &build(
                r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 12],
            ),
        ),
    ];
    for (what, bytes) in cases {
        let path = tmp_file("garbage.safetensors", bytes);
        match SafeTensorsFile::open(&path) {
            Err(e @ FormatError::CorruptHeader { .. }) => {
                assert!(e.to_string().contains("garbage.safetensors"), "{what}: {e}")
            }
            other => panic!("{what}: expected CorruptHeader, got {other:?}"),
        }
    }
    let overflow = build(
        r#"{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    let path = tmp_file("overflow.safetensors", &overflow);
    assert!(SafeTensorsFile::open(&path).is_err());
}

#[test]
fn missing_file_is_an_io_error() {
    let e = SafeTensorsFile::open("/nonexistent/dir/model.safetensors").unwrap_err();
    assert!(matches!(e, FormatError::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/dir/model.safetensors"));
}
