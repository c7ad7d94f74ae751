//! Operators and their attributes.
//!
//! Layout conventions shared by every backend:
//! - activations are row-major; "rank 3" attention tensors are `[B, S, H*D]`;
//! - `MatMul` is `[.., M, K] x [.., K, N] -> [.., M, N]` with broadcast batch dims;
//! - packed quantized weights for `DequantMatMul` are `U8 [N, row_bytes]`, one
//!   GGUF row (K elements) per output feature.
//!
//! Numeric semantics every backend and the reference interpreter follow:
//! - `LayerNorm`: `(x - mean) / sqrt(var + eps) * gamma + beta`, biased variance.
//! - `RmsNorm`: `x / sqrt(mean(x^2) + eps) * gamma`.
//! - `Attention`: `s = (q . k) * scale` (scale defaults to `1/sqrt(head_dim)`),
//!   then softcap `c * tanh(s / c)` if set, then the mask, then softmax over keys.
//!   Query head `h` reads kv head `h / (Hq / Hkv)`. A query row whose keys are
//!   all masked outputs zeros. With `Bias`, masked means `-inf` in the bias.
//! - `Rope`: for pair index `i < n_rot/2`, angle `pos * theta^(-2i/n_rot)`
//!   (divided by `f[i]` when a third input `f`, f32 `[n_rot/2]`, is given:
//!   Llama 3's rope scaling, llama.cpp's `rope_freqs`);
//!   NeoX rotates `(x[i], x[i + n_rot/2])`, GPT-J rotates `(x[2i], x[2i+1])`;
//!   `(a, b) -> (a cos - b sin, a sin + b cos)`. Dims `n_rot..head_dim` pass through.
//! - `Cast`: float to integer truncates toward zero and saturates (Rust `as`);
//!   anything to `Bool` is `x != 0`.
//! - `Max`/`Min` propagate NaN. `Softmax` subtracts the row max first.
//! - `DequantMatMul`: `y = Σ_k x̂_k ŵ_k`, where `ŵ` is the weight row
//!   dequantized as ggml does. With [`ActivationPrecision::F32`], `x̂ = x`.
//!   With [`ActivationPrecision::Int8`] (llama.cpp's activation rounding),
//!   each row of x is cut into blocks of 32 along K and, per block, in f32:
//!   `amax = max |x_i|`, `d = amax / 127`, `q_i = round_half_even(x_i * (1 / d))`,
//!   an integer in `-127..=127`, and `x̂_i = d * q_i` (exact). When `d` is
//!   below the smallest normal f32 (zero included) every `x̂_i` of the block
//!   is 0; a block holding a NaN or an infinity gives NaN for every `x̂_i`.

use crate::formula::Formula::{self, *};
use crate::{DType, Tensor};

/// Defines [`Activation`], [`Activation::ALL`] and [`Activation::formula`]
/// from one table: a new activation is one entry here. Backends with no
/// hand-written kernel for it derive theirs from the formula (the reference
/// interpreter in f64, the CPU in f32, CUDA from [`Formula::cuda`]), and the
/// conformance suite takes its cases from `ALL`.
macro_rules! activations {
    ($($(#[$doc:meta])* $name:ident = $formula:expr;)*) => {
        /// Elementwise unary functions.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Activation {
            $($(#[$doc])* $name,)*
        }

        impl Activation {
            /// Every activation, for tests and property generators; an
            /// activation's op code is its position here.
            pub const ALL: [Activation; <[&str]>::len(&[$(stringify!($name)),*])] =
                [$(Activation::$name),*];

            /// Its definition as a scalar formula (`None`: it needs a
            /// function formulas lack, and every backend implements it by
            /// hand).
            pub fn formula(self) -> Option<Formula> {
                match self {
                    $(Activation::$name => $formula,)*
                }
            }
        }
    };
}

activations! {
    /// max(x, 0).
    Relu = Some(Max(&X, &C(0.0)));
    /// Exact GELU: x * Φ(x), with the error function.
    Gelu = None;
    /// GELU with the tanh approximation.
    GeluTanh = Some(Mul(
        &Mul(&C(0.5), &X),
        &Add(&C(1.0), &Tanh(&Mul(&C(0.7978845608028654), &Add(&X, &Mul(&C(0.044715), &Mul(&X, &Mul(&X, &X))))))),
    ));
    /// x * sigmoid(x).
    Silu = Some(Div(&X, &Add(&C(1.0), &Exp(&Neg(&X)))));
    /// 1 / (1 + e^-x).
    Sigmoid = Some(Div(&C(1.0), &Add(&C(1.0), &Exp(&Neg(&X)))));
    /// tanh(x).
    Tanh = Some(Tanh(&X));
    /// e^x.
    Exp = Some(Exp(&X));
    /// -x.
    Neg = Some(Neg(&X));
    /// sqrt(x).
    Sqrt = Some(Sqrt(&X));
    /// 1 / sqrt(x).
    Rsqrt = Some(Div(&C(1.0), &Sqrt(&X)));
    /// |x|.
    Abs = Some(Abs(&X));
    /// ln(1 + e^x), as max(x, 0) + ln(1 + e^-|x|).
    Softplus = Some(SOFTPLUS);
    /// x * tanh(softplus(x)).
    Mish = Some(Mul(&X, &Tanh(&SOFTPLUS)));
    /// x / (1 + |x|).
    Softsign = Some(Div(&X, &Add(&C(1.0), &Abs(&X))));
}

/// ln(1 + e^x) without overflow.
const SOFTPLUS: Formula = Add(&Max(&X, &C(0.0)), &Log1p(&Exp(&Neg(&Abs(&X)))));

/// Elementwise binary functions with numpy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b.
    Add,
    /// a - b.
    Sub,
    /// a * b.
    Mul,
    /// a / b.
    Div,
    /// max(a, b), NaN-propagating.
    Max,
    /// min(a, b), NaN-propagating.
    Min,
    /// a ^ b.
    Pow,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ];
}

/// Masking applied by `Op::Attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// Every query sees every key.
    None,
    /// Query i sees key j when j <= i + (S_k - S_q).
    Causal,
    /// Causal, and additionally only the last `w` keys (j > i + (S_k - S_q) - w).
    SlidingWindow(usize),
    /// A fourth input `[B, S_k]` keep-mask (f32 or u8/bool): non-zero = keep.
    Custom,
    /// A fourth input f32 additive bias, broadcastable to `[B, H, S_q, S_k]`.
    Bias,
}

/// Rotary embedding pairing style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// GPT-NeoX: rotate pairs (i, i + n_rot/2).
    NeoX,
    /// GPT-J / original Llama GGUF layout: rotate adjacent pairs (2i, 2i+1).
    GptJ,
}

/// Reduction functions for `Op::Reduce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Arithmetic mean.
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// GGUF block-quantization schemes understood by `Op::DequantMatMul`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// 32 x 4-bit, one f16 scale.
    Q4_0,
    /// 32 x 4-bit, f16 scale and min.
    Q4_1,
    /// 32 x 5-bit, one f16 scale.
    Q5_0,
    /// 32 x 5-bit, f16 scale and min.
    Q5_1,
    /// 32 x 8-bit, one f16 scale.
    Q8_0,
    /// 256-element super-block, 2-bit.
    Q2K,
    /// 256-element super-block, 3-bit.
    Q3K,
    /// 256-element super-block, 4-bit.
    Q4K,
    /// 256-element super-block, 5-bit.
    Q5K,
    /// 256-element super-block, 6-bit.
    Q6K,
    /// 256-element super-block, 8-bit with f32 scale.
    Q8K,
}

impl QuantScheme {
    /// Every scheme.
    pub const ALL: [QuantScheme; 11] = [
        QuantScheme::Q4_0,
        QuantScheme::Q4_1,
        QuantScheme::Q5_0,
        QuantScheme::Q5_1,
        QuantScheme::Q8_0,
        QuantScheme::Q2K,
        QuantScheme::Q3K,
        QuantScheme::Q4K,
        QuantScheme::Q5K,
        QuantScheme::Q6K,
        QuantScheme::Q8K,
    ];

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            QuantScheme::Q4_0
            | QuantScheme::Q4_1
            | QuantScheme::Q5_0
            | QuantScheme::Q5_1
            | QuantScheme::Q8_0 => 32,
            _ => 256,
        }
    }

    /// Bytes per block, as laid out in GGUF.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantScheme::Q4_0 => 18,
            QuantScheme::Q4_1 => 20,
            QuantScheme::Q5_0 => 22,
            QuantScheme::Q5_1 => 24,
            QuantScheme::Q8_0 => 34,
            QuantScheme::Q2K => 84,
            QuantScheme::Q3K => 110,
            QuantScheme::Q4K => 144,
            QuantScheme::Q5K => 176,
            QuantScheme::Q6K => 210,
            QuantScheme::Q8K => 292,
        }
    }

    /// Bytes of one packed row of `k` elements, or `None` if `k` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        k.is_multiple_of(self.block_elems())
            .then(|| k / self.block_elems() * self.block_bytes())
    }

    /// GGUF / ggml name (e.g. `Q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::Q4_0 => "Q4_0",
            QuantScheme::Q4_1 => "Q4_1",
            QuantScheme::Q5_0 => "Q5_0",
            QuantScheme::Q5_1 => "Q5_1",
            QuantScheme::Q8_0 => "Q8_0",
            QuantScheme::Q2K => "Q2_K",
            QuantScheme::Q3K => "Q3_K",
            QuantScheme::Q4K => "Q4_K",
            QuantScheme::Q5K => "Q5_K",
            QuantScheme::Q6K => "Q6_K",
            QuantScheme::Q8K => "Q8_K",
        }
    }
}

/// The precision of the activations a `DequantMatMul` multiplies (see the
/// module docs for the exact rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActivationPrecision {
    /// f32 activations: only f32 rounding separates the result from the
    /// exact product with the dequantized weights.
    #[default]
    F32,
    /// Activations rounded to 8-bit blocks of 32 with an f32 scale each
    /// (llama.cpp's `q8_0`/`q8_1` activations): faster integer dot
    /// products, about 2-3 significant digits per activation.
    Int8,
}

impl ActivationPrecision {
    /// Lower-case name (`f32`, `int8`), as printed by plans and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            ActivationPrecision::F32 => "f32",
            ActivationPrecision::Int8 => "int8",
        }
    }
}

/// A graph operator. Input arity and layouts are documented per variant;
/// shape rules live in [`crate::infer`].
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A runtime input supplied to `run`.
    Input {
        /// Name used to bind the input.
        name: String,
    },
    /// A weight supplied once with `set_param`.
    Param {
        /// Name used to bind the weight.
        name: String,
    },
    /// A constant baked into the graph.
    Constant {
        /// The value; its shape equals the node's shape.
        value: Tensor,
    },
    /// `[.., M, K] x [.., K, N] -> [.., M, N]`, batch dims broadcast.
    MatMul,
    /// `act(a x b + bias)`; inputs a, b, bias `[N]`.
    FusedMatMulBiasAct {
        /// Activation applied after the bias; `None` is identity.
        activation: Option<Activation>,
    },
    /// Elementwise unary function.
    Activation(Activation),
    /// Elementwise binary function with broadcasting.
    Binary(BinaryOp),
    /// Layer normalization over the last axis; inputs x, gamma, beta.
    LayerNorm {
        /// Normalized axis; must be the last (-1 or rank-1).
        axis: i32,
        /// Variance epsilon.
        eps: f32,
    },
    /// RMS normalization over the last axis; inputs x, gamma.
    RmsNorm {
        /// Normalized axis; must be the last (-1 or rank-1).
        axis: i32,
        /// Epsilon added to the mean square.
        eps: f32,
    },
    /// `LayerNorm(x + residual [+ bias])`; inputs x, residual, bias `[D]`
    /// (only with `has_bias`), gamma, beta.
    FusedResidualLN {
        /// Whether a bias `[D]` input follows the residual.
        has_bias: bool,
        /// Variance epsilon.
        eps: f32,
    },
    /// `RmsNorm(x + residual [+ bias])`; inputs x, residual, bias `[D]`
    /// (only with `has_bias`), gamma.
    FusedResidualRmsNorm {
        /// Whether a bias `[D]` input follows the residual.
        has_bias: bool,
        /// Epsilon added to the mean square.
        eps: f32,
    },
    /// Reinterpret the same elements with new dims (a view).
    Reshape {
        /// Target dims; the element count must match.
        shape: Vec<usize>,
    },
    /// Broadcast to larger dims (numpy rules).
    Expand {
        /// Target dims.
        shape: Vec<usize>,
    },
    /// Convert the element type.
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// Row lookup: inputs table `[V, ..]` and integer ids of any shape;
    /// output `[ids.., table.dims[1..]]`. Only `axis == 0` is defined.
    Gather {
        /// Axis of the table that ids index; 0.
        axis: usize,
    },
    /// A contiguous slice along one axis.
    Narrow {
        /// Sliced axis.
        axis: usize,
        /// First index.
        start: usize,
        /// Number of indices kept.
        len: usize,
    },
    /// `silu(gate) * up`. With `packed`, one input `[.., 2N]` whose first half
    /// is the gate; otherwise two inputs gate, up of the same shape.
    FusedSwiGLU {
        /// Whether gate and up arrive packed in one tensor.
        packed: bool,
    },
    /// Concatenation along one axis; two or more inputs.
    Concat {
        /// Concatenation axis.
        axis: usize,
    },
    /// Rotary position embedding. Inputs: x `[B, S, H*head_dim]`, integer
    /// positions `[S]` or `[B, S]`, and optionally per-pair frequency
    /// divisors f32 `[n_rot/2]` (pair `i`'s angle is divided by `f[i]`).
    /// Only the first `n_rot` dims of each head rotate.
    Rope {
        /// Dims per head.
        head_dim: usize,
        /// Rotated dims per head (even, <= head_dim).
        n_rot: usize,
        /// Frequency base θ.
        theta: f32,
        /// Pairing style.
        style: RopeStyle,
    },
    /// Scaled dot-product attention. Inputs q `[B, S_q, Hq*D]`, k and v
    /// `[B, S_k, Hkv*D]` with `Hq % Hkv == 0` (GQA), and a mask input for
    /// `Custom` and `Bias`. Output `[B, S_q, Hq*D]`.
    Attention {
        /// Query heads.
        num_heads: usize,
        /// Dims per head.
        head_dim: usize,
        /// Mask applied to scores.
        mask_kind: MaskKind,
        /// Score multiplier; default 1/sqrt(head_dim).
        score_scale: Option<f32>,
        /// If set, scores become `c * tanh(s / c)` before masking.
        attn_logit_softcap: Option<f32>,
    },
    /// Gated delta-rule linear attention. Inputs q, k, v `[B, S, H, n]`,
    /// g (log decay) and beta `[B, S, H]`, and with `carry_state` an initial
    /// state `[B, H, n, n]`.
    ///
    /// Without `carry_state` the output is o `[B, S, H, n]`. With it, the one
    /// output is `[B, S + n, H, n]`: rows `0..S` along axis 1 are o, and rows
    /// `S..S+n` hold the final state, `out[b, S+i, h, j] = state[b, h, i, j]`.
    /// Consumers take o and the state apart with `Narrow` on axis 1, so the
    /// IR keeps one output per node.
    GatedDeltaNet {
        /// Per-head state width n.
        state_size: usize,
        /// Whether an initial state is an input and the final state an output.
        carry_state: bool,
    },
    /// Multi-layer LSTM in PyTorch layout (gate order i, f, g, o).
    Lstm {
        /// Hidden width H.
        hidden_size: usize,
        /// Stacked layers.
        num_layers: usize,
        /// Whether each layer runs both directions.
        bidirectional: bool,
        /// Whether h0 and c0 are inputs.
        carry: bool,
    },
    /// `x [.., K] x W^T -> [.., N]` with W packed as `U8 [N, row_bytes]`.
    DequantMatMul {
        /// Block format of W.
        scheme: QuantScheme,
        /// How x is rounded before the product (`F32`: not at all).
        activations: ActivationPrecision,
    },
    /// Write rows into a persistent cache (a KV cache). Inputs: the cache
    /// (a Param, f32 `[B, ctx, D]`), new rows f32 `[B, n, D]`, and the start
    /// position, integer `[1]`. The output is the cache with rows
    /// `pos..pos+n` along `axis` replaced. Backends execute it in place on
    /// the param's storage, so the update persists across runs and costs
    /// O(n); readers of the cache must read this node's output, never the
    /// param directly, to be ordered after the write.
    CacheWrite {
        /// The sequence axis; 1.
        axis: usize,
    },
    /// Softmax along one axis.
    Softmax {
        /// Normalized axis.
        axis: usize,
    },
    /// Axis permutation.
    Transpose {
        /// `out.dims[i] = in.dims[perm[i]]`.
        perm: Vec<usize>,
    },
    /// Reduction over axes.
    Reduce {
        /// Reduction function.
        op: ReduceOp,
        /// Reduced axes, ascending.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keep_dims: bool,
    },
}

impl Op {
    /// Short op name, as used by dumps, stats and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "Input",
            Op::Param { .. } => "Param",
            Op::Constant { .. } => "Constant",
            Op::MatMul => "MatMul",
            Op::FusedMatMulBiasAct { .. } => "FusedMatMulBiasAct",
            Op::Activation(_) => "Activation",
            Op::Binary(_) => "Binary",
            Op::LayerNorm { .. } => "LayerNorm",
            Op::RmsNorm { .. } => "RmsNorm",
            Op::FusedResidualLN { .. } => "FusedResidualLN",
            Op::FusedResidualRmsNorm { .. } => "FusedResidualRmsNorm",
            Op::Reshape { .. } => "Reshape",
            Op::Expand { .. } => "Expand",
            Op::Cast { .. } => "Cast",
            Op::Gather { .. } => "Gather",
            Op::Narrow { .. } => "Narrow",
            Op::FusedSwiGLU { .. } => "FusedSwiGLU",
            Op::Concat { .. } => "Concat",
            Op::Rope { .. } => "Rope",
            Op::Attention { .. } => "Attention",
            Op::GatedDeltaNet { .. } => "GatedDeltaNet",
            Op::Lstm { .. } => "Lstm",
            Op::DequantMatMul { .. } => "DequantMatMul",
            Op::CacheWrite { .. } => "CacheWrite",
            Op::Softmax { .. } => "Softmax",
            Op::Transpose { .. } => "Transpose",
            Op::Reduce { .. } => "Reduce",
        }
    }

    /// Whether this is a leaf (Input, Param, Constant): it computes nothing.
    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. }
        )
    }

    /// A one-line description with attributes, for dumps.
    pub fn describe(&self) -> String {
        match self {
            Op::Input { name } => format!("Input({name})"),
            Op::Param { name } => format!("Param({name})"),
            Op::Constant { value } => format!("Constant({})", value.shape),
            Op::Activation(a) => format!("Activation({a:?})"),
            Op::Binary(b) => format!("Binary({b:?})"),
            Op::MatMul => "MatMul".into(),
            other => format!("{other:?}"),
        }
    }
}
