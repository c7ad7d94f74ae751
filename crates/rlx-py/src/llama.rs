//! `rlx.LlamaModel`: text generation with a Llama-family GGUF.

use crate::chat::{ChatTemplate, Message, Step, StopText, Utf8Stream};
use crate::{guarded, lock, ExecutionError, ModelLoadError, RlxError};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use rlx::cpu::CpuOptions;
use rlx::ir::ActivationPrecision;
use rlx::models::gguf_tokenizer::GgufTokenizer;
use rlx::models::llama::{LlamaConfig, LlamaDevice, LlamaModel, LlamaWeights};
use rlx::models::sampling::{Sampler, SamplerConfig};
use std::sync::{Arc, Mutex};

/// The model, its tokenizer and template, and which generation owns the
/// KV cache now.
struct Inner {
    model: LlamaModel,
    tok: GgufTokenizer,
    template: ChatTemplate,
    /// Bumped by every new generation; a stream whose epoch is older was
    /// interrupted (its KV cache was overwritten).
    epoch: u64,
}

/// A Llama-family GGUF model (`rlx.LlamaModel`): `llama` or `qwen2`
/// architectures, quantized weights kept packed.
///
/// One sequence at a time: a new `generate`/`stream`/`chat` call ends an
/// unfinished stream of the same model (its next step raises RlxError).
#[pyclass(name = "LlamaModel", module = "rlx", frozen)]
pub struct PyLlamaModel {
    inner: Arc<Mutex<Inner>>,
    path: String,
    ctx: usize,
    vocab: usize,
    arch: String,
    bos: Option<u32>,
    eos: Option<u32>,
}

/// One generation in progress.
struct Gen {
    epoch: u64,
    sampler: Sampler,
    prompt: Vec<u32>,
    history: Vec<u32>,
    max_tokens: usize,
    generated: usize,
    logits: Option<Vec<f32>>,
    utf8: Utf8Stream,
    stop: StopText,
    finish_reason: Option<&'static str>,
}

/// An iterator over the text pieces of one generation
/// (`rlx.LlamaModel.stream` / `chat(..., stream=True)`).
#[pyclass(name = "TextStream", module = "rlx", frozen)]
pub struct PyTextStream {
    inner: Arc<Mutex<Inner>>,
    gen: Mutex<Gen>,
}

fn err<E: std::fmt::Display>(e: E) -> PyErr {
    ExecutionError::new_err(e.to_string())
}

/// Sampling arguments shared by generate, stream and chat.
struct SampleArgs {
    max_tokens: i64,
    temperature: f64,
    top_p: f64,
    top_k: i64,
    seed: Option<i64>,
    repetition_penalty: f64,
    stop: Vec<String>,
}

/// `stop`: None, a str or a list of str.
fn stop_arg(stop: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(s) = stop else { return Ok(vec![]) };
    if s.is_none() {
        return Ok(vec![]);
    }
    if let Ok(s) = s.cast::<PyString>() {
        return Ok(vec![s.to_str()?.to_owned()]);
    }
    s.extract::<Vec<String>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "stop: expected None, a str or a list of str, got {}",
            crate::type_name(s)
        ))
    })
}

impl Inner {
    /// Validate the arguments and start a generation of `prompt`.
    fn start(&mut self, prompt: Vec<u32>, a: SampleArgs) -> PyResult<Gen> {
        let ctx = self.model.ctx_len();
        if prompt.is_empty() {
            return Err(PyValueError::new_err("the prompt encodes to no tokens"));
        }
        let room = ctx.saturating_sub(prompt.len());
        if a.max_tokens < 1 || a.max_tokens as u64 > room as u64 {
            return Err(PyValueError::new_err(format!(
                "max_tokens={}: expected 1..={room} (the prompt is {} tokens and ctx is {ctx})",
                a.max_tokens,
                prompt.len()
            )));
        }
        if a.top_k < 0 {
            return Err(PyValueError::new_err(format!(
                "top_k={}: expected 0 (all tokens) or a positive count",
                a.top_k
            )));
        }
        let seed = match a.seed {
            None => 0,
            Some(s) if s < 0 => {
                return Err(PyValueError::new_err(format!(
                    "seed={s}: expected a non-negative integer"
                )))
            }
            Some(s) => s as u64,
        };
        let sampler = Sampler::new(SamplerConfig {
            temperature: a.temperature as f32,
            top_k: a.top_k as usize,
            top_p: a.top_p as f32,
            repetition_penalty: a.repetition_penalty as f32,
            seed,
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.epoch += 1;
        Ok(Gen {
            epoch: self.epoch,
            sampler,
            history: prompt.clone(),
            prompt,
            max_tokens: a.max_tokens as usize,
            generated: 0,
            logits: None,
            utf8: Utf8Stream::default(),
            stop: StopText::new(a.stop),
            finish_reason: None,
        })
    }

    /// One step of `g`: the text it releases (maybe empty), or `None` once
    /// finished. The same loop as `rlx generate`: prefill, then sample,
    /// stop at an end-of-generation token or after `max_tokens`, decode.
    fn step(&mut self, g: &mut Gen) -> PyResult<Option<String>> {
        if g.finish_reason.is_some() {
            return Ok(None);
        }
        if g.epoch != self.epoch {
            return Err(RlxError::new_err(
                "this stream was interrupted: a later generate/stream/chat call on the same \
                 LlamaModel reused its KV cache",
            ));
        }
        let logits = match g.logits.take() {
            Some(l) => l,
            None => self.model.prefill(&g.prompt).map_err(err)?,
        };
        let id = g.sampler.sample(&logits, &g.history).map_err(err)?;
        g.generated += 1;
        if self.tok.is_end_of_generation(id) {
            g.finish_reason = Some("stop");
            return Ok(Some(self.flush(g)));
        }
        g.history.push(id);
        let piece = g.utf8.push(self.tok.token_bytes(id).map_err(err)?);
        match g.stop.push(&piece) {
            Step::Stop(s) => {
                g.finish_reason = Some("stop");
                Ok(Some(s))
            }
            Step::Send(mut s) => {
                if g.generated == g.max_tokens {
                    g.finish_reason = Some("length");
                    s.push_str(&self.flush(g));
                } else {
                    g.logits = Some(self.model.decode(id).map_err(err)?);
                }
                Ok(Some(s))
            }
        }
    }

    /// The text held back at the end (an incomplete character, a possible
    /// start of a stop string).
    fn flush(&self, g: &mut Gen) -> String {
        let rest = g.utf8.finish();
        match g.stop.push(&rest) {
            Step::Stop(s) => s,
            Step::Send(mut s) => {
                s.push_str(&g.stop.finish());
                s
            }
        }
    }

    /// Run `g` to the end.
    fn run(&mut self, g: &mut Gen) -> PyResult<String> {
        let mut out = String::new();
        while let Some(s) = self.step(g)? {
            out.push_str(&s);
        }
        Ok(out)
    }

    /// The prompt ids of `messages` rendered with the chat template.
    fn chat_ids(&self, messages: &[Message]) -> PyResult<Vec<u32>> {
        let text = self.template.render(messages).map_err(RlxError::new_err)?;
        // The template writes the BOS text itself where the model wants one.
        self.tok.encode(&text, false).map_err(err)
    }
}

/// `messages`: a list of `{"role": str, "content": str}` dicts.
fn messages_arg(messages: &Bound<'_, PyAny>) -> PyResult<Vec<Message>> {
    if messages.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "messages: expected a list of {\"role\": str, \"content\": str} dicts, got a str",
        ));
    }
    let iter = messages.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "messages: expected a list of dicts, got {}",
            crate::type_name(messages)
        ))
    })?;
    let mut out = Vec::new();
    for (i, m) in iter.enumerate() {
        let m = m?;
        let d = m.cast::<PyDict>().map_err(|_| {
            PyTypeError::new_err(format!(
                "messages[{i}]: expected a dict with \"role\" and \"content\", got {}",
                crate::type_name(&m)
            ))
        })?;
        let field = |k: &str| -> PyResult<String> {
            let v = d.get_item(k)?.ok_or_else(|| {
                PyValueError::new_err(format!("messages[{i}]: missing key {k:?}"))
            })?;
            v.extract::<String>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "messages[{i}][{k:?}]: expected str, got {}",
                    crate::type_name(&v)
                ))
            })
        };
        out.push(Message {
            role: field("role")?,
            content: field("content")?,
        });
    }
    if out.is_empty() {
        return Err(PyValueError::new_err(
            "messages: empty; expected at least one message",
        ));
    }
    Ok(out)
}

impl PyLlamaModel {
    /// Start a generation (under the lock, GIL released) from `prompt`.
    fn begin(
        &self,
        py: Python<'_>,
        prompt: Prompt,
        a: SampleArgs,
    ) -> PyResult<(Arc<Mutex<Inner>>, Gen)> {
        let inner = self.inner.clone();
        let g = py.detach(|| {
            guarded("LlamaModel", || {
                let mut m = lock(&inner, "LlamaModel")?;
                let ids = match prompt {
                    Prompt::Text(t) => {
                        let bos = m.tok.add_bos_default();
                        m.tok.encode(&t, bos).map_err(err)?
                    }
                    Prompt::Chat(msgs) => m.chat_ids(&msgs)?,
                };
                m.start(ids, a)
            })
        })?;
        Ok((inner, g))
    }

    /// Run a whole generation with the GIL released.
    fn complete(&self, py: Python<'_>, prompt: Prompt, a: SampleArgs) -> PyResult<String> {
        let (inner, mut g) = self.begin(py, prompt, a)?;
        py.detach(|| {
            guarded("LlamaModel.generate", || {
                lock(&inner, "LlamaModel")?.run(&mut g)
            })
        })
    }

    /// A streaming iterator over a new generation.
    fn streamer(&self, py: Python<'_>, prompt: Prompt, a: SampleArgs) -> PyResult<PyTextStream> {
        let (inner, g) = self.begin(py, prompt, a)?;
        Ok(PyTextStream {
            inner,
            gen: Mutex::new(g),
        })
    }
}

/// What to generate from.
enum Prompt {
    /// Plain text (BOS added when the model wants one).
    Text(String),
    /// Chat messages through the template.
    Chat(Vec<Message>),
}

#[pymethods]
impl PyLlamaModel {
    /// Load a GGUF model: "smollm2" (SmolLM2-135M-Instruct Q4_1, fetched on
    /// first use as `rlx fetch smollm2` does) or the path of a `.gguf` file.
    ///
    /// `device`: "cpu", or "cuda[:N]" in a wheel built with `--features cuda`
    /// (weights and KV caches on the GPU, each decode step one CUDA graph;
    /// a machine without a usable GPU raises `DeviceError`).
    /// `ctx`: KV-cache positions (prompt plus generated tokens), 1 to the
    /// model's context length. `threads`: CPU worker threads (None: one per
    /// core). `int8_activations`: round matmul activations to 8-bit blocks as
    /// llama.cpp does (faster decode, looser numerics).
    #[new]
    #[pyo3(signature = (gguf = None, device = "cpu", ctx = 2048, threads = None, int8_activations = false))]
    fn new(
        py: Python<'_>,
        gguf: Option<&Bound<'_, PyAny>>,
        device: &str,
        ctx: i64,
        threads: Option<i64>,
        int8_activations: bool,
    ) -> PyResult<Self> {
        let spec = match gguf {
            Some(m) => crate::path_arg(m, "gguf")?,
            None => "smollm2".to_string(),
        };
        let cuda = crate::parse_device(device)?;
        let threads = match threads {
            Some(t) if t < 1 => {
                return Err(PyValueError::new_err(format!(
                    "threads={t}: expected a positive count or None"
                )))
            }
            Some(t) => crate::check_threads(Some(t as usize))?,
            None => None,
        };
        if ctx < 1 {
            return Err(PyValueError::new_err(format!(
                "ctx={ctx}: expected a positive number of positions"
            )));
        }
        let ctx = ctx as usize;
        // The device is checked before the model is read.
        let device = llama_device(cuda, threads)?;
        let path = crate::resolve_model(
            &spec,
            "smollm2",
            "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
        )?;
        if path.is_dir() {
            return Err(ModelLoadError::new_err(format!(
                "gguf={spec:?}: {} is a directory; expected a .gguf file",
                path.display()
            )));
        }
        let inner = py.detach(|| {
            guarded("LlamaModel", || {
                let load = |e: String| ModelLoadError::new_err(format!("{}: {e}", path.display()));
                let f = rlx::formats::GgufFile::open(&path).map_err(|e| load(e.to_string()))?;
                let tok = GgufTokenizer::from_gguf(&f).map_err(|e| load(e.to_string()))?;
                let cfg = LlamaConfig::from_gguf(&f).map_err(|e| load(e.to_string()))?;
                if let Some(max) = cfg.context_length {
                    if ctx > max {
                        return Err(PyValueError::new_err(format!(
                            "ctx={ctx}: expected 1..={max} ({}.context_length of the model)",
                            cfg.arch
                        )));
                    }
                }
                cfg.check_ctx(ctx)
                    .map_err(|e| PyValueError::new_err(format!("ctx={ctx}: {e}")))?;
                let mut w = LlamaWeights::load(&f, &cfg).map_err(|e| load(e.to_string()))?;
                w.activations = if int8_activations {
                    ActivationPrecision::Int8
                } else {
                    ActivationPrecision::F32
                };
                let template = ChatTemplate::from_gguf(&f, &tok).map_err(load)?;
                let model = LlamaModel::from_weights_on(w, ctx, device).map_err(err)?;
                Ok(Inner {
                    model,
                    tok,
                    template,
                    epoch: 0,
                })
            })
        })?;
        Ok(PyLlamaModel {
            path: path.display().to_string(),
            ctx,
            vocab: inner.tok.vocab_size(),
            arch: inner.model.config().arch.clone(),
            bos: inner.tok.bos_id(),
            eos: inner.tok.eos_id(),
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// Generate text after `prompt` (no chat template; BOS added when the
    /// model asks for one). Stops at an end-of-generation token, a `stop`
    /// string (not included) or after `max_tokens` tokens.
    /// `temperature=0` is greedy (the same tokens as `rlx generate`);
    /// otherwise `top_k` (0: all), `top_p`, `repetition_penalty` (1: off)
    /// and `seed` pick the sample. The GIL is released while it runs.
    #[pyo3(signature = (prompt, max_tokens = 128, temperature = 0.0, top_p = 1.0, top_k = 0, seed = None, stop = None, repetition_penalty = 1.0))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: String,
        max_tokens: i64,
        temperature: f64,
        top_p: f64,
        top_k: i64,
        seed: Option<i64>,
        stop: Option<&Bound<'_, PyAny>>,
        repetition_penalty: f64,
    ) -> PyResult<String> {
        let a = SampleArgs {
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            repetition_penalty,
            stop: stop_arg(stop)?,
        };
        self.complete(py, Prompt::Text(prompt), a)
    }

    /// `generate` as an iterator of text pieces (each step releases the GIL).
    #[pyo3(signature = (prompt, max_tokens = 128, temperature = 0.0, top_p = 1.0, top_k = 0, seed = None, stop = None, repetition_penalty = 1.0))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        py: Python<'_>,
        prompt: String,
        max_tokens: i64,
        temperature: f64,
        top_p: f64,
        top_k: i64,
        seed: Option<i64>,
        stop: Option<&Bound<'_, PyAny>>,
        repetition_penalty: f64,
    ) -> PyResult<PyTextStream> {
        let a = SampleArgs {
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            repetition_penalty,
            stop: stop_arg(stop)?,
        };
        self.streamer(py, Prompt::Text(prompt), a)
    }

    /// The assistant's reply to `messages` (a list of `{"role", "content"}`
    /// dicts), rendered with the GGUF's own `tokenizer.chat_template`
    /// (ChatML when it has none). With `stream=True`, an iterator of text
    /// pieces instead of a str. Other arguments as in `generate`.
    #[pyo3(signature = (messages, max_tokens = 128, temperature = 0.0, top_p = 1.0, top_k = 0, seed = None, stop = None, repetition_penalty = 1.0, stream = false))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        max_tokens: i64,
        temperature: f64,
        top_p: f64,
        top_k: i64,
        seed: Option<i64>,
        stop: Option<&Bound<'_, PyAny>>,
        repetition_penalty: f64,
        stream: bool,
    ) -> PyResult<Py<PyAny>> {
        let msgs = messages_arg(messages)?;
        let a = SampleArgs {
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            repetition_penalty,
            stop: stop_arg(stop)?,
        };
        if stream {
            let s = self.streamer(py, Prompt::Chat(msgs), a)?;
            Ok(Py::new(py, s)?.into_any())
        } else {
            let s = self.complete(py, Prompt::Chat(msgs), a)?;
            Ok(PyString::new(py, &s).into_any().unbind())
        }
    }

    /// The prompt text of `messages` after the chat template (what `chat`
    /// tokenizes).
    fn apply_chat_template(&self, py: Python<'_>, messages: &Bound<'_, PyAny>) -> PyResult<String> {
        let msgs = messages_arg(messages)?;
        let inner = self.inner.clone();
        py.detach(|| {
            guarded("LlamaModel.apply_chat_template", || {
                let m = lock(&inner, "LlamaModel")?;
                m.template.render(&msgs).map_err(RlxError::new_err)
            })
        })
    }

    /// Token ids of `text`; `add_bos` None: as the model asks
    /// (`tokenizer.ggml.add_bos_token`), which is what `generate` uses.
    #[pyo3(signature = (text, add_bos = None))]
    fn tokenize(&self, py: Python<'_>, text: String, add_bos: Option<bool>) -> PyResult<Vec<u32>> {
        let inner = self.inner.clone();
        py.detach(|| {
            guarded("LlamaModel.tokenize", || {
                let m = lock(&inner, "LlamaModel")?;
                let bos = add_bos.unwrap_or_else(|| m.tok.add_bos_default());
                m.tok.encode(&text, bos).map_err(err)
            })
        })
    }

    /// The text of token `ids` (control tokens as their text; invalid UTF-8
    /// becomes U+FFFD). An id outside the vocabulary is a ValueError.
    fn detokenize(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids: Vec<i64> = ids.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "ids: expected a list of int, got {}",
                crate::type_name(ids)
            ))
        })?;
        let mut out = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            if id < 0 || id as u64 >= self.vocab as u64 {
                return Err(PyValueError::new_err(format!(
                    "ids[{i}] = {id}: expected 0..{} (the vocabulary size)",
                    self.vocab
                )));
            }
            out.push(id as u32);
        }
        let inner = self.inner.clone();
        py.detach(|| {
            guarded("LlamaModel.detokenize", || {
                lock(&inner, "LlamaModel")?.tok.decode(&out).map_err(err)
            })
        })
    }

    /// KV-cache positions (prompt plus generated tokens).
    #[getter]
    fn ctx(&self) -> usize {
        self.ctx
    }

    /// Vocabulary size.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Architecture (`llama` or `qwen2`).
    #[getter]
    fn arch(&self) -> &str {
        &self.arch
    }

    /// Beginning-of-sequence token id, if the model has one.
    #[getter]
    fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token id, if the model has one.
    #[getter]
    fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The GGUF file.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    fn __repr__(&self) -> String {
        format!(
            "LlamaModel(gguf={:?}, arch={:?}, ctx={})",
            self.path, self.arch, self.ctx
        )
    }
}

#[pymethods]
impl PyTextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next text piece; StopIteration when the generation ends.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let (inner, gen) = (&self.inner, &self.gen);
        py.detach(|| {
            guarded("TextStream", || {
                let mut g = lock(gen, "TextStream")?;
                let mut m = lock(inner, "LlamaModel")?;
                loop {
                    match m.step(&mut g)? {
                        Some(s) if s.is_empty() => continue,
                        other => return Ok(other),
                    }
                }
            })
        })
    }

    /// Why the generation ended: "stop" (end-of-generation token or stop
    /// string), "length" (max_tokens), or None while it runs.
    #[getter]
    fn finish_reason(&self) -> PyResult<Option<&'static str>> {
        Ok(lock(&self.gen, "TextStream")?.finish_reason)
    }

    /// Tokens generated so far (an end-of-generation token counts).
    #[getter]
    fn generated_tokens(&self) -> PyResult<usize> {
        Ok(lock(&self.gen, "TextStream")?.generated)
    }
}

/// The generation backend: the CPU (hybrid, `threads` workers) or, for
/// `Some(ordinal)`, that CUDA device after [`crate::check_cuda`] (hybrid:
/// the whole decode step is one CUDA graph; `threads` does not apply).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn llama_device(cuda: Option<usize>, threads: Option<usize>) -> PyResult<LlamaDevice> {
    match cuda {
        None => Ok(LlamaDevice::Cpu(CpuOptions {
            hybrid: true,
            threads,
            ..Default::default()
        })),
        #[cfg(feature = "cuda")]
        Some(i) => {
            crate::check_cuda(i)?;
            Ok(LlamaDevice::Cuda(rlx::cuda::CudaOptions {
                device: i,
                hybrid: true,
                ..Default::default()
            }))
        }
        #[cfg(not(feature = "cuda"))]
        Some(i) => Err(crate::DeviceError::new_err(format!(
            "device cuda:{i}: this build of rlx has no CUDA backend"
        ))),
    }
}
