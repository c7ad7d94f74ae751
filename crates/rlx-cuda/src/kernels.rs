//! The f32 kernels (`cu/kernels.cu`), compiled once per process by NVRTC.
//!
//! Conventions: every pointer argument is a raw device address; integer
//! sizes are `int` (the lowering checks that they fit); metadata arrays
//! (dims and strides) live in the model's metadata buffer and are passed
//! as `const int*`. Kernels that detect bad input (an out-of-range id)
//! record `node + 1` in the status word and write zeros.

/// Names of every `extern "C"` kernel in `cu/kernels.cu`.
pub const KERNELS: &[&str] = &[
    "binary_mod",
    "binary_bcast",
    "activation",
    "bias_act",
    "norm_rows",
    "gather4",
    "copy_rows4",
    "copy_rows1",
    "strided_copy1",
    "strided_copy4",
    "strided_copy8",
    "reduce_f32",
    "softmax_f32",
    "cast_kernel",
    "swiglu",
    "rope_f32",
    "attention_d32",
    "attention_d64",
    "attention_d128",
    "attention_d256",
];
