//! Memory-mapped safetensors reader.
//!
//! The header is parsed and validated by the `safetensors` crate; tensor data
//! is read straight out of the mapping.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Dtype, Metadata, SafeTensorError, SafeTensors};
use memmap2::Mmap;
use rlx_ir::DType;

use crate::error::FormatError;

/// One tensor's entry in the header.
#[derive(Debug, Clone)]
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// A memory-mapped safetensors file.
///
/// The file must not be modified or truncated while it is open: the mapping
/// reflects the file's contents, and changing them underneath it is the
/// caller's responsibility (on Linux a truncation can raise `SIGBUS`).
#[derive(Debug)]
pub struct SafeTensorsFile {
    path: PathBuf,
    map: Mmap,
    /// Names in file (data offset) order.
    names: Vec<String>,
    entries: HashMap<String, Entry>,
}

impl SafeTensorsFile {
    /// Opens and memory-maps `path` and validates its header: the JSON must
    /// parse, offsets must be contiguous and match each tensor's shape and
    /// dtype, and the data section must end exactly at the end of the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        if file_len < 8 {
            return Err(FormatError::Truncated {
                path,
                what: "safetensors header length".into(),
                offset: 0,
                needed: 8,
                file_len,
            });
        }
        // SAFETY: the file is opened read-only and the mapping is immutable
        // (`Mmap`, not `MmapMut`); we never hand out mutable access. Another
        // process modifying or truncating the file while it is mapped would
        // change the bytes we read (or fault), which is documented on
        // `SafeTensorsFile` as the caller's responsibility.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let buf: &[u8] = &map;
        // The file may have changed since `metadata()`: use the mapped length.
        let file_len = buf.len() as u64;
        if file_len < 8 {
            return Err(FormatError::Truncated {
                path,
                what: "safetensors header length".into(),
                offset: 0,
                needed: 8,
                file_len,
            });
        }
        let header_len = u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8]));
        if header_len > file_len - 8 {
            return Err(FormatError::Truncated {
                path,
                what: format!("safetensors JSON header of {header_len} bytes"),
                offset: 8,
                needed: header_len,
                file_len,
            });
        }
        let (n, metadata) = match SafeTensors::read_metadata(buf) {
            Ok(v) => v,
            Err(e) => return Err(header_error(&path, buf, header_len, e)),
        };
        let data_start = 8 + n;
        let (names, entries) = collect_entries(&metadata, data_start);
        Ok(SafeTensorsFile {
            path,
            map,
            names,
            entries,
        })
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names in file order.
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the file holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether a tensor named `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The dtype and shape of `name`. `None` if the tensor is missing or its
    /// dtype has no [`DType`] equivalent (see [`Self::dtype_name`]).
    pub fn info(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let e = self.entries.get(name)?;
        Some((to_dtype(e.dtype)?, e.shape.clone()))
    }

    /// The safetensors dtype name of `name` (e.g. `"F32"`, `"F64"`), for any
    /// dtype including those without a [`DType`] equivalent.
    pub fn dtype_name(&self, name: &str) -> Option<String> {
        self.entries.get(name).map(|e| format!("{:?}", e.dtype))
    }

    /// The raw little-endian bytes of `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], FormatError> {
        let e = self.entry(name)?;
        Ok(&self.map[e.start..e.end])
    }

    /// Reads `name` as f32, checking that its shape equals `expected_dims`.
    ///
    /// F32 data is borrowed from the mapping without copying when it is
    /// 4-byte aligned (and the target is little-endian), copied otherwise;
    /// F16 and BF16 are converted exactly. Other dtypes are an error.
    pub fn tensor_f32(
        &self,
        name: &str,
        expected_dims: &[usize],
    ) -> Result<Cow<'_, [f32]>, FormatError> {
        let e = self.checked(name, expected_dims)?;
        let bytes = &self.map[e.start..e.end];
        match e.dtype {
            Dtype::F32 => {
                if let Some(s) = cast_slice_f32(bytes) {
                    return Ok(Cow::Borrowed(s));
                }
                Ok(Cow::Owned(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ))
            }
            Dtype::F16 => Ok(Cow::Owned(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                    .collect(),
            )),
            Dtype::BF16 => Ok(Cow::Owned(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                    .collect(),
            )),
            other => Err(self.wrong_dtype(name, "F32, F16 or BF16", other)),
        }
    }

    /// Reads `name` as i64, checking that its shape equals `expected_dims`.
    ///
    /// I64 data is borrowed without copying when 8-byte aligned (little-endian
    /// target), copied otherwise; I32 is widened. Other dtypes are an error.
    pub fn tensor_i64(
        &self,
        name: &str,
        expected_dims: &[usize],
    ) -> Result<Cow<'_, [i64]>, FormatError> {
        let e = self.checked(name, expected_dims)?;
        let bytes = &self.map[e.start..e.end];
        match e.dtype {
            Dtype::I64 => {
                if let Some(s) = cast_slice_i64(bytes) {
                    return Ok(Cow::Borrowed(s));
                }
                Ok(Cow::Owned(
                    bytes
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                        .collect(),
                ))
            }
            Dtype::I32 => Ok(Cow::Owned(
                bytes
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                    .collect(),
            )),
            other => Err(self.wrong_dtype(name, "I64 or I32", other)),
        }
    }

    fn entry(&self, name: &str) -> Result<&Entry, FormatError> {
        self.entries
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
                count: self.names.len(),
            })
    }

    fn checked(&self, name: &str, expected_dims: &[usize]) -> Result<&Entry, FormatError> {
        let e = self.entry(name)?;
        if e.shape != expected_dims {
            return Err(FormatError::WrongShape {
                path: self.path.clone(),
                name: name.to_string(),
                expected: expected_dims.to_vec(),
                found: e.shape.clone(),
            });
        }
        Ok(e)
    }

    fn wrong_dtype(&self, name: &str, expected: &str, found: Dtype) -> FormatError {
        FormatError::WrongDtype {
            path: self.path.clone(),
            name: name.to_string(),
            expected: expected.to_string(),
            found: format!("{found:?}"),
        }
    }
}

fn to_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn collect_entries(
    metadata: &Metadata,
    data_start: usize,
) -> (Vec<String>, HashMap<String, Entry>) {
    let mut list: Vec<(String, Entry)> = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let (s, e) = info.data_offsets;
            let entry = Entry {
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: data_start + s,
                end: data_start + e,
            };
            (name, entry)
        })
        .collect();
    list.sort_by(|a, b| (a.1.start, &a.0).cmp(&(b.1.start, &b.0)));
    let names = list.iter().map(|(n, _)| n.clone()).collect();
    (names, list.into_iter().collect())
}

/// Turns a `safetensors` header error into a [`FormatError`] naming the file.
fn header_error(path: &Path, buf: &[u8], header_len: u64, e: SafeTensorError) -> FormatError {
    let corrupt = |reason: String| FormatError::CorruptHeader {
        path: path.to_path_buf(),
        reason,
    };
    match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            // Find the data size the header declares, for the message.
            let header = &buf[8..8 + header_len as usize];
            let declared = serde_json::from_slice::<serde_json::Value>(header)
                .ok()
                .and_then(|v| {
                    v.as_object().map(|o| {
                        o.values()
                            .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
                            .max()
                            .unwrap_or(0)
                    })
                })
                .unwrap_or(0);
            let needed = 8 + header_len + declared;
            if needed > buf.len() as u64 {
                FormatError::Truncated {
                    path: path.to_path_buf(),
                    what: format!("tensor data of {declared} bytes declared by the header"),
                    offset: 8 + header_len,
                    needed: declared,
                    file_len: buf.len() as u64,
                }
            } else {
                corrupt(format!(
                    "header declares {declared} data bytes but the file has {} after the header",
                    buf.len() as u64 - 8 - header_len
                ))
            }
        }
        SafeTensorError::InvalidHeader => corrupt("header is not valid UTF-8".into()),
        SafeTensorError::InvalidHeaderStart => corrupt("header does not start with '{'".into()),
        SafeTensorError::InvalidHeaderDeserialization => {
            corrupt("header is not valid safetensors JSON".into())
        }
        SafeTensorError::HeaderTooLarge => corrupt(format!(
            "header length {header_len} exceeds the 100 MB limit"
        )),
        SafeTensorError::InvalidOffset(name) => corrupt(format!(
            "tensor `{name}` has data offsets that are not contiguous"
        )),
        SafeTensorError::TensorInvalidInfo => {
            corrupt("a tensor's byte size does not match its shape and dtype".into())
        }
        SafeTensorError::ValidationOverflow => {
            corrupt("a tensor's shape or byte size overflows".into())
        }
        other => corrupt(format!("{other:?}")),
    }
}

/// Reinterprets `bytes` as f32 if aligned and the target is little-endian.
fn cast_slice_f32(bytes: &[u8]) -> Option<&[f32]> {
    if cfg!(target_endian = "big") || bytes.as_ptr() as usize % std::mem::align_of::<f32>() != 0 {
        return None;
    }
    // SAFETY: the pointer is 4-byte aligned (checked above), the length is
    // `bytes.len() / 4` whole f32s within `bytes`, every bit pattern is a
    // valid f32, the target is little-endian like the file, and the returned
    // slice borrows `bytes` so it cannot outlive the (immutable) mapping.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), bytes.len() / 4) })
}

/// Reinterprets `bytes` as i64 if aligned and the target is little-endian.
fn cast_slice_i64(bytes: &[u8]) -> Option<&[i64]> {
    if cfg!(target_endian = "big") || bytes.as_ptr() as usize % std::mem::align_of::<i64>() != 0 {
        return None;
    }
    // SAFETY: the pointer is 8-byte aligned (checked above), the length is
    // `bytes.len() / 8` whole i64s within `bytes`, every bit pattern is a
    // valid i64, the target is little-endian like the file, and the returned
    // slice borrows `bytes` so it cannot outlive the (immutable) mapping.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i64>(), bytes.len() / 8) })
}
