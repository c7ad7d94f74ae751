// DequantMatMul kernels on packed GGUF blocks (see the `quant` module). Self-contained:
// compiled by NVRTC as its own module.
// Scheme ids: 0 Q4_0 (18-byte blocks), 1 Q4_1 (20), 2 Q8_0 (34), 3 Q5_0 (22), 4 Q5_1 (24):
// 32 weights a block; 5 Q4_K (144), 6 Q5_K (176), 7 Q6_K (210): 256 weights a super-block.
// Every scheme splits its blocks into units of 8 weights in two runs of 4 (at dq_off_a and
// dq_off_c), which is what the GEMV loads and dots; the tiled GEMM decodes 8 consecutive
// weights of a 32-weight column instead (dq_slice).

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
template <> struct Scheme<3> { static const int BYTES = 22; };
template <> struct Scheme<4> { static const int BYTES = 24; };
template <> struct Scheme<5> { static const int BYTES = 144; };
template <> struct Scheme<6> { static const int BYTES = 176; };
template <> struct Scheme<7> { static const int BYTES = 210; };
// Weights per block.
template <int S> __device__ __forceinline__ int dq_elems() { return S >= 5 ? 256 : 32; }

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
// Q4_K/Q5_K unit t: bytes 4(t%8).. of qs chunk t/8, low nibbles at 64(t/8) + 4(t%8), high 32
// further. Q6_K unit t: half t/16, ql part (t/8)%2, l0 = 4(t%8): low nibbles at 128 half +
// 32 part + l0, high 64 further.
template <int S> __device__ __forceinline__ int dq_off_a(int t) {
    if (S == 2) return 8 * t;
    if (S == 5 || S == 6) return 64 * (t >> 3) + 4 * (t & 7);
    if (S == 7) return 128 * (t >> 4) + 32 * ((t >> 3) & 1) + 4 * (t & 7);
    return 4 * t;
}
template <int S> __device__ __forceinline__ int dq_off_c(int t) {
    if (S == 2) return 8 * t + 4;
    if (S == 5 || S == 6) return dq_off_a<S>(t) + 32;
    if (S == 7) return dq_off_a<S>(t) + 64;
    return 16 + 4 * t;
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block, from its 12 scale bytes
// held as three little-endian words.
__device__ __forceinline__ void dq_k_scale_min(const unsigned int sc[3], int j, float* s, float* m) {
    auto byte = [&](int i) { return (sc[i >> 2] >> (8 * (i & 3))) & 0xffu; };
    if (j < 4) {
        *s = (float)(byte(j) & 63u);
        *m = (float)(byte(j + 4) & 63u);
    } else {
        *s = (float)((byte(j + 4) & 0xfu) | ((byte(j - 4) >> 6) << 4));
        *m = (float)((byte(j + 4) >> 4) | ((byte(j) >> 6) << 4));
    }
}

// The raw words of unit t of a block: the f16 scale (Q4_1: scale and
// minimum) and its 4 (Q8_0: 8) bytes of quants. Loading is split from the
// arithmetic so that a warp issues all its loads before it waits on any.
// K-quants also carry their scale words (s0..s2): Q4_K/Q5_K the 12 scale bytes, Q6_K the two
// 8-bit scales of the unit's runs.
struct DqRaw { unsigned int h, q0, q1, s0, s1, s2; };

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
    } else if (S == 3) {
        r.h = *(const unsigned short*)blk;
        r.q0 = dq_u32_a2(blk + 6 + 4 * t);
        r.q1 = dq_u32_a2(blk + 2);
    } else if (S == 4) {
        r.h = *(const unsigned int*)blk;
        r.q0 = *(const unsigned int*)(blk + 8 + 4 * t);
        r.q1 = *(const unsigned int*)(blk + 4);
    } else if (S == 5 || S == 6) {
        const unsigned int* w = (const unsigned int*)blk;
        r.h = w[0];
        r.s0 = w[1]; r.s1 = w[2]; r.s2 = w[3];
        int c = t >> 3, j = 4 * (t & 7);
        if (S == 5) {
            r.q0 = *(const unsigned int*)(blk + 16 + 32 * c + j);
        } else {
            r.q0 = *(const unsigned int*)(blk + 48 + 32 * c + j);
            r.q1 = *(const unsigned int*)(blk + 16 + j);
        }
    } else if (S == 7) {
        int h = t >> 4, p = (t >> 3) & 1, l0 = 4 * (t & 7);
        r.q0 = dq_u32_a2(blk + 64 * h + 32 * p + l0);
        r.q1 = dq_u32_a2(blk + 128 + 32 * h + l0);
        int ia = 8 * h + 2 * p + (l0 >> 4);
        r.s0 = (unsigned int)blk[192 + ia] | ((unsigned int)blk[192 + ia + 4] << 8);
        r.h = *(const unsigned short*)(blk + 208);
    } else {
        r.h = *(const unsigned short*)blk;
        r.q0 = dq_u32_a2(blk + 2 + 4 * t);
        r.q1 = 0;
    }
    return r;
}

// Dot of a unit with its activations (a at dq_off_a, c at dq_off_c).
template <int S>
__device__ __forceinline__ float dq_raw_dot(DqRaw w, int t, float4 a, float4 c) {
    if (S == 2) {
        float d = dq_h2f((unsigned short)w.h);
        unsigned int q0 = w.q0, q1 = w.q1;
        float s = (float)(signed char)(q0) * a.x + (float)(signed char)(q0 >> 8) * a.y
                + (float)(signed char)(q0 >> 16) * a.z + (float)(signed char)(q0 >> 24) * a.w
                + (float)(signed char)(q1) * c.x + (float)(signed char)(q1 >> 8) * c.y
                + (float)(signed char)(q1 >> 16) * c.z + (float)(signed char)(q1 >> 24) * c.w;
        return s * d;
    } else if (S == 3 || S == 4) {
        // 5-bit: qh bit i is weight i's fifth bit; unit t holds weights 4t.. and 16+4t..
        float d, m;
        if (S == 4) {
            d = dq_h2f((unsigned short)(w.h & 0xffffu));
            m = dq_h2f((unsigned short)(w.h >> 16));
        } else {
            d = dq_h2f((unsigned short)w.h);
            m = -16.0f * d;
        }
        unsigned int q = w.q0, ha = w.q1 >> (4 * t), hc = w.q1 >> (16 + 4 * t);
        float qa[4], qc[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            qa[i] = (float)(((q >> (8 * i)) & 0xfu) | (((ha >> i) & 1u) << 4));
            qc[i] = (float)(((q >> (8 * i + 4)) & 0xfu) | (((hc >> i) & 1u) << 4));
        }
        float sq = qa[0] * a.x + qa[1] * a.y + qa[2] * a.z + qa[3] * a.w
                 + qc[0] * c.x + qc[1] * c.y + qc[2] * c.z + qc[3] * c.w;
        float sx = (a.x + a.y) + (a.z + a.w) + (c.x + c.y) + (c.z + c.w);
        return d * sq + m * sx;
    } else if (S == 5 || S == 6) {
        // Runs a and c are sub-blocks 2(t/8) and 2(t/8)+1: weight = d s q - dmin m.
        float d = dq_h2f((unsigned short)(w.h & 0xffffu)), dmin = dq_h2f((unsigned short)(w.h >> 16));
        unsigned int sc[3] = {w.s0, w.s1, w.s2};
        int sub = 2 * (t >> 3);
        float sa, ma, sc1, mc;
        dq_k_scale_min(sc, sub, &sa, &ma);
        dq_k_scale_min(sc, sub + 1, &sc1, &mc);
        unsigned int q = w.q0;
        float qa[4], qc[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned int lo = (q >> (8 * i)) & 0xfu, hi = (q >> (8 * i + 4)) & 0xfu;
            if (S == 6) {
                unsigned int hb = w.q1 >> (8 * i);
                lo |= ((hb >> sub) & 1u) << 4;
                hi |= ((hb >> (sub + 1)) & 1u) << 4;
            }
            qa[i] = (float)lo;
            qc[i] = (float)hi;
        }
        float pa = qa[0] * a.x + qa[1] * a.y + qa[2] * a.z + qa[3] * a.w;
        float pc = qc[0] * c.x + qc[1] * c.y + qc[2] * c.z + qc[3] * c.w;
        float xa = (a.x + a.y) + (a.z + a.w), xc = (c.x + c.y) + (c.z + c.w);
        return (d * sa) * pa - (dmin * ma) * xa + (d * sc1) * pc - (dmin * mc) * xc;
    } else if (S == 7) {
        // Q6_K: q = (4 bits of ql | 2 bits of qh) - 32, weight = d * scale * q; run a takes qh
        // bits 2p, run c bits 2p + 4.
        float d = dq_h2f((unsigned short)w.h);
        int p = (t >> 3) & 1;
        float qa[4], qc[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned int l = w.q0 >> (8 * i), hb = w.q1 >> (8 * i);
            qa[i] = (float)((int)((l & 0xfu) | (((hb >> (2 * p)) & 3u) << 4)) - 32);
            qc[i] = (float)((int)(((l >> 4) & 0xfu) | (((hb >> (2 * p + 4)) & 3u) << 4)) - 32);
        }
        float pa = qa[0] * a.x + qa[1] * a.y + qa[2] * a.z + qa[3] * a.w;
        float pc = qc[0] * c.x + qc[1] * c.y + qc[2] * c.z + qc[3] * c.w;
        float sa = (float)(signed char)(w.s0 & 0xffu), sc2 = (float)(signed char)(w.s0 >> 8);
        return (d * sa) * pa + (d * sc2) * pc;
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
    const int upb = dq_elems<S>() / 8;
    int nb = K / dq_elems<S>(), units = nb * upb;
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
                int b = u / upb, t = u % upb;
                int ka = dq_elems<S>() * b + dq_off_a<S>(t), kc = dq_elems<S>() * b + dq_off_c<S>(t);
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
                int t = (base + lane + 32 * j) % upb;
                #pragma unroll
                for (int r = 0; r < R; ++r)
                    if (R == 1 || n0 + r < N) acc[r] += dq_raw_dot<S>(wr[j][r], t, a, c);
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

// Part wt (0..3) of the 32-weight column b of a weight row: 8 weights and their positions
// (0..31) in the column. Q4_0/Q4_1/Q8_0 by dq_unit; the others decode weights 8wt..8wt+7 as
// rlx_formats::quant::dequantize does.
template <int S>
__device__ __forceinline__ void dq_slice(const unsigned char* row, int b, int wt, float w[8], int k[8]) {
    if (S <= 2) {
        dq_unit<S>(row + (long long)b * Scheme<S>::BYTES, wt, w, k);
        return;
    }
    #pragma unroll
    for (int i = 0; i < 8; ++i) k[i] = 8 * wt + i;
    if (S == 3 || S == 4) {
        const unsigned char* blk = row + (long long)b * Scheme<S>::BYTES;
        float d = dq_h2f(*(const unsigned short*)blk);
        float m = S == 4 ? dq_h2f(*(const unsigned short*)(blk + 2)) : -16.0f * d;
        unsigned int qh = dq_u32_a2(blk + (S == 4 ? 4 : 2));
        const unsigned char* qs = blk + (S == 4 ? 8 : 6);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            int e = 8 * wt + i, j = e & 15;
            unsigned int q = e < 16 ? (qs[j] & 0xfu) : (qs[j] >> 4);
            q |= ((qh >> e) & 1u) << 4;
            w[i] = (float)q * d + m;
        }
        return;
    }
    const unsigned char* blk = row + (long long)(b >> 3) * Scheme<S>::BYTES;
    int sub = b & 7;
    if (S == 5 || S == 6) {
        const unsigned int* hw = (const unsigned int*)blk;
        unsigned int sc[3] = {hw[1], hw[2], hw[3]};
        float s, mn;
        dq_k_scale_min(sc, sub, &s, &mn);
        float d1 = dq_h2f((unsigned short)(hw[0] & 0xffffu)) * s;
        float m1 = dq_h2f((unsigned short)(hw[0] >> 16)) * mn;
        const unsigned char* qs = blk + (S == 5 ? 16 : 48) + 32 * (sub >> 1);
        int shift = 4 * (sub & 1);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            int l = 8 * wt + i;
            unsigned int q = (qs[l] >> shift) & 0xfu;
            if (S == 6) q |= ((blk[16 + l] >> sub) & 1u) << 4;
            w[i] = d1 * (float)q - m1;
        }
        return;
    }
    // Q6_K
    float d = dq_h2f(*(const unsigned short*)(blk + 208));
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        int e = 32 * sub + 8 * wt + i, half = e >> 7, r = e & 127;
        unsigned int lo = (blk[64 * half + (r & 63)] >> (4 * (r >> 6))) & 0xfu;
        unsigned int hi = (blk[128 + 32 * half + (r & 31)] >> (2 * (r >> 5))) & 3u;
        float sc = (float)(signed char)blk[192 + (e >> 4)];
        w[i] = d * sc * (float)((int)(lo | (hi << 4)) - 32);
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
    long long rb = (long long)(K / dq_elems<S>()) * Scheme<S>::BYTES;
    int wn = tid >> 2, wt = tid & 3;
    for (int b = 0; b < nb; ++b) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            int idx = tid + 256 * i, row = idx >> 5, kk = idx & 31;
            Xs[kk][row] = (m0 + row < M) ? x[(long long)(m0 + row) * K + 32 * b + kk] : 0.0f;
        }
        float wv[8];
        int wk[8];
        dq_slice<S>(w + (long long)min(n0 + wn, N - 1) * rb, b, wt, wv, wk);
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
DQ(dq_gemv_q5_0, 3, 1)
DQ(dq_gemv_q5_1, 4, 1)
DQ(dq_gemv_q4_k, 5, 1)
DQ(dq_gemv_q5_k, 6, 1)
DQ(dq_gemv_q6_k, 7, 1)
DQ(dq_gemv_q5_0_r4, 3, 4)
DQ(dq_gemv_q5_1_r4, 4, 4)
DQ(dq_gemv_q4_k_r4, 5, 4)
DQ(dq_gemv_q5_k_r4, 6, 4)
DQ(dq_gemv_q6_k_r4, 7, 4)
} // extern "C"

extern "C" __global__ void __launch_bounds__(256) dq_gemm_q4_0(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<0>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q4_1(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<1>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q8_0(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<2>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q5_0(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<3>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q5_1(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<4>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q4_k(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<5>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q5_k(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<6>(y, x, w, M, N, K); }
extern "C" __global__ void __launch_bounds__(256) dq_gemm_q6_k(float* y, const float* x, const unsigned char* w, int M, int N, int K) { dq_gemm<7>(y, x, w, M, N, K); }
