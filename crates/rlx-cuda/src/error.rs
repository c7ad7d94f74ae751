//! [`CudaError`]: what can go wrong on the device, by kind.

use rlx_runtime::RuntimeError;

/// A failure of the CUDA backend. Converted to
/// [`RuntimeError::Device`] (boxed, so callers can downcast to this type)
/// except [`CudaError::Unsupported`], which stays
/// [`RuntimeError::Unsupported`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// A CUDA driver call failed (or the driver could not be used).
    #[error("cuda: {what}: {message}")]
    Driver {
        /// What was being done (`bind`, `upload`, `graph launch`, ...).
        what: String,
        /// The driver's error.
        message: String,
    },
    /// NVRTC rejected a kernel module.
    #[error("NVRTC compile of {module} failed: {log}")]
    Nvrtc {
        /// The module (`kernels`, `mixed`, `quant`, `kv`, or a generated
        /// kernel's name).
        module: String,
        /// The compiler's log (or error).
        log: String,
    },
    /// A cuBLAS or cuBLASLt call failed.
    #[error("cuBLAS: {what}: {message}")]
    Cublas {
        /// The call or step that failed (`cublasGemmStridedBatchedEx`,
        /// `cublasLt layout`, ...), prefixed `node N:` when it ran for a node.
        what: String,
        /// The library's status, as its `Debug` text.
        message: String,
    },
    /// A device allocation failed for lack of memory.
    #[error("out of device memory: {requested} bytes requested, {free} bytes free")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device when it failed (0 if unknown).
        free: usize,
    },
    /// The backend cannot do this (no kernel, no device, bad sizes).
    #[error("{0}")]
    Unsupported(String),
}

impl CudaError {
    /// A failed driver call: `what` was being done.
    pub(crate) fn driver(what: &str, e: impl std::fmt::Debug) -> CudaError {
        CudaError::Driver {
            what: what.to_string(),
            message: format!("{e:?}"),
        }
    }

    /// A failed cuBLAS / cuBLASLt call.
    pub(crate) fn cublas(what: &str, e: impl std::fmt::Debug) -> CudaError {
        CudaError::Cublas {
            what: what.to_string(),
            message: format!("{e:?}"),
        }
    }

    /// A failed allocation of `requested` bytes: [`CudaError::OutOfMemory`]
    /// when the driver says so (with `free()`, the free memory now), else a
    /// driver error.
    pub(crate) fn alloc(
        what: &str,
        requested: usize,
        e: cudarc::driver::DriverError,
        free: impl FnOnce() -> usize,
    ) -> CudaError {
        use cudarc::driver::sys::CUresult;
        if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            CudaError::OutOfMemory {
                requested,
                free: free(),
            }
        } else {
            CudaError::driver(&format!("{what} {requested} bytes"), e)
        }
    }
}

impl CudaError {
    /// This error, naming the node whose work failed (driver and cuBLAS
    /// errors; the others already say what failed).
    pub(crate) fn at_node(self, node: rlx_ir::NodeId) -> CudaError {
        match self {
            CudaError::Driver { what, message } => CudaError::Driver {
                what: format!("node {node}: {what}"),
                message,
            },
            CudaError::Cublas { what, message } => CudaError::Cublas {
                what: format!("node {node}: {what}"),
                message,
            },
            e => e,
        }
    }
}

impl From<CudaError> for RuntimeError {
    fn from(e: CudaError) -> RuntimeError {
        match e {
            CudaError::Unsupported(m) => RuntimeError::Unsupported(m),
            e => RuntimeError::Device(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed allocation is `Device` (downcastable to `OutOfMemory`), not
    /// `Unsupported`; a missing kernel stays `Unsupported`.
    #[test]
    fn device_failures_are_device_errors() {
        let oom =
            cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let e = CudaError::alloc("alloc", 1 << 40, oom, || 4096);
        assert_eq!(
            e,
            CudaError::OutOfMemory {
                requested: 1 << 40,
                free: 4096
            }
        );
        let r: RuntimeError = e.clone().into();
        let RuntimeError::Device(inner) = &r else {
            panic!("{r:?}");
        };
        assert_eq!(inner.downcast_ref::<CudaError>(), Some(&e));
        assert!(
            r.to_string().contains("1099511627776 bytes requested"),
            "{r}"
        );
        let u: RuntimeError = CudaError::Unsupported("no kernel".into()).into();
        assert!(matches!(u, RuntimeError::Unsupported(m) if m == "no kernel"));
    }
}
