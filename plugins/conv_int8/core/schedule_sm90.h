// Which tiles each block of an sm90 ("wgw_*") launch (conv1x1_sm90.cuh) computes: the host picks the schedule
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

#include "common/fast_divmod.h"

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
    FastDivmod rest;   // by the M tiles per N block left to the extra blocks (past regular / n_blocks * quota)
};

// m_blocks x n_blocks tiles on `resident` block slots. `balance`: extra blocks allowed (the kernel reloads a weight
// slice safely only where its consumers take turns: PINGPONG configs).
inline WgwSchedule wgw_schedule(int m_blocks, int n_blocks, int resident, bool balance) {
    int per_n = resident / n_blocks;                           // regular blocks per N block
    per_n = per_n < 1 ? 1 : per_n > m_blocks ? m_blocks : per_n;   // at least one, none without a tile
    WgwSchedule s{per_n * n_blocks, per_n * n_blocks, (m_blocks + per_n - 1) / per_n, FastDivmod(1)};
    int const extra = balance ? resident - s.regular : 0;
    // the smallest quota whose leftover tiles (M tiles past per_n * quota, of every N block) take the extra blocks
    // no more tiles each than a regular block
    for (int q = 1; extra > 0 && q < s.quota; ++q) {
        int64_t const left = static_cast<int64_t>(m_blocks - per_n * q) * n_blocks;
        if ((left + extra - 1) / extra <= q) {
            s.quota = q;
            s.rest = FastDivmod(m_blocks - per_n * q);
            s.grid = s.regular + static_cast<int>(left < extra ? left : extra);
            break;
        }
    }
    return s;
}

// The tiles of one block, in the order it computes them: tile t is (m_block(t), n_block(t)). `rest` is the
// schedule's, made on the host (an extra block asks for its tile's blocks at every tile: a multiply, not a division).
struct WgwTiles {
    int count;    // tiles of this block
    bool extra;
    int nb;       // regular: the N block
    int mb0, mstep;   // regular: M blocks mb0, mb0 + mstep, ...
    int first, rest_mb0;   // extra: leftover tiles first, first + 1, ... (rest.divisor per N block, from rest_mb0)
    FastDivmod rest;

    TRTFUSE_HD WgwTiles(int block, int grid, int m_blocks, int n_blocks, int regular, int quota, FastDivmod rest_)
        : rest(rest_) {
        int const per_n = regular / n_blocks;
        extra = block >= regular;
        nb = block % n_blocks;
        mb0 = block / n_blocks;
        mstep = per_n;
        rest_mb0 = per_n * quota;
        if (!extra) {
            int const avail = mb0 < m_blocks ? (m_blocks - 1 - mb0) / per_n + 1 : 0;
            count = avail < quota ? avail : quota;
            first = 0;
        } else {
            int64_t const left = static_cast<int64_t>(m_blocks - rest_mb0) * n_blocks;
            int const e = block - regular, n_extra = grid - regular;
            first = static_cast<int>(left * e / n_extra);
            count = static_cast<int>(left * (e + 1) / n_extra) - first;
        }
    }
    TRTFUSE_HD int n_block(int t) const { return extra ? n_block<true>(t) : n_block<false>(t); }
    TRTFUSE_HD int m_block(int t) const { return extra ? m_block<true>(t) : m_block<false>(t); }
    // the same where the kind of block is known at compile time (the kernel's tile loop is compiled for each)
    template <bool EXTRA>
    TRTFUSE_HD int n_block(int t) const { return EXTRA ? rest.div(first + t) : nb; }
    template <bool EXTRA>
    TRTFUSE_HD int m_block(int t) const {
        return EXTRA ? rest_mb0 + first + t - rest.div(first + t) * rest.divisor : mb0 + t * mstep;
    }
};

}  // namespace rconv
}  // namespace trtfuse
