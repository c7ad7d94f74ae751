//! [`LlamaModel`]: a loaded decoder with a KV cache, and the generation loop.

use super::graph::{
    batch_cache_names, build_graph, cache_names, extend_bias, swa_input, swa_keep, Phase,
};
use super::{LlamaConfig, LlamaError, LlamaWeights};
use rlx_cpu::{CpuModel, CpuOptions};
use rlx_formats::GgufFile;
#[cfg(feature = "cuda")]
use rlx_ir::{Graph, Op};
use rlx_ir::{Tensor, TensorData};
use rlx_runtime::{Executable, TensorRef};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most sequences one [`LlamaModel::decode_batch`] step takes (and the
/// largest batched decode graph [`build_graph`] builds).
pub const MAX_DECODE_BATCH: usize = 16;

/// Distinct ids of the models of this process (for [`KvCache`] ownership).
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

/// Where a [`LlamaModel`] runs.
#[derive(Debug, Clone)]
pub enum LlamaDevice {
    /// The CPU backend with these options.
    Cpu(CpuOptions),
    /// A CUDA GPU (feature `cuda`). The weights and the KV caches live on
    /// the device once, shared by the decode model and the prefill model.
    #[cfg(feature = "cuda")]
    Cuda(rlx_cuda::CudaOptions),
}

/// The compiled decode model and the last prefill model, per backend.
// One per loaded model: the size difference between the variants is moot.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Cpu {
        decode: CpuModel,
        /// The last compiled prefill (or extend) model and its phase,
        /// sharing the decode model's params and packed weights.
        prefill: Option<(Phase, CpuModel)>,
        /// Whether the caches currently live in the decode model (else in
        /// the prefill model).
        caches_in_decode: bool,
        /// The batched decode model of `N` sequences at index `N`, compiled
        /// on first use (sharing the decode model's weights) and kept.
        batch: Vec<Option<CpuModel>>,
    },
    /// The prefill and batched decode models use the decode model's device
    /// buffers for every weight (`CudaModel::share_params`); the caches are
    /// device buffers moved (not copied) between the decode and the
    /// prefill model, as on the CPU (`CudaModel::take_param_buffer` /
    /// `set_param_buffer`: the same buffers at the same addresses keep each
    /// model's captured CUDA graphs).
    #[cfg(feature = "cuda")]
    Cuda {
        opts: rlx_cuda::CudaOptions,
        decode: rlx_cuda::CudaModel,
        prefill: Option<(Phase, rlx_cuda::CudaModel)>,
        /// Whether the caches currently live in the decode model.
        caches_in_decode: bool,
        /// The batched decode model of `N` sequences at index `N`.
        batch: Vec<Option<rlx_cuda::CudaModel>>,
    },
}

/// Names of every param of `g` but the KV caches (`cache.*`): the
/// weights, which a CUDA prefill or batched decode model shares with the
/// decode model.
#[cfg(feature = "cuda")]
fn weight_names(g: &Graph) -> Vec<String> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Param { name } if !name.starts_with("cache.") => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// The names of every layer's k and v cache params, in [`KvCache`] order.
fn all_cache_names(n_layers: usize) -> Vec<String> {
    (0..n_layers)
        .flat_map(|l| {
            let (k, v) = cache_names(l);
            [k, v]
        })
        .collect()
}

/// The index of the largest logit (the first one on ties; NaN never wins).
/// `0` for an empty slice.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// A Llama-family decoder compiled for the CPU or a CUDA GPU, with a KV
/// cache of `ctx_len` positions.
///
/// [`prefill`](Self::prefill) runs a prompt from position 0 (resetting the
/// cache) and returns the next-token logits; [`decode`](Self::decode) feeds
/// one more token. The caches are params moved (not copied) between the
/// prefill model (one per prompt length, the last one kept) and the decode
/// model: host tensors on the CPU, device buffers on CUDA (where every
/// model shares the decode model's weight buffers).
pub struct LlamaModel {
    config: LlamaConfig,
    weights: LlamaWeights,
    ctx_len: usize,
    engine: Engine,
    /// Tokens currently in the cache.
    pos: usize,
    /// This model's id, stamped on the caches it hands out.
    id: u64,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("config", &self.config)
            .field("ctx_len", &self.ctx_len)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl LlamaModel {
    /// Load a GGUF file with a context of `ctx_len` positions, compiling
    /// with default CPU options (thunks).
    pub fn load(gguf_path: impl AsRef<Path>, ctx_len: usize) -> Result<LlamaModel, LlamaError> {
        Self::load_with(gguf_path, ctx_len, CpuOptions::default())
    }

    /// Load a GGUF file with explicit CPU options (e.g. `hybrid: true`).
    pub fn load_with(
        gguf_path: impl AsRef<Path>,
        ctx_len: usize,
        opts: CpuOptions,
    ) -> Result<LlamaModel, LlamaError> {
        Self::load_on(gguf_path, ctx_len, LlamaDevice::Cpu(opts))
    }

    /// Load a GGUF file to run on `device`.
    pub fn load_on(
        gguf_path: impl AsRef<Path>,
        ctx_len: usize,
        device: LlamaDevice,
    ) -> Result<LlamaModel, LlamaError> {
        let f = GgufFile::open(gguf_path)?;
        let config = LlamaConfig::from_gguf(&f)?;
        let weights = LlamaWeights::load(&f, &config)?;
        Self::from_weights_on(weights, ctx_len, device)
    }

    /// Build from already loaded weights, on the CPU.
    pub fn from_weights(
        weights: LlamaWeights,
        ctx_len: usize,
        opts: CpuOptions,
    ) -> Result<LlamaModel, LlamaError> {
        Self::from_weights_on(weights, ctx_len, LlamaDevice::Cpu(opts))
    }

    /// Build from already loaded weights, on `device`.
    pub fn from_weights_on(
        weights: LlamaWeights,
        ctx_len: usize,
        device: LlamaDevice,
    ) -> Result<LlamaModel, LlamaError> {
        if ctx_len == 0 {
            return Err(LlamaError::ContextOverflow { needed: 1, ctx_len });
        }
        weights.config.check_ctx(ctx_len)?;
        let config = weights.config.clone();
        let g = build_graph(&weights, Phase::Decode, ctx_len)?;
        let kv = config.kv_dim();
        let zero_caches = |m: &mut dyn Executable| -> Result<(), LlamaError> {
            for l in 0..config.n_layers {
                let (k, v) = cache_names(l);
                for name in [k, v] {
                    let t = Tensor::f32(&[1, ctx_len, kv], vec![0.0; ctx_len * kv]);
                    m.set_param_tensor(&name, t)?;
                }
            }
            Ok(())
        };
        let engine = match device {
            LlamaDevice::Cpu(opts) => {
                let mut decode = CpuModel::compile(g, &opts)?;
                bind_weights(&mut decode, &weights)?;
                zero_caches(&mut decode)?;
                Engine::Cpu {
                    decode,
                    prefill: None,
                    caches_in_decode: true,
                    batch: Vec::new(),
                }
            }
            #[cfg(feature = "cuda")]
            LlamaDevice::Cuda(opts) => {
                let mut decode = rlx_cuda::CudaModel::compile(g, &opts)?;
                bind_weights(&mut decode, &weights)?;
                // Zeroed device buffers (no host copy of the caches).
                for name in all_cache_names(config.n_layers) {
                    let p = decode.new_param_buffer(&name)?;
                    decode.set_param_buffer(&name, p)?;
                }
                Engine::Cuda {
                    opts,
                    decode,
                    prefill: None,
                    caches_in_decode: true,
                    batch: Vec::new(),
                }
            }
        };
        Ok(LlamaModel {
            config,
            weights,
            ctx_len,
            engine,
            pos: 0,
            id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Context length (KV cache positions).
    pub fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    /// Tokens currently in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The compiled decode model (for reports and memory stats).
    pub fn decode_model(&self) -> &dyn Executable {
        match &self.engine {
            Engine::Cpu { decode, .. } => decode,
            #[cfg(feature = "cuda")]
            Engine::Cuda { decode, .. } => decode,
        }
    }

    /// The plans of the graphs this model holds compiled now, in this
    /// order: `decode` (one sequence), `decode_batch N` for each batched
    /// decode graph compiled so far (see
    /// [`prepare_decode_batch`](Self::prepare_decode_batch)), and the last
    /// prefill graph, `prefill N` (N prompt tokens) or `extend N`.
    pub fn compiled_plans(&self) -> Vec<crate::CompiledPlan> {
        let plan = |name: String, nodes: usize, m: &dyn Executable| crate::CompiledPlan {
            name,
            nodes,
            report: m.report().clone(),
        };
        let phase_name = |p: &Phase| match p {
            Phase::Prefill { seq_len } => format!("prefill {seq_len}"),
            Phase::Extend { seq_len } => format!("extend {seq_len}"),
            Phase::Decode => "decode".to_string(),
            Phase::DecodeBatch { batch } => format!("decode_batch {batch}"),
        };
        let mut out = Vec::new();
        match &self.engine {
            Engine::Cpu {
                decode,
                prefill,
                batch,
                ..
            } => {
                out.push(plan("decode".into(), decode.graph().len(), decode));
                for (n, m) in batch.iter().enumerate() {
                    if let Some(m) = m {
                        out.push(plan(format!("decode_batch {n}"), m.graph().len(), m));
                    }
                }
                if let Some((p, m)) = prefill {
                    out.push(plan(phase_name(p), m.graph().len(), m));
                }
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda {
                decode,
                prefill,
                batch,
                ..
            } => {
                out.push(plan("decode".into(), decode.graph().len(), decode));
                for (n, m) in batch.iter().enumerate() {
                    if let Some(m) = m {
                        out.push(plan(format!("decode_batch {n}"), m.graph().len(), m));
                    }
                }
                if let Some((p, m)) = prefill {
                    out.push(plan(phase_name(p), m.graph().len(), m));
                }
            }
        }
        out
    }

    /// Device operations (kernel launches, gemms, copies) per decode step,
    /// inside CUDA graphs included: `Some` on CUDA after the first decode.
    pub fn decode_device_ops(&self) -> Option<usize> {
        match &self.engine {
            Engine::Cpu { .. } => None,
            #[cfg(feature = "cuda")]
            Engine::Cuda { decode, .. } => decode.device_ops(),
        }
    }

    /// The sliding window, when some layer of the model uses one (its
    /// graphs then take the `*_swa` mask inputs).
    fn swa_window(&self) -> Option<usize> {
        let b = &self.config.block;
        b.sliding_window
            .filter(|_| (0..self.config.n_layers).any(|l| b.is_swa(l)))
    }

    fn check_ids(&self, ids: &[u32], first_position: usize) -> Result<(), LlamaError> {
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= self.config.vocab {
                return Err(LlamaError::TokenOutOfRange {
                    id,
                    position: first_position + i,
                    vocab: self.config.vocab,
                });
            }
        }
        Ok(())
    }

    /// Move every cache param between the prefill and decode models (host
    /// tensors on the CPU, device buffers on CUDA; never a copy).
    fn move_caches(&mut self, to_decode: bool) -> Result<(), LlamaError> {
        let names = all_cache_names(self.config.n_layers);
        let expected = || {
            format!(
                "KV cache f32 [1, {}, {}]",
                self.ctx_len,
                self.config.kv_dim()
            )
        };
        match &mut self.engine {
            Engine::Cpu {
                decode,
                prefill,
                caches_in_decode,
                ..
            } => {
                if *caches_in_decode == to_decode {
                    return Ok(());
                }
                let Some((_, pre)) = prefill.as_mut() else {
                    return Ok(());
                };
                let (from, to) = if to_decode {
                    (pre, decode)
                } else {
                    (decode, pre)
                };
                for name in names {
                    let t = from
                        .take_param(&name)
                        .ok_or_else(|| LlamaError::MissingTensor {
                            name: name.clone(),
                            expected: expected(),
                        })?;
                    to.set_param_tensor(&name, t)?;
                }
                *caches_in_decode = to_decode;
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda {
                decode,
                prefill,
                caches_in_decode,
                ..
            } => {
                if *caches_in_decode == to_decode {
                    return Ok(());
                }
                let Some((_, pre)) = prefill.as_mut() else {
                    return Ok(());
                };
                let (from, to) = if to_decode {
                    (pre, decode)
                } else {
                    (decode, pre)
                };
                for name in names {
                    let p = from.take_param_buffer(&name)?.ok_or_else(|| {
                        LlamaError::MissingTensor {
                            name: name.clone(),
                            expected: expected(),
                        }
                    })?;
                    to.set_param_buffer(&name, p)?;
                }
                *caches_in_decode = to_decode;
            }
        }
        Ok(())
    }

    /// Compile the prefill-slot model for `phase` (a prefill or an extend of
    /// some length) unless the last one is that.
    fn ensure_prefill(&mut self, phase: Phase) -> Result<(), LlamaError> {
        let have = match &self.engine {
            Engine::Cpu { prefill, .. } => prefill.as_ref().map(|p| p.0),
            #[cfg(feature = "cuda")]
            Engine::Cuda { prefill, .. } => prefill.as_ref().map(|p| p.0),
        };
        if have == Some(phase) {
            return Ok(());
        }
        // Bring the caches home before dropping the old prefill model.
        self.move_caches(true)?;
        let g = build_graph(&self.weights, phase, self.ctx_len)?;
        match &mut self.engine {
            Engine::Cpu {
                decode, prefill, ..
            } => {
                // Drop the old model first (its arena is freed), then share
                // the decode model's params and packed weights (the decode
                // model holds every param: the caches are home), so a new
                // prompt length costs a plan, not a repack of the weights.
                *prefill = None;
                let m = decode.compile_sharing(g)?;
                *prefill = Some((phase, m));
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda {
                opts,
                decode,
                prefill,
                ..
            } => {
                // The weights are shared; the caches move in for each run.
                let names = weight_names(&g);
                // Drop the old model first: its device memory is freed.
                *prefill = None;
                let mut m = rlx_cuda::CudaModel::compile(g, opts)?;
                m.share_params(decode, &names)?;
                *prefill = Some((phase, m));
            }
        }
        Ok(())
    }

    /// Run `ids` from position 0 (discarding any previous cache contents)
    /// and return the logits for the next token (`vocab` floats).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, LlamaError> {
        self.prefill_step(ids, false).map(|(logits, _)| logits)
    }

    /// [`prefill`](Self::prefill), timing every dispatch (CPU only; on
    /// CUDA the profile is empty).
    pub fn prefill_profiled(
        &mut self,
        ids: &[u32],
    ) -> Result<(Vec<f32>, Vec<rlx_cpu::ProfileEntry>), LlamaError> {
        self.prefill_step(ids, true)
    }

    fn prefill_step(
        &mut self,
        ids: &[u32],
        profile: bool,
    ) -> Result<(Vec<f32>, Vec<rlx_cpu::ProfileEntry>), LlamaError> {
        let s = ids.len();
        if s == 0 {
            return Err(LlamaError::EmptyPrompt);
        }
        if s > self.ctx_len {
            return Err(LlamaError::ContextOverflow {
                needed: s,
                ctx_len: self.ctx_len,
            });
        }
        self.check_ids(ids, 0)?;
        let ids64: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let pos: Vec<i64> = (0..s as i64).collect();
        let (out, prof) = self.run_prefill_slot(
            Phase::Prefill { seq_len: s },
            &[
                ("ids", TensorRef::I64(&ids64)),
                ("pos", TensorRef::I64(&pos)),
            ],
            profile,
        )?;
        self.pos = s;
        Ok((self.logits(out)?, prof))
    }

    /// Feed `ids` after the tokens already in the cache, at positions
    /// `p..p + ids.len()` where `p` is [`position`](Self::position), and
    /// return the logits for the next token: a later chunk of a long prompt,
    /// or the next turn of a chat. `prefill(a)` then `prefill_continue(b)`
    /// gives the logits of `prefill(a ++ b)`; at position 0 this is
    /// [`prefill`](Self::prefill). Errors with `ContextOverflow` (and changes
    /// nothing) when `p + ids.len()` exceeds the context.
    pub fn prefill_continue(&mut self, ids: &[u32]) -> Result<Vec<f32>, LlamaError> {
        let p = self.pos;
        if p == 0 {
            return self.prefill(ids);
        }
        let s = ids.len();
        if s == 0 {
            return Err(LlamaError::EmptyPrompt);
        }
        if p + s > self.ctx_len {
            return Err(LlamaError::ContextOverflow {
                needed: p + s,
                ctx_len: self.ctx_len,
            });
        }
        self.check_ids(ids, p)?;
        let ids64: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let pos: Vec<i64> = (p as i64..(p + s) as i64).collect();
        let bias = extend_bias(p, s, self.ctx_len);
        let swa_name = swa_input("kv_bias");
        let bias_swa = self.swa_window().map(|w| {
            let mut b = bias.clone();
            for (i, row) in b.chunks_exact_mut(self.ctx_len).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    if !swa_keep(p + i, j, w) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
            b
        });
        let start = [p as i64];
        let mut inputs = vec![
            ("ids", TensorRef::I64(&ids64)),
            ("pos", TensorRef::I64(&pos)),
            ("start", TensorRef::I64(&start)),
            ("kv_bias", TensorRef::F32(&bias)),
        ];
        if let Some(b) = &bias_swa {
            inputs.push((swa_name.as_str(), TensorRef::F32(b)));
        }
        let (out, _) = self.run_prefill_slot(Phase::Extend { seq_len: s }, &inputs, false)?;
        self.pos = p + s;
        self.logits(out)
    }

    /// Run the prefill-slot model of `phase` on `inputs`, with the caches
    /// moved in for the run and back to the decode model after it.
    fn run_prefill_slot(
        &mut self,
        phase: Phase,
        inputs: &[(&str, TensorRef<'_>)],
        profile: bool,
    ) -> Result<(Vec<Tensor>, Vec<rlx_cpu::ProfileEntry>), LlamaError> {
        self.ensure_prefill(phase)?;
        self.move_caches(false)?;
        let out = match &mut self.engine {
            Engine::Cpu { prefill, .. } => match prefill.as_mut() {
                Some((_, m)) if profile => m.run_profiled(inputs),
                Some((_, m)) => m.run(inputs).map(|o| (o, Vec::new())),
                None => return Err(LlamaError::NoPrefill),
            },
            #[cfg(feature = "cuda")]
            Engine::Cuda { prefill, .. } => match prefill.as_mut() {
                Some((_, m)) => m.run(inputs).map(|o| (o, Vec::new())),
                None => return Err(LlamaError::NoPrefill),
            },
        };
        // Hand the caches to the decode model even if the run failed.
        let moved = self.move_caches(true);
        let out = out?;
        moved?;
        Ok(out)
    }

    /// A fresh (zeroed, empty) KV cache of this model's shape, for
    /// [`swap_cache`](Self::swap_cache): one per sequence a caller keeps.
    /// On the CPU it holds host tensors; on CUDA zeroed device buffers.
    /// On CUDA an allocation that fails gives a cache that every use
    /// rejects with the allocation's error; [`try_new_cache`](Self::try_new_cache)
    /// returns the error instead.
    pub fn new_cache(&self) -> KvCache {
        match self.try_new_cache() {
            Ok(c) => c,
            #[cfg(feature = "cuda")]
            Err(e) => KvCache {
                store: CacheStore::Device {
                    bufs: Vec::new(),
                    error: Some(e.to_string()),
                },
                pos: 0,
                model: self.id,
            },
            #[cfg(not(feature = "cuda"))]
            Err(e) => unreachable!("a host cache cannot fail: {e}"),
        }
    }

    /// [`new_cache`](Self::new_cache), with the error of a device
    /// allocation that fails (CUDA only; on the CPU it always succeeds).
    pub fn try_new_cache(&self) -> Result<KvCache, LlamaError> {
        let kv = self.config.kv_dim();
        let names = all_cache_names(self.config.n_layers);
        let store = match &self.engine {
            Engine::Cpu { .. } => CacheStore::Host(
                names
                    .into_iter()
                    .map(|name| {
                        let t = Tensor::f32(&[1, self.ctx_len, kv], vec![0.0; self.ctx_len * kv]);
                        (name, t)
                    })
                    .collect(),
            ),
            #[cfg(feature = "cuda")]
            Engine::Cuda { decode, .. } => {
                let mut bufs = Vec::with_capacity(names.len());
                for name in names {
                    let p = decode.new_param_buffer(&name)?;
                    bufs.push((name, Some(p)));
                }
                CacheStore::Device { bufs, error: None }
            }
        };
        Ok(KvCache {
            store,
            pos: 0,
            model: self.id,
        })
    }

    /// Put `cache` (its tensors and position) into the model and return the
    /// one it held: the tensors (on CUDA the device buffers) are moved, not
    /// copied. Several sequences can so share one compiled model, each with
    /// its own cache and position: swap a sequence's cache in,
    /// [`prefill`](Self::prefill) or [`decode`](Self::decode) it, swap it
    /// out. Errors (and changes nothing) when `cache` is not of this
    /// model's shape or device (a host cache given to a CUDA model, or the
    /// reverse).
    pub fn swap_cache(&mut self, cache: KvCache) -> Result<KvCache, LlamaError> {
        let kv = self.config.kv_dim();
        let want = self.config.n_layers * 2;
        let names = all_cache_names(self.config.n_layers);
        let bad = |detail: String| {
            LlamaError::MissingTensor {
            name: "KvCache".into(),
            expected: format!(
                "{want} f32 tensors cache.k.{{l}}/cache.v.{{l}} of [1, {}, {kv}] and a position <= {}{detail}",
                self.ctx_len, self.ctx_len
            ),
        }
        };
        if cache.pos > self.ctx_len {
            return Err(bad(String::new()));
        }
        match (&mut self.engine, cache.store) {
            (Engine::Cpu { .. }, CacheStore::Host(tensors)) => {
                let ok = tensors.len() == want
                    && tensors.iter().zip(&names).all(|((name, t), want_name)| {
                        name == want_name
                            && t.shape.dims[..] == [1, self.ctx_len, kv]
                            && matches!(&*t.data, TensorData::F32(d) if d.len() == self.ctx_len * kv)
                    });
                if !ok {
                    return Err(bad(String::new()));
                }
                self.move_caches(true)?;
                let decode = match &mut self.engine {
                    Engine::Cpu { decode, .. } => decode,
                    #[cfg(feature = "cuda")]
                    Engine::Cuda { .. } => unreachable!("matched above"),
                };
                let mut old = Vec::with_capacity(want);
                for (name, t) in tensors {
                    let prev =
                        decode
                            .take_param(&name)
                            .ok_or_else(|| LlamaError::MissingTensor {
                                name: name.clone(),
                                expected: format!("KV cache f32 [1, {}, {kv}]", self.ctx_len),
                            })?;
                    decode.set_param_tensor(&name, t)?;
                    old.push((name, prev));
                }
                let pos = std::mem::replace(&mut self.pos, cache.pos);
                Ok(KvCache {
                    store: CacheStore::Host(old),
                    pos,
                    model: self.id,
                })
            }
            #[cfg(feature = "cuda")]
            (Engine::Cuda { decode, .. }, CacheStore::Device { bufs, error }) => {
                if let Some(e) = error {
                    return Err(bad(format!(" (this cache's allocation failed: {e})")));
                }
                let ok = bufs.len() == want
                    && bufs.iter().zip(&names).all(|((name, p), want_name)| {
                        name == want_name
                            && p.as_ref().is_some_and(|p| {
                                p.shape().dims[..] == [1, self.ctx_len, kv]
                                    && p.shape().dtype == rlx_ir::DType::F32
                            })
                    });
                if !ok {
                    return Err(bad(String::new()));
                }
                for (name, p) in &bufs {
                    decode.check_param_buffer(name, p.as_ref().expect("checked above"))?;
                }
                self.move_caches(true)?;
                let decode = match &mut self.engine {
                    Engine::Cuda { decode, .. } => decode,
                    Engine::Cpu { .. } => unreachable!("matched above"),
                };
                let mut old = Vec::with_capacity(want);
                for (name, p) in bufs {
                    let prev = decode.take_param_buffer(&name)?.ok_or_else(|| {
                        LlamaError::MissingTensor {
                            name: name.clone(),
                            expected: format!("KV cache f32 [1, {}, {kv}]", self.ctx_len),
                        }
                    })?;
                    decode.set_param_buffer(&name, p.expect("checked above"))?;
                    old.push((name, Some(prev)));
                }
                let pos = std::mem::replace(&mut self.pos, cache.pos);
                Ok(KvCache {
                    store: CacheStore::Device {
                        bufs: old,
                        error: None,
                    },
                    pos,
                    model: self.id,
                })
            }
            #[cfg(feature = "cuda")]
            (Engine::Cpu { .. }, CacheStore::Device { .. }) => Err(bad(
                " on the host (this cache holds CUDA device buffers)".into(),
            )),
            #[cfg(feature = "cuda")]
            (Engine::Cuda { .. }, CacheStore::Host(_)) => Err(bad(
                " in CUDA device buffers (this cache holds host tensors)".into(),
            )),
        }
    }

    /// Feed one token at the next position and return the logits for the
    /// token after it.
    pub fn decode(&mut self, id: u32) -> Result<Vec<f32>, LlamaError> {
        self.decode_step(id, false).map(|(logits, _)| logits)
    }

    /// [`decode`](Self::decode), timing every dispatch of the step (CPU
    /// only; on CUDA the profile is empty).
    pub fn decode_profiled(
        &mut self,
        id: u32,
    ) -> Result<(Vec<f32>, Vec<rlx_cpu::ProfileEntry>), LlamaError> {
        self.decode_step(id, true)
    }

    fn decode_step(
        &mut self,
        id: u32,
        profile: bool,
    ) -> Result<(Vec<f32>, Vec<rlx_cpu::ProfileEntry>), LlamaError> {
        if self.pos == 0 {
            return Err(LlamaError::NoPrefill);
        }
        let p = self.pos;
        if p >= self.ctx_len {
            return Err(LlamaError::ContextOverflow {
                needed: p + 1,
                ctx_len: self.ctx_len,
            });
        }
        self.check_ids(&[id], p)?;
        self.move_caches(true)?;
        let mut mask = vec![0.0f32; self.ctx_len];
        mask[..=p].fill(1.0);
        let swa_name = swa_input("kv_mask");
        let mask_swa = self.swa_window().map(|w| {
            let mut m = vec![0.0f32; self.ctx_len];
            m[(p + 1).saturating_sub(w)..=p].fill(1.0);
            m
        });
        let id64 = [i64::from(id)];
        let p64 = [p as i64];
        let mut inputs = vec![
            ("ids", TensorRef::I64(&id64)),
            ("pos", TensorRef::I64(&p64)),
            ("kv_mask", TensorRef::F32(&mask)),
        ];
        if let Some(m) = &mask_swa {
            inputs.push((swa_name.as_str(), TensorRef::F32(m)));
        }
        let (out, prof) = match &mut self.engine {
            Engine::Cpu { decode, .. } if profile => decode.run_profiled(&inputs)?,
            Engine::Cpu { decode, .. } => (decode.run(&inputs)?, Vec::new()),
            #[cfg(feature = "cuda")]
            Engine::Cuda { decode, .. } => (decode.run(&inputs)?, Vec::new()),
        };
        self.pos = p + 1;
        Ok((self.logits(out)?, prof))
    }

    /// Feed one token to each of several sequences in one step and return
    /// each one's logits for the token after it (`vocab` floats per
    /// sequence, in the order given).
    ///
    /// `steps[b]` is sequence `b`'s KV cache (made by
    /// [`new_cache`](Self::new_cache) and filled by a
    /// [`prefill`](Self::prefill) through [`swap_cache`](Self::swap_cache))
    /// and the token to feed at its position. One graph runs for all of
    /// them: the projections, FFN and head multiply the `[N, d]` activations
    /// (each weight is read once per step, not once per sequence), rope uses
    /// each sequence's own position, and attention runs per sequence over
    /// its own cache. The caches stay in their own buffers: they are bound
    /// to the step's graph by moving the tensors in and back out, with no
    /// copy, and each advances by one position. The model's own cache and
    /// [`position`](Self::position) are not touched.
    ///
    /// Each row is computed as the one-row [`decode`](Self::decode) of
    /// that sequence computes it: the norms, rope and elementwise ops work
    /// row by row, cache writes and attention run per sequence at the
    /// one-row shapes, and the quantized matmuls, on panels (AVX2 or
    /// AVX-512 VNNI), give each row bit for bit its one-row product at any
    /// row count up to 32; so the logits are bit-identical to the solo
    /// decode there (`tests/llama_batch.rs`). Without panels (a portable
    /// build) the many-row GGUF-layout kernel rounds differently (about
    /// 1e-4).
    ///
    /// One graph per `N` is built and compiled on first use (sharing this
    /// model's weights and packed copies) and kept;
    /// [`prepare_decode_batch`](Self::prepare_decode_batch) compiles them
    /// ahead of time.
    ///
    /// Errors, before anything runs or any cache changes:
    /// [`LlamaError::BatchSize`] for no sequences or more than
    /// [`MAX_DECODE_BATCH`]; [`LlamaError::BatchSequence`] naming the
    /// sequence and wrapping `ForeignCache` (a cache made by another model,
    /// or of another shape), `NoPrefill` (an empty cache),
    /// `ContextOverflow` (a full cache) or `TokenOutOfRange`.
    ///
    /// On CUDA the caches are device buffers, bound to rows `0..N` of the
    /// step's model by moving the handles in and back out
    /// (`CudaModel::set_param_buffer` / `take_param_buffer`, no copy); a
    /// binding at the same addresses as the last step keeps the model's
    /// resolved schedule, in hybrid mode its captured CUDA graph, so a
    /// steady batch replays one graph per step (a change of the sequences
    /// in some row captures it again). The rows are not bit-identical to
    /// the solo decode there (cuBLAS picks other kernels for `N` rows),
    /// but agree to rounding.
    pub fn decode_batch(
        &mut self,
        steps: &mut [(&mut KvCache, u32)],
    ) -> Result<Vec<Vec<f32>>, LlamaError> {
        let n = steps.len();
        if n == 0 || n > MAX_DECODE_BATCH {
            return Err(LlamaError::BatchSize {
                batch: n,
                max: MAX_DECODE_BATCH,
            });
        }
        for (index, (cache, id)) in steps.iter().enumerate() {
            self.check_step(cache, *id)
                .map_err(|e| LlamaError::BatchSequence {
                    index,
                    source: Box::new(e),
                })?;
        }
        self.prepare_decode_batch(n)?;
        let ctx = self.ctx_len;
        let ids: Vec<i64> = steps.iter().map(|(_, id)| i64::from(*id)).collect();
        let pos: Vec<i64> = steps.iter().map(|(c, _)| c.pos as i64).collect();
        let mut mask = vec![0.0f32; n * ctx];
        for (row, (c, _)) in mask.chunks_exact_mut(ctx).zip(steps.iter()) {
            row[..=c.pos].fill(1.0);
        }
        let swa_name = swa_input("kv_mask");
        let mask_swa = self.swa_window().map(|w| {
            let mut m = vec![0.0f32; n * ctx];
            for (row, (c, _)) in m.chunks_exact_mut(ctx).zip(steps.iter()) {
                row[(c.pos + 1).saturating_sub(w)..=c.pos].fill(1.0);
            }
            m
        });
        let mut inputs = vec![
            ("ids", TensorRef::I64(&ids)),
            ("pos", TensorRef::I64(&pos)),
            ("kv_mask", TensorRef::F32(&mask)),
        ];
        if let Some(m) = &mask_swa {
            inputs.push((swa_name.as_str(), TensorRef::F32(m)));
        }
        let missing = || LlamaError::BatchSize {
            batch: n,
            max: MAX_DECODE_BATCH,
        };
        let out = match &mut self.engine {
            Engine::Cpu { batch, .. } => {
                let model = batch
                    .get_mut(n)
                    .and_then(Option::as_mut)
                    .ok_or_else(missing)?;
                run_batch_cpu(model, steps, &inputs)?
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda { batch, .. } => {
                let model = batch
                    .get_mut(n)
                    .and_then(Option::as_mut)
                    .ok_or_else(missing)?;
                run_batch_cuda(model, steps, &inputs)?
            }
        };
        let logits = self.batch_logits(out, n)?;
        for (c, _) in steps.iter_mut() {
            c.pos += 1;
        }
        Ok(logits)
    }

    /// Compile the batched decode graphs of 1 to `max_batch` sequences that
    /// are not compiled yet (each is otherwise compiled on the first
    /// [`decode_batch`](Self::decode_batch) of its size). Errors with
    /// [`LlamaError::BatchSize`] when `max_batch` exceeds
    /// [`MAX_DECODE_BATCH`].
    pub fn prepare_decode_batch(&mut self, max_batch: usize) -> Result<(), LlamaError> {
        if max_batch > MAX_DECODE_BATCH {
            return Err(LlamaError::BatchSize {
                batch: max_batch,
                max: MAX_DECODE_BATCH,
            });
        }
        let missing = |e: &Engine, n: usize| match e {
            Engine::Cpu { batch, .. } => batch.get(n).is_none_or(Option::is_none),
            #[cfg(feature = "cuda")]
            Engine::Cuda { batch, .. } => batch.get(n).is_none_or(Option::is_none),
        };
        for n in 1..=max_batch {
            if !missing(&self.engine, n) {
                continue;
            }
            // The decode model holds every param again, so all of its
            // values (packed weights included) are shared.
            self.move_caches(true)?;
            let g = build_graph(&self.weights, Phase::DecodeBatch { batch: n }, self.ctx_len)?;
            match &mut self.engine {
                Engine::Cpu { decode, batch, .. } => {
                    let m = decode.compile_sharing(g)?;
                    if batch.len() <= n {
                        batch.resize_with(n + 1, || None);
                    }
                    batch[n] = Some(m);
                }
                #[cfg(feature = "cuda")]
                Engine::Cuda {
                    opts,
                    decode,
                    batch,
                    ..
                } => {
                    // The weights are the decode model's device buffers;
                    // the caches are bound per step.
                    let names = weight_names(&g);
                    let mut m = rlx_cuda::CudaModel::compile(g, opts)?;
                    m.share_params(decode, &names)?;
                    if batch.len() <= n {
                        batch.resize_with(n + 1, || None);
                    }
                    batch[n] = Some(m);
                }
            }
        }
        Ok(())
    }

    /// Why `cache` cannot take `id` in a batched step (or `Ok`).
    fn check_step(&self, cache: &KvCache, id: u32) -> Result<(), LlamaError> {
        let kv = self.config.kv_dim();
        let want = self.config.n_layers * 2;
        if cache.model != self.id {
            return Err(LlamaError::ForeignCache {
                detail: format!(
                    "made by another model (#{}), not by this one (#{}): use this model's new_cache/swap_cache",
                    cache.model, self.id
                ),
            });
        }
        let shape_ok = |dims: &[usize]| dims == [1, self.ctx_len, kv];
        match (&self.engine, &cache.store) {
            (Engine::Cpu { .. }, CacheStore::Host(tensors)) => {
                if tensors.len() != want {
                    return Err(LlamaError::ForeignCache {
                        detail: format!(
                            "{} tensors, expected {want} (k and v of {} layers)",
                            tensors.len(),
                            self.config.n_layers
                        ),
                    });
                }
                for (i, (name, t)) in tensors.iter().enumerate() {
                    let ok = shape_ok(&t.shape.dims)
                        && matches!(&*t.data, TensorData::F32(d) if d.len() == self.ctx_len * kv);
                    if !ok {
                        return Err(LlamaError::ForeignCache {
                            detail: format!(
                                "tensor {i} '{name}' is {}, expected f32 [1, {}, {kv}]",
                                t.shape, self.ctx_len
                            ),
                        });
                    }
                }
            }
            #[cfg(feature = "cuda")]
            (Engine::Cuda { .. }, CacheStore::Device { bufs, error }) => {
                if let Some(e) = error {
                    return Err(LlamaError::ForeignCache {
                        detail: format!("its device allocation failed: {e}"),
                    });
                }
                if bufs.len() != want {
                    return Err(LlamaError::ForeignCache {
                        detail: format!(
                            "{} buffers, expected {want} (k and v of {} layers)",
                            bufs.len(),
                            self.config.n_layers
                        ),
                    });
                }
                for (i, (name, p)) in bufs.iter().enumerate() {
                    let Some(p) = p else {
                        return Err(LlamaError::ForeignCache {
                            detail: format!(
                                "buffer {i} '{name}' was lost (a failed step could not take it back)"
                            ),
                        });
                    };
                    if !shape_ok(&p.shape().dims) || p.shape().dtype != rlx_ir::DType::F32 {
                        return Err(LlamaError::ForeignCache {
                            detail: format!(
                                "buffer {i} '{name}' is {}, expected f32 [1, {}, {kv}]",
                                p.shape(),
                                self.ctx_len
                            ),
                        });
                    }
                }
            }
            #[cfg(feature = "cuda")]
            (Engine::Cpu { .. }, CacheStore::Device { .. }) => {
                return Err(LlamaError::ForeignCache {
                    detail: "holds CUDA device buffers; this model runs on the CPU".into(),
                })
            }
            #[cfg(feature = "cuda")]
            (Engine::Cuda { .. }, CacheStore::Host(_)) => {
                return Err(LlamaError::ForeignCache {
                    detail: "holds host tensors; this model runs on CUDA".into(),
                })
            }
        }
        let p = cache.pos;
        if p == 0 {
            return Err(LlamaError::NoPrefill);
        }
        if p >= self.ctx_len {
            return Err(LlamaError::ContextOverflow {
                needed: p + 1,
                ctx_len: self.ctx_len,
            });
        }
        self.check_ids(&[id], p)
    }

    /// The `[N, 1, vocab]` output of a batched step, one row per sequence.
    fn batch_logits(&self, out: Vec<Tensor>, n: usize) -> Result<Vec<Vec<f32>>, LlamaError> {
        let vocab = self.config.vocab;
        let bad = |found: String| LlamaError::BadOutput { found, vocab };
        let t = out
            .into_iter()
            .next()
            .ok_or_else(|| bad("nothing".into()))?;
        match &*t.data {
            TensorData::F32(v) if v.len() == n * vocab => {
                Ok(v.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
            }
            _ => Err(bad(format!("{} for {n} sequences", t.shape))),
        }
    }

    /// The logits from the graph's single output, moved out when the
    /// tensor is not shared (no copy).
    fn logits(&self, out: Vec<Tensor>) -> Result<Vec<f32>, LlamaError> {
        let vocab = self.config.vocab;
        let bad = |found: String| LlamaError::BadOutput { found, vocab };
        let t = out
            .into_iter()
            .next()
            .ok_or_else(|| bad("nothing".into()))?;
        if t.shape.numel() != vocab {
            return Err(bad(t.shape.to_string()));
        }
        let shape = t.shape.to_string();
        match std::sync::Arc::try_unwrap(t.data) {
            Ok(TensorData::F32(v)) if v.len() == vocab => Ok(v),
            Ok(_) => Err(bad(shape)),
            Err(shared) => match &*shared {
                TensorData::F32(v) if v.len() == vocab => Ok(v.clone()),
                _ => Err(bad(shape)),
            },
        }
    }

    /// Prefill `prompt_ids`, then pick and feed tokens until `max_new` are
    /// generated or `eos` is picked (it is included). `sample` maps logits
    /// to the next id (e.g. [`argmax`] for greedy decoding). Returns the
    /// new ids only. Fails up front if the prompt plus the fed tokens
    /// would not fit the context.
    pub fn generate(
        &mut self,
        prompt_ids: &[u32],
        max_new: usize,
        eos: Option<u32>,
        sample: &mut dyn FnMut(&[f32]) -> u32,
    ) -> Result<Vec<u32>, LlamaError> {
        self.generate_stream(prompt_ids, max_new, eos, &mut |l, _| sample(l), &mut |_| {
            true
        })
    }

    /// [`generate`](Self::generate) with the history and a token callback:
    /// `sample(logits, history)` sees every id so far (prompt then generated,
    /// e.g. for a repetition penalty), and `on_token(id)` is called as soon
    /// as each id is picked; returning `false` stops after that token.
    pub fn generate_stream(
        &mut self,
        prompt_ids: &[u32],
        max_new: usize,
        eos: Option<u32>,
        sample: &mut dyn FnMut(&[f32], &[u32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Vec<u32>, LlamaError> {
        let needed = prompt_ids.len() + max_new.saturating_sub(1);
        if needed > self.ctx_len {
            return Err(LlamaError::ContextOverflow {
                needed,
                ctx_len: self.ctx_len,
            });
        }
        if max_new == 0 {
            return Ok(Vec::new());
        }
        let mut history = prompt_ids.to_vec();
        let mut logits = self.prefill(prompt_ids)?;
        loop {
            let id = sample(&logits, &history);
            history.push(id);
            let go_on = on_token(id);
            if !go_on || Some(id) == eos || history.len() - prompt_ids.len() == max_new {
                return Ok(history.split_off(prompt_ids.len()));
            }
            logits = self.decode(id)?;
        }
    }

    /// Greedy [`generate`](Self::generate).
    pub fn generate_greedy(
        &mut self,
        prompt_ids: &[u32],
        max_new: usize,
        eos: Option<u32>,
    ) -> Result<Vec<u32>, LlamaError> {
        self.generate(prompt_ids, max_new, eos, &mut |l| argmax(l))
    }
}

/// One sequence's KV cache (every layer's `cache.k.{l}` / `cache.v.{l}`)
/// and its position, held outside a [`LlamaModel`]: see
/// [`LlamaModel::new_cache`] and [`LlamaModel::swap_cache`]. Host tensors
/// for a model on the CPU, device buffers for one on CUDA.
#[derive(Debug)]
pub struct KvCache {
    store: CacheStore,
    pos: usize,
    /// Id of the model that made it (or last held it).
    model: u64,
}

/// Where a [`KvCache`]'s tensors live.
#[derive(Debug)]
enum CacheStore {
    /// Host tensors (the CPU backend), by param name.
    Host(Vec<(String, Tensor)>),
    /// Device buffers (CUDA), by param name; `None` while bound to a
    /// batched step's model (or lost, if a failed step could not take it
    /// back). `error`: the allocation of a [`LlamaModel::new_cache`] failed.
    #[cfg(feature = "cuda")]
    Device {
        bufs: Vec<(String, Option<rlx_cuda::DeviceParam>)>,
        error: Option<String>,
    },
}

impl KvCache {
    /// Tokens this cache holds.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Whether the cache lives in CUDA device memory.
    pub fn on_device(&self) -> bool {
        match &self.store {
            CacheStore::Host(_) => false,
            #[cfg(feature = "cuda")]
            CacheStore::Device { .. } => true,
        }
    }
}

/// The batched decode graph's param for tensor `j` of a cache (`k` then
/// `v` of each layer, [`KvCache`]'s order) of sequence `b`.
fn batch_cache_param(j: usize, b: usize) -> String {
    let (k, v) = batch_cache_names(j / 2, b);
    if j.is_multiple_of(2) {
        k
    } else {
        v
    }
}

/// The CPU batched step: move each cache's tensors into row `b`'s params,
/// run, and move them back (whether the run worked or not).
fn run_batch_cpu(
    model: &mut CpuModel,
    steps: &mut [(&mut KvCache, u32)],
    inputs: &[(&str, TensorRef<'_>)],
) -> Result<Vec<Tensor>, LlamaError> {
    fn host(c: &mut KvCache) -> &mut Vec<(String, Tensor)> {
        match &mut c.store {
            CacheStore::Host(t) => t,
            #[cfg(feature = "cuda")]
            CacheStore::Device { .. } => unreachable!("checked by check_step"),
        }
    }
    // Move each cache's tensors into its sequence's params...
    let mut bound = Ok(());
    'bind: for (b, (cache, _)) in steps.iter_mut().enumerate() {
        for (j, (_, t)) in host(cache).iter_mut().enumerate() {
            let name = batch_cache_param(j, b);
            let t = std::mem::replace(t, Tensor::f32(&[0], Vec::new()));
            if let Err(e) = model.set_param_tensor(&name, t) {
                bound = Err(e);
                break 'bind;
            }
        }
    }
    let out = match bound {
        Ok(()) => model.run(inputs),
        Err(e) => Err(e),
    };
    // ...and back, whether the run worked or not.
    let mut lost = None;
    for (b, (cache, _)) in steps.iter_mut().enumerate() {
        for (j, (_, t)) in host(cache).iter_mut().enumerate() {
            let name = batch_cache_param(j, b);
            match model.take_param(&name) {
                Some(back) => *t = back,
                None => lost = lost.or(Some(name)),
            }
        }
    }
    let out = out?;
    if let Some(name) = lost {
        return Err(LlamaError::MissingTensor {
            name,
            expected: "a KV cache bound for the batched decode step".into(),
        });
    }
    Ok(out)
}

/// The CUDA batched step: move each cache's device buffers into row `b`'s
/// params (the same buffers as the last step keep the captured graph),
/// run, and move them back (whether the run worked or not).
#[cfg(feature = "cuda")]
fn run_batch_cuda(
    model: &mut rlx_cuda::CudaModel,
    steps: &mut [(&mut KvCache, u32)],
    inputs: &[(&str, TensorRef<'_>)],
) -> Result<Vec<Tensor>, LlamaError> {
    type Bufs = Vec<(String, Option<rlx_cuda::DeviceParam>)>;
    fn dev(c: &mut KvCache) -> &mut Bufs {
        match &mut c.store {
            CacheStore::Device { bufs, .. } => bufs,
            CacheStore::Host(_) => unreachable!("checked by check_step"),
        }
    }
    let mut bound = Ok(());
    'bind: for (b, (cache, _)) in steps.iter_mut().enumerate() {
        for (j, (_, slot)) in dev(cache).iter_mut().enumerate() {
            let name = batch_cache_param(j, b);
            let Some(p) = slot.take() else {
                continue;
            };
            // Checked first, so a refused buffer stays in its cache.
            if let Err(e) = model.check_param_buffer(&name, &p) {
                *slot = Some(p);
                bound = Err(e);
                break 'bind;
            }
            if let Err(e) = model.set_param_buffer(&name, p) {
                bound = Err(e);
                break 'bind;
            }
        }
    }
    let out = match bound {
        Ok(()) => model.run(inputs),
        Err(e) => Err(e),
    };
    let mut lost = None;
    for (b, (cache, _)) in steps.iter_mut().enumerate() {
        for (j, (_, slot)) in dev(cache).iter_mut().enumerate() {
            let name = batch_cache_param(j, b);
            match model.take_param_buffer(&name) {
                Ok(Some(p)) => *slot = Some(p),
                _ if slot.is_some() => {}
                _ => lost = lost.or(Some(name)),
            }
        }
    }
    let out = out?;
    if let Some(name) = lost {
        return Err(LlamaError::MissingTensor {
            name,
            expected: "a KV cache bound for the batched decode step".into(),
        });
    }
    Ok(out)
}

/// Bind every weight (shared, not copied) into a compiled model.
fn bind_weights(m: &mut dyn Executable, w: &LlamaWeights) -> Result<(), LlamaError> {
    for (name, t) in &w.tensors {
        m.set_param_tensor(name, t.clone())?;
    }
    Ok(())
}
