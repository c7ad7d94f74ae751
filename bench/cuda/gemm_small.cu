// Small-M bf16 matmul microbenchmark for the H200 (MiniLM's four matmul
// shapes at 128 rows): cuBLASLt (every heuristic candidate) against a
// split-K kernel family whose K slices are a thread-block cluster, reduced
// through distributed shared memory. Each configuration is timed as a CUDA
// graph of 20 back-to-back launches, replayed; the figure is microseconds
// per launch (median of 5 replays of 100 graphs). Each rlx configuration
// also runs with parts switched off (`mode`: loads only, no cross-slice
// reduction, no global loads, TMA bulk loads instead of cp.async) and
// without the cluster launch attribute, to show where its time goes. Also
// timed: empty kernels (the per-launch floor, with clusters, dynamic shared
// memory and programmatic launch) and the host side of one inference (n
// small pinned copies in, one kernel, m copies out, stream sync).
// Also timed: rlx's own small-matmul kernels (`gemm_pf_bf16_*`, the ones the
// CUDA backend ships: crates/rlx-cuda/src/cu/mixed.cu is #included below, so
// this file benchmarks the real kernel source, not a copy).
// Results and what they mean: bench/results/gpu_h200.md.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o gemm_small bench/cuda/gemm_small.cu -lcublasLt
//   ./gemm_small
//
// out[M, N] = A[M, K] W[N, K]^T + bias[N], all bf16, f32 accumulation.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

// The rlx kernels themselves (with their prelude, common.cuh).
#include "../../crates/rlx-cuda/src/cu/mixed.cu"

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)
#define CL(x)                                                                        \
    do {                                                                             \
        cublasStatus_t e = (x);                                                      \
        if (e != CUBLAS_STATUS_SUCCESS) {                                            \
            printf("cuBLASLt error %d at %s:%d\n", (int)e, __FILE__, __LINE__);      \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

__global__ void empty_kernel(int* p) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && p[0] == 12345) p[1] = 1;
}

__global__ void empty_dyn(int* p) {
    extern __shared__ int sm[];
    if (threadIdx.x == 0 && blockIdx.x == 0 && p[0] == 12345) { sm[0] = 1; p[1] = sm[0]; }
}

__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// grid (N / BN, KS, ceil(M / BM)), cluster (1, KS, 1), BM / 16 warps: block
// (x, y) computes rows BM z.., columns BN x.. over K slice y (K / KS wide),
// warp w rows 16 w..16 w + 15 over all BN columns. The KS partial tiles meet
// in distributed shared memory: cluster rank r sums rows r BM / KS.. of all
// KS tiles, adds the bias, stores bf16. PDL: the weight slice is requested
// before griddepcontrol.wait.
template <int BM, int BN, int KS>
__global__ void __launch_bounds__(BM * 2) gemm_ks(__nv_bfloat16* out, const __nv_bfloat16* a,
                                                  const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                                  int M, int N, int K, int mode) {
    extern __shared__ __align__(16) unsigned char ks_dsm[];
    constexpr int NT = BM * 2;
    const unsigned short* A = (const unsigned short*)a;
    const unsigned short* W = (const unsigned short*)w;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int ks = K / KS, kv = ks >> 3, ld = ks + 8;
    int n0 = blockIdx.x * BN, k0 = blockIdx.y * ks, m0 = blockIdx.z * BM;
    unsigned short* sa = (unsigned short*)ks_dsm;
    unsigned short* sw = sa + BM * ld;
    float* red = (float*)(sw + BN * ld);
    constexpr int RL = BN + 4;
    asm volatile("griddepcontrol.launch_dependents;");
    if (mode == 4) {
        // One bulk copy (TMA, 1-D) per row, completing on an mbarrier.
        __shared__ __align__(8) unsigned long long bar;
        unsigned ba = (unsigned)__cvta_generic_to_shared(&bar);
        int arows = min(BM, M - m0);
        if (tid == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(ba));
            asm volatile("fence.mbarrier_init.release.cluster;");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ba),
                         "r"((unsigned)((BN + arows) * ks * 2)));
        }
        __syncthreads();
        unsigned sw0 = (unsigned)__cvta_generic_to_shared(sw);
        for (int r = tid; r < BN; r += NT)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             sw0 + (unsigned)(r * ld) * 2u),
                         "l"(W + (long long)(n0 + r) * K + k0), "r"(ks * 2), "r"(ba)
                         : "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
        unsigned sa0 = (unsigned)__cvta_generic_to_shared(sa);
        for (int r = tid; r < arows; r += NT)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             sa0 + (unsigned)(r * ld) * 2u),
                         "l"(A + (long long)(m0 + r) * K + k0), "r"(ks * 2), "r"(ba)
                         : "memory");
        for (int v = arows * kv + tid; v < BM * kv; v += NT) {  // rows past M: zeros
            int r = v / kv, c = v - r * kv;
            *(uint4*)(sa + r * ld + c * 8) = make_uint4(0u, 0u, 0u, 0u);
        }
        unsigned done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(ba) : "memory");
    } else {
    unsigned sw0 = (unsigned)__cvta_generic_to_shared(sw);
    for (int v = tid; mode != 3 && v < BN * kv; v += NT) {
        int r = v / kv, c = v - r * kv;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sw0 + (unsigned)(r * ld + c * 8) * 2u),
                     "l"(W + (long long)(n0 + r) * K + k0 + c * 8));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned sa0 = (unsigned)__cvta_generic_to_shared(sa);
    for (int v = tid; mode != 3 && v < BM * kv; v += NT) {
        int r = v / kv, c = v - r * kv;
        int ok = (m0 + r < M) ? 16 : 0;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa0 + (unsigned)(r * ld + c * 8) * 2u),
                     "l"(A + (long long)(ok ? m0 + r : 0) * K + k0 + c * 8), "r"(ok));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();
    float acc[BN / 8][4];
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (int kk = 0; mode != 1 && kk < ks; kk += 16) {
        unsigned af[4];
        {
            int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = kk + (lane >> 4) * 8;
            unsigned addr = (unsigned)__cvta_generic_to_shared(sa + r * ld + c);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(af[0]), "=r"(af[1]), "=r"(af[2]), "=r"(af[3])
                         : "r"(addr));
        }
#pragma unroll
        for (int q = 0; q < BN / 16; ++q) {
            int r = 16 * q + (lane & 7) + (lane >> 4) * 8, c = kk + ((lane >> 3) & 1) * 8;
            unsigned addr = (unsigned)__cvta_generic_to_shared(sw + r * ld + c);
            unsigned bf[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3])
                         : "r"(addr));
            mma_bf16(acc[2 * q], af, bf);
            mma_bf16(acc[2 * q + 1], af, bf + 2);
        }
    }
    if (mode == 2) {  // timing only: no cross-slice reduction
        int g = lane >> 2, t2 = (lane & 3) * 2, row = m0 + warp * 16 + g;
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            int c = n0 + t * 8 + t2;
            if (row < M) *(__nv_bfloat162*)&out[(long long)row * N + c] = __floats2bfloat162_rn(acc[t][0], acc[t][1]);
            if (row + 8 < M) *(__nv_bfloat162*)&out[(long long)(row + 8) * N + c] = __floats2bfloat162_rn(acc[t][2], acc[t][3]);
        }
        return;
    }
    {
        int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            int c = t * 8 + t2;
            *(float2*)&red[(warp * 16 + g) * RL + c] = make_float2(acc[t][0], acc[t][1]);
            *(float2*)&red[(warp * 16 + g + 8) * RL + c] = make_float2(acc[t][2], acc[t][3]);
        }
    }
    cluster_sync();
    constexpr int RPR = BM / KS;  // rows reduced per rank
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    unsigned red0 = (unsigned)__cvta_generic_to_shared(red);
    for (int p = tid; p < RPR * BN / 2; p += NT) {
        int r = rank * RPR + p / (BN / 2), c = (p % (BN / 2)) * 2;
        unsigned off = red0 + (unsigned)(r * RL + c) * 4u;
        float2 part[KS];
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            unsigned ra;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(off), "r"(s));
            asm volatile("ld.shared::cluster.v2.f32 {%0,%1}, [%2];" : "=f"(part[s].x), "=f"(part[s].y) : "r"(ra));
        }
        float x = 0.0f, y = 0.0f;
#pragma unroll
        for (int s = 0; s < KS; ++s) { x += part[s].x; y += part[s].y; }
        int row = m0 + r;
        if (row < M) {
            x += __bfloat162float(bias[n0 + c]);
            y += __bfloat162float(bias[n0 + c + 1]);
            *(__nv_bfloat162*)&out[(long long)row * N + n0 + c] = __floats2bfloat162_rn(x, y);
        }
    }
    cluster_sync();  // peers may still read this block's tile
}

struct Cfg {
    int bm, bn, ks;
    void (*f)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, int);
};
#define C(bm, bn, ks) Cfg{bm, bn, ks, gemm_ks<bm, bn, ks>}
static Cfg CFGS[] = {C(64, 32, 4), C(64, 64, 8), C(128, 32, 8), C(64, 32, 1), C(16, 16, 1), C(32, 16, 1)};

static float time_graph(cudaStream_t s, const std::function<void()>& launch) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i) launch();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> v;
    for (int r = 0; r < 5; ++r) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < 100; ++i) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        v.push_back(ms * 1000.0f / 2000.0f);
    }
    std::sort(v.begin(), v.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return v[2];
}

int main() {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int* dummy;
    CK(cudaMalloc(&dummy, 64));
    CK(cudaMemset(dummy, 0, 64));
    printf("empty kernel: %.2f us/launch\n", time_graph(s, [&] { empty_kernel<<<1, 32, 0, s>>>(dummy); }));
    printf("empty kernel 132x256: %.2f us/launch\n", time_graph(s, [&] { empty_kernel<<<132, 256, 0, s>>>(dummy); }));
    auto ex = [&](const char* name, void (*f)(int*), dim3 grid, size_t smem, int cy, int pdl) {
        cudaLaunchAttribute at[2];
        int n = 0;
        if (cy) {
            at[n].id = cudaLaunchAttributeClusterDimension;
            at[n].val.clusterDim.x = 1;
            at[n].val.clusterDim.y = cy;
            at[n].val.clusterDim.z = 1;
            ++n;
        }
        if (pdl) {
            at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[n].val.programmaticStreamSerializationAllowed = 1;
            ++n;
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cfg.attrs = at;
        cfg.numAttrs = n;
        printf("%-44s %.2f us/launch\n", name,
               time_graph(s, [&] { CK(cudaLaunchKernelEx(&cfg, f, dummy)); }));
    };
    CK(cudaFuncSetAttribute(empty_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10));
    ex("empty Ex 96 blocks", empty_kernel, dim3(96), 0, 0, 0);
    ex("empty Ex 96 blocks, cluster 1", empty_kernel, dim3(96), 0, 1, 0);
    ex("empty Ex 12x8 blocks, cluster 1x8", empty_kernel, dim3(12, 8), 0, 8, 0);
    ex("empty Ex 24x4 blocks, cluster 1x4", empty_kernel, dim3(24, 4), 0, 4, 0);
    ex("empty Ex 96 blocks, PDL", empty_kernel, dim3(96), 0, 0, 1);
    ex("empty dyn 64 KB, 96 blocks", empty_dyn, dim3(96), 64 << 10, 0, 0);
    ex("empty dyn 16 KB, 96 blocks", empty_dyn, dim3(96), 16 << 10, 0, 0);
    ex("empty dyn 64 KB, 12x8 blocks, cluster 1x8", empty_dyn, dim3(12, 8), 64 << 10, 8, 0);
    ex("empty dyn 64 KB, 96 blocks, PDL", empty_dyn, dim3(96), 64 << 10, 0, 1);
    {
        // The host side of one inference: n_in pinned->device copies, one
        // kernel, n_out device->pinned copies, stream sync (wall clock).
        unsigned char *hin, *hout, *din;
        CK(cudaMallocHost(&hin, 1 << 16));
        CK(cudaMallocHost(&hout, 1 << 16));
        CK(cudaMalloc(&din, 1 << 16));
        auto io = [&](int n_in, int n_out) {
            std::vector<double> v;
            for (int r = 0; r < 2000; ++r) {
                auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < n_in; ++i) CK(cudaMemcpyAsync(din + 4096 * i, hin + 4096 * i, 1024, cudaMemcpyHostToDevice, s));
                empty_kernel<<<96, 128, 0, s>>>(dummy);
                for (int i = 0; i < n_out; ++i) CK(cudaMemcpyAsync(hout + 4096 * i, din + 4096 * i, i == 0 ? 1536 : 4, cudaMemcpyDeviceToHost, s));
                CK(cudaStreamSynchronize(s));
                v.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(v.begin(), v.end());
            printf("io: %d H2D + kernel + %d D2H + sync: median %.2f us\n", n_in, n_out, v[v.size() / 2]);
        };
        for (int rep = 0; rep < 2; ++rep) { io(0, 0); io(1, 1); io(3, 2); io(1, 2); io(3, 1); }
    }
    cublasLtHandle_t lt;
    CL(cublasLtCreate(&lt));
    void* ws;
    size_t wsz = 32 << 20;
    CK(cudaMalloc(&ws, wsz));
    const int M = 128;
    int shapes[4][2] = {{1152, 384}, {384, 384}, {1536, 384}, {384, 1536}};
    for (auto& sh : shapes) {
        int N = sh[0], K = sh[1];
        std::vector<__nv_bfloat16> ha((size_t)M * K), hw((size_t)N * K), hb(N);
        srand(7);
        for (auto& x : ha) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f));
        for (auto& x : hw) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f) * 0.1f);
        for (auto& x : hb) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f));
        __nv_bfloat16 *da, *dw, *db, *dref, *dout;
        CK(cudaMalloc(&da, ha.size() * 2));
        CK(cudaMalloc(&dw, hw.size() * 2));
        CK(cudaMalloc(&db, hb.size() * 2));
        CK(cudaMalloc(&dref, (size_t)M * N * 2));
        CK(cudaMalloc(&dout, (size_t)M * N * 2));
        CK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        // cuBLASLt, column-major view: D^T [N, M] = op_T(W as [K, N]) x A^T [K, M].
        cublasLtMatmulDesc_t op;
        CL(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        CL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
        CL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db, sizeof(db)));
        cublasLtMatrixLayout_t la, lb, lc;
        CL(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
        CL(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
        CL(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
        cublasLtMatmulPreference_t pref;
        CL(cublasLtMatmulPreferenceCreate(&pref));
        CL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof(wsz)));
        cublasLtMatmulHeuristicResult_t res[16];
        int nres = 0;
        CL(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &nres));
        float one = 1.0f, zero = 0.0f;
        float best = 1e9;
        int besti = -1;
        for (int i = 0; i < nres; ++i) {
            float t = time_graph(s, [&] {
                CL(cublasLtMatmul(lt, op, &one, dw, la, da, lb, &zero, dref, lc, dref, lc, &res[i].algo, ws, wsz, s));
            });
            if (i == 0) printf("M=%d N=%d K=%d cuBLASLt heuristic #0: %.2f us\n", M, N, K, t);
            if (t < best) { best = t; besti = i; }
        }
        printf("M=%d N=%d K=%d cuBLASLt best of %d: %.2f us (#%d)\n", M, N, K, nres, best, besti);
        // rlx's gemm_pf (bias, no activation), each column tile that fits
        // (as crates/rlx-cuda/src/mixed.rs gemm_pf_smem / GEMM_PF_SMEM_MAX).
        {
            struct Pf { int bn; const void* f; } pfs[3] = {
                {16, (const void*)gemm_pf_bf16_16}, {32, (const void*)gemm_pf_bf16_32}, {64, (const void*)gemm_pf_bf16_64}};
            for (auto& pf : pfs) {
                size_t smem = std::max((size_t)(pf.bn + 16) * (K + 8) * 2, (size_t)4 * 16 * (pf.bn + 4) * 4);
                if (N % pf.bn || smem > 99 * 1024) continue;
                CK(cudaFuncSetAttribute(pf.f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(N / pf.bn, (M + 15) / 16, 1);
                cfg.blockDim = dim3(128);
                cfg.dynamicSmemBytes = smem;
                cfg.stream = s;
                int act = RLX_ACT_IDENTITY, tbias = 1;
                auto launch = [&] {
                    void* args[] = {(void*)&dref, (void*)&da, (void*)&dw, (void*)&db, (void*)&M, (void*)&N,
                                    (void*)&K, (void*)&K, (void*)&act, (void*)&tbias};
                    CK(cudaLaunchKernelExC(&cfg, pf.f, args));
                };
                printf("M=%d N=%d K=%d rlx gemm_pf_bf16_%d: %.2f us\n", M, N, K, pf.bn, time_graph(s, launch));
            }
        }
        CL(cublasLtMatmul(lt, op, &one, dw, la, da, lb, &zero, dref, lc, dref, lc, &res[0].algo, ws, wsz, s));
        CK(cudaStreamSynchronize(s));
        std::vector<__nv_bfloat16> href((size_t)M * N), hout((size_t)M * N);
        CK(cudaMemcpy(href.data(), dref, href.size() * 2, cudaMemcpyDeviceToHost));
        for (auto& c : CFGS) {
            if (N % c.bn || K % (c.ks * 16) || c.bm / c.ks < 1) continue;
            int ks = K / c.ks;
            size_t smem = (size_t)(c.bm + c.bn) * (ks + 8) * 2 + (size_t)c.bm * (c.bn + 4) * 4;
            if (smem > 227 * 1024) continue;
            CK(cudaFuncSetAttribute(c.f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            if (c.ks > 8) CK(cudaFuncSetAttribute(c.f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
            // (pdl, mode, cluster attribute)
            int runs[9][3] = {{0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {0, 2, 1}, {0, 3, 1}, {0, 4, 1}, {1, 4, 1},
                              {0, 0, 0}, {0, 3, 0}};
            for (int pm = 0; pm < (c.ks == 1 ? 9 : 7); ++pm) {
                int pdl = runs[pm][0], mode = runs[pm][1];
                bool clus = runs[pm][2];
                cudaLaunchAttribute at[2];
                at[0].id = cudaLaunchAttributeClusterDimension;
                at[0].val.clusterDim.x = 1;
                at[0].val.clusterDim.y = c.ks;
                at[0].val.clusterDim.z = 1;
                at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[1].val.programmaticStreamSerializationAllowed = 1;
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(N / c.bn, c.ks, (M + c.bm - 1) / c.bm);
                cfg.blockDim = dim3(c.bm * 2);
                cfg.dynamicSmemBytes = smem;
                cfg.stream = s;
                cfg.attrs = at;
                cfg.attrs = clus ? at : at + 1;
                cfg.numAttrs = (clus ? 1 : 0) + (pdl ? 1 : 0);
                CK(cudaMemset(dout, 0, (size_t)M * N * 2));
                cudaError_t e = cudaLaunchKernelEx(&cfg, c.f, dout, (const __nv_bfloat16*)da,
                                                   (const __nv_bfloat16*)dw, (const __nv_bfloat16*)db, M, N, K, mode);
                if (e != cudaSuccess) {
                    printf("  ks %dx%dx%d: launch failed: %s\n", c.bm, c.bn, c.ks, cudaGetErrorString(e));
                    cudaGetLastError();
                    break;
                }
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(hout.data(), dout, hout.size() * 2, cudaMemcpyDeviceToHost));
                float md = 0.0f;
                for (size_t i = 0; i < hout.size(); ++i)
                    md = std::max(md, fabsf(__bfloat162float(hout[i]) - __bfloat162float(href[i])));
                float t = time_graph(s, [&] {
                    CK(cudaLaunchKernelEx(&cfg, c.f, dout, (const __nv_bfloat16*)da, (const __nv_bfloat16*)dw,
                                          (const __nv_bfloat16*)db, M, N, K, mode));
                });
                if (mode && mode != 4) md = 0.0f;
                const char* mn[] = {"full", "loads only", "no reduce", "no loads", "bulk"};
                printf("  %-10s%s BM=%3d BN=%3d KS=%2d pdl=%d blocks=%4d smem=%6zu: %.2f us  max|diff|=%.4f\n", mn[mode], clus ? "" : " nocluster", c.bm,
                       c.bn, c.ks, pdl, (N / c.bn) * c.ks * ((M + c.bm - 1) / c.bm), smem, t, md);
            }
        }
        cudaFree(da); cudaFree(dw); cudaFree(db); cudaFree(dref); cudaFree(dout);
    }
    return 0;
}
