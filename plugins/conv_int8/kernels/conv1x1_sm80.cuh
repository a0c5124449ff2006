// The sm80 kernel (A100-class GPUs; also runs on Hopper, where the tuner prefers the sm90 kernel except for layers
// whose weight slice does not fit that kernel's shared memory): mma.sync m16n8k32 from ldmatrix fragments, fed by a
// cp.async multistage pipeline.
//
//   Sm80Config        threadblock tile (BM x BN x BK), warp tile (WM x WN), pipeline depth, register cap
//   WarpMma           one k32 step of a warp tile: ldmatrix fragments from shared memory, mma.sync
//   conv_kernel_sm80  persistent blocks; the cp.async pipeline runs over the flattened (tile, k stage) sequence, so
//                     the next tile's x, weights and residual stream in while this tile's MMAs, epilogue and stores
//                     run; the epilogue (epilogue.cuh) writes in place over the residual tile, then 16-byte
//                     evict-first stores.
//
// The per-tile overhead is kept out of the instruction stream (docs/residual_conv.md, Version 6):
//   * every 16-byte piece a thread moves (x, residual, output) lies on ONE tile row when (THREADS/2) % BM == 0
//     (piece = tid + i*THREADS: row = (tid/2) % BM for every i, slab = (tid/2)/BM + i*THREADS/(2*BM)), so
//     (image, hw) is computed once per tile and per thread, with FastDivmod (IMAD.HI + SHF, no MUFU);
//   * the flattened iteration is tracked by counters (tile, k stage, pipeline slot), not divisions;
//   * magic-start accumulators and the permuted weights' 4 channels per thread (epilogue.cuh).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "conv_int8/core/epilogue.cuh"
#include "conv_int8/core/params.h"
#include "conv_int8/core/ptx_sm80.cuh"
#include "conv_int8/core/tile_layout.h"

namespace trtfuse {
namespace rconv {

// MIN_BLOCKS caps registers (__launch_bounds__) so that enough blocks share an SM: the op is memory bound, and the
// bytes in flight per SM, not the math, set its speed.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, int MIN_BLOCKS_>
struct Sm80Config {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
    static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int KCH = BK / 32;                 // 32-byte k chunks per stage
    static constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK, R_TILE = BM * BN;
    // STAGES residual tiles: a tile's residual is fetched with its first k stage, up to STAGES-1 tiles
    // ahead of its epilogue when K fits one stage (res2), so that many can be alive at once.
    static constexpr int SMEM = STAGES * (A_STAGE + B_STAGE + R_TILE);
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 32 == 0, "warp tiling (epilogue: 32-channel slabs)");
    static_assert(BK % 32 == 0 && BN % 32 == 0 && 256 % BN == 0 && 128 % BK == 0, "packing pads N to 256, K to 128");
    static_assert((BM * BK / 16) % THREADS == 0 && (BN * BK / 16) % THREADS == 0 && (BM * BN / 16) % THREADS == 0,
                  "every thread moves the same number of 16-byte pieces");
    static_assert((THREADS / 2) % BM == 0, "all 16-byte pieces of a thread lie on one tile row");
    static_assert(STAGES >= 2, "multistage pipeline");
};

// One k32 step of a WM x WN warp tile. acc[i][4j + e]: 16-row group i, n8 chunk j, the m16n8 C fragment.
template <int WM, int WN>
struct WarpMma {
    static constexpr int MI = WM / 16, NI = WN / 8;
    int acc[MI][NI * 4];

    // Start every accumulator at v (the magic bits, see epilogue.cuh, or 0).
    __device__ __forceinline__ void fill(int v) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI * 4; ++j) acc[i][j] = v;
    }

    // sA/sB: the k chunk's [rows][32] slab; a_row0/b_row0: this warp's first row in it.
    __device__ __forceinline__ void step(int8_t const* sA, int a_rows, int a_row0, int8_t const* sB, int b_rows,
                                         int b_row0, int lane) {
        uint32_t a[MI][4], b[NI][2];
        // A: matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31), (rows 8-15, k 16-31)
        // which is exactly a0..a3 of the m16n8k32 s8 A fragment.
        int j = lane >> 3;
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            int row = a_row0 + i * 16 + (lane & 7) + (j & 1) * 8;
            ldmatrix_x4(a[i], smem_u32(sA + swz_offset(0, a_rows, row, (j >> 1) * 16)));
        }
        // B (rows = n, 32 contiguous k bytes): matrices (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, ...) ...
        // which are b0, b1 of two neighbouring n8 fragments.
#pragma unroll
        for (int nj = 0; nj < NI; nj += 2) {
            uint32_t d[4];
            int row = b_row0 + (nj + (j >> 1)) * 8 + (lane & 7);
            ldmatrix_x4(d, smem_u32(sB + swz_offset(0, b_rows, row, (j & 1) * 16)));
            b[nj][0] = d[0]; b[nj][1] = d[1]; b[nj + 1][0] = d[2]; b[nj + 1][1] = d[3];
        }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int n = 0; n < NI; ++n) mma_s8_16832(&acc[i][4 * n], a[i], b[n][0], b[n][1]);
    }
};

// Persistent kernel: a block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (tile = (M block, N block), N
// fastest so the blocks sharing an x tile run together and hit L2). RESIDUAL: the layer has a residual input
// (p.r); without one the residual buffers only stage the output.
template <class Cfg, bool RESIDUAL>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
conv_kernel_sm80(Params p) {
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, WM = Cfg::WM, WN = Cfg::WN, STAGES = Cfg::STAGES;
    constexpr int THREADS = Cfg::THREADS, KCH = Cfg::KCH;
    using Warp = WarpMma<WM, WN>;
    constexpr int NI = Warp::NI, MI = Warp::MI;
    constexpr int A_PIECES = BM * BK / 16 / THREADS, B_PIECES = BN * BK / 16 / THREADS;
    constexpr int R_PIECES = BM * BN / 16 / THREADS;
    constexpr int SLAB_STEP = THREADS / 2 / BM;   // slab (or k chunk) advance from piece i to i + 1

    extern __shared__ __align__(128) int8_t smem[];
    int8_t* sA = smem;                                   // STAGES x [KCH][BM][32]
    int8_t* sB = sA + STAGES * Cfg::A_STAGE;             // STAGES x [KCH][BN][32]
    int8_t* sR = sB + STAGES * Cfg::B_STAGE;             // STAGES x [BN/32][BM][32]: residual in, output out

    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
    int const g = lane >> 2, tig = lane & 3;
    // This thread's place in every [slab][row][2 x 16 B] tile it copies (x stage, residual, output).
    int const my_row = (tid >> 1) % BM, my_slab0 = (tid >> 1) / BM, my_half = tid & 1;
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;       // between consecutive slabs of r and out
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    int const tiles = m_blocks * p.n_blocks;
    int const my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    int const k_tiles = (p.x.Kc * 32 + BK - 1) / BK;
    int const iters = my_tiles * k_tiles;
    int const init = p.rule.small_acc ? kMagicBits : 0;   // accumulator start (epilogue.cuh)

    auto tile_mn = [&](int j, int& m0, int& n0) {   // j-th tile of this block, N fastest
        int t = blockIdx.x + j * gridDim.x;
        int mb = p.nb_div.div(t);
        n0 = (t - mb * p.n_blocks) * BN;
        m0 = mb * BM;
    };
    // Byte offset of this thread's row (m0 + my_row) in slab 0 of x (X) or of r and out, its 16-byte half
    // included; ok = the row exists (m < M; m < 2^31 since M < 2^31 - 256 and BM <= 256).
    auto my_row_offset = [&](int m0, bool x, bool& ok) -> int64_t {
        int const m = m0 + my_row;
        ok = m < p.M;
        return (x ? x_row_offset(p, p.x, m) : out_row_offset(p, m)) + my_half * 16;
    };

    // cp.asyncs of k stage kt of tile j into pipeline slot `slot`; kt == 0 also brings the tile's residual
    // into R buffer (j % STAGES).
    auto load_iter = [&](int j, int kt, int slot) {
        int m0, n0;
        tile_mn(j, m0, n0);
        if (RESIDUAL && kt == 0) {
            bool row_ok;
            int64_t const base = my_row_offset(m0, false, row_ok);
            int8_t* r_dst = sR + (j % STAGES) * Cfg::R_TILE;
#pragma unroll
            for (int i = 0; i < R_PIECES; ++i) {
                int slab = my_slab0 + i * SLAB_STEP, gslab = n0 / 32 + slab;
                bool ok = row_ok && gslab < p.Nc;
                cp_async_16(smem_u32(r_dst + swz_offset(slab, BM, my_row, my_half * 16)),
                            p.r + (ok ? base + gslab * slab_bytes : 0), ok ? 16 : 0);
            }
        }
        {
            bool row_ok;
            int64_t const base = my_row_offset(m0, true, row_ok);
            int8_t* a_dst = sA + slot * Cfg::A_STAGE;
#pragma unroll
            for (int i = 0; i < A_PIECES; ++i) {
                int chunk = my_slab0 + i * SLAB_STEP, kc = kt * KCH + chunk;
                bool ok = row_ok && kc < p.x.Kc;
                cp_async_16(smem_u32(a_dst + swz_offset(chunk, BM, my_row, my_half * 16)),
                            p.x.data + (ok ? base + kc * (static_cast<int64_t>(p.x.in_hw) * 32) : 0), ok ? 16 : 0);
            }
        }
        int8_t* b_dst = sB + slot * Cfg::B_STAGE;
#pragma unroll
        for (int i = 0; i < B_PIECES; ++i) {
            int piece = tid + i * THREADS;
            // consecutive threads walk along one weight row: BK/16 pieces per row
            int row = piece / (BK / 16), kb = (piece % (BK / 16)) * 16;
            cp_async_16(smem_u32(b_dst + swz_offset(kb >> 5, BN, row, kb & 31)),
                        p.w + static_cast<int64_t>(n0 + row) * p.Kpad + kt * BK + kb, 16);
        }
    };

    // (load_j, load_kt, load_slot): the next flattened iteration to load; load_n: how many were issued.
    int load_j = 0, load_kt = 0, load_slot = 0, load_n = 0;
    auto load_next = [&]() {
        if (load_n < iters) {
            load_iter(load_j, load_kt, load_slot);
            ++load_n;
            if (++load_kt == k_tiles) { load_kt = 0; ++load_j; }
            if (++load_slot == STAGES) load_slot = 0;
        }
        cp_async_commit();   // empty groups keep the wait counts uniform
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) load_next();

    Warp mma;
    mma.fill(init);
    int j = 0, kt = 0, slot = 0;   // the iteration being computed
    for (int it = 0; it < iters; ++it) {
        cp_async_wait<STAGES - 2>();   // iteration it's stage (and, at kt == 0, its residual) has landed
        __syncthreads();               // ... for every thread; slot (it-1) % STAGES and old R buffers are free
        load_next();                   // iteration it + STAGES - 1
#pragma unroll
        for (int c = 0; c < KCH; ++c)
            mma.step(sA + slot * Cfg::A_STAGE + c * BM * 32, BM, warp_m * WM,
                     sB + slot * Cfg::B_STAGE + c * BN * 32, BN, warp_n * WN, lane);
        if (++slot == STAGES) slot = 0;
        if (++kt != k_tiles) continue;
        kt = 0;

        // ---- epilogue of tile j: registers, in place over the residual, then 16-byte stores ----
        int m0, n0;
        tile_mn(j, m0, n0);
        int8_t* r_tile = sR + (j % STAGES) * Cfg::R_TILE;
        // this warp's fragment: rows warp_m * WM + 16i + g (+8), channels from its first 32-channel slab
        epilogue_fragment<BM, MI, NI, RESIDUAL>(mma.acc, p.rule, r_tile + (warp_n * WN / 32) * BM * 32, warp_m * WM + g, tig,
                                      n0 + warp_n * WN);
        mma.fill(init);
        __syncthreads();
        // ---- coalesced 16-byte stores of this thread's row (evict-first: the output is not re-read here) ----
        bool row_ok;
        int64_t const obase = my_row_offset(m0, false, row_ok);
#pragma unroll
        for (int i = 0; i < R_PIECES; ++i) {
            int slab = my_slab0 + i * SLAB_STEP, gslab = n0 / 32 + slab;
            if (row_ok && gslab < p.Nc)
                st_global_cs_16(p.out + obase + gslab * slab_bytes,
                                *reinterpret_cast<int4 const*>(r_tile + swz_offset(slab, BM, my_row, my_half * 16)));
        }
        ++j;
    }
    cp_async_wait<0>();   // nothing is left in flight at exit (the trailing groups are empty)
}

}  // namespace rconv
}  // namespace trtfuse
