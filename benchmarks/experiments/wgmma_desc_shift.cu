// Does wgmma read an int8 A tile whose shared-memory descriptor starts s rows (of 32 bytes) into a 32-byte-swizzled
// buffer? The 3x3 halo kernel (plugins/residual_conv/kernel3x3_sm90.cuh) relies on it: each tap is the same halo box
// under a descriptor started dy * (W + 2) + dx rows later. One wgmma m64n64k32 per shift s = 0..19, against the
// integer product; three descriptor variants:
//   0: 32-byte swizzle, base offset 0 (what the kernel uses)
//   1: 32-byte swizzle, base offset (start >> 7) & 7
//   2: no swizzle, the tile as two 16-byte planes (LBO = plane size, SBO = 128)
// Prints the mismatching outputs per shift (0 everywhere = reads right).
//   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -I plugins -o wgmma_desc_shift benchmarks/experiments/wgmma_desc_shift.cu
// H100 (2026-11-24): variant 0 and 2 exact at every shift; variant 1 wrong at shifts 4-7 and 12-15.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#include "conv_int8/core/ptx_sm90.cuh"   // the library's wgmma wrappers
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)

__device__ uint64_t desc(uint32_t a, uint32_t lbo, uint32_t sbo, uint32_t base_off, uint32_t layout) {
    return (uint64_t)((a >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) |
           ((uint64_t)(base_off & 7) << 49) | ((uint64_t)layout << 62);
}
__host__ __device__ int8_t aval(int q, int k) { return (int8_t)((q * 7 + k * 13 + (q * k) % 11) % 23 - 11); }
__host__ __device__ int8_t bval(int n, int k) { return (int8_t)((n * 5 + k * 3 + (n ^ k)) % 19 - 9); }

// variant 0: 32B swizzle, base_offset 0; 1: 32B swizzle, base_offset (start >> 7) & 7; 2: no swizzle, 16-byte planes
__global__ void k(int s, int variant, int* bad) {
    extern __shared__ __align__(1024) int8_t smem[];
    int8_t* A = smem;                  // 512 rows x 32 (or two planes of 512 x 16)
    int8_t* B = smem + 512 * 32;       // 64 rows x 32, 32B swizzle
    int t = threadIdx.x;
    for (int i = t; i < 512 * 32; i += 128) {
        int q = i / 32, kk = i % 32;
        int off = variant < 2 ? q * 32 + ((((kk >> 4) ^ ((q >> 2) & 1))) << 4) + (kk & 15)
                              : (kk >> 4) * (512 * 16) + q * 16 + (kk & 15);
        A[off] = aval(q, kk);
    }
    for (int i = t; i < 64 * 32; i += 128) {
        int n = i / 32, kk = i % 32;
        B[n * 32 + ((((kk >> 4) ^ ((n >> 2) & 1))) << 4) + (kk & 15)] = bval(n, kk);
    }
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    uint32_t a0 = (uint32_t)__cvta_generic_to_shared(A), b0 = (uint32_t)__cvta_generic_to_shared(B);
    uint64_t da, db = desc(b0, 16, 256, 0, 3);
    if (variant == 0) da = desc(a0 + s * 32, 16, 256, 0, 3);
    else if (variant == 1) da = desc(a0 + s * 32, 16, 256, ((a0 + s * 32) >> 7) & 7, 3);
    else da = desc(a0 + s * 16, 512 * 16, 128, 0, 0);
    int d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0;
    using namespace trtfuse::rconv;
    wgmma_fence();
    wgmma_m64n64k32_s8(d, da, db, 1);
    wgmma_commit();
    wgmma_wait<0>();
    int w = t >> 5, lane = t & 31, g = lane >> 2, tig = lane & 3, nb = 0;
    for (int j = 0; j < 32; ++j) {
        int c = j >> 2, h = (j >> 1) & 1, e = j & 1;
        int row = 16 * w + g + 8 * h, col = 8 * c + 2 * tig + e;
        int ref = 0;
        for (int kk = 0; kk < 32; ++kk) ref += aval(row + s, kk) * bval(col, kk);
        nb += ref != d[j];
    }
    atomicAdd(bad, nb);
}

int main() {
    int* bad;
    CK(cudaMalloc(&bad, 4));
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    for (int v = 0; v < 3; ++v) {
        printf("variant %d:", v);
        for (int s = 0; s < 20; ++s) {
            CK(cudaMemset(bad, 0, 4));
            k<<<1, 128, 32 * 1024>>>(s, v, bad);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            int h;
            CK(cudaMemcpy(&h, bad, 4, cudaMemcpyDeviceToHost));
            printf(" s%d:%d", s, h);
        }
        printf("\n");
    }
    return 0;
}
