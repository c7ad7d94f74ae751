//! The public surface of DESIGN.md, exactly as written there, and every
//! error class of `Session` / `CompiledModel`.

use rlx::hybrid::{segment, CompiledSegment, Segment, SplitPolicy};
use rlx::ir::op::{Activation, BinaryOp, MaskKind};
use rlx::ir::{DType, Graph, Node, NodeId, Op, Shape};
use rlx::{Device, Error, ExecMode, PlanStats, RuntimeError, Session};

fn mlp() -> Graph {
    let mut g = Graph::new("mlp");
    let x = g.input("x", Shape::new(&[2, 3], DType::F32));
    let w = g.param("w", Shape::new(&[3, 4], DType::F32));
    let h = g.matmul(x, w, Shape::new(&[2, 4], DType::F32));
    let y = g.activation(Activation::Relu, h, Shape::new(&[2, 4], DType::F32));
    g.set_outputs(vec![y]);
    g
}

#[test]
fn design_surface_compiles_and_runs() {
    let g = mlp();
    let n: &Node = g.node(NodeId(2));
    assert!(matches!(n.op, Op::MatMul));
    assert_eq!(n.inputs, vec![NodeId(0), NodeId(1)]);
    assert_eq!(n.shape, Shape::new(&[2, 4], DType::F32));
    assert_eq!(g.users(NodeId(2)), vec![NodeId(3)]);
    assert_eq!(g.outputs, vec![NodeId(3)]);
    assert_eq!(g.nodes().len(), 4);
    g.verify().unwrap();
    let _ = (BinaryOp::Add, MaskKind::Causal, MaskKind::SlidingWindow(4));
    let segs: Vec<Segment> = segment(&g, &SplitPolicy::default());
    let Segment::Compiled(CompiledSegment {
        nodes,
        boundary_inputs,
        boundary_outputs,
    }) = &segs[0]
    else {
        panic!("expected one compiled segment")
    };
    assert_eq!(nodes, &vec![NodeId(2), NodeId(3)]);
    assert_eq!(boundary_inputs, &vec![NodeId(0), NodeId(1)]);
    assert_eq!(boundary_outputs, &vec![NodeId(3)]);
    let custom = SplitPolicy::new(|op: &Op| !matches!(op, Op::Activation(_)));
    assert!(matches!(
        segment(&g, &custom)[1],
        Segment::Thunks { start: 3, end: 4 }
    ));

    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let mut m = Session::new(Device::Cpu)
            .mode(mode)
            .compile(g.clone())
            .unwrap();
        m.set_param(
            "w",
            &[1.0, -1.0, 0.5, 0.0, 2.0, 1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 3.0],
        )
        .unwrap();
        let out: Vec<Vec<f32>> = m.run(&[("x", &[1.0, 2.0, 3.0, -1.0, 0.0, 1.0])]).unwrap();
        // Row 0: [1,2,3] x w = [5, 1, 1.5, 9]; row 1: [-1,0,1] x w = [-1, 1, 0.5, 3] -> relu.
        assert_eq!(out, vec![vec![5.0, 1.0, 1.5, 9.0, 0.0, 1.0, 0.5, 3.0]]);
        let st: PlanStats = m.plan_stats();
        let want = if mode == ExecMode::Hybrid {
            (1, 0, 1)
        } else {
            (0, 1, 2)
        };
        assert_eq!((st.compiled_segments, st.thunk_ranges, st.dispatches), want);
    }
}

fn compiled() -> rlx::CompiledModel {
    Session::new(Device::Cpu).compile(mlp()).unwrap()
}

#[test]
fn missing_param_is_an_error() {
    let mut m = compiled();
    let e = m.run(&[("x", &[0.0; 6])]).unwrap_err();
    assert!(
        matches!(e, Error::Runtime(RuntimeError::MissingParam { ref name, .. }) if name == "w"),
        "{e}"
    );
    assert!(e.to_string().contains("f32[3,4]"), "{e}");
}

#[test]
fn wrong_length_is_an_error() {
    let mut m = compiled();
    let e = m.set_param("w", &[0.0; 11]).unwrap_err();
    assert!(e.to_string().contains("expected 12 elements"), "{e}");
    m.set_param("w", &[0.0; 12]).unwrap();
    let e = m.run(&[("x", &[0.0; 5])]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Runtime(RuntimeError::WrongLength {
                expected: 6,
                got: 5,
                ..
            })
        ),
        "{e}"
    );
}

#[test]
fn unknown_input_and_param_are_errors() {
    let mut m = compiled();
    m.set_param("w", &[0.0; 12]).unwrap();
    let e = m.run(&[("y", &[0.0; 6])]).unwrap_err();
    assert!(
        e.to_string().contains("no input named 'y'") && e.to_string().contains("x"),
        "{e}"
    );
    let e = m.set_param("nope", &[0.0; 12]).unwrap_err();
    assert!(
        matches!(e, Error::Runtime(RuntimeError::UnknownParam { .. })),
        "{e}"
    );
    let e = m.run(&[]).unwrap_err();
    assert!(
        matches!(e, Error::Runtime(RuntimeError::MissingInput { .. })),
        "{e}"
    );
}

#[test]
fn duplicate_input_is_an_error_and_params_replace() {
    let mut m = compiled();
    m.set_param("w", &[0.0; 12]).unwrap();
    let e = m.run(&[("x", &[0.0; 6]), ("x", &[1.0; 6])]).unwrap_err();
    assert!(
        matches!(e, Error::Runtime(RuntimeError::DuplicateInput { .. })),
        "{e}"
    );
    let mut w = vec![0.0; 12];
    w[0] = 1.0;
    m.set_param("w", &w).unwrap();
    let out = m.run(&[("x", &[2.0, 0.0, 0.0, 0.0, 0.0, 0.0])]).unwrap();
    assert_eq!(out[0][0], 2.0, "the second set_param replaced the first");
}

#[test]
fn wrong_dtype_is_an_error() {
    let mut g = Graph::new("ids");
    let ids = g.input("ids", Shape::new(&[3], DType::I64));
    let t = g.param("t", Shape::f32(&[5, 2]));
    let y = g.add_node(Op::Gather { axis: 0 }, vec![t, ids], Shape::f32(&[3, 2]));
    g.set_outputs(vec![y]);
    let mut m = Session::new(Device::Cpu).compile(g).unwrap();
    m.set_param("t", &[0.0; 10]).unwrap();
    let e = m.run(&[("ids", &[0.0; 3])]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Runtime(RuntimeError::WrongDType {
                expected: DType::I64,
                got: DType::F32,
                ..
            })
        ),
        "{e}"
    );
    // Out-of-range ids are errors naming the node, not panics.
    let e = m
        .run_typed(&[("ids", rlx::TensorRef::I64(&[0, 5, 1]))])
        .unwrap_err();
    assert!(
        e.to_string().contains("Gather") && e.to_string().contains('5'),
        "{e}"
    );
}

#[test]
fn invalid_graph_is_an_error_naming_the_node() {
    let mut g = Graph::new("bad");
    let a = g.input("a", Shape::f32(&[2, 3]));
    let b = g.input("b", Shape::f32(&[4, 5]));
    let y = g.matmul(a, b, Shape::f32(&[2, 5]));
    g.set_outputs(vec![y]);
    let e = Session::new(Device::Cpu)
        .compile(g)
        .err()
        .expect("must fail");
    let msg = e.to_string();
    assert!(
        msg.contains("%2")
            && msg.contains("MatMul")
            && msg.contains("f32[2,3]")
            && msg.contains("f32[4,5]"),
        "{msg}"
    );

    let mut g = Graph::new("recorded");
    let a = g.input("a", Shape::f32(&[2]));
    let y = g.activation(Activation::Tanh, a, Shape::f32(&[3]));
    g.set_outputs(vec![y]);
    let msg = Session::new(Device::Cpu)
        .compile(g)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("recorded shape f32[3]") && msg.contains("f32[2]"),
        "{msg}"
    );

    let mut g = Graph::new("no outputs");
    g.input("a", Shape::f32(&[2]));
    assert!(Session::new(Device::Cpu).compile(g).is_err());

    let mut g = Graph::new("unknown output");
    g.input("a", Shape::f32(&[2]));
    g.set_outputs(vec![NodeId(9)]);
    assert!(Session::new(Device::Cpu)
        .compile(g)
        .err()
        .unwrap()
        .to_string()
        .contains("%9"));
}

/// `Session::f16_weights`: a matmul multiplies the weights rounded to f16
/// (checked against f64 products of the rounded values), in both modes,
/// and differs from the f32 result where rounding changes the weights.
#[test]
fn f16_weights_multiply_rounded_weights() {
    let (m, k, n) = (5usize, 40usize, 24usize);
    let mut g = Graph::new("mm");
    let x = g.input("x", Shape::new(&[m, k], DType::F32));
    let w = g.param("w", Shape::new(&[k, n], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[m, n], DType::F32));
    g.set_outputs(vec![y]);
    let xv: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0)
        .collect();
    let wv: Vec<f32> = (0..k * n)
        .map(|i| ((i * 11 % 17) as f32 - 8.0) / 3.3)
        .collect();
    let w16: Vec<f64> = wv
        .iter()
        .map(|&v| half::f16::from_f32(v).to_f32() as f64)
        .collect();
    let mut differs = false;
    for mode in [ExecMode::Thunks, ExecMode::Hybrid] {
        let run = |f16: bool| {
            let mut model = Session::new(Device::Cpu)
                .mode(mode)
                .f16_weights(f16)
                .compile(g.clone())
                .unwrap();
            model.set_param("w", &wv).unwrap();
            model.run(&[("x", &xv)]).unwrap().remove(0)
        };
        let (full, half) = (run(false), run(true));
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|p| xv[i * k + p] as f64 * w16[p * n + j]).sum();
                let got = half[i * n + j] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "{mode:?} ({i},{j}): {got} vs {want}"
                );
                differs |= half[i * n + j] != full[i * n + j];
            }
        }
    }
    assert!(differs, "f16 weights gave exactly the f32 result");
}

/// `mlp()` with a NaN at `w[1][2]`: column 2 of the matmul is NaN.
fn nan_mlp(mode: ExecMode, check: bool) -> rlx::CompiledModel {
    let mut m = Session::new(Device::Cpu)
        .mode(mode)
        .check_finite(check)
        .compile(mlp())
        .unwrap();
    let mut w = vec![0.5f32; 12];
    w[4 + 2] = f32::NAN;
    m.set_param("w", &w).unwrap();
    m
}

#[test]
fn check_finite_names_the_first_node_producing_nan() {
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    // Off (and RLX_CHECK_FINITE unset): the NaN reaches the output silently.
    if std::env::var_os("RLX_CHECK_FINITE").is_none() {
        let out = nan_mlp(ExecMode::Thunks, false).run(&[("x", &x)]).unwrap();
        assert!(out[0].iter().any(|v| v.is_nan()));
    }
    // Thunks: the MatMul (node 2) is the first node producing it.
    let err = nan_mlp(ExecMode::Thunks, true)
        .run(&[("x", &x)])
        .unwrap_err();
    let msg = err.to_string();
    match err {
        Error::Runtime(RuntimeError::NonFinite {
            node,
            op,
            shape,
            index,
            value,
            ..
        }) => {
            assert_eq!(node, NodeId(2), "{msg}");
            assert_eq!(op, "MatMul");
            assert_eq!(shape, Shape::new(&[2, 4], DType::F32));
            assert_eq!(index, 2, "{msg}");
            assert!(value.is_nan());
        }
        other => panic!("expected NonFinite, got {other}"),
    }
    assert!(msg.contains("%2") || msg.contains("node 2"), "{msg}");
    assert!(msg.contains("MatMul") && msg.contains("f32[2,4]"), "{msg}");
    // Hybrid: MatMul+Relu run as one compiled segment; its boundary output
    // (the Relu, node 3) is reported, with the segment named.
    let mut m = nan_mlp(ExecMode::Hybrid, true);
    assert_eq!(m.plan_stats().compiled_segments, 1);
    let msg = m.run(&[("x", &x)]).unwrap_err().to_string();
    assert!(msg.contains("compiled segment"), "{msg}");
    assert!(msg.contains("Relu"), "{msg}");
    // Finite inputs and weights pass the check.
    let mut ok = Session::new(Device::Cpu)
        .check_finite(true)
        .compile(mlp())
        .unwrap();
    ok.set_param("w", &[0.5; 12]).unwrap();
    assert_eq!(ok.run(&[("x", &x)]).unwrap()[0].len(), 8);
}

#[test]
fn overflowing_shapes_are_refused_naming_node_and_shape() {
    let huge = 1usize << 40;
    let s = Shape::new(&[huge, huge], DType::F32);
    assert_eq!(s.checked_numel(), None);
    assert_eq!(s.checked_size_bytes(), None);
    assert_eq!(s.numel(), usize::MAX, "numel saturates, never wraps");
    // Product fits usize but the bytes do not fit one allocation.
    assert_eq!(
        Shape::new(&[1 << 62], DType::F32).checked_size_bytes(),
        None
    );
    assert_eq!(
        Shape::new(&[3, 4], DType::F32).checked_size_bytes(),
        Some(48)
    );

    let mut g = Graph::new("huge");
    let x = g.input("x", s.clone());
    let y = g.activation(Activation::Relu, x, s.clone());
    g.set_outputs(vec![y]);
    let err = g.verify().unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, rlx::ir::IrError::SizeOverflow { node, shape, .. } if *node == NodeId(0) && *shape == s),
        "{msg}"
    );
    assert!(
        msg.contains("Input(x)") && msg.contains("f32[1099511627776,1099511627776]"),
        "{msg}"
    );
    assert!(matches!(
        Session::new(Device::Cpu).compile(g),
        Err(Error::Ir(rlx::ir::IrError::SizeOverflow { .. }))
    ));
    // A reshape to a shape whose product overflows is a shape error.
    let mut g = Graph::new("reshape");
    let x = g.input("x", Shape::new(&[4], DType::F32));
    let r = g.push(
        Op::Reshape {
            shape: vec![huge, huge, 16],
        },
        vec![x],
    );
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn compiling_never_allocates_the_arena_and_big_plans_are_refused() {
    // A graph whose arena needs ~64 GiB... under a 1 GiB limit.
    let mut g = Graph::new("big");
    let x = g.input("x", Shape::new(&[1 << 16, 1 << 16], DType::F32));
    let y = g.activation(
        Activation::Relu,
        x,
        Shape::new(&[1 << 16, 1 << 16], DType::F32),
    );
    g.set_outputs(vec![y]);
    let cpu = rlx::cpu::CpuModel::compile(g.clone(), &Default::default());
    // Either refused by the machine's RAM, or compiled without allocating.
    match cpu {
        Ok(m) => assert!(!m.arena_allocated()),
        Err(e) => assert!(e.to_string().contains("bytes"), "{e}"),
    }
    // A small model compiles without allocating its arena; running does.
    let mut m = rlx::cpu::CpuModel::compile(mlp(), &Default::default()).unwrap();
    assert!(!m.arena_allocated());
    use rlx::runtime::Executable;
    m.set_param("w", rlx::TensorRef::F32(&[0.5; 12])).unwrap();
    m.run(&[("x", rlx::TensorRef::F32(&[1.0; 6]))]).unwrap();
    assert!(m.arena_allocated());
}
