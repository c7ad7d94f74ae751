//! The conformance suite: every case of the table in
//! `tests/common/cases.rs` (every `Op` variant, every activation, binary
//! op, mask kind and reduce function, with edge shapes) on every backend,
//! each run compared with the reference interpreter (`rlx-ref`) within one
//! tolerance per precision:
//!
//! - CPU thunks, CPU hybrid, and CPU hybrid with every 2nd eligible segment
//!   declined (`SplitPolicy::decline_every(2)`): f32, 1e-4 relative (with
//!   an absolute floor of 1e-4); both hybrids also equal the thunks within
//!   1e-5 (DESIGN invariant 3);
//! - CUDA (`--features cuda`) thunks and hybrid in f32 (1e-4), bf16 (4e-2)
//!   and f16 (1e-2); a case whose op has no CUDA kernel must fail to
//!   compile with an error naming the op.
//!
//! Every model is run twice and the second run must equal the first bit
//! for bit (reused arena, replayed CUDA graphs).
//!
//! `every_op_variant_has_a_case` fails when an `Op` variant, activation,
//! binary op, mask kind, reduce function, rope style or quant scheme has no
//! case (and `op_cases` does not compile when a variant has no arm).
//!
//! Without a GPU the CUDA tests print "skipped: no CUDA device" and pass;
//! with `RLX_REQUIRE_CUDA=1` that is a failure.

mod common;
use common::cases::{self, mask_kinds, op_cases, reduce_ops, Case, OP_ARMS};
#[cfg(feature = "cuda")]
use common::cuda_or_skip;
use common::{random_bindings, tref, Rng};
use rlx::hybrid::SplitPolicy;
use rlx::ir::op::{Activation, BinaryOp, RopeStyle};
use rlx::ir::{Op, QuantScheme, Tensor};
use rlx::{Device, ExecMode, Precision, Session};
use std::collections::{HashMap, HashSet};

/// One tolerance per precision: relative error, with an absolute floor of
/// the same size (values below 1 in magnitude compare absolutely).
fn tolerance(p: Precision) -> f32 {
    match p {
        Precision::F32 => 1e-4,
        Precision::Tf32 => 5e-3,
        Precision::F16 => 1e-2,
        Precision::Bf16 => 4e-2,
    }
}

/// Hybrid against thunks on the same device (DESIGN invariant 3).
const HYBRID_VS_THUNKS: f32 = 1e-5;

/// A backend configuration of the suite.
// Without the `cuda` feature only the CPU variants exist.
#[cfg_attr(not(feature = "cuda"), allow(clippy::enum_variant_names))]
#[derive(Debug, Clone, Copy)]
enum Backend {
    /// CPU, one thunk per op.
    CpuThunks,
    /// CPU, hybrid with the default policy.
    CpuHybrid,
    /// CPU, hybrid declining every 2nd eligible segment.
    CpuHybridDeclining,
    /// CUDA in one precision, thunks and hybrid.
    #[cfg(feature = "cuda")]
    Cuda(Precision),
}

impl Backend {
    fn precision(self) -> Precision {
        match self {
            #[cfg(feature = "cuda")]
            Backend::Cuda(p) => p,
            _ => Precision::F32,
        }
    }

    /// The sessions this backend runs every case on.
    fn sessions(self) -> Vec<(&'static str, Session)> {
        let cpu = || Session::new(Device::Cpu).poison_freed(true);
        match self {
            Backend::CpuThunks => vec![("thunks", cpu())],
            Backend::CpuHybrid => vec![("hybrid", cpu().mode(ExecMode::Hybrid))],
            Backend::CpuHybridDeclining => vec![(
                "hybrid-declining",
                cpu()
                    .mode(ExecMode::Hybrid)
                    .policy(SplitPolicy::default().decline_every(2)),
            )],
            #[cfg(feature = "cuda")]
            Backend::Cuda(p) => vec![
                ("cuda-thunks", Session::new(Device::Cuda(0)).precision(p)),
                (
                    "cuda-hybrid",
                    Session::new(Device::Cuda(0))
                        .precision(p)
                        .mode(ExecMode::Hybrid),
                ),
            ],
        }
    }

    fn is_hybrid_cpu(self) -> bool {
        matches!(self, Backend::CpuHybrid | Backend::CpuHybridDeclining)
    }
}

/// Seeded bindings for a case: random, with the case's fixed values.
fn bindings(case: &Case) -> HashMap<String, Tensor> {
    let seed = case.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut b = random_bindings(&case.graph, &mut Rng::new(seed), 1.0);
    for (name, t) in &case.fixed {
        b.insert(name.clone(), t.clone());
    }
    b
}

/// Compile, bind, run twice; the second run must equal the first.
fn run(session: &Session, case: &Case, b: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, String> {
    let g = &case.graph;
    let mut m = session
        .compile(g.clone())
        .map_err(|e| format!("compile: {e}"))?;
    let mut inputs = Vec::new();
    for n in g.nodes() {
        match &n.op {
            Op::Param { name } => m
                .set_param_typed(name, tref(&b[name]))
                .map_err(|e| format!("set_param {name}: {e}"))?,
            Op::Input { name } => inputs.push((name.as_str(), tref(&b[name]))),
            _ => {}
        }
    }
    let first = m.run_typed(&inputs).map_err(|e| format!("run: {e}"))?;
    let again = m
        .run_typed(&inputs)
        .map_err(|e| format!("second run: {e}"))?;
    for (i, (x, y)) in first.iter().zip(&again).enumerate() {
        let (x, y) = (x.data.to_f64(), y.data.to_f64());
        let same = x.len() == y.len()
            && x.iter()
                .zip(&y)
                .all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan());
        if !same {
            return Err(format!("output {i}: the second run differs from the first"));
        }
    }
    Ok(first)
}

/// `got` within `rel` of `want` (NaN matches NaN, infinities must be
/// equal), or the worst element.
fn compare(got: &Tensor, want: &Tensor, rel: f64, what: &str) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!("{what}: shape {} want {}", got.shape, want.shape));
    }
    let (g, w) = (got.data.to_f64(), want.data.to_f64());
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        if a.is_nan() && b.is_nan() || a == b {
            continue;
        }
        let err = (a - b).abs() / b.abs().max(1.0);
        if err.is_nan() || err > rel && worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, if err.is_nan() { f64::INFINITY } else { err }));
        }
    }
    match worst {
        None => Ok(()),
        Some((i, e)) => Err(format!(
            "{what}: element {i} got {} want {} (rel err {e:e} > {rel:e})",
            g[i], w[i]
        )),
    }
}

/// A case whose op the backend has no kernel for must fail to compile
/// with an error naming the op.
#[cfg(feature = "cuda")]
fn check_refused(session: &Session, case: &Case) -> Result<(), String> {
    let ops: Vec<&str> = case
        .graph
        .nodes()
        .iter()
        .filter(|n| !n.op.is_leaf())
        .map(|n| n.op.name())
        .collect();
    match session.compile(case.graph.clone()) {
        Ok(_) => Err("compiled, but the case says the backend cannot run it".into()),
        Err(e) if ops.iter().any(|o| e.to_string().contains(o)) => Ok(()),
        Err(e) => Err(format!("error does not name the op ({ops:?}): {e}")),
    }
}

fn run_suite(backend: Backend) {
    #[cfg(feature = "cuda")]
    if matches!(backend, Backend::Cuda(_)) && !cuda_or_skip() {
        return;
    }
    let rel = tolerance(backend.precision()) as f64;
    let sessions = backend.sessions();
    let thunks = Session::new(Device::Cpu);
    let mut failures = Vec::new();
    let mut ran = 0;
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut refused = 0;
    for case in cases::all() {
        let b = bindings(&case);
        let want = rlx_ref::run(&case.graph, &b)
            .unwrap_or_else(|e| panic!("{}: reference: {e}", case.name));
        #[cfg(feature = "cuda")]
        if let (Backend::Cuda(_), Some(why)) = (backend, case.no_cuda) {
            refused += 1;
            if let Err(e) = check_refused(&sessions[0].1, &case) {
                failures.push(format!("{} ({why}): {e}", case.name));
            }
            continue;
        }
        #[cfg(feature = "cuda")]
        if let (Backend::Cuda(Precision::F16), Some(why)) = (backend, case.no_f16) {
            println!("{}: not run in f16 ({why})", case.name);
            continue;
        }
        let base = if backend.is_hybrid_cpu() {
            match run(&thunks, &case, &b) {
                Ok(t) => Some(t),
                Err(e) => {
                    failures.push(format!("{} thunks: {e}", case.name));
                    continue;
                }
            }
        } else {
            None
        };
        for (label, s) in &sessions {
            let got = match run(s, &case, &b) {
                Ok(got) => got,
                Err(e) => {
                    failures.push(format!("{} {label}: {e}", case.name));
                    continue;
                }
            };
            for (i, (x, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{} {label} output {i} vs reference", case.name);
                if let Err(e) = compare(x, w, rel, &what) {
                    failures.push(e);
                }
                if let Some(t) = &base {
                    let what = format!("{} {label} output {i} vs thunks", case.name);
                    if let Err(e) = compare(x, &t[i], HYBRID_VS_THUNKS as f64, &what) {
                        failures.push(e);
                    }
                }
            }
        }
        ran += 1;
    }
    println!(
        "{backend:?}: {ran} cases run, {refused} refused as expected, {} failures",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{backend:?}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One `#[test]` per backend configuration, each running the whole table.
macro_rules! test_backends {
    ($($(#[$attr:meta])* $name:ident => $backend:expr;)+) => {
        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                run_suite($backend);
            }
        )+
    };
}

test_backends! {
    cpu_thunks => Backend::CpuThunks;
    cpu_hybrid => Backend::CpuHybrid;
    cpu_hybrid_declining_every_2nd_segment => Backend::CpuHybridDeclining;
    #[cfg(feature = "cuda")]
    cuda_f32 => Backend::Cuda(Precision::F32);
    #[cfg(feature = "cuda")]
    cuda_bf16 => Backend::Cuda(Precision::Bf16);
    #[cfg(feature = "cuda")]
    cuda_f16 => Backend::Cuda(Precision::F16);
}

#[test]
fn every_op_variant_has_a_case() {
    let all = cases::all();
    let mut names = HashSet::new();
    for c in &all {
        assert!(names.insert(c.name.as_str()), "case name {} twice", c.name);
    }
    let by_name: HashMap<&str, &Case> = all.iter().map(|c| (c.name.as_str(), c)).collect();
    for (variant, listed) in OP_ARMS {
        assert!(!listed.is_empty(), "Op::{variant} has no case");
        for name in *listed {
            let case = by_name
                .get(name)
                .unwrap_or_else(|| panic!("Op::{variant}: no case named {name}"));
            let holds = case
                .graph
                .nodes()
                .iter()
                .any(|n| n.op.name() == *variant && op_cases(&n.op).contains(name));
            assert!(holds, "case {name} has no Op::{variant} node");
        }
    }
    let ops: Vec<&Op> = all
        .iter()
        .flat_map(|c| c.graph.nodes().iter().map(|n| &n.op))
        .collect();
    let any = |p: &dyn Fn(&Op) -> bool| ops.iter().any(|o| p(o));
    for a in Activation::ALL {
        assert!(
            any(&|o| *o == Op::Activation(a)),
            "no Activation({a:?}) case"
        );
        assert!(
            any(&|o| matches!(o, Op::FusedMatMulBiasAct { activation: Some(x) } if *x == a)),
            "no FusedMatMulBiasAct({a:?}) case"
        );
    }
    for b in BinaryOp::ALL {
        assert!(any(&|o| *o == Op::Binary(b)), "no Binary({b:?}) case");
    }
    for m in mask_kinds() {
        let d = std::mem::discriminant(&m);
        assert!(
            any(
                &|o| matches!(o, Op::Attention { mask_kind, .. } if std::mem::discriminant(mask_kind) == d)
            ),
            "no Attention case with mask {m:?}"
        );
    }
    for r in reduce_ops() {
        assert!(
            any(&|o| matches!(o, Op::Reduce { op, .. } if *op == r)),
            "no Reduce({r:?}) case"
        );
    }
    for s in [RopeStyle::NeoX, RopeStyle::GptJ] {
        assert!(
            any(&|o| matches!(o, Op::Rope { style, .. } if *style == s)),
            "no Rope({s:?}) case"
        );
    }
    for q in QuantScheme::ALL {
        assert!(
            any(&|o| matches!(o, Op::DequantMatMul { scheme, .. } if *scheme == q)),
            "no DequantMatMul({}) case",
            q.name()
        );
    }
}

/// The declining backend really declines: a graph with several eligible
/// segments gets the test hook's reason on the ops of every 2nd one, and
/// keeps compiled segments on both sides of a declined one.
#[test]
fn declining_policy_declines_every_second_segment() {
    let case = cases::all()
        .into_iter()
        .find(|c| c.name == "mlp_chain")
        .expect("mlp_chain case");
    let m = Session::new(Device::Cpu)
        .mode(ExecMode::Hybrid)
        .policy(SplitPolicy::default().decline_every(2))
        .compile(case.graph.clone())
        .unwrap();
    let r = m.plan_report();
    let hooked: Vec<_> = r
        .ranges
        .iter()
        .flat_map(|x| &x.ops)
        .filter(|o| o.reason.contains("test hook declines every 2-th segment"))
        .collect();
    assert!(!hooked.is_empty(), "{r:#?}");
    assert!(r.compiled_segments >= 2, "{r:#?}");
}
