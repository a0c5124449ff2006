// Which tiles each block of a wgw_* launch (residual_conv_wgmma_ws.cuh) computes: the host picks the schedule
// (wgw_schedule), the kernel walks it (WgwTiles). Both live here so that they cannot drift apart.
//
// A block keeps a weight slice (one N block) in shared memory, so the plain schedule gives every N block the same
// number of "regular" blocks, each walking the N block's 64-row M tiles with a stride (the blocks that share an x
// tile then run it at about the same time: L2 hits). When the N blocks do not divide the GPU's block slots (res5: 8
// N blocks on 132 SMs), the slots left over become "extra" blocks: each regular block stops after `quota` tiles and
// the extra blocks share the M tiles past that (of every N block, in N-major order), reloading the weight slice
// where their run crosses into the next N block. res5 at batch 256: 1,568 tiles, 128 regular blocks would take 13
// tiles (7 rounds of their two consumers); with 4 extra blocks every block takes at most 12.
#pragma once
#include <cstdint>

namespace trtfuse {
namespace rconv {

#if defined(__CUDACC__)
#define TRTFUSE_HD __host__ __device__
#else
#define TRTFUSE_HD
#endif

struct WgwSchedule {
    int grid;      // blocks to launch
    int regular;   // blocks 0..regular-1 are regular (a multiple of n_blocks); the rest are extra
    int quota;     // tiles per regular block at most
};

// m_blocks x n_blocks tiles on `resident` block slots. `balance`: extra blocks allowed (the kernel reloads a weight
// slice safely only where its consumers take turns: PINGPONG configs).
inline WgwSchedule wgw_schedule(int m_blocks, int n_blocks, int resident, bool balance) {
    int per_n = resident / n_blocks;                           // regular blocks per N block
    per_n = per_n < 1 ? 1 : per_n > m_blocks ? m_blocks : per_n;   // at least one, none without a tile
    WgwSchedule s{per_n * n_blocks, per_n * n_blocks, (m_blocks + per_n - 1) / per_n};
    int const extra = balance ? resident - s.regular : 0;
    // the smallest quota whose leftover tiles (M tiles past per_n * quota, of every N block) take the extra blocks
    // no more tiles each than a regular block
    for (int q = 1; extra > 0 && q < s.quota; ++q) {
        int64_t const rest = static_cast<int64_t>(m_blocks - per_n * q) * n_blocks;
        if ((rest + extra - 1) / extra <= q) {
            s.quota = q;
            s.grid = s.regular + static_cast<int>(rest < extra ? rest : extra);
            break;
        }
    }
    return s;
}

// The tiles of one block, in the order it computes them: tile t is (m_block(t), n_block(t)).
struct WgwTiles {
    int count;    // tiles of this block
    bool extra;
    int nb;       // regular: the N block
    int mb0, mstep;   // regular: M blocks mb0, mb0 + mstep, ...
    int first, rest_m, rest_mb0;   // extra: leftover tiles first, first + 1, ... (rest_m per N block, from rest_mb0)

    TRTFUSE_HD WgwTiles(int block, int grid, int m_blocks, int n_blocks, int regular, int quota) {
        int const per_n = regular / n_blocks;
        extra = block >= regular;
        nb = block % n_blocks;
        mb0 = block / n_blocks;
        mstep = per_n;
        rest_mb0 = per_n * quota;
        rest_m = m_blocks - rest_mb0;
        if (!extra) {
            int const avail = mb0 < m_blocks ? (m_blocks - 1 - mb0) / per_n + 1 : 0;
            count = avail < quota ? avail : quota;
            first = 0;
        } else {
            int64_t const rest = static_cast<int64_t>(rest_m) * n_blocks;
            int const e = block - regular, n_extra = grid - regular;
            first = static_cast<int>(rest * e / n_extra);
            count = static_cast<int>(rest * (e + 1) / n_extra) - first;
        }
    }
    TRTFUSE_HD int n_block(int t) const { return extra ? (first + t) / rest_m : nb; }
    TRTFUSE_HD int m_block(int t) const { return extra ? rest_mb0 + (first + t) % rest_m : mb0 + t * mstep; }
};

}  // namespace rconv
}  // namespace trtfuse
