//! The error type of the weight-file readers.

use std::path::PathBuf;

use crate::gguf::GgmlType;

/// Errors from dequantizing raw block bytes (see [`crate::quant`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error("{ty}: {n_elems} elements is not a multiple of the block size {block_elems}")]
    NotBlockMultiple {
        /// Block type.
        ty: GgmlType,
        /// Requested element count.
        n_elems: usize,
        /// Elements per block.
        block_elems: usize,
    },
    /// The byte buffer does not hold exactly the blocks for `n_elems` elements.
    #[error("{ty}: {n_elems} elements need {expected} bytes, got {found}")]
    ByteLength {
        /// Block type.
        ty: GgmlType,
        /// Requested element count.
        n_elems: usize,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
    /// The output buffer length differs from `n_elems`.
    #[error("{ty}: output buffer holds {found} floats, expected {expected}")]
    OutLength {
        /// Block type.
        ty: GgmlType,
        /// Elements requested.
        expected: usize,
        /// Output length given.
        found: usize,
    },
    /// There is no dequantizer for this type.
    #[error("dequantization of {ty} is not supported")]
    Unsupported {
        /// Block type.
        ty: GgmlType,
    },
}

/// Errors from opening and reading safetensors and GGUF files.
///
/// Every variant names the file; tensor-level variants name the tensor and
/// say what was expected and what was found.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file could not be opened, inspected or mapped.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// File.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file ends before a structure it declares.
    #[error("{path}: truncated file: {what} needs {needed} bytes at offset {offset}, file has {file_len}", path = path.display())]
    Truncated {
        /// File.
        path: PathBuf,
        /// What was being read.
        what: String,
        /// Offset where the read starts.
        offset: u64,
        /// Bytes needed from there.
        needed: u64,
        /// File length in bytes.
        file_len: u64,
    },
    /// The header (safetensors JSON or GGUF metadata) is malformed.
    #[error("{path}: corrupt header: {reason}", path = path.display())]
    CorruptHeader {
        /// File.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The requested tensor is not in the file.
    #[error("{path}: tensor `{name}` not found ({count} tensors in file)", path = path.display())]
    MissingTensor {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Number of tensors the file holds.
        count: usize,
    },
    /// The tensor's shape differs from the requested one.
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}", path = path.display())]
    WrongShape {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Requested shape.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// The tensor's element type cannot be read as the requested type.
    #[error("{path}: tensor `{name}` has dtype {found}, expected {expected}", path = path.display())]
    WrongDtype {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Accepted dtypes.
        expected: String,
        /// Dtype in the file.
        found: String,
    },
    /// The GGUF magic bytes are wrong.
    #[error("{path}: not a GGUF file: magic is {found:02x?}, expected \"GGUF\"", path = path.display())]
    BadMagic {
        /// File.
        path: PathBuf,
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The GGUF version is not 2 or 3.
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)", path = path.display())]
    UnsupportedVersion {
        /// File.
        path: PathBuf,
        /// Version found.
        version: u32,
    },
    /// A GGUF tensor has a ggml type id this reader does not know.
    #[error("{path}: tensor `{name}` has unknown ggml type id {type_id}", path = path.display())]
    UnknownTensorType {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Raw type id.
        type_id: u32,
    },
    /// A GGUF metadata value has an unknown value type id.
    #[error("{path}: metadata key `{key}` has unknown value type id {type_id}", path = path.display())]
    UnknownValueType {
        /// File.
        path: PathBuf,
        /// Metadata key.
        key: String,
        /// Raw type id.
        type_id: u32,
    },
    /// A tensor's data lies (partly) outside the file.
    #[error("{path}: tensor `{name}` data [{start}, {start}+{size}) is outside the file of {file_len} bytes", path = path.display())]
    TensorOutOfBounds {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Absolute start offset in the file.
        start: u64,
        /// Byte size of the tensor data.
        size: u64,
        /// File length.
        file_len: u64,
    },
    /// A size computed from the file overflows.
    #[error("{path}: size overflow: {what}", path = path.display())]
    Overflow {
        /// File.
        path: PathBuf,
        /// The computation that overflowed.
        what: String,
    },
    /// GGUF metadata is larger than the reader's limits
    /// (`GgufLimits`): an array too long, or too many metadata bytes.
    #[error("{path}: metadata key `{key}`: {what} exceeds the limit ({limit})", path = path.display())]
    MetadataLimit {
        /// File.
        path: PathBuf,
        /// Metadata key (or what was being read).
        key: String,
        /// What was found, with its size.
        what: String,
        /// The limit.
        limit: String,
    },
    /// The path is a directory (or another non-file).
    #[error("{path}: is a directory, expected {expected}", path = path.display())]
    NotAFile {
        /// The path given.
        path: PathBuf,
        /// What was expected there.
        expected: String,
    },
    /// A GGUF metadata key is missing.
    #[error("{path}: metadata key `{key}` not found", path = path.display())]
    MissingKey {
        /// File.
        path: PathBuf,
        /// Metadata key.
        key: String,
    },
    /// A GGUF metadata value has a different type than requested.
    #[error("{path}: metadata key `{key}` is {found}, expected {expected}", path = path.display())]
    WrongValueType {
        /// File.
        path: PathBuf,
        /// Metadata key.
        key: String,
        /// Requested type.
        expected: String,
        /// Type found.
        found: String,
    },
    /// A row index is past the tensor's last row.
    #[error("{path}: tensor `{name}` has {n_rows} rows, row {row} requested", path = path.display())]
    RowOutOfRange {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Requested row.
        row: usize,
        /// Rows in the tensor.
        n_rows: usize,
    },
    /// Dequantizing a tensor failed.
    #[error("{path}: tensor `{name}`: {source}", path = path.display())]
    Dequant {
        /// File.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// What went wrong.
        #[source]
        source: QuantError,
    },
}
