//! `DequantMatMul` on packed GGUF blocks: `y [M, N] = x [M, K] x W^T` with
//! `W` a `u8 [N, row_bytes]` param, uploaded once in its packed form.
//!
//! - `M == 1` (decode): `dq_gemv_*`, one warp per output feature; each lane
//!   dequantizes 8 weights at a time in registers and dots them with `x`.
//! - `M > 1` (prefill): `dq_gemm_*`, 32 x 64 output tiles; each step
//!   dequantizes one block column (32 weights of 64 rows) into shared
//!   memory. The whole of `W` is never expanded.
//!
//! Schemes: Q4_0, Q4_1 and Q8_0. Weights dequantize exactly as ggml does
//! (`q * d + m` with f16 `d`, `m`); sums are in f32, so results differ
//! from the CPU backend only by rounding order.

use crate::lower::{Arg, Launch};
use rlx_ir::QuantScheme;

/// Names of every kernel in [`SOURCE`].
pub(crate) const KERNELS: &[&str] = &[
    "dq_gemv_q4_0",
    "dq_gemv_q4_1",
    "dq_gemv_q8_0",
    "dq_gemv_q4_0_r4",
    "dq_gemv_q4_1_r4",
    "dq_gemv_q8_0_r4",
    "dq_gemm_q4_0",
    "dq_gemm_q4_1",
    "dq_gemm_q8_0",
];

/// The CUDA C source (its own NVRTC module).
pub(crate) const SOURCE: &str = r#"
// Scheme ids: 0 Q4_0 (18-byte blocks), 1 Q4_1 (20), 2 Q8_0 (34). 32 weights a block.

__device__ __forceinline__ float dq_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Two 2-byte-aligned halves as one word.
__device__ __forceinline__ unsigned int dq_u32_a2(const unsigned char* p) {
    const unsigned short* s = (const unsigned short*)p;
    return (unsigned int)s[0] | ((unsigned int)s[1] << 16);
}

template <int S> struct Scheme;
template <> struct Scheme<0> { static const int BYTES = 18; };
template <> struct Scheme<1> { static const int BYTES = 20; };
template <> struct Scheme<2> { static const int BYTES = 34; };

// Unit t (0..3) of a block: 8 weights and the positions (0..31) they hold.
// Q4_x: bytes 4t..4t+3 of qs: low nibbles are weights 4t..4t+3, high
// nibbles 16+4t..16+4t+3. Q8_0: weights 8t..8t+7.
template <int S>
__device__ __forceinline__ void dq_unit(const unsigned char* blk, int t, float w[8], int k[8]) {
    if (S == 2) {
        float d = dq_h2f(*(const unsigned short*)blk);
        unsigned int q0 = dq_u32_a2(blk + 2 + 8 * t), q1 = dq_u32_a2(blk + 6 + 8 * t);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = (float)(signed char)(q0 >> (8 * i)) * d;
            w[4 + i] = (float)(signed char)(q1 >> (8 * i)) * d;
            k[i] = 8 * t + i;
            k[4 + i] = 8 * t + 4 + i;
        }
    } else {
        float d, m;
        unsigned int q;
        if (S == 1) {
            unsigned int dm = *(const unsigned int*)blk;
            d = dq_h2f((unsigned short)(dm & 0xffffu));
            m = dq_h2f((unsigned short)(dm >> 16));
            q = *(const unsigned int*)(blk + 4 + 4 * t);
        } else {
            d = dq_h2f(*(const unsigned short*)blk);
            m = -8.0f * d;
            q = dq_u32_a2(blk + 2 + 4 * t);
        }
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            float lo = (float)((q >> (8 * i)) & 0xfu), hi = (float)((q >> (8 * i + 4)) & 0xfu);
            w[i] = lo * d + m;
            w[4 + i] = hi * d + m;
            k[i] = 4 * t + i;
            k[4 + i] = 16 + 4 * t + i;
        }
    }
}

// Four activations; `vec`: 16-byte aligned (one vector load).
__device__ __forceinline__ float4 dq_x4(const float* p, bool vec) {
    if (vec) return *(const float4*)p;
    return make_float4(p[0], p[1], p[2], p[3]);
}

// Offsets (in the block) of unit t's two runs of 4 activations: Q8_0 holds
// weights 8t..8t+7, Q4_x weights 4t..4t+3 and 16+4t..16+4t+3.
template <int S> __device__ __forceinline__ int dq_off_a(int t) { return S == 2 ? 8 * t : 4 * t; }
template <int S> __device__ __forceinline__ int dq_off_c(int t) { return S == 2 ? 8 * t + 4 : 16 + 4 * t; }

// The raw words of unit t of a block: the f16 scale (Q4_1: scale and
// minimum) and its 4 (Q8_0: 8) bytes of quants. Loading is split from the
// arithmetic so that a warp issues all its loads before it waits on any.
struct DqRaw { unsigned int h, q0, q1; };

template <int S>
__device__ __forceinline__ DqRaw dq_raw(const unsigned char* blk, int t) {
    DqRaw r;
    if (S == 2) {
        r.h = *(const unsigned short*)blk;
        r.q0 = dq_u32_a2(blk + 2 + 8 * t);
        r.q1 = dq_u32_a2(blk + 6 + 8 * t);
    } else if (S == 1) {
        r.h = *(const unsigned int*)blk;
        r.q0 = *(const unsigned int*)(blk + 4 + 4 * t);
        r.q1 = 0;
    } else {
        r.h = *(const unsigned short*)blk;
        r.q0 = dq_u32_a2(blk + 2 + 4 * t);
        r.q1 = 0;
    }
    return r;
}

// Dot of a unit with its activations (a at dq_off_a, c at dq_off_c).
template <int S>
__device__ __forceinline__ float dq_raw_dot(DqRaw w, float4 a, float4 c) {
    if (S == 2) {
        float d = dq_h2f((unsigned short)w.h);
        unsigned int q0 = w.q0, q1 = w.q1;
        float s = (float)(signed char)(q0) * a.x + (float)(signed char)(q0 >> 8) * a.y
                + (float)(signed char)(q0 >> 16) * a.z + (float)(signed char)(q0 >> 24) * a.w
                + (float)(signed char)(q1) * c.x + (float)(signed char)(q1 >> 8) * c.y
                + (float)(signed char)(q1 >> 16) * c.z + (float)(signed char)(q1 >> 24) * c.w;
        return s * d;
    } else {
        float d, m;
        if (S == 1) {
            d = dq_h2f((unsigned short)(w.h & 0xffffu));
            m = dq_h2f((unsigned short)(w.h >> 16));
        } else {
            d = dq_h2f((unsigned short)w.h);
            m = -8.0f * d;
        }
        unsigned int q = w.q0;
        float sq = (float)(q & 0xfu) * a.x + (float)((q >> 8) & 0xfu) * a.y
                 + (float)((q >> 16) & 0xfu) * a.z + (float)((q >> 24) & 0xfu) * a.w
                 + (float)((q >> 4) & 0xfu) * c.x + (float)((q >> 12) & 0xfu) * c.y
                 + (float)((q >> 20) & 0xfu) * c.z + (float)((q >> 28) & 0xfu) * c.w;
        float sx = (a.x + a.y) + (a.z + a.w) + (c.x + c.y) + (c.z + c.w);
        return d * sq + m * sx;
    }
}

__device__ __forceinline__ float dq_sq4(float4 a) {
    return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
}

// The prologue on four loaded activations: 1 RMS norm (x * scale * gamma,
// the RmsNorm kernel's order), 2 SwiGLU (the swiglu kernel's expression;
// g holds the up values).
__device__ __forceinline__ float4 dq_pro(float4 a, float4 g, int pro, float scale) {
    if (pro == 1) {
        a.x = a.x * scale * g.x; a.y = a.y * scale * g.y;
        a.z = a.z * scale * g.z; a.w = a.w * scale * g.w;
    } else if (pro == 2) {
        a.x = a.x / (1.0f + expf(-a.x)) * g.x; a.y = a.y / (1.0f + expf(-a.y)) * g.y;
        a.z = a.z / (1.0f + expf(-a.z)) * g.z; a.w = a.w / (1.0f + expf(-a.w)) * g.w;
    }
    return a;
}

// y[m, n] = pro(x[m, :]) . W[n, :] (+ add[(m * N + n) % add_n] when add is
// set: a bias or a residual). grid (ceil(N / (4 R)), M), 128 threads: one
// warp per R consecutive outputs, which share each activation load.
// pro: 0 none; 1 RMS norm with gamma [K] and eps; 2 SwiGLU, x rows of 2K
// packed [gate | up]. A decode GEMV is latency-bound, so each lane first
// loads up to U units (weights, activations, gamma or up) into registers,
// then computes: one memory round trip per U units instead of one per
// unit. When a row fits one pass, the RMS comes from the loaded values.
template <int S, int R, int U>
__device__ void dq_gemv(float* y, const float* x, const unsigned char* w, int M, int N, int K,
                        int pro, const float* gamma, float eps, const float* add, long long add_n) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n0 = (blockIdx.x * 4 + warp) * R, m = blockIdx.y;
    if (n0 >= N || m >= M) return;
    int nb = K >> 5, units = nb * 4;
    long long rb = (long long)nb * Scheme<S>::BYTES;
    const float* xm = x + (long long)m * K * (pro == 2 ? 2 : 1);
    // The second operand of the prologue: gamma, or the up half of the row.
    const float* gm = pro == 1 ? gamma : xm + K;
    bool vec = (((unsigned long long)xm) & 15) == 0
            && (pro != 1 || (((unsigned long long)gamma) & 15) == 0);
    bool one_pass = units <= 32 * U;
    float scale = 1.0f;
    if (pro == 1 && !one_pass) {
        float s = 0.0f;
        for (int i = lane; i < K; i += 32) { float v = xm[i]; s += v * v; }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        scale = 1.0f / sqrtf(s / (float)K + eps);
    }
    float acc[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int base = 0; base < units; base += 32 * U) {
        DqRaw wr[U][R];
        float4 xa[U], xc[U], ga[U], gc[U];
        #pragma unroll
        for (int j = 0; j < U; ++j) {
            int u = base + lane + 32 * j;
            if (u < units) {
                int b = u >> 2, t = u & 3;
                int ka = 32 * b + dq_off_a<S>(t), kc = 32 * b + dq_off_c<S>(t);
                #pragma unroll
                for (int r = 0; r < R; ++r)
                    if (R == 1 || n0 + r < N)
                        wr[j][r] = dq_raw<S>(w + (n0 + r) * rb + b * Scheme<S>::BYTES, t);
                xa[j] = dq_x4(xm + ka, vec);
                xc[j] = dq_x4(xm + kc, vec);
                if (pro != 0) {
                    ga[j] = dq_x4(gm + ka, vec);
                    gc[j] = dq_x4(gm + kc, vec);
                } else {
                    ga[j] = gc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
        }
        if (pro == 1 && one_pass) {
            float s = 0.0f;
            #pragma unroll
            for (int j = 0; j < U; ++j)
                if (base + lane + 32 * j < units) s += dq_sq4(xa[j]) + dq_sq4(xc[j]);
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            scale = 1.0f / sqrtf(s / (float)K + eps);
        }
        #pragma unroll
        for (int j = 0; j < U; ++j) {
            if (base + lane + 32 * j < units) {
                float4 a = dq_pro(xa[j], ga[j], pro, scale), c = dq_pro(xc[j], gc[j], pro, scale);
                #pragma unroll
                for (int r = 0; r < R; ++r)
                    if (R == 1 || n0 + r < N) acc[r] += dq_raw_dot<S>(wr[j][r], a, c);
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < R; ++r)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane == 0) {
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            int n = n0 + r;
            if (n >= N) break;
            long long i = (long long)m * N + n;
            y[i] = add ? acc[r] + add[i % add_n] : acc[r];
        }
    }
}

// Tiled: grid (ceil(N / 64), ceil(M / 32)), 256 threads, each 2 rows x 4 columns.
template <int S>
__device__ void dq_gemm(float* y, const float* x, const unsigned char* w, int M, int N, int K) {
    __shared__ float Xs[32][33];
    __shared__ float Ws[32][65];
    int tid = threadIdx.x;
    int m0 = blockIdx.y * 32, n0 = blockIdx.x * 64;
    int r = (tid >> 4) * 2, c = (tid & 15) * 4;
    float acc[2][4];
    #pragma unroll
    for (int i = 0; i < 2; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    int nb = K >> 5;
    long long rb = (long long)nb * Scheme<S>::BYTES;
    int wn = tid >> 2, wt = tid & 3;
    for (int b = 0; b < nb; ++b) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            int idx = tid + 256 * i, row = idx >> 5, kk = idx & 31;
            Xs[kk][row] = (m0 + row < M) ? x[(long long)(m0 + row) * K + 32 * b + kk] : 0.0f;
        }
        float wv[8];
        int wk[8];
        dq_unit<S>(w + (long long)min(n0 + wn, N - 1) * rb + (long long)b * Scheme<S>::BYTES, wt, wv, wk);
        if (n0 + wn >= N) {
            #pragma unroll
            for (int i = 0; i < 8; ++i) wv[i] = 0.0f;
        }
        #pragma unroll
        for (int i = 0; i < 8; ++i) Ws[wk[i]][wn] = wv[i];
        __syncthreads();
        #pragma unroll 8
        for (int kk = 0; kk < 32; ++kk) {
            float a0 = Xs[kk][r], a1 = Xs[kk][r + 1];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                float bv = Ws[kk][c + j];
                acc[0][j] += a0 * bv;
                acc[1][j] += a1 * bv;
            }
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        int m = m0 + r + i;
        if (m >= M) continue;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            int n = n0 + c + j;
            if (n < N) y[(long long)m * N + n] = acc[i][j];
        }
    }
}

extern "C" {
#define DQ(NAME, S, R)                                                                    \
__global__ void NAME(float* y, const float* x, const unsigned char* w, int M, int N, int K, \
                     int pro, const float* gamma, float eps, const float* add,            \
                     long long add_n) {                                                   \
    dq_gemv<S, R, (R == 1 ? 6 : 2)>(y, x, w, M, N, K, pro, gamma, eps, add, add_n);        \
}
DQ(dq_gemv_q4_0, 0, 1)
DQ(dq_gemv_q4_1, 1, 1)
DQ(dq_gemv_q8_0, 2, 1)
DQ(dq_gemv_q4_0_r4, 0, 4)
DQ(dq_gemv_q4_1_r4, 1, 4)
DQ(dq_gemv_q8_0_r4, 2, 4)
} // extern "C"

extern "C" __global__ void __launch_bounds__(256) dq_gemm_q4_0(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<0>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q4_1(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<1>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q8_0(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<2>(y, x, w, M, N, K); }
"#;

/// Kernel names (one output per warp, four per warp, tiled) and the weight
/// alignment their loads need, by scheme.
fn kernels(scheme: QuantScheme) -> Option<(&'static str, &'static str, &'static str, u64)> {
    match scheme {
        QuantScheme::Q4_0 => Some(("dq_gemv_q4_0", "dq_gemv_q4_0_r4", "dq_gemm_q4_0", 2)),
        QuantScheme::Q4_1 => Some(("dq_gemv_q4_1", "dq_gemv_q4_1_r4", "dq_gemm_q4_1", 4)),
        QuantScheme::Q8_0 => Some(("dq_gemv_q8_0", "dq_gemv_q8_0_r4", "dq_gemm_q8_0", 2)),
        _ => None,
    }
}

/// Outputs from which a warp computes four outputs (sharing its activation
/// loads): a vocabulary head, not a layer's projection, which needs the
/// blocks to spread over the SMs.
const WIDE_N: usize = 8192;

/// Rows up to which a fused GEMV runs (one grid row per matrix row).
pub(crate) const FUSED_ROWS_MAX: usize = 8;

/// What a fused GEMV does around the product (a compiled segment's
/// [`crate::fuse_gemv`] fusion): a prologue on the activations and an
/// added operand.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct GemvExtra {
    /// The prologue on `x`.
    pub pro: Prologue,
    /// A tensor added to the product (0: none): element `(m * N + n) %
    /// add_n`, so a bias `[N]` or a residual `[M, N]`.
    pub add: u64,
    /// Elements of `add`.
    pub add_n: usize,
}

/// The prologue of a fused GEMV, applied to activations as they load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) enum Prologue {
    /// `x` as it is.
    #[default]
    None,
    /// RMS norm over each row of `x`, scaled by `gamma [K]`.
    RmsNorm { gamma: u64, eps: f32 },
    /// `silu(gate) * up` of rows `[gate | up]` of `2K` values.
    SwiGlu,
}

impl GemvExtra {
    fn plain(&self) -> bool {
        *self == GemvExtra::default()
    }
}

/// Lower `y [m, n] = x [m, k] x W^T` (`W` packed in `scheme`, `n` rows of
/// `row_bytes`), with `extra` fused around it. `y`, `x`, `w` are device
/// addresses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dequant_matmul(
    scheme: QuantScheme,
    y: u64,
    x: u64,
    w: u64,
    m: usize,
    n: usize,
    k: usize,
    extra: GemvExtra,
) -> Result<Vec<Launch>, String> {
    let (gemv, gemv4, gemm, align) = kernels(scheme).ok_or_else(|| {
        format!(
            "no CUDA kernel for DequantMatMul {} (Q4_0, Q4_1 and Q8_0 have one)",
            scheme.name()
        )
    })?;
    if !k.is_multiple_of(32) {
        return Err(format!("K = {k} is not a whole number of 32-weight blocks"));
    }
    if !w.is_multiple_of(align) {
        return Err(format!(
            "packed weights at {w:#x} are not {align}-byte aligned"
        ));
    }
    if !x.is_multiple_of(4) || !y.is_multiple_of(4) {
        return Err("activations are not 4-byte aligned".into());
    }
    let int = |v: usize, what: &str| {
        i32::try_from(v).map_err(|_| format!("{what} = {v} does not fit a 32-bit int"))
    };
    let (mi, ni, ki) = (int(m, "M")?, int(n, "N")?, int(k, "K")?);
    if m == 0 || n == 0 {
        return Ok(vec![]);
    }
    if !extra.plain() && (m > FUSED_ROWS_MAX || k == 0) {
        return Err(format!(
            "a fused GEMV takes 1..={FUSED_ROWS_MAX} rows and K > 0 (M = {m}, K = {k})"
        ));
    }
    if k == 0 {
        return Ok(vec![Launch::Zero {
            dst: y,
            bytes: m * n * 4,
        }]);
    }
    // Both kernels start with these; the GEMV adds its fused work.
    let mut args = vec![
        Arg::P(y),
        Arg::P(x),
        Arg::P(w),
        Arg::I(mi),
        Arg::I(ni),
        Arg::I(ki),
    ];
    if m == 1 || !extra.plain() {
        let (pro, gamma, eps) = match extra.pro {
            Prologue::None => (0, 0, 0.0),
            Prologue::RmsNorm { gamma, eps } => (1, gamma, eps),
            Prologue::SwiGlu => (2, 0, 0.0),
        };
        let (name, per_warp) = if n >= WIDE_N { (gemv4, 4) } else { (gemv, 1) };
        args.extend([
            Arg::I(pro),
            Arg::P(gamma),
            Arg::F(eps),
            Arg::P(extra.add),
            Arg::L(extra.add_n.max(1) as i64),
        ]);
        return Ok(vec![Launch::Kernel {
            name,
            grid: [int(n.div_ceil(4 * per_warp), "N / 4")? as u32, m as u32, 1],
            block: 128,
            smem: 0,
            args,
        }]);
    }
    if m.div_ceil(32) > 65535 {
        return Err(format!("M = {m} rows: grid too large"));
    }
    Ok(vec![Launch::Kernel {
        name: gemm,
        grid: [
            int(n.div_ceil(64), "N / 64")? as u32,
            m.div_ceil(32) as u32,
            1,
        ],
        block: 256,
        smem: 0,
        args,
    }])
}

#[cfg(test)]
mod tests {
    use crate::lower::{lower, Launch};
    use rlx_ir::{ActivationPrecision, DType, Graph, MaskKind, NodeId, Op, QuantScheme, Shape};

    fn addr(id: NodeId) -> Option<u64> {
        Some(0x10_0000 * (id.0 as u64 + 1))
    }

    fn kernel_names(g: &Graph, id: NodeId) -> Result<Vec<&'static str>, String> {
        Ok(lower(g, g.node(id), &addr, &mut Vec::new())?
            .iter()
            .map(|l| match l {
                Launch::Kernel { name, .. } => *name,
                _ => "other",
            })
            .collect())
    }

    #[test]
    fn one_row_is_a_gemv_and_more_rows_a_tiled_kernel() {
        for (rows, want) in [(1, "dq_gemv_q4_1"), (7, "dq_gemm_q4_1")] {
            let mut g = Graph::new("dq");
            let x = g.input("x", Shape::f32(&[1, rows, 64]));
            let w = g.param("w", Shape::new(&[10, 40], DType::U8));
            let op = Op::DequantMatMul {
                scheme: QuantScheme::Q4_1,
                activations: ActivationPrecision::F32,
            };
            let y = g.push(op, vec![x, w]).unwrap();
            assert_eq!(kernel_names(&g, y).unwrap(), vec![want]);
        }
    }

    #[test]
    fn unsupported_schemes_and_int8_activations_are_reported() {
        let mut g = Graph::new("dq");
        let x = g.input("x", Shape::f32(&[1, 256]));
        let w = g.param("w", Shape::new(&[4, 210], DType::U8));
        let op = Op::DequantMatMul {
            scheme: QuantScheme::Q6K,
            activations: ActivationPrecision::F32,
        };
        let y = g.push(op, vec![x, w]).unwrap();
        let e = kernel_names(&g, y).unwrap_err();
        assert!(e.contains("no CUDA kernel") && e.contains("Q6_K"), "{e}");
        let w8 = g.param("w8", Shape::new(&[4, 272], DType::U8));
        let op = Op::DequantMatMul {
            scheme: QuantScheme::Q8_0,
            activations: ActivationPrecision::Int8,
        };
        let y = g.push(op, vec![x, w8]).unwrap();
        let e = kernel_names(&g, y).unwrap_err();
        assert!(e.contains("int8"), "{e}");
    }

    #[test]
    fn cache_writes_need_a_param_and_decode_attention_reads_rows() {
        let mut g = Graph::new("kv");
        let cache = g.param("cache", Shape::f32(&[1, 8, 4]));
        let not_param = g.input("c", Shape::f32(&[1, 8, 4]));
        let rows = g.input("rows", Shape::f32(&[1, 1, 4]));
        let pos = g.input("pos", Shape::new(&[1], DType::I64));
        let ok = g
            .push(Op::CacheWrite { axis: 1 }, vec![cache, rows, pos])
            .unwrap();
        // Distinct addresses: the update, then a copy to the output.
        assert_eq!(kernel_names(&g, ok).unwrap(), vec!["cache_write", "other"]);
        let bad = g
            .push(Op::CacheWrite { axis: 1 }, vec![not_param, rows, pos])
            .unwrap();
        assert!(kernel_names(&g, bad).unwrap_err().contains("Param"));
        let q = g.input("q", Shape::f32(&[1, 1, 8]));
        let keep = g.input("keep", Shape::f32(&[1, 8]));
        let op = Op::Attention {
            num_heads: 2,
            head_dim: 4,
            mask_kind: MaskKind::Custom,
            score_scale: None,
            attn_logit_softcap: None,
        };
        let a = g.push(op, vec![q, ok, ok, keep]).unwrap();
        assert_eq!(kernel_names(&g, a).unwrap(), vec!["attention_rows"]);
    }
}
