//! What every backend does the same way at its edges: checking and
//! converting host buffers, and splitting off the param-only part of a
//! graph so it is evaluated once per change of params, not on every run.

use crate::{RuntimeError, TensorRef};
use rlx_ir::{DType, Graph, NodeId, Op, Shape, Tensor, TensorData};
use std::collections::HashMap;

impl<'a> TensorRef<'a> {
    /// The buffer's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        match *self {
            TensorRef::F32(v) => bytemuck::cast_slice(v),
            TensorRef::I32(v) => bytemuck::cast_slice(v),
            TensorRef::I64(v) => bytemuck::cast_slice(v),
            TensorRef::U8(v) => v,
        }
    }

    /// An owned tensor of `shape` holding a copy of the buffer.
    pub fn to_tensor(&self, shape: &Shape) -> Tensor {
        let data = match *self {
            TensorRef::F32(v) => TensorData::F32(v.to_vec()),
            TensorRef::I32(v) => TensorData::I32(v.to_vec()),
            TensorRef::I64(v) => TensorData::I64(v.to_vec()),
            TensorRef::U8(v) => TensorData::U8(v.to_vec()),
        };
        Tensor {
            shape: shape.clone(),
            data: data.into(),
        }
    }
}

/// The bytes of a host tensor.
pub fn tensor_bytes(t: &Tensor) -> &[u8] {
    match &*t.data {
        TensorData::F32(v) => bytemuck::cast_slice(v),
        TensorData::I32(v) => bytemuck::cast_slice(v),
        TensorData::I64(v) => bytemuck::cast_slice(v),
        TensorData::U8(v) => v,
    }
}

/// A tensor of `shape` read from raw little-endian bytes.
pub fn tensor_from_bytes(shape: &Shape, b: &[u8]) -> Tensor {
    let data = match shape.dtype {
        DType::F32 => TensorData::F32(bytemuck::pod_collect_to_vec(b)),
        DType::I32 => TensorData::I32(bytemuck::pod_collect_to_vec(b)),
        DType::I64 => TensorData::I64(bytemuck::pod_collect_to_vec(b)),
        _ => TensorData::U8(b.to_vec()),
    };
    Tensor {
        shape: shape.clone(),
        data: data.into(),
    }
}

/// Check that a buffer bound to `name` fits `shape`: its dtype (u8 data
/// also binds Bool) and its element count.
pub fn check_buffer(name: &str, shape: &Shape, r: &TensorRef<'_>) -> Result<(), RuntimeError> {
    let want = match shape.dtype {
        DType::Bool => DType::U8,
        d => d,
    };
    if r.dtype() != want {
        return Err(RuntimeError::WrongDType {
            name: name.into(),
            shape: shape.clone(),
            expected: shape.dtype,
            got: r.dtype(),
        });
    }
    if r.len() != shape.numel() {
        return Err(RuntimeError::WrongLength {
            name: name.into(),
            shape: shape.clone(),
            expected: shape.numel(),
            got: r.len(),
        });
    }
    Ok(())
}

/// Nodes computed from params and constants alone. `CacheWrite` never is:
/// it has a side effect on every run.
pub fn static_nodes(graph: &Graph) -> Vec<bool> {
    let mut s = vec![false; graph.len()];
    for n in graph.nodes() {
        s[n.id.index()] = !n.op.is_leaf()
            && !matches!(n.op, Op::CacheWrite { .. })
            && n.inputs.iter().all(|&i| {
                s[i.index()] || matches!(graph.node(i).op, Op::Param { .. } | Op::Constant { .. })
            });
    }
    s
}

/// A graph split into its per-run part and its param-only part.
#[derive(Debug, Clone)]
pub struct StaticSplit {
    /// The per-run graph: same node ids, every static node replaced by a
    /// Param named `%static.<id>`.
    pub main: Graph,
    /// The param-only graph whose outputs are the static values the main
    /// graph reads, and the param name each output is stored under.
    pub prep: Option<(Graph, Vec<String>)>,
}

/// Split off the param-only nodes of `graph` (see [`StaticSplit`]).
pub fn split_static(graph: &Graph) -> StaticSplit {
    let is_static = static_nodes(graph);
    let users = graph.users_all();
    let frontier: Vec<NodeId> = graph
        .nodes()
        .iter()
        .filter(|n| {
            is_static[n.id.index()]
                && (graph.outputs.contains(&n.id)
                    || users[n.id.index()].iter().any(|u| !is_static[u.index()]))
        })
        .map(|n| n.id)
        .collect();
    let static_name = |id: NodeId| format!("%static.{}", id.0);
    let mut main = Graph::new(graph.name.clone());
    let mut prep = Graph::new(format!("{}.prep", graph.name));
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for n in graph.nodes() {
        if !is_static[n.id.index()] {
            main.add_node(n.op.clone(), n.inputs.clone(), n.shape.clone());
            continue;
        }
        let name = static_name(n.id);
        main.add_node(Op::Param { name }, vec![], n.shape.clone());
        for &i in &n.inputs {
            map.entry(i).or_insert_with(|| {
                let leaf = graph.node(i);
                prep.add_node(leaf.op.clone(), vec![], leaf.shape.clone())
            });
        }
        let ins = n.inputs.iter().map(|i| map[i]).collect();
        map.insert(n.id, prep.add_node(n.op.clone(), ins, n.shape.clone()));
    }
    main.set_outputs(graph.outputs.clone());
    if frontier.is_empty() {
        return StaticSplit { main, prep: None };
    }
    prep.set_outputs(frontier.iter().map(|f| map[f]).collect());
    let names = frontier.iter().map(|&f| static_name(f)).collect();
    StaticSplit {
        main,
        prep: Some((prep, names)),
    }
}
