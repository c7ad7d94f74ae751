//! rlx-opt: graph passes over the rlx IR.
//!
//! Passes never mutate a graph: each builds a new one through a
//! [`Rewriter`], which re-infers every shape and verifies the result. The
//! [`PassManager`] runs a pass list to a bounded fixpoint and collects an
//! [`OptReport`] (per pass, a count per pattern name).
//!
//! Passes are backend-aware through a target predicate, `&dyn Fn(&Op) -> bool`
//! ("the backend claims this fused op"): a fusion only fires when the target
//! claims the fused op it would create.
//!
//! The default pipeline ([`optimize`]) is, per iteration: CSE, DCE,
//! constant folding, QKV merge, matmul+bias+activation fusion,
//! residual+norm fusion, SwiGLU fusion, DCE.

#![deny(missing_docs)]

mod error;
pub mod passes;
mod rewrite;

pub use error::OptError;
pub use passes::{
    has_side_effect, ConstFold, Cse, Dce, FuseMatMulBiasAct, FuseQkv, FuseResidualNorm, FuseSwiGlu,
    FUSABLE_ACTIVATIONS,
};
pub use rewrite::{schedule, Rewriter, Uses};

use rlx_ir::{Graph, Op};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Counts per pattern name for one run of one pass. Only patterns that fired
/// appear; an empty map means the pass changed nothing.
pub type PassReport = BTreeMap<String, usize>;

/// The target predicate: whether the backend claims (can run) an op.
pub type TargetFn = dyn Fn(&Op) -> bool + Send + Sync;

/// A graph pass.
pub trait Pass {
    /// Stable pass name, used as the key in [`OptReport::passes`].
    fn name(&self) -> &'static str;

    /// Run the pass on `g`, returning a new, verified graph and what fired.
    /// `target` says which (fused) ops the backend claims.
    fn run(&self, g: &Graph, target: &dyn Fn(&Op) -> bool)
        -> Result<(Graph, PassReport), OptError>;
}

/// What the optimizer did: per pass name, a count per pattern name, summed
/// over all fixpoint iterations. Plain maps so a CLI can serialize it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptReport {
    /// Pass name -> pattern name -> count. Every pass that ran has an entry
    /// (possibly empty); patterns appear only when they fired.
    pub passes: BTreeMap<String, BTreeMap<String, usize>>,
    /// Fixpoint iterations run (the last one changed nothing unless the
    /// bound was hit).
    pub iterations: usize,
    /// Node count of the input graph.
    pub nodes_before: usize,
    /// Node count of the optimized graph.
    pub nodes_after: usize,
}

impl OptReport {
    /// The count of `pattern` in `pass`, 0 if it never fired.
    pub fn count(&self, pass: &str, pattern: &str) -> usize {
        self.passes
            .get(pass)
            .and_then(|m| m.get(pattern))
            .copied()
            .unwrap_or(0)
    }

    /// Sum of all pattern counts of `pass`.
    pub fn total(&self, pass: &str) -> usize {
        self.passes.get(pass).map(|m| m.values().sum()).unwrap_or(0)
    }

    fn add(&mut self, pass: &str, r: &PassReport) {
        let e = self.passes.entry(pass.to_string()).or_default();
        for (k, v) in r {
            *e.entry(k.clone()).or_insert(0) += v;
        }
    }
}

impl fmt::Display for OptReport {
    /// `nodes A -> B in N iterations`, then one line per pass with its counts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "nodes {} -> {} in {} iteration(s)",
            self.nodes_before, self.nodes_after, self.iterations
        )?;
        for (pass, m) in &self.passes {
            let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            writeln!(f, "  {pass}: {{{}}}", items.join(", "))?;
        }
        Ok(())
    }
}

/// An ordered pass list run to a bounded fixpoint.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    max_iterations: usize,
}

impl PassManager {
    /// An empty manager that runs at most `max_iterations` (at least 1) rounds.
    pub fn new(max_iterations: usize) -> Self {
        PassManager {
            passes: Vec::new(),
            max_iterations: max_iterations.max(1),
        }
    }

    /// Append a pass.
    pub fn add(&mut self, pass: Box<dyn Pass>) -> &mut Self {
        self.passes.push(pass);
        self
    }

    /// Names of the passes, in run order.
    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Verify `g`, then run every pass in order, repeating until a whole
    /// round changes nothing or `max_iterations` rounds ran.
    pub fn run(
        &self,
        g: &Graph,
        target: &dyn Fn(&Op) -> bool,
    ) -> Result<(Graph, OptReport), OptError> {
        g.verify().map_err(|source| OptError::InvalidInput {
            graph: g.name.clone(),
            source: Box::new(source),
        })?;
        let mut report = OptReport {
            nodes_before: g.len(),
            ..OptReport::default()
        };
        let mut cur = g.clone();
        for p in &self.passes {
            report.passes.entry(p.name().to_string()).or_default();
        }
        for _ in 0..self.max_iterations {
            report.iterations += 1;
            let mut changed = false;
            for p in &self.passes {
                let (next, r) = p.run(&cur, target)?;
                changed |= r.values().any(|&v| v > 0);
                report.add(p.name(), &r);
                cur = next;
            }
            if !changed {
                break;
            }
        }
        report.nodes_after = cur.len();
        Ok((cur, report))
    }
}

impl fmt::Debug for PassManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassManager")
            .field("passes", &self.pass_names())
            .field("max_iterations", &self.max_iterations)
            .finish()
    }
}

/// Options of [`optimize`]: which passes run, the fixpoint bound, and the
/// target predicate.
#[derive(Clone)]
pub struct OptOptions {
    /// Most fixpoint rounds (default 8).
    pub max_iterations: usize,
    /// Dead-code elimination (keeps every Input).
    pub dce: bool,
    /// Common-subexpression elimination.
    pub cse: bool,
    /// Constant folding through the reference interpreter.
    pub fold_constants: bool,
    /// Most work constant folding spends on one node (default 16 Mi):
    /// elements produced, or multiply-adds for matmuls and attention.
    pub fold_max_elements: usize,
    /// Merge matmuls sharing an lhs against weights (QKV).
    pub fuse_qkv: bool,
    /// MatMul + bias [+ activation] fusion.
    pub fuse_matmul_bias_act: bool,
    /// Residual add [+ bias] + LayerNorm / RmsNorm fusion.
    pub fuse_residual_norm: bool,
    /// SwiGLU fusion (packed and unpacked).
    pub fuse_swiglu: bool,
    /// Whether the backend claims an op; fusions only create claimed ops.
    /// The default claims everything.
    pub target: Arc<TargetFn>,
}

impl Default for OptOptions {
    fn default() -> Self {
        OptOptions {
            max_iterations: 8,
            dce: true,
            cse: true,
            fold_constants: true,
            fold_max_elements: 16 << 20,
            fuse_qkv: true,
            fuse_matmul_bias_act: true,
            fuse_residual_norm: true,
            fuse_swiglu: true,
            target: Arc::new(|_: &Op| true),
        }
    }
}

impl OptOptions {
    /// Every pass off: [`optimize`] only verifies and returns a copy.
    pub fn none() -> Self {
        OptOptions {
            dce: false,
            cse: false,
            fold_constants: false,
            fuse_qkv: false,
            fuse_matmul_bias_act: false,
            fuse_residual_norm: false,
            fuse_swiglu: false,
            ..OptOptions::default()
        }
    }

    /// Only the cleanup passes (DCE, CSE, constant folding), no fusion.
    pub fn cleanup_only() -> Self {
        OptOptions {
            fuse_qkv: false,
            fuse_matmul_bias_act: false,
            fuse_residual_norm: false,
            fuse_swiglu: false,
            ..OptOptions::default()
        }
    }

    /// The same options with another target predicate.
    pub fn with_target(mut self, target: impl Fn(&Op) -> bool + Send + Sync + 'static) -> Self {
        self.target = Arc::new(target);
        self
    }

    /// The pass manager these options describe (order: CSE, DCE, constant
    /// folding, QKV, matmul+bias+act, residual+norm, SwiGLU, DCE).
    pub fn pass_manager(&self) -> PassManager {
        let mut pm = PassManager::new(self.max_iterations);
        if self.cse {
            pm.add(Box::new(Cse));
        }
        if self.dce {
            pm.add(Box::new(Dce));
        }
        if self.fold_constants {
            pm.add(Box::new(ConstFold {
                max_elements: self.fold_max_elements,
            }));
        }
        if self.fuse_qkv {
            pm.add(Box::new(FuseQkv));
        }
        if self.fuse_matmul_bias_act {
            pm.add(Box::new(FuseMatMulBiasAct));
        }
        if self.fuse_residual_norm {
            pm.add(Box::new(FuseResidualNorm));
        }
        if self.fuse_swiglu {
            pm.add(Box::new(FuseSwiGlu));
        }
        if self.dce {
            pm.add(Box::new(Dce));
        }
        pm
    }
}

impl fmt::Debug for OptOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OptOptions")
            .field("max_iterations", &self.max_iterations)
            .field("dce", &self.dce)
            .field("cse", &self.cse)
            .field("fold_constants", &self.fold_constants)
            .field("fold_max_elements", &self.fold_max_elements)
            .field("fuse_qkv", &self.fuse_qkv)
            .field("fuse_matmul_bias_act", &self.fuse_matmul_bias_act)
            .field("fuse_residual_norm", &self.fuse_residual_norm)
            .field("fuse_swiglu", &self.fuse_swiglu)
            .finish_non_exhaustive()
    }
}

/// Verify `g` and run the pipeline that `opts` describes to a bounded
/// fixpoint. The result verifies and computes the same outputs (in the same
/// order) from the same named inputs and params.
pub fn optimize(g: &Graph, opts: &OptOptions) -> Result<(Graph, OptReport), OptError> {
    let target = opts.target.clone();
    opts.pass_manager().run(g, &*target)
}
