//! `Session`: compile a graph for a device and run it.

use rlx_cpu::{CpuModel, CpuOptions};
use rlx_ir::{Graph, IrError, Tensor, TensorData};
use rlx_runtime::hybrid::{PlanReport, SplitPolicy};
use rlx_runtime::{Executable, MemoryStats, Precision, RuntimeError, TensorRef};

/// Where a graph runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU by ordinal.
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

/// How a graph is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecMode {
    /// One kernel dispatch per op.
    #[default]
    Thunks,
    /// Compiled segments separated by thunk ranges.
    Hybrid,
}

/// Every error rlx returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The graph is ill-formed.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// Compiling or running failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The requested device is not available in this build or machine.
    #[error("device unavailable: {0}")]
    Device(String),
    /// An output is not f32; use `run_typed`.
    #[error("output {index} is {dtype}, not f32: use run_typed")]
    NotF32 {
        /// Output position.
        index: usize,
        /// Its dtype.
        dtype: rlx_ir::DType,
    },
}

/// Dispatch figures of a compiled model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanStats {
    /// Compiled segments.
    pub compiled_segments: usize,
    /// Thunk ranges.
    pub thunk_ranges: usize,
    /// Dispatches per run: one per compiled segment, one per compute thunk.
    pub dispatches: usize,
}

/// Compiles graphs for one device and mode.
#[derive(Debug, Clone)]
pub struct Session {
    device: Device,
    mode: ExecMode,
    /// The split policy set with [`Session::policy`], if any.
    policy: Option<SplitPolicy>,
    threads: Option<usize>,
    poison: bool,
    precision: Precision,
    f16_weights: bool,
    check_finite: bool,
}

impl Session {
    /// A session on `device`, in Thunks mode with the default split policy
    /// (on the CPU, [`SplitPolicy::default`]; on CUDA, every op the CUDA
    /// segment compiler can lower).
    pub fn new(device: Device) -> Self {
        Session {
            device,
            mode: ExecMode::Thunks,
            policy: None,
            threads: None,
            poison: false,
            precision: Precision::F32,
            f16_weights: false,
            check_finite: false,
        }
    }

    /// Set the execution mode.
    pub fn mode(mut self, mode: ExecMode) -> Self {
        self.mode = mode;
        self
    }

    /// Set the split policy used in Hybrid mode.
    pub fn policy(mut self, policy: SplitPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Run on `n` worker threads instead of the global pool.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    /// Set the arithmetic of float tensors (default f32). `Bf16` and `F16`
    /// store matmul weights and intermediate activations in 16 bits and run
    /// matmuls on tensor cores with f32 accumulation; `Tf32` keeps f32
    /// storage and rounds matmul inputs to TF32. Inputs and outputs stay
    /// f32. On the CPU, `Bf16` rounds matmul weights and the activations
    /// they multiply to bf16 and accumulates in f32 (AVX512-BF16 where
    /// present; see `CpuOptions::bf16`); everything else stays f32. `F16`
    /// and `Tf32` on the CPU are an [`Error::Device`].
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// CPU only: keep the packed copies of matmul weights in f16 (half
    /// the bytes streamed per run; products accumulate in f32). Inputs,
    /// activations and outputs stay f32. Compiling for CUDA with this set
    /// is an [`Error::Device`] (use [`Session::precision`] there).
    pub fn f16_weights(mut self, on: bool) -> Self {
        self.f16_weights = on;
        self
    }

    /// Check every step's outputs for NaN and infinities and fail the run
    /// with [`RuntimeError::NonFinite`] naming the first node (id, op,
    /// shape) that produced one (the environment variable
    /// `RLX_CHECK_FINITE=1` does the same for every model). CPU: thunks
    /// report their own node, compiled segments the first non-finite
    /// boundary output. CUDA: not implemented; compiling with this set on a
    /// CUDA device is an [`Error::Device`] (the environment variable is
    /// ignored there).
    pub fn check_finite(mut self, on: bool) -> Self {
        self.check_finite = on;
        self
    }

    /// Poison arena memory as soon as it is freed (a testing aid).
    pub fn poison_freed(mut self, on: bool) -> Self {
        self.poison = on;
        self
    }

    /// Verify, plan and compile `graph`.
    pub fn compile(&self, graph: Graph) -> Result<CompiledModel, Error> {
        graph.verify()?;
        let exec: Box<dyn Executable> = match self.device {
            Device::Cpu if !matches!(self.precision, Precision::F32 | Precision::Bf16) => {
                return Err(Error::Device(format!(
                    "cpu: precision {} is not supported (f32, or bf16 matmuls)",
                    self.precision
                )))
            }
            Device::Cpu => Box::new(CpuModel::compile(
                graph,
                &CpuOptions {
                    hybrid: self.mode == ExecMode::Hybrid,
                    policy: self.policy.clone().unwrap_or_default(),
                    threads: self.threads,
                    poison_freed: self.poison,
                    f16_weights: self.f16_weights,
                    bf16: self.precision == Precision::Bf16,
                    check_finite: self.check_finite,
                },
            )?),
            #[cfg(feature = "cuda")]
            Device::Cuda(i) if self.check_finite => {
                return Err(Error::Device(format!(
                    "cuda:{i}: check_finite is not implemented on CUDA (run on Device::Cpu to find the first non-finite node)"
                )))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(i) if self.f16_weights => {
                return Err(Error::Device(format!(
                    "cuda:{i}: f16_weights is a CPU option (use precision(Precision::F16))"
                )))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => {
                rlx_cuda::cuda_available().map_err(|e| Error::Device(format!("cuda:{i}: {e}")))?;
                // Every CUDA launch is fixed when it is lowered: shapes are
                // static and attention reads its valid KV length on the device.
                // So the CUDA segment compiler decides by capability (it
                // claims each op it can lower); the default policy, written
                // for the CPU, does not apply. An explicit policy does.
                let policy = self
                    .policy
                    .clone()
                    .unwrap_or_else(|| SplitPolicy::new(|_| true));
                Box::new(rlx_cuda::CudaModel::compile(
                    graph,
                    &rlx_cuda::CudaOptions {
                        device: i,
                        hybrid: self.mode == ExecMode::Hybrid,
                        policy,
                        precision: self.precision,
                        ..Default::default()
                    },
                )?)
            }
        };
        Ok(CompiledModel { exec })
    }
}

/// A graph compiled for one device.
pub struct CompiledModel {
    exec: Box<dyn Executable>,
}

impl CompiledModel {
    /// Set (or replace) an f32 weight.
    pub fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), Error> {
        Ok(self.exec.set_param(name, TensorRef::F32(data))?)
    }

    /// Set (or replace) a weight of any dtype.
    pub fn set_param_typed(&mut self, name: &str, data: TensorRef<'_>) -> Result<(), Error> {
        Ok(self.exec.set_param(name, data)?)
    }

    /// Run with f32 inputs; returns one f32 vector per graph output.
    pub fn run(&mut self, inputs: &[(&str, &[f32])]) -> Result<Vec<Vec<f32>>, Error> {
        let typed: Vec<(&str, TensorRef<'_>)> = inputs
            .iter()
            .map(|(n, d)| (*n, TensorRef::F32(d)))
            .collect();
        self.run_typed(&typed)?
            .into_iter()
            .enumerate()
            .map(|(index, t)| match &*t.data {
                TensorData::F32(v) => Ok(v.clone()),
                _ => Err(Error::NotF32 {
                    index,
                    dtype: t.shape.dtype,
                }),
            })
            .collect()
    }

    /// Run with inputs of any dtype; returns tensors with shapes.
    pub fn run_typed(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<Tensor>, Error> {
        Ok(self.exec.run(inputs)?)
    }

    /// Dispatch figures.
    pub fn plan_stats(&self) -> PlanStats {
        let r = self.exec.report();
        PlanStats {
            compiled_segments: r.compiled_segments,
            thunk_ranges: r.thunk_ranges,
            dispatches: r.dispatches,
        }
    }

    /// The full plan report: segments, ranges and why each op stayed out.
    pub fn plan_report(&self) -> &PlanReport {
        self.exec.report()
    }

    /// Arena figures.
    pub fn memory(&self) -> MemoryStats {
        self.exec.memory()
    }
}
