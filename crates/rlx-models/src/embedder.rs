//! `SentenceEmbedder`: a sentence-transformers BERT directory in, normalized
//! embeddings out.

use crate::bert::{build_graph_pooled, pool_inputs, BertConfig, BertOutputs};
use crate::lru::ByteLru;
use crate::st::{Pooling, StConfig};
use crate::tokenizer::{Batch, BertTokenizer, TokenizerError};
use rlx_cpu::{CpuModel, CpuOptions};
use rlx_formats::{FormatError, SafeTensorsFile};
use rlx_ir::{DType, Tensor, TensorData};
use rlx_runtime::{Executable, RuntimeError, TensorRef};
use std::path::{Path, PathBuf};

/// Errors loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A required file is missing.
    #[error("{path}: missing ({what})")]
    MissingFile {
        /// The path looked for.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
    /// A config file could not be read or parsed.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The directory holds an architecture rlx does not build.
    #[error(
        "{path}: unsupported architecture {found:?} (model_type '{model_type}'); supported: {}",
        crate::bert::SUPPORTED_ARCHITECTURES
    )]
    UnknownArchitecture {
        /// The config file.
        path: PathBuf,
        /// `architectures` in the config.
        found: Vec<String>,
        /// `model_type` in the config.
        model_type: String,
    },
    /// `modules.json` lists a sentence-transformers module rlx does not run.
    #[error("{path}: unsupported sentence-transformers module {found:?}; supported: {supported}")]
    UnsupportedModule {
        /// The `modules.json` file.
        path: PathBuf,
        /// The module's `type`.
        found: String,
        /// The module types rlx runs.
        supported: &'static str,
    },
    /// A Pooling module's config names a mode rlx does not know.
    #[error("{path}: unsupported pooling mode {found}; supported: {supported}")]
    UnsupportedPooling {
        /// The Pooling module's `config.json`.
        path: PathBuf,
        /// The mode found.
        found: String,
        /// The modes rlx pools with.
        supported: &'static str,
    },
    /// A prompt name that the model's `config_sentence_transformers.json`
    /// does not define.
    #[error("unknown prompt name {name:?}; the model's prompts: {known}")]
    UnknownPrompt {
        /// The name asked for.
        name: String,
        /// The names the model defines.
        known: String,
    },
    /// The directory is not a model of the kind asked for (e.g. a
    /// cross-encoder given to the embedder).
    #[error("{path}: {message}")]
    WrongKind {
        /// The config file.
        path: PathBuf,
        /// What was found and what was expected.
        message: String,
    },
    /// A weight file problem (missing tensor, wrong shape or dtype, corrupt file).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A tokenizer problem.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Building or optimizing the graph failed.
    #[error("graph: {0}")]
    Graph(String),
    /// Compiling or running failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A hyper-parameter is out of range or disagrees with the weights.
    #[error(transparent)]
    InvalidConfig(#[from] crate::validate::ConfigError),
    /// The model produced a NaN or an infinity.
    #[error("output {output} ({what}) holds a non-finite value: element {index} is {value}; run with RLX_CHECK_FINITE=1 to find the first node producing one")]
    NonFinite {
        /// Which output (0 = pooled embeddings, 1 = token states).
        output: usize,
        /// What the output is.
        what: &'static str,
        /// Flat index of the first non-finite element.
        index: usize,
        /// That element.
        value: f32,
    },
    /// Token-id input that the model cannot embed (see
    /// [`SentenceEmbedder::embed_ids`]).
    #[error("input ids, row {row}: {message}")]
    BadIds {
        /// Which row of the input.
        row: usize,
        /// What was wrong and what was expected.
        message: String,
    },
}

/// One vector per input text.
pub type Embeddings = Vec<Vec<f32>>;

/// How the embedder runs.
///
/// Memory: the weights and their packed copies are held once; each batch
/// shape compiled on the CPU adds its own arena and plan (a few MB for
/// short batches, tens of MB for 32 x 256 tokens), kept in a
/// least-recently-used cache of at most [`EmbedOptions::cache_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Hybrid plan (compiled segments + thunks) instead of thunks only.
    pub hybrid: bool,
    /// Worker threads (`None`: rayon's default).
    pub threads: Option<usize>,
    /// Apply the graph optimizer (fusion passes).
    pub optimize: bool,
    /// CPU: store matmul weights as f16 (see `CpuOptions::f16_weights`);
    /// faster where weight bytes dominate (short inputs), embeddings within
    /// ~1e-4 of the f32 ones.
    pub f16_weights: bool,
    /// CPU: matmuls in bf16 with f32 accumulation (see `CpuOptions::bf16`:
    /// half the weight bytes, not faster than f32 on the CPUs measured).
    pub bf16: bool,
    /// CPU: the most bytes of compiled shapes (arena and plan per
    /// (batch, sequence length) shape) kept for reuse; the least recently
    /// used shapes beyond it are dropped (and compiled again if they come
    /// back). The shape in use is always kept, whatever its size, so `0`
    /// keeps exactly one. Default [`DEFAULT_CACHE_BYTES`].
    pub cache_bytes: usize,
    /// CPU: sequence lengths are padded with masked `[PAD]` tokens up to a
    /// multiple of this and at least [`MIN_PADDED_LEN`] (capped at the
    /// model's maximum length), so batches of similar lengths share one
    /// compiled shape ([`padded_len`]). The padding is masked out of
    /// attention and pooling: embeddings match the unpadded ones (to float
    /// rounding, ~1e-6). `1` pads only short inputs (to the minimum).
    /// Default [`CPU_SEQ_BUCKET`].
    pub seq_bucket: usize,
}

/// Default [`EmbedOptions::cache_bytes`]: 512 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 512 << 20;

/// Default [`EmbedOptions::seq_bucket`] on the CPU. Small: a model run
/// costs about as much per token at 4 tokens of padding as at 16, so
/// coarser buckets only add padded work (short sentences of 8-23 tokens
/// padded to 16 gave 1.49x the real tokens, to 4 1.10x); the shapes it
/// adds compile in a few milliseconds each (weights are shared).
pub const CPU_SEQ_BUCKET: usize = 4;

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            hybrid: true,
            threads: None,
            optimize: true,
            f16_weights: false,
            bf16: false,
            cache_bytes: DEFAULT_CACHE_BYTES,
            seq_bucket: CPU_SEQ_BUCKET,
        }
    }
}

/// What the CPU shape cache of a [`SentenceEmbedder`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStats {
    /// The cached `(batch, seq, tokens)` shapes, least recently used first.
    pub shapes: Vec<(usize, usize, bool)>,
    /// Arena and plan bytes of the cached shapes together.
    pub plan_bytes: usize,
    /// The budget ([`EmbedOptions::cache_bytes`]).
    pub budget_bytes: usize,
    /// Shapes compiled so far (including ones compiled again after eviction).
    pub compiled: usize,
    /// Shapes dropped from the cache so far.
    pub evicted: usize,
}

/// Where a [`SentenceEmbedder`] runs.
#[derive(Debug, Clone, Default)]
pub enum EmbedDevice {
    /// The CPU backend (mode and threads from [`EmbedOptions`]). One
    /// compiled model per batch shape, all sharing one copy of the weights,
    /// their packed copies and one thread pool, in a byte-bounded cache
    /// (see [`EmbedOptions::cache_bytes`] and [`EmbedOptions::seq_bucket`]).
    #[default]
    Cpu,
    /// A CUDA GPU (feature `cuda`), with these options (mode, precision).
    /// One compiled model is kept: a batch of another shape re-targets it
    /// (`CudaModel::set_graph`), so the weights stay on the device and
    /// only the CUDA graphs are captured again. Sequences are padded with
    /// masked tokens to a multiple of [`CUDA_SEQ_BUCKET`], so batches of
    /// similar lengths share one shape bucket (the padding is masked out
    /// of attention and pooling: the embeddings do not change).
    #[cfg(feature = "cuda")]
    Cuda(rlx_cuda::CudaOptions),
}

/// Sequence lengths on CUDA are rounded up to a multiple of this.
pub const CUDA_SEQ_BUCKET: usize = 32;

/// A loaded sentence-embedding model.
pub struct SentenceEmbedder {
    cfg: BertConfig,
    st: StConfig,
    tokenizer: BertTokenizer,
    weights: Vec<(String, Tensor)>,
    opts: EmbedOptions,
    models: ByteLru<(usize, usize, bool), CpuModel>,
    compiled: usize,
    evicted: usize,
    device: EmbedDevice,
    /// The CUDA model and the (batch, seq, tokens) bucket it is planned for.
    #[cfg(feature = "cuda")]
    gpu: Option<((usize, usize, bool), rlx_cuda::CudaModel)>,
}

impl SentenceEmbedder {
    /// Load `config.json`, `tokenizer.json`, `sentence_bert_config.json` and
    /// `model.safetensors` from `dir`, validating every tensor.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        Self::load_with(dir, EmbedOptions::default())
    }

    /// [`SentenceEmbedder::load`] with options.
    pub fn load_with(dir: impl AsRef<Path>, opts: EmbedOptions) -> Result<Self, ModelError> {
        Self::load_on(dir, opts, EmbedDevice::Cpu)
    }

    /// [`SentenceEmbedder::load`] with options, to run on `device`.
    pub fn load_on(
        dir: impl AsRef<Path>,
        opts: EmbedOptions,
        device: EmbedDevice,
    ) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let (cfg, max_len) = crate::bert::load_dir_config(dir)?;
        let st = StConfig::from_dir(dir)?;
        let tokenizer = BertTokenizer::from_dir(dir, Some(max_len))?;
        let weights = load_weights(dir, &cfg.params())?;
        Ok(SentenceEmbedder {
            cfg,
            st,
            tokenizer,
            weights,
            opts,
            models: ByteLru::new(opts.cache_bytes),
            compiled: 0,
            evicted: 0,
            device,
            #[cfg(feature = "cuda")]
            gpu: None,
        })
    }

    /// The loaded weights, by graph param name (linear weights `[in, out]`).
    pub fn weights(&self) -> &[(String, Tensor)] {
        &self.weights
    }

    /// Where the embedder runs.
    pub fn device(&self) -> &EmbedDevice {
        &self.device
    }

    /// The (optimized, if so configured) graph for a batch shape.
    pub fn graph_for(
        &self,
        batch: usize,
        seq: usize,
        tokens: bool,
    ) -> Result<rlx_ir::Graph, ModelError> {
        let g = build_graph_pooled(
            &self.cfg,
            batch,
            seq,
            BertOutputs {
                pooled: true,
                tokens,
            },
            &self.st.pooling,
        )
        .map_err(|e| ModelError::Graph(e.to_string()))?;
        if !self.opts.optimize {
            return Ok(g);
        }
        let opt = rlx_opt::OptOptions {
            target: std::sync::Arc::new(|_: &rlx_ir::Op| true),
            ..Default::default()
        };
        Ok(rlx_opt::optimize(&g, &opt)
            .map_err(|e| ModelError::Graph(e.to_string()))?
            .0)
    }

    /// The model config.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &BertTokenizer {
        &self.tokenizer
    }

    /// Embedding width (the hidden size times the number of pooling modes).
    pub fn dim(&self) -> usize {
        self.st.pooling.dim(self.cfg.hidden_size)
    }

    /// What the directory's sentence-transformers files say: pooling,
    /// normalization, prompts.
    pub fn st_config(&self) -> &StConfig {
        &self.st
    }

    /// The pooling (modes, `include_prompt`, normalization).
    pub fn pooling(&self) -> &Pooling {
        &self.st.pooling
    }

    /// The model's named prompts (`config_sentence_transformers.json`).
    pub fn prompts(&self) -> &std::collections::BTreeMap<String, String> {
        &self.st.prompts
    }

    /// The prompt [`embed`](Self::embed) prepends (`default_prompt_name`), if any.
    pub fn default_prompt_name(&self) -> Option<&str> {
        self.st.default_prompt_name.as_deref()
    }

    /// The compiled model for exactly this batch shape, compiling it on
    /// first use (see [`EmbedOptions::cache_bytes`]). A new shape shares the
    /// weights, their packed copies and the thread pool of the shapes
    /// already compiled ([`CpuModel::compile_sharing`]); compiling it may
    /// drop the least recently used shapes.
    pub fn model_for(
        &mut self,
        batch: usize,
        seq: usize,
        tokens: bool,
    ) -> Result<&mut CpuModel, ModelError> {
        let key = (batch, seq, tokens);
        if !self.models.contains(&key) {
            let g = self.graph_for(batch, seq, tokens)?;
            let m = match self.models.most_recent_mut() {
                Some(donor) => donor.compile_sharing(g)?,
                None => {
                    let mut m = CpuModel::compile(
                        g,
                        &CpuOptions {
                            hybrid: self.opts.hybrid,
                            threads: self.opts.threads,
                            f16_weights: self.opts.f16_weights,
                            bf16: self.opts.bf16,
                            ..Default::default()
                        },
                    )?;
                    for (name, t) in &self.weights {
                        m.set_param_tensor(name, t.clone())?;
                    }
                    m
                }
            };
            let bytes = m.plan_bytes();
            self.evicted += self.models.insert(key, m, bytes).len();
            self.compiled += 1;
        }
        Ok(self.models.get_mut(&key).expect("inserted above"))
    }

    /// Compile now (without running) the CPU shapes of 1 to `max_rows`
    /// rows at every padded length up to `max_len` tokens ([`padded_len`]),
    /// so that the first batches of those shapes do not wait for a compile
    /// (a few ms each; the arenas are allocated on first use). Returns how
    /// many shapes were compiled. Shapes beyond the cache budget
    /// ([`EmbedOptions::cache_bytes`]) push out the least recently used, so
    /// this is meant for small bounds. CUDA compiles per batch as it comes:
    /// nothing is done there.
    pub fn warm(&mut self, max_rows: usize, max_len: usize) -> Result<usize, ModelError> {
        #[cfg(feature = "cuda")]
        if let EmbedDevice::Cuda(_) = &self.device {
            return Ok(0);
        }
        let (bucket, top) = (self.seq_bucket(), self.cfg.max_seq());
        let mut lens: Vec<usize> = (1..=max_len.min(top))
            .map(|l| padded_len(l, bucket, top))
            .collect();
        lens.dedup();
        let before = self.compiled;
        for &s in &lens {
            for b in 1..=max_rows {
                self.model_for(b, s, false)?;
            }
        }
        Ok(self.compiled - before)
    }

    /// The plan of the CPU model for a `batch` x `seq` pooled-embedding
    /// batch (compiled now if this shape is not cached; `seq` as it runs,
    /// i.e. after padding to [`EmbedOptions::seq_bucket`]). On CUDA the
    /// CPU plan is compiled all the same (it is what `rlx plan` shows for
    /// the CPU).
    pub fn plan_for(
        &mut self,
        batch: usize,
        seq: usize,
    ) -> Result<crate::CompiledPlan, ModelError> {
        let m = self.model_for(batch, seq, false)?;
        Ok(crate::CompiledPlan {
            name: format!("embeddings {batch}x{seq}"),
            nodes: m.graph().len(),
            report: m.report().clone(),
        })
    }

    /// What the CPU shape cache holds.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            shapes: self.models.keys(),
            plan_bytes: self.models.total_bytes(),
            budget_bytes: self.models.budget(),
            compiled: self.compiled,
            evicted: self.evicted,
        }
    }

    /// Embed `texts` as one padded batch: one vector per text (L2-normalized
    /// when the model has a Normalize module, or has no `modules.json`).
    /// The model's default prompt (`default_prompt_name`), if any, is
    /// prepended to each text, as sentence-transformers' `encode` does.
    pub fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(self.embed_batch(texts, false, None)?.0)
    }

    /// [`embed`](Self::embed) with the prompt named `prompt_name` (e.g.
    /// e5's `"query"`) prepended to each text; `None` is the default
    /// prompt. A name the model does not define is
    /// [`ModelError::UnknownPrompt`].
    pub fn embed_with_prompt(
        &mut self,
        texts: &[&str],
        prompt_name: Option<&str>,
    ) -> Result<Embeddings, ModelError> {
        let prompt = self.st.prompt(prompt_name)?.to_string();
        Ok(self.embed_batch(texts, false, Some(&prompt))?.0)
    }

    /// [`embed`](Self::embed) with `prompt` itself prepended to each text
    /// (`""` for none, overriding the default prompt), as
    /// sentence-transformers' `encode(prompt=...)`.
    pub fn embed_with_prompt_text(
        &mut self,
        texts: &[&str],
        prompt: &str,
    ) -> Result<Embeddings, ModelError> {
        Ok(self.embed_batch(texts, false, Some(prompt))?.0)
    }

    /// Embed, also returning the last hidden states per text (`len x hidden`, unpadded).
    pub fn embed_with_tokens(
        &mut self,
        texts: &[&str],
    ) -> Result<(Embeddings, Embeddings), ModelError> {
        let (e, t) = self.embed_batch(texts, true, None)?;
        Ok((e, t.unwrap_or_default()))
    }

    /// Embed many texts in few model runs, one vector per text in input
    /// order, each **bit for bit** [`embed`](Self::embed) of that text
    /// alone: texts are tokenized together, grouped by their padded
    /// length (their length rounded up to [`EmbedOptions::seq_bucket`],
    /// as a text alone is padded; see [`plan_runs`]) and each group runs
    /// in batches of at most `max_rows` texts. Compared with
    /// [`embed`](Self::embed) of the whole list (every row padded to the
    /// longest), short texts carry no padding for long ones.
    pub fn embed_many(
        &mut self,
        texts: &[&str],
        max_rows: usize,
    ) -> Result<Embeddings, ModelError> {
        Ok(self.embed_planned(texts, false, None, max_rows)?.0)
    }

    /// [`embed_many`](Self::embed_many), also returning the last hidden
    /// states per text (`len x hidden`, unpadded), as
    /// [`embed_with_tokens`](Self::embed_with_tokens) of each text alone.
    pub fn embed_many_with_tokens(
        &mut self,
        texts: &[&str],
        max_rows: usize,
    ) -> Result<(Embeddings, Embeddings), ModelError> {
        let (e, t) = self.embed_planned(texts, true, None, max_rows)?;
        Ok((e, t.unwrap_or_default()))
    }

    /// [`embed_ids`](Self::embed_ids) of many rows in few model runs, each
    /// row's vector bit for bit `embed_ids` of that row alone (grouped by
    /// padded length as [`embed_many`](Self::embed_many) groups texts).
    pub fn embed_ids_many(
        &mut self,
        rows: &[Vec<i64>],
        max_rows: usize,
    ) -> Result<Embeddings, ModelError> {
        let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        for run in plan_runs(
            &lengths,
            self.seq_bucket(),
            self.cfg.max_seq(),
            max_rows,
            usize::MAX,
        ) {
            let part: Vec<Vec<i64>> = run.iter().map(|&i| rows[i].clone()).collect();
            for (&i, v) in run.iter().zip(self.embed_ids(&part)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// The sequence bucket rows are padded to on this embedder's device.
    pub fn seq_bucket(&self) -> usize {
        #[cfg(feature = "cuda")]
        if let EmbedDevice::Cuda(_) = &self.device {
            return CUDA_SEQ_BUCKET;
        }
        self.opts.seq_bucket.max(1)
    }

    fn embed_planned(
        &mut self,
        texts: &[&str],
        tokens: bool,
        prompt: Option<&str>,
        max_rows: usize,
    ) -> Result<(Embeddings, Option<Embeddings>), ModelError> {
        if texts.is_empty() {
            return Ok((vec![], tokens.then(Vec::new)));
        }
        let (all, prompt_len) = self.tokenize(texts, prompt)?;
        let mut emb: Embeddings = vec![Vec::new(); texts.len()];
        let mut toks: Option<Embeddings> = tokens.then(|| vec![Vec::new(); texts.len()]);
        let runs = plan_runs(
            &all.lengths,
            self.seq_bucket(),
            self.cfg.max_seq(),
            max_rows,
            usize::MAX,
        );
        for run in runs {
            let (e, t) = self.run_batch(all.select(&run), tokens, prompt_len)?;
            for (k, &i) in run.iter().enumerate() {
                emb[i] = e[k].clone();
            }
            if let (Some(dst), Some(t)) = (toks.as_mut(), t) {
                for (&i, row) in run.iter().zip(t) {
                    dst[i] = row;
                }
            }
        }
        Ok((emb, toks))
    }

    /// The number of leading tokens `prompt` takes when prepended to a
    /// text (`0` for `""`), as sentence-transformers counts them: the
    /// `prompt_len` that [`embed_ids_with_prompt_len`](Self::embed_ids_with_prompt_len)
    /// takes for ids tokenized from [`StConfig::input_text`] of that prompt.
    pub fn prompt_len(&self, prompt: &str) -> Result<usize, ModelError> {
        if prompt.is_empty() {
            return Ok(0);
        }
        Ok(self.tokenizer.prompt_length(prompt)?)
    }

    /// Tokenize `texts` with the prompt (`None`: the default prompt)
    /// prepended and the model's lower-casing: one batch padded to the
    /// longest, and the prompt's length in tokens.
    fn tokenize(&self, texts: &[&str], prompt: Option<&str>) -> Result<(Batch, usize), ModelError> {
        let prompt = match prompt {
            Some(p) => p.to_string(),
            None => self.st.prompt(None)?.to_string(),
        };
        let prompt_len = self.prompt_len(&prompt)?;
        let inputs: Vec<String> = texts
            .iter()
            .map(|t| self.st.input_text(&prompt, t))
            .collect();
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        Ok((self.tokenizer.encode_batch(&refs)?, prompt_len))
    }

    /// `prompt`: `None` is the default prompt.
    fn embed_batch(
        &mut self,
        texts: &[&str],
        tokens: bool,
        prompt: Option<&str>,
    ) -> Result<(Embeddings, Option<Embeddings>), ModelError> {
        if texts.is_empty() {
            return Ok((vec![], tokens.then(Vec::new)));
        }
        let (batch, prompt_len) = self.tokenize(texts, prompt)?;
        self.run_batch(batch, tokens, prompt_len)
    }

    /// Embed rows of token ids used as they are (special tokens such as
    /// `[CLS]` and `[SEP]` included by the caller; no truncation, no
    /// prompt): one vector per row, pooled and normalized as
    /// [`embed`](Self::embed) pools and normalizes. For the ids the
    /// tokenizer gives a text, this is bit for bit
    /// [`embed_with_prompt_text`](Self::embed_with_prompt_text) of that
    /// text with the prompt `""` in the same batch (and
    /// [`embed`](Self::embed) of it for a model without a default prompt).
    /// Errors name the row: an empty row, a row longer than the model's
    /// maximum length, or an id outside the vocabulary.
    pub fn embed_ids(&mut self, rows: &[Vec<i64>]) -> Result<Embeddings, ModelError> {
        self.embed_ids_with_prompt_len(rows, 0)
    }

    /// [`embed_ids`](Self::embed_ids) of rows whose first `prompt_len` ids
    /// are a prompt's (as [`prompt_len`](Self::prompt_len) counts them):
    /// with a Pooling module whose `include_prompt` is false, those tokens
    /// are left out of pooling. For the ids the tokenizer gives
    /// [`StConfig::input_text`] of a prompt and a text, this is bit for bit
    /// [`embed_with_prompt_text`](Self::embed_with_prompt_text) of that
    /// text with that prompt in the same batch; with the default prompt,
    /// [`embed`](Self::embed) of the text. This is how a caller that
    /// tokenizes itself (the server) applies the model's prompt.
    pub fn embed_ids_with_prompt_len(
        &mut self,
        rows: &[Vec<i64>],
        prompt_len: usize,
    ) -> Result<Embeddings, ModelError> {
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let max_len = self.tokenizer.max_seq_len();
        let vocab = self.cfg.vocab_size as i64;
        for (row, r) in rows.iter().enumerate() {
            let bad = |message: String| Err(ModelError::BadIds { row, message });
            if r.is_empty() {
                return bad("empty: expected at least one token id".into());
            }
            if r.len() > max_len {
                return bad(format!(
                    "{} ids: expected at most {max_len} (the model's maximum length)",
                    r.len()
                ));
            }
            if let Some(&id) = r.iter().find(|&&id| id < 0 || id >= vocab) {
                return bad(format!("id {id}: expected 0 to {}", vocab - 1));
            }
        }
        let seq = rows.iter().map(Vec::len).max().unwrap_or(0);
        let pad = i64::from(self.tokenizer.pad_id());
        let mut batch = Batch {
            ids: Vec::with_capacity(rows.len() * seq),
            attention_mask: Vec::with_capacity(rows.len() * seq),
            token_type_ids: vec![0; rows.len() * seq],
            batch: rows.len(),
            seq,
            lengths: rows.iter().map(Vec::len).collect(),
        };
        for r in rows {
            batch.ids.extend_from_slice(r);
            batch.ids.extend(std::iter::repeat_n(pad, seq - r.len()));
            batch
                .attention_mask
                .extend(std::iter::repeat_n(1.0f32, r.len()));
            batch
                .attention_mask
                .extend(std::iter::repeat_n(0.0f32, seq - r.len()));
        }
        Ok(self.run_batch(batch, false, prompt_len)?.0)
    }

    /// Run one tokenized batch (padded to the device's bucket first);
    /// `prompt_len` tokens at the start of each row are the prompt's.
    fn run_batch(
        &mut self,
        batch: Batch,
        tokens: bool,
        prompt_len: usize,
    ) -> Result<(Embeddings, Option<Embeddings>), ModelError> {
        let (h, dim) = (self.cfg.hidden_size, self.dim());
        #[cfg(feature = "cuda")]
        if let EmbedDevice::Cuda(opts) = &self.device {
            let opts = opts.clone();
            let padded = pad_batch(batch, CUDA_SEQ_BUCKET, self.cfg.max_seq());
            let pool = pool_inputs(&self.st.pooling, &padded.lengths, padded.seq, prompt_len);
            let outs = self.run_cuda(&padded, &pool, tokens, &opts)?;
            check_outputs_finite(&outs)?;
            return Ok(split_outputs(&outs, &padded, h, dim, tokens));
        }
        let batch = pad_batch(batch, self.opts.seq_bucket, self.cfg.max_seq());
        let pool = pool_inputs(&self.st.pooling, &batch.lengths, batch.seq, prompt_len);
        let model = self.model_for(batch.batch, batch.seq, tokens)?;
        let outs = model.run(&run_inputs(&batch, &pool))?;
        check_outputs_finite(&outs)?;
        Ok(split_outputs(&outs, &batch, h, dim, tokens))
    }

    /// Run a (padded) batch on the CUDA model, re-targeting it to this
    /// batch's shape bucket first if needed.
    #[cfg(feature = "cuda")]
    fn run_cuda(
        &mut self,
        batch: &Batch,
        pool: &[(&'static str, Vec<f32>)],
        tokens: bool,
        opts: &rlx_cuda::CudaOptions,
    ) -> Result<Vec<Tensor>, ModelError> {
        let key = (batch.batch, batch.seq, tokens);
        let current = self.gpu.as_ref().map(|(k, _)| *k);
        if current != Some(key) {
            let g = self.graph_for(batch.batch, batch.seq, tokens)?;
            match &mut self.gpu {
                Some((k, m)) => {
                    m.set_graph(g)?;
                    *k = key;
                }
                None => {
                    let mut m = rlx_cuda::CudaModel::compile(g, opts)?;
                    for (name, t) in &self.weights {
                        m.set_param_tensor(name, t.clone())?;
                    }
                    self.gpu = Some((key, m));
                }
            }
        }
        let (_, model) = self.gpu.as_mut().expect("set above");
        Ok(model.run(&run_inputs(batch, pool))?)
    }
}

/// The graph inputs of a batch: ids, token types, the attention mask and
/// the pooling inputs ([`pool_inputs`]).
pub(crate) fn run_inputs<'a>(
    batch: &'a Batch,
    pool: &'a [(&'static str, Vec<f32>)],
) -> Vec<(&'a str, TensorRef<'a>)> {
    let mut v = vec![
        ("input_ids", TensorRef::I64(&batch.ids)),
        ("token_type_ids", TensorRef::I64(&batch.token_type_ids)),
        ("attention_mask", TensorRef::F32(&batch.attention_mask)),
    ];
    v.extend(pool.iter().map(|(n, x)| (*n, TensorRef::F32(x))));
    v
}

/// Read `params` (name, shape as bound, stored transposed) from
/// `dir/model.safetensors`, whose names may carry a `bert.`/`roberta.`
/// prefix ([`crate::bert::weight_prefix`]); linear weights are transposed
/// to `[in, out]`. Every tensor's shape and dtype is checked.
pub(crate) fn load_weights(
    dir: &Path,
    params: &[(String, Vec<usize>, bool)],
) -> Result<Vec<(String, Tensor)>, ModelError> {
    let weights_path = dir.join("model.safetensors");
    if !weights_path.exists() {
        return Err(ModelError::MissingFile {
            path: weights_path,
            what: "the model weights",
        });
    }
    let file = SafeTensorsFile::open(&weights_path)?;
    let prefix = crate::bert::weight_prefix(file.names());
    let mut weights = Vec::new();
    for (name, dims, transposed) in params {
        let stored = if *transposed {
            vec![dims[1], dims[0]]
        } else {
            dims.clone()
        };
        // Task heads (pooler, classifier) sit outside the encoder's prefix.
        let full = format!("{prefix}{name}");
        let key = if file.names().contains(&full.as_str()) {
            full
        } else {
            name.clone()
        };
        let data = file.tensor_f32(&key, &stored)?;
        let v = if *transposed {
            let (o, i) = (stored[0], stored[1]);
            let mut t = vec![0f32; o * i];
            for r in 0..o {
                for c in 0..i {
                    t[c * o + r] = data[r * i + c];
                }
            }
            t
        } else {
            data.into_owned()
        };
        weights.push((name.clone(), Tensor::f32(dims, v)));
    }
    Ok(weights)
}

/// The length a row of `len` tokens is padded to: a multiple of `bucket`
/// and at least [`MIN_PADDED_LEN`], at most `max_len`, never less than
/// `len` (as [`pad_batch`] pads a batch whose longest row has `len`
/// tokens).
pub fn padded_len(len: usize, bucket: usize, max_len: usize) -> usize {
    let b = bucket.max(1);
    (len.max(MIN_PADDED_LEN).div_ceil(b) * b)
        .min(max_len)
        .max(len)
}

/// Rows are padded to at least this many tokens. Below it, a one-row
/// batch is so small that some kernels take their serial path where a
/// larger batch of the same length takes the parallel one, and the two
/// round differently (~1e-7); from 8 tokens on, a row's embedding is the
/// same bit for bit whatever it is batched with (tested in
/// `tests/embed_many.rs`), which the server's dynamic batching relies on.
pub const MIN_PADDED_LEN: usize = 8;

/// How to run rows of these token `lengths` in few model runs without
/// changing any row's result: the indices of each run, in run order.
///
/// A row's embedding depends, bit for bit, on its own tokens and the
/// length it is padded to, not on the other rows of its batch (every
/// kernel works row by row; padding is masked). So rows are grouped by
/// [`padded_len`] (as a row alone is padded), shortest group first, and a
/// group larger than `max_rows` rows or `max_tokens` padded tokens is split
/// into near-equal runs (33 rows at most 32 a run: 17 + 16, not 32 + 1,
/// since a run of few rows costs more per row). Within a run, rows keep
/// their input order. Every run holds at least one row.
pub fn plan_runs(
    lengths: &[usize],
    bucket: usize,
    max_len: usize,
    max_rows: usize,
    max_tokens: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<(usize, usize)> = lengths
        .iter()
        .enumerate()
        .map(|(i, &l)| (padded_len(l, bucket, max_len), i))
        .collect();
    order.sort_unstable();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let len = order[i].0;
        let end = i + order[i..].iter().take_while(|(l, _)| *l == len).count();
        let cap = max_rows.min(max_tokens / len.max(1)).max(1);
        let n = end - i;
        let k = n.div_ceil(cap);
        let (base, extra) = (n / k, n % k);
        let mut at = i;
        for r in 0..k {
            let size = base + usize::from(r < extra);
            runs.push(order[at..at + size].iter().map(|&(_, j)| j).collect());
            at += size;
        }
        i = end;
    }
    runs
}

/// `batch` with every row padded by masked `[PAD]` (id 0) tokens to a
/// multiple of `bucket` (at most `max_len`, and never shorter than it was).
pub(crate) fn pad_batch(batch: Batch, bucket: usize, max_len: usize) -> Batch {
    let s = batch.seq;
    let padded = padded_len(s, bucket, max_len);
    if padded == s {
        return batch;
    }
    let mut out = Batch {
        ids: Vec::with_capacity(batch.batch * padded),
        attention_mask: Vec::with_capacity(batch.batch * padded),
        token_type_ids: Vec::with_capacity(batch.batch * padded),
        batch: batch.batch,
        seq: padded,
        lengths: batch.lengths.clone(),
    };
    for r in 0..batch.batch {
        let row = r * s..(r + 1) * s;
        out.ids.extend_from_slice(&batch.ids[row.clone()]);
        out.ids.extend(std::iter::repeat_n(0, padded - s));
        out.attention_mask
            .extend_from_slice(&batch.attention_mask[row.clone()]);
        out.attention_mask
            .extend(std::iter::repeat_n(0.0, padded - s));
        out.token_type_ids
            .extend_from_slice(&batch.token_type_ids[row]);
        out.token_type_ids
            .extend(std::iter::repeat_n(0, padded - s));
    }
    out
}

/// [`ModelError::NonFinite`] naming the first NaN or infinity in the
/// outputs (one pass over them).
fn check_outputs_finite(outs: &[Tensor]) -> Result<(), ModelError> {
    for (output, t) in outs.iter().enumerate() {
        if let TensorData::F32(v) = &*t.data {
            if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                let what = if output == 0 {
                    "pooled embeddings"
                } else {
                    "token states"
                };
                return Err(ModelError::NonFinite {
                    output,
                    what,
                    index,
                    value,
                });
            }
        }
    }
    Ok(())
}

/// Pooled rows (`dim` wide; and unpadded token rows, `h` wide) from a run's outputs.
fn split_outputs(
    outs: &[Tensor],
    batch: &Batch,
    h: usize,
    dim: usize,
    tokens: bool,
) -> (Embeddings, Option<Embeddings>) {
    let (b, s) = (batch.batch, batch.seq);
    {
        let f32s = |t: &Tensor| match &*t.data {
            TensorData::F32(v) => v.clone(),
            _ => Vec::new(),
        };
        let pooled = f32s(&outs[0]);
        let emb = pooled.chunks(dim).map(|c| c.to_vec()).collect();
        let toks = tokens.then(|| {
            let all = f32s(&outs[1]);
            (0..b)
                .map(|i| all[i * s * h..(i * s + batch.lengths[i]) * h].to_vec())
                .collect()
        });
        debug_assert_eq!(outs[0].shape.dtype, DType::F32);
        (emb, toks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_to_a_bucket_masks_the_new_tokens() {
        let b = Batch {
            ids: vec![101, 7, 102, 101, 102, 0],
            attention_mask: vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
            token_type_ids: vec![0; 6],
            batch: 2,
            seq: 3,
            lengths: vec![3, 2],
        };
        // At least MIN_PADDED_LEN (8) tokens, then a multiple of the bucket.
        let p = pad_batch(b.clone(), 4, 512);
        assert_eq!((p.batch, p.seq), (2, 8));
        assert_eq!(
            p.ids,
            vec![101, 7, 102, 0, 0, 0, 0, 0, 101, 102, 0, 0, 0, 0, 0, 0]
        );
        let mask = |n: usize| (0..8).map(move |i| if i < n { 1.0 } else { 0.0 });
        assert_eq!(
            p.attention_mask,
            mask(3).chain(mask(2)).collect::<Vec<f32>>()
        );
        assert_eq!(p.lengths, vec![3, 2]);
        assert_eq!(pad_batch(b.clone(), 16, 512).seq, 16);
        // Never past the model's length, never shorter than the batch.
        assert_eq!(pad_batch(b.clone(), 4, 3).seq, 3);
        assert_eq!(pad_batch(b, 1, 5).seq, 5);
    }

    #[test]
    fn runs_split_a_group_evenly_within_the_row_and_token_limits() {
        // 33 rows of one padded length, at most 32 a run: 17 + 16.
        let runs = plan_runs(&[10; 33], 4, 512, 32, usize::MAX);
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), vec![17, 16]);
        // Input order kept within a run.
        assert_eq!(runs[0], (0..17).collect::<Vec<_>>());
        // 12 rows of 12 padded tokens, at most 100 tokens a run (8 rows):
        // 6 + 6.
        let runs = plan_runs(&[11; 12], 4, 512, 1024, 100);
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), vec![6, 6]);
        // A row alone over the budget still runs (alone).
        assert_eq!(plan_runs(&[300], 4, 512, 1024, 100), vec![vec![0]]);
        // Different padded lengths never share a run: 5 -> 8, 8 -> 8, 9 -> 12.
        // (3 -> 8 too: at least MIN_PADDED_LEN.)
        assert_eq!(
            plan_runs(&[9, 5, 8], 4, 512, 1024, usize::MAX),
            vec![vec![1, 2], vec![0]]
        );
        assert!(plan_runs(&[], 4, 512, 8, 8).is_empty());
    }
}
