// DequantMatMul kernels on packed GGUF blocks (see the `quant` module). Self-contained:
// compiled by NVRTC as its own module.
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
