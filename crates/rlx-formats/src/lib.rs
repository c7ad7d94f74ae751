//! rlx-formats: weight-file readers for rlx.
//!
//! - [`safetensors`]: memory-mapped safetensors files ([`SafeTensorsFile`]).
//! - [`gguf`]: a memory-mapped GGUF v2/v3 reader ([`GgufFile`]) with typed
//!   metadata access and per-tensor dequantization.
//! - [`quant`]: dequantization of ggml block formats to f32.
//!
//! All readers treat the file as untrusted: malformed input yields a
//! [`FormatError`] naming the file (and tensor or key), never a panic.

#![deny(missing_docs)]

mod error;
mod ggml_type;
pub mod gguf;
pub mod quant;
pub mod safetensors;

pub use error::{FormatError, QuantError};
pub use ggml_type::GgmlType;
pub use gguf::{
    GgufArray, GgufArrayIter, GgufFile, GgufLimits, GgufTensorInfo, GgufValue, GgufValueType,
};
pub use safetensors::SafeTensorsFile;
