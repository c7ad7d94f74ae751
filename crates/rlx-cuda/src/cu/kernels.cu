// f32 kernels of the CUDA backend (the `kernels` module lists their names).
// Compiled by NVRTC at run time (rlx-cuda's `cu` module), which expands the include of
// common.cuh itself, so the file also builds with nvcc as is.
#include "common.cuh"

#define MAXR 8

template <int DPL>
__device__ __forceinline__ void attention_body(
    const float* q, const float* k, const float* v, float* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3) {
    __shared__ float Ks[32][32 * DPL + 1];
    __shared__ float Vs[32][32 * DPL];
    __shared__ float Qs[4][2][32 * DPL];
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qbase = blockIdx.x * 8;
    for (int r = 0; r < 2; ++r) {
        int i = qbase + warp * 2 + r;
        for (int d = lane; d < D; d += 32)
            Qs[warp][r][d] = i < Sq ? q[((long long)b * Sq + i) * qs + h * D + d] : 0.0f;
    }
    float m[2], l[2], acc[2][DPL];
    for (int r = 0; r < 2; ++r) {
        m[r] = NEG_INF; l[r] = 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) acc[r][c] = 0.0f;
    }
    int off = Sk - Sq;
    int kend = Sk, kbeg = 0;
    if (mkind == 1 || mkind == 2) {
        int last = qbase + 7 < Sq - 1 ? qbase + 7 : Sq - 1;
        kend = min(Sk, last + off + 1);
        if (kend < 0) kend = 0;
    }
    if (mkind == 2) {
        kbeg = qbase + off - window + 1;
        if (kbeg < 0) kbeg = 0;
    }
    for (int t0 = kbeg; t0 < kend; t0 += 32) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < 32 * 32 * DPL; idx += blockDim.x) {
            int j = idx / (32 * DPL), d = idx - j * (32 * DPL), key = t0 + j;
            bool ok = key < Sk && d < D;
            if (d < D) Ks[j][d] = ok ? k[((long long)b * Sk + key) * ks + hk * D + d] : 0.0f;
            Vs[j][d] = ok ? v[((long long)b * Sk + key) * vs + hk * D + d] : 0.0f;
        }
        __syncthreads();
        int key = t0 + lane;
        for (int r = 0; r < 2; ++r) {
            int i = qbase + warp * 2 + r;
            if (i >= Sq) continue;
            bool vis = key < kend;
            if (mkind == 1) vis = vis && key <= i + off;
            if (mkind == 2) vis = vis && key <= i + off && key > i + off - window;
            float s = NEG_INF;
            if (vis) {
                float dot = 0.0f;
                for (int d = 0; d < D; ++d) dot += Qs[warp][r][d] * Ks[lane][d];
                s = dot * scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                if (mkind == 3 && ((const float*)mask)[(long long)b * Sk + key] == 0.0f) s = NEG_INF;
                if (mkind == 4 && ((const unsigned char*)mask)[(long long)b * Sk + key] == 0) s = NEG_INF;
                if (mkind == 5) s += ((const float*)mask)[(long long)b * b0 + (long long)h * b1 + (long long)i * b2 + (long long)key * b3];
            }
            float mnew = fmaxf(m[r], warp_max(s));
            if (mnew == NEG_INF) continue;
            float p = (s == NEG_INF) ? 0.0f : expf(s - mnew);
            float corr = (m[r] == NEG_INF) ? 0.0f : expf(m[r] - mnew);
            l[r] = l[r] * corr + warp_sum(p);
            #pragma unroll
            for (int c = 0; c < DPL; ++c) acc[r][c] *= corr;
            #pragma unroll 8
            for (int j = 0; j < 32; ++j) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                #pragma unroll
                for (int c = 0; c < DPL; ++c) acc[r][c] += pj * Vs[j][lane + 32 * c];
            }
            m[r] = mnew;
        }
    }
    for (int r = 0; r < 2; ++r) {
        int i = qbase + warp * 2 + r;
        if (i >= Sq) continue;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) {
            int d = lane + 32 * c;
            if (d < D) out[((long long)b * Sq + i) * os + h * D + d] = acc[r][c] * inv;
        }
    }
}


// The body of attention_d256: head_dim <= 256, for which 32 keys of K and V
// (attention_body's tiles) would not fit the 48 KB of static shared memory
// (73.9 KB). Keys in tiles of 16, each key's score taking two lanes (lane
// l: key l & 15, the float4 chunks 2t + (l >> 4) of its row), summed with
// one shuffle. K rows are unpadded, their chunks stored XOR-swizzled by
// (key & 7), so each quarter warp's 16-byte reads hit distinct bank groups;
// Q and K rows past D are zeros. Shared memory: 16 x 256 (K) + 16 x 256
// (V) + 4 x 2 x 256 (Q) floats = 40 KB. ptxas (CUDA 13, sm_90): 96
// registers, no local memory (with the row loop and the 16-key P.V loop
// unrolled; not unrolling either put acc or spills on a stack frame).
__device__ __forceinline__ void attention_wide_body(
    const float* q, const float* k, const float* v, float* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3) {
    constexpr int W = 256, TK = 16, DPL = 8;
    __shared__ __align__(16) float Ks[TK][W];
    __shared__ __align__(16) float Vs[TK][W];
    __shared__ __align__(16) float Qs[4][2][W];
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qbase = blockIdx.x * 8;
    for (int r = 0; r < 2; ++r) {
        int i = qbase + warp * 2 + r;
        for (int d = lane; d < W; d += 32)
            Qs[warp][r][d] = (i < Sq && d < D) ? q[((long long)b * Sq + i) * qs + h * D + d] : 0.0f;
    }
    float m[2], l[2], acc[2][DPL];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        m[r] = NEG_INF; l[r] = 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) acc[r][c] = 0.0f;
    }
    int off = Sk - Sq;
    int kend = Sk, kbeg = 0;
    if (mkind == 1 || mkind == 2) {
        int last = qbase + 7 < Sq - 1 ? qbase + 7 : Sq - 1;
        kend = min(Sk, last + off + 1);
        if (kend < 0) kend = 0;
    }
    if (mkind == 2) {
        kbeg = qbase + off - window + 1;
        if (kbeg < 0) kbeg = 0;
    }
    int jl = lane & (TK - 1), hh = lane >> 4, sw = jl & 7;
    for (int t0 = kbeg; t0 < kend; t0 += TK) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < TK * W; idx += blockDim.x) {
            int j = idx / W, d = idx - j * W, key = t0 + j;
            bool ok = key < Sk && d < D;
            long long ko = (long long)b * Sk + key;
            Ks[j][(((d >> 2) ^ (j & 7)) << 2) | (d & 3)] = ok ? k[ko * ks + hk * D + d] : 0.0f;
            Vs[j][d] = ok ? v[ko * vs + hk * D + d] : 0.0f;
        }
        __syncthreads();
        int key = t0 + jl;
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            int i = qbase + warp * 2 + r;
            if (i >= Sq) continue;
            bool vis = key < kend;
            if (mkind == 1) vis = vis && key <= i + off;
            if (mkind == 2) vis = vis && key <= i + off && key > i + off - window;
            // Both lanes of a key shuffle, whether or not it is visible.
            const float4* kr = (const float4*)&Ks[jl][0];
            const float4* qr = (const float4*)&Qs[warp][r][0];
            float dot = 0.0f;
            #pragma unroll 8
            for (int t = 0; t < W / 8; ++t) {
                int c = 2 * t + hh;
                float4 kk = kr[c ^ sw], qq = qr[c];
                dot += qq.x * kk.x + qq.y * kk.y + qq.z * kk.z + qq.w * kk.w;
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 16);
            float s = NEG_INF;
            if (vis) {
                s = dot * scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                if (mkind == 3 && ((const float*)mask)[(long long)b * Sk + key] == 0.0f) s = NEG_INF;
                if (mkind == 4 && ((const unsigned char*)mask)[(long long)b * Sk + key] == 0) s = NEG_INF;
                if (mkind == 5) s += ((const float*)mask)[(long long)b * b0 + (long long)h * b1 + (long long)i * b2 + (long long)key * b3];
            }
            float mnew = fmaxf(m[r], warp_max(s));
            if (mnew == NEG_INF) continue;
            float p = (s == NEG_INF) ? 0.0f : expf(s - mnew);
            float corr = (m[r] == NEG_INF) ? 0.0f : expf(m[r] - mnew);
            // Lanes 16..31 repeat lanes 0..15: each key counts once.
            l[r] = l[r] * corr + warp_sum(lane < TK ? p : 0.0f);
            #pragma unroll
            for (int c = 0; c < DPL; ++c) acc[r][c] *= corr;
            #pragma unroll
            for (int j = 0; j < TK; ++j) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                #pragma unroll
                for (int c = 0; c < DPL; ++c) acc[r][c] += pj * Vs[j][lane + 32 * c];
            }
            m[r] = mnew;
        }
    }
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        int i = qbase + warp * 2 + r;
        if (i >= Sq) continue;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) {
            int d = lane + 32 * c;
            if (d < D) out[((long long)b * Sq + i) * os + h * D + d] = acc[r][c] * inv;
        }
    }
}


extern "C" {

// out[i] = a[i % na] op b[i % nb]: operands that are a suffix of the output.
__global__ void binary_mod(float* out, const float* a, const float* b, long long n,
                           long long na, long long nb, int op) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = bin_apply(op, a[i % na], b[i % nb]);
}

// General numpy broadcasting. meta: rank, dims[rank], sa[rank], sb[rank].
__global__ void binary_bcast(float* out, const float* a, const float* b, long long n,
                             const int* meta, int op) {
    int rank = meta[0];
    const int* dims = meta + 1;
    const int* sa = dims + rank;
    const int* sb = sa + rank;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        long long r = i, ia = 0, ib = 0;
        for (int d = rank - 1; d >= 0; --d) {
            long long c = r % dims[d];
            r /= dims[d];
            ia += c * sa[d];
            ib += c * sb[d];
        }
        out[i] = bin_apply(op, a[ia], b[ib]);
    }
}

__global__ void activation(float* out, const float* x, long long n, int kind) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = act_apply(kind, x[i]);
}

// In place: out[i] = act(out[i] + bias[i % cols]) (bias may be null).
__global__ void bias_act(float* out, const float* bias, long long n, int cols, int kind) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float v = out[i];
        if (bias) v += bias[i % cols];
        out[i] = act_apply(kind, v);
    }
}

// One block per row. v = x + res + bias (res, bias may be null).
// rms == 0: LayerNorm with gamma, beta (beta may be null); rms == 1: RmsNorm.
__global__ void norm_rows(float* out, const float* x, const float* res, const float* bias,
                          const float* gamma, const float* beta, int rows, int d,
                          float eps, int rms) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (long long)row * d;
    const float* rr = res ? res + (long long)row * d : 0;
    float* orow = out + (long long)row * d;
    float s = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = xr[c];
        if (rr) v += rr[c];
        if (bias) v += bias[c];
        s += rms ? v * v : v;
    }
    s = block_sum(s, sh);
    float inv;
    float mean = 0.0f;
    if (rms) {
        inv = 1.0f / sqrtf(s / (float)d + eps);
    } else {
        mean = s / (float)d;
        float q = 0.0f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            float v = xr[c];
            if (rr) v += rr[c];
            if (bias) v += bias[c];
            float t = v - mean;
            q += t * t;
        }
        q = block_sum(q, sh);
        inv = 1.0f / sqrtf(q / (float)d + eps);
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = xr[c];
        if (rr) v += rr[c];
        if (bias) v += bias[c];
        float y = (v - mean) * inv * gamma[c];
        if (!rms && beta) y += beta[c];
        orow[c] = y;
    }
}

// Row lookup of 4-byte elements. ids are i64 (idx64 = 1) or i32.
__global__ void gather4(unsigned int* out, const unsigned int* table, const void* ids,
                        long long n_ids, int row, long long vocab, int idx64,
                        int* status, int node) {
    long long n = n_ids * row;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        long long r = i / row;
        int c = (int)(i - r * row);
        long long id = idx64 ? ((const long long*)ids)[r] : (long long)((const int*)ids)[r];
        if (id < 0 || id >= vocab) {
            atomicCAS(status, 0, node + 1);
            out[i] = 0u;
        } else {
            out[i] = table[id * row + c];
        }
    }
}

// dst[r * dpitch + c] = src[r * spitch + c], 4-byte words.
__global__ void copy_rows4(unsigned int* dst, const unsigned int* src, long long rows,
                           long long cols, long long dpitch, long long spitch) {
    long long n = rows * cols;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        long long r = i / cols, c = i - r * cols;
        dst[r * dpitch + c] = src[r * spitch + c];
    }
}

__global__ void copy_rows1(unsigned char* dst, const unsigned char* src, long long rows,
                           long long cols, long long dpitch, long long spitch) {
    long long n = rows * cols;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        long long r = i / cols, c = i - r * cols;
        dst[r * dpitch + c] = src[r * spitch + c];
    }
}

// out (contiguous, dims) from src with element strides. meta: rank, dims[rank], strides[rank].
#define STRIDED(NAME, T)                                                              \
__global__ void NAME(T* out, const T* src, long long n, const int* meta) {            \
    int rank = meta[0];                                                               \
    const int* dims = meta + 1;                                                       \
    const int* st = dims + rank;                                                      \
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;                   \
    long long stride = (long long)gridDim.x * blockDim.x;                             \
    for (; i < n; i += stride) {                                                      \
        long long r = i, o = 0;                                                       \
        for (int d = rank - 1; d >= 0; --d) {                                         \
            long long c = r % dims[d];                                                \
            r /= dims[d];                                                             \
            o += c * st[d];                                                           \
        }                                                                             \
        out[i] = src[o];                                                              \
    }                                                                                 \
}
STRIDED(strided_copy1, unsigned char)
STRIDED(strided_copy4, unsigned int)
STRIDED(strided_copy8, unsigned long long)

// One thread per output element. meta: nk, kdims[nk], kstrides[nk], nr, rdims[nr], rstrides[nr].
// op: 0 sum, 1 mean, 2 max, 3 min.
__global__ void reduce_f32(float* out, const float* x, long long n_out, const int* meta, int op) {
    int nk = meta[0];
    const int* kd = meta + 1;
    const int* ks = kd + nk;
    int nr = ks[nk];
    const int* rd = ks + nk + 1;
    const int* rs = rd + nr;
    long long cnt = 1;
    for (int d = 0; d < nr; ++d) cnt *= rd[d];
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n_out; i += stride) {
        long long r = i, base = 0;
        for (int d = nk - 1; d >= 0; --d) {
            long long c = r % kd[d];
            r /= kd[d];
            base += c * ks[d];
        }
        float acc = (op == 2) ? NEG_INF : (op == 3 ? -NEG_INF : 0.0f);
        bool nan = false;
        for (long long j = 0; j < cnt; ++j) {
            long long rr = j, o = base;
            for (int d = nr - 1; d >= 0; --d) {
                long long c = rr % rd[d];
                rr /= rd[d];
                o += c * rs[d];
            }
            float v = x[o];
            if (op <= 1) acc += v;
            else {
                if (v != v) nan = true;
                acc = (op == 2) ? fmaxf(acc, v) : fminf(acc, v);
            }
        }
        if (op == 1) acc /= (float)cnt;
        if (nan) acc = QNAN;
        out[i] = acc;
    }
}

// Softmax over the middle axis of [outer, n, inner]; one thread per (outer, inner).
__global__ void softmax_f32(float* out, const float* x, long long outer, long long n, long long inner) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * inner) return;
    long long o = t / inner, in = t - o * inner;
    const float* xs = x + o * n * inner + in;
    float* os = out + o * n * inner + in;
    float m = NEG_INF;
    for (long long j = 0; j < n; ++j) m = fmaxf(m, xs[j * inner]);
    float s = 0.0f;
    for (long long j = 0; j < n; ++j) {
        float e = expf(xs[j * inner] - m);
        os[j * inner] = e;
        s += e;
    }
    float inv = 1.0f / s;
    for (long long j = 0; j < n; ++j) os[j * inner] *= inv;
}

// dtype codes: 0 f32, 1 i32, 2 i64, 3 u8, 4 bool.
__global__ void cast_kernel(void* out, const void* x, long long n, int from, int to) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        double f = 0.0;
        long long iv = 0;
        bool isf = false;
        switch (from) {
        case 0: f = (double)((const float*)x)[i]; isf = true; break;
        case 1: iv = ((const int*)x)[i]; break;
        case 2: iv = ((const long long*)x)[i]; break;
        default: iv = ((const unsigned char*)x)[i]; break;
        }
        switch (to) {
        case 0: ((float*)out)[i] = isf ? (float)f : (float)iv; break;
        case 1:
            if (isf) {
                int r = (f != f) ? 0 : (f >= 2147483647.0 ? 2147483647 : (f <= -2147483648.0 ? (-2147483647 - 1) : (int)f));
                ((int*)out)[i] = r;
            } else ((int*)out)[i] = (int)iv;
            break;
        case 2:
            if (isf) {
                long long r = (f != f) ? 0 : (f >= 9.2233720368547758e18 ? 9223372036854775807LL : (f <= -9.2233720368547758e18 ? (-9223372036854775807LL - 1) : (long long)f));
                ((long long*)out)[i] = r;
            } else ((long long*)out)[i] = iv;
            break;
        case 3:
            if (isf) {
                ((unsigned char*)out)[i] = (f != f) ? 0 : (f >= 255.0 ? 255 : (f <= 0.0 ? 0 : (unsigned char)f));
            } else ((unsigned char*)out)[i] = (unsigned char)iv;
            break;
        default:
            ((unsigned char*)out)[i] = isf ? (f != 0.0) : (iv != 0);
            break;
        }
    }
}

// silu(gate) * up. packed: x is [rows, 2 * cols] with the gate first.
__global__ void swiglu(float* out, const float* g, const float* u, long long rows, long long cols, int packed) {
    long long n = rows * cols;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float a, b;
        if (packed) {
            long long r = i / cols, c = i - r * cols;
            a = g[r * 2 * cols + c];
            b = g[r * 2 * cols + cols + c];
        } else {
            a = g[i];
            b = u[i];
        }
        out[i] = a / (1.0f + expf(-a)) * b;
    }
}

// x [B, S, H*hd]; pos [S] (pos_b = 0) or [B, S]; div: null, or [n_rot / 2]
// divisors of each pair's angle (Llama 3 rope scaling). One thread per
// (row, head, dim).
__global__ void rope_f32(float* out, const float* x, const void* pos, const float* div,
                         int batch, int seq, int heads,
                         int hd, int n_rot, float theta, int gptj, int pos64, int pos_b) {
    long long n = (long long)batch * seq * heads * hd;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    int half = n_rot / 2;
    for (; i < n; i += stride) {
        int d = (int)(i % hd);
        long long row = i / ((long long)heads * hd);
        if (d >= n_rot) { out[i] = x[i]; continue; }
        int b = (int)(row / seq), s = (int)(row % seq);
        long long pi = pos_b ? (long long)b * seq + s : s;
        double p = pos64 ? (double)((const long long*)pos)[pi] : (double)((const int*)pos)[pi];
        long long base = i - d;
        int pair, first;
        if (gptj) { pair = d / 2; first = (d % 2 == 0); }
        else { pair = d < half ? d : d - half; first = d < half; }
        double ang = p * pow((double)theta, -2.0 * (double)pair / (double)n_rot);
        if (div) ang /= (double)div[pair];
        float cs = (float)cos(ang), sn = (float)sin(ang);
        float a, bb;
        if (gptj) { a = x[base + 2 * pair]; bb = x[base + 2 * pair + 1]; }
        else { a = x[base + pair]; bb = x[base + pair + half]; }
        out[i] = first ? (a * cs - bb * sn) : (a * sn + bb * cs);
    }
}

// Fused attention with online softmax. grid (ceil(Sq / 8), Hq, B), 128 threads:
// 4 warps x 2 query rows; keys in tiles of 32 (one per lane). head_dim <= 32 * DPL <= 128.
// mkind: 0 none, 1 causal, 2 sliding window, 3 keep-mask f32, 4 keep-mask u8, 5 bias.
#define ATTN_KERNEL(NAME, DPL)                                                           \
__global__ void __launch_bounds__(128) NAME(                                            \
    const float* q, const float* k, const float* v, float* out,                         \
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,             \
    float scale, float softcap, int mkind, int window, const void* mask,                \
    int b0, int b1, int b2, int b3) {                                                   \
    attention_body<DPL>(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, D, scale,        \
                        softcap, mkind, window, mask, b0, b1, b2, b3);                  \
}
ATTN_KERNEL(attention_d32, 1)
ATTN_KERNEL(attention_d64, 2)
ATTN_KERNEL(attention_d128, 4)

// head_dim <= 256: as above, keys in tiles of 16 (see attention_wide_body).
__global__ void __launch_bounds__(128) attention_d256(
    const float* q, const float* k, const float* v, float* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3) {
    attention_wide_body(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, D, scale, softcap,
                        mkind, window, mask, b0, b1, b2, b3);
}

} // extern "C"
