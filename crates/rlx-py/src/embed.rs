//! `rlx.SentenceEmbedder`: sentence embeddings as a numpy array.

use crate::{guarded, lock, ExecutionError, ModelLoadError};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use rlx::models::st::l2_normalize;
use rlx::models::{EmbedDevice, EmbedOptions, ModelError, SentenceEmbedder};
use std::io::Write;
use std::sync::Mutex;

/// Largest `batch_size` (as `rlx embed --batch-size`).
pub const MAX_BATCH: usize = 1024;

/// Texts tokenized and planned together by `encode` (see
/// `SentenceEmbedder::embed_many`).
const SLICE: usize = 4096;

/// A loaded sentence-embedding model (`rlx.SentenceEmbedder`).
///
/// Calls from several Python threads are safe: each `encode` releases the
/// GIL and takes the model's lock for its batches, so concurrent calls run
/// one after the other on the model's own thread pool.
#[pyclass(name = "SentenceEmbedder", module = "rlx", frozen)]
pub struct PySentenceEmbedder {
    inner: Mutex<SentenceEmbedder>,
    dim: usize,
    max_seq_length: usize,
    path: String,
    device: String,
    precision: String,
}

/// The Python exception for a model error.
pub(crate) fn model_err(e: ModelError) -> PyErr {
    match e {
        ModelError::Runtime(_) | ModelError::NonFinite { .. } | ModelError::Graph(_) => {
            ExecutionError::new_err(e.to_string())
        }
        _ => ModelLoadError::new_err(e.to_string()),
    }
}

/// The texts of `obj`: a list/tuple/iterable of `str`, a 1-D numpy array of
/// strings (dtype `U` or `object`), or a pyarrow string array (`Array` or
/// `ChunkedArray`). Errors name the offending element.
fn extract_texts(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "texts: expected a list of str (or a numpy/pyarrow string array), got a single str; \
             wrap it in a list: encode([text])",
        ));
    }
    let list = if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if arr.ndim() != 1 {
            return Err(PyValueError::new_err(format!(
                "texts: a numpy array of {} dimensions; expected 1",
                arr.ndim()
            )));
        }
        let kind = arr.dtype().kind();
        if kind != b'U' && kind != b'O' {
            return Err(PyTypeError::new_err(format!(
                "texts: a numpy array of dtype {}; expected str (dtype '<U..' or object)",
                arr.dtype()
            )));
        }
        obj.call_method0("tolist")?
    } else if is_pyarrow(obj) {
        let ty = obj.getattr("type")?.str()?.to_string();
        if !matches!(ty.as_str(), "string" | "large_string" | "string_view") {
            return Err(PyTypeError::new_err(format!(
                "texts: a pyarrow array of type {ty}; expected string, large_string or string_view"
            )));
        }
        obj.call_method0("to_pylist")?
    } else {
        obj.clone()
    };
    let iter = list.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "texts: expected a list of str (or a numpy/pyarrow string array), got {}",
            crate::type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        let item = item?;
        let s = item.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "texts[{i}]: expected str, got {}",
                if item.is_none() {
                    "None".to_string()
                } else {
                    crate::type_name(&item)
                }
            ))
        })?;
        let s = s
            .to_str()
            .map_err(|e| PyValueError::new_err(format!("texts[{i}]: not valid Unicode: {e}")))?;
        out.push(s.to_owned());
    }
    Ok(out)
}

/// Whether `obj` is a pyarrow array (without importing pyarrow).
fn is_pyarrow(obj: &Bound<'_, PyAny>) -> bool {
    obj.get_type()
        .module()
        .map(|m| m.to_string().starts_with("pyarrow"))
        .unwrap_or(false)
        && obj.hasattr("to_pylist").unwrap_or(false)
}

#[pymethods]
impl PySentenceEmbedder {
    /// Load a sentence-transformers model (BERT, XLM-RoBERTa or MPNet).
    ///
    /// `model`: "minilm" or "mpnet" (all-MiniLM-L6-v2 / all-mpnet-base-v2,
    /// fetched into `$RLX_MODELS_DIR` or `~/.cache/rlx/models` on first use,
    /// as `rlx fetch minilm` does) or
    /// the path of a model directory (`config.json`, `tokenizer.json`,
    /// `model.safetensors`, ...). `device`: "cpu" or "cuda[:N]" (CUDA needs
    /// a wheel built with `--features cuda`). `threads`: CPU worker threads
    /// (None: one per core). `precision`: "f32"; "bf16" (matmuls in bf16
    /// with f32 accumulation); "f16" (on the CPU f16 weight storage with
    /// f32 products; on CUDA f16 matmuls).
    #[new]
    #[pyo3(signature = (model = None, device = "cpu", threads = None, precision = "f32"))]
    fn new(
        py: Python<'_>,
        model: Option<&Bound<'_, PyAny>>,
        device: &str,
        threads: Option<i64>,
        precision: &str,
    ) -> PyResult<Self> {
        let spec = match model {
            Some(m) => crate::path_arg(m, "model")?,
            None => "minilm".to_string(),
        };
        let threads = match threads {
            Some(t) if t < 1 => {
                return Err(PyValueError::new_err(format!(
                    "threads={t}: expected a positive count or None"
                )))
            }
            Some(t) => crate::check_threads(Some(t as usize))?,
            None => None,
        };
        let cuda = crate::parse_device(device)?;
        let prec = precision.trim().to_ascii_lowercase();
        if !matches!(prec.as_str(), "f32" | "bf16" | "f16") {
            return Err(PyValueError::new_err(format!(
                "precision={precision:?}: expected \"f32\", \"bf16\" or \"f16\""
            )));
        }
        let short = [
            ("minilm", "all-minilm-l6-v2/model.safetensors"),
            ("mpnet", "all-mpnet-base-v2/model.safetensors"),
        ];
        let dir = match short.iter().find(|(n, _)| *n == spec) {
            Some((name, rel)) => {
                let p = crate::resolve_model(&spec, name, rel)?;
                p.parent().map(|d| d.to_path_buf()).unwrap_or(p)
            }
            None => std::path::PathBuf::from(&spec),
        };
        if !dir.is_dir() {
            return Err(ModelLoadError::new_err(format!(
                "model={spec:?}: {} is not a directory; expected \"minilm\", \"mpnet\" or a \
                 sentence-transformers model directory",
                dir.display()
            )));
        }
        let opts = EmbedOptions {
            hybrid: true,
            threads,
            bf16: cuda.is_none() && prec == "bf16",
            f16_weights: cuda.is_none() && prec == "f16",
            ..Default::default()
        };
        let edev = embed_device(cuda, &prec)?;
        let emb = py.detach(|| {
            guarded("SentenceEmbedder", || {
                SentenceEmbedder::load_on(&dir, opts, edev).map_err(model_err)
            })
        })?;
        Ok(PySentenceEmbedder {
            dim: emb.dim(),
            max_seq_length: emb.tokenizer().max_seq_len(),
            inner: Mutex::new(emb),
            path: dir.display().to_string(),
            device: match cuda {
                None => "cpu".into(),
                Some(i) => format!("cuda:{i}"),
            },
            precision: prec,
        })
    }

    /// Embed `texts`: a float32 array of shape `[len(texts), dim]`.
    ///
    /// `texts`: a list (or any iterable) of str, a 1-D numpy array of
    /// strings, or a pyarrow string array. Texts are truncated to the
    /// model's maximum length as sentence-transformers does. `batch_size`
    /// (1 to 1024): most texts per model run; texts are grouped by their
    /// token length (rounded up to a multiple of 4), so a run pads little
    /// and each row equals that text's embedding alone; the rows come back
    /// in the input order. The model's default prompt
    /// (`default_prompt_name`), if any, is prepended. `normalize=False`:
    /// the model's pipeline as configured, as sentence-transformers'
    /// `encode(normalize_embeddings=False)`: its pooling modes, then its
    /// Normalize module if `modules.json` lists one (all-MiniLM-L6-v2's
    /// rows stay unit length). `normalize=True` (the default): those rows
    /// L2-normalized (`normalize_embeddings=True`; rows of a pipeline
    /// ending in Normalize are unit length already and come back as they
    /// are). `show_progress`: print `rlx encode: k/n` to stderr. The GIL
    /// is released while the model runs.
    #[pyo3(signature = (texts, batch_size = 32, normalize = true, show_progress = false))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        batch_size: i64,
        normalize: bool,
        show_progress: bool,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if batch_size < 1 || batch_size as u64 > MAX_BATCH as u64 {
            return Err(PyValueError::new_err(format!(
                "batch_size={batch_size}: expected 1 to {MAX_BATCH}"
            )));
        }
        let texts = extract_texts(texts)?;
        let (n, dim) = (texts.len(), self.dim);
        let inner = &self.inner;
        let flat = py.detach(move || {
            guarded("SentenceEmbedder.encode", || {
                let mut m = lock(inner, "SentenceEmbedder")?;
                // The texts go to the model in slices (bounded memory and
                // progress steps); within a slice `embed_many` groups them
                // by padded length, at most `batch_size` to a run, so a
                // short text is never padded to a long one's length, and
                // every row equals that text's embedding alone.
                let step = if show_progress {
                    (batch_size as usize).saturating_mul(8)
                } else {
                    SLICE
                };
                let mut flat = vec![0f32; n * dim];
                let mut done = 0;
                for slice in texts.chunks(step.max(1)) {
                    let refs: Vec<&str> = slice.iter().map(String::as_str).collect();
                    let mut rows = m
                        .embed_many(&refs, batch_size as usize)
                        .map_err(model_err)?;
                    if normalize && !m.pooling().normalize {
                        rows.iter_mut().for_each(|r| l2_normalize(r));
                    }
                    for (k, v) in rows.iter().enumerate() {
                        flat[(done + k) * dim..(done + k + 1) * dim].copy_from_slice(v);
                    }
                    done += slice.len();
                    if show_progress {
                        eprint!("\rrlx encode: {done}/{n}");
                        if done == n {
                            eprintln!();
                        }
                        std::io::stderr().flush().ok();
                    }
                }
                Ok(flat)
            })
        })?;
        let arr = Array2::from_shape_vec((n, dim), flat)
            .map_err(|e| ExecutionError::new_err(format!("encode: output shape: {e}")))?;
        Ok(arr.into_pyarray(py))
    }

    /// Embedding width (384 for MiniLM).
    #[getter]
    fn dim(&self) -> usize {
        self.dim
    }

    /// Most tokens read per text (longer texts are truncated).
    #[getter]
    fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// The model directory.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The device ("cpu" or "cuda:N").
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// The precision ("f32", "bf16" or "f16").
    #[getter]
    fn precision(&self) -> &str {
        &self.precision
    }

    fn __repr__(&self) -> String {
        format!(
            "SentenceEmbedder(model={:?}, device={:?}, precision={:?}, dim={})",
            self.path, self.device, self.precision, self.dim
        )
    }
}

/// The embedder device for a parsed device and precision: on CUDA, checks
/// the device first ([`crate::check_cuda`]) and compiles hybrid (CUDA-graph
/// segments) with `prec` as the arithmetic.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn embed_device(cuda: Option<usize>, prec: &str) -> PyResult<EmbedDevice> {
    match cuda {
        None => Ok(EmbedDevice::Cpu),
        #[cfg(feature = "cuda")]
        Some(i) => {
            crate::check_cuda(i)?;
            let precision = match prec {
                "bf16" => rlx::Precision::Bf16,
                "f16" => rlx::Precision::F16,
                _ => rlx::Precision::F32,
            };
            Ok(EmbedDevice::Cuda(rlx::cuda::CudaOptions {
                device: i,
                hybrid: true,
                precision,
                ..Default::default()
            }))
        }
        #[cfg(not(feature = "cuda"))]
        Some(i) => Err(crate::DeviceError::new_err(format!(
            "device cuda:{i}: this build of rlx has no CUDA backend"
        ))),
    }
}
