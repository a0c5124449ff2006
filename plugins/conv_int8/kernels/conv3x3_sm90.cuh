// The Hopper (sm_90a) 3x3 conv (padding 1, stride 1 or 2) + folded BN (+ReLU), int8 kCHW32 in and out, as an implicit
// GEMM on halo tiles ("halo_*" configs). The rounding rule is the library's (epilogue.cuh), without a residual.
//
// Why halo tiles: the first 3x3 form (branch wip/conv3x3-per-tap) copied each tap's input rows into its own k stage,
// so every input byte was read 9 times and the producers' per-tap address work was the limit (2x slower than
// TensorRT 8.5). Here a tile's input rows come in once per 32-channel slab, by one TMA box that includes the zero
// padding, and the 9 taps are 9 views of that box:
//
//   A tile of R output rows of one image is a GEMM of 64 * MB "padded" rows o = r * Wp + x (Wp = W + 2; rows with
//   x >= W, or r >= R, are computed and thrown away). Its halo box holds input rows y0 - 1 .. y0 + R and columns
//   -1 .. W (TMA fills what lies outside the image with zeros) as rows q = yy * Wp + xx of 32 bytes. Output row o
//   reads tap (dy, dx) from box row o + dy * Wp + dx: each tap's A operand is the box itself, its wgmma descriptor
//   started dy * Wp + dx rows further. With the 32-byte swizzle the hardware swizzles by address bits, so a start
//   at any row reads right, with base offset 0 (benchmarks/experiments/wgmma_desc_shift.cu, run on the H100: every shift
//   0..19 exact), and the box's rows need no rearranging.
//
// Stride 2: output (y, x) reads input (2y + dy - 1, 2x + dx - 1). A slot holds four phase boxes, loaded with TMA
// element strides of 2: odd or even input rows (2k - 1 or 2k, k = y0 .. y0 + R) times odd or even columns (2j - 1 or
// 2j, j = 0 .. W), each as rows k * Wp + j (Wp = W + 1). Tap (dy, dx) reads the phase box of (dy odd ? even rows :
// odd rows, dx likewise) shifted by (dy == 2) Wp + (dx == 2) rows: the same shifted-descriptor trick, 4 boxes a slab.
//
// WREG (weights stationary in registers): the GEMM transposed, out^T = w x^T. The weights are wgmma's A operand,
// held in the consumers' registers for the whole launch (one m64 block of output channels, Cin <= 64: 9 taps x 2
// slabs x 4 registers), and the halo box is its B operand, 256 padded rows per wgmma m64n256k32 under the same
// shifted descriptors. Each wgmma then reads only its 8 KB of B from shared memory (the form above reads 4 x (2 +
// 2) KB for the same 256 x 64 x 32 MACs at Cout 64), and the accumulator rows are channels: a thread holds two of
// them for 64 pixels, packs four channels of a pixel with its neighbour lane (one shuffle per two pixels) and
// stores to a staging tile of padded rows (R x Wp, the store's box clips the columns past W).
//
// Block: NC + 1 warpgroups. Warpgroups 0 .. NC - 1 are consumers: consumer c takes the block's tiles c, c + NC, ...
// (with PINGPONG, issuing in turns, in consumer order); per slab it issues 9 taps x MB wgmma m64nBNk32 (one commit
// group), then rounds its accumulators into a staging tile [BN/32 slabs][R*W rows][32 bytes] in shared memory, which
// one TMA store writes to the output (rows past H are clipped by the store). Warpgroup NC: thread 0 loads the weight
// slice (bulk copies, once), and lane 0 of its warp c loads consumer c's halo boxes into its ring of STAGES slots.
// More consumers with smaller tiles give each scheduler more consumer warps: ncu put the 2-consumer kernel's issue
// slots 54 % idle at layer1, where three consumers of 2 x 64 rows are 3.5 % faster (docs/residual_conv.md, Version 20).
// The weight slice of the block's N block (BN output channels x 9 Cin, packed as the sm90 1x1 kernel's: tile_layout.h)
// stays in shared memory: Cout <= BN covers ResNet-50's layer1 and layer2 (BN 64: 40 and 74 KB; BN 128: 147 KB).
//
// Compiled only in the sm_90a pass (ptx_sm90.cuh; kHasWgmma guards the launch).
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>

#include "conv_int8/core/epilogue.cuh"
#include "conv_int8/core/params.h"
#include "conv_int8/core/ptx_sm90.cuh"

namespace trtfuse {
namespace rconv {

// Kernel arguments of the 3x3 conv (the host fills them: host/launch_conv3x3.cu).
struct Conv3Params {
    CUtensorMap in_map;    // x as (32 bytes, W_in, H_in, N * Kc), 32-byte swizzle, zero fill; box (32, Wp, R + 2, 1) at
                           // stride 1, (32, 2 Wp, 2 (R + 1), 1) with element strides (1, 2, 2, 1) at stride 2
    CUtensorMap out_map;   // out as (32 bytes, W, H, Nc, N), box (32, W, R, BN / 32, 1), 32-byte swizzle (WREG: box
                           // (32, Wp, R, ..): its columns past W are clipped)
    Rule rule;             // the layer's rule (no residual: s is 0)
    int8_t const* w_img;   // weight slices of BN rows (tile_layout.h: pack_weight_slices), k = tap * Kc * 32 + ch
    int Kpad;              // weight row bytes (9 * Kc * 32, padded to 128)
    int Kc;                // input slabs (ceil(Cin / 32))
    int stride;            // 1, or 2 (four phase boxes per slab, see above)
    int H, W, Wp;          // output size; Wp: a box row (W + 2 at stride 1, W + 1 at stride 2)
    int R;                 // output rows per tile (R * Wp <= 64 * MB)
    int tiles_per_img;     // ceil(H / R)
    int m_tiles;           // N * tiles_per_img
    int n_blocks;          // ceil(Nc * 32 / BN); the grid is a multiple of it
    uint32_t slot_bytes;   // one halo slot in shared memory (multiple of 1024)
    uint32_t phase_bytes;  // stride 2: one phase box of a slot (a quarter of it)
    uint32_t stage_bytes;  // one staging tile (multiple of 1024)
};

// BN: N tile (64 or 128); MB: m64 blocks per consumer tile (MB * BN / 2 accumulators per thread); STAGES: halo slots
// per consumer; SBUF: staging tiles per consumer (2: a tile's store may still be read while the next is written).
// PINGPONG: the consumers take turns issuing their tiles' wgmmas (an mbarrier per consumer), so that one's epilogue
// runs while the others' wgmmas do; without turns they tend to reach their epilogues together. NC: consumer
// warpgroups (2 to 4; the producer warpgroup has a warp per consumer).
// WREG: weights stationary in registers (above), for inputs of up to kWregSlabs slabs (the host refuses deeper ones).
constexpr int kWregSlabs = 2;
template <int BN_, int MB_, int STAGES_, int SBUF_, bool PINGPONG_ = false, int NC_ = 2, bool WREG_ = false>
struct HaloConfig {
    static constexpr int BN = BN_, MB = MB_, BM = 64 * MB_, STAGES = STAGES_, SBUF = SBUF_, NC = NC_;
    static constexpr bool PINGPONG = PINGPONG_, WREG = WREG_;
    static constexpr int W_REGS = WREG ? kWregSlabs * 9 * 4 : 0;   // A fragments: 9 taps x kWregSlabs slabs
    static constexpr int ACC_BLOCKS = WREG ? 1 : MB;           // accumulator blocks: MB m64nBN, or one m64nBM
    static constexpr int ACC_REGS = WREG ? BM / 2 : BN / 2;
    static constexpr int THREADS = (NC + 1) * 128;
    // setmaxnreg moves registers from the producers to the consumers within the block's launch allocation
    // (ptx_sm90.cuh: consumer_regs); at most 232 (two consumers)
    static constexpr int LAUNCH_REGS = launch_regs(THREADS);
    static constexpr int PRODUCER_REGS = 40;
    static constexpr int CONSUMER_REGS_FIT = consumer_regs(THREADS, PRODUCER_REGS);
    static constexpr int CONSUMER_REGS = CONSUMER_REGS_FIT < 232 ? CONSUMER_REGS_FIT : 232;
    static_assert(NC >= 2 && NC <= 4, "consumer warpgroups: one producer warp each");
    static_assert(ACC_BLOCKS * ACC_REGS + W_REGS + 32 <= CONSUMER_REGS, "accumulators (and weights) per thread");
    static_assert(!WREG || (BN == 64 && BM == 256), "WREG: 64 output channels (A) x 256 padded rows (B) per wgmma");
    static_assert(BN == 64 || BN == 128, "wgmma N tiles of this kernel");
    // a consumer releases a slot once the next slab's wgmmas are issued, which with one slot is the one it waits for
    // (a config with STAGES 1 hung on the H100)
    static_assert(STAGES >= 2, "two halo slots per consumer at least");
    static_assert(128 * NC * CONSUMER_REGS + 128 * PRODUCER_REGS <= THREADS * LAUNCH_REGS, "register file");
};

// Shared memory of a launch: [1 KB alignment slack][weights BN x Kpad][NC x STAGES slots][NC x SBUF staging]
// [the N block's rule constants a, b: 2 x BN floats][barriers: weights, full and empty per slot, a turn per consumer]
template <class Cfg>
TRTFUSE_RCONV_HD int halo_smem_bytes(int kpad, int slot_bytes, int stage_bytes) {
    return 1024 + Cfg::BN * kpad + Cfg::NC * Cfg::STAGES * slot_bytes + Cfg::NC * Cfg::SBUF * stage_bytes +
           8 * Cfg::BN + 8 * (1 + 2 * Cfg::NC * Cfg::STAGES + Cfg::NC);
}

#if defined(__CUDACC__)
// The 32-byte swizzle by address (tile_layout.h: swz_offset) of byte `byte` of linear 32-byte row `row`, from a
// 256-byte aligned base: rows of the staging tile are [slab][R*W], and R*W need not be a multiple of 8.
__device__ __forceinline__ uint32_t swz_row(int row, int byte) {
    return (static_cast<uint32_t>(row) << 5) + ((((byte >> 4) ^ (row >> 2)) & 1) << 4) + (byte & 15);
}

// The epilogue of one consumer tile: accumulators -> rounded bytes in the staging tile. dst[mb][h]: the staging row
// of this thread's padded rows (mb * 64 + 16 warp + g + 8 h), -1 for rows thrown away. ab: the N block's rule
// constants a then b (BN each; the saturating form's a8, b8 where SAT), staged in shared memory once per block: read
// from global memory in the loop they put a load's latency on every 16-channel step.
template <class Cfg, bool SMALL, bool SAT>
__device__ __forceinline__ void halo_epilogue(int const (&acc)[Cfg::MB][Cfg::BN / 2], float const* ab, float lo,
                                              int const (&dst)[Cfg::MB][2], int8_t* stage, int rows, int tig) {
    std::integral_constant<bool, SMALL> small;
#pragma unroll
    for (int n = 0; n < Cfg::BN / 8; n += 2) {   // n8 chunks n, n + 1: channels 16 (n / 2) + 4 tig .. + 3
        int const col = n * 8 + tig * 4, slab_row0 = (col >> 5) * rows;
        float4 const a = *reinterpret_cast<float4 const*>(ab + col);
        float4 const b = *reinterpret_cast<float4 const*>(ab + Cfg::BN + col);
#pragma unroll
        for (int mb = 0; mb < Cfg::MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (dst[mb][h] < 0) continue;
                float const c[4] = {acc_bits_to_float(acc[mb][4 * n + 2 * h], small),
                                    acc_bits_to_float(acc[mb][4 * n + 2 * h + 1], small),
                                    acc_bits_to_float(acc[mb][4 * n + 4 + 2 * h], small),
                                    acc_bits_to_float(acc[mb][4 * n + 4 + 2 * h + 1], small)};
                uint32_t const q = q_quad_t<SAT>(rule_t_plain<SAT>(c[0], a.x, b.x), rule_t_plain<SAT>(c[1], a.y, b.y),
                                                 rule_t_plain<SAT>(c[2], a.z, b.z), rule_t_plain<SAT>(c[3], a.w, b.w),
                                                 lo);
                *reinterpret_cast<uint32_t*>(stage + swz_row(slab_row0 + dst[mb][h], col & 31)) = q;
            }
    }
}

// WREG's epilogue: acc is out^T, rows = 2 channels of this thread (a, b: ab = a0, a1, b0, b1), columns = padded rows
// 8 j + 2 tig + e. Each thread rounds its 2 x 2 bytes of padded rows 8 j + 2 tig (+1), swaps half of them with lane
// ^ 4 (which holds the quad's other two channels), and stores a word of four channels: even g for row 8 j + 2 tig,
// odd g for + 1 (sel). addr0: its word's staging offset at j = 0 (+256 per j: 8 rows, the swizzle bit unchanged);
// q: its row at j = 0; rows: padded rows in the tile (past them nothing is stored).
template <int BM, bool SMALL, bool SAT>
__device__ __forceinline__ void halo_epilogue_t(int const (&acc)[BM / 2], float4 ab, float lo, int8_t* stage,
                                                uint32_t addr0, int q, int rows, uint32_t sel) {
    std::integral_constant<bool, SMALL> small;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
        float const c[4] = {acc_bits_to_float(acc[4 * j], small), acc_bits_to_float(acc[4 * j + 1], small),
                            acc_bits_to_float(acc[4 * j + 2], small), acc_bits_to_float(acc[4 * j + 3], small)};
        // bytes: (channel 0, row e = 0), (channel 1, e = 0), (channel 0, e = 1), (channel 1, e = 1)
        uint32_t const word =
            q_quad_t<SAT>(rule_t_plain<SAT>(c[0], ab.x, ab.z), rule_t_plain<SAT>(c[2], ab.y, ab.w),
                          rule_t_plain<SAT>(c[1], ab.x, ab.z), rule_t_plain<SAT>(c[3], ab.y, ab.w), lo);
        uint32_t const other = __shfl_xor_sync(0xffffffffu, word, 4);
        if (8 * j + q < rows) *reinterpret_cast<uint32_t*>(stage + addr0 + 256 * j) = __byte_perm(word, other, sel);
    }
}

// A tap's start in a halo slot, in 16-byte units: dy Wp + dx rows; stride 2: its phase box, then (dy == 2) Wp +
// (dx == 2) rows
__device__ __forceinline__ uint32_t halo_tap_shift(Conv3Params const& p, int tap) {
    int const dy = tap / 3, dx = tap % 3, phase = (dy == 1) * 2 + (dx == 1);
    return p.stride == 1 ? (dy * p.Wp + dx) * 2 : phase * (p.phase_bytes >> 4) + ((dy == 2) * p.Wp + (dx == 2)) * 2;
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1) conv3x3_kernel_sm90(const __grid_constant__ Conv3Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = Cfg::BN, MB = Cfg::MB, STAGES = Cfg::STAGES, SBUF = Cfg::SBUF, NC = Cfg::NC;
    extern __shared__ uint8_t smem_raw[];
    // TMA boxes with a swizzle, and the wgmma descriptors' swizzle phase, want 1 KB-aligned tiles
    uint32_t const raw = smem_u32(smem_raw);
    int8_t* const base = reinterpret_cast<int8_t*>(smem_raw) + (((raw + 1023) & ~1023u) - raw);
    int8_t* const sW = base;
    int8_t* const sA = sW + BN * p.Kpad;
    int8_t* const sS = sA + NC * STAGES * p.slot_bytes;
    float* const sAB = reinterpret_cast<float*>(sS + NC * SBUF * p.stage_bytes);   // [a: BN][b: BN]
    uint64_t* const bars = reinterpret_cast<uint64_t*>(sAB + 2 * BN);
    auto w_full = [&] { return smem_u32(bars); };
    auto full = [&](int c, int s) { return smem_u32(bars + 1 + c * STAGES + s); };
    auto empty = [&](int c, int s) { return smem_u32(bars + 1 + NC * STAGES + c * STAGES + s); };
    auto mma_turn = [&](int c) { return smem_u32(bars + 1 + 2 * NC * STAGES + c); };   // PINGPONG: c may issue

    int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        mbar_init(w_full(), 1);
        for (int c = 0; c < NC; ++c)
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(full(c, s), 1);    // the producer's expect_tx arrival; the box's bytes complete it
                mbar_init(empty(c, s), 4);   // lane 0 of each consumer warp, once its wgmmas read the slot
            }
        for (int c = 0; c < NC; ++c) mbar_init(mma_turn(c), 128);   // every thread of the consumer before it
        fence_mbarrier_init();
    }
    // this block's tiles: N block nb, M tiles m_first, m_first + m_step, ... (the grid is a multiple of n_blocks)
    int const nb = blockIdx.x % p.n_blocks, m_first = blockIdx.x / p.n_blocks, m_step = gridDim.x / p.n_blocks;
    // the N block's rule constants (the saturating form's where the epilogue takes it)
    for (int i = tid; i < 2 * BN; i += Cfg::THREADS)
        sAB[i] = (i < BN ? (p.rule.sat ? p.rule.a8 : p.rule.a) : (p.rule.sat ? p.rule.b8 : p.rule.b))[nb * BN + i % BN];
    __syncthreads();

    int const my_tiles = m_first < p.m_tiles ? (p.m_tiles - 1 - m_first) / m_step + 1 : 0;

    if (warp >= 4 * NC) {   // ---------------- producers ----------------
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        int const c = warp - 4 * NC;
        if (c >= NC || lane != 0) return;
        if (c == 0) {   // the weight slice, once, ahead of the halo boxes
            int const bytes = BN * p.Kpad, chunk = 16 * 1024;
            mbar_arrive_expect_tx(w_full(), bytes);
            int8_t const* src = p.w_img + static_cast<int64_t>(nb) * bytes;
            for (int off = 0; off < bytes; off += chunk)
                bulk_load(smem_u32(sW) + off, src + off, min(chunk, bytes - off), w_full());
        }
        uint32_t const box_bytes = p.stride == 1 ? (p.R + 2) * p.Wp * 32 : 4 * (p.R + 1) * p.Wp * 32;
        for (int t = c, u = 0; t < my_tiles; t += NC, ++u) {
            int const mt = m_first + t * m_step, img = mt / p.tiles_per_img, y0 = (mt - img * p.tiles_per_img) * p.R;
            for (int s = 0; s < p.Kc; ++s) {
                int const fill = u * p.Kc + s, slot = fill % STAGES;
                mbar_wait(empty(c, slot), ((fill / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(full(c, slot), box_bytes);
                uint32_t const dst = smem_u32(sA + (c * STAGES + slot) * p.slot_bytes);
                if (p.stride == 1) {
                    tma_load_4d(&p.in_map, dst, full(c, slot), 0, -1, y0 - 1, img * p.Kc + s);
                } else {   // phase boxes (row parity, column parity): odd = from -1, even = from 0
                    for (int ph = 0; ph < 4; ++ph)
                        tma_load_4d(&p.in_map, dst + ph * p.phase_bytes, full(c, slot), 0, ph & 1 ? 0 : -1,
                                    ph & 2 ? 2 * y0 : 2 * y0 - 1, img * p.Kc + s);
                }
            }
        }
        return;
    }

    // ---------------- consumers ----------------
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    int const c = warp >> 2, t128 = tid & 127, warp_in_wg = warp & 3;
    int const g = lane >> 2, tig = lane & 3;
    int const rows = p.R * (Cfg::WREG ? p.Wp : p.W);   // staging rows per slab (WREG: padded rows)
    // the staging rows of this thread's accumulator rows, the same for every tile
    int dst[MB][2] = {};
    // WREG: the weight fragments (rows: channels 16 warp + 4 (g >> 1) + 2 (g & 1) + h, so that lanes g and g ^ 1
    // hold a quad of consecutive channels), this thread's two channels' rule constants, and its staging word
    uint32_t wfrag[Cfg::WREG ? kWregSlabs : 1][9][4] = {};
    float4 ab_t{};
    uint32_t st_addr0 = 0, sel = 0;
    int q = 0;
    if constexpr (Cfg::WREG) {
        // ldmatrix.x4: lane's matrix m = lane >> 3 (h = m & 1, k bytes 16 (m >> 1) ..), its row i = lane & 7 (= g):
        // the packed row holding channel 16 warp + 4 (i >> 1) + 2 (i & 1) + h (tile_layout.h: packed_row_channel)
        int const m = lane >> 3, i = lane & 7;
        uint32_t const w_lane =
            smem_u32(sW) + swz_offset(0, BN, warp_in_wg * 16 + 8 * (i & 1) + 2 * (i >> 1) + (m & 1), 16 * (m >> 1));
        mbar_wait(w_full(), 0);
#pragma unroll
        for (int s = 0; s < kWregSlabs; ++s)   // slab s, tap t: k chunk t * Kc + s (BN x 32 bytes each)
#pragma unroll
            for (int tap = 0; tap < 9; ++tap)
                if (s < p.Kc) ldmatrix_x4(wfrag[s][tap], w_lane + (tap * p.Kc + s) * BN * 32);
        int const ch = warp_in_wg * 16 + 4 * (g >> 1) + 2 * (g & 1);
        ab_t = make_float4(sAB[ch], sAB[ch + 1], sAB[BN + ch], sAB[BN + ch + 1]);
        q = 2 * tig + (g & 1);
        st_addr0 = swz_row((warp_in_wg >> 1) * rows + q, 16 * (warp_in_wg & 1) + 4 * (g >> 1));
        sel = g & 1 ? 0x3276u : 0x5410u;
    } else {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int const o = mb * 64 + warp_in_wg * 16 + g + 8 * h, r = o / p.Wp, x = o - r * p.Wp;
                dst[mb][h] = r < p.R && x < p.W ? r * p.W + x : -1;
            }
    }
    // Descriptors (ptx_sm90.cuh: smem_desc) change only in their start address, the low 32 bits: the taps' and
    // slots' offsets are 32-bit adds to it (as 64-bit adds they were two instructions per wgmma operand).
    uint64_t const descW = smem_desc(smem_u32(sW)), descA = smem_desc(smem_u32(sA + c * STAGES * p.slot_bytes));
    uint32_t const w_lo = static_cast<uint32_t>(descW), a_lo = static_cast<uint32_t>(descA);
    uint32_t const desc_hi = static_cast<uint32_t>(descA >> 32);   // the same for both
    auto desc = [&](uint32_t lo) { return (static_cast<uint64_t>(desc_hi) << 32) | lo; };
    int8_t* const stage0 = sS + c * SBUF * p.stage_bytes;
    // Accumulators start at 0 by the first wgmma's scale-d 0 (no moves per tile), or at the magic bits where
    // |acc| < 2^22 (epilogue.cuh: Rule::small_acc), which the wgmmas then add to.
    bool const small = p.rule.small_acc;
    int acc[Cfg::ACC_BLOCKS][Cfg::ACC_REGS];

    for (int t = c, u = 0; t < my_tiles; t += NC, ++u) {
        int const mt = m_first + t * m_step, img = mt / p.tiles_per_img, y0 = (mt - img * p.tiles_per_img) * p.R;
        if (small) {
#pragma unroll
            for (int mb = 0; mb < Cfg::ACC_BLOCKS; ++mb)
#pragma unroll
                for (int i = 0; i < Cfg::ACC_REGS; ++i) acc[mb][i] = kMagicBits;
        }
        int prev = -1;
        // PINGPONG: tile u of consumers 0, 1, .., NC - 1, then tile u + 1 of consumer 0, ...: consumer c's turn
        // completes one phase per tile of the consumer before it (consumer 0's: of consumer NC - 1's previous tile).
        // Each waits at most one phase ahead: the consumer before it cannot pass a turn it has not been given.
        if (Cfg::PINGPONG && (c > 0 || u > 0)) mbar_wait(mma_turn(c), (c > 0 ? u : u - 1) & 1);
        // one slab: wait for its halo box, issue its taps' wgmmas (one commit group), release the previous slab's slot
        // once its wgmmas are done. issue(slot start in 16-byte units, whether the accumulators hold a start)
        auto slab = [&](int s, auto&& issue) {
            int const fill = u * p.Kc + s, slot = fill % STAGES;
            mbar_wait(full(c, slot), (fill / STAGES) & 1);
            if (!Cfg::WREG && u == 0 && s == 0) mbar_wait(w_full(), 0);
            wgmma_fence();
            issue(a_lo + ((slot * p.slot_bytes) >> 4), small || s > 0);
            wgmma_commit();
            if (prev >= 0) {
                wgmma_wait<1>();
                __syncwarp();
                if (lane == 0) mbar_arrive(empty(c, prev));
            }
            prev = slot;
        };
        if constexpr (Cfg::WREG) {
#pragma unroll
            for (int s = 0; s < kWregSlabs; ++s)
                if (s < p.Kc)
                    slab(s, [&](uint32_t b_slot, bool started) {
#pragma unroll
                        for (int tap = 0; tap < 9; ++tap)
                            wgmma_m64n256k32_s8_rs(acc[0], wfrag[s][tap], desc(b_slot + halo_tap_shift(p, tap)),
                                                   started || tap > 0);
                    });
        } else {
            for (int s = 0; s < p.Kc; ++s)
                slab(s, [&](uint32_t a_slot, bool started) {
#pragma unroll
                    for (int tap = 0; tap < 9; ++tap) {
                        uint32_t const shift = halo_tap_shift(p, tap);
                        uint32_t const w = w_lo + (((tap * p.Kc + s) * BN * 32) >> 4);
                        int const scale_d = started || tap > 0;   // 0: this wgmma starts the accumulators
#pragma unroll
                        for (int mb = 0; mb < MB; ++mb)
                            wgmma_m64k32_s8<BN>(acc[mb], desc(a_slot + mb * 128 + shift), desc(w), scale_d);
                    }
                });
        }
        if (Cfg::PINGPONG) mbar_arrive(mma_turn((c + 1) % NC));   // this tile's wgmmas are all issued
        wgmma_wait<0>();
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(c, prev));

        // ---- epilogue: staging tile u % SBUF, once the store that last read it is done reading ----
        int8_t* const stage = stage0 + (u % SBUF) * p.stage_bytes;
        if (t128 == 0) bulk_wait<SBUF - 1, true>();
        named_barrier_sync(1 + c, 128);
        with_rule_form(p.rule.sat, small, [&](auto sat, auto small_c) {
            constexpr bool SAT = decltype(sat)::value, SMALL = decltype(small_c)::value;
            if constexpr (Cfg::WREG)
                halo_epilogue_t<Cfg::BM, SMALL, SAT>(acc[0], ab_t, p.rule.lo, stage, st_addr0, q, rows, sel);
            else
                halo_epilogue<Cfg, SMALL, SAT>(acc, sAB, p.rule.lo, dst, stage, rows, tig);
        });
        fence_proxy_async_smem();   // the staging bytes (generic writes) -> the TMA engine's reads
        named_barrier_sync(1 + c, 128);
        if (t128 == 0) {
            tma_store_5d(&p.out_map, smem_u32(stage), 0, 0, y0, nb * BN / 32, img);
            bulk_commit();
        }
    }
    if (t128 == 0) bulk_wait<0, false>();   // the output stores complete before the block ends
#else
    (void)p;   // not an sm_90a pass: never launched (the host checks kHasWgmma first)
#endif
}
#endif  // __CUDACC__

}  // namespace rconv
}  // namespace trtfuse
