// The int8 kCHW32 global average pool into hi and lo (avgpool.h). One warp per (image, 32-channel slab): the slab's
// hw x 32 bytes are contiguous, and lane l reads word l % 8 (channels 4 (l % 8) .. + 3) of pixel l / 8 + 4 k, so each
// warp load is 128 contiguous bytes; the four pixel lanes of a word then add up by two shuffles, and each of lanes 0-7
// rounds its four sums to m (1/256 LSB, round_mean256) and splits each into hi and lo (split_hi_lo). The op reads each
// input byte once and writes 2 bytes per channel: bound by DRAM (205 MB per batch of 2048 at ResNet-50's layer4).
#include <cstdint>
#include <cuda_runtime.h>

#include "avgpool/avgpool.h"

namespace trtfuse {
namespace avgpool {
namespace {

constexpr int kWarpsPerBlock = 8;

// m = the nearest integer to 256 sum / hw, ties to even (avgpool.h), exactly: 256 sum reaches 2^31 (|sum| <= 128 hw,
// hw <= 65536), so 64-bit integers. Floor division (q, r with 0 <= r < hw, also for a negative sum), then up by one
// where 2 r > hw, or 2 r == hw and q is odd; clamped to [-32768, 32512] (a no-op for the sums an int8 tensor has).
// Host too: trtfuse_avgpool_round_mean256 (tests check it against exact fractions without a GPU).
__host__ __device__ __forceinline__ int round_mean256(int sum, int hw) {
    int64_t const num = static_cast<int64_t>(sum) * 256;
    int64_t q = num / hw, r = num - q * hw;   // C++ division truncates toward zero: r has the sign of num
    if (r < 0) {
        q -= 1;
        r += hw;
    }
    q += (2 * r > hw || (2 * r == hw && (q & 1))) ? 1 : 0;
    return q < -32768 ? -32768 : (q > 32512 ? 32512 : static_cast<int>(q));
}

// hi = floor((m + 128) / 256), lo = m - 256 hi, both in [-128, 127] for m in [-32768, 32512]. m + 128 + 32768 >= 128 is
// positive, so its truncating division is the floor (no shift of a negative number).
__host__ __device__ __forceinline__ void split_hi_lo(int m, int8_t& hi, int8_t& lo) {
    int const h = (m + 128 + 32768) / 256 - 128;
    hi = static_cast<int8_t>(h);
    lo = static_cast<int8_t>(m - 256 * h);
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
avgpool_int8_kernel(int8_t const* __restrict__ x, int8_t* __restrict__ hi, int8_t* __restrict__ lo, int n, int c,
                    int hw) {
    int const slabs = (c + 31) / 32;
    int64_t const item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (item >= static_cast<int64_t>(n) * slabs) return;   // whole warps leave together
    int const lane = threadIdx.x & 31, word = lane & 7;
    uint32_t const* src = reinterpret_cast<uint32_t const*>(x + item * hw * 32) + word;
    int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    // Unrolled so that four loads are in flight per lane: at batch 1 a few dozen warps each walk their slab (49
    // pixels at layer4), one L2 round trip after another without it (H200, batch 1: 16 us against TensorRT's 11).
#pragma unroll 4
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
    int const sums[4] = {s0, s1, s2, s3};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if (ch0 + e < c) {
            int8_t h, l;
            split_hi_lo(round_mean256(sums[e], hw), h, l);
            hi[img * c + ch0 + e] = h;
            lo[img * c + ch0 + e] = l;
        }
    }
}

}  // namespace
}  // namespace avgpool
}  // namespace trtfuse

extern "C" int trtfuse_avgpool_int8_forward(void const* x, int8_t* hi, int8_t* lo, int n, int c, int hw,
                                            void* stream) {
    using namespace trtfuse::avgpool;
    if (!x || !hi || !lo) return TRTFUSE_AVGPOOL_ERR_NULL;
    // |sum| <= 128 hw <= 2^23 stays exact in int32; 256 sum is taken in 64 bits (round_mean256)
    if (n <= 0 || c <= 0 || hw <= 0 || hw > (1 << 16)) return TRTFUSE_AVGPOOL_ERR_SHAPE;
    if (reinterpret_cast<uintptr_t>(x) & 15) return TRTFUSE_AVGPOOL_ERR_ALIGN;   // hi, lo: bytes, any alignment
    int64_t const items = static_cast<int64_t>(n) * ((c + 31) / 32);
    int64_t const blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks >= (int64_t(1) << 31)) return TRTFUSE_AVGPOOL_ERR_SHAPE;
    avgpool_int8_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<int8_t const*>(x), hi, lo, n, c, hw);
    return static_cast<int>(cudaGetLastError());
}

extern "C" int trtfuse_avgpool_round_mean256(int sum, int hw, int8_t* hi, int8_t* lo) {
    int const m = hw <= 0 || hw > (1 << 16) ? 0 : trtfuse::avgpool::round_mean256(sum, hw);
    int8_t h, l;
    trtfuse::avgpool::split_hi_lo(m, h, l);   // m = 0: hi = lo = 0
    if (hi) *hi = h;
    if (lo) *lo = l;
    return m;
}

extern "C" char const* trtfuse_avgpool_error_string(int status) {
    switch (status) {
        case 0: return "ok";
        case TRTFUSE_AVGPOOL_ERR_NULL: return "x, hi and lo must not be null";
        case TRTFUSE_AVGPOOL_ERR_SHAPE: return "n, c and hw must be positive, hw at most 65536";
        case TRTFUSE_AVGPOOL_ERR_ALIGN: return "x must be 16-byte aligned";
        default: return status > 0 ? cudaGetErrorString(static_cast<cudaError_t>(status)) : "unknown status";
    }
}
