//! Elementwise chains inside compiled segments, each fused into one
//! generated NVRTC kernel.
//!
//! A chain is a connected run of `Binary` / `Activation` nodes where every
//! node but the last (the root) has exactly one user, the next node of the
//! chain, and is not a segment output. Every chain node and every leaf (an
//! input from outside the chain) broadcasts to its user as a trailing
//! block, so element `i` of the root reads leaf element `i % numel`, and a
//! smaller interior value is recomputed per element (it is cheap). The root's kernel computes the whole chain per element in
//! registers (f32, loads and stores in any storage type); the other chain
//! nodes launch nothing. Only segments fuse: a thunk is one op by
//! definition.

pub(crate) mod cache;
pub(crate) mod gemv;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod reduce;

use crate::opcodes::{act_code, bin_code};
use crate::store::Store;
use crate::views::is_suffix;
use rlx_ir::{DType, Graph, Node, NodeId, Op};
use rlx_runtime::memory::Tick;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

/// One generated kernel.
#[derive(Debug)]
pub(crate) struct Chain {
    /// Chain nodes in topological order (the root last).
    pub nodes: Vec<NodeId>,
    /// Inputs from outside the chain, in kernel argument order.
    pub leaves: Vec<NodeId>,
    /// Entry point name (derived from the source, so equal chains share it).
    pub name: Arc<str>,
    /// Complete CUDA C source (the mixed-precision helpers included).
    pub source: Arc<str>,
}

/// What a node does under fusion.
#[derive(Debug, Clone, Default)]
pub(crate) enum Fusion {
    /// Not part of a fused chain.
    #[default]
    None,
    /// Computed inside its root's kernel: no launch of its own.
    Interior,
    /// Launches the chain's kernel.
    Root(Arc<Chain>),
    /// Launches a quantized GEMV with the nodes it absorbed.
    Gemv(Arc<crate::fuse::gemv::GemvFusion>),
    /// A one-row `Rope` whose launch also does cache writes.
    RopeCache(Arc<crate::fuse::cache::RopeCache>),
    /// The root of a masked mean pooling (and its L2 normalization):
    /// one launch for the group.
    Pool(Arc<crate::fuse::pool::Pool>),
    /// A `Reduce` that applies its input's `Binary` per element.
    Reduce(Arc<crate::fuse::reduce::ReducePrologue>),
    /// A `FusedResidualLN` that computes the matmul it reads.
    GemmNorm(Arc<crate::fuse::norm::GemmNorm>),
    /// A norm that computes the `Add` making its input and / or reads the
    /// `Gather`s making its operands from their tables.
    NormFeed(Arc<crate::fuse::norm::NormFeed>),
    /// Done by an earlier node's launch (a `RopeCache`'s writes): no
    /// launch, but its place in the schedule stays.
    Done,
}

fn fusable(g: &Graph, n: &Node) -> bool {
    matches!(n.op, Op::Binary(_) | Op::Activation(_))
        && n.shape.dtype == DType::F32
        && n.shape.numel() > 0
        && n.inputs.iter().all(|&i| {
            let s = &g.node(i).shape;
            s.dtype == DType::F32 && s.rank() <= n.shape.rank() && is_suffix(&s.dims, &n.shape.dims)
        })
}

/// The chains of a segment's sub-graph (roots and interiors by node id),
/// leaving out the nodes in `claimed` (fused otherwise).
pub(crate) fn find_chains(g: &Graph, claimed: &HashSet<NodeId>) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let fusable = |g: &Graph, n: &Node| fusable(g, n) && !claimed.contains(&n.id);
    let absorbed = |n: &Node| -> bool {
        if !fusable(g, n) || outputs.contains(&n.id) {
            return false;
        }
        let users = g.users(n.id);
        users.len() == 1 && {
            let u = g.node(users[0]);
            fusable(g, u) && is_suffix(&n.shape.dims, &u.shape.dims)
        }
    };
    let inner: HashSet<NodeId> = g
        .nodes()
        .iter()
        .filter(|n| absorbed(n))
        .map(|n| n.id)
        .collect();
    let mut out = HashMap::new();
    for root in g.nodes() {
        if inner.contains(&root.id)
            || !fusable(g, root)
            || !root.inputs.iter().any(|i| inner.contains(i))
        {
            continue;
        }
        let mut nodes = vec![root.id];
        let mut stack = vec![root.id];
        while let Some(x) = stack.pop() {
            for &i in &g.node(x).inputs {
                if inner.contains(&i) && !nodes.contains(&i) {
                    nodes.push(i);
                    stack.push(i);
                }
            }
        }
        nodes.sort();
        let mut leaves = Vec::new();
        for &x in &nodes {
            for &i in &g.node(x).inputs {
                if !nodes.contains(&i) && !leaves.contains(&i) {
                    leaves.push(i);
                }
            }
        }
        let chain = Arc::new(generate(g, nodes, leaves));
        for &x in &chain.nodes {
            out.insert(x, Fusion::Interior);
        }
        out.insert(root.id, Fusion::Root(chain));
    }
    out
}

/// Every fusion of a segment's sub-graph: the quantized GEMV groups
/// ([`crate::fuse::gemv`]) first, then mean poolings ([`crate::fuse::pool`]),
/// reductions with their binary
/// ([`crate::fuse::reduce`]), matmuls with their norm and norms with the
/// Add before them ([`crate::fuse::norm`]), then elementwise chains over
/// the rest,
/// then decode ropes with their cache writes ([`crate::fuse::cache`]).
/// `store` gives each node's storage.
/// `matmul_norm` enables the matmul-norm groups (`CudaOptions::fuse_matmul_norm`).
pub(crate) fn find_fusions(
    g: &Graph,
    matmul_norm: bool,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let mut m = crate::fuse::gemv::find_gemv(g, &store);
    let claimed: HashSet<NodeId> = m.keys().copied().collect();
    m.extend(crate::fuse::pool::find_pools(g, &claimed, &store));
    let claimed: HashSet<NodeId> = m.keys().copied().collect();
    m.extend(crate::fuse::reduce::find_reduce_prologues(
        g, &claimed, &store,
    ));
    let claimed: HashSet<NodeId> = m.keys().copied().collect();
    if matmul_norm {
        m.extend(crate::fuse::norm::find_gemm_norms(g, &claimed, &store));
    }
    let claimed: HashSet<NodeId> = m.keys().copied().collect();
    m.extend(crate::fuse::norm::find_norm_feeds(g, &claimed, &store));
    let claimed: HashSet<NodeId> = m.keys().copied().collect();
    m.extend(find_chains(g, &claimed));
    let ropes = crate::fuse::cache::find_rope_cache(g, &m, &store);
    m.extend(ropes);
    m
}

/// The memory-plan ticks of a segment's sub-graph under its fusions. A
/// fused group runs as one launch at its root, so it is one atomic tick
/// there: every input of every member stays live until the launch, and no
/// member's slot can share memory with them. Unfused nodes tick alone.
pub(crate) fn fused_ticks(g: &Graph, fusions: &HashMap<NodeId, Fusion>) -> Vec<Tick> {
    let group = |nodes: &[NodeId]| {
        let mut inputs = Vec::new();
        for &n in nodes {
            for &i in &g.node(n).inputs {
                if !nodes.contains(&i) && !inputs.contains(&i) {
                    inputs.push(i);
                }
            }
        }
        Tick::Segment {
            inputs,
            outputs: nodes.to_vec(),
        }
    };
    g.nodes()
        .iter()
        .filter(|n| !n.op.is_leaf())
        .filter_map(|n| match fusions.get(&n.id) {
            None | Some(Fusion::None | Fusion::RopeCache(_) | Fusion::Done) => {
                Some(Tick::Node(n.id))
            }
            Some(Fusion::Interior) => None,
            Some(Fusion::Root(c)) => Some(group(&c.nodes)),
            Some(Fusion::Gemv(f)) => Some(group(&f.nodes)),
            Some(Fusion::Reduce(f)) => Some(group(&f.nodes)),
            Some(Fusion::Pool(f)) => Some(group(&f.nodes)),
            Some(Fusion::GemmNorm(f)) => Some(group(&f.nodes)),
            Some(Fusion::NormFeed(f)) => Some(group(&f.nodes)),
        })
        .collect()
}

/// FNV-1a, for stable kernel names.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn generate(g: &Graph, nodes: Vec<NodeId>, leaves: Vec<NodeId>) -> Chain {
    let var = |id: NodeId| -> String {
        match leaves.iter().position(|&l| l == id) {
            Some(k) => format!("l{k}"),
            None => format!("v{}", id.0),
        }
    };
    let mut params = String::from("void* out, long long n, int to");
    let mut body = String::new();
    for k in 0..leaves.len() {
        let _ = write!(params, ", const void* a{k}, long long n{k}, int t{k}");
        let _ = writeln!(body, "        float l{k} = ldx(a{k}, i % n{k}, t{k});");
    }
    for &x in &nodes {
        let n = g.node(x);
        let expr = match &n.op {
            Op::Binary(b) => format!(
                "bin_apply({}, {}, {})",
                bin_code(*b),
                var(n.inputs[0]),
                var(n.inputs[1])
            ),
            Op::Activation(a) => format!("act_apply({}, {})", act_code(Some(*a)), var(n.inputs[0])),
            _ => unreachable!("only fusable ops enter a chain"),
        };
        let _ = writeln!(body, "        float v{} = {expr};", x.0);
    }
    let root = *nodes.last().expect("a chain has a root");
    let _ = writeln!(body, "        stx(out, i, to, v{});", root.0);
    let kernel = |name: &str| {
        format!(
            "extern \"C\" __global__ void {name}({params}) {{\n    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    long long stride = (long long)gridDim.x * blockDim.x;\n    for (; i < n; i += stride) {{\n{body}    }}\n}}\n"
        )
    };
    let name = format!("rlx_fused_{:016x}", fnv(&kernel("K")));
    let source = format!("{}{}", crate::cu::prelude(), kernel(&name));
    Chain {
        nodes,
        leaves,
        name: name.into(),
        source: source.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::op::{Activation, BinaryOp};
    use rlx_ir::Shape;

    #[test]
    fn a_single_user_chain_fuses_and_a_shared_value_does_not() {
        let mut g = Graph::new("chain");
        let x = g.input("x", Shape::f32(&[2, 8]));
        let b = g.input("b", Shape::f32(&[8]));
        let s = g.push(Op::Activation(Activation::Sqrt), vec![x]).unwrap();
        let m = g.push(Op::Binary(BinaryOp::Max), vec![s, b]).unwrap();
        let d = g.push(Op::Binary(BinaryOp::Div), vec![x, m]).unwrap();
        // `d` has two users: it ends a chain and starts none.
        let e = g.push(Op::Activation(Activation::Exp), vec![d]).unwrap();
        let f = g.push(Op::Binary(BinaryOp::Mul), vec![d, d]).unwrap();
        g.set_outputs(vec![e, f]);
        let c = find_chains(&g, &HashSet::new());
        let Some(Fusion::Root(chain)) = c.get(&d) else {
            panic!("d should root a chain: {c:?}");
        };
        assert_eq!(chain.nodes, vec![s, m, d]);
        assert_eq!(chain.leaves, vec![x, b]);
        assert!(matches!(c.get(&s), Some(Fusion::Interior)));
        assert!(!c.contains_key(&e) && !c.contains_key(&f));
        assert!(chain.source.contains(&*chain.name));
        assert!(
            chain.source.contains("bin_apply(3, l0, v"),
            "{}",
            chain.source
        );
        // The generated source compiles where libnvrtc can be loaded.
        // SAFETY: only tries to open the shared library.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            let opts = cudarc::nvrtc::CompileOptions {
                options: vec!["--gpu-architecture=compute_90".into()],
                ..Default::default()
            };
            if let Err(e) = cudarc::nvrtc::compile_ptx_with_opts(&*chain.source, opts) {
                panic!("{e:?}\n{}", chain.source);
            }
        }
    }
}
