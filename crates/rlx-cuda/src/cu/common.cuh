// The shared prelude of the rlx kernel modules `kernels.cu` and `mixed.cu` and of
// the generated (fused) kernels: type conversion (type codes 0 f32, 1 bf16,
// 2 f16), the activation and binary-op functions, warp and block reductions. No
// CUDA headers are needed: the 16-bit conversions are written out (bf16 by bit
// arithmetic, f16 by `cvt`).
//
// rlx-cuda expands the `#include`s below itself before NVRTC sees the source
// (`cu/mod.rs`); `ops.cuh` is generated from the op-code table in `opcodes.rs`
// (a test keeps the checked-in copy equal to it, for builds with nvcc).
#ifndef RLX_COMMON_CUH
#define RLX_COMMON_CUH

#include "grid_dep.cuh"

#define NEG_INF (__int_as_float(0xff800000))
#define QNAN (__int_as_float(0x7fffffff))

// Type codes: 0 f32, 1 bf16, 2 f16.
__device__ __forceinline__ float ldx(const void* p, long long i, int t) {
    if (t == 0) return ((const float*)p)[i];
    unsigned short h = ((const unsigned short*)p)[i];
    if (t == 1) return __uint_as_float(((unsigned int)h) << 16);
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2bf(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ void stx(void* p, long long i, int t, float v) {
    if (t == 0) { ((float*)p)[i] = v; return; }
    unsigned short h;
    if (t == 1) h = f2bf(v);
    else asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(v));
    ((unsigned short*)p)[i] = h;
}

#include "ops.cuh"

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}

#endif // RLX_COMMON_CUH
