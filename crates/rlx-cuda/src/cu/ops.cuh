// Generated from rlx-cuda's op-code table (src/opcodes.rs): do not edit.
// Rewrite with `RLX_BLESS=1 cargo test -p rlx-cuda --lib opcodes`.
#ifndef RLX_OPS_CUH
#define RLX_OPS_CUH

#define RLX_ACT_RELU 0
#define RLX_ACT_GELU 1
#define RLX_ACT_GELUTANH 2
#define RLX_ACT_SILU 3
#define RLX_ACT_SIGMOID 4
#define RLX_ACT_TANH 5
#define RLX_ACT_EXP 6
#define RLX_ACT_NEG 7
#define RLX_ACT_SQRT 8
#define RLX_ACT_RSQRT 9
#define RLX_ACT_ABS 10
#define RLX_ACT_SOFTPLUS 11
#define RLX_ACT_MISH 12
#define RLX_ACT_SOFTSIGN 13
#define RLX_ACT_IDENTITY 14
#define RLX_BIN_ADD 0
#define RLX_BIN_SUB 1
#define RLX_BIN_MUL 2
#define RLX_BIN_DIV 3
#define RLX_BIN_MAX 4
#define RLX_BIN_MIN 5
#define RLX_BIN_POW 6

__device__ __forceinline__ float act_apply(int kind, float x) {
    switch (kind) {
    case 0: return x < 0.0f ? 0.0f : x; // Relu
    case 1: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); // Gelu
    case 2: { float u = 0.7978845608028654f * (x + 0.044715f * x * x * x); return 0.5f * x * (1.0f + tanhf(u)); } // GeluTanh
    case 3: return x / (1.0f + expf(-x)); // Silu
    case 4: return 1.0f / (1.0f + expf(-x)); // Sigmoid
    case 5: return tanhf(x); // Tanh
    case 6: return expf(x); // Exp
    case 7: return -x; // Neg
    case 8: return sqrtf(x); // Sqrt
    case 9: return 1.0f / sqrtf(x); // Rsqrt
    case 10: return fabsf(x); // Abs
    case 11: { float m = x > 0.0f ? x : 0.0f; return m + log1pf(expf(-fabsf(x))); } // Softplus
    case 12: { float m = x > 0.0f ? x : 0.0f; return x * tanhf(m + log1pf(expf(-fabsf(x)))); } // Mish
    case 13: return (x / (1.0f + fabsf(x))); // Softsign
    default: return x; // identity
    }
}

__device__ __forceinline__ float bin_apply(int op, float a, float b) {
    switch (op) {
    case 0: return a + b; // Add
    case 1: return a - b; // Sub
    case 2: return a * b; // Mul
    case 3: return a / b; // Div
    case 4: return (a != a || b != b) ? QNAN : fmaxf(a, b); // Max
    case 5: return (a != a || b != b) ? QNAN : fminf(a, b); // Min
    default: return powf(a, b); // Pow (6)
    }
}

#endif // RLX_OPS_CUH
