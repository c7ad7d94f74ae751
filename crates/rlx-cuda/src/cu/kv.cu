// KV-cache kernels: CacheWrite, one-row Rope, few-row attention (see the `kv` module).
// Self-contained: compiled by NVRTC as its own module.
#define KV_NEG_INF (__int_as_float(0xff800000))
#define KV_TILE 256

__device__ __forceinline__ float kv_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kv_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Over a block of 256 threads; `red` holds 8 floats. Ends with a barrier.
__device__ __forceinline__ float kv_block_sum8(float v, float* red) {
    v = kv_warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = ((red[0] + red[1]) + (red[2] + red[3])) + ((red[4] + red[5]) + (red[6] + red[7]));
    __syncthreads();
    return t;
}

__device__ __forceinline__ float kv_block_max8(float v, float* red) {
    v = kv_warp_max(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = fmaxf(fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])),
                    fmaxf(fmaxf(red[4], red[5]), fmaxf(red[6], red[7])));
    __syncthreads();
    return t;
}

extern "C" {

// cache [B, ctx, D] <- rows [B, n, D] at position pos[0] (i64 when pos64, else i32).
__global__ void cache_write(float* cache, const float* rows, const void* pos, int pos64,
                            int B, int ctx, int n, int D, int* status, int node) {
    long long p = pos64 ? ((const long long*)pos)[0] : (long long)((const int*)pos)[0];
    if (p < 0 || p + n > ctx) {
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicCAS(status, 0, -(node + 1));
        return;
    }
    long long per = (long long)n * D, total = (long long)B * per;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < total; i += stride) {
        long long b = i / per, rem = i - b * per;
        cache[(b * ctx + p) * D + rem] = rows[i];
    }
}

// A decode step's rope and cache writes in one launch. out [W] = rope of
// the row x [W] (heads of hd, rope_f32's arithmetic) at position p = pos[0];
// c0 [ctx0, d0] row p <- out[o0 .. o0 + d0]; c1 (when set) [ctx1, d1] row p
// <- s1 [d1]. A position outside a cache records -(node + 1) in the
// status word and skips that write. One thread per element of max(W, d1).
__global__ void rope_cache_row(float* out, const float* x, const void* pos, int pos64, int W,
                               int hd, int n_rot, float theta, int gptj,
                               float* c0, int o0, int d0, int ctx0, int node0,
                               float* c1, const float* s1, int d1, int ctx1, int node1,
                               int* status) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    long long p = pos64 ? ((const long long*)pos)[0] : (long long)((const int*)pos)[0];
    if (i < W) {
        int d = i % hd, half = n_rot / 2;
        float y;
        if (d >= n_rot) {
            y = x[i];
        } else {
            int base = i - d, pair, first;
            if (gptj) { pair = d / 2; first = (d % 2 == 0); }
            else { pair = d < half ? d : d - half; first = d < half; }
            double ang = (double)p * pow((double)theta, -2.0 * (double)pair / (double)n_rot);
            float cs = (float)cos(ang), sn = (float)sin(ang);
            float a, bb;
            if (gptj) { a = x[base + 2 * pair]; bb = x[base + 2 * pair + 1]; }
            else { a = x[base + pair]; bb = x[base + pair + half]; }
            y = first ? (a * cs - bb * sn) : (a * sn + bb * cs);
        }
        out[i] = y;
        if (i >= o0 && i < o0 + d0) {
            if (p < 0 || p >= ctx0) {
                if (i == o0) atomicCAS(status, 0, -(node0 + 1));
            } else {
                c0[p * d0 + (i - o0)] = y;
            }
        }
    }
    if (c1 && i < d1) {
        if (p < 0 || p >= ctx1) {
            if (i == 0) atomicCAS(status, 0, -(node1 + 1));
        } else {
            c1[p * d1 + i] = s1[i];
        }
    }
}

} // extern "C"

// One query row per block: grid (Sq, Hq, B), 256 threads, head_dim <= 32 NC
// (NC 4: `attention_rows`, head_dim <= 128; NC 8: `attention_rows_d256`).
// Keys in tiles of 256: one key per thread for the score (its K row read
// with float4 loads when aligned), then P.V with one warp per key and the
// lanes over dims (NC per lane); online softmax across tiles. Loads are
// batched ahead of their use: a decode step is a chain of memory round
// trips. The valid length is read from device memory: keys at or past
// kv_len[b] (when given) are skipped, and so are keys past the last kept
// key of a keep-mask (found here). Arguments as the tiled attention
// kernels. mkind: 0 none, 1 causal, 2 sliding window, 3 keep-mask f32,
// 4 keep-mask u8, 5 bias. Shared memory 1152 NC + 1056 bytes (5664 at NC 4,
// 10272 at NC 8); ptxas (CUDA 13, sm_90): 128 registers at NC 4, 182 at NC 8
// (vv holds 8 keys x NC dims), no spills, under __launch_bounds__(256)'s 255.
template <int NC>
__device__ __forceinline__ void attention_rows_body(
    const float* q, const float* k, const float* v, float* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3, const int* kv_len) {
    __shared__ float qsh[32 * NC];
    __shared__ float sc[KV_TILE];
    __shared__ float red[8];
    __shared__ float part[8][32 * NC];
    int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int d = tid; d < D; d += KV_TILE) qsh[d] = q[((long long)b * Sq + i) * qs + h * D + d];
    int off = Sk - Sq;
    int kend = Sk, kbeg = 0;
    if (kv_len) kend = min(kend, kv_len[b]);
    if (mkind == 3 || mkind == 4) {
        float last = 0.0f;
        for (int j = tid; j < kend; j += KV_TILE) {
            bool keep = mkind == 4 ? ((const unsigned char*)mask)[(long long)b * Sk + j] != 0
                                   : ((const float*)mask)[(long long)b * Sk + j] != 0.0f;
            if (keep) last = (float)(j + 1);
        }
        kend = min(kend, (int)kv_block_max8(last, red));
    }
    if (mkind == 1 || mkind == 2) kend = min(kend, i + off + 1);
    if (mkind == 2) kbeg = max(0, i + off - window + 1);
    const float* kb = k + (long long)b * Sk * ks + hk * D;
    const float* vb = v + (long long)b * Sk * vs + hk * D;
    bool vec = (D & 3) == 0 && (ks & 3) == 0 && (((unsigned long long)kb) & 15) == 0;
    float m = KV_NEG_INF, l = 0.0f;
    float acc[NC];
    #pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    __syncthreads();
    for (int c0 = kbeg; c0 < kend; c0 += KV_TILE) {
        int cn = min(KV_TILE, kend - c0);
        float s = KV_NEG_INF;
        if (tid < cn) {
            int key = c0 + tid;
            const float* kr = kb + (long long)key * ks;
            float dot = 0.0f;
            if (vec) {
                // The row's loads are all issued before the first is used.
                for (int d0 = 0; d0 < D; d0 += 64) {
                    float4 kk[16];
                    #pragma unroll
                    for (int t = 0; t < 16; ++t)
                        if (d0 + 4 * t < D) kk[t] = *(const float4*)(kr + d0 + 4 * t);
                    #pragma unroll
                    for (int t = 0; t < 16; ++t) {
                        int d = d0 + 4 * t;
                        if (d < D)
                            dot += qsh[d] * kk[t].x + qsh[d + 1] * kk[t].y + qsh[d + 2] * kk[t].z
                                 + qsh[d + 3] * kk[t].w;
                    }
                }
            } else {
                for (int d = 0; d < D; ++d) dot += qsh[d] * kr[d];
            }
            s = dot * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            if (mkind == 3 && ((const float*)mask)[(long long)b * Sk + key] == 0.0f) s = KV_NEG_INF;
            if (mkind == 4 && ((const unsigned char*)mask)[(long long)b * Sk + key] == 0) s = KV_NEG_INF;
            if (mkind == 5) s += ((const float*)mask)[(long long)b * b0 + (long long)h * b1 + (long long)i * b2 + (long long)key * b3];
        }
        float mnew = fmaxf(m, kv_block_max8(s, red));
        if (mnew == KV_NEG_INF) continue;
        float corr = (m == KV_NEG_INF) ? 0.0f : expf(m - mnew);
        float p = (s == KV_NEG_INF) ? 0.0f : expf(s - mnew);
        sc[tid] = p;
        l = l * corr + kv_block_sum8(p, red);
        #pragma unroll
        for (int c = 0; c < NC; ++c) acc[c] *= corr;
        // Warp w takes keys w, w + 8, ... in batches of 8 whose V loads are
        // all issued before the first is used (decode is latency-bound).
        for (int j0 = warp; j0 < cn; j0 += 64) {
            float vv[8][NC];
            #pragma unroll
            for (int t = 0; t < 8; ++t) {
                int jj = j0 + 8 * t;
                const float* vr = vb + (long long)(c0 + jj) * vs;
                #pragma unroll
                for (int c = 0; c < NC; ++c)
                    vv[t][c] = (jj < cn && lane + 32 * c < D) ? vr[lane + 32 * c] : 0.0f;
            }
            #pragma unroll
            for (int t = 0; t < 8; ++t) {
                int jj = j0 + 8 * t;
                if (jj >= cn) break;
                float pj = sc[jj];
                #pragma unroll
                for (int c = 0; c < NC; ++c)
                    if (lane + 32 * c < D) acc[c] += pj * vv[t][c];
            }
        }
        m = mnew;
        __syncthreads();
    }
    #pragma unroll
    for (int c = 0; c < NC; ++c)
        if (lane + 32 * c < D) part[warp][lane + 32 * c] = acc[c];
    __syncthreads();
    // 256 threads cover D <= 256 outputs in one pass.
    if (tid < D) {
        float t = 0.0f;
        #pragma unroll
        for (int w = 0; w < 8; ++w) t += part[w][tid];
        out[((long long)b * Sq + i) * os + h * D + tid] = l > 0.0f ? t / l : 0.0f;
    }
}

extern "C" {

#define ATTN_ROWS(NAME, NC)                                                              \
__global__ void __launch_bounds__(256) NAME(                                            \
    const float* q, const float* k, const float* v, float* out,                         \
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,             \
    float scale, float softcap, int mkind, int window, const void* mask,                \
    int b0, int b1, int b2, int b3, const int* kv_len) {                                \
    attention_rows_body<NC>(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, D, scale,    \
                            softcap, mkind, window, mask, b0, b1, b2, b3, kv_len);      \
}
ATTN_ROWS(attention_rows, 4)
ATTN_ROWS(attention_rows_d256, 8)

} // extern "C"
