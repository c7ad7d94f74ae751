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

/// A graph input as executors keep it: name, node, shape.
pub type InputSlot = (String, NodeId, Shape);

/// Bind `given` (name, buffer) to a graph's `inputs`: each name must be an
/// input ([`RuntimeError::UnknownInput`]), given once
/// ([`RuntimeError::DuplicateInput`]), with a buffer that fits
/// ([`check_buffer`]), and every input must be given
/// ([`RuntimeError::MissingInput`]). Errors come in that order, for the
/// first offending entry of `given`. The buffers in `inputs` order.
pub fn bind_inputs<'a>(
    inputs: &[InputSlot],
    given: &[(&str, TensorRef<'a>)],
) -> Result<Vec<TensorRef<'a>>, RuntimeError> {
    let mut bound: Vec<Option<TensorRef<'a>>> = vec![None; inputs.len()];
    for (name, data) in given {
        let Some(pos) = inputs.iter().position(|(n, _, _)| n == name) else {
            return Err(RuntimeError::UnknownInput {
                name: name.to_string(),
                known: inputs
                    .iter()
                    .map(|i| i.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        if bound[pos].is_some() {
            return Err(RuntimeError::DuplicateInput {
                name: name.to_string(),
            });
        }
        check_buffer(name, &inputs[pos].2, data)?;
        bound[pos] = Some(*data);
    }
    bound
        .into_iter()
        .zip(inputs)
        .map(|(b, (name, _, shape))| {
            b.ok_or_else(|| RuntimeError::MissingInput {
                name: name.clone(),
                shape: shape.clone(),
            })
        })
        .collect()
}

/// Every param in `shapes` has a value (`is_set`), else
/// [`RuntimeError::MissingParam`] for the first missing one by name.
pub fn check_params_set(
    shapes: &HashMap<String, Shape>,
    is_set: impl Fn(&str) -> bool,
) -> Result<(), RuntimeError> {
    let mut missing: Vec<(&String, &Shape)> = shapes.iter().filter(|(n, _)| !is_set(n)).collect();
    missing.sort_by(|a, b| a.0.cmp(b.0));
    match missing.first() {
        Some((name, shape)) => Err(RuntimeError::MissingParam {
            name: name.to_string(),
            shape: (*shape).clone(),
        }),
        None => Ok(()),
    }
}

/// The shape of param `name` ([`RuntimeError::UnknownParam`] if the graph
/// has none), checking that the buffer `value` fits it ([`check_buffer`]).
pub fn param_shape<'s>(
    shapes: &'s HashMap<String, Shape>,
    name: &str,
    value: &TensorRef<'_>,
) -> Result<&'s Shape, RuntimeError> {
    let shape = known_param(shapes, name)?;
    check_buffer(name, shape, value)?;
    Ok(shape)
}

/// [`param_shape`] for an owned tensor: its data must fit the shape
/// ([`RuntimeError::WrongLength`]).
pub fn param_tensor_shape<'s>(
    shapes: &'s HashMap<String, Shape>,
    name: &str,
    value: &Tensor,
) -> Result<&'s Shape, RuntimeError> {
    let shape = known_param(shapes, name)?;
    if !value.data.fits(shape) {
        return Err(RuntimeError::WrongLength {
            name: name.into(),
            shape: shape.clone(),
            expected: shape.numel(),
            got: value.data.len(),
        });
    }
    Ok(shape)
}

fn known_param<'s>(
    shapes: &'s HashMap<String, Shape>,
    name: &str,
) -> Result<&'s Shape, RuntimeError> {
    shapes
        .get(name)
        .ok_or_else(|| RuntimeError::UnknownParam { name: name.into() })
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

/// The part of `graph` that computes its outputs `keep` (indices into
/// `graph.outputs`, in that order): the nodes they depend on, renumbered in
/// the same order, with `keep`'s outputs. A param-only graph whose other
/// outputs are already known runs only this.
pub fn outputs_subgraph(graph: &Graph, keep: &[usize]) -> Graph {
    let mut needed = vec![false; graph.len()];
    let mut stack: Vec<NodeId> = keep.iter().map(|&k| graph.outputs[k]).collect();
    while let Some(id) = stack.pop() {
        if !std::mem::replace(&mut needed[id.index()], true) {
            stack.extend(graph.node(id).inputs.iter().copied());
        }
    }
    let mut sub = Graph::new(graph.name.clone());
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for n in graph.nodes().iter().filter(|n| needed[n.id.index()]) {
        let ins = n.inputs.iter().map(|i| map[i]).collect();
        map.insert(n.id, sub.add_node(n.op.clone(), ins, n.shape.clone()));
    }
    sub.set_outputs(keep.iter().map(|&k| map[&graph.outputs[k]]).collect());
    sub
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Vec<InputSlot> {
        vec![
            ("ids".into(), NodeId(0), Shape::new(&[2], DType::I32)),
            ("x".into(), NodeId(1), Shape::f32(&[3])),
        ]
    }

    /// The subgraph of chosen outputs holds exactly the nodes they read,
    /// in their order, and its outputs are those, in the order asked for.
    #[test]
    fn outputs_subgraph_keeps_what_the_chosen_outputs_read() {
        let f = |d: &[usize]| Shape::f32(d);
        let mut g = Graph::new("prep");
        let a = g.param("a", f(&[4, 2]));
        let b = g.param("b", f(&[4, 2]));
        let c = g.param("c", f(&[4]));
        let ab = g.add_node(Op::Concat { axis: 1 }, vec![a, b], f(&[4, 4]));
        let rows = g.add_node(
            Op::Narrow {
                axis: 0,
                start: 1,
                len: 2,
            },
            vec![a],
            f(&[2, 2]),
        );
        let cc = g.add_node(Op::Concat { axis: 0 }, vec![c, c], f(&[8]));
        g.set_outputs(vec![ab, rows, cc]);
        let sub = outputs_subgraph(&g, &[2, 1]);
        let ops: Vec<String> = sub.nodes().iter().map(|n| n.op.describe()).collect();
        assert_eq!(sub.len(), 4, "{ops:?}");
        assert!(matches!(
            &sub.node(sub.outputs[0]).op,
            Op::Concat { axis: 0 }
        ));
        assert!(matches!(
            &sub.node(sub.outputs[1]).op,
            Op::Narrow { start: 1, .. }
        ));
        assert_eq!(sub.node(sub.outputs[1]).shape, f(&[2, 2]));
        let names: Vec<&str> = sub
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Param { name } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["a", "c"]);
        sub.verify().unwrap();
        assert_eq!(outputs_subgraph(&g, &[0, 1, 2]).len(), g.len());
    }

    /// Inputs bind in graph order whatever order they are given in, and
    /// each misuse is the error that names it.
    #[test]
    fn inputs_bind_in_graph_order_and_misuse_is_named() {
        let (ids, x) = ([7i32, 8], [1.0f32, 2.0, 3.0]);
        let v = bind_inputs(
            &inputs(),
            &[("x", TensorRef::F32(&x)), ("ids", TensorRef::I32(&ids))],
        )
        .unwrap();
        assert_eq!(v[0].as_bytes(), TensorRef::I32(&ids).as_bytes());
        assert_eq!(v[1].as_bytes(), TensorRef::F32(&x).as_bytes());
        let e = bind_inputs(&inputs(), &[("y", TensorRef::F32(&x))]).unwrap_err();
        assert!(
            matches!(e, RuntimeError::UnknownInput { ref name, ref known } if name == "y" && known == "ids, x")
        );
        let e = bind_inputs(
            &inputs(),
            &[("x", TensorRef::F32(&x)), ("x", TensorRef::F32(&x))],
        )
        .unwrap_err();
        assert!(matches!(e, RuntimeError::DuplicateInput { ref name } if name == "x"));
        let e = bind_inputs(&inputs(), &[("x", TensorRef::F32(&x[..2]))]).unwrap_err();
        assert!(matches!(
            e,
            RuntimeError::WrongLength {
                expected: 3,
                got: 2,
                ..
            }
        ));
        let e = bind_inputs(&inputs(), &[("x", TensorRef::F32(&x))]).unwrap_err();
        assert!(matches!(e, RuntimeError::MissingInput { ref name, .. } if name == "ids"));
    }

    /// Params: unknown names, wrong buffers and the first unset one by name.
    #[test]
    fn params_are_checked_by_name_and_shape() {
        let shapes: HashMap<String, Shape> = [
            ("b".to_string(), Shape::f32(&[2])),
            ("a".to_string(), Shape::f32(&[1])),
        ]
        .into();
        let w = [1.0f32, 2.0];
        assert_eq!(
            param_shape(&shapes, "b", &TensorRef::F32(&w)).unwrap(),
            &Shape::f32(&[2])
        );
        assert!(matches!(
            param_shape(&shapes, "c", &TensorRef::F32(&w)),
            Err(RuntimeError::UnknownParam { .. })
        ));
        assert!(matches!(
            param_shape(&shapes, "a", &TensorRef::F32(&w)),
            Err(RuntimeError::WrongLength {
                expected: 1,
                got: 2,
                ..
            })
        ));
        let t = Tensor::f32(&[3], vec![0.0; 3]);
        assert!(matches!(
            param_tensor_shape(&shapes, "b", &t),
            Err(RuntimeError::WrongLength {
                expected: 2,
                got: 3,
                ..
            })
        ));
        let e = check_params_set(&shapes, |n| n == "b").unwrap_err();
        assert!(matches!(e, RuntimeError::MissingParam { ref name, .. } if name == "a"));
        assert!(check_params_set(&shapes, |_| true).is_ok());
    }
}
