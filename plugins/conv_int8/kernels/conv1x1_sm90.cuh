// The Hopper (sm_90a) kernel ("wgw_*" configs): warp specialized, weight stationary. A block keeps one N block's
// 256 x K weight slice in shared memory (it walks M tiles of that N block, schedule_sm90.h); two consumer
// warpgroups each own 64-row tiles and run wgmma m64n256k32 from shared memory, then the shared epilogue
// (epilogue.cuh); a producer warpgroup does the loads. 384 threads (NH 2: each consumer is a pair of warpgroups,
// each with half of the tile's columns, m64n128k32; 640 threads; see WgwConfig):
//   warpgroups 0 and 1 (consumers): wgmma over the k stages, then the epilogue, then the output stores.
//     Consumer c takes the block's tiles c, c + 2, ...; its k stages are waited for on mbarriers and released as
//     soon as the wgmmas that read them are done (wgmma.wait_group 1: the next stage's wgmmas are already
//     issued), so the tensor cores never wait for a block-wide barrier.
//   warpgroup 2 (producers), two warps per consumer. Default: warp c copies consumer c's x stages into its ring
//     of STAGES slots, warp 2 + c its residual tiles into its ring of RBUF buffers (as far ahead as they allow).
//     SPLIT: warps c and 2 + c each copy half of the rows of both (the residual first, then the x stages).
//     A producer lane computes its rows' source offsets once per tile; each 16-byte copy is then one 64-bit add
//     (the first version recomputed them per copy: ncu showed the x warp busy all the time, ~17 instructions and a
//     register reuse stall per cp.async, and the consumers waiting for x).
//   PINGPONG: the consumers take turns issuing their tiles' wgmmas (mbarrier mma_turn), so one's epilogue runs
//     while the other's wgmmas do. SHARED (with PINGPONG and SPLIT): one x ring for both consumers, filled by
//     warps 0 and 1 (half of the rows each) in turn order, and the residuals by warps 2 and 3: the consumer on
//     the tensor cores may have the whole ring in flight (res5: its wgmma phase 5.0k -> 2.8k cycles per tile).
// An mbarrier wait by parity is only unambiguous when the waiter is at most one phase ahead of the barrier. That
// holds for a ring that one consumer walks in order, and for the SHARED ring, which the turns make the consumers
// walk in order: a consumer reaches a fill only after the fill one lap earlier was waited for (by itself, or by
// the other consumer before it passed the turn).
// Output: each consumer warp stores its own 16 rows (one dense block of the tile in shared memory): rows within one
// image by one TMA store (Params::out_map), rows that straddle two images by 16-byte stores.
// Measured on the H100 against TensorRT 8.5 (docs/residual_conv.md, Version 11), batch 2048: res2 1.26 ms, res3
// 0.64, res4 0.37, res5 0.26 (Version 9: 1.30 / 0.72 / 0.43 / 0.33); res5 batch 256 0.042. Per-tile phases (clock64,
// benchmarks/experiments/residual_conv_wgw_phases.cu): the epilogue, 3.3-4.1k cycles, is the largest at every stage.
// Variants measured and not kept: one x and one residual warp for both consumers, without turns (1.3-1.5x slower
// than the earlier kernel with independent warpgroups and no producers); the residual by bulk copies into linear buffers (res5 0.41 ms, res2 1.75 ms); 8 x slots and 1 residual buffer
// (res5 0.361); the output stores by the residual warp instead of the consumers (res2 1.83 vs 1.55 ms); SPLIT
// with x stage 0 before the residual (a parity race, see load_residual).
//
// Producer -> consumer: a producer lane issues its cp.asyncs, then cp.async.mbarrier.arrive.noinc on the slot's
// full barrier (count 32 per producer warp: it fires when every lane's copies have landed). cp.async writes
// through the generic proxy and wgmma reads through the async proxy: each consumer thread runs
// fence.proxy.async.shared::cta after its full-barrier wait, before its wgmmas. The residual is read by ordinary
// loads: no proxy fence.
// Consumer -> producer: lane 0 of each consumer warp arrives on a slot's empty barrier (count 4) once the warp's
// wgmmas that read the slot are done; every consumer thread arrives on a residual buffer's empty barrier (count
// 128) once it has read its output pieces back (its own accesses then precede its own release: compute-sanitizer's
// racecheck does not follow a release by lane 0 after __syncwarp), except lane 0 of a warp whose rows left by TMA:
// it arrives after the next tile's wgmmas, once the engine has read them (bulk wait_group.read).
// The weight slice arrives by bulk copies (TMA) of Params::w_img, the weights packed on the host in this kernel's
// shared-memory layout (tile_layout.h: pack_weight_slices), issued by thread 0 at block start ahead of every other load; k chunk kt
// has a barrier of its own (w_full, expect_tx), waited for by each consumer's first tile with that slice. Before,
// the x warps copied it by cp.async, one k chunk ahead of each of the first tile's stages (res5 batch 256: first
// tile stored 14 us after block start, steady period 5.4 us); TMA boxes of 32 bytes x BN rows from a 2-d tensor
// map of the weights were tried too (first tile stored 12.3 us after block start; 10.3 with the bulk copies).
// Extra blocks (schedule_sm90.h) reload it where their run of tiles crosses into the next N block.
//
// Form::kProjResidual, a stage's first block in one kernel (issue 14, step 3): the residual of the tail is the
// block's projection (a strided 1x1 conv of the block input xp, no ReLU), computed by the same consumer just before
// the tail: a tile's k stages are the projection's (from xp, by the first proj_kpad bytes of each weight row), then
// the tail's (from x). After the projection's last stage the consumer rounds its accumulators by proj_rule into the
// residual tile in shared memory (exactly the bytes the projection kernel would write, and where a residual read
// from memory would land), starts the accumulators over, and the tail's epilogue reads them as its residual. The
// projection's output never goes to memory (ResNet-50 res2 at batch 2048: 1.6 GB written and read again). Two
// accumulators summed into one would round differently from the network's int8 graph, whose projection output is
// quantized before the Add; this keeps the int8 tensor the graph defines. The consumer holds its tensor-core turn
// (PINGPONG) through the projection's epilogue: the turns then stay one per tile.
//
// NEXT_N > 0, a chained next conv (issue 14, step 3: a tail and the next bottleneck's conv1 in one kernel): the next
// conv's 1x1 GEMM (K = this layer's <= 256 channels, N = NEXT_N of 64 or 128) runs from the tail's output tile
// while it is still in registers, so the conv1 does not read the tail's output back from memory (ResNet-50 layer1:
// 1.6 GB per batch of 2048 at the DRAM floor, TensorRT's conv1 0.67 ms). The epilogue hands each output word to the
// consumer as well as to the tile (epilogue.cuh: keep): a thread's word of 16-channel group j, row g (+ 8), holds
// channels 16 j + 4 tig .. + 3, which is exactly its wgmma A fragment of k32 step j / 2 (mma.sync m16n8k32 layout)
// for the next GEMM, so its A comes from registers (wgmma RS), and its weights (one slice of NEXT_N rows, loaded at
// block start) from shared memory. The next conv's epilogue writes its words straight to global memory: per warp
// instruction 8 rows x 16 bytes, two instructions a 256-byte run.
//
// Compiled only in the sm_90a pass (ptx_sm90.cuh; kHasWgmma guards the launch).
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda_runtime.h>

#include "conv_int8/core/epilogue.cuh"
#include "conv_int8/core/params.h"
#include "conv_int8/core/ptx_sm80.cuh"
#include "conv_int8/core/ptx_sm90.cuh"
#include "conv_int8/core/schedule_sm90.h"
#include "conv_int8/core/tile_layout.h"
#include "conv_int8/kernels/next_gemm_sm90.cuh"   // WgwNextGemm, kNextMaxK

namespace trtfuse {
namespace rconv {

// Phase marks of the per-tile clock trace (WGW_TRACE, WGW_SPAN, WGW_TRACE_*): empty unless a measuring program
// defines TRTFUSE_WGW_TRACE before including this header (kernels/wgw_trace.cuh defines them then).
#ifdef TRTFUSE_WGW_TRACE
#include "conv_int8/kernels/wgw_trace.cuh"
#else
#define WGW_TRACE(i)
#define WGW_SPAN(i)
#define WGW_TRACE_BEGIN()
#define WGW_TRACE_STAGE0(t, c, u)
#endif

// Tile configuration: BK (k bytes per x stage), STAGES x slots and RBUF residual buffers per consumer, and the
// producers' schedule:
//   SPLIT = false: producer warp c copies consumer c's x stages, warp 2 + c its residual tiles;
//   SPLIT = true: warps c and 2 + c each copy half of the rows of both;
//   PINGPONG (needs SPLIT): the consumers take turns on the tensor cores, and share one x ring of STAGES slots
//     (SHARED), filled by warps 0 and 1 in turn order, the residuals by warps 2 and 3.
// BN is 256 (the tile's N, one weight slice): the only N the tuner ever picked (docs/residual_conv.md, Version 12;
// N tiles of 128 on three or four consumers were slower again in Version 21: x is read once per N block).
// NH, consumer warpgroups per tile: 1 (one wgmma m64n256 per k32 step, 128 accumulators per thread), or 2 (each takes
// WN = 128 of the tile's columns: the same tiles and loads, twice the consumer warps per scheduler for the epilogue,
// which ncu showed issue-bound at two, Version 20). Either way two tiles are in flight ("tile consumers" c = 0, 1).
// Shared memory: [weights 256 x k_tiles*BK][X_SLOTS x 64 x BK][2 x RBUF x 64 x 256][mbarriers]; the weight slice
// depends on K (wgw_smem_bytes).
template <int BK_, int STAGES_, int RBUF_, bool SPLIT_, bool PINGPONG_, int NH_ = 1>
struct WgwConfig {
    static constexpr int BM = 64, BN = 256, BK = BK_, STAGES = STAGES_, RBUF = RBUF_;
    static constexpr int NH = NH_, WN = BN / NH, NC = 2 * NH;   // NC: consumer warpgroups
    static_assert(NH == 1 || NH == 2, "one or two consumer warpgroups per tile");
    static constexpr bool SPLIT = SPLIT_, PINGPONG = PINGPONG_;
    static constexpr bool SHARED = PINGPONG;   // one x ring for both consumers: they walk it in turns
    static_assert(!PINGPONG || SPLIT, "the shared x ring is filled by two producer warps");
    // extra blocks (schedule_sm90.h): their weight-slice reload is made by one consumer warpgroup per tile
    static constexpr bool BALANCE = PINGPONG && NH == 1;
    static constexpr int X_SLOTS = SHARED ? STAGES : 2 * STAGES;
    static constexpr int THREADS = (NC + 1) * 128;
    // setmaxnreg moves registers from the producers (they need few) to the consumers (WN / 2 accumulators) within
    // the block's allocation, THREADS x LAUNCH_REGS (the consumers' increase blocks until the pool has them). NH 2:
    // 104-112 per consumer, the producers at the least that spilled least (ptxas -v: 56, or with SPLIT, half the
    // rows per producer lane, 32); ptxas still spills up to 84 bytes (the fused form; 0-44 in the others)
    static constexpr int LAUNCH_REGS = launch_regs(THREADS);
    static constexpr int PRODUCER_REGS = NH == 1 ? 72 : SPLIT ? 32 : 56;
    static constexpr int CONSUMER_REGS = consumer_regs(THREADS, PRODUCER_REGS);
    static constexpr int KCH = BK / 32;
    static constexpr int A_STAGE = BM * BK, R_TILE = BM * BN;
    // a residual/output tile is [4 warp blocks][BN/32 slabs][16 rows][32 bytes]: consumer warp w's wgmma rows
    // 16w..16w+15 are one dense block, which that warp alone writes and stores (one TMA box, no warpgroup barrier)
    static constexpr int R_BLOCK = 16 * BN;
    // k chunks of the weight slice with a barrier each: shared memory caps BN * k_tiles * BK below 227 KB
    static constexpr int MAX_K_TILES = 227 * 1024 / (BN * BK) + 1;
    static constexpr int BARRIERS = 2 * X_SLOTS + 4 * RBUF + MAX_K_TILES + 5;
    static constexpr int SMEM = X_SLOTS * A_STAGE + 2 * RBUF * R_TILE + BARRIERS * 8;   // + the weight slice
    static_assert(BK % 32 == 0 && 128 % BK == 0, "packing pads K to 128");
    // RBUF >= 2: a consumer releases a buffer its TMA store read (pay_owed) only once it has the next tile's buffer
    // (r_full); with one buffer that wait would be for the buffer it still owes (the 3x3 experiment's RBUF 1 configs
    // hung, docs/residual_conv.md Version 14)
    static_assert(STAGES >= 2 && RBUF >= 2 && SMEM <= 227 * 1024, "rings, shared memory");
    static_assert(CONSUMER_REGS >= LAUNCH_REGS && CONSUMER_REGS <= 240 && WN / 2 + 32 <= CONSUMER_REGS &&
                      128 * NC * CONSUMER_REGS + 128 * PRODUCER_REGS <= THREADS * LAUNCH_REGS,
                  "setmaxnreg within the block's register allocation");
};

template <class Cfg>
constexpr int wgw_smem_bytes(int k_tiles) {
    return Cfg::BN * k_tiles * Cfg::BK + Cfg::SMEM;
}

// ---- the kernel's parts: the shared-memory pipeline, the producer loop, the epilogue store; the next GEMM is
// next_gemm_sm90.cuh's; the consumer mainloop is the kernel's body ----

// The shared memory of conv_kernel_sm90 and its pipeline's barriers: [weights BN x w_tiles*BK][NEXT_N: the next conv's
// weights, NEXT_N x kNextMaxK][X_SLOTS x stages][2 x RBUF residual/output tiles][mbarriers], and which x slot a stage
// takes.
template <class Cfg, int NEXT_N>
struct WgwPipeline {
    static constexpr int BN = Cfg::BN, BK = Cfg::BK, XS = Cfg::X_SLOTS, RBUF = Cfg::RBUF, STAGES = Cfg::STAGES;
    int8_t* sW;    // w_tiles*KCH chunks x [BN][32] (swz_offset)
    int8_t* sW2;   // NEXT_N: the next conv's weights, [kNextMaxK/32][NEXT_N][32]
    int8_t* sA;    // [slot]: [KCH][64][32] (swz_offset)
    int8_t* sR;    // [consumer][buffer]: 4 warp blocks [BN/32][16][32], residual/output
    uint32_t bars;
    int k_tiles;
    __device__ __forceinline__ WgwPipeline(int8_t* smem, int w_tiles, int k_tiles_)
        : sW(smem),
          sW2(sW + BN * w_tiles * BK),
          sA(sW2 + NEXT_N * kNextMaxK),
          sR(sA + XS * Cfg::A_STAGE),
          bars(smem_u32(sR + 2 * RBUF * Cfg::R_TILE)),
          k_tiles(k_tiles_) {}
    // barriers of x slot s, of consumer c's buffer b (index c * RBUF + b), of weight chunk kt
    __device__ __forceinline__ uint32_t x_full(int s) const { return bars + 8 * s; }
    __device__ __forceinline__ uint32_t x_empty(int s) const { return bars + 8 * (XS + s); }
    __device__ __forceinline__ uint32_t r_full(int b) const { return bars + 8 * (2 * XS + b); }
    __device__ __forceinline__ uint32_t r_empty(int b) const { return bars + 8 * (2 * XS + 2 * RBUF + b); }
    __device__ __forceinline__ uint32_t w_full(int kt) const { return bars + 8 * (2 * XS + 4 * RBUF + kt); }
    __device__ __forceinline__ uint32_t mma_turn(int c) const {
        return bars + 8 * (2 * XS + 4 * RBUF + Cfg::MAX_K_TILES + c);
    }
    __device__ __forceinline__ uint32_t mma_done(int c) const {
        return bars + 8 * (2 * XS + 4 * RBUF + Cfg::MAX_K_TILES + 2 + c);
    }
    __device__ __forceinline__ uint32_t w2_full() const { return bars + 8 * (2 * XS + 4 * RBUF + Cfg::MAX_K_TILES + 4); }
    // the x slot of stage kt of tile t (consumer t % 2, its tile u = t / 2) and that slot's fill count: per consumer
    // rings of STAGES slots, or (SHARED) one ring that the tiles of both consumers take in order
    __device__ __forceinline__ void x_pos(int t, int kt, int& slot, int& fill) const {
        int const q = (Cfg::SHARED ? t : t >> 1) * k_tiles + kt;
        slot = (Cfg::SHARED ? 0 : (t & 1) * STAGES) + q % STAGES;
        fill = q / STAGES;
    }
};

// The producer warpgroup's loop (the block's last warpgroup): each consumer's x stages and residual tiles into their
// rings by cp.async, landing on the slots' full barriers, each slot first waited for on its empty barrier. k0: the
// projection's stages of a tile (FUSED), k_tiles: all of them; slab_bytes: between slabs of r and out.
template <class Cfg, int FORM, int NEXT_N>
__device__ __forceinline__ void wgw_producer_loop(Params const& p, WgwPipeline<Cfg, NEXT_N> const& pipe,
                                                  WgwTiles const& tiles, int warp, int lane, int k0, int k_tiles,
                                                  int64_t slab_bytes) {
    constexpr int BM = Cfg::BM, BN = Cfg::BN, KCH = Cfg::KCH, RBUF = Cfg::RBUF;
    constexpr bool RESIDUAL = FORM == kResidual, FUSED = FORM == kProjResidual;
    int const my_tiles = tiles.count;
    setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    // SPLIT: warps c and c + 2 each copy half of consumer c's rows of x and of the residual; else warp c
    // copies consumer c's x and warp c + 2 its residual. SHARED: warps 0 and 1 copy half of the rows of x of
    // every tile (both consumers', in turn order), warps 2 and 3 half of the rows of every residual.
    int const pw = warp - 4 * Cfg::NC;
    constexpr bool SH = Cfg::SHARED;
    constexpr int W = Cfg::SPLIT ? 2 : 1, ROWS = 4 / W;
    int const wsub = SH ? pw & 1 : Cfg::SPLIT ? pw >> 1 : 0;
    bool const do_x = SH ? pw < 2 : Cfg::SPLIT || pw < 2, do_r = SH ? pw >= 2 : Cfg::SPLIT || pw >= 2;
    int const t0 = SH ? 0 : pw & 1, t_step = SH ? 1 : 2;   // the tiles this warp serves: t0, t0 + t_step, ...
    // Lane l copies rows l/2 + 16 (W i + wsub), i < ROWS, 16-byte half l % 2, of every slab of a tile: per slab
    // 16 lanes read 16 consecutive rows x 32 bytes (coalesced). The swizzle depends on the row mod 8 only, so
    // piece (slab, i) lies at a lane's first piece + slab * SLAB + i * STEP: in an x stage ([slab][64][32]) SLAB
    // is 64 rows and STEP 16 W rows, in a residual tile (warp blocks) SLAB is 16 rows and STEP W blocks. Source
    // offsets are computed once per tile.
    int const half = lane & 1, row0 = (lane >> 1) + 16 * wsub;
    uint32_t const x_dst = swz_offset(0, BM, row0, half * 16);
    uint32_t const r_dst = wsub * Cfg::R_BLOCK + swz_offset(0, 16, row0 & 15, half * 16);
    // copies `slabs` slabs of the tile rows, starting at slab s0 of a tensor with `nslabs` slabs `pitch` bytes
    // apart, to dst (see above); slabs past nslabs and rows past M are zero-filled
    auto copy_slabs = [&](uint32_t dst, int slab_step, int row_step, int8_t const* src, int64_t pitch,
                          int64_t const (&off)[ROWS], int const (&bytes)[ROWS], int slabs, int s0, int nslabs) {
#pragma unroll
        for (int sl = 0; sl < slabs; ++sl) {
            bool const ok = s0 + sl < nslabs;
            int8_t const* base = src + (ok ? s0 + sl : 0) * pitch;
#pragma unroll
            for (int i = 0; i < ROWS; ++i)
                cp_async_16(dst + sl * slab_step + i * row_step, base + off[i], ok ? bytes[i] : 0);
        }
    };
    // per tile: the byte offsets of this lane's rows (slab 0, its half) in operand x (or, null, the residual),
    // and their source sizes (0 for rows past M, clamped to a valid address and zero-filled)
    auto row_offsets = [&](int m0, Operand const* x, int64_t (&off)[ROWS], int (&bytes)[ROWS]) {
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            int m = m0 + row0 + 16 * W * i;
            bytes[i] = m < p.M ? 16 : 0;
            m = min(m, p.M - 1);
            off[i] = (x ? x_row_offset(p, *x, m) : out_row_offset(p, m)) + half * 16;
        }
    };
    for (int t = t0; t < my_tiles; t += t_step) {
        int const m0 = tiles.m_block(t) * BM, n0 = tiles.n_block(t) * BN, u = t >> 1;
        auto load_residual = [&] {
            int const b = (t & 1) * RBUF + u % RBUF;
            if constexpr (!RESIDUAL) {   // no residual input (or computed here): only hand the free buffer on
                mbar_wait(pipe.r_empty(b), ((u / RBUF) & 1) ^ 1);
                mbar_arrive(pipe.r_full(b));
                return;
            }
            int64_t off[ROWS];
            int bytes[ROWS];
            row_offsets(m0, nullptr, off, bytes);
            mbar_wait(pipe.r_empty(b), ((u / RBUF) & 1) ^ 1);
            copy_slabs(smem_u32(pipe.sR + b * Cfg::R_TILE) + r_dst, 16 * 32, W * Cfg::R_BLOCK, p.r, slab_bytes, off, bytes,
                       BN / 32, n0 / 32, p.Nc);
            mbar_arrive_on_cp_async(pipe.r_full(b));
        };
        if (!do_x) {
            load_residual();
            continue;
        }
        // SPLIT: the residual first. Its r_empty wait keeps these warps within RBUF tiles of the consumer; with
        // x stage 0 first, the x ring let them run up to STAGES tiles ahead, and a parity wait two phases ahead
        // passed at once (racecheck: residual overwritten before the epilogue read it). Cost: a cp.async
        // mbarrier arrival waits for all of the thread's earlier copies, so x stage 0 lands no sooner than the
        // residual (measured: not ready at 24-36 % of res2/res3 tile starts).
        if (do_r) load_residual();
        // stages kt0..kt1-1 of the tile from operand src, its slabs from 0 (offsets made once per loop: made in
        // the loop at the operand switch, they cost the consumers' wgmmas their registers, ptxas C7511)
        auto load_stages = [&](Operand const& src, int kt0, int kt1) {
            int64_t off[ROWS];
            int bytes[ROWS];
            row_offsets(m0, &src, off, bytes);
            for (int kt = kt0; kt < kt1; ++kt) {
                int slot, fill;
                pipe.x_pos(t, kt, slot, fill);
                mbar_wait(pipe.x_empty(slot), (fill & 1) ^ 1);
                copy_slabs(smem_u32(pipe.sA + slot * Cfg::A_STAGE) + x_dst, BM * 32, 16 * W * 32, src.data,
                           static_cast<int64_t>(src.in_hw) * 32, off, bytes, KCH, (kt - kt0) * KCH, src.Kc);
                mbar_arrive_on_cp_async(pipe.x_full(slot));
            }
        };
        if (FUSED) load_stages(p.xp, 0, k0);   // the projection's stages first
        load_stages(p.x, k0, k_tiles);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Each warp stores its own 16 rows, which only its epilogue wrote: a warp barrier suffices. Rows within
// one image leave by one TMA store (p.out_map, box 16 rows x WN/32 slabs, this warpgroup's columns, from
// the block's first row; rows past HW or M and slabs past Nc not written), issued by lane 0, which
// releases the buffer after the next tile's wgmmas, when the engine has long read it (waiting right away
// put the read, 0.7-1k cycles, on the warpgroup's path: the next wgmma needs every warp). Rows that
// straddle two images take 16-byte stores: a store box must not start at a negative hw (measured: illegal
// instruction). 16-row blocks straddle only where an image boundary falls inside one: never at
// res2/res3, ~1 in 12 at res4, ~1 in 3 at res5.
// (w_tile: this warp's block of the tile in shared memory; n0, part: the tile's and this warpgroup's columns; b: the
// buffer, whose r_empty arrival lane 0 owes (owed) until its TMA store has been read.)
template <class Cfg, int NEXT_N>
__device__ __forceinline__ void wgw_store_rows(Params const& p, WgwPipeline<Cfg, NEXT_N> const& pipe, int8_t* w_tile,
                                               int wm0, int n0, int part, int lane, int my_row, int my_half, int b,
                                               int& owed, int64_t slab_bytes) {
    constexpr int WN = Cfg::WN;
    int const img0 = p.hw_div.div(min(wm0, p.M - 1)), hs = wm0 - img0 * p.HW;
    if (wm0 < p.M && min(16, p.M - wm0) + hs <= p.HW) {
        fence_proxy_async_smem();   // this thread's output bytes (generic writes) -> the TMA engine's reads
        __syncwarp();
        if (lane == 0) {
            tma_store_4d(&p.out_map, smem_u32(w_tile), 0, hs, (n0 + part * WN) / 32, img0);
            bulk_commit();
            owed = b;
        } else {
            mbar_arrive(pipe.r_empty(b));
        }
    } else {
        __syncwarp();
        int const m = wm0 + my_row;
        if (m < p.M) {
            int const img = p.hw_div.div(m), hw = m - img * p.HW;
            int8_t* obase = p.out + (static_cast<int64_t>(img) * p.Nc * p.HW + hw) * 32 + my_half * 16;
#pragma unroll
            for (int slab = 0; slab < WN / 32; ++slab) {
                int const gslab = (n0 + part * WN) / 32 + slab;
                if (gslab < p.Nc)
                    st_global_cs_16(obase + gslab * slab_bytes,
                        *reinterpret_cast<int4 const*>(w_tile + swz_offset(slab, 16, my_row, my_half * 16)));
            }
        }
        mbar_arrive(pipe.r_empty(b));
    }
}

// FORM: kResidual, the layer has a residual input (p.r); kPlain, none: the producers only hand the residual
// buffers on and the epilogue only writes them (they stage the output for its TMA store); kProjResidual, the residual
// is the projection of p.xp, computed here (see above). NEXT_N: 0, or the chained next conv's N tile (see above).
template <class Cfg, int FORM, int NEXT_N = 0>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
conv_kernel_sm90(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, RBUF = Cfg::RBUF;
    constexpr int KCH = Cfg::KCH, NI = BN / 8, NH = Cfg::NH, WN = Cfg::WN;
    constexpr bool RESIDUAL = FORM == kResidual, FUSED = FORM == kProjResidual;
    static_assert(NEXT_N == 0 || NEXT_N == 64 || NEXT_N == 128, "the next conv's N tile: 64 or 128");
    // (a chained next conv reads whole output rows: one warpgroup per tile. With two, the other half read back from the
    // tile and the two halves' k steps in turn was 1.2-1.7x slower, docs/residual_conv.md Version 21; K split between
    // them, each a partial sum of every column, halves exchanged through shared memory, 1.14-1.43x, Version 22)
    static_assert(NEXT_N == 0 || NH == 1, "a chained next conv needs one consumer warpgroup per tile");

    // k stages per tile: the projection's k0 (FUSED), then x's. Weight k tile of stage kt: kt for the projection's,
    // x's from w_x0 on (the projection's K is padded to 128 in a weight row). All weight tiles: <= MAX_K_TILES, the
    // host's shared-memory fit rule.
    int const k0 = FUSED ? (p.xp.Kc * 32 + BK - 1) / BK : 0;
    int const k_tiles = k0 + (p.x.Kc * 32 + BK - 1) / BK;
    int const w_x0 = FUSED ? p.proj_kpad / BK : 0;
    int const w_tiles = w_x0 + k_tiles - k0;
    auto w_tile_of = [&](int kt) { return kt < k0 ? kt : w_x0 + kt - k0; };
    extern __shared__ __align__(1024) int8_t wg_smem[];
    constexpr int XS = Cfg::X_SLOTS;
    WgwPipeline<Cfg, NEXT_N> const pipe(wg_smem, w_tiles, k_tiles);
    int8_t* const sW = pipe.sW;
    int8_t* const sW2 = pipe.sW2;
    int8_t* const sA = pipe.sA;
    int8_t* const sR = pipe.sR;
    uint32_t const w2_full = pipe.w2_full();

    constexpr int XW = Cfg::SPLIT ? 2 : 1;   // producer warps per ring
    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;       // between slabs of r and out
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    // This block's tiles (schedule_sm90.h): a regular block keeps one N block; an extra block's run may
    // cross into the next N blocks, and the consumer of the first tile with a new N block reloads the weight slice
    // (safe only with the PINGPONG turns; the host schedules extra blocks for no other config).
    WgwTiles const tiles(blockIdx.x, gridDim.x, m_blocks, p.n_blocks, p.wgw_regular, p.wgw_quota, p.wgw_rest);
    if (!Cfg::BALANCE && tiles.extra) __trap();
    int const my_tiles = tiles.count;
    // the weight slice of N block nb: k chunk kt, BN x BK contiguous bytes of the packed image, by one bulk copy on
    // pipe.w_full(kt)
    auto load_weights = [&](int nb) {
        int8_t const* src = p.w_img + static_cast<int64_t>(nb) * BN * p.Kpad;
#pragma unroll 1
        for (int kt = 0; kt < w_tiles; ++kt) {
            mbar_arrive_expect_tx(pipe.w_full(kt), BN * BK);
            bulk_load(smem_u32(sW + kt * BK * BN), src + kt * BK * BN, BN * BK, pipe.w_full(kt));
        }
    };

    if (tid == 0) {
        WGW_SPAN(0);
        // consumer arrivals: every warp (x_empty, mma_done) or thread (r_empty, mma_turn) of a tile's NH warpgroups
        for (int s = 0; s < XS; ++s) { mbar_init(pipe.x_full(s), 32 * XW); mbar_init(pipe.x_empty(s), 4 * NH); }
        for (int b = 0; b < 2 * RBUF; ++b) { mbar_init(pipe.r_full(b), 32 * XW); mbar_init(pipe.r_empty(b), 128 * NH); }
        for (int kt = 0; kt < w_tiles; ++kt) mbar_init(pipe.w_full(kt), 1);
        for (int c = 0; c < 2; ++c) { mbar_init(pipe.mma_turn(c), 128 * NH); mbar_init(pipe.mma_done(c), 4 * NH); }
        if (NEXT_N > 0) mbar_init(w2_full, 1);
        fence_mbarrier_init();
        if (my_tiles > 0) load_weights(tiles.n_block(0));   // the first slice, ahead of every other load
        if (NEXT_N > 0 && my_tiles > 0) {   // the next conv's slice, needed only after the first tile's epilogue
            mbar_arrive_expect_tx(w2_full, NEXT_N * p.next_kpad);
            bulk_load(smem_u32(sW2), p.next_w_img, NEXT_N * p.next_kpad, w2_full);
        }
    }
    __syncthreads();   // the only block-wide barrier

    if (warp >= 4 * Cfg::NC) {   // the producers (the last warpgroup)
        wgw_producer_loop<Cfg, FORM>(p, pipe, tiles, warp, lane, k0, k_tiles, slab_bytes);
        return;
    }

    // ---------------- consumers (warpgroups 0 .. NC - 1) ----------------
    // warpgroup wg computes columns part WN .. (part + 1) WN - 1 of tile consumer c's tiles
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    int const wg = warp >> 2, c = wg / NH, part = wg % NH, t128 = tid & 127, warp_in_wg = warp & 3;
    int const g = lane >> 2, tig = lane & 3;
    // accumulator start (epilogue.cuh): a tile begins with the projection's stages when FUSED
    int const init = p.rule.small_acc ? kMagicBits : 0;
    int const init0 = FUSED ? (p.proj_rule.small_acc ? kMagicBits : 0) : init;
    uint64_t const descA0 = smem_desc(smem_u32(sA));
    uint64_t const descB0 = smem_desc(smem_u32(sW));
    // the output pieces this thread stores (16-byte path): row lane / 2 of its warp's block, half lane % 2, every slab
    int const my_row = lane >> 1, my_half = lane & 1;
    WGW_TRACE_BEGIN();

    int acc[1][WN / 2];   // the warp's m64nWN fragment: one 16-row group of the epilogue
#pragma unroll
    for (int i = 0; i < WN / 2; ++i) acc[0][i] = init0;
    // lane 0 of a warp: the buffer of its last TMA store, whose r_empty arrival it owes until the engine has read it
    int owed = -1;
    auto pay_owed = [&] {
        if (owed >= 0) {
            bulk_wait<0, true>();
            mbar_arrive(pipe.r_empty(owed));
            owed = -1;
        }
    };
    // the chained next conv (NEXT_N > 0): kernels/next_gemm_sm90.cuh
    using Next = WgwNextGemm<NEXT_N, NI>;
    constexpr int HALVES = Next::HALVES;
    // an extra block whose run crosses N blocks: the consumers report each tile's wgmmas done (mma_done), so that the
    // consumer that reloads the weight slice knows when the old one is no longer read
    int const nb_first = my_tiles > 0 ? tiles.n_block(0) : 0;
    bool const reloads = my_tiles > 0 && tiles.n_block(my_tiles - 1) != nb_first;
    // The tile loop, compiled twice: for an extra block (EXTRA: N block per tile, reloads), and for a regular one,
    // whose N block is a constant as before the extra blocks (measured: with it per tile, res4 2048 +3-4 %).
    auto consume = [&](auto extra_tag) {
        constexpr bool EXTRA = decltype(extra_tag)::value;
        for (int t = c, u = 0; t < my_tiles; t += 2, ++u) {
            int prev = -1;
            int const nb = tiles.template n_block<EXTRA>(t), n0 = nb * BN;
            // this consumer's first tile with this weight slice waits for it: w_full completes one phase per slice
            bool const wait_w = t < 2 || (EXTRA && nb != tiles.template n_block<EXTRA>(t - 2));
            uint32_t const w_parity = (nb - nb_first) & 1;
            WGW_TRACE(0);
            WGW_TRACE_STAGE0(t, c, u);
            // PINGPONG: the consumers take turns on the tensor cores (tile u of consumer 0, tile u of consumer 1,
            // tile u + 1 of consumer 0, ...), so that one's epilogue runs while the other's wgmmas do
            if (Cfg::PINGPONG && (c == 1 || u > 0)) mbar_wait(pipe.mma_turn(c), (c == 1 ? u : u - 1) & 1);
            // The first tile with a new N block (extra blocks only, PINGPONG): the old slice is free once tile
            // t - 1 (the other consumer's, issued before this turn) and tile t - 2 (this consumer's) are done; one
            // thread then loads the new one. Each mma_done wait is at most one phase ahead: the other consumer
            // reported tile t - 3 before it issued t - 1, and no consumer reports a tile past t - 1 before this tile
            // is issued.
            if (EXTRA && t > 0 && nb != tiles.template n_block<EXTRA>(t - 1) && t128 == 0) {
                mbar_wait(pipe.mma_done(1 - c), ((t - 1) >> 1) & 1);
                if (t >= 2) mbar_wait(pipe.mma_done(c), ((t - 2) >> 1) & 1);
                load_weights(nb);
            }
            // this warp's part of buffer b: its block's slabs of this warpgroup's columns
            auto warp_part = [&](int b) { return sR + b * Cfg::R_TILE + warp_in_wg * Cfg::R_BLOCK + part * WN * 16; };
            // this tile's residual/output buffer (this warp's part), once it is full
            auto take_buffer = [&](int b) {
                mbar_wait(pipe.r_full(b), (u / RBUF) & 1);
                // the previous tile's TMA stores have had this tile's wgmmas to read their buffer: release it now
                if (lane == 0) pay_owed();
                return warp_part(b);
            };
            for (int kt = 0; kt < k_tiles; ++kt) {
                int slot, fill;
                pipe.x_pos(t, kt, slot, fill);
                mbar_wait(pipe.x_full(slot), fill & 1);
                if (kt == 0) WGW_TRACE(1);
                int const wt = w_tile_of(kt);
                if (wait_w) mbar_wait(pipe.w_full(wt), w_parity);
                fence_proxy_async_smem();   // the landed cp.async bytes, visible to this thread's wgmmas
                wgmma_fence();
                wgmma_stage<BM, KCH, WN, BN>(acc[0], descA0 + ((slot * Cfg::A_STAGE) >> 4),
                                             descB0 + ((wt * KCH * BN * 32 + part * WN * 32) >> 4));
                wgmma_commit();
                if (prev >= 0) {   // the previous stage's wgmmas are done: release its slot
                    wgmma_wait<1>();
                    __syncwarp();
                    if (lane == 0) mbar_arrive(pipe.x_empty(prev));
                }
                prev = slot;
                if (FUSED && kt == k0 - 1) {
                    // the projection's accumulators are complete: its output bytes go where the residual would land
                    wgmma_wait<0>();
                    __syncwarp();
                    if (lane == 0) mbar_arrive(pipe.x_empty(prev));
                    prev = -1;
                    epilogue_fragment<16, 1, WN / 8, false>(acc, p.proj_rule, take_buffer(c * RBUF + u % RBUF), g, tig,
                                                            n0 + part * WN);
#pragma unroll
                    for (int i = 0; i < WN / 2; ++i) acc[0][i] = init;   // the tail's accumulators
                }
            }
            if (Cfg::PINGPONG) mbar_arrive(pipe.mma_turn(1 - c));   // this tile's wgmmas are all issued
            WGW_TRACE(2);
            wgmma_wait<0>();
            WGW_TRACE(3);
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(pipe.x_empty(prev));
                if (EXTRA && reloads) mbar_arrive(pipe.mma_done(c));
            }

            // ---- epilogue: in registers, written in place over the residual tile, then 16-byte stores ----
            int const b = c * RBUF + u % RBUF, m0 = tiles.template m_block<EXTRA>(t) * BM;
            int8_t* const w_tile = FUSED ? warp_part(b) : take_buffer(b);
            WGW_TRACE(4);
            // NEXT_N: the output words of 16-channel group j, rows g and g + 8, kept as the next GEMM's A fragments
            [[maybe_unused]] uint32_t next_a[NEXT_N > 0 ? NI / 2 : 1][2];
            [[maybe_unused]] int acc2[HALVES][1][32];   // the next conv's accumulators
            if constexpr (NEXT_N > 0) {
                epilogue_fragment<16, 1, NI, RESIDUAL || FUSED>(
                    acc, p.rule, w_tile, g, tig, n0, [&](int j, int, int h, uint32_t word) { next_a[j][h] = word; });
                Next::issue(p, w2_full, sW2, next_a, acc2, u == 0);
            } else {
                epilogue_fragment<16, 1, WN / 8, RESIDUAL || FUSED>(acc, p.rule, w_tile, g, tig, n0 + part * WN);
            }
            WGW_TRACE(5);
            // the next tile's accumulators, set here: the moves then overlap the wait below instead of delaying the
            // next tile's first wgmma (measured: ~1k cycles between a tile's start and its first wgmma otherwise).
            // With a next conv, after it: its registers would otherwise hold these and the next GEMM's at once.
            auto reset_acc = [&] {
#pragma unroll
                for (int i = 0; i < WN / 2; ++i)   // stays here
                    asm volatile("mov.b32 %0, %1;\n" : "=r"(acc[0][i]) : "r"(init0));
            };
            if constexpr (NEXT_N == 0) reset_acc();
            // ---- epilogue store: this warp's 16 rows from wm0 ----
            int const wm0 = m0 + warp_in_wg * 16;
            wgw_store_rows<Cfg>(p, pipe, w_tile, wm0, n0, part, lane, my_row, my_half, b, owed, slab_bytes);
            if constexpr (NEXT_N > 0) {
                Next::finish(p, acc2, wm0, g, tig);
                reset_acc();
            }
            WGW_TRACE(6);
        }
    };
    if constexpr (Cfg::PINGPONG) {   // the only configs with extra blocks
        if (tiles.extra) consume(std::true_type{});
        else consume(std::false_type{});
    } else {
        consume(std::false_type{});
    }
    if (lane == 0) {
        pay_owed();
        bulk_wait<0, false>();   // the output stores complete before the block ends
    }
    if (t128 == 0 && part == 0) WGW_SPAN(1 + c);
#else
    (void)p;   // not an sm_90a pass: never launched (the host checks kHasWgmma first)
#endif
}

}  // namespace rconv
}  // namespace trtfuse
