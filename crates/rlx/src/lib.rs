//! rlx: an ML compiler and runtime for transformer inference.
//!
//! ```no_run
//! use rlx::ir::{op::Activation, DType, Graph, Shape};
//! use rlx::{Device, ExecMode, Session};
//!
//! let mut g = Graph::new("mlp");
//! let x = g.input("x", Shape::new(&[4, 8], DType::F32));
//! let w = g.param("w", Shape::new(&[8, 16], DType::F32));
//! let h = g.matmul(x, w, Shape::new(&[4, 16], DType::F32));
//! let y = g.activation(Activation::Gelu, h, Shape::new(&[4, 16], DType::F32));
//! g.set_outputs(vec![y]);
//!
//! let mut model = Session::new(Device::Cpu).mode(ExecMode::Hybrid).compile(g)?;
//! model.set_param("w", &vec![0.1; 8 * 16])?;
//! let out = model.run(&[("x", &vec![1.0; 4 * 8])])?;
//! assert_eq!(out[0].len(), 4 * 16);
//! # Ok::<(), rlx::Error>(())
//! ```

#![deny(missing_docs)]

mod session;

pub use rlx_ir as ir;
pub use rlx_runtime::{MemoryStats, Precision, RuntimeError, TensorRef};
pub use session::{CompiledModel, Device, Error, ExecMode, PlanStats, Session};

/// The hybrid planner: schedule splitting into compiled segments and thunk ranges.
pub mod hybrid {
    pub use rlx_runtime::hybrid::*;
}

/// Model builders and loaders (BERT, sentence embeddings, Llama, recurrent blocks).
pub mod models {
    pub use rlx_models::*;
}

/// Weight-file readers: safetensors, GGUF, dequantization.
pub mod formats {
    pub use rlx_formats::*;
}

/// Graph passes: fusion, DCE, CSE, constant folding.
pub mod opt {
    pub use rlx_opt::*;
}

/// Backend-independent runtime pieces: memory planner, `Executable`.
pub mod runtime {
    pub use rlx_runtime::*;
}

pub use rlx_models::{Reranker, SentenceEmbedder};

/// The CPU backend.
pub mod cpu {
    pub use rlx_cpu::*;
}

/// The CUDA backend (feature `cuda`).
#[cfg(feature = "cuda")]
pub mod cuda {
    pub use rlx_cuda::*;
}
