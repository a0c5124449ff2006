// The int8 kCHW32 global average pool (avgpool.h). One warp per (image, 32-channel slab): the slab's hw x 32 bytes
// are contiguous, and lane l reads word l % 8 (channels 4 (l % 8) .. + 3) of pixel l / 8 + 4 k, so each warp load is
// 128 contiguous bytes; the four pixel lanes of a word then add up by two shuffles. The op reads each input byte
// once and writes 4 bytes per channel: bound by DRAM (205 MB per batch of 2048 at ResNet-50's layer4).
#include <cmath>
#include <cstdint>
#include <cuda_runtime.h>

#include "avgpool/avgpool.h"

namespace trtfuse {
namespace avgpool {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
avgpool_int8_kernel(int8_t const* __restrict__ x, float* __restrict__ out, int n, int c, int hw, float x_scale) {
    int const slabs = (c + 31) / 32;
    int64_t const item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (item >= static_cast<int64_t>(n) * slabs) return;   // whole warps leave together
    int const lane = threadIdx.x & 31, word = lane & 7;
    uint32_t const* src = reinterpret_cast<uint32_t const*>(x + item * hw * 32) + word;
    int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int px = lane >> 3; px < hw; px += 4) {
        uint32_t const v = __ldg(src + px * 8);
        s0 += static_cast<int8_t>(v & 0xff);
        s1 += static_cast<int8_t>((v >> 8) & 0xff);
        s2 += static_cast<int8_t>((v >> 16) & 0xff);
        s3 += static_cast<int8_t>(v >> 24);
    }
#pragma unroll
    for (int off = 8; off < 32; off *= 2) {   // lanes word, word + 8, + 16, + 24: the same channels
        s0 += __shfl_xor_sync(0xffffffffu, s0, off);
        s1 += __shfl_xor_sync(0xffffffffu, s1, off);
        s2 += __shfl_xor_sync(0xffffffffu, s2, off);
        s3 += __shfl_xor_sync(0xffffffffu, s3, off);
    }
    if (lane >= 8) return;
    int64_t const img = item / slabs;
    int const ch0 = static_cast<int>(item - img * slabs) * 32 + 4 * word;
    float const inv = static_cast<float>(hw);
    int const sums[4] = {s0, s1, s2, s3};
#pragma unroll
    for (int e = 0; e < 4; ++e)
        if (ch0 + e < c) out[img * c + ch0 + e] = __fdiv_rn(__fmul_rn(static_cast<float>(sums[e]), x_scale), inv);
}

}  // namespace
}  // namespace avgpool
}  // namespace trtfuse

extern "C" int trtfuse_avgpool_int8_forward(void const* x, float* out, int n, int c, int hw, float x_scale,
                                            void* stream) {
    using namespace trtfuse::avgpool;
    if (!x || !out) return TRTFUSE_AVGPOOL_ERR_NULL;
    // |sum| <= 128 hw stays exact in int32 and in fp32 (below 2^24)
    if (n <= 0 || c <= 0 || hw <= 0 || hw > (1 << 16)) return TRTFUSE_AVGPOOL_ERR_SHAPE;
    if (!std::isfinite(x_scale) || !(x_scale > 0.f)) return TRTFUSE_AVGPOOL_ERR_SCALE;
    if ((reinterpret_cast<uintptr_t>(x) & 15) || (reinterpret_cast<uintptr_t>(out) & 3)) return TRTFUSE_AVGPOOL_ERR_ALIGN;
    int64_t const items = static_cast<int64_t>(n) * ((c + 31) / 32);
    int64_t const blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks >= (int64_t(1) << 31)) return TRTFUSE_AVGPOOL_ERR_SHAPE;
    avgpool_int8_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<int8_t const*>(x), out, n, c, hw, x_scale);
    return static_cast<int>(cudaGetLastError());
}

extern "C" char const* trtfuse_avgpool_error_string(int status) {
    switch (status) {
        case 0: return "ok";
        case TRTFUSE_AVGPOOL_ERR_NULL: return "x and out must not be null";
        case TRTFUSE_AVGPOOL_ERR_SHAPE: return "n, c and hw must be positive, hw at most 65536";
        case TRTFUSE_AVGPOOL_ERR_SCALE: return "x_scale must be finite and > 0";
        case TRTFUSE_AVGPOOL_ERR_ALIGN: return "x must be 16-byte aligned and out 4-byte aligned";
        default: return status > 0 ? cudaGetErrorString(static_cast<cudaError_t>(status)) : "unknown status";
    }
}
