// Microbenchmark: int8 wgmma m64n256k32 rate from shared memory by operand swizzle mode (32/64/128 B), with 1 or 2
// warpgroups per SM and no loads (zeroed operands; only the rate matters). Shows whether the kernels' 32-byte
// swizzle limits the tensor cores (docs/residual_conv.md, Version 9; output: `git show 74e77f2:benchmarks/results/logs/wgmma_rate_h100.log`).
//   nvcc -std=c++17 -O3 -arch=sm_90a -Iplugins -o /tmp/wgmma_rate benchmarks/experiments/wgmma_rate.cu && /tmp/wgmma_rate
#include <cstdio>
#include <cstdint>
#include "conv_int8/core/ptx_sm90.cuh"
using namespace trtfuse::rconv;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint64_t mkdesc(uint32_t saddr, int lt, int sbo) {
    return static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (uint64_t(1) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
           (static_cast<uint64_t>(lt) << 62);
}
// SW: 32, 64 or 128 (swizzle bytes = the row pitch of one k block); a stage = 4 k32 steps (128 K bytes)
template <int SW>
__global__ void __launch_bounds__(256, 1) bench(int* sink, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) int8_t sm[];
    for (int i = threadIdx.x; i < 80 * 1024 / 16; i += blockDim.x) reinterpret_cast<int4*>(sm)[i] = make_int4(0, 0, 0, 0);
    fence_proxy_async_smem();
    __syncthreads();
    int const wg = threadIdx.x / 128;
    uint32_t const a0 = smem_u32(sm) + wg * 8192, b0 = smem_u32(sm) + 16384;
    constexpr int LT = SW == 128 ? 1 : SW == 64 ? 2 : 3;
    constexpr int SBO = SW * 8;
    int acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0;
    for (int it = 0; it < iters; ++it) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            // k step k: SW 128: +32 B inside the row; SW 64: block k/2, +32 B; SW 32: block k
            uint32_t ao = SW == 128 ? k * 32 : SW == 64 ? (k >> 1) * 64 * 64 + (k & 1) * 32 : k * 64 * 32;
            uint32_t bo = SW == 128 ? k * 32 : SW == 64 ? (k >> 1) * 256 * 64 + (k & 1) * 32 : k * 256 * 32;
            wgmma_m64n256k32_s8(acc, mkdesc(a0 + ao, LT, SBO), mkdesc(b0 + bo, LT, SBO));
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    int s = 0;
#pragma unroll
    for (int i = 0; i < 128; ++i) s += acc[i];
    if (s == 12345) sink[threadIdx.x] = s;
#endif
}

int main() {
    int* sink;
    CK(cudaMalloc(&sink, 4096));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto run = [&](auto kern, char const* name, int wgs) -> int {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 80 * 1024));
        int iters = 4000;
        kern<<<sms, wgs * 128, 80 * 1024>>>(sink, 100);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e0));
        kern<<<sms, wgs * 128, 80 * 1024>>>(sink, iters);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        double ops = 2.0 * 64 * 256 * 32 * 4 * double(iters) * wgs * sms;
        printf("swizzle %-4s warpgroups %d: %.3f ms, %.0f int8 TOPS\n", name, wgs, ms, ops / ms / 1e9);
        return 0;
    };
    for (int wgs = 1; wgs <= 2; ++wgs) {
        if (run(bench<32>, "32B", wgs) || run(bench<64>, "64B", wgs) || run(bench<128>, "128B", wgs)) return 1;
    }
    return 0;
}
