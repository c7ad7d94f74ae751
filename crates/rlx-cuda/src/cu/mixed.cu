// Mixed-precision kernels (type codes 0 f32, 1 bf16, 2 f16; see the `mixed` module).
// Compiled by NVRTC at run time (rlx-cuda's `cu` module), which expands the include of
// common.cuh itself, so the file also builds with nvcc as is.
#include "common.cuh"

// Fused attention, online softmax, f32 accumulation. grid (ceil(Sq / (W R)), Hq, B),
// W <= 4 warps x R query rows; keys in tiles of 32 (one per lane).
// head_dim <= 32 * DPL. mkind: 0 none, 1 causal, 2 window, 3 keep f32, 4 keep u8, 5 bias.
template <int DPL, int R>
__device__ __forceinline__ void attention_x_body(
    const void* q, const void* k, const void* v, void* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3, int tq, int tk, int tv, int to) {
    __shared__ float Ks[32][32 * DPL + 1];
    __shared__ float Vs[32][32 * DPL];
    __shared__ float Qs[4][R][32 * DPL];
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows_blk = (blockDim.x >> 5) * R;
    int qbase = blockIdx.x * rows_blk;
    for (int r = 0; r < R; ++r) {
        int i = qbase + warp * R + r;
        for (int d = lane; d < 32 * DPL; d += 32)
            Qs[warp][r][d] = (i < Sq && d < D) ? ldx(q, ((long long)b * Sq + i) * qs + h * D + d, tq) : 0.0f;
    }
    float m[R], l[R], acc[R][DPL], p[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = NEG_INF; l[r] = 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) acc[r][c] = 0.0f;
    }
    int off = Sk - Sq;
    int kend = Sk, kbeg = 0;
    if (mkind == 1 || mkind == 2) {
        int last = qbase + rows_blk - 1 < Sq - 1 ? qbase + rows_blk - 1 : Sq - 1;
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
            long long ko = ((long long)b * Sk + key);
            Ks[j][d] = ok ? ldx(k, ko * ks + hk * D + d, tk) : 0.0f;
            Vs[j][d] = ok ? ldx(v, ko * vs + hk * D + d, tv) : 0.0f;
        }
        __syncthreads();
        int key = t0 + lane;
        bool kvis = key < kend;
        if (kvis && mkind == 3 && ((const float*)mask)[(long long)b * Sk + key] == 0.0f) kvis = false;
        if (kvis && mkind == 4 && ((const unsigned char*)mask)[(long long)b * Sk + key] == 0) kvis = false;
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            int i = qbase + warp * R + r;
            bool vis = kvis && i < Sq;
            if (mkind == 1) vis = vis && key <= i + off;
            if (mkind == 2) vis = vis && key <= i + off && key > i + off - window;
            float s = NEG_INF;
            if (vis) {
                float dot = 0.0f;
                #pragma unroll
                for (int d = 0; d < 32 * DPL; ++d) dot += Qs[warp][r][d] * Ks[lane][d];
                s = dot * scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                if (mkind == 5) s += ((const float*)mask)[(long long)b * b0 + (long long)h * b1 + (long long)i * b2 + (long long)key * b3];
            }
            float mnew = fmaxf(m[r], warp_max(s));
            if (mnew == NEG_INF) { p[r] = 0.0f; continue; }
            float pr = (s == NEG_INF) ? 0.0f : expf(s - mnew);
            float corr = (m[r] == NEG_INF) ? 0.0f : expf(m[r] - mnew);
            l[r] = l[r] * corr + warp_sum(pr);
            #pragma unroll
            for (int c = 0; c < DPL; ++c) acc[r][c] *= corr;
            m[r] = mnew;
            p[r] = pr;
        }
        #pragma unroll 4
        for (int j = 0; j < 32; ++j) {
            float vv[DPL];
            #pragma unroll
            for (int c = 0; c < DPL; ++c) vv[c] = Vs[j][lane + 32 * c];
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                float pj = __shfl_sync(0xffffffffu, p[r], j);
                #pragma unroll
                for (int c = 0; c < DPL; ++c) acc[r][c] += pj * vv[c];
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        int i = qbase + warp * R + r;
        if (i >= Sq) continue;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) {
            int d = lane + 32 * c;
            if (d < D) stx(out, ((long long)b * Sq + i) * os + h * D + d, to, acc[r][c] * inv);
        }
    }
}

// attention_x_body for head_dim <= 256 (W = 256, 8 dims per lane): a tile
// of 32 keys of 256 would not fit the 48 KB of static shared memory, so the
// tile is 16 keys, each key's score taking two lanes (lane l: key l & 15,
// float4 chunks 2t + (l >> 4) of the row, summed with one shuffle), every K
// chunk read once for all R rows. K rows are unpadded, their chunks
// XOR-swizzled by (key & 7) so each quarter warp's 16-byte reads hit
// distinct bank groups; Q and K past D are zeros. Shared memory: 16 x 256
// (K) + 16 x 256 (V) + 4 x R x 256 (Q) floats: 40 KB at R 2, 48 KB (the
// static limit exactly) at R 4. ptxas (CUDA 13, sm_90): 104 registers at
// R 2, 128 at R 4, no local memory.
template <int R>
__device__ __forceinline__ void attention_x_wide_body(
    const void* q, const void* k, const void* v, void* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3, int tq, int tk, int tv, int to) {
    constexpr int W = 256, TK = 16, DPL = 8;
    __shared__ __align__(16) float Ks[TK][W];
    __shared__ __align__(16) float Vs[TK][W];
    __shared__ __align__(16) float Qs[4][R][W];
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows_blk = (blockDim.x >> 5) * R;
    int qbase = blockIdx.x * rows_blk;
    for (int r = 0; r < R; ++r) {
        int i = qbase + warp * R + r;
        for (int d = lane; d < W; d += 32)
            Qs[warp][r][d] = (i < Sq && d < D) ? ldx(q, ((long long)b * Sq + i) * qs + h * D + d, tq) : 0.0f;
    }
    float m[R], l[R], acc[R][DPL], p[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = NEG_INF; l[r] = 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) acc[r][c] = 0.0f;
    }
    int off = Sk - Sq;
    int kend = Sk, kbeg = 0;
    if (mkind == 1 || mkind == 2) {
        int last = qbase + rows_blk - 1 < Sq - 1 ? qbase + rows_blk - 1 : Sq - 1;
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
            long long ko = ((long long)b * Sk + key);
            Ks[j][(((d >> 2) ^ (j & 7)) << 2) | (d & 3)] = ok ? ldx(k, ko * ks + hk * D + d, tk) : 0.0f;
            Vs[j][d] = ok ? ldx(v, ko * vs + hk * D + d, tv) : 0.0f;
        }
        __syncthreads();
        int key = t0 + jl;
        bool kvis = key < kend;
        if (kvis && mkind == 3 && ((const float*)mask)[(long long)b * Sk + key] == 0.0f) kvis = false;
        if (kvis && mkind == 4 && ((const unsigned char*)mask)[(long long)b * Sk + key] == 0) kvis = false;
        // The R rows' dots, each K chunk loaded once for all rows; both
        // lanes of a key shuffle, whether or not it is visible.
        float dots[R];
        {
            const float4* kr = (const float4*)&Ks[jl][0];
            #pragma unroll
            for (int r = 0; r < R; ++r) dots[r] = 0.0f;
            #pragma unroll 4
            for (int t = 0; t < W / 8; ++t) {
                int c = 2 * t + hh;
                float4 kk = kr[c ^ sw];
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    float4 qq = ((const float4*)&Qs[warp][r][0])[c];
                    dots[r] += qq.x * kk.x + qq.y * kk.y + qq.z * kk.z + qq.w * kk.w;
                }
            }
            #pragma unroll
            for (int r = 0; r < R; ++r) dots[r] += __shfl_xor_sync(0xffffffffu, dots[r], 16);
        }
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            int i = qbase + warp * R + r;
            bool vis = kvis && i < Sq;
            if (mkind == 1) vis = vis && key <= i + off;
            if (mkind == 2) vis = vis && key <= i + off && key > i + off - window;
            float s = NEG_INF;
            if (vis) {
                s = dots[r] * scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                if (mkind == 5) s += ((const float*)mask)[(long long)b * b0 + (long long)h * b1 + (long long)i * b2 + (long long)key * b3];
            }
            float mnew = fmaxf(m[r], warp_max(s));
            if (mnew == NEG_INF) { p[r] = 0.0f; continue; }
            float pr = (s == NEG_INF) ? 0.0f : expf(s - mnew);
            float corr = (m[r] == NEG_INF) ? 0.0f : expf(m[r] - mnew);
            // Lanes 16..31 repeat lanes 0..15: each key counts once.
            l[r] = l[r] * corr + warp_sum(lane < TK ? pr : 0.0f);
            #pragma unroll
            for (int c = 0; c < DPL; ++c) acc[r][c] *= corr;
            m[r] = mnew;
            p[r] = pr;
        }
        #pragma unroll 4
        for (int j = 0; j < TK; ++j) {
            float vv[DPL];
            #pragma unroll
            for (int c = 0; c < DPL; ++c) vv[c] = Vs[j][lane + 32 * c];
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                float pj = __shfl_sync(0xffffffffu, p[r], j);
                #pragma unroll
                for (int c = 0; c < DPL; ++c) acc[r][c] += pj * vv[c];
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        int i = qbase + warp * R + r;
        if (i >= Sq) continue;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        #pragma unroll
        for (int c = 0; c < DPL; ++c) {
            int d = lane + 32 * c;
            if (d < D) stx(out, ((long long)b * Sq + i) * os + h * D + d, to, acc[r][c] * inv);
        }
    }
}

// Two floats as a 32-bit pair of 16-bit values (T: 1 bf16, 2 f16), x low.
template <int T>
__device__ __forceinline__ unsigned pack2(float x, float y) {
    unsigned short a, b;
    if (T == 1) { a = f2bf(x); b = f2bf(y); }
    else {
        asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(a) : "f"(x));
        asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(b) : "f"(y));
    }
    return (unsigned)a | ((unsigned)b << 16);
}

#if __CUDA_ARCH__ >= 800
// D (16x8, f32) += A (16x16, row) B (16x8, col), 16-bit inputs of type T.
template <int T>
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
    if (T == 1)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Flash attention on tensor cores: q, k, v all 16-bit of type T, head dim D
// (32 or 64), f32 scores, online softmax and accumulation. The block's warps
// share one (batch, head): each chunk of KC keys of K and V (and the chunk's
// keep-mask) is staged in shared memory with 16-byte loads, zero-filled past
// S_k, then each warp walks its 16 query rows over the chunk 32 keys at a
// time (one online-softmax update per step, exp2 of log2-scaled scores):
// S = Q K^T and O += P V with mma.m16n8k16 (P rounded to T; the V fragments
// come from ldmatrix.trans). mkind: 0 none, 3 keep-mask f32, 4 keep
// u8. grid (ceil(Sq / (16 W)), Hq, B) with W = 1, 2 or 4 warps per block.
// Before sm_80 the CUDA-core kernel runs instead (16 rows per warp, 4 warps).
template <int D, int T>
__device__ __forceinline__ void attention_tc_body(
    const void* q, const void* k, const void* v, void* out,
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int Dr,
    float scale, float softcap, int mkind, int window, const void* mask,
    int b0, int b1, int b2, int b3, int tq, int tk, int tv, int to) {
#if __CUDA_ARCH__ >= 800
    constexpr int KC = D == 32 ? 128 : 64;
    constexpr int LD = D + 8;  // padded rows: conflict-free fragment reads
    const float scale2 = scale * 1.4426950408889634f;  // scores in log2 units (exp2f)
    __shared__ __align__(16) unsigned short sk[KC * LD];
    __shared__ __align__(16) unsigned short sv[KC * LD];
    __shared__ float skeep[KC];
    const unsigned short* Q = (const unsigned short*)q;
    const unsigned short* K = (const unsigned short*)k;
    const unsigned short* V = (const unsigned short*)v;
    int b = blockIdx.z, h = blockIdx.y, hk = h / (Hq / Hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tc = lane & 3;
    int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * 16;
    bool active = row0 < Sq;  // no early return: every warp stages and syncs
    int ra = row0 + g, rb = row0 + g + 8;
    long long qa_off = ((long long)b * Sq + ra) * qs + h * D;
    long long qb_off = ((long long)b * Sq + rb) * qs + h * D;
    unsigned qa[D / 16][4];
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        int col = kk * 16 + tc * 2;
        qa[kk][0] = ra < Sq ? *(const unsigned*)(Q + qa_off + col) : 0u;
        qa[kk][1] = rb < Sq ? *(const unsigned*)(Q + qb_off + col) : 0u;
        qa[kk][2] = ra < Sq ? *(const unsigned*)(Q + qa_off + col + 8) : 0u;
        qa[kk][3] = rb < Sq ? *(const unsigned*)(Q + qb_off + col + 8) : 0u;
    }
    float o[D / 8][4];
    #pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) { o[nt][0] = 0.0f; o[nt][1] = 0.0f; o[nt][2] = 0.0f; o[nt][3] = 0.0f; }
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;
    long long kbase = (long long)b * Sk;
    const unsigned short* Kh = K + hk * D;
    const unsigned short* Vh = V + hk * D;
    // 16-byte staging loads need 16-byte aligned rows; else 4-byte words.
    bool vec = ((ks | vs) & 7) == 0 && ((((size_t)Kh) | ((size_t)Vh)) & 15) == 0;
    for (int c0 = 0; c0 < Sk; c0 += KC) {
        int n = min(KC, Sk - c0);
        __syncthreads();  // the previous chunk is no longer read
        // The chunk's keep flags are requested before the K/V loads (stored
        // after them), so the three reads overlap.
        bool keep[4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            int i = threadIdx.x + u * blockDim.x;
            bool ok = i < KC && i < n;
            if (ok && mkind == 3) ok = ((const float*)mask)[kbase + c0 + i] != 0.0f;
            if (ok && mkind == 4) ok = ((const unsigned char*)mask)[kbase + c0 + i] != 0;
            keep[u] = ok;
        }
        // Eight 16-byte vectors of K and of V per thread in flight at once,
        // then their stores.
        for (int i0 = 0; i0 < KC * (D / 8); i0 += 8 * blockDim.x) {
            uint4 kx[8], vx[8];
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                int i = i0 + u * blockDim.x + threadIdx.x;
                int r = i / (D / 8), c = (i % (D / 8)) * 8;
                kx[u] = make_uint4(0u, 0u, 0u, 0u);
                vx[u] = kx[u];
                if (i < KC * (D / 8) && r < n) {
                    const unsigned short* kp = Kh + (kbase + c0 + r) * ks + c;
                    const unsigned short* vp = Vh + (kbase + c0 + r) * vs + c;
                    if (vec) {
                        kx[u] = *(const uint4*)kp;
                        vx[u] = *(const uint4*)vp;
                    } else {
                        const unsigned* kw = (const unsigned*)kp;
                        const unsigned* vw = (const unsigned*)vp;
                        kx[u] = make_uint4(kw[0], kw[1], kw[2], kw[3]);
                        vx[u] = make_uint4(vw[0], vw[1], vw[2], vw[3]);
                    }
                }
            }
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                int i = i0 + u * blockDim.x + threadIdx.x;
                if (i < KC * (D / 8)) {
                    int r = i / (D / 8), c = (i % (D / 8)) * 8;
                    *(uint4*)(sk + r * LD + c) = kx[u];
                    *(uint4*)(sv + r * LD + c) = vx[u];
                }
            }
        }
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            int i = threadIdx.x + u * blockDim.x;
            if (i < KC) skeep[i] = keep[u] ? 1.0f : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        // 32 keys per step: four 8-key score tiles, one online-softmax
        // update, and two 16-key halves of P V.
        for (int t0 = 0; t0 < n; t0 += 32) {
            float s[4][4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[j][0] = 0.0f; s[j][1] = 0.0f; s[j][2] = 0.0f; s[j][3] = 0.0f;
                const unsigned short* kr = sk + (t0 + j * 8 + g) * LD + tc * 2;
                #pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    unsigned bf[2] = {*(const unsigned*)(kr + kk * 16),
                                      *(const unsigned*)(kr + kk * 16 + 8)};
                    mma16816<T>(s[j], qa[kk], bf);
                }
            }
            float mxa = NEG_INF, mxb = NEG_INF;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    bool ok = skeep[t0 + j * 8 + tc * 2 + e] != 0.0f;
                    float va = ok ? s[j][e] * scale2 : NEG_INF;
                    float vb = ok ? s[j][2 + e] * scale2 : NEG_INF;
                    s[j][e] = va;
                    s[j][2 + e] = vb;
                    mxa = fmaxf(mxa, va);
                    mxb = fmaxf(mxb, vb);
                }
            }
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
            float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
            float ca = (ma == NEG_INF) ? 0.0f : exp2f(ma - na);
            float cb = (mb == NEG_INF) ? 0.0f : exp2f(mb - nb);
            float p[4][4];
            float sa = 0.0f, sb = 0.0f;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    p[j][e] = s[j][e] == NEG_INF ? 0.0f : exp2f(s[j][e] - na);
                    p[j][2 + e] = s[j][2 + e] == NEG_INF ? 0.0f : exp2f(s[j][2 + e] - nb);
                    sa += p[j][e];
                    sb += p[j][2 + e];
                }
            }
            la = la * ca + sa;
            lb = lb * cb + sb;
            ma = na;
            mb = nb;
            #pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) { o[nt][0] *= ca; o[nt][1] *= ca; o[nt][2] *= cb; o[nt][3] *= cb; }
            // ldmatrix.x4.trans: lanes 8m..8m+7 address matrix m's rows (keys
            // t0 + h16 * 16 + (m & 1) * 8 + r, dims (nt + m / 2) * 8 ..),
            // giving the B fragments of two 8-wide output tiles.
            int mi = lane >> 3, r = lane & 7;
            #pragma unroll
            for (int h16 = 0; h16 < 2; ++h16) {
                unsigned pa[4] = {pack2<T>(p[2 * h16][0], p[2 * h16][1]),
                                  pack2<T>(p[2 * h16][2], p[2 * h16][3]),
                                  pack2<T>(p[2 * h16 + 1][0], p[2 * h16 + 1][1]),
                                  pack2<T>(p[2 * h16 + 1][2], p[2 * h16 + 1][3])};
                #pragma unroll
                for (int nt = 0; nt < D / 8; nt += 2) {
                    const unsigned short* vr =
                        sv + (t0 + h16 * 16 + (mi & 1) * 8 + r) * LD + (nt + (mi >> 1)) * 8;
                    unsigned addr = (unsigned)__cvta_generic_to_shared(vr);
                    unsigned vb[4];
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(vb[0]), "=r"(vb[1]), "=r"(vb[2]), "=r"(vb[3])
                                 : "r"(addr));
                    mma16816<T>(o[nt], pa, vb);
                    mma16816<T>(o[nt + 1], pa, vb + 2);
                }
            }
        }
    }
    if (!active) return;
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
    #pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
        int d = h * D + nt * 8 + tc * 2;
        if (ra < Sq) {
            long long oa = ((long long)b * Sq + ra) * os + d;
            stx(out, oa, to, o[nt][0] * ia);
            stx(out, oa + 1, to, o[nt][1] * ia);
        }
        if (rb < Sq) {
            long long ob = ((long long)b * Sq + rb) * os + d;
            stx(out, ob, to, o[nt][2] * ib);
            stx(out, ob + 1, to, o[nt][3] * ib);
        }
    }
#else
    attention_x_body<D / 32, 16>(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, Dr, scale,
                                 softcap, mkind, window, mask, b0, b1, b2, b3, tq, tk, tv, to);
#endif
}

extern "C" {

__global__ void binary_mod_x(void* out, const void* a, const void* b, long long n,
                             long long na, long long nb, int op, int to, int ta, int tb) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) stx(out, i, to, bin_apply(op, ldx(a, i % na, ta), ldx(b, i % nb, tb)));
}

// meta: rank, dims[rank], sa[rank], sb[rank].
__global__ void binary_bcast_x(void* out, const void* a, const void* b, long long n,
                               const int* meta, int op, int to, int ta, int tb) {
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
        stx(out, i, to, bin_apply(op, ldx(a, ia, ta), ldx(b, ib, tb)));
    }
}

__global__ void activation_x(void* out, const void* x, long long n, int kind, int to, int tx) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) stx(out, i, to, act_apply(kind, ldx(x, i, tx)));
}

// In place: out[i] = act(out[i] + bias[i % cols]) (bias may be null).
__global__ void bias_act_x(void* out, const void* bias, long long n, int cols, int kind,
                           int to, int tb) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float v = ldx(out, i, to);
        if (bias) v += ldx(bias, i % cols, tb);
        stx(out, i, to, act_apply(kind, v));
    }
}

// One block per row; v = x + res + bias (res, bias may be null); f32 statistics.
__global__ void norm_rows_x(void* out, const void* x, const void* res, const void* bias,
                            const void* gamma, const void* beta, int rows, int d,
                            float eps, int rms, int to, int tx, int tr, int tbias,
                            int tg, int tbeta) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    if (row >= rows) return;
    long long base = (long long)row * d;
    if (d <= 4 * (int)blockDim.x) {
        // One read of the row: each thread keeps its (at most 4) values.
        float vals[4];
        float s = 0.0f;
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            int c = threadIdx.x + i * blockDim.x;
            float v = 0.0f;
            if (c < d) {
                v = ldx(x, base + c, tx);
                if (res) v += ldx(res, base + c, tr);
                if (bias) v += ldx(bias, c, tbias);
            }
            vals[i] = v;
            s += rms ? v * v : v;
        }
        s = block_sum(s, sh);
        float inv, mean = 0.0f;
        if (rms) {
            inv = 1.0f / sqrtf(s / (float)d + eps);
        } else {
            mean = s / (float)d;
            float q = 0.0f;
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                int c = threadIdx.x + i * blockDim.x;
                float t = vals[i] - mean;
                if (c < d) q += t * t;
            }
            q = block_sum(q, sh);
            inv = 1.0f / sqrtf(q / (float)d + eps);
        }
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            int c = threadIdx.x + i * blockDim.x;
            if (c < d) {
                float y = (vals[i] - mean) * inv * ldx(gamma, c, tg);
                if (!rms && beta) y += ldx(beta, c, tbeta);
                stx(out, base + c, to, y);
            }
        }
        return;
    }
    float s = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = ldx(x, base + c, tx);
        if (res) v += ldx(res, base + c, tr);
        if (bias) v += ldx(bias, c, tbias);
        s += rms ? v * v : v;
    }
    s = block_sum(s, sh);
    float inv, mean = 0.0f;
    if (rms) {
        inv = 1.0f / sqrtf(s / (float)d + eps);
    } else {
        mean = s / (float)d;
        float q = 0.0f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            float v = ldx(x, base + c, tx);
            if (res) v += ldx(res, base + c, tr);
            if (bias) v += ldx(bias, c, tbias);
            float t = v - mean;
            q += t * t;
        }
        q = block_sum(q, sh);
        inv = 1.0f / sqrtf(q / (float)d + eps);
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = ldx(x, base + c, tx);
        if (res) v += ldx(res, base + c, tr);
        if (bias) v += ldx(bias, c, tbias);
        float y = (v - mean) * inv * ldx(gamma, c, tg);
        if (!rms && beta) y += ldx(beta, c, tbeta);
        stx(out, base + c, to, y);
    }
}


// Row lookup with conversion. ids are i64 (idx64 = 1) or i32.
__global__ void gather_x(void* out, const void* table, const void* ids, long long n_ids,
                         int row, long long vocab, int idx64, int* status, int node,
                         int to, int tt) {
    long long n = n_ids * row;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        long long r = i / row;
        int c = (int)(i - r * row);
        long long id = idx64 ? ((const long long*)ids)[r] : (long long)((const int*)ids)[r];
        if (id < 0 || id >= vocab) {
            atomicCAS(status, 0, node + 1);
            stx(out, i, to, 0.0f);
        } else {
            stx(out, i, to, ldx(table, id * row + c, tt));
        }
    }
}

} // extern "C"

// Reductions. meta: nk, kdims[nk], kstrides[nk], kstrides_y[nk], nr,
// rdims[nr], rstrides[nr], rstrides_y[nr] (kept axes, then reduced axes;
// the y strides are those of the optional second operand). op: 0 sum,
// 1 mean, 2 max, 3 min. With y non-null each element is
// bin_apply(bop, x, y) (a fused Binary prologue), else x.
struct RedMeta {
    int nk, nr;
    const int *kd, *ks, *ks2, *rd, *rs, *rs2;
    long long cnt;
};

__device__ __forceinline__ RedMeta red_meta(const int* meta) {
    RedMeta m;
    m.nk = meta[0];
    m.kd = meta + 1;
    m.ks = m.kd + m.nk;
    m.ks2 = m.ks + m.nk;
    m.nr = m.ks2[m.nk];
    m.rd = m.ks2 + m.nk + 1;
    m.rs = m.rd + m.nr;
    m.rs2 = m.rs + m.nr;
    m.cnt = 1;
    for (int d = 0; d < m.nr; ++d) m.cnt *= m.rd[d];
    return m;
}

// The (x, y) offsets of kept index w.
__device__ __forceinline__ void red_base(const RedMeta& m, long long w, long long* bx, long long* by) {
    long long r = w, ox = 0, oy = 0;
    for (int d = m.nk - 1; d >= 0; --d) {
        long long c = r % m.kd[d];
        r /= m.kd[d];
        ox += c * m.ks[d];
        oy += c * m.ks2[d];
    }
    *bx = ox;
    *by = oy;
}

// Element j of the reduced range at base (bx, by).
__device__ __forceinline__ float red_load(const RedMeta& m, const void* x, const void* y,
                                          long long bx, long long by, long long j, int bop,
                                          int tx, int ty) {
    long long rr = j, ox = bx, oy = by;
    for (int d = m.nr - 1; d >= 0; --d) {
        long long c = rr % m.rd[d];
        rr /= m.rd[d];
        ox += c * m.rs[d];
        oy += c * m.rs2[d];
    }
    float v = ldx(x, ox, tx);
    return y ? bin_apply(bop, v, ldx(y, oy, ty)) : v;
}

__device__ __forceinline__ float red_init(int op) {
    return (op == 2) ? NEG_INF : (op == 3 ? -NEG_INF : 0.0f);
}

__device__ __forceinline__ float red_step(int op, float acc, float v, bool* nan) {
    if (op <= 1) return acc + v;
    if (v != v) *nan = true;
    return (op == 2) ? fmaxf(acc, v) : fminf(acc, v);
}

__device__ __forceinline__ float red_warp(int op, float acc) {
    if (op <= 1) return warp_sum(acc);
    if (op == 2) return warp_max(acc);
    return -warp_max(-acc);
}

// Four consecutive values at element i (16-byte aligned for f32, 8-byte
// for 16-bit storage) of type T, converted to f32.
template <int T>
__device__ __forceinline__ void ld4(const void* p, long long i, float* v) {
    if (T == 0) {
        float4 f = *(const float4*)((const float*)p + i);
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
        return;
    }
    uint2 u = *(const uint2*)((const unsigned short*)p + i);
    unsigned short h[4] = {(unsigned short)(u.x & 0xffffu), (unsigned short)(u.x >> 16),
                           (unsigned short)(u.y & 0xffffu), (unsigned short)(u.y >> 16)};
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (T == 1) {
            v[k] = __uint_as_float(((unsigned int)h[k]) << 16);
        } else {
            float f;
            asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h[k]));
            v[k] = f;
        }
    }
}

template <int T>
__device__ __forceinline__ void st4(void* p, long long i, const float* v) {
    if (T == 0) {
        *(float4*)((float*)p + i) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    unsigned short h[4];
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (T == 1) h[k] = f2bf(v[k]);
        else asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h[k]) : "f"(v[k]));
    }
    *(uint2*)((unsigned short*)p + i) =
        make_uint2((unsigned)h[0] | ((unsigned)h[1] << 16), (unsigned)h[2] | ((unsigned)h[3] << 16));
}

// f32 value v rounded to storage type T (0 f32, 1 bf16, 2 f16).
template <int T>
__device__ __forceinline__ float round_t(float v) {
    if (T == 1) return __uint_as_float(((unsigned int)f2bf(v)) << 16);
    if (T == 2) {
        unsigned short h;
        float r;
        asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(v));
        asm("{ cvt.f32.f16 %0, %1; }" : "=f"(r) : "h"(h));
        return r;
    }
    return v;
}

// Four values at element i of a tensor of storage type code t.
__device__ __forceinline__ void ld4_any(const void* p, long long i, int t, float* v) {
    if (t == 0) ld4<0>(p, i, v);
    else if (t == 1) ld4<1>(p, i, v);
    else ld4<2>(p, i, v);
}

// The table row a norm reads for `row` through ids (i64 if idx64, else
// i32) of a table of `vocab` rows: an id outside [0, vocab) records
// node + 1 in the status word and yields -1 (the row reads as zeros, as
// the Gather it replaces writes it).
__device__ __forceinline__ long long norm_row_id(const void* ids, int idx64, long long vocab,
                                                 int row, int lane, int* status, int node) {
    long long id = idx64 ? ((const long long*)ids)[row] : (long long)((const int*)ids)[row];
    if (id >= 0 && id < vocab) return id;
    if (lane == 0) atomicCAS(status, 0, node + 1);
    return -1;
}

// LayerNorm / RMSNorm of one row per warp: v = x + res + bias (res, bias may
// be null), f32 statistics (mean, then the mean squared deviation, as
// norm_rows_x). x, res and out are stored as T; bias, gamma and beta as P.
// With x2 non-null, x is first x + x2[i % n2] rounded to T (an absorbed
// Add, its second operand broadcast as a trailing block, of type t2;
// n2 % 4 == 0). With xi (ri) non-null, x (res) is a [vx (vr), d] table of
// type txt (trt) and the row's values are its row xi[row] (ri[row])
// rounded to T: an absorbed embedding Gather (norm_row_id; nx, nr its node).
// G is 1 for the kernels that take an absorbed Add or gathers (the `_g`
// names), 0 for the plain ones, which compile without that code (x2, xi,
// ri unused): on the H200 a plain norm without it measured 3.05 us per
// call at MiniLM 1x128 against 3.67 with the Add's code (ncu, one run).
// Lane l holds columns 4 (32 c + l) .. + 3 for c < NC: one vector load per
// tensor and chunk, all issued before any arithmetic. d % 4 == 0,
// d <= 128 NC, and every pointer is aligned to 4 elements.
template <int T, int P, int NC, int G>
__device__ __forceinline__ void norm_warp_body(void* out, const void* x, const void* res,
                                               const void* bias, const void* gamma,
                                               const void* beta, int rows, int d, float eps,
                                               int rms, const void* x2, long long n2,
                                               int t2, const void* xi, const void* ri,
                                               long long vx, long long vr, int ix64,
                                               int ir64, int txt, int trt, int* status,
                                               int nx, int nr) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long long base = (long long)row * d;
    if (!G) {
        xi = ri = nullptr;
        x2 = nullptr;
    }
    long long xrow = xi ? norm_row_id(xi, ix64, vx, row, lane, status, nx) : row;
    long long rrow = ri ? norm_row_id(ri, ir64, vr, row, lane, status, nr) : row;
    float v[NC][4], r[NC][4], b[NC][4], e[NC][4];
    #pragma unroll
    for (int c = 0; c < NC; ++c) {
        int col = (c * 32 + lane) * 4;
        bool in = col < d;
        #pragma unroll
        for (int k = 0; k < 4; ++k) { v[c][k] = 0.0f; r[c][k] = 0.0f; b[c][k] = 0.0f; e[c][k] = 0.0f; }
        if (G && in && xi && xrow >= 0) ld4_any(x, xrow * d + col, txt, v[c]);
        if (in && !xi) ld4<T>(x, base + col, v[c]);
        if (in && x2) {
            long long i2 = (base + col) % n2;
            if (t2 == 0) ld4<0>(x2, i2, e[c]);
            else if (t2 == 1) ld4<1>(x2, i2, e[c]);
            else ld4<2>(x2, i2, e[c]);
        }
        if (G && in && ri && rrow >= 0) ld4_any(res, rrow * d + col, trt, r[c]);
        if (in && res && !ri) ld4<T>(res, base + col, r[c]);
        if (in && bias) ld4<P>(bias, col, b[c]);
    }
    if (G && (xi || ri)) {
        #pragma unroll
        for (int c = 0; c < NC; ++c) {
            #pragma unroll
            for (int k = 0; k < 4; ++k) {
                if (xi) v[c][k] = round_t<T>(v[c][k]);
                if (ri) r[c][k] = round_t<T>(r[c][k]);
            }
        }
    }
    if (x2) {
        #pragma unroll
        for (int c = 0; c < NC; ++c) {
            #pragma unroll
            for (int k = 0; k < 4; ++k) v[c][k] = round_t<T>(v[c][k] + e[c][k]);
        }
    }
    float s = 0.0f;
    #pragma unroll
    for (int c = 0; c < NC; ++c) {
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[c][k] = v[c][k] + r[c][k] + b[c][k];
            s += rms ? v[c][k] * v[c][k] : v[c][k];
        }
    }
    // gamma and beta (into the registers res and bias used) load while the
    // statistics are reduced.
    #pragma unroll
    for (int c = 0; c < NC; ++c) {
        int col = (c * 32 + lane) * 4;
        #pragma unroll
        for (int k = 0; k < 4; ++k) b[c][k] = 0.0f;
        if (col < d) ld4<P>(gamma, col, r[c]);
        if (col < d && !rms && beta) ld4<P>(beta, col, b[c]);
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float mean = 0.0f, inv;
    if (rms) {
        inv = 1.0f / sqrtf(s / (float)d + eps);
    } else {
        mean = s / (float)d;
        float q = 0.0f;
        #pragma unroll
        for (int c = 0; c < NC; ++c) {
            if ((c * 32 + lane) * 4 < d) {
                #pragma unroll
                for (int k = 0; k < 4; ++k) {
                    float t = v[c][k] - mean;
                    q += t * t;
                }
            }
        }
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
        inv = 1.0f / sqrtf(q / (float)d + eps);
    }
    #pragma unroll
    for (int c = 0; c < NC; ++c) {
        int col = (c * 32 + lane) * 4;
        if (col >= d) continue;
        #pragma unroll
        for (int k = 0; k < 4; ++k) v[c][k] = (v[c][k] - mean) * inv * r[c][k] + b[c][k];
        st4<T>(out, base + col, v[c]);
    }
}

// An f32 read through L2 only (a value another block of this kernel wrote).
__device__ __forceinline__ float ldcg_f(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// One 16 x 32 tile of C = A W^T (f32) for 128 threads: A [M, K] (row
// stride lda), W [N, K] (a weight stored [out, in]), both 16-bit of type
// T; the tile at rows m0.., columns n0... K comes in stages of 64, six
// buffered (five in flight: all of K = 320 at once) with cp.async, rows
// past M zero-filled; the 4 warps split each stage in 16s on
// mma.m16n8k16 and their partial tiles are summed through shared memory.
// Thread t gets row t / 8, columns (t % 8) * 4 .. + 3 in cv. K % 64 == 0;
// A and W 16-byte aligned, lda % 8 == 0. Before sm_80 the tile is
// computed on CUDA cores.
template <int T>
__device__ __forceinline__ void gemm_tile16x32(const void* a, const void* w, int M, int K,
                                               int lda, int m0, int n0, float* cv) {
    constexpr int BM = 16, BN = 32, BK = 64, ST = 6, LDS = BK + 8;
    __shared__ __align__(16) unsigned short sa[ST][BM * LDS];
    __shared__ __align__(16) unsigned short sw[ST][BN * LDS];
    const unsigned short* A = (const unsigned short*)a;
    const unsigned short* W = (const unsigned short*)w;
    int tid = threadIdx.x;
    int er = tid >> 3, ec = (tid & 7) * 4;
#if __CUDA_ARCH__ >= 800
    int lane = tid & 31, warp = tid >> 5;
    int nk = K / BK;
    float acc[4][4];
    #pragma unroll
    for (int t = 0; t < 4; ++t) { acc[t][0] = 0.0f; acc[t][1] = 0.0f; acc[t][2] = 0.0f; acc[t][3] = 0.0f; }
    // Stage loads: A 16 x 64 (one 16-byte vector per thread; rows past M
    // zero-filled), W 32 x 64 (two per thread).
    #define GEMM_TILE_LOAD(kt, s)                                                           \
    {                                                                                       \
        int r = tid >> 3, c = (tid & 7) * 8, k0 = (kt) * BK;                                \
        int ok = (m0 + r < M) ? 16 : 0;                                                     \
        const unsigned short* src = A + (long long)(ok ? m0 + r : 0) * lda + k0 + c;        \
        unsigned dst = (unsigned)__cvta_generic_to_shared(&sa[s][r * LDS + c]);             \
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"                        \
                     :: "r"(dst), "l"(src), "r"(ok));                                       \
        for (int q = 0; q < 2; ++q) {                                                       \
            int rw = r + 16 * q;                                                            \
            const unsigned short* ws = W + (long long)(n0 + rw) * K + k0 + c;               \
            unsigned dw = (unsigned)__cvta_generic_to_shared(&sw[s][rw * LDS + c]);         \
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dw), "l"(ws));  \
        }                                                                                   \
    }
    #pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (s < nk) GEMM_TILE_LOAD(s, s);
        asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < nk; ++kt) {
        asm volatile("cp.async.wait_group 4;");  // ST - 2: stage kt has landed
        __syncthreads();  // ... for every thread; stage kt - 1 is no longer read
        if (kt + ST - 1 < nk) GEMM_TILE_LOAD(kt + ST - 1, (kt + ST - 1) % ST);
        asm volatile("cp.async.commit_group;");
        int s = kt % ST, kk = warp * 16;
        unsigned af[4];
        {
            int r = (lane & 7) + ((lane >> 3) & 1) * 8, c = kk + (lane >> 4) * 8;
            unsigned addr = (unsigned)__cvta_generic_to_shared(&sa[s][r * LDS + c]);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(af[0]), "=r"(af[1]), "=r"(af[2]), "=r"(af[3]) : "r"(addr));
        }
        #pragma unroll
        for (int q = 0; q < 2; ++q) {
            int r = 16 * q + (lane & 7) + (lane >> 4) * 8, c = kk + ((lane >> 3) & 1) * 8;
            unsigned addr = (unsigned)__cvta_generic_to_shared(&sw[s][r * LDS + c]);
            unsigned bf[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3]) : "r"(addr));
            mma16816<T>(acc[2 * q], af, bf);
            mma16816<T>(acc[2 * q + 1], af, bf + 2);
        }
    }
    #undef GEMM_TILE_LOAD
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    // The four warps' partial tiles, summed through shared memory (the W
    // stages are free now: 4 x 16 x 32 floats fit in them; rows padded).
    constexpr int RL = BN + 4;
    float* red = (float*)&sw[0][0];
    {
        int g = lane >> 2, t2 = (lane & 3) * 2;
        #pragma unroll
        for (int t = 0; t < 4; ++t) {
            int c = t * 8 + t2;
            red[(warp * BM + g) * RL + c] = acc[t][0];
            red[(warp * BM + g) * RL + c + 1] = acc[t][1];
            red[(warp * BM + g + 8) * RL + c] = acc[t][2];
            red[(warp * BM + g + 8) * RL + c + 1] = acc[t][3];
        }
    }
    __syncthreads();
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        float v = 0.0f;
        #pragma unroll
        for (int q = 0; q < 4; ++q) v += red[(q * BM + er) * RL + ec + j];
        cv[j] = v;
    }
#else
    for (int j = 0; j < 4; ++j) cv[j] = 0.0f;
    if (m0 + er < M) {
        for (int k = 0; k < K; ++k) {
            float x = ldx(A, (long long)(m0 + er) * lda + k, T);
            for (int j = 0; j < 4; ++j) cv[j] += x * ldx(W, (long long)(n0 + ec + j) * K + k, T);
        }
    }
#endif
}

// A matmul with its LayerNorm: c = A W^T + bias (rounded to T, as the
// matmul's own output would be), v = c + res (+ lnb), out = LN(v) gamma +
// beta. A [M, K] (row stride lda), W [N, K], res and out [M, N]: all
// 16-bit of type T; bias, lnb, gamma, beta of any type (codes tb ..
// tbeta; bias, lnb and beta may be null). grid (N / 32, ceil(M / 16)), 128
// threads: a block computes a 16 x 32 tile (gemm_tile16x32), writes c and
// the tile's row statistics (mean and the sum of squared deviations over
// its 32 columns) to `stats`, and counts itself in `counters[blockIdx.y]`.
// The last block of a row tile to finish merges the statistics (Chan's
// formula), resets the counter (so the next launch, or graph replay,
// starts from zero) and normalizes the tile's 16 full rows in place.
// N % 32 == 0, N <= 1024, res and out 8-byte aligned.
template <int T>
__device__ __forceinline__ void gemm_ln_body(
    void* out, const void* a, const void* w, const void* bias, const void* res,
    const void* lnb, const void* gamma, const void* beta, int M, int N, int K, int lda,
    float eps, int tb, int tlnb, int tg, int tbeta, float* stats, int* counters) {
    constexpr int BM = 16, BN = 32;
    __shared__ float smean[BM], sinv[BM];
    __shared__ int is_last;
    int tid = threadIdx.x;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    int er = tid >> 3, ec = (tid & 7) * 4;
    float cv[4];
    gemm_tile16x32<T>(a, w, M, K, lda, m0, n0, cv);
    int row = m0 + er;
    bool in = row < M;
    float rv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in) ld4<T>(res, (long long)row * N + n0 + ec, rv);
    float v[4], sum = 0.0f;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        int c = n0 + ec + j;
        // Round to T as the matmul output would be stored.
        cv[j] = round_t<T>(cv[j] + (bias ? ldx(bias, c, tb) : 0.0f));
        v[j] = in ? cv[j] + rv[j] + (lnb ? ldx(lnb, c, tlnb) : 0.0f) : 0.0f;
        sum += v[j];
    }
    // Row statistics over the tile's 32 columns: the 8 threads of a row are
    // 8 consecutive lanes.
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    float mean = sum * (1.0f / BN), m2 = 0.0f;
    #pragma unroll
    for (int j = 0; j < 4; ++j) { float d = v[j] - mean; m2 += d * d; }
    m2 += __shfl_xor_sync(0xffffffffu, m2, 1);
    m2 += __shfl_xor_sync(0xffffffffu, m2, 2);
    m2 += __shfl_xor_sync(0xffffffffu, m2, 4);
    float* st = stats + ((long long)blockIdx.y * gridDim.x + blockIdx.x) * (2 * BM);
    if ((tid & 7) == 0) { st[2 * er] = mean; st[2 * er + 1] = m2; }
    if (in) st4<T>(out, (long long)row * N + n0 + ec, cv);
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(&counters[blockIdx.y], 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    if (tid == 0) counters[blockIdx.y] = 0;
    int nb = gridDim.x;
    if (tid < BM) {
        const float* s0 = stats + (long long)blockIdx.y * nb * (2 * BM);
        float mu = 0.0f;
        for (int b = 0; b < nb; ++b) mu += ldcg_f(&s0[b * 2 * BM + 2 * tid]);
        mu /= (float)nb;
        float q = 0.0f;
        for (int b = 0; b < nb; ++b) {
            float d = ldcg_f(&s0[b * 2 * BM + 2 * tid]) - mu;
            q += ldcg_f(&s0[b * 2 * BM + 2 * tid + 1]) + (float)BN * d * d;
        }
        smean[tid] = mu;
        sinv[tid] = 1.0f / sqrtf(q / (float)N + eps);
    }
    __syncthreads();
    if (!in) return;
    // Normalize row er: this thread's 4 columns in each 32-column block,
    // four blocks' loads issued before their arithmetic.
    float mu = smean[er], inv = sinv[er];
    long long rbase = (long long)row * N;
    for (int b0 = 0; b0 < nb; b0 += 4) {
        float x[4][4], rr[4][4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (b0 + u < nb) {
                long long off = rbase + (b0 + u) * BN + ec;
                uint2 h;
                asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];"
                             : "=r"(h.x), "=r"(h.y) : "l"((const unsigned short*)out + off));
                unsigned short e[4] = {(unsigned short)(h.x & 0xffffu), (unsigned short)(h.x >> 16),
                                       (unsigned short)(h.y & 0xffffu), (unsigned short)(h.y >> 16)};
                #pragma unroll
                for (int k = 0; k < 4; ++k) {
                    if (T == 1) {
                        x[u][k] = __uint_as_float(((unsigned int)e[k]) << 16);
                    } else {
                        asm("{ cvt.f32.f16 %0, %1; }" : "=f"(x[u][k]) : "h"(e[k]));
                    }
                }
                ld4<T>(res, off, rr[u]);
            }
        }
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (b0 + u >= nb) break;
            int c = (b0 + u) * BN + ec;
            float y[4];
            #pragma unroll
            for (int k = 0; k < 4; ++k) {
                float vv = x[u][k] + rr[u][k] + (lnb ? ldx(lnb, c + k, tlnb) : 0.0f);
                y[k] = (vv - mu) * inv * ldx(gamma, c + k, tg) + (beta ? ldx(beta, c + k, tbeta) : 0.0f);
            }
            st4<T>(out, rbase + c, y);
        }
    }
}

// A small matmul with its bias and activation: out = act(A W^T + bias),
// A [M, K] (row stride lda) and W [N, K] (a weight stored [out, in]) 16-bit
// of type T, out [M, N] of type T, bias any type (code tb; may be null).
// grid (N / BN, ceil(M / 16)), 128 threads, dynamic shared memory
// max((BN + 16)(K + 8), 128 (BN + 4)) * 2 bytes: the block's BN weight
// rows and 16 A rows, whole K (rows padded by 8: conflict-free ldmatrix).
// The weight rows are requested before the wait on the previous grids
// (programmatic dependent launch: a weight is written only by uploads,
// never by a kernel), so they load while the previous kernel finishes;
// then the A rows (zero-filled past M). The 4 warps split K in quarters
// on mma.m16n8k16, their partial tiles summed through shared memory;
// thread t writes row t / 8, columns (t % 8) BN / 8 .. + BN / 8 - 1.
// K % 64 == 0, N % BN == 0, A, W, out 16-byte aligned, lda % 8 == 0.
// Before sm_80 CUDA cores compute the tile from global memory.
template <int T, int BN>
__device__ __forceinline__ void gemm_pf_body(void* out, const void* a, const void* w,
                                             const void* bias, int M, int N, int K, int lda,
                                             int act, int tb) {
    extern __shared__ __align__(16) unsigned short dsm[];
    constexpr int EPT = BN / 8;
    const unsigned short* A = (const unsigned short*)a;
    const unsigned short* W = (const unsigned short*)w;
    int tid = threadIdx.x;
    int m0 = blockIdx.y * 16, n0 = blockIdx.x * BN;
    int er = tid >> 3, ec = (tid & 7) * EPT;
    float cv[EPT];
#if __CUDA_ARCH__ >= 800
    int lane = tid & 31, warp = tid >> 5;
    int LDK = K + 8, kv = K >> 3;
    unsigned short* sw = dsm;
    unsigned short* sa = dsm + BN * LDK;
    // Thread t copies 16-byte vectors t, t + 128, ... of the row-major
    // region; (row, vector) advance by (128 / kv, 128 % kv) with one carry,
    // not a division per vector (the copy loops dominated the instruction
    // count). The weight rows n0.. are contiguous in W.
    int dr = 128 / kv, dc = 128 - dr * kv;
    const unsigned short* Wt = W + (long long)n0 * K;
    unsigned sw0 = (unsigned)__cvta_generic_to_shared(sw);
    {
        int r = tid / kv, c = tid - (tid / kv) * kv;
        #pragma unroll 4
        for (int i = tid; i < BN * kv; i += 128) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                         :: "r"(sw0 + (unsigned)(r * LDK + c * 8) * 2u), "l"(Wt + (long long)i * 8));
            r += dr; c += dc;
            if (c >= kv) { c -= kv; ++r; }
        }
    }
    asm volatile("cp.async.commit_group;");
    RLX_GRID_WAIT();
    {
        unsigned sa0 = (unsigned)__cvta_generic_to_shared(sa);
        int r = tid / kv, c = tid - (tid / kv) * kv;
        #pragma unroll 2
        for (int i = tid; i < 16 * kv; i += 128) {
            int ok = (m0 + r < M) ? 16 : 0;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         :: "r"(sa0 + (unsigned)(r * LDK + c * 8) * 2u),
                            "l"(A + (long long)(ok ? m0 + r : 0) * lda + c * 8), "r"(ok));
            r += dr; c += dc;
            if (c >= kv) { c -= kv; ++r; }
        }
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    float acc[BN / 8][4];
    #pragma unroll
    for (int t = 0; t < BN / 8; ++t) { acc[t][0] = 0.0f; acc[t][1] = 0.0f; acc[t][2] = 0.0f; acc[t][3] = 0.0f; }
    int kq = K >> 2;
    for (int kk = warp * kq; kk < (warp + 1) * kq; kk += 16) {
        unsigned af[4];
        {
            int r = (lane & 7) + ((lane >> 3) & 1) * 8, c = kk + (lane >> 4) * 8;
            unsigned addr = (unsigned)__cvta_generic_to_shared(sa + r * LDK + c);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(af[0]), "=r"(af[1]), "=r"(af[2]), "=r"(af[3]) : "r"(addr));
        }
        #pragma unroll
        for (int q = 0; q < BN / 16; ++q) {
            int r = 16 * q + (lane & 7) + (lane >> 4) * 8, c = kk + ((lane >> 3) & 1) * 8;
            unsigned addr = (unsigned)__cvta_generic_to_shared(sw + r * LDK + c);
            unsigned bf[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3]) : "r"(addr));
            mma16816<T>(acc[2 * q], af, bf);
            mma16816<T>(acc[2 * q + 1], af, bf + 2);
        }
    }
    __syncthreads();  // every warp is done with sw and sa
    constexpr int RL = BN + 4;
    float* red = (float*)dsm;
    {
        int g = lane >> 2, t2 = (lane & 3) * 2;
        #pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            int c = t * 8 + t2;
            red[(warp * 16 + g) * RL + c] = acc[t][0];
            red[(warp * 16 + g) * RL + c + 1] = acc[t][1];
            red[(warp * 16 + g + 8) * RL + c] = acc[t][2];
            red[(warp * 16 + g + 8) * RL + c + 1] = acc[t][3];
        }
    }
    __syncthreads();
    #pragma unroll
    for (int j = 0; j < EPT; ++j) {
        float v = 0.0f;
        #pragma unroll
        for (int q = 0; q < 4; ++q) v += red[(q * 16 + er) * RL + ec + j];
        cv[j] = v;
    }
#else
    RLX_GRID_WAIT();
    for (int j = 0; j < EPT; ++j) cv[j] = 0.0f;
    if (m0 + er < M) {
        for (int k = 0; k < K; ++k) {
            float x = ldx(A, (long long)(m0 + er) * lda + k, T);
            for (int j = 0; j < EPT; ++j) cv[j] += x * ldx(W, (long long)(n0 + ec + j) * K + k, T);
        }
    }
#endif
    int row = m0 + er;
    if (row >= M) return;
    unsigned* o = (unsigned*)((unsigned short*)out + (long long)row * N + n0 + ec);
    #pragma unroll
    for (int j = 0; j < EPT; j += 2) {
        int c = n0 + ec + j;
        float x0 = act_apply(act, cv[j] + (bias ? ldx(bias, c, tb) : 0.0f));
        float x1 = act_apply(act, cv[j + 1] + (bias ? ldx(bias, c + 1, tb) : 0.0f));
        o[j >> 1] = pack2<T>(x0, x1);
    }
}

// pool_mean_x's column sums for columns 4 j .. 4 j + 3 over rows g, g +
// groups, ..: eight rows' loads in flight before their products (rows
// past S predicated off, not a serial tail).
template <int T>
__device__ __forceinline__ void pool_rows4(const void* x, const void* m, long long xb,
                                           long long mb, int S, int H, int j, int g,
                                           int groups, int tm, float* acc) {
    for (int s = g; s < S; s += 8 * groups) {
        float v[8][4], w[8];
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            int r = s + u * groups;
            w[u] = 0.0f;
            v[u][0] = 0.0f; v[u][1] = 0.0f; v[u][2] = 0.0f; v[u][3] = 0.0f;
            if (r < S) {
                ld4<T>(x, xb + (long long)r * H + 4 * j, v[u]);
                w[u] = ldx(m, mb + r, tm);
            }
        }
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[e] += v[u][e] * w[u];
        }
    }
}

extern "C" {

// One warp per output element (lanes split the reduced elements, then a
// warp reduction).
__global__ void reduce_warp_x(void* out, const void* x, const void* y, long long n_out,
                              const int* meta, int op, int bop, int to, int tx, int ty) {
    RedMeta m = red_meta(meta);
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= n_out) return;
    long long bx, by;
    red_base(m, w, &bx, &by);
    float acc = red_init(op);
    bool nan = false;
    if (m.nr == 1) {
        // One reduced axis: plain strided loads (no index decomposition).
        long long sx = m.rs[0], sy = m.rs2[0];
        for (long long j = lane; j < m.cnt; j += 32) {
            float v = ldx(x, bx + j * sx, tx);
            acc = red_step(op, acc, y ? bin_apply(bop, v, ldx(y, by + j * sy, ty)) : v, &nan);
        }
    } else {
        for (long long j = lane; j < m.cnt; j += 32)
            acc = red_step(op, acc, red_load(m, x, y, bx, by, j, bop, tx, ty), &nan);
    }
    acc = red_warp(op, acc);
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) {
        if (op == 1) acc /= (float)m.cnt;
        if (nan) acc = QNAN;
        stx(out, w, to, acc);
    }
}

// Reductions whose last kept axis is the source's contiguous last axis
// (a sum over the sequence of [b, s, h]): lane l of warp y takes output
// 32 blockIdx.x + l, so a warp's loads are consecutive, and the warps split
// the reduced elements; their partials combine through shared memory.
// blockDim 32 * RY with RY <= 8.
__global__ void reduce_cols_x(void* out, const void* x, const void* y, long long n_out,
                              const int* meta, int op, int bop, int to, int tx, int ty) {
    __shared__ float part[8][32];
    __shared__ bool part_nan[8][32];
    RedMeta m = red_meta(meta);
    int lane = threadIdx.x & 31, wy = threadIdx.x >> 5, ny = blockDim.x >> 5;
    long long w = (long long)blockIdx.x * 32 + lane;
    float acc = red_init(op);
    bool nan = false;
    if (w < n_out) {
        long long bx, by;
        red_base(m, w, &bx, &by);
        if (m.nr == 1) {
            // Eight elements' loads in flight before their arithmetic.
            long long sx = m.rs[0], sy = m.rs2[0];
            for (long long j0 = wy; j0 < m.cnt; j0 += 8 * ny) {
                float xs[8], ys[8];
                #pragma unroll
                for (int u = 0; u < 8; ++u) {
                    long long j = j0 + u * ny;
                    bool ok = j < m.cnt;
                    xs[u] = ok ? ldx(x, bx + j * sx, tx) : 0.0f;
                    ys[u] = ok && y ? ldx(y, by + j * sy, ty) : 0.0f;
                }
                #pragma unroll
                for (int u = 0; u < 8; ++u) {
                    if (j0 + u * ny < m.cnt)
                        acc = red_step(op, acc, y ? bin_apply(bop, xs[u], ys[u]) : xs[u], &nan);
                }
            }
        } else {
            for (long long j = wy; j < m.cnt; j += ny)
                acc = red_step(op, acc, red_load(m, x, y, bx, by, j, bop, tx, ty), &nan);
        }
    }
    part[wy][lane] = acc;
    part_nan[wy][lane] = nan;
    __syncthreads();
    if (wy != 0 || w >= n_out) return;
    for (int k = 1; k < ny; ++k) {
        acc = red_step(op, acc, part[k][lane], &nan);
        nan = nan || part_nan[k][lane];
    }
    if (op == 1) acc /= (float)m.cnt;
    if (nan) acc = QNAN;
    stx(out, w, to, acc);
}

// One block per output element (few outputs over many elements: the
// threads split the reduced elements, then warp and block reductions).
// blockDim a multiple of 32, at most 1024.
__global__ void reduce_block_x(void* out, const void* x, const void* y, long long n_out,
                               const int* meta, int op, int bop, int to, int tx, int ty) {
    __shared__ float part[32];
    __shared__ int part_nan[32];
    RedMeta m = red_meta(meta);
    long long w = blockIdx.x;
    if (w >= n_out) return;
    long long bx, by;
    red_base(m, w, &bx, &by);
    float acc = red_init(op);
    bool nan = false;
    if (m.nr == 1) {
        long long sx = m.rs[0], sy = m.rs2[0];
        for (long long j = threadIdx.x; j < m.cnt; j += blockDim.x) {
            float v = ldx(x, bx + j * sx, tx);
            acc = red_step(op, acc, y ? bin_apply(bop, v, ldx(y, by + j * sy, ty)) : v, &nan);
        }
    } else {
        for (long long j = threadIdx.x; j < m.cnt; j += blockDim.x)
            acc = red_step(op, acc, red_load(m, x, y, bx, by, j, bop, tx, ty), &nan);
    }
    acc = red_warp(op, acc);
    nan = __any_sync(0xffffffffu, nan);
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { part[wi] = acc; part_nan[wi] = nan; }
    __syncthreads();
    if (wi != 0) return;
    acc = red_warp(op, lane < nw ? part[lane] : red_init(op));
    nan = __any_sync(0xffffffffu, lane < nw && part_nan[lane]);
    if (lane == 0) {
        if (op == 1) acc /= (float)m.cnt;
        if (nan) acc = QNAN;
        stx(out, w, to, acc);
    }
}

// Softmax over the middle axis of [outer, n, inner]; one thread per (outer, inner).
__global__ void softmax_x(void* out, const void* x, long long outer, long long n,
                          long long inner, int to, int tx) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * inner) return;
    long long o = t / inner, in = t - o * inner;
    long long base = o * n * inner + in;
    float m = NEG_INF;
    for (long long j = 0; j < n; ++j) m = fmaxf(m, ldx(x, base + j * inner, tx));
    float s = 0.0f;
    for (long long j = 0; j < n; ++j) s += expf(ldx(x, base + j * inner, tx) - m);
    float inv = 1.0f / s;
    for (long long j = 0; j < n; ++j)
        stx(out, base + j * inner, to, expf(ldx(x, base + j * inner, tx) - m) * inv);
}

// 2-byte strided copy. meta: rank, dims[rank], strides[rank].
__global__ void strided_copy2(unsigned short* out, const unsigned short* src, long long n,
                              const int* meta) {
    int rank = meta[0];
    const int* dims = meta + 1;
    const int* st = dims + rank;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        long long r = i, o = 0;
        for (int d = rank - 1; d >= 0; --d) {
            long long c = r % dims[d];
            r /= dims[d];
            o += c * st[d];
        }
        out[i] = src[o];
    }
}

#define ATTN_X(NAME, DPL, R)                                                             \
__global__ void __launch_bounds__(128) NAME(                                            \
    const void* q, const void* k, const void* v, void* out,                             \
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,             \
    float scale, float softcap, int mkind, int window, const void* mask,                \
    int b0, int b1, int b2, int b3, int tq, int tk, int tv, int to) {                   \
    attention_x_body<DPL, R>(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, D, scale,   \
                             softcap, mkind, window, mask, b0, b1, b2, b3,              \
                             tq, tk, tv, to);                                           \
}
ATTN_X(attention_x_d32, 1, 8)
ATTN_X(attention_x_d64, 2, 8)
ATTN_X(attention_x_d128, 4, 4)
ATTN_X(attention_x_d32_r2, 1, 2)
ATTN_X(attention_x_d64_r2, 2, 2)
ATTN_X(attention_x_d128_r2, 4, 2)

// head_dim <= 256 (see attention_x_wide_body), R rows per warp.
#define ATTN_XW(NAME, R)                                                                 \
__global__ void __launch_bounds__(128) NAME(                                            \
    const void* q, const void* k, const void* v, void* out,                             \
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int D,             \
    float scale, float softcap, int mkind, int window, const void* mask,                \
    int b0, int b1, int b2, int b3, int tq, int tk, int tv, int to) {                   \
    attention_x_wide_body<R>(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, D, scale,   \
                             softcap, mkind, window, mask, b0, b1, b2, b3,              \
                             tq, tk, tv, to);                                           \
}
ATTN_XW(attention_x_d256, 4)
ATTN_XW(attention_x_d256_r2, 2)

#define ATTN_TC(NAME, D, T)                                                              \
__global__ void __launch_bounds__(128) NAME(                                            \
    const void* q, const void* k, const void* v, void* out,                             \
    int qs, int ks, int vs, int os, int Sq, int Sk, int Hq, int Hkv, int Dr,            \
    float scale, float softcap, int mkind, int window, const void* mask,                \
    int b0, int b1, int b2, int b3, int tq, int tk, int tv, int to) {                   \
    attention_tc_body<D, T>(q, k, v, out, qs, ks, vs, os, Sq, Sk, Hq, Hkv, Dr, scale,   \
                            softcap, mkind, window, mask, b0, b1, b2, b3,              \
                            tq, tk, tv, to);                                           \
}
ATTN_TC(attention_tc_d32_bf16, 32, 1)
ATTN_TC(attention_tc_d32_f16, 32, 2)
ATTN_TC(attention_tc_d64_bf16, 64, 1)
ATTN_TC(attention_tc_d64_f16, 64, 2)


#define NORM_W(NAME, T, P, NC, G)                                                       \
__global__ void NAME(void* out, const void* x, const void* res, const void* bias,       \
                     const void* gamma, const void* beta, int rows, int d, float eps,   \
                     int rms, const void* x2, long long n2, int t2, const void* xi,     \
                     const void* ri, long long vx, long long vr, int ix64, int ir64,    \
                     int txt, int trt, int* status, int nx, int nr) {                   \
    norm_warp_body<T, P, NC, G>(out, x, res, bias, gamma, beta, rows, d, eps, rms, x2,   \
                                n2, t2, xi, ri, vx, vr, ix64, ir64, txt, trt, status,   \
                                nx, nr);                                                \
}
NORM_W(norm_warp_f32_f32_4, 0, 0, 4, 0)
NORM_W(norm_warp_bf16_f32_4, 1, 0, 4, 0)
NORM_W(norm_warp_bf16_bf16_4, 1, 1, 4, 0)
NORM_W(norm_warp_f16_f32_4, 2, 0, 4, 0)
NORM_W(norm_warp_f16_f16_4, 2, 2, 4, 0)
NORM_W(norm_warp_f32_f32_4_g, 0, 0, 4, 1)
NORM_W(norm_warp_bf16_f32_4_g, 1, 0, 4, 1)
NORM_W(norm_warp_bf16_bf16_4_g, 1, 1, 4, 1)
NORM_W(norm_warp_f16_f32_4_g, 2, 0, 4, 1)
NORM_W(norm_warp_f16_f16_4_g, 2, 2, 4, 1)
NORM_W(norm_warp_f32_f32_8, 0, 0, 8, 0)
NORM_W(norm_warp_bf16_f32_8, 1, 0, 8, 0)
NORM_W(norm_warp_bf16_bf16_8, 1, 1, 8, 0)
NORM_W(norm_warp_f16_f32_8, 2, 0, 8, 0)
NORM_W(norm_warp_f16_f16_8, 2, 2, 8, 0)
NORM_W(norm_warp_f32_f32_8_g, 0, 0, 8, 1)
NORM_W(norm_warp_bf16_f32_8_g, 1, 0, 8, 1)
NORM_W(norm_warp_bf16_bf16_8_g, 1, 1, 8, 1)
NORM_W(norm_warp_f16_f32_8_g, 2, 0, 8, 1)
NORM_W(norm_warp_f16_f16_8_g, 2, 2, 8, 1)

// Rows of a table gathered by ids, one warp per id: lane l moves values
// 4 (32 c + l) .. + 3 of the row (table type tt, out type to; row % 4 == 0,
// both 4-element aligned). An id outside [0, vocab) zeroes its row and
// records node + 1 in the status word.
__global__ void gather_rows_x(void* out, const void* table, const void* ids, long long n_ids,
                              int row, long long vocab, int idx64, int* status, int node,
                              int to, int tt) {
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= n_ids) return;
    long long id = idx64 ? ((const long long*)ids)[r] : (long long)((const int*)ids)[r];
    bool bad = id < 0 || id >= vocab;
    if (bad && lane == 0) atomicCAS(status, 0, node + 1);
    for (int c = lane * 4; c < row; c += 128) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (!bad) {
            long long i = id * row + c;
            if (tt == 0) ld4<0>(table, i, v);
            else if (tt == 1) ld4<1>(table, i, v);
            else ld4<2>(table, i, v);
        }
        long long o = r * row + c;
        if (to == 0) st4<0>(out, o, v);
        else if (to == 1) st4<1>(out, o, v);
        else st4<2>(out, o, v);
    }
}

// Masked mean pooling over axis 1, then (l2 != 0) an L2 normalization,
// one block per batch row b (see fuse_pool.rs): x [B, S, H] of type tx,
// m and c B x S masks (types tm, tc: m multiplies, c is counted);
// mean[j] = sum_s x[b, s, j] m[b, s] / max(sum_s c[b, s], tiny), and
// out[b, j] = mean[j] / max(sqrt(sum_j mean[j]^2), eps), or mean[j].
// The block is `groups` row groups of blockDim / groups threads: thread
// (g, col) sums rows g, g + groups, .. of column items col, col + cols, ..
// (with v4 an item is 4 columns read by one vector load: H % 4 == 0, x
// aligned to 4 elements; else one column). One block reads all S H values,
// so the loads must overlap: many groups, several rows in flight each.
// Dynamic shared memory: groups * H column sums, then 33 floats.
__global__ void pool_mean_x(void* out, const void* x, const void* m, const void* c, int S,
                            int H, float tiny, float eps, int l2, int groups, int v4, int to,
                            int tx, int tm, int tc) {
    extern __shared__ float pool_sm[];
    float* part = pool_sm;
    float* red = pool_sm + groups * H;
    int cols = blockDim.x / groups;
    int g = threadIdx.x / cols, col = threadIdx.x - g * cols;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    long long b = blockIdx.x, xb = b * S * H, mb = b * S;
    if (v4) {
        for (int j = col; j < H / 4; j += cols) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (tx == 0) pool_rows4<0>(x, m, xb, mb, S, H, j, g, groups, tm, acc);
            else if (tx == 1) pool_rows4<1>(x, m, xb, mb, S, H, j, g, groups, tm, acc);
            else pool_rows4<2>(x, m, xb, mb, S, H, j, g, groups, tm, acc);
            #pragma unroll
            for (int e = 0; e < 4; ++e) part[g * H + 4 * j + e] = acc[e];
        }
    } else {
        for (int j = col; j < H; j += cols) {
            float acc = 0.0f;
            for (int s = g; s < S; s += 4 * groups) {
                float v[4], w[4];
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    int r = s + u * groups;
                    v[u] = r < S ? ldx(x, xb + (long long)r * H + j, tx) : 0.0f;
                    w[u] = r < S ? ldx(m, mb + r, tm) : 0.0f;
                }
                #pragma unroll
                for (int u = 0; u < 4; ++u) acc += v[u] * w[u];
            }
            part[g * H + j] = acc;
        }
    }
    if (warp == 0) {
        float n = 0.0f;
        for (int s = lane; s < S; s += 32) n += ldx(c, mb + s, tc);
        n = warp_sum(n);
        if (lane == 0) red[32] = bin_apply(RLX_BIN_MAX, n, tiny);
    }
    __syncthreads();
    float cnt = red[32], ss = 0.0f;
    // Column j's mean stays with the thread that will store it.
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float v = 0.0f;
        for (int q = 0; q < groups; ++q) v += part[q * H + j];
        v = v / cnt;
        if (l2) part[j] = v;
        else stx(out, b * H + j, to, v);
        ss += v * v;
    }
    if (!l2) return;
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < nw; ++w) tot += red[w];
    float norm = bin_apply(RLX_BIN_MAX, sqrtf(tot), eps);
    for (int j = threadIdx.x; j < H; j += blockDim.x) stx(out, b * H + j, to, part[j] / norm);
}

#define GEMM_LN(NAME, T)                                                                  \
__global__ void __launch_bounds__(128) NAME(                                               \
    void* out, const void* a, const void* w, const void* bias, const void* res,           \
    const void* lnb, const void* gamma, const void* beta, int M, int N, int K, int lda,   \
    float eps, int tb, int tlnb, int tg, int tbeta, float* stats, int* counters) {        \
    gemm_ln_body<T>(out, a, w, bias, res, lnb, gamma, beta, M, N, K, lda, eps, tb, tlnb,  \
                    tg, tbeta, stats, counters);                                          \
}
GEMM_LN(gemm_ln_bf16, 1)
GEMM_LN(gemm_ln_f16, 2)

#define GEMM_PF(NAME, T, BN)                                                                \
__global__ void __launch_bounds__(128) RLX_OWN_GRID_DEP NAME(                               \
    void* out, const void* a, const void* w, const void* bias, int M, int N, int K,        \
    int lda, int act, int tb) {                                                            \
    RLX_GRID_LAUNCH();                                                                     \
    gemm_pf_body<T, BN>(out, a, w, bias, M, N, K, lda, act, tb);                           \
}
GEMM_PF(gemm_pf_bf16_16, 1, 16)
GEMM_PF(gemm_pf_bf16_32, 1, 32)
GEMM_PF(gemm_pf_bf16_64, 1, 64)
GEMM_PF(gemm_pf_f16_16, 2, 16)
GEMM_PF(gemm_pf_f16_32, 2, 32)
GEMM_PF(gemm_pf_f16_64, 2, 64)

} // extern "C"
