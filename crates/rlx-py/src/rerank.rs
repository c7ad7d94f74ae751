//! `rlx.Reranker`: cross-encoder relevance scores as a numpy array.

use crate::embed::{model_err, MAX_BATCH};
use crate::{guarded, lock, ModelLoadError};
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use rlx::models::reranker::RERANK_BATCH;
use rlx::models::EmbedOptions;
use rlx::Reranker;
use std::sync::Mutex;

/// A loaded cross-encoder reranker (`rlx.Reranker`).
///
/// Calls from several Python threads are safe: each call releases the GIL
/// and takes the model's lock, so concurrent calls run one after the other.
#[pyclass(name = "Reranker", module = "rlx", frozen)]
pub struct PyReranker {
    inner: Mutex<Reranker>,
    path: String,
    max_length: usize,
}

/// `documents` as a list of str; errors name the offending element.
fn extract_docs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "documents: expected a list of str, got a single str; wrap it in a list",
        ));
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "documents: expected a list of str, got {}",
            crate::type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        let item = item?;
        let s = item.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "documents[{i}]: expected str, got {}",
                crate::type_name(&item)
            ))
        })?;
        out.push(s.to_str()?.to_owned());
    }
    Ok(out)
}

/// `pairs` as (query, document) strings: an iterable of tuples or lists
/// of two str, as `CrossEncoder.predict` takes them. Errors name the
/// offending pair (and item): `TypeError` for a wrong type, `ValueError`
/// for a pair that does not hold two items.
fn extract_pairs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    const WANT: &str = "a (query, document) tuple or list of two str";
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "pairs: expected a list of (query, document) pairs, got a single str",
        ));
    }
    let is_pair =
        |x: &Bound<'_, PyAny>| x.is_instance_of::<PyTuple>() || x.is_instance_of::<PyList>();
    if is_pair(obj)
        && obj.len().ok() == Some(2)
        && obj
            .try_iter()?
            .all(|x| x.is_ok_and(|x| x.is_instance_of::<PyString>()))
    {
        return Err(PyTypeError::new_err(
            "pairs: got a single (query, document) pair; wrap it in a list: \
             predict([(query, document)])",
        ));
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "pairs: expected a list of (query, document) pairs, got {}",
            crate::type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        let item = item?;
        if !is_pair(&item) {
            return Err(PyTypeError::new_err(format!(
                "pairs[{i}]: expected {WANT}, got {}",
                crate::type_name(&item)
            )));
        }
        let n = item.len()?;
        if n != 2 {
            return Err(PyValueError::new_err(format!(
                "pairs[{i}]: {n} items; expected {WANT}"
            )));
        }
        let text = |j: usize| -> PyResult<String> {
            let x = item.get_item(j)?;
            let s = x.cast::<PyString>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "pairs[{i}][{j}]: expected str, got {}",
                    if x.is_none() {
                        "None".to_string()
                    } else {
                        crate::type_name(&x)
                    }
                ))
            })?;
            Ok(s.to_str()
                .map_err(|e| {
                    PyValueError::new_err(format!("pairs[{i}][{j}]: not valid Unicode: {e}"))
                })?
                .to_owned())
        };
        out.push((text(0)?, text(1)?));
    }
    Ok(out)
}

impl PyReranker {
    /// Scores of `pairs`, in input order, in forward passes of at most
    /// `batch_size` pairs; `what` names the method in an internal error.
    fn scores(
        &self,
        py: Python<'_>,
        what: &str,
        pairs: &[(&str, &str)],
        batch_size: usize,
    ) -> PyResult<Vec<f32>> {
        if pairs.is_empty() {
            return Ok(vec![]);
        }
        let inner = &self.inner;
        py.detach(|| {
            guarded(what, || {
                let mut m = lock(inner, "Reranker")?;
                m.score_batched(pairs, batch_size).map_err(model_err)
            })
        })
    }

    /// Scores of every document against `query`, in input order.
    fn doc_scores(
        &self,
        py: Python<'_>,
        what: &str,
        query: &str,
        docs: &[String],
    ) -> PyResult<Vec<f32>> {
        let pairs: Vec<(&str, &str)> = docs.iter().map(|d| (query, d.as_str())).collect();
        self.scores(py, what, &pairs, RERANK_BATCH)
    }
}

#[pymethods]
impl PyReranker {
    /// Load a cross-encoder directory (a `BertForSequenceClassification`
    /// with one label, as sentence-transformers' `CrossEncoder` saves it:
    /// `config.json`, `tokenizer.json`, `model.safetensors`). `threads`:
    /// CPU worker threads (None: one per core).
    #[new]
    #[pyo3(signature = (model, threads = None))]
    fn new(py: Python<'_>, model: &Bound<'_, PyAny>, threads: Option<i64>) -> PyResult<Self> {
        let spec = crate::path_arg(model, "model")?;
        let threads = match threads {
            Some(t) if t < 1 => {
                return Err(PyValueError::new_err(format!(
                    "threads={t}: expected a positive count or None"
                )))
            }
            Some(t) => crate::check_threads(Some(t as usize))?,
            None => None,
        };
        let dir = std::path::PathBuf::from(&spec);
        if !dir.is_dir() {
            return Err(ModelLoadError::new_err(format!(
                "model={spec:?}: {} is not a directory; expected a cross-encoder model directory",
                dir.display()
            )));
        }
        let opts = EmbedOptions {
            threads,
            ..Default::default()
        };
        let m = py.detach(|| {
            guarded("Reranker", || {
                Reranker::load_with(&dir, opts).map_err(model_err)
            })
        })?;
        Ok(PyReranker {
            max_length: m.tokenizer().max_seq_len(),
            inner: Mutex::new(m),
            path: dir.display().to_string(),
        })
    }

    /// The relevance of each document to `query`: a float32 array of
    /// `len(documents)` scores in input order (the model's activation
    /// applied, sigmoid by default, as `CrossEncoder.predict`). Pairs are
    /// truncated to `max_length` tokens. Releases the GIL.
    fn rerank<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        documents: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let docs = extract_docs(documents)?;
        Ok(self
            .doc_scores(py, "Reranker.rerank", query, &docs)?
            .into_pyarray(py))
    }

    /// The scores of (query, document) pairs, as `CrossEncoder.predict`:
    /// `pairs` is a list (or any iterable) of tuples or lists of two str;
    /// returns a float32 array of `len(pairs)` scores in input order (the
    /// model's activation applied, sigmoid by default). `batch_size` (1 to
    /// 1024): most pairs per forward pass, each pass padded to its longest
    /// pair (the padding is masked: a score does not depend on its batch
    /// beyond float rounding). Pairs are truncated to `max_length` tokens.
    /// A pair that is not two str raises `TypeError` (`ValueError` for a
    /// tuple or list of another length), naming it. Releases the GIL.
    #[pyo3(signature = (pairs, batch_size = 32))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        pairs: &Bound<'py, PyAny>,
        batch_size: i64,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        if batch_size < 1 || batch_size as u64 > MAX_BATCH as u64 {
            return Err(PyValueError::new_err(format!(
                "batch_size={batch_size}: expected 1 to {MAX_BATCH}"
            )));
        }
        let pairs = extract_pairs(pairs)?;
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(q, d)| (q.as_str(), d.as_str()))
            .collect();
        Ok(self
            .scores(py, "Reranker.predict", &refs, batch_size as usize)?
            .into_pyarray(py))
    }

    /// The documents ranked best first, as `CrossEncoder.rank`: a list of
    /// `{"corpus_id", "score"}` dicts (and `"text"` with
    /// `return_documents=True`), the best `top_k` only when given.
    #[pyo3(signature = (query, documents, top_k = None, return_documents = false))]
    fn rank<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        documents: &Bound<'py, PyAny>,
        top_k: Option<i64>,
        return_documents: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        if let Some(k) = top_k.filter(|&k| k < 1) {
            return Err(PyValueError::new_err(format!(
                "top_k={k}: expected a positive count or None"
            )));
        }
        let docs = extract_docs(documents)?;
        let scores = self.doc_scores(py, "Reranker.rank", query, &docs)?;
        let mut order: Vec<usize> = (0..docs.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        order.truncate(top_k.map_or(docs.len(), |k| k as usize));
        let out = PyList::empty(py);
        for i in order {
            let d = PyDict::new(py);
            d.set_item("corpus_id", i)?;
            d.set_item("score", scores[i])?;
            if return_documents {
                d.set_item("text", &docs[i])?;
            }
            out.append(d)?;
        }
        Ok(out)
    }

    /// Most tokens read per (query, document) pair.
    #[getter]
    fn max_length(&self) -> usize {
        self.max_length
    }

    /// The model directory.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    fn __repr__(&self) -> String {
        format!("Reranker(model={:?})", self.path)
    }
}
