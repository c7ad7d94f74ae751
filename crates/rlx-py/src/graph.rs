//! `rlx.Graph` / `rlx.Session`: a thin layer over the Rust graph builder,
//! the compiler and the plan report.

use crate::{guarded, lock, ExecutionError, GraphError};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rlx::ir::op::{Activation, BinaryOp};
use rlx::ir::{infer, DType, Graph, NodeId, Op, Shape, Tensor, TensorData};
use rlx::{CompiledModel, Device, ExecMode, Session, TensorRef};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Source of graph identities, so a node of one graph is refused by another.
static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// A node of an `rlx.Graph`: its id, shape and dtype (`rlx.Node`).
#[pyclass(name = "Node", module = "rlx", frozen)]
#[derive(Clone)]
pub struct PyNode {
    graph: u64,
    id: u32,
    dims: Vec<usize>,
    dtype: DType,
}

#[pymethods]
impl PyNode {
    /// The node id (its index in the graph).
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// Dimensions, outermost first.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.dims.clone()
    }

    /// Element type name ("f32", "i64", ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    fn __repr__(&self) -> String {
        format!(
            "Node(id={}, shape={:?}, dtype={:?})",
            self.id,
            self.dims,
            self.dtype.name()
        )
    }
}

/// A graph under construction (`rlx.Graph`). Ops infer their output shape
/// from their inputs; a shape error is a `GraphError` naming the op and the
/// input shapes.
#[pyclass(name = "Graph", module = "rlx")]
pub struct PyGraph {
    uid: u64,
    g: Graph,
}

fn parse_dtype(s: &str) -> PyResult<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "i32" | "int32" => Ok(DType::I32),
        "i64" | "int64" => Ok(DType::I64),
        "u8" | "uint8" => Ok(DType::U8),
        _ => Err(PyValueError::new_err(format!(
            "dtype={s:?}: expected \"f32\", \"i32\", \"i64\" or \"u8\""
        ))),
    }
}

/// `GeluTanh` -> `gelu_tanh`.
fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn parse_activation(s: &str) -> PyResult<Activation> {
    let key = |t: &str| t.trim().to_ascii_lowercase().replace(['_', '-'], "");
    let want = key(s);
    Activation::ALL
        .into_iter()
        .find(|a| key(&format!("{a:?}")) == want)
        .ok_or_else(|| {
            let names: Vec<String> = Activation::ALL
                .iter()
                .map(|a| snake(&format!("{a:?}")))
                .collect();
            PyValueError::new_err(format!(
                "activation {s:?}: expected one of {}",
                names.join(", ")
            ))
        })
}

fn parse_binary(s: &str) -> PyResult<BinaryOp> {
    let want = s.trim().to_ascii_lowercase();
    BinaryOp::ALL
        .into_iter()
        .find(|b| format!("{b:?}").to_ascii_lowercase() == want)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "binary op {s:?}: expected add, sub, mul, div, max, min or pow"
            ))
        })
}

fn dims_arg(shape: Vec<i64>, what: &str) -> PyResult<Vec<usize>> {
    shape
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                PyValueError::new_err(format!(
                    "{what}: shape {shape:?}: dimensions must be non-negative"
                ))
            })
        })
        .collect()
}

impl PyGraph {
    /// The node id of `n`, checked to belong to this graph.
    fn id_of(&self, n: &PyNode) -> PyResult<NodeId> {
        if n.graph != self.uid || n.id as usize >= self.g.nodes().len() {
            return Err(GraphError::new_err(format!(
                "node {} is not a node of graph {:?}",
                n.id, self.g.name
            )));
        }
        Ok(NodeId(n.id))
    }

    /// Add `op` over `inputs`, inferring its shape.
    fn op(&mut self, op: Op, inputs: &[&PyNode]) -> PyResult<PyNode> {
        let ids = inputs
            .iter()
            .map(|n| self.id_of(n))
            .collect::<PyResult<Vec<_>>>()?;
        let shapes: Vec<Shape> = ids.iter().map(|&i| self.g.node(i).shape.clone()).collect();
        let shape = infer::infer_shape(&op, &shapes).map_err(|e| {
            let ins: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
            GraphError::new_err(format!("{} over [{}]: {e}", op.name(), ins.join(", ")))
        })?;
        let id = self.g.add_node(op, ids, shape.clone());
        Ok(self.node(id, &shape))
    }

    fn node(&self, id: NodeId, shape: &Shape) -> PyNode {
        PyNode {
            graph: self.uid,
            id: id.0,
            dims: shape.dims.clone(),
            dtype: shape.dtype,
        }
    }

    fn leaf_name_taken(&self, name: &str) -> bool {
        self.g.nodes().iter().any(|n| match &n.op {
            Op::Input { name: m } | Op::Param { name: m } => m == name,
            _ => false,
        })
    }

    fn leaf(&mut self, name: &str, shape: Vec<i64>, dtype: &str, input: bool) -> PyResult<PyNode> {
        if name.is_empty() {
            return Err(PyValueError::new_err("name: empty"));
        }
        if self.leaf_name_taken(name) {
            return Err(GraphError::new_err(format!(
                "graph {:?} already has an input or param named {name:?}",
                self.g.name
            )));
        }
        let s = Shape::new(&dims_arg(shape, name)?, parse_dtype(dtype)?);
        if s.checked_size_bytes().is_none() {
            return Err(PyValueError::new_err(format!(
                "{name}: shape {s} overflows the address space"
            )));
        }
        let id = if input {
            self.g.input(name, s.clone())
        } else {
            self.g.param(name, s.clone())
        };
        Ok(self.node(id, &s))
    }
}

#[pymethods]
impl PyGraph {
    /// An empty graph called `name`.
    #[new]
    #[pyo3(signature = (name = "graph"))]
    fn new(name: &str) -> Self {
        PyGraph {
            uid: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            g: Graph::new(name),
        }
    }

    /// A graph input fed by `Session.run` (`dtype`: "f32", "i32", "i64", "u8").
    #[pyo3(signature = (name, shape, dtype = "f32"))]
    fn input(&mut self, name: &str, shape: Vec<i64>, dtype: &str) -> PyResult<PyNode> {
        self.leaf(name, shape, dtype, true)
    }

    /// A weight set with `Session.set_param` (or `compile(params=...)`).
    #[pyo3(signature = (name, shape, dtype = "f32"))]
    fn param(&mut self, name: &str, shape: Vec<i64>, dtype: &str) -> PyResult<PyNode> {
        self.leaf(name, shape, dtype, false)
    }

    /// A constant tensor (a numpy array of float32, int32, int64 or uint8).
    fn constant(&mut self, value: &Bound<'_, PyAny>) -> PyResult<PyNode> {
        let t = array_to_tensor(value, "constant")?;
        self.op(Op::Constant { value: t }, &[])
    }

    /// `a @ b` (batched over leading dims).
    fn matmul(&mut self, a: PyRef<'_, PyNode>, b: PyRef<'_, PyNode>) -> PyResult<PyNode> {
        self.op(Op::MatMul, &[&a, &b])
    }

    /// An elementwise activation: relu, gelu, gelu_tanh, silu, sigmoid,
    /// tanh, exp, neg, sqrt, rsqrt, abs, softplus, mish.
    fn activation(&mut self, kind: &str, x: PyRef<'_, PyNode>) -> PyResult<PyNode> {
        let a = parse_activation(kind)?;
        self.op(Op::Activation(a), &[&x])
    }

    /// An elementwise binary op with numpy broadcasting: add, sub, mul,
    /// div, max, min, pow.
    fn binary(
        &mut self,
        kind: &str,
        a: PyRef<'_, PyNode>,
        b: PyRef<'_, PyNode>,
    ) -> PyResult<PyNode> {
        let op = parse_binary(kind)?;
        self.op(Op::Binary(op), &[&a, &b])
    }

    /// `a + b` (broadcasting).
    fn add(&mut self, a: PyRef<'_, PyNode>, b: PyRef<'_, PyNode>) -> PyResult<PyNode> {
        self.op(Op::Binary(BinaryOp::Add), &[&a, &b])
    }

    /// `a * b` (broadcasting).
    fn mul(&mut self, a: PyRef<'_, PyNode>, b: PyRef<'_, PyNode>) -> PyResult<PyNode> {
        self.op(Op::Binary(BinaryOp::Mul), &[&a, &b])
    }

    /// Layer normalization over the last axis with `gamma` and `beta` (`[D]`).
    #[pyo3(signature = (x, gamma, beta, eps = 1e-5))]
    fn layer_norm(
        &mut self,
        x: PyRef<'_, PyNode>,
        gamma: PyRef<'_, PyNode>,
        beta: PyRef<'_, PyNode>,
        eps: f32,
    ) -> PyResult<PyNode> {
        self.op(Op::LayerNorm { axis: -1, eps }, &[&x, &gamma, &beta])
    }

    /// RMS normalization over the last axis with `gamma` (`[D]`).
    #[pyo3(signature = (x, gamma, eps = 1e-6))]
    fn rms_norm(
        &mut self,
        x: PyRef<'_, PyNode>,
        gamma: PyRef<'_, PyNode>,
        eps: f32,
    ) -> PyResult<PyNode> {
        self.op(Op::RmsNorm { axis: -1, eps }, &[&x, &gamma])
    }

    /// Softmax over `axis` (negative counts from the end).
    #[pyo3(signature = (x, axis = -1))]
    fn softmax(&mut self, x: PyRef<'_, PyNode>, axis: i64) -> PyResult<PyNode> {
        let rank = x.dims.len() as i64;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            return Err(PyValueError::new_err(format!(
                "softmax axis={axis}: out of range for rank {rank}"
            )));
        }
        self.op(Op::Softmax { axis: a as usize }, &[&x])
    }

    /// The same elements with new dims (the element count must match).
    fn reshape(&mut self, x: PyRef<'_, PyNode>, shape: Vec<i64>) -> PyResult<PyNode> {
        let shape = dims_arg(shape, "reshape")?;
        self.op(Op::Reshape { shape }, &[&x])
    }

    /// Permute the axes: `out.shape[i] = x.shape[perm[i]]`.
    fn transpose(&mut self, x: PyRef<'_, PyNode>, perm: Vec<usize>) -> PyResult<PyNode> {
        self.op(Op::Transpose { perm }, &[&x])
    }

    /// Set the graph outputs (what `Session.run` returns, in order).
    fn set_outputs(&mut self, outputs: Vec<PyRef<'_, PyNode>>) -> PyResult<()> {
        if outputs.is_empty() {
            return Err(PyValueError::new_err(
                "set_outputs: empty; expected at least one node",
            ));
        }
        let ids = outputs
            .iter()
            .map(|n| self.id_of(n))
            .collect::<PyResult<Vec<_>>>()?;
        self.g.set_outputs(ids);
        Ok(())
    }

    /// Number of nodes.
    fn __len__(&self) -> usize {
        self.g.nodes().len()
    }

    /// The graph's name.
    #[getter]
    fn name(&self) -> String {
        self.g.name.clone()
    }

    /// Verify and compile for `device` ("cpu", or "cuda[:N]" in a wheel built
    /// with `--features cuda`; `DeviceError` when it cannot be used), in `mode` "hybrid" (compiled
    /// segments between thunk ranges) or "thunks" (one dispatch per op);
    /// `params` binds weights by name (more can be set later with
    /// `Session.set_param`). The graph stays usable.
    #[pyo3(signature = (mode = "hybrid", device = "cpu", threads = None, params = None))]
    fn compile(
        &self,
        py: Python<'_>,
        mode: &str,
        device: &str,
        threads: Option<i64>,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PySession> {
        let exec = match mode.trim().to_ascii_lowercase().as_str() {
            "hybrid" => ExecMode::Hybrid,
            "thunks" => ExecMode::Thunks,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "mode={mode:?}: expected \"hybrid\" or \"thunks\""
                )))
            }
        };
        let dev = match crate::parse_device(device)? {
            None => Device::Cpu,
            #[cfg(feature = "cuda")]
            Some(i) => {
                crate::check_cuda(i)?;
                Device::Cuda(i)
            }
            #[cfg(not(feature = "cuda"))]
            Some(i) => {
                return Err(crate::DeviceError::new_err(format!(
                    "device cuda:{i}: this build of rlx has no CUDA backend"
                )))
            }
        };
        let threads = match threads {
            Some(t) if t < 1 => {
                return Err(PyValueError::new_err(format!(
                    "threads={t}: expected a positive count or None"
                )))
            }
            Some(t) => crate::check_threads(Some(t as usize))?,
            None => None,
        };
        if self.g.outputs.is_empty() {
            return Err(GraphError::new_err(format!(
                "graph {:?} has no outputs: call set_outputs first",
                self.g.name
            )));
        }
        let mut session = Session::new(dev).mode(exec);
        if let Some(t) = threads {
            session = session.threads(t);
        }
        let g = self.g.clone();
        let inputs: Vec<(String, Shape)> = g
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Input { name } => Some((name.clone(), n.shape.clone())),
                _ => None,
            })
            .collect();
        let params_decl: HashMap<String, Shape> = g
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Param { name } => Some((name.clone(), n.shape.clone())),
                _ => None,
            })
            .collect();
        let model = py.detach(|| {
            guarded("Graph.compile", || {
                session.compile(g).map_err(|e| match e {
                    rlx::Error::Ir(e) => GraphError::new_err(e.to_string()),
                    e => ExecutionError::new_err(e.to_string()),
                })
            })
        })?;
        let sess = PySession {
            model: Mutex::new(model),
            inputs,
            params: params_decl,
            mode: if exec == ExecMode::Hybrid {
                "hybrid"
            } else {
                "thunks"
            },
        };
        if let Some(p) = params {
            for (k, v) in p.iter() {
                let name: String = k.extract().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "params: keys must be str, got {}",
                        crate::type_name(&k)
                    ))
                })?;
                sess.set_param(py, &name, &v)?;
            }
        }
        Ok(sess)
    }

    /// The graph as text (one line per node).
    fn dump(&self) -> String {
        format!("{}", self.g)
    }

    fn __repr__(&self) -> String {
        format!(
            "Graph(name={:?}, nodes={}, outputs={})",
            self.g.name,
            self.g.nodes().len(),
            self.g.outputs.len()
        )
    }
}

/// A numpy array as an owned tensor (C order).
fn array_to_tensor(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: expected a numpy array, got {}",
            crate::type_name(obj)
        ))
    })?;
    let dims = arr.shape().to_vec();
    let data = if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'_, f32>>() {
        TensorData::F32(a.as_array().iter().copied().collect())
    } else if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'_, i64>>() {
        TensorData::I64(a.as_array().iter().copied().collect())
    } else if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'_, i32>>() {
        TensorData::I32(a.as_array().iter().copied().collect())
    } else if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'_, u8>>() {
        TensorData::U8(a.as_array().iter().copied().collect())
    } else {
        return Err(PyTypeError::new_err(format!(
            "{what}: a numpy array of dtype {}; expected float32, int32, int64 or uint8 \
             (convert with .astype(np.float32))",
            arr.dtype()
        )));
    };
    let dtype = data.dtype();
    Ok(Tensor {
        shape: Shape::new(&dims, dtype),
        data: std::sync::Arc::new(data),
    })
}

/// A compiled graph (`rlx.Session`): set weights, run, read the plan.
#[pyclass(name = "Session", module = "rlx", frozen)]
pub struct PySession {
    model: Mutex<CompiledModel>,
    inputs: Vec<(String, Shape)>,
    params: HashMap<String, Shape>,
    mode: &'static str,
}

/// Check a tensor against a declared leaf.
fn check_leaf(kind: &str, name: &str, want: &Shape, t: &Tensor) -> PyResult<()> {
    if t.shape.dtype != want.dtype {
        return Err(PyTypeError::new_err(format!(
            "{kind} {name:?}: got dtype {}, expected {} (shape {want})",
            t.shape.dtype, want.dtype
        )));
    }
    if t.shape.dims != want.dims {
        return Err(PyValueError::new_err(format!(
            "{kind} {name:?}: got shape {:?}, expected {:?}",
            t.shape.dims, want.dims
        )));
    }
    Ok(())
}

fn tensor_ref(t: &Tensor) -> TensorRef<'_> {
    match &*t.data {
        TensorData::F32(v) => TensorRef::F32(v),
        TensorData::I32(v) => TensorRef::I32(v),
        TensorData::I64(v) => TensorRef::I64(v),
        TensorData::U8(v) => TensorRef::U8(v),
    }
}

fn to_numpy<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let dims = IxDyn(&t.shape.dims);
    let data = std::sync::Arc::try_unwrap(t.data).unwrap_or_else(|a| (*a).clone());
    let shape_err = |e: numpy::ndarray::ShapeError| ExecutionError::new_err(e.to_string());
    Ok(match data {
        TensorData::F32(v) => ArrayD::from_shape_vec(dims, v)
            .map_err(shape_err)?
            .into_pyarray(py)
            .into_any(),
        TensorData::I32(v) => ArrayD::from_shape_vec(dims, v)
            .map_err(shape_err)?
            .into_pyarray(py)
            .into_any(),
        TensorData::I64(v) => ArrayD::from_shape_vec(dims, v)
            .map_err(shape_err)?
            .into_pyarray(py)
            .into_any(),
        TensorData::U8(v) => ArrayD::from_shape_vec(dims, v)
            .map_err(shape_err)?
            .into_pyarray(py)
            .into_any(),
    })
}

#[pymethods]
impl PySession {
    /// Set (or replace) the weight `name` from a numpy array of its
    /// declared shape and dtype.
    fn set_param(&self, py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let want = self.params.get(name).ok_or_else(|| {
            let mut known: Vec<&String> = self.params.keys().collect();
            known.sort();
            PyValueError::new_err(format!(
                "set_param: the graph has no param {name:?} (params: {known:?})"
            ))
        })?;
        let t = array_to_tensor(value, &format!("param {name:?}"))?;
        check_leaf("param", name, want, &t)?;
        let model = &self.model;
        py.detach(|| {
            guarded("Session.set_param", || {
                lock(model, "Session")?
                    .set_param_typed(name, tensor_ref(&t))
                    .map_err(|e| ExecutionError::new_err(e.to_string()))
            })
        })
    }

    /// Run with `inputs` (`{name: numpy array}`, every graph input, each of
    /// its declared shape and dtype); one numpy array per graph output.
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut given: HashMap<String, Tensor> = HashMap::new();
        for (k, v) in inputs.iter() {
            let name: String = k.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "inputs: keys must be str, got {}",
                    crate::type_name(&k)
                ))
            })?;
            let Some((_, want)) = self.inputs.iter().find(|(n, _)| *n == name) else {
                let known: Vec<&String> = self.inputs.iter().map(|(n, _)| n).collect();
                return Err(PyValueError::new_err(format!(
                    "inputs: the graph has no input {name:?} (inputs: {known:?})"
                )));
            };
            let t = array_to_tensor(&v, &format!("input {name:?}"))?;
            check_leaf("input", &name, want, &t)?;
            given.insert(name, t);
        }
        if let Some((missing, s)) = self.inputs.iter().find(|(n, _)| !given.contains_key(n)) {
            return Err(PyValueError::new_err(format!(
                "inputs: missing {missing:?} (shape {s})"
            )));
        }
        let model = &self.model;
        let outs = py.detach(|| {
            guarded("Session.run", || {
                let refs: Vec<(&str, TensorRef<'_>)> = given
                    .iter()
                    .map(|(n, t)| (n.as_str(), tensor_ref(t)))
                    .collect();
                lock(model, "Session")?
                    .run_typed(&refs)
                    .map_err(|e| ExecutionError::new_err(e.to_string()))
            })
        })?;
        let list = PyList::empty(py);
        for t in outs {
            list.append(to_numpy(py, t)?)?;
        }
        Ok(list)
    }

    /// The plan as a dict: mode, compiled_segments, thunk_ranges,
    /// dispatches, dispatches_thunks_only, segments (nodes, first, last,
    /// boundary_inputs, boundary_outputs), ranges (start, end, ops with the
    /// op name and the rule that kept it out), declined and split
    /// (node, reason), and the arena bytes.
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = lock(&self.model, "Session")?;
        let r = m.plan_report();
        let d = PyDict::new(py);
        d.set_item("mode", self.mode)?;
        d.set_item("compiled_segments", r.compiled_segments)?;
        d.set_item("thunk_ranges", r.thunk_ranges)?;
        d.set_item("dispatches", r.dispatches)?;
        d.set_item("dispatches_thunks_only", r.dispatches_thunks_only)?;
        let segs = PyList::empty(py);
        for s in &r.segments {
            let e = PyDict::new(py);
            e.set_item("nodes", s.nodes)?;
            e.set_item("first", s.first.0)?;
            e.set_item("last", s.last.0)?;
            e.set_item(
                "boundary_inputs",
                s.boundary_inputs.iter().map(|n| n.0).collect::<Vec<_>>(),
            )?;
            e.set_item(
                "boundary_outputs",
                s.boundary_outputs.iter().map(|n| n.0).collect::<Vec<_>>(),
            )?;
            segs.append(e)?;
        }
        d.set_item("segments", segs)?;
        let ranges = PyList::empty(py);
        for rr in &r.ranges {
            let e = PyDict::new(py);
            e.set_item("start", rr.start)?;
            e.set_item("end", rr.end)?;
            let ops = PyList::empty(py);
            for o in &rr.ops {
                let od = PyDict::new(py);
                od.set_item("node", o.node.0)?;
                od.set_item("op", o.op)?;
                od.set_item("reason", &o.reason)?;
                ops.append(od)?;
            }
            e.set_item("ops", ops)?;
            ranges.append(e)?;
        }
        d.set_item("ranges", ranges)?;
        let pairs = |v: &[(NodeId, String)]| -> PyResult<Bound<'py, PyList>> {
            let l = PyList::empty(py);
            for (n, why) in v {
                let e = PyDict::new(py);
                e.set_item("node", n.0)?;
                e.set_item("reason", why)?;
                l.append(e)?;
            }
            Ok(l)
        };
        d.set_item("declined", pairs(&r.declined)?)?;
        d.set_item("split", pairs(&r.split)?)?;
        let mem = m.memory();
        d.set_item("memory", format!("{mem:?}"))?;
        Ok(d)
    }

    /// `{"compiled_segments", "thunk_ranges", "dispatches"}` (as the Rust
    /// `PlanStats`).
    fn plan_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = lock(&self.model, "Session")?.plan_stats();
        let d = PyDict::new(py);
        d.set_item("compiled_segments", s.compiled_segments)?;
        d.set_item("thunk_ranges", s.thunk_ranges)?;
        d.set_item("dispatches", s.dispatches)?;
        Ok(d)
    }

    /// Names, shapes and dtypes of the graph inputs, in graph order.
    #[getter]
    fn inputs(&self) -> Vec<(String, Vec<usize>, &'static str)> {
        self.inputs
            .iter()
            .map(|(n, s)| (n.clone(), s.dims.clone(), s.dtype.name()))
            .collect()
    }

    fn __repr__(&self) -> PyResult<String> {
        let s = lock(&self.model, "Session")?.plan_stats();
        Ok(format!(
            "Session(mode={:?}, compiled_segments={}, thunk_ranges={}, dispatches={})",
            self.mode, s.compiled_segments, s.thunk_ranges, s.dispatches
        ))
    }
}
