//! What lowering produces: [`Launch`]es (kernels, gemms, copies) and
//! their [`Arg`]s, and the helpers that build elementwise launches. The
//! bottom layer of the lowering: it imports nothing from `lower` or
//! `fuse`.

use crate::opcodes::act_code;
use crate::store::Dt;
use rlx_ir::op::Activation;

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    /// A device address (or 0 for null).
    P(u64),
    /// A C `int`.
    I(i32),
    /// A C `long long`.
    L(i64),
    /// A C `float`.
    F(f32),
    /// The address of element `usize` of the metadata buffer.
    Meta(usize),
    /// The address of the status word.
    Status,
}

/// A column-major gemm call (already transformed from row-major).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: u64,
    pub lda: i32,
    pub sa: i64,
    pub b: u64,
    pub ldb: i32,
    pub sb: i64,
    pub c: u64,
    pub ldc: i32,
    pub sc: i64,
    pub batch: i32,
    /// `a` is stored transposed (a weight kept `[out, in]`): op(A) = A^T.
    pub ta: bool,
    /// Storage of `a`, `b` and `c`.
    pub dt: [Dt; 3],
    /// Round matmul inputs to TF32 (precision `tf32`).
    pub tf32: bool,
    /// The epilogue: bias (one value per row of `C`) and activation.
    pub epi: Epi,
    /// Epilogue bias address (0 without one) and its storage.
    pub bias: u64,
    pub bias_dt: Dt,
    /// The exact activation (kernel code) the epilogue stands for, used by
    /// the fallback kernel when cuBLASLt declines the gemm.
    pub act: i32,
}

/// A gemm epilogue that cuBLASLt applies in the matmul kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Epi {
    /// Plain product.
    None,
    /// `+ bias`.
    Bias,
    /// `relu(+ bias)`.
    ReluBias,
    /// `gelu(+ bias)` in cuBLASLt's tanh form.
    GeluBias,
}

/// The kernel that applies `g`'s epilogue in place after a gemm that ran
/// without it (the fallback when cuBLASLt declines), if it has one.
pub(crate) fn epilogue_launch(g: &Gemm) -> Option<Launch> {
    if g.epi == Epi::None {
        return None;
    }
    let n = g.m as usize * g.n as usize * g.batch.max(1) as usize;
    let all_f32 = g.dt[2] == Dt::F32 && g.bias_dt == Dt::F32;
    let mut args = vec![
        Arg::P(g.c),
        Arg::P(g.bias),
        Arg::L(n as i64),
        Arg::I(g.m),
        Arg::I(g.act),
    ];
    if all_f32 {
        return Some(elementwise("bias_act", n, args));
    }
    args.extend([Arg::I(g.dt[2].code()), Arg::I(g.bias_dt.code())]);
    Some(elementwise("bias_act_x", n, args))
}

/// One unit of device work.
#[derive(Debug, Clone)]
pub(crate) enum Launch {
    /// A kernel from the NVRTC module.
    Kernel {
        name: &'static str,
        grid: [u32; 3],
        block: u32,
        /// Bytes of dynamic shared memory.
        smem: u32,
        args: Vec<Arg>,
    },
    /// A cuBLAS sgemm (strided batched).
    Gemm(Gemm),
    /// A device-to-device copy.
    Copy { dst: u64, src: u64, bytes: usize },
    /// Zero `bytes` at `dst`.
    Zero { dst: u64, bytes: usize },
    /// A kernel generated at compile time (a fused elementwise chain),
    /// compiled by NVRTC on first use.
    Dyn {
        name: std::sync::Arc<str>,
        source: std::sync::Arc<str>,
        grid: [u32; 3],
        block: u32,
        args: Vec<Arg>,
    },
}

pub(crate) fn grid1(n: usize) -> [u32; 3] {
    [n.div_ceil(256).clamp(1, 8192) as u32, 1, 1]
}

pub(crate) fn elementwise(name: &'static str, n: usize, args: Vec<Arg>) -> Launch {
    Launch::Kernel {
        name,
        grid: grid1(n),
        block: 256,
        smem: 0,
        args,
    }
}

pub(crate) fn int(x: usize, what: &str) -> Result<i32, String> {
    i32::try_from(x).map_err(|_| format!("{what} = {x} does not fit a 32-bit int"))
}

/// `out = act(x)` elementwise in any storage (in place when `out == x`).
pub(crate) fn activation_launch(
    out: u64,
    x: u64,
    n: usize,
    act: Activation,
    to: Dt,
    tx: Dt,
) -> Launch {
    let mut args = vec![
        Arg::P(out),
        Arg::P(x),
        Arg::L(n as i64),
        Arg::I(act_code(Some(act))),
    ];
    if to == Dt::F32 && tx == Dt::F32 {
        return elementwise("activation", n, args);
    }
    args.extend([Arg::I(to.code()), Arg::I(tx.code())]);
    elementwise("activation_x", n, args)
}
