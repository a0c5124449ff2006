// Warp-specialized Hopper (sm_90a) variant of the fused int8 1x1 conv + BN + residual Add (+ReLU) ("wgw_*"
// configs): the wgi kernel's math (residual_conv_wgmma.cuh: weight stationary, two consumer warpgroups that each
// own 64-row tiles, wgmma m64nNk32 from shared memory, the shared epilogue) with the loads taken off the
// consumers. 384 threads:
//   warpgroups 0 and 1 (consumers): wgmma over the k stages, then the epilogue, then the output stores.
//     Consumer c takes the block's tiles c, c + 2, ...; its k stages are waited for on mbarriers and released as
//     soon as the wgmmas that read them are done (wgmma.wait_group 1: the next stage's wgmmas are already
//     issued), so the tensor cores never wait for a block-wide barrier.
//   warpgroup 2 (producers), one warp per (consumer, operand): warp c copies consumer c's x stages into its ring
//     of STAGES slots (and, with its first tile, half of the weight slice, one k chunk ahead of each stage);
//     warp 2 + c copies consumer c's residual tiles into its ring of RBUF buffers, as far ahead as they allow.
// Each consumer has rings of its own: an mbarrier wait by parity is only unambiguous when the waiter is at most
// one phase ahead of the barrier, which holds for a ring that one consumer walks in order.
// Measured on the H100 (tuner, same run): faster than the wgi kernel at res5 (batch 2048: 0.348 vs 0.384 ms; 256:
// 0.058 vs 0.064 ms) and res4 batch 256 (0.0705 vs 0.0712 ms); 3-12 % slower at res2, res3 and res4 batch 2048.
// Variants measured and not kept: one x and one residual warp for both consumers (1.3-1.5x slower than wgi);
// the residual by bulk copies into linear buffers, issued by the consumers, with x by 2 warps per consumer
// (res5 0.41 ms, res2 1.75 ms); 1 residual buffer and 8 x slots per consumer (res5 0.384 ms).
//
// Producer -> consumer: a producer lane issues its cp.asyncs, then cp.async.mbarrier.arrive.noinc on the slot's
// full barrier (count 32: it fires when every lane's copies have landed). cp.async writes through the generic
// proxy and wgmma reads through the async proxy: each consumer thread runs fence.proxy.async.shared::cta after
// its full-barrier wait, before its wgmmas. The residual is read by ordinary loads: no proxy fence.
// Consumer -> producer: lane 0 of each consumer warp arrives on a slot's empty barrier (count 4) once the warp's
// wgmmas that read the slot are done; every consumer thread arrives on a residual buffer's empty barrier (count
// 128) once it has read its output pieces back (its own accesses then precede its own release: compute-sanitizer's
// racecheck does not follow a release by lane 0 after __syncwarp).
// The weight slice: k chunk kt has a barrier of its own (count 64: both x warps copy half of its rows), waited
// for by both consumers in their first tile only.
//
// Compiled only in the sm_90a pass, like the other wgmma kernels (kHasWgmma guards the launch).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "residual_conv/residual_conv_wgmma.cuh"

namespace trtfuse {
namespace rconv {

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

// ---- mbarrier (shared::cta) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
// Arrives on `bar` when every cp.async this thread issued so far has completed (the expected count covers it).
__device__ __forceinline__ void mbar_arrive_on_cp_async(uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Waits until the phase of `bar` with this parity has completed (a fresh barrier: parity 1 passes at once).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
#endif
}

// Tile configuration: BN (wgmma N), BK (k bytes per x stage), STAGES x slots and RBUF residual buffers per
// consumer, PERM (the v6 PERM epilogue). Shared memory: [weights BN x k_tiles*BK][2 x STAGES x 64 x BK]
// [2 x RBUF x 64 x BN][mbarriers]; the weight slice depends on K (wgw_smem_bytes).
template <int BN_, int BK_, int STAGES_, int RBUF_, bool PERM_ = true>
struct WgwTileConfig {
    static constexpr int BM = 64, BN = BN_, BK = BK_, STAGES = STAGES_, RBUF = RBUF_;
    static constexpr bool PERM = PERM_;
    static constexpr int THREADS = 3 * 128;
    // setmaxnreg moves registers from the producers (they need few) to the consumers (128 accumulators at BN
    // 256) within the block's allocation, THREADS x 168 (the consumers' increase blocks until the pool has them)
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static constexpr int PRODUCER_REGS = 72;
    static constexpr int CONSUMER_REGS = (THREADS * LAUNCH_REGS - 128 * PRODUCER_REGS) / 256 / 8 * 8;
    static constexpr int KCH = BK / 32;
    static constexpr int A_STAGE = BM * BK, R_TILE = BM * BN;
    // k chunks of the weight slice with a barrier each: shared memory caps BN * k_tiles * BK below 227 KB
    static constexpr int MAX_K_TILES = 227 * 1024 / (BN * BK) + 1;
    static constexpr int BARRIERS = 4 * (STAGES + RBUF) + MAX_K_TILES;
    static constexpr int SMEM = 2 * (STAGES * A_STAGE + RBUF * R_TILE) + BARRIERS * 8;   // + the weight slice
    static_assert(BN == 128 || BN == 256, "n128 or n256 per wgmma");
    static_assert(BK % 32 == 0 && 128 % BK == 0, "packing pads K to 128");
    static_assert(STAGES >= 2 && RBUF >= 1 && SMEM <= 227 * 1024, "rings, shared memory");
    static_assert(CONSUMER_REGS >= LAUNCH_REGS && CONSUMER_REGS <= 240 &&
                      256 * CONSUMER_REGS + 128 * PRODUCER_REGS <= THREADS * LAUNCH_REGS,
                  "setmaxnreg within the block's register allocation");
};

template <class Cfg>
constexpr int wgw_smem_bytes(int k_tiles) {
    return Cfg::BN * k_tiles * Cfg::BK + Cfg::SMEM;
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
residual_conv_kernel_wgmma_ws(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, RBUF = Cfg::RBUF;
    constexpr int KCH = Cfg::KCH, NI = BN / 8;

    int const k_tiles = (p.Kc * 32 + BK - 1) / BK;   // <= MAX_K_TILES: the host's shared-memory fit rule
    extern __shared__ __align__(1024) int8_t wg_smem[];
    int8_t* sW = wg_smem;                          // k_tiles*KCH chunks x [BN][32] (swz_offset)
    int8_t* sA = sW + BN * k_tiles * BK;           // [consumer][slot]: [KCH][64][32] (swz_offset)
    int8_t* sR = sA + 2 * STAGES * Cfg::A_STAGE;   // [consumer][buffer]: [BN/32][64][32] (swz_offset), residual/output
    uint32_t const bars = smem_u32(sR + 2 * RBUF * Cfg::R_TILE);
    // barriers of consumer c's slot s (index c * STAGES + s) / buffer b (c * RBUF + b), and of weight chunk kt
    auto x_full = [&](int s) { return bars + 8 * s; };
    auto x_empty = [&](int s) { return bars + 8 * (2 * STAGES + s); };
    auto r_full = [&](int b) { return bars + 8 * (4 * STAGES + b); };
    auto r_empty = [&](int b) { return bars + 8 * (4 * STAGES + 2 * RBUF + b); };
    auto w_full = [&](int kt) { return bars + 8 * (4 * STAGES + 4 * RBUF + kt); };

    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    // Block b keeps N block b % n_blocks and walks 64-row M tiles mb0, mb0 + mstep, ... (the grid is a multiple
    // of n_blocks: the blocks sharing an x tile run it at about the same time, L2 hits)
    int const n0 = (static_cast<int>(blockIdx.x) % p.n_blocks) * BN;
    int const mb0 = static_cast<int>(blockIdx.x) / p.n_blocks;
    int const mstep = static_cast<int>(gridDim.x) / p.n_blocks;
    int const my_tiles = mb0 < m_blocks ? (m_blocks - 1 - mb0) / mstep + 1 : 0;
    auto tile_m0 = [&](int t) { return (mb0 + t * mstep) * BM; };

    if (tid == 0) {
        for (int s = 0; s < 2 * STAGES; ++s) { mbar_init(x_full(s), 32); mbar_init(x_empty(s), 4); }
        for (int b = 0; b < 2 * RBUF; ++b) { mbar_init(r_full(b), 32); mbar_init(r_empty(b), 128); }
        for (int kt = 0; kt < k_tiles; ++kt) mbar_init(w_full(kt), 64);
    }
    __syncthreads();   // the only block-wide barrier

    if (warp >= 8) {
        // ---------------- producers (warpgroup 2) ----------------
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        int const c = warp & 1;           // the consumer this warp feeds: tiles c, c + 2, ...
        bool const x_warp = warp < 10;    // else the residual
        // Lane l copies rows l/2 + 16 i (i = 0..3), 16-byte half l % 2, of every slab of a tile: per slab the warp
        // reads 16 consecutive rows x 32 bytes per i (coalesced); the row math is done once per tile.
        int const half = lane & 1;
        int8_t const* wsrc = (Cfg::PERM ? p.w_perm : p.w) + static_cast<int64_t>(n0) * p.Kpad;
        auto copy_weights = [&](int kt) {   // rows c*BN/2 .. c*BN/2 + BN/2 - 1 of chunk kt (the rest: warp 1 - c)
            constexpr int W_PIECES = BN / 2 * BK / 16;
            for (int piece = lane; piece < W_PIECES; piece += 32) {
                int row = c * (BN / 2) + piece / (BK / 16), kb = kt * BK + (piece % (BK / 16)) * 16;
                cp_async_16(smem_u32(sW + swz_offset(kb >> 5, BN, row, kb & 31)),
                            wsrc + static_cast<int64_t>(row) * p.Kpad + kb, true);
            }
            mbar_arrive_on_cp_async(w_full(kt));
        };
        for (int t = c, u = 0; t < my_tiles; t += 2, ++u) {
            int const m0 = tile_m0(t);
            int img[4], hw[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int m = min(m0 + (lane >> 1) + 16 * i, p.M - 1);   // rows past M: clamped, copied as zeros
                img[i] = p.hw_div.div(m);
                hw[i] = m - img[i] * p.HW;
            }
            auto row_src = [&](int8_t const* base, int slabs, int i) {
                return base + (static_cast<int64_t>(img[i]) * slabs * p.HW + hw[i]) * 32 + half * 16;
            };
            if (x_warp) {
                for (int kt = 0; kt < k_tiles; ++kt) {
                    int const q = u * k_tiles + kt, slot = c * STAGES + q % STAGES;
                    mbar_wait(x_empty(slot), ((q / STAGES) & 1) ^ 1);
                    if (u == 0) copy_weights(kt);
                    int8_t* dst = sA + slot * Cfg::A_STAGE;
#pragma unroll
                    for (int ch = 0; ch < KCH; ++ch) {
                        int const kc = kt * KCH + ch;
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            int const row = (lane >> 1) + 16 * i;
                            bool const ok = m0 + row < p.M && kc < p.Kc;
                            cp_async_16(smem_u32(dst + swz_offset(ch, BM, row, half * 16)),
                                        ok ? row_src(p.x, p.Kc, i) + kc * slab_bytes : p.x, ok);
                        }
                    }
                    mbar_arrive_on_cp_async(x_full(slot));
                }
            } else {
                int const b = c * RBUF + u % RBUF;
                mbar_wait(r_empty(b), ((u / RBUF) & 1) ^ 1);
                int8_t* dst = sR + b * Cfg::R_TILE;
#pragma unroll
                for (int slab = 0; slab < BN / 32; ++slab) {
                    int const gslab = n0 / 32 + slab;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        int const row = (lane >> 1) + 16 * i;
                        bool const ok = m0 + row < p.M && gslab < p.Nc;
                        cp_async_16(smem_u32(dst + swz_offset(slab, BM, row, half * 16)),
                                    ok ? row_src(p.r, p.Nc, i) + gslab * slab_bytes : p.r, ok);
                    }
                }
                mbar_arrive_on_cp_async(r_full(b));
            }
        }
        // a consumer's first tile waits for every weight chunk: an x warp without tiles still copies its half
        if (x_warp && c >= my_tiles && my_tiles > 0)
            for (int kt = 0; kt < k_tiles; ++kt) copy_weights(kt);
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    // ---------------- consumers (warpgroups 0 and 1) ----------------
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    int const c = warp >> 2, t128 = tid & 127, warp_in_wg = warp & 3;
    int const g = lane >> 2, tig = lane & 3;
    int const init = p.small_acc ? kMagicBits : 0;
    uint64_t const descA0 = smem_desc<true>(smem_u32(sA));
    uint64_t const descB0 = smem_desc<true>(smem_u32(sW));
    // the output pieces this thread stores: row t128 / 2, 16-byte half t128 % 2, of every slab
    int const my_row = t128 >> 1, my_half = t128 & 1;

    int acc[BN / 2];
    for (int t = c, u = 0; t < my_tiles; t += 2, ++u) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = init;
        int prev = -1;
        for (int kt = 0; kt < k_tiles; ++kt) {
            int const q = u * k_tiles + kt, slot = c * STAGES + q % STAGES;
            mbar_wait(x_full(slot), (q / STAGES) & 1);
            if (u == 0) mbar_wait(w_full(kt), 0);
            fence_proxy_async_smem();   // the landed cp.async bytes, visible to this thread's wgmmas
            wgmma_fence();
            uint64_t const da = descA0 + ((slot * Cfg::A_STAGE) >> 4);
            uint64_t const db = descB0 + ((kt * KCH * BN * 32) >> 4);
#pragma unroll
            for (int cc = 0; cc < KCH; ++cc)
                wgmma_m64k32_s8<BN>(acc, da + ((cc * BM * 32) >> 4), db + ((cc * BN * 32) >> 4));
            wgmma_commit();
            if (prev >= 0) {   // the previous stage's wgmmas are done: release its slot
                wgmma_wait<1>();
                __syncwarp();
                if (lane == 0) mbar_arrive(x_empty(prev));
            }
            prev = slot;
        }
        wgmma_wait<0>();
        __syncwarp();
        if (lane == 0) mbar_arrive(x_empty(prev));

        // ---- epilogue: in registers, written in place over the residual tile, then 16-byte stores ----
        int const b = c * RBUF + u % RBUF, m0 = tile_m0(t);
        mbar_wait(r_full(b), (u / RBUF) & 1);
        int8_t* r_tile = sR + b * Cfg::R_TILE;
        wgmma_epilogue<BM, NI, Cfg::PERM>(acc, p, r_tile, warp_in_wg * 16 + g, tig, n0);
        named_barrier_sync(1 + c, 128);   // every output byte of the tile is in shared memory
        int const m = m0 + my_row;
        if (m < p.M) {
            int const img = p.hw_div.div(m), hw = m - img * p.HW;
            int8_t* obase = p.out + (static_cast<int64_t>(img) * p.Nc * p.HW + hw) * 32 + my_half * 16;
#pragma unroll
            for (int slab = 0; slab < BN / 32; ++slab) {
                int const gslab = n0 / 32 + slab;
                if (gslab < p.Nc)
                    st_global_cs_16(obase + gslab * slab_bytes,
                                    *reinterpret_cast<int4 const*>(r_tile + swz_offset(slab, BM, my_row, my_half * 16)));
            }
        }
        mbar_arrive(r_empty(b));
    }
#else
    (void)p;   // not an sm_90a pass: never launched (the host checks kHasWgmma first)
#endif
}

}  // namespace rconv
}  // namespace trtfuse
