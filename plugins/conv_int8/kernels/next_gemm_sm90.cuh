// The chained next conv of the sm90 1x1 kernel (conv_kernel_sm90 with NEXT_N > 0; kernels/conv1x1_sm90.cuh has the
// dataflow): the next bottleneck's 1x1 GEMM (K = the tail's <= 256 output channels, N = NEXT_N of 64 or 128) from the
// tail's output words, still in registers, as wgmma A fragments (RS); its weights are one slice in shared memory.
#pragma once
#include <cstdint>

#include "conv_int8/core/epilogue.cuh"
#include "conv_int8/core/params.h"
#include "conv_int8/core/ptx_sm90.cuh"

namespace trtfuse {
namespace rconv {

// the largest K a chained next conv may have (its K padded to 128); its weight slice is zero padded to this K and takes
// NEXT_N x this many bytes of shared memory
constexpr int kNextMaxK = 256;

// NI: the tail's N tile / 8 (its output words of 16-channel group j are the A fragments of k32 step j / 2).
template <int NEXT_N, int NI>
struct WgwNextGemm {
    // A tile's next conv, in two steps: issue starts its wgmmas into acc2 from the A fragments `a` (the tail's output
    // words; first: this consumer's first tile, which waits for the next conv's weights on w2_full), finish waits for
    // them and writes this warp's 16 rows from wm0 (g, tig: the thread's fragment row and column group). The tile's
    // output store is issued in between.
    static constexpr int HALVES = NEXT_N > 0 ? NEXT_N / 64 : 1;   // m64n64 wgmmas per k32 step
    __device__ __forceinline__ static void issue(Params const& p, uint32_t w2_full, int8_t* sW2,
                                                 uint32_t const (&a)[NI / 2][2], int (&acc2)[HALVES][1][32],
                                                 bool first) {
        if (first) mbar_wait(w2_full, 0);
        int const init2 = p.next_rule.small_acc ? kMagicBits : 0;
#pragma unroll
        for (int hh = 0; hh < HALVES; ++hh)
#pragma unroll
            for (int i = 0; i < 32; ++i) acc2[hh][0][i] = init2;
        uint64_t const descW2 = smem_desc(smem_u32(sW2));
        wgmma_fence();   // the A registers and accumulators were just written
        // Every k32 step, with no branch between the wgmmas: past the layer's channels both the words and the
        // weights are 0 (trtfuse_next_attach pads the slice to kNextMaxK). A branch on K here cost 1.5-5.8 % of the
        // chained layer1 nodes (docs/residual_conv.md, Version 22); under NH 2 one on a warpgroup's half of K made
        // ptxas serialize every wgmma of the kernel (C7520).
#pragma unroll
        for (int ks = 0; ks < kNextMaxK / 32; ++ks) {
            uint32_t const frag[4] = {a[2 * ks][0], a[2 * ks][1], a[2 * ks + 1][0], a[2 * ks + 1][1]};
#pragma unroll
            for (int hh = 0; hh < HALVES; ++hh)
                wgmma_m64n64k32_s8_rs(acc2[hh][0], frag, descW2 + ((ks * NEXT_N * 32 + hh * 64 * 32) >> 4), 1);
        }
        wgmma_commit();
    }
    __device__ __forceinline__ static void finish(Params const& p, int (&acc2)[HALVES][1][32], int wm0, int g,
                                                  int tig) {
        wgmma_wait<0>();
        // rows wm0 + g and + 8 of next_out, the word of channels c .. c + 3 at (slab c / 32, byte c % 32)
        int64_t const next_slab = static_cast<int64_t>(p.HW) * 32;
        int8_t* rows[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int const m = wm0 + g + 8 * h;
            int const img = p.hw_div.div(min(m, p.M - 1)), hw = m - img * p.HW;
            rows[h] = m < p.M ? p.next_out + (static_cast<int64_t>(img) * p.next_nc * p.HW + hw) * 32 : nullptr;
        }
#pragma unroll
        for (int hh = 0; hh < HALVES; ++hh)
            epilogue_fragment<16, 1, 8, false, false>(
                acc2[hh], p.next_rule, nullptr, g, tig, hh * 64, [&](int j, int, int h, uint32_t word) {
                    int const ch = hh * 64 + 16 * j + 4 * tig;
                    if (rows[h] && (ch >> 5) < p.next_nc)
                        *reinterpret_cast<uint32_t*>(rows[h] + (ch >> 5) * next_slab + (ch & 31)) = word;
                });
    }
};

}  // namespace rconv
}  // namespace trtfuse
