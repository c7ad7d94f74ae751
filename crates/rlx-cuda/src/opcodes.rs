//! The integer op codes that kernels take for activations, binary ops and
//! dtypes, and the CUDA C that interprets them.
//!
//! One table: [`act_cuda`] and [`bin_cuda`] give each op's CUDA C, its code
//! is its position in `Activation::ALL` / `BinaryOp::ALL`, and
//! [`ops_cuh`] generates the `act_apply` / `bin_apply` switches from them
//! (spliced into `cu/common.cuh` where it includes `ops.cuh`). An
//! activation with no arm in [`act_cuda`] gets the C of its formula
//! (`Activation::formula`); the checked-in `cu/ops.cuh` (for
//! nvcc builds of the `.cu` files) is kept equal by a test that rewrites it
//! with `RLX_BLESS=1`.

use rlx_ir::op::{Activation, BinaryOp};
use rlx_ir::DType;

/// CUDA C of `act_apply`'s case for `a`: statements over `float x` that
/// return the result.
fn act_cuda(a: Activation) -> std::borrow::Cow<'static, str> {
    match a {
        Activation::Relu => "return x < 0.0f ? 0.0f : x;".into(),
        Activation::Gelu => "return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));".into(),
        Activation::GeluTanh => "{ float u = 0.7978845608028654f * (x + 0.044715f * x * x * x); \
             return 0.5f * x * (1.0f + tanhf(u)); }"
            .into(),
        Activation::Silu => "return x / (1.0f + expf(-x));".into(),
        Activation::Sigmoid => "return 1.0f / (1.0f + expf(-x));".into(),
        Activation::Tanh => "return tanhf(x);".into(),
        Activation::Exp => "return expf(x);".into(),
        Activation::Neg => "return -x;".into(),
        Activation::Sqrt => "return sqrtf(x);".into(),
        Activation::Rsqrt => "return 1.0f / sqrtf(x);".into(),
        Activation::Abs => "return fabsf(x);".into(),
        Activation::Softplus => {
            "{ float m = x > 0.0f ? x : 0.0f; return m + log1pf(expf(-fabsf(x))); }".into()
        }
        Activation::Mish => {
            "{ float m = x > 0.0f ? x : 0.0f; return x * tanhf(m + log1pf(expf(-fabsf(x)))); }"
                .into()
        }
        // No CUDA C of its own: the activation table's formula (every
        // activation without one has an arm above).
        a => match a.formula() {
            Some(f) => format!("return {};", f.cuda()).into(),
            None => "return QNAN;".into(),
        },
    }
}

/// CUDA C of `bin_apply`'s case for `b`: statements over `float a, b` that
/// return the result (Max and Min propagate NaN, as the reference does).
fn bin_cuda(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "return a + b;",
        BinaryOp::Sub => "return a - b;",
        BinaryOp::Mul => "return a * b;",
        BinaryOp::Div => "return a / b;",
        BinaryOp::Max => "return (a != a || b != b) ? QNAN : fmaxf(a, b);",
        BinaryOp::Min => "return (a != a || b != b) ? QNAN : fminf(a, b);",
        BinaryOp::Pow => "return powf(a, b);",
    }
}

/// The code of an activation (`None`: identity, one past the last).
pub(crate) fn act_code(a: Option<Activation>) -> i32 {
    let all = Activation::ALL;
    match a {
        None => all.len() as i32,
        Some(a) => all.iter().position(|&x| x == a).unwrap_or(all.len()) as i32,
    }
}

/// The code of a binary op.
pub(crate) fn bin_code(b: BinaryOp) -> i32 {
    BinaryOp::ALL
        .iter()
        .position(|&x| x == b)
        .unwrap_or(BinaryOp::ALL.len() - 1) as i32
}

/// The code `cast_kernel` takes for a dtype it handles (16-bit floats go
/// through the mixed-precision kernels).
pub(crate) fn dtype_code(d: DType) -> Option<i32> {
    match d {
        DType::F32 => Some(0),
        DType::I32 => Some(1),
        DType::I64 => Some(2),
        DType::U8 => Some(3),
        DType::Bool => Some(4),
        DType::F16 | DType::BF16 => None,
    }
}

/// Upper-case C name of an op for `#define`s (`GeluTanh` -> `GELUTANH`).
fn c_name(debug: String) -> String {
    debug.to_ascii_uppercase()
}

/// The generated `ops.cuh`: `RLX_ACT_*` / `RLX_BIN_*` code macros and the
/// `act_apply` / `bin_apply` switches. Unknown activation codes are the
/// identity; the last binary op is the switch's `default`.
pub(crate) fn ops_cuh() -> String {
    let mut s = String::from(
        "// Generated from rlx-cuda's op-code table (src/opcodes.rs): do not edit.\n\
         // Rewrite with `RLX_BLESS=1 cargo test -p rlx-cuda --lib opcodes`.\n\
         #ifndef RLX_OPS_CUH\n#define RLX_OPS_CUH\n\n",
    );
    for a in Activation::ALL {
        let name = c_name(format!("{a:?}"));
        s += &format!("#define RLX_ACT_{name} {}\n", act_code(Some(a)));
    }
    s += &format!("#define RLX_ACT_IDENTITY {}\n", act_code(None));
    for b in BinaryOp::ALL {
        let name = c_name(format!("{b:?}"));
        s += &format!("#define RLX_BIN_{name} {}\n", bin_code(b));
    }
    s += "\n__device__ __forceinline__ float act_apply(int kind, float x) {\n    switch (kind) {\n";
    for a in Activation::ALL {
        s += &format!("    case {}: {} // {a:?}\n", act_code(Some(a)), act_cuda(a));
    }
    s += "    default: return x; // identity\n    }\n}\n\n";
    s += "__device__ __forceinline__ float bin_apply(int op, float a, float b) {\n    switch (op) {\n";
    let (last, rest) = BinaryOp::ALL.split_last().expect("binary ops");
    for &b in rest {
        s += &format!("    case {}: {} // {b:?}\n", bin_code(b), bin_cuda(b));
    }
    s += &format!(
        "    default: {} // {last:?} ({})\n    }}\n}}\n\n#endif // RLX_OPS_CUH\n",
        bin_cuda(*last),
        bin_code(*last)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every activation and binary op has a distinct code, identity is
    /// none of them, and the codes are what the kernels were written for.
    #[test]
    fn codes_are_distinct_and_stable() {
        let acts: Vec<i32> = Activation::ALL.iter().map(|&a| act_code(Some(a))).collect();
        let want: Vec<i32> = (0..Activation::ALL.len() as i32).collect();
        assert_eq!(acts, want);
        assert!(!acts.contains(&act_code(None)));
        let bins: Vec<i32> = BinaryOp::ALL.iter().map(|&b| bin_code(b)).collect();
        assert_eq!(bins, (0..BinaryOp::ALL.len() as i32).collect::<Vec<_>>());
        assert_eq!(act_code(Some(Activation::Relu)), 0);
        assert_eq!(bin_code(BinaryOp::Max), 4);
    }

    /// Every code has its own case in the generated switches.
    #[test]
    fn generated_switches_have_every_case() {
        let s = ops_cuh();
        for a in Activation::ALL {
            let case = format!("case {}: {} // {a:?}", act_code(Some(a)), act_cuda(a));
            assert!(s.contains(&case), "no case for {a:?} in\n{s}");
        }
        for b in &BinaryOp::ALL[..BinaryOp::ALL.len() - 1] {
            assert!(s.contains(&format!("case {}: ", bin_code(*b))), "{b:?}");
        }
        assert!(s.contains("default: return powf(a, b); // Pow (6)"));
        assert!(s.contains("#define RLX_BIN_MAX 4\n"));
    }

    /// The checked-in `cu/ops.cuh` (read by nvcc builds of the `.cu` files)
    /// is the generated text; `RLX_BLESS=1` rewrites it.
    #[test]
    fn checked_in_ops_cuh_is_generated() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cu/ops.cuh");
        let want = ops_cuh();
        if std::env::var_os("RLX_BLESS").is_some() {
            std::fs::write(path, &want).expect("write cu/ops.cuh");
            return;
        }
        assert_eq!(
            crate::cu::OPS_CUH,
            want,
            "src/cu/ops.cuh is out of date: run RLX_BLESS=1 cargo test -p rlx-cuda --lib opcodes"
        );
    }
}
