//! Memory-mapped GGUF reader (versions 2 and 3, little-endian).
//!
//! File layout: magic `GGUF`, `version: u32`, `tensor_count: u64`,
//! `metadata_kv_count: u64`, the metadata key/value pairs, the tensor infos
//! (`name`, `n_dims: u32`, `dims: u64[n_dims]`, `type: u32`, `offset: u64`),
//! padding to `general.alignment` (default 32), then the data section. Tensor
//! offsets are relative to the start of the data section.
//!
//! GGUF lists dims innermost-first: `dims[0]` (ggml's `ne[0]`) is the row
//! length K. [`GgufTensorInfo::shape`] gives the row-major (outermost-first)
//! shape.
//!
//! Every count and size in the file is untrusted: reads are bounds-checked,
//! arithmetic is checked, and nothing is preallocated from a declared count
//! beyond what the remaining bytes could hold.
//!
//! Metadata arrays are not decoded at open: a [`GgufArray`] is a view of its
//! bytes in the mapping (element type, count, byte range), so parsing costs
//! O(1) memory per array whatever its length. Elements are decoded when
//! read. [`GgufLimits`] bounds array lengths and the total metadata size;
//! a file past them is a [`FormatError::MetadataLimit`] naming the key.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::FormatError;
pub use crate::ggml_type::GgmlType;
use crate::quant;

/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Maximum tensor rank in ggml.
pub const MAX_DIMS: u32 = 4;

/// Maximum nesting depth of metadata arrays.
const MAX_ARRAY_DEPTH: usize = 16;

/// Bounds on the metadata a [`GgufFile`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufLimits {
    /// Most elements in one metadata array (nested arrays count each level).
    pub max_array_len: u64,
    /// Most bytes of the whole metadata section (keys, types and values).
    pub max_metadata_bytes: u64,
}

impl Default for GgufLimits {
    /// 256 Mi elements per array (vocabularies are ~50k-260k tokens; arrays
    /// are views of the file, so a long one costs no memory) and 512 MiB of
    /// metadata.
    fn default() -> Self {
        GgufLimits {
            max_array_len: 1 << 28,
            max_metadata_bytes: 512 << 20,
        }
    }
}

/// The bytes a [`GgufFile`] reads: a memory map or an owned buffer.
enum Backing {
    Map(Mmap),
    Bytes(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Bytes(b) => b,
        }
    }
}

impl fmt::Debug for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backing::Map(m) => write!(f, "Mmap({} bytes)", m.len()),
            Backing::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
        }
    }
}

/// The type of a GGUF metadata value. The discriminant is the file's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgufValueType {
    /// `u8`.
    U8 = 0,
    /// `i8`.
    I8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i16`.
    I16 = 3,
    /// `u32`.
    U32 = 4,
    /// `i32`.
    I32 = 5,
    /// `f32`.
    F32 = 6,
    /// Boolean (one byte).
    Bool = 7,
    /// Length-prefixed UTF-8 string.
    String = 8,
    /// Typed array.
    Array = 9,
    /// `u64`.
    U64 = 10,
    /// `i64`.
    I64 = 11,
    /// `f64`.
    F64 = 12,
}

impl GgufValueType {
    /// The type with file id `id`.
    pub fn from_id(id: u32) -> Option<GgufValueType> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case name used in error messages.
    pub fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The size of one value of a fixed-size type (`None` for strings and
    /// arrays).
    pub fn fixed_size(self) -> Option<usize> {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f32`.
    F32(f32),
    /// `f64`.
    F64(f64),
    /// Boolean (any nonzero byte is `true`).
    Bool(bool),
    /// String. Invalid UTF-8 is replaced with U+FFFD.
    String(String),
    /// Array of values of one type (possibly nested arrays).
    Array(GgufArray),
}

/// A metadata array: every element has type `elem_type`.
///
/// A view of the array's bytes in the file (kept alive by a shared handle
/// to the mapping): opening a file never copies or decodes array elements,
/// [`get`](Self::get) and [`iter`](Self::iter) decode them on demand. The
/// bytes were validated at open, so decoding cannot fail.
#[derive(Clone)]
pub struct GgufArray {
    /// Element type.
    pub elem_type: GgufValueType,
    len: usize,
    /// Byte range of the elements in `data`.
    start: usize,
    end: usize,
    data: Arc<Backing>,
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements' bytes as stored (little-endian scalars, or
    /// length-prefixed strings, or nested array headers and payloads).
    pub fn raw_bytes(&self) -> &[u8] {
        &self.data.bytes()[self.start..self.end]
    }

    /// Element `i`, decoded (`O(1)` for fixed-size elements, `O(i)` for
    /// strings and nested arrays).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        if i >= self.len {
            return None;
        }
        match self.elem_type.fixed_size() {
            Some(w) => {
                let at = self.start + i * w;
                decode_scalar(self.elem_type, self.data.bytes().get(at..at + w)?)
            }
            None => self.iter().nth(i),
        }
    }

    /// The elements in order, decoded one at a time.
    pub fn iter(&self) -> GgufArrayIter<'_> {
        GgufArrayIter {
            array: self,
            pos: self.start,
            left: self.len,
        }
    }

    /// Every element decoded into a `Vec` (allocates one [`GgufValue`] per
    /// element: prefer [`iter`](Self::iter) or the typed getters of
    /// [`GgufFile`] for long arrays).
    pub fn values(&self) -> Vec<GgufValue> {
        self.iter().collect()
    }

    /// The strings of a string array (`None` for another element type);
    /// invalid UTF-8 is replaced with U+FFFD.
    pub fn strings(&self) -> Option<impl Iterator<Item = Cow<'_, str>>> {
        if self.elem_type != GgufValueType::String {
            return None;
        }
        let bytes = self.data.bytes();
        let mut pos = self.start;
        let mut left = self.len;
        Some(std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let (s, next) = read_str(bytes, pos)?;
            pos = next;
            Some(String::from_utf8_lossy(s))
        }))
    }
}

impl fmt::Debug for GgufArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for v in self.iter().take(16) {
            l.entry(&v);
        }
        if self.len > 16 {
            l.entry(&format_args!(
                "... {} elements of {}",
                self.len, self.elem_type
            ));
        }
        l.finish()
    }
}

impl PartialEq for GgufArray {
    fn eq(&self, other: &Self) -> bool {
        self.elem_type == other.elem_type
            && self.len == other.len
            && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

/// Iterator over the decoded elements of a [`GgufArray`].
#[derive(Debug)]
pub struct GgufArrayIter<'a> {
    array: &'a GgufArray,
    pos: usize,
    left: usize,
}

impl Iterator for GgufArrayIter<'_> {
    type Item = GgufValue;

    fn next(&mut self) -> Option<GgufValue> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let a = self.array;
        let bytes = a.data.bytes();
        let (v, next) = decode_at(&a.data, bytes, a.elem_type, self.pos)?;
        self.pos = next;
        Some(v)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// A fixed-size scalar from exactly its bytes.
fn decode_scalar(ty: GgufValueType, b: &[u8]) -> Option<GgufValue> {
    use GgufValueType as T;
    Some(match ty {
        T::U8 => GgufValue::U8(b[0]),
        T::I8 => GgufValue::I8(b[0] as i8),
        T::Bool => GgufValue::Bool(b[0] != 0),
        T::U16 => GgufValue::U16(u16::from_le_bytes(b.try_into().ok()?)),
        T::I16 => GgufValue::I16(i16::from_le_bytes(b.try_into().ok()?)),
        T::U32 => GgufValue::U32(u32::from_le_bytes(b.try_into().ok()?)),
        T::I32 => GgufValue::I32(i32::from_le_bytes(b.try_into().ok()?)),
        T::F32 => GgufValue::F32(f32::from_le_bytes(b.try_into().ok()?)),
        T::U64 => GgufValue::U64(u64::from_le_bytes(b.try_into().ok()?)),
        T::I64 => GgufValue::I64(i64::from_le_bytes(b.try_into().ok()?)),
        T::F64 => GgufValue::F64(f64::from_le_bytes(b.try_into().ok()?)),
        T::String | T::Array => return None,
    })
}

/// A length-prefixed string at `pos`, and the position after it.
fn read_str(bytes: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let len = u64::from_le_bytes(bytes.get(pos..pos.checked_add(8)?)?.try_into().ok()?);
    let start = pos + 8;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    Some((bytes.get(start..end)?, end))
}

/// The value of type `ty` at `pos` (validated at open), and the position
/// after it.
fn decode_at(
    data: &Arc<Backing>,
    bytes: &[u8],
    ty: GgufValueType,
    pos: usize,
) -> Option<(GgufValue, usize)> {
    match ty {
        GgufValueType::String => {
            let (s, next) = read_str(bytes, pos)?;
            Some((
                GgufValue::String(String::from_utf8_lossy(s).into_owned()),
                next,
            ))
        }
        GgufValueType::Array => {
            let id = u32::from_le_bytes(bytes.get(pos..pos + 4)?.try_into().ok()?);
            let elem_type = GgufValueType::from_id(id)?;
            let count = u64::from_le_bytes(bytes.get(pos + 4..pos + 12)?.try_into().ok()?);
            let len = usize::try_from(count).ok()?;
            let start = pos + 12;
            let end = skip_elems(bytes, elem_type, len, start, 0)?;
            let a = GgufArray {
                elem_type,
                len,
                start,
                end,
                data: data.clone(),
            };
            Some((GgufValue::Array(a), end))
        }
        _ => {
            let w = ty.fixed_size()?;
            let v = decode_scalar(ty, bytes.get(pos..pos.checked_add(w)?)?)?;
            Some((v, pos + w))
        }
    }
}

/// The end of `count` validated elements of `ty` starting at `pos`.
fn skip_elems(
    bytes: &[u8],
    ty: GgufValueType,
    count: usize,
    mut pos: usize,
    depth: usize,
) -> Option<usize> {
    if let Some(w) = ty.fixed_size() {
        return pos.checked_add(count.checked_mul(w)?);
    }
    if depth > MAX_ARRAY_DEPTH {
        return None;
    }
    for _ in 0..count {
        pos = match ty {
            GgufValueType::String => read_str(bytes, pos)?.1,
            _ => {
                let id = u32::from_le_bytes(bytes.get(pos..pos + 4)?.try_into().ok()?);
                let n = u64::from_le_bytes(bytes.get(pos + 4..pos + 12)?.try_into().ok()?);
                skip_elems(
                    bytes,
                    GgufValueType::from_id(id)?,
                    usize::try_from(n).ok()?,
                    pos + 12,
                    depth + 1,
                )?
            }
        };
    }
    Some(pos)
}

impl GgufValue {
    /// The value's type.
    pub fn value_type(&self) -> GgufValueType {
        use GgufValue as V;
        use GgufValueType as T;
        match self {
            V::U8(_) => T::U8,
            V::I8(_) => T::I8,
            V::U16(_) => T::U16,
            V::I16(_) => T::I16,
            V::U32(_) => T::U32,
            V::I32(_) => T::I32,
            V::U64(_) => T::U64,
            V::I64(_) => T::I64,
            V::F32(_) => T::F32,
            V::F64(_) => T::F64,
            V::Bool(_) => T::Bool,
            V::String(_) => T::String,
            V::Array(_) => T::Array,
        }
    }

    /// A description of the type for error messages, e.g. `u32` or
    /// `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("array of {}", a.elem_type),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as `u64` if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        use GgufValue as V;
        match *self {
            V::U8(v) => Some(v as u64),
            V::U16(v) => Some(v as u64),
            V::U32(v) => Some(v as u64),
            V::U64(v) => Some(v),
            V::I8(v) => u64::try_from(v).ok(),
            V::I16(v) => u64::try_from(v).ok(),
            V::I32(v) => u64::try_from(v).ok(),
            V::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as `i64` if it is an integer of any width that fits.
    pub fn as_i64(&self) -> Option<i64> {
        use GgufValue as V;
        match *self {
            V::U8(v) => Some(v as i64),
            V::U16(v) => Some(v as i64),
            V::U32(v) => Some(v as i64),
            V::U64(v) => i64::try_from(v).ok(),
            V::I8(v) => Some(v as i64),
            V::I16(v) => Some(v as i64),
            V::I32(v) => Some(v as i64),
            V::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as `f64` if it is `f32` or `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, if this is an array.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's entry in the GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// Tensor name.
    pub name: String,
    /// Dims innermost-first, as stored (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    /// Element / block type.
    pub ggml_type: GgmlType,
    /// Offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Total elements (product of `dims`).
    pub n_elements: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// The row-major shape (outermost-first): `dims` reversed.
    pub fn shape(&self) -> Vec<usize> {
        // Each dim divides n_elements, which was checked to fit usize.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Row length (`dims[0]`), or 1 for a rank-0 (scalar) tensor.
    pub fn row_len(&self) -> usize {
        self.dims.first().map_or(1, |&d| d as usize)
    }

    /// Number of rows (`n_elements / row_len`).
    pub fn n_rows(&self) -> usize {
        match self.row_len() {
            0 => 0,
            k => self.n_elements as usize / k,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        // row_len is a multiple of the block size and its byte size fits
        // (both checked at open).
        self.row_len() / self.ggml_type.block_elems() * self.ggml_type.block_bytes()
    }
}

/// A memory-mapped GGUF file.
///
/// The file must not be modified or truncated while it is open: the mapping
/// reflects the file's contents, and changing them underneath it is the
/// caller's responsibility (on Linux a truncation can raise `SIGBUS`).
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Backing>,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

/// Bounded little-endian reader over the mapped bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// The backing of `buf`, shared with the arrays parsed.
    data: &'a Arc<Backing>,
    limits: GgufLimits,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], FormatError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(FormatError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.buf.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], FormatError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let len = self.u64(&|| format!("{} (string length)", what()))?;
        if len > self.limits.max_metadata_bytes {
            return Err(FormatError::MetadataLimit {
                path: self.path.to_path_buf(),
                key: what(),
                what: format!("a string of {len} bytes"),
                limit: format!(
                    "at most {} bytes of metadata",
                    self.limits.max_metadata_bytes
                ),
            });
        }
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(
        &mut self,
        ty: GgufValueType,
        key: &str,
        depth: usize,
    ) -> Result<GgufValue, FormatError> {
        let what = || format!("value of metadata key `{key}`");
        use GgufValueType as T;
        Ok(match ty {
            T::U8 => GgufValue::U8(self.array::<1>(&what)?[0]),
            T::I8 => GgufValue::I8(self.array::<1>(&what)?[0] as i8),
            T::Bool => GgufValue::Bool(self.array::<1>(&what)?[0] != 0),
            T::U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            T::I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            T::U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            T::I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            T::F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            T::U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            T::I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            T::F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            T::String => GgufValue::String(self.string(&what)?),
            T::Array => GgufValue::Array(self.array_value(key, depth)?),
        })
    }
}

impl Cursor<'_> {
    /// An array header at the cursor, and the array's elements skipped
    /// (validated, not decoded): O(1) memory whatever the count.
    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufArray, FormatError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(FormatError::CorruptHeader {
                path: self.path.to_path_buf(),
                reason: format!(
                    "metadata key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                ),
            });
        }
        let type_id = self.u32(&|| format!("array element type of `{key}`"))?;
        let elem_type =
            GgufValueType::from_id(type_id).ok_or_else(|| FormatError::UnknownValueType {
                path: self.path.to_path_buf(),
                key: key.to_string(),
                type_id,
            })?;
        let count = self.u64(&|| format!("array length of `{key}`"))?;
        if count > self.limits.max_array_len {
            return Err(FormatError::MetadataLimit {
                path: self.path.to_path_buf(),
                key: key.to_string(),
                what: format!("array of {elem_type} with {count} elements"),
                limit: format!("at most {} elements per array", self.limits.max_array_len),
            });
        }
        let start = self.pos;
        match elem_type.fixed_size() {
            Some(w) => {
                // checked: count <= max_array_len, w <= 8.
                let bytes = count.saturating_mul(w as u64);
                self.take(bytes, &|| {
                    format!("{count} {elem_type} elements of array `{key}`")
                })?;
            }
            None => {
                for i in 0..count {
                    match elem_type {
                        GgufValueType::String => {
                            let len =
                                self.u64(&|| format!("length of string #{i} of array `{key}`"))?;
                            self.take(len, &|| format!("string #{i} of array `{key}`"))?;
                        }
                        _ => {
                            self.array_value(key, depth + 1)?;
                        }
                    }
                }
            }
        }
        Ok(GgufArray {
            elem_type,
            len: count as usize,
            start,
            end: self.pos,
            data: self.data.clone(),
        })
    }
}

impl GgufFile {
    /// Opens and memory-maps `path` with the default [`GgufLimits`]; see
    /// [`GgufFile::open_with_limits`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        Self::open_with_limits(path, GgufLimits::default())
    }

    /// Parses a GGUF image held in memory (`name` is used in errors). The
    /// same checks as [`GgufFile::open`]; tensor data is read from `bytes`.
    pub fn from_bytes(
        name: impl Into<PathBuf>,
        bytes: Vec<u8>,
        limits: GgufLimits,
    ) -> Result<Self, FormatError> {
        Self::from_backing(name.into(), Arc::new(Backing::Bytes(bytes)), limits)
    }

    fn from_backing(
        path: PathBuf,
        map: Arc<Backing>,
        limits: GgufLimits,
    ) -> Result<Self, FormatError> {
        let parsed = parse(&path, &map, limits)?;
        Ok(GgufFile {
            path,
            map,
            version: parsed.version,
            metadata: parsed.metadata,
            metadata_index: parsed.metadata_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        })
    }

    /// Opens and memory-maps `path`, parsing and validating the header,
    /// metadata and tensor infos. Every tensor's type must be known, its row
    /// length a whole number of blocks, its offset aligned, and its data
    /// inside the file. Metadata past `limits` is a
    /// [`FormatError::MetadataLimit`] naming the key; a directory is a
    /// [`FormatError::NotAFile`].
    pub fn open_with_limits(
        path: impl AsRef<Path>,
        limits: GgufLimits,
    ) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        if path.is_dir() {
            return Err(FormatError::NotAFile {
                path,
                expected: "a .gguf file".into(),
            });
        }
        let io = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        if file_len < 4 {
            return Err(FormatError::Truncated {
                path,
                what: "GGUF magic".into(),
                offset: 0,
                needed: 4,
                file_len,
            });
        }
        // SAFETY: the file is opened read-only and the mapping is immutable
        // (`Mmap`, not `MmapMut`); we never hand out mutable access. Another
        // process modifying or truncating the file while it is mapped would
        // change the bytes we read (or fault), which is documented on
        // `GgufFile` as the caller's responsibility.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_backing(path, Arc::new(Backing::Map(map)), limits)
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_start
    }

    /// All metadata pairs in file order.
    pub fn metadata_entries(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The metadata value for `key`.
    pub fn metadata(&self, key: &str) -> Option<&GgufValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The metadata value for `key`, or a [`FormatError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&GgufValue, FormatError> {
        self.metadata(key).ok_or_else(|| FormatError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &GgufValue) -> FormatError {
        FormatError::WrongValueType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: found.type_description(),
        }
    }

    /// `key` as any non-negative integer type converted to `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize, FormatError> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| self.wrong_type(key, "non-negative integer", v))
    }

    /// `key` as `f32` or `f64`, converted to `f64`.
    pub fn get_float(&self, key: &str) -> Result<f64, FormatError> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| self.wrong_type(key, "f32 or f64", v))
    }

    /// The string at `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, FormatError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, "string", v))
    }

    /// The array at `key`.
    pub fn get_array(&self, key: &str) -> Result<&GgufArray, FormatError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong_type(key, "array", v))
    }

    /// The array of strings at `key` (borrowed from the mapping; invalid
    /// UTF-8 is replaced with U+FFFD).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<Cow<'_, str>>, FormatError> {
        let v = self.require(key)?;
        match v {
            GgufValue::Array(a) => match a.strings() {
                Some(it) => Ok(it.collect()),
                None => Err(self.wrong_type(key, "array of string", v)),
            },
            _ => Err(self.wrong_type(key, "array of string", v)),
        }
    }
}

/// Generates strict scalar getters.
macro_rules! scalar_getters {
    ($($(#[$doc:meta])* $fn:ident => $variant:ident : $t:ty, $name:literal;)*) => {
        impl GgufFile {
            $(
                $(#[$doc])*
                pub fn $fn(&self, key: &str) -> Result<$t, FormatError> {
                    match self.require(key)? {
                        GgufValue::$variant(v) => Ok(*v),
                        other => Err(self.wrong_type(key, $name, other)),
                    }
                }
            )*
        }
    };
}

scalar_getters! {
    /// The `u8` at `key` (no conversion from other types).
    get_u8 => U8: u8, "u8";
    /// The `i8` at `key` (no conversion from other types).
    get_i8 => I8: i8, "i8";
    /// The `u16` at `key` (no conversion from other types).
    get_u16 => U16: u16, "u16";
    /// The `i16` at `key` (no conversion from other types).
    get_i16 => I16: i16, "i16";
    /// The `u32` at `key` (no conversion from other types).
    get_u32 => U32: u32, "u32";
    /// The `i32` at `key` (no conversion from other types).
    get_i32 => I32: i32, "i32";
    /// The `u64` at `key` (no conversion from other types).
    get_u64 => U64: u64, "u64";
    /// The `i64` at `key` (no conversion from other types).
    get_i64 => I64: i64, "i64";
    /// The `f32` at `key` (no conversion from other types).
    get_f32 => F32: f32, "f32";
    /// The `f64` at `key` (no conversion from other types).
    get_f64 => F64: f64, "f64";
    /// The `bool` at `key` (no conversion from other types).
    get_bool => Bool: bool, "bool";
}

/// Generates strict typed-array getters.
macro_rules! array_getters {
    ($($(#[$doc:meta])* $fn:ident => $variant:ident : $t:ty, $name:literal;)*) => {
        impl GgufFile {
            $(
                $(#[$doc])*
                pub fn $fn(&self, key: &str) -> Result<Vec<$t>, FormatError> {
                    let v = self.require(key)?;
                    match v {
                        GgufValue::Array(a) if a.elem_type == GgufValueType::$variant => Ok(a
                            .raw_bytes()
                            .chunks_exact(std::mem::size_of::<$t>())
                            .map(|b| <$t>::from_le_bytes(b.try_into().expect("exact chunk")))
                            .collect()),
                        _ => Err(self.wrong_type(key, $name, v)),
                    }
                }
            )*
        }
    };
}

array_getters! {
    /// The array of `i32` at `key` (e.g. `tokenizer.ggml.token_type`).
    get_i32_array => I32: i32, "array of i32";
    /// The array of `u32` at `key`.
    get_u32_array => U32: u32, "array of u32";
    /// The array of `f32` at `key` (e.g. `tokenizer.ggml.scores`).
    get_f32_array => F32: f32, "array of f32";
}

impl GgufFile {
    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn require_tensor(&self, name: &str) -> Result<&GgufTensorInfo, FormatError> {
        self.tensor_info(name)
            .ok_or_else(|| FormatError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
                count: self.tensors.len(),
            })
    }

    /// The raw (possibly block-quantized) bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], FormatError> {
        let t = self.require_tensor(name)?;
        // Bounds were validated at open; `get` keeps this panic-free anyway.
        let start = self.data_start + t.offset;
        let end = start + t.n_bytes;
        self.map
            .bytes()
            .get(start as usize..end as usize)
            .ok_or_else(|| FormatError::TensorOutOfBounds {
                path: self.path.clone(),
                name: name.to_string(),
                start,
                size: t.n_bytes,
                file_len: self.map.bytes().len() as u64,
            })
    }

    /// Tensor `name` dequantized to f32, in row-major order (row `r` of
    /// length `dims[0]` is `[r * dims[0] .. (r + 1) * dims[0]]`).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, FormatError> {
        let t = self.require_tensor(name)?;
        let bytes = self.tensor_bytes(name)?;
        quant::dequantize_to_vec(t.ggml_type, bytes, t.n_elements as usize).map_err(|source| {
            FormatError::Dequant {
                path: self.path.clone(),
                name: name.to_string(),
                source,
            }
        })
    }

    /// Row `row` (of length `dims[0]`) of tensor `name`, dequantized to f32.
    pub fn tensor_row_f32(&self, name: &str, row: usize) -> Result<Vec<f32>, FormatError> {
        let t = self.require_tensor(name)?;
        if row >= t.n_rows() {
            return Err(FormatError::RowOutOfRange {
                path: self.path.clone(),
                name: name.to_string(),
                row,
                n_rows: t.n_rows(),
            });
        }
        let rb = t.row_bytes();
        let bytes = self.tensor_bytes(name)?;
        let row_bytes =
            bytes
                .get(row * rb..(row + 1) * rb)
                .ok_or_else(|| FormatError::RowOutOfRange {
                    path: self.path.clone(),
                    name: name.to_string(),
                    row,
                    n_rows: t.n_rows(),
                })?;
        quant::dequantize_to_vec(t.ggml_type, row_bytes, t.row_len()).map_err(|source| {
            FormatError::Dequant {
                path: self.path.clone(),
                name: name.to_string(),
                source,
            }
        })
    }
}

/// Everything parsed from the header.
struct Parsed {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

fn parse(path: &Path, data: &Arc<Backing>, limits: GgufLimits) -> Result<Parsed, FormatError> {
    let buf = data.bytes();
    let mut c = Cursor {
        buf,
        pos: 0,
        path,
        data,
        limits,
    };
    let corrupt = |reason: String| FormatError::CorruptHeader {
        path: path.to_path_buf(),
        reason,
    };
    let overflow = |what: String| FormatError::Overflow {
        path: path.to_path_buf(),
        what,
    };

    let magic: [u8; 4] = c.array(&|| "GGUF magic".into())?;
    if &magic != b"GGUF" {
        return Err(FormatError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    let version = c.u32(&|| "GGUF version".into())?;
    if version != 2 && version != 3 {
        return Err(FormatError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;

    // Metadata. Each pair needs at least 8 (key length) + 4 (type) + 1 bytes.
    let cap = (c.remaining() / 13).min(usize::try_from(n_kv).unwrap_or(usize::MAX));
    let mut metadata = Vec::with_capacity(cap);
    let mut metadata_index = HashMap::with_capacity(cap);
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let type_id = c.u32(&|| format!("value type of metadata key `{key}`"))?;
        let ty = GgufValueType::from_id(type_id).ok_or_else(|| FormatError::UnknownValueType {
            path: path.to_path_buf(),
            key: key.clone(),
            type_id,
        })?;
        let value = c.value(ty, &key, 0)?;
        if c.pos as u64 > limits.max_metadata_bytes {
            return Err(FormatError::MetadataLimit {
                path: path.to_path_buf(),
                key: key.clone(),
                what: format!("metadata ending at byte {}", c.pos),
                limit: format!("at most {} bytes of metadata", limits.max_metadata_bytes),
            });
        }
        if metadata_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(corrupt(format!("duplicate metadata key `{key}`")));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => match &metadata[i].1 {
            GgufValue::U32(a) if a.is_power_of_two() => *a as u64,
            other => {
                return Err(corrupt(format!(
                    "general.alignment must be a power-of-two u32, found {} {:?}",
                    other.type_description(),
                    other
                )))
            }
        },
    };

    // Tensor infos. Each needs at least 8 + 4 + 4 + 8 bytes.
    let cap = (c.remaining() / 24).min(usize::try_from(n_tensors).unwrap_or(usize::MAX));
    let mut tensors = Vec::with_capacity(cap);
    let mut tensor_index = HashMap::with_capacity(cap);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor info #{i}"))?;
        let n_dims = c.u32(&|| format!("rank of tensor `{name}`"))?;
        if n_dims > MAX_DIMS {
            return Err(corrupt(format!(
                "tensor `{name}` has {n_dims} dims, at most {MAX_DIMS} allowed"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&|| format!("dim {d} of tensor `{name}`"))?);
        }
        let type_id = c.u32(&|| format!("type of tensor `{name}`"))?;
        let offset = c.u64(&|| format!("offset of tensor `{name}`"))?;
        let ggml_type =
            GgmlType::from_id(type_id).ok_or_else(|| FormatError::UnknownTensorType {
                path: path.to_path_buf(),
                name: name.clone(),
                type_id,
            })?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(|| overflow(format!("element count of tensor `{name}` dims {dims:?}")))?;
        let be = ggml_type.block_elems() as u64;
        let row = dims.first().copied().unwrap_or(1);
        if row % be != 0 {
            return Err(corrupt(format!(
                "tensor `{name}`: row length {row} is not a multiple of the {ggml_type} block size {be}"
            )));
        }
        // A zero dim makes the tensor empty, but its rows keep their size:
        // that must fit too (`GgufTensorInfo::row_bytes` relies on it).
        usize::try_from(row)
            .ok()
            .and_then(|r| ggml_type.row_bytes(r))
            .ok_or_else(|| overflow(format!("row size of tensor `{name}` dims {dims:?}")))?;
        let n_bytes = (n_elements / be)
            .checked_mul(ggml_type.block_bytes() as u64)
            .ok_or_else(|| overflow(format!("byte size of tensor `{name}` dims {dims:?}")))?;
        if offset % alignment != 0 {
            return Err(corrupt(format!(
                "tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if tensor_index.insert(name.clone(), tensors.len()).is_some() {
            return Err(corrupt(format!("duplicate tensor name `{name}`")));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_elements,
            n_bytes,
        });
    }

    let data_start = (c.pos as u64)
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| overflow("data section start".into()))?;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let start = data_start
            .checked_add(t.offset)
            .ok_or_else(|| overflow(format!("start of tensor `{}`", t.name)))?;
        let end = start
            .checked_add(t.n_bytes)
            .ok_or_else(|| overflow(format!("end of tensor `{}`", t.name)))?;
        if end > file_len {
            return Err(FormatError::TensorOutOfBounds {
                path: path.to_path_buf(),
                name: t.name.clone(),
                start,
                size: t.n_bytes,
                file_len,
            });
        }
    }

    Ok(Parsed {
        version,
        metadata,
        metadata_index,
        tensors,
        tensor_index,
        alignment,
        data_start,
    })
}
