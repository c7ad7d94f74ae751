//! The interface every backend's compiled model implements.

use crate::hybrid::PlanReport;
use crate::RuntimeError;
use rlx_ir::{DType, Tensor};

/// A borrowed host buffer handed to `set_param` and `run`.
#[derive(Debug, Clone, Copy)]
pub enum TensorRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// i32 elements.
    I32(&'a [i32]),
    /// i64 elements.
    I64(&'a [i64]),
    /// Bytes (u8, bool, packed quantized blocks).
    U8(&'a [u8]),
}

impl TensorRef<'_> {
    /// The dtype of the buffer (U8 also stands for Bool).
    pub fn dtype(&self) -> DType {
        match self {
            TensorRef::F32(_) => DType::F32,
            TensorRef::I32(_) => DType::I32,
            TensorRef::I64(_) => DType::I64,
            TensorRef::U8(_) => DType::U8,
        }
    }

    /// Element count.
    pub fn len(&self) -> usize {
        match self {
            TensorRef::F32(v) => v.len(),
            TensorRef::I32(v) => v.len(),
            TensorRef::I64(v) => v.len(),
            TensorRef::U8(v) => v.len(),
        }
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Arena figures of a compiled model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes of the step-aware arena.
    pub arena_bytes: usize,
    /// Sum of all arena tensors without reuse.
    pub naive_bytes: usize,
    /// Bytes of compiled-segment scratch memory a run uses at once (the
    /// largest segment's; backends may pool it across segments).
    pub scratch_bytes: usize,
}

/// A graph compiled for one backend.
pub trait Executable: Send {
    /// Set (or replace) a weight by name.
    fn set_param(&mut self, name: &str, value: TensorRef<'_>) -> Result<(), RuntimeError>;
    /// Set (or replace) a weight with a shared tensor, without copying.
    fn set_param_tensor(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError>;
    /// Remove a weight and hand it back (e.g. a KV cache moving from a
    /// prefill model to a decode model). `None` if it was not set.
    fn take_param(&mut self, name: &str) -> Option<Tensor>;
    /// Run once; returns one tensor per graph output, in order.
    fn run(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<Tensor>, RuntimeError>;
    /// What the planner did.
    fn report(&self) -> &PlanReport;
    /// Arena figures.
    fn memory(&self) -> MemoryStats;
}
