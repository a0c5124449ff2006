// Where bytes sit: the shared-memory tile layout every kernel uses, and the host's packing of the weights into it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TRTFUSE_RCONV_HD __host__ __device__ __forceinline__
#else
#define TRTFUSE_RCONV_HD inline
#endif

namespace trtfuse {
namespace rconv {

// Shared-memory tiles of x, weights and residual/output are [slab][row][2 halves of 16 bytes] (a slab: 32 channels,
// or 32 k bytes). A row's two 16-byte halves are swapped on rows 4..7 mod 8: ldmatrix reads 8 rows x 16 bytes and a
// 32-byte row pitch would put rows i and i+4 on the same banks; the swap makes each 8-row read conflict-free (and
// the epilogue's 4-byte accesses, 8 rows x 4 lanes, too). It is also exactly wgmma's canonical K-major 32-byte
// swizzle (ptx_sm90.cuh: smem_desc), and TMA's CU_TENSOR_MAP_SWIZZLE_32B (out_map.h).
TRTFUSE_RCONV_HD int swz_offset(int slab, int rows, int row, int byte_in_slab) {
    int half = (byte_in_slab >> 4) ^ ((row >> 2) & 1);
    return ((slab * rows + row) << 5) + (half << 4) + (byte_in_slab & 15);
}

// The channel whose weights packed row `row` holds. Rows are permuted within each 16-channel group so that packed
// row t*8 + 2*tig + e holds channel 4*tig + 2*t + e (t, e in {0,1}, tig in 0..3): an m16n8 accumulator fragment
// (mma.sync's C, and wgmma's per n8 chunk) gives lane (g, tig) columns 2*tig + e of n8 tiles t = 0, 1, so with
// this order the lane owns 4 CONSECUTIVE channels of each 16-channel group, and the epilogue reads and writes them
// as one 32-bit word (epilogue.cuh).
inline int packed_row_channel(int row) {
    int const p = row & 15, t = p >> 3, tig = (p & 7) >> 1, e = p & 1;
    return (row & ~15) + 4 * tig + 2 * t + e;
}

// Params::w_img for the sm90 kernel (slices of bn rows): the packed weights w [npad][kpad] (row pitch kpad) as that
// kernel's weight slices in shared memory, one after the other: N block nb at nb * bn * kpad, [kpad / 32 chunks][bn
// rows][32 bytes] (swz_offset). A slice's k chunk then is one contiguous run, which one bulk copy moves.
inline void pack_weight_slices(int8_t const* w, int npad, int kpad, int bn, int8_t* img) {
    for (int nb = 0; nb < npad / bn; ++nb) {
        int8_t* slice = img + static_cast<int64_t>(nb) * bn * kpad;
        for (int row = 0; row < bn; ++row)
            for (int k = 0; k < kpad; ++k)
                slice[swz_offset(k >> 5, bn, row, k & 31)] = w[static_cast<int64_t>(nb * bn + row) * kpad + k];
    }
}

}  // namespace rconv
}  // namespace trtfuse
