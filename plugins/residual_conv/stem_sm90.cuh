// The Hopper (sm_90a) ResNet stem: 7x7 conv (stride 2, padding 3) + folded BN + ReLU + 3x3 max pool (stride 2,
// padding 1) in one kernel. In: the network's int8 input, linear NCHW with Cin <= 4 (no reformat ahead of it). Out:
// int8 kCHW32, Cout <= 64. The conv is rounded by the library's rule (epilogue.cuh); the pool takes the max of the
// rounded bytes, which is the rounded max (the rule is monotone in acc: a > 0), so the output is what the conv's own
// rounding followed by a max pool gives.
//
// Why A comes from registers: an implicit-GEMM row (output pixel x, kernel row ky) is 7 taps x Cin bytes spread over
// Cin planes at input columns 2x - 3 .., two bytes further per output pixel: no wgmma shared-memory layout (8-row
// core matrices of 16-byte rows) describes it, and copying it into one (im2col in shared memory) would write every
// input byte ~24 times. The register form of wgmma takes the A fragment from each thread instead, and a thread's 4
// bytes (4 consecutive taps of one channel) are one aligned 32-bit load:
//
//   K of kernel row ky is one k32 step: k = c * 8 + kx (c < 4 channels, kx < 8 taps; tap 7 and channels >= Cin have
//   zero weights). The fragment register of (pixel x, k 4t .. 4t + 3) holds input bytes 2x - 3 + kx0 .. + 3 of
//   channel c (kx0 = 0 or 4): 4-byte aligned only where the row's start makes it so, and consecutive pixels are 2
//   bytes apart. A TMA box must start at a 16-byte aligned column (a start of -3 faults as an illegal instruction),
//   so the box lands at column -16 and the block builds two copies of it shifted by 3 and by 1 byte (a funnel shift
//   per word): even pixels read the first, odd ones the second, at byte 4 (x / 2) + 16 + kx0, aligned.
//   Row order: each conv row's even pixels first, then its odd ones, so 8 consecutive GEMM rows (a load's 8 row
//   lanes) read one copy at consecutive words, and the two channels of a load fall on disjoint banks: a copy's
//   channel planes are 16 words (mod 32) apart.
//
// Pool first, round after: the rule is monotone in acc (a > 0: every scale is), so the rounded max is the max of the
// rounded values, and the max can be taken over the raw int32 accumulators. The rule then runs once per pooled
// output, a quarter of the conv's outputs. (The first version rounded every conv output into an int8 staging tile
// and pooled the bytes: 2.45 ms at batch 2048 on the H100, instruction-bound; docs/residual_conv.md, Version 16.)
//
// Block: one band of P pooled rows of one image = conv rows 2 py0 - 1 .. 2 py0 + 2P - 1 (R = 2P + 1; the row shared
// with the next band is computed twice). 256 threads, two warpgroups: warpgroup j owns GEMM rows 64 j .. 64 j + 63 of
// every conv row (the row order's pixels; past Wc they are computed and thrown away), so a thread owns the same two
// pixels x 16 channels in every conv row. One TMA load brings the band's input rows (zero padding included) into the
// pooling tile, which the copies are built from; one bulk copy the weights ([7 ky][64 rows][32 k], the 32-byte
// swizzle). Per conv row each warpgroup loads its 7 A fragments and issues 7 wgmma m64n64k32; each thread keeps
// the vertical max of the pooled row in progress in registers (a pooled row's three conv rows are consecutive). When
// a pooled row is complete its vertical maxima go to the pooling tile (int32 [Wc pixels][64 channels], in natural
// pixel order), and after a barrier every thread takes output words (4 channels of a pooled pixel): the max of three
// pixels' words, then the rule, one 32-bit store. Two blocks fit an SM, so one block's pooling overlaps the other's
// wgmmas.
//
// Compiled only in the sm_90a pass (ptx_sm90.cuh; kHasWgmma guards the launch).
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "residual_conv/epilogue.cuh"
#include "residual_conv/params.h"
#include "residual_conv/ptx_sm90.cuh"

namespace trtfuse {
namespace rconv {

constexpr int kStemTaps = 7;                              // kernel rows = k32 steps
constexpr int kStemN = 64;                                // output channels computed (Cout <= 64, zero padded)
constexpr int kStemMaxCin = 4;                            // channels of one k32 step (8 taps each)
constexpr int kStemWBytes = kStemTaps * kStemN * 32;      // the weight slice
constexpr int kStemThreads = 256;
constexpr int kStemBoxRow = 256;                          // a box row in bytes (W <= 236: 2 Wc + 19 <= 256)

// The band geometry of P pooled rows per block (the configuration): conv rows R, input rows IR of the box, a copy's
// channel plane (IR rows, then 64 bytes: 16 banks between planes). Two blocks an SM (P <= 8 fits their shared memory).
template <int P_>
struct StemBand {
    static constexpr int P = P_, R = 2 * P + 1, IR = 2 * R + 5;
    static constexpr int BOX_PLANE = IR * kStemBoxRow, PLANE = BOX_PLANE + 64;
};

// Kernel arguments of the stem (the host fills them: residual_conv.cu, launch_stem).
struct StemParams {
    CUtensorMap in_map;    // x as (W, H, Cin, N) bytes, box (256, IR, Cin, 1), zero fill outside the image
    Rule rule;             // the conv's rule (no residual)
    int8_t const* w_img;   // [7 ky][64 rows][32 k] (tile_layout.h: pack_weight_slices), k = c * 8 + kx
    int8_t* out;           // [N][Nc][Hp][Wp][32]
    int Cin, Nc;           // input channels; output slabs (ceil(Cout / 32))
    int Hc, Wc, Hp, Wp;    // conv output and pooled output sizes
    int half_w;            // (Wc + 1) / 2: the even pixels of a conv row, which come first in the row order
    int bands;             // ceil(Hp / P): blocks per image
    uint32_t copy_bytes;   // a copy (Cin planes, rounded up to 256 bytes)
    uint32_t pool_bytes;   // the pooling tile: Wc x 256 bytes, and at least the TMA box, rounded up to 256
};

// Shared memory of a launch: [256-byte alignment slack: the weights' 32-byte swizzle repeats every 256][weights][2
// copies][pooling tile (first the TMA box)][rule constants a, b][each thread's two A addresses][barrier]. P = 3 keeps
// it under half of the SM up to P = 8 (105 KB at ResNet-50's 224 x 224).
TRTFUSE_RCONV_HD int stem_smem_bytes(int copy_bytes, int pool_bytes) {
    return 256 + kStemWBytes + 2 * copy_bytes + pool_bytes + 8 * kStemN + 8 * kStemThreads + 16;
}

#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
// Keeps v in a register, unchanged, up to here: an A fragment must not be overwritten while a wgmma may read it.
__device__ __forceinline__ void keep_reg(uint32_t& v) { asm volatile("" : "+r"(v)::"memory"); }

// The pooling tile's 16-byte word `chunk` (channels 4 chunk .. + 3) of pixel x: rows of 256 bytes, the chunk's
// bit 1 flipped by its bit 3 and its bit 0 by bit 1 of x. A read's 8 lanes (2 pooled pixels x 4 chunks 4 apart) then
// fall on distinct banks; a write's (2 pixels x 4 consecutive chunks) on two lanes a bank.
__device__ __forceinline__ uint32_t pool_offset(int x, int chunk) {
    return (static_cast<uint32_t>(x) << 8) + (static_cast<uint32_t>(chunk ^ (chunk >> 2 & 2) ^ (x >> 1 & 1)) << 4);
}

// One pooled row: the rule on the horizontal max of three pixels' vertical maxima (the pooling tile), one word per 4
// channels of a pooled pixel: thread t takes chunk t % (8 Nc) and pooled pixels t / (8 Nc), + 256 / (8 Nc), ...
// (Items of 16 channels, one 16-byte store each, were 7 % slower: a quarter as many independent items.)
template <bool SAT>
__device__ __forceinline__ void stem_pool_row(StemParams const& p, int8_t const* sP, float const* sAB, int img,
                                              int py) {
    int const shift = p.Nc == 2 ? 4 : 3;   // log2 of the chunks (8 Nc)
    int const chunk = threadIdx.x & ((1 << shift) - 1);
    float4 const a = *reinterpret_cast<float4 const*>(sAB + 4 * chunk);
    float4 const b = *reinterpret_cast<float4 const*>(sAB + kStemN + 4 * chunk);
    int8_t* const out =
        p.out + ((static_cast<int64_t>(img) * p.Nc + (chunk >> 3)) * p.Hp + py) * p.Wp * 32 + (chunk & 7) * 4;
    std::integral_constant<bool, false> exact_int;
    for (int ox = threadIdx.x >> shift; ox < p.Wp; ox += kStemThreads >> shift) {
        int4 m = *reinterpret_cast<int4 const*>(sP + pool_offset(2 * ox, chunk));
#pragma unroll
        for (int side = -1; side <= 1; side += 2) {
            int const x = 2 * ox + side;
            if (x < 0 || x >= p.Wc) continue;
            int4 const v = *reinterpret_cast<int4 const*>(sP + pool_offset(x, chunk));
            m = make_int4(max(m.x, v.x), max(m.y, v.y), max(m.z, v.z), max(m.w, v.w));
        }
        *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(ox) * 32) =
            q_quad_t<SAT>(rule_t_plain<SAT>(acc_bits_to_float(m.x, exact_int), a.x, b.x),
                          rule_t_plain<SAT>(acc_bits_to_float(m.y, exact_int), a.y, b.y),
                          rule_t_plain<SAT>(acc_bits_to_float(m.z, exact_int), a.z, b.z),
                          rule_t_plain<SAT>(acc_bits_to_float(m.w, exact_int), a.w, b.w), p.rule.lo);
    }
}

template <class Band>
__global__ void __launch_bounds__(kStemThreads, 2) stem_kernel_sm90(const __grid_constant__ StemParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int P = Band::P, R = Band::R, PLANE = Band::PLANE, BW = kStemBoxRow;
    extern __shared__ uint8_t smem_raw[];
    uint32_t const raw = smem_u32(smem_raw);
    int8_t* const base = reinterpret_cast<int8_t*>(smem_raw) + (((raw + 255) & ~255u) - raw);
    int8_t* const sW = base;
    int8_t* const sX = sW + kStemWBytes;
    int8_t* const sP = sX + 2 * p.copy_bytes;                          // the pooling tile (first the TMA box)
    float* const sAB = reinterpret_cast<float*>(sP + p.pool_bytes);   // [a: 64][b: 64]
    uint2* const sRow = reinterpret_cast<uint2*>(sAB + 2 * kStemN);     // [thread]: its two A addresses
    uint32_t const bar = smem_u32(sRow + kStemThreads);

    int const tid = threadIdx.x;
    int const img = blockIdx.x / p.bands, py0 = (blockIdx.x - img * p.bands) * P, cy0 = 2 * py0 - 1;
    if (tid == 0) {
        mbar_init(bar, 1);
        fence_mbarrier_init();
        mbar_arrive_expect_tx(bar, kStemWBytes + p.Cin * Band::BOX_PLANE);
        bulk_load(smem_u32(sW), p.w_img, kStemWBytes, bar);
        // the box into the pooling tile (free until the first pooled row): columns from -16 (a TMA box starts at a
        // 16-byte aligned column), input rows from 2 cy0 - 3
        tma_load_4d(&p.in_map, smem_u32(sP), bar, -16, 2 * cy0 - 3, 0, img);
    }
    for (int i = tid; i < 2 * kStemN; i += kStemThreads)
        sAB[i] = (i < kStemN ? (p.rule.sat ? p.rule.a8 : p.rule.a) : (p.rule.sat ? p.rule.b8 : p.rule.b))[i % kStemN];
    __syncthreads();   // the barrier's init and the rule constants
    mbar_wait(bar, 0);
    // The two copies: byte b of copy e is box byte b - (e ? 1 : 3), so box column c sits at c + 3 (c + 1). Each word
    // takes the box's word and the one before (across a row start that puts the previous row's last bytes at columns
    // 0..2, which no load reads: the first pixel's first byte is at 16).
    for (int c = 0; c < p.Cin; ++c) {   // 4 words a step (planes are 16-byte aligned)
        uint32_t const* box = reinterpret_cast<uint32_t const*>(sP + c * Band::BOX_PLANE);
        uint4* const even = reinterpret_cast<uint4*>(sX + c * PLANE);
        uint4* const odd = reinterpret_cast<uint4*>(sX + p.copy_bytes + c * PLANE);
        for (int i = tid; i < Band::BOX_PLANE / 16; i += kStemThreads) {
            uint4 const w = reinterpret_cast<uint4 const*>(box)[i];
            uint32_t const before = i > 0 ? box[4 * i - 1] : 0u;
            even[i] = make_uint4(__funnelshift_r(before, w.x, 8), __funnelshift_r(w.x, w.y, 8),
                                 __funnelshift_r(w.y, w.z, 8), __funnelshift_r(w.z, w.w, 8));
            odd[i] = make_uint4(__funnelshift_r(before, w.x, 24), __funnelshift_r(w.x, w.y, 24),
                                __funnelshift_r(w.y, w.z, 24), __funnelshift_r(w.z, w.w, 24));
        }
    }
    __syncthreads();   // the copies are whole; the pooling tile is free again

    int const warp = tid >> 5, lane = tid & 31, wg = warp >> 2, g = lane >> 2, tig = lane & 3;
    // this thread's k bytes: channel tig / 2 (registers 0, 1) and tig / 2 + 2 (registers 2, 3), taps 4 (tig & 1) ..;
    // a channel past Cin is zero padding of k, not read (its plane would lie past the copy)
    bool const lo = (tig >> 1) < p.Cin, hi = (tig >> 1) + 2 < p.Cin;
    uint64_t const descW = smem_desc(smem_u32(sW));
    // this thread's two pixels (GEMM rows 64 wg + 16 (warp % 4) + g and + 8): q of the row order, x, and the address
    // of their first conv row's first tap in their copy: byte 4 (x / 2) + 16, x = 2q (even) or 2 (q - half_w) + 1
    // (kept in shared memory: in registers, at 80 a thread, the compiler recomputed them at every conv row, 14 % of
    // the instructions)
    auto pixel = [&](int h) {   // -1 past the row
        int const q = 64 * wg + (warp & 3) * 16 + g + 8 * h;
        return q >= p.Wc ? -1 : q >= p.half_w ? 2 * (q - p.half_w) + 1 : 2 * q;
    };
    {
        uint32_t addr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int const q = min(64 * wg + (warp & 3) * 16 + g + 8 * h, p.Wc - 1), odd = q >= p.half_w;
            addr[h] = smem_u32(sX) + odd * p.copy_bytes + (tig >> 1) * PLANE + 4 * (tig & 1) +
                      4 * (odd ? q - p.half_w : q) + 16;
        }
        sRow[tid] = make_uint2(addr[0], addr[1]);   // read back by this thread only
    }

    // A pooled row's three conv rows are local rows 2pr .. 2pr + 2: row 2k closes pooled row k - 1 and opens k.
    // Rows outside the image are not computed (the top band's first, the bottom band's last ones).
    int const r_begin = cy0 < 0 ? 1 : 0, r_end = min(R, p.Hc - cy0);
    int vmax[kStemN / 2];   // the vertical max of the open pooled row
#pragma unroll
    for (int i = 0; i < kStemN / 2; ++i) vmax[i] = INT32_MIN;
    int open = 0;   // the pooled row vmax belongs to

    // the open pooled row's vertical maxima -> pooling tile -> stem_pool_row
    auto flush = [&](int pr) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int const x = pixel(h);
            if (x < 0) continue;
#pragma unroll
            for (int k = 0; k < kStemN / 16; ++k) {   // n8 chunks 2k, 2k + 1: channels 16k + 4 tig .. + 3
                int const n = 2 * k;
                *reinterpret_cast<int4*>(sP + pool_offset(x, 4 * k + tig)) =
                    make_int4(vmax[4 * n + 2 * h], vmax[4 * n + 2 * h + 1], vmax[4 * n + 4 + 2 * h],
                              vmax[4 * n + 4 + 2 * h + 1]);
            }
        }
        __syncthreads();   // the pooled row's vertical maxima are all in the tile
        if (p.rule.sat) stem_pool_row<true>(p, sP, sAB, img, py0 + pr);
        else stem_pool_row<false>(p, sP, sAB, img, py0 + pr);
        __syncthreads();   // the tile is free for the next pooled row
    };

    for (int r = r_begin; r < r_end; ++r) {
        uint2 const rows = sRow[tid];
        uint32_t const row0 = rows.x + 2 * r * BW, row1 = rows.y + 2 * r * BW;
        auto load = [&](uint32_t(&frag)[4], int ky) {   // offsets are immediates: BW and PLANE are constants
            frag[0] = lo ? lds32(row0 + ky * BW) : 0u;
            frag[1] = lo ? lds32(row1 + ky * BW) : 0u;
            frag[2] = hi ? lds32(row0 + ky * BW + 2 * PLANE) : 0u;
            frag[3] = hi ? lds32(row1 + ky * BW + 2 * PLANE) : 0u;
        };
        // The row's 7 A fragments at once, then its 7 wgmmas back to back (28 registers). Two fragments taking turns
        // (a wgmma wait before each refill) kept each warpgroup's wgmmas in a chain of waits: 1.39-1.41 ms at batch
        // 2048 against 1.33 (docs/residual_conv.md, Version 16).
        int acc[kStemN / 2];   // started by the first wgmma (scale-d 0)
        uint32_t a[kStemTaps][4];
#pragma unroll
        for (int ky = 0; ky < kStemTaps; ++ky) load(a[ky], ky);
        wgmma_fence();
#pragma unroll
        for (int ky = 0; ky < kStemTaps; ++ky)
            wgmma_m64n64k32_s8_rs(acc, a[ky], descW + ((ky * kStemN * 32) >> 4), ky > 0);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int ky = 0; ky < kStemTaps; ++ky)
#pragma unroll
            for (int i = 0; i < 4; ++i) keep_reg(a[ky][i]);
#pragma unroll
        for (int i = 0; i < kStemN / 2; ++i) vmax[i] = max(vmax[i], acc[i]);
        if (r % 2 == 0 && r > 0) {   // pooled row r / 2 - 1 is complete; row r also opens pooled row r / 2
            flush(open);
            open = r / 2;
#pragma unroll
            for (int i = 0; i < kStemN / 2; ++i) vmax[i] = acc[i];
        }
    }
    if (open < P && py0 + open < p.Hp && r_end - 1 >= 2 * open) flush(open);   // cut short by the image's bottom
#else
    (void)p;   // not an sm_90a pass: never launched (the host checks kHasWgmma first)
#endif
}
#endif  // __CUDACC__

}  // namespace rconv
}  // namespace trtfuse
