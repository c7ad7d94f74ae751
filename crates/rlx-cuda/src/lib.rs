//! rlx-cuda: the CUDA backend.
//!
//! - [`CudaModel`]: a graph compiled for one NVIDIA GPU. One device arena,
//!   planned step-aware by `rlx_runtime::memory::plan_memory`; weights
//!   uploaded once (param-only subgraphs, such as the optimizer's QKV weight
//!   concat, run once on the host through `rlx_cpu` and are uploaded as
//!   params, converted to the storage plan: matmul weights `[out, in]`,
//!   16-bit in a half [`Precision`]); kernels written in CUDA C and compiled
//!   by NVRTC once per process and compute capability (f32 and
//!   mixed-precision variants, tensor-core attention); matmuls through
//!   cuBLASLt with bias / ReLU / GELU epilogues and timed algorithms.
//! - Thunks mode: one launch (kernel, gemm or copy) per op.
//! - Hybrid mode: [`CudaSegmentCompiler`] lowers each segment of the plan;
//!   at the first run its launches are captured into a CUDA graph that
//!   replays as one dispatch. Boundary tensors are arena slots at fixed
//!   addresses; segment-internal tensors live in a shared scratch buffer;
//!   elementwise chains inside a segment run as one generated kernel, and a
//!   quantized GEMV, a one-row Rope or a Reduce absorbs its neighbours
//!   (`fuse::gemv`, `fuse::cache`, `fuse::reduce`), a masked mean pooling and
//!   its L2 normalization run as one kernel (`fuse::pool`), and a norm the Add before
//!   it (`fuse::norm`; opt-in, `CudaOptions::fuse_matmul_norm`: a small
//!   16-bit matmul with the LayerNorm reading it, slower than cuBLASLt on
//!   the H200 so far).
//! - Programmatic dependent launch on compute capability 9.0+
//!   (`CudaOptions::programmatic_launch`, on by default): every rlx kernel
//!   opens with `griddepcontrol.launch_dependents` and `griddepcontrol.wait`
//!   (inserted into each module's source at compile time), and is launched
//!   with programmatic stream serialization, so the next kernel's blocks
//!   are scheduled while the current one runs and wait on the device
//!   instead of after a full drain (in CUDA graphs too). It pays where rlx
//!   kernels follow each other (SmolLM2 decode); cuBLASLt's kernels launch
//!   as usual.
//! - [`CudaModel::set_graph`]: another shape bucket of the same model
//!   (weights kept, graphs captured again); [`plan`]: the plan without a
//!   device.
//!
//! cudarc loads the CUDA libraries at run time, so the crate builds without
//! a CUDA toolkit; [`cuda_available`] says whether a device can be used.
//! Device failures are [`CudaError`]s, reported as
//! `RuntimeError::Device` (an allocation that runs out of memory is
//! [`CudaError::OutOfMemory`], not "unsupported").
//!
//! Layout, bottom layer first (a module imports only its own layer or
//! lower ones; the `layering` test checks it from the sources):
//! - `cu/` (the CUDA C: `common.cuh`, one `.cu` file per NVRTC module),
//!   `opcodes` (activation / binary-op codes and the generated CUDA
//!   switches), `kernels` (f32 kernel names), `store` (storage plan),
//!   `error`;
//! - `launch` (`Launch`, `Arg`, elementwise launches), `views` (aliases and
//!   broadcasts), `mixed`, `quant`, `kv` (kernel choice and launches);
//! - `fuse/` (fusion planning: chains, GEMV, rope cache, pooling, norms);
//! - `lower/` (one node to launches, by op family) and `device` (context,
//!   NVRTC module cache, buffers, graphs);
//! - `lt` (cuBLASLt), then `executor` ([`CudaModel`], the segment compiler).

#![deny(missing_docs)]

mod cu;
mod device;
mod error;
mod executor;
mod fuse;
mod kernels;
mod kv;
mod launch;
mod lower;
mod lt;
mod mixed;
mod opcodes;
mod quant;
mod store;
mod views;

pub use device::cuda_available;
pub use error::CudaError;
pub use executor::{
    plan, CudaModel, CudaOptions, CudaPlan, CudaSegmentCompiler, DeviceParam, SegmentPlan,
};
pub use rlx_runtime::Precision;

#[cfg(test)]
mod layering {
    //! The crate's modules form layers: each imports only its own layer
    //! or lower ones, and no two modules import each other (directly or
    //! through others). Read from the sources, test modules excluded.

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Bottom first.
    const LAYERS: &[&[&str]] = &[
        &["cu", "opcodes", "kernels", "store", "error"],
        &["launch", "views", "mixed", "quant", "kv"],
        &["fuse"],
        &["lower", "device"],
        &["lt"],
        &["executor"],
    ];

    /// Top-level module -> the top-level modules its non-test code names.
    fn imports() -> BTreeMap<String, BTreeSet<String>> {
        fn walk(dir: &Path, top: Option<&str>, out: &mut BTreeMap<String, BTreeSet<String>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_stem().unwrap().to_str().unwrap().to_string();
                if p.is_dir() {
                    walk(&p, Some(top.unwrap_or(&name)), out);
                    continue;
                }
                if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                    continue;
                }
                let module = top.unwrap_or(&name).to_string();
                if module == "lib" {
                    continue;
                }
                let src = std::fs::read_to_string(&p).unwrap();
                let src = src.split("#[cfg(test)]\nmod tests").next().unwrap();
                let deps = out.entry(module.clone()).or_default();
                for (i, _) in src.match_indices("crate::") {
                    let rest = &src[i + "crate::".len()..];
                    let names: Vec<&str> = match rest.strip_prefix('{') {
                        Some(r) => r[..r.find('}').unwrap()]
                            .split(',')
                            .map(|s| s.trim().split("::").next().unwrap())
                            .collect(),
                        None => vec![rest
                            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                            .next()
                            .unwrap()],
                    };
                    for n in names {
                        if !n.is_empty()
                            && n != module
                            && n.chars().all(|c| c.is_lowercase() || c == '_')
                        {
                            deps.insert(n.to_string());
                        }
                    }
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            None,
            &mut out,
        );
        out
    }

    #[test]
    fn modules_import_only_their_layer_or_below() {
        let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
        let deps = imports();
        assert!(
            deps.contains_key("lower") && deps.contains_key("fuse"),
            "{deps:?}"
        );
        for (m, ds) in &deps {
            let lm = layer(m).unwrap_or_else(|| panic!("module {m} is in no layer"));
            for d in ds.iter().filter(|d| deps.contains_key(*d)) {
                let ld =
                    layer(d).unwrap_or_else(|| panic!("{m} imports {d}, which is in no layer"));
                assert!(
                    ld <= lm,
                    "{m} (layer {lm}) imports {d} (layer {ld}, above it)"
                );
            }
        }
        // No cycles: repeatedly remove modules that import nothing left.
        let mut left: BTreeMap<&String, BTreeSet<&String>> = deps
            .iter()
            .map(|(m, ds)| (m, ds.iter().filter(|d| deps.contains_key(*d)).collect()))
            .collect();
        while let Some(m) = left.iter().find(|(_, ds)| ds.is_empty()).map(|(m, _)| *m) {
            left.remove(m);
            for ds in left.values_mut() {
                ds.remove(m);
            }
        }
        assert!(left.is_empty(), "import cycle among {left:?}");
    }
}
