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
//   per word): even pixels read the first, odd ones the second, at byte 4 (x / 2) + 16 + kx0 (pixel -1 at 12),
//   aligned. A load's 8 row lanes (rows g, or rows g + 8, of a warp: the row order below) read one copy at 8
//   consecutive words, and the two channels of a load fall on disjoint banks: a copy's channel planes are 16 words
//   (mod 32) apart.
//
// Pool first, round after: the rule is monotone in acc (a > 0: every scale is), so the rounded max is the max of the
// rounded values, and the max can be taken over the raw int32 accumulators. The rule then runs once per pooled
// output, a quarter of the conv's outputs. (The first version rounded every conv output into an int8 staging tile
// and pooled the bytes: 2.45 ms at batch 2048 on the H100, instruction-bound; docs/residual_conv.md, Version 16.)
//
// Pool in registers: the GEMM rows of a conv row are laid out so that each warp holds whole pooling windows. Warp w
// (of 8) owns pooled columns 7 w .. 7 w + 6, which read conv pixels 14 w - 1 .. 14 w + 13; thread g (of the warp's
// 8 row lanes) computes pixels 14 w + 2 g (GEMM row g) and 14 w + 2 g + 1 (row g + 8), except g = 7, which computes
// pixel 14 w - 1 as its second (its first is thrown away). Pooled column 7 w + g (g < 7) is then the max of thread
// g's two pixels and the second pixel of thread g - 1 (of thread 7 for g = 0): one warp shuffle, same channels (same
// tig). 8 warps x 7 = 56 pooled columns: W <= 224. Each thread keeps the vertical max of its two pixels x 16 channels
// in registers while a pooled row's three conv rows pass (they are consecutive), then rounds its pooled column's 16
// channels and stores them. After the prologue no thread waits for another: the two warpgroups (and the two blocks
// an SM holds) run their wgmmas and pools independently. (Version 16 pooled through an int32 tile in shared memory,
// two block barriers per pooled row: 1.33 ms at batch 2048.)
//
// Block: one band of P pooled rows of one image = conv rows 2 py0 - 1 .. 2 py0 + 2P - 1 (R = 2P + 1; the row shared
// with the next band is computed twice). 256 threads, two warpgroups (warps 0-3, 4-7). One TMA load brings the band's
// input rows (zero padding included) into a box area, which the copies are built from; one bulk copy the weights
// ([7 ky][64 rows][32 k], the 32-byte swizzle). Per conv row each warpgroup loads its 7 A fragments and issues 7
// wgmma m64n64k32. Two blocks fit an SM.
//
// NEXT, a chained next conv (issue 14: the stem and layer1.0's conv1 in one kernel): the 1x1 conv (K = the stem's
// <= 64 channels, N 64) of the band's pooled output, so the conv1 does not read the stem's output back from memory
// (411 MB per batch of 2048). Each pooled word also goes to a band tile in shared memory (the box area, free after
// the copies: [2 k32 chunks][P x Wp rows][32], the wgmma layout), and after the band's last pooled row each
// warpgroup runs m64 tiles of it: wgmma m64n64k32 from shared memory (weights: [2 chunks][64 rows][32], the first
// chunks of Layer::w_img_next, loaded with the stem's), then the library's epilogue, its words straight to memory
// (a band's rows are consecutive in each output slab). First measured with the GEMM per pooled row, A from the
// pooled words in registers: 7 of a warp's 16 rows useful and a wgmma wait per pooled row; the conv1 then added
// 0.45 ms at batch 2048, more than TensorRT's own conv1 (0.38 ms).
//
// Compiled only in the sm_90a pass (ptx_sm90.cuh; kHasWgmma guards the launch).
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "conv_int8/core/epilogue.cuh"
#include "conv_int8/core/params.h"
#include "conv_int8/core/ptx_sm90.cuh"

namespace trtfuse {
namespace rconv {

constexpr int kStemTaps = 7;                              // kernel rows = k32 steps
constexpr int kStemN = 64;                                // output channels computed (Cout <= 64, zero padded)
constexpr int kStemMaxCin = 4;                            // channels of one k32 step (8 taps each)
constexpr int kStemWBytes = kStemTaps * kStemN * 32;      // the weight slice
constexpr int kStemThreads = 256;
constexpr int kStemBoxRow = 256;                          // a box row in bytes (W <= 224: 2 Wc + 19 <= 256)
constexpr int kStemPoolCols = 7;                          // pooled columns per warp (8 warps: Wp <= 56)
constexpr int kStemNextWBytes = kStemN / 32 * kStemN * 32;  // NEXT: the conv1's weights, K = kStemN (2 k32 steps)

// The band geometry of P pooled rows per block (the configuration): conv rows R, input rows IR of the box, a copy's
// channel plane (IR rows, then 64 bytes: 16 banks between planes). Two blocks an SM (P <= 8 fits their shared memory).
template <int P_>
struct StemBand {
    static constexpr int P = P_, R = 2 * P + 1, IR = 2 * R + 5;
    static constexpr int BOX_PLANE = IR * kStemBoxRow, PLANE = BOX_PLANE + 64;
};

// Kernel arguments of the stem (the host fills them: host/launch_stem.cu).
struct StemParams {
    CUtensorMap in_map;    // x as (W, H, Cin, N) bytes, box (256, IR, Cin, 1), zero fill outside the image
    Rule rule;             // the conv's rule (no residual)
    int8_t const* w_img;   // [7 ky][64 rows][32 k] (tile_layout.h: pack_weight_slices), k = c * 8 + kx
    int8_t* out;           // [N][Nc][Hp][Wp][32]
    int Cin, Nc;           // input channels; output slabs (ceil(Cout / 32))
    int Hc, Wc, Hp, Wp;    // conv output and pooled output sizes (Wp <= 8 kStemPoolCols)
    int bands;             // ceil(Hp / P): blocks per image
    uint32_t copy_bytes;   // a copy (Cin planes, rounded up to 256 bytes)
    uint32_t box_bytes;    // the TMA box (Cin planes of IR rows) and (NEXT) the band tile, rounded up to 256
    // NEXT: the chained conv1 (its rule, output [N][next_nc][Hp][Wp][32], weights [2][64 rows][32] (swz_offset))
    Rule next_rule;
    int8_t* next_out;
    int8_t const* next_w_img;
    int next_nc;
};

// Shared memory of a launch: [256-byte alignment slack: the weights' 32-byte swizzle repeats every 256][weights]
// [NEXT: the conv1's weights][2 copies][the TMA box; NEXT: then the band tile][rule constants a, b][each thread's
// two A addresses][barrier].
// Under half of the SM up to P = 8 (109 KB at ResNet-50's 224 x 224 with NEXT).
TRTFUSE_RCONV_HD int stem_smem_bytes(int copy_bytes, int box_bytes, bool next) {
    return 256 + kStemWBytes + (next ? kStemNextWBytes : 0) + 2 * copy_bytes + box_bytes + 8 * kStemN +
           8 * kStemThreads + 16;
}

#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
// Keeps v in a register, unchanged, up to here: an A fragment must not be overwritten while a wgmma may read it.
__device__ __forceinline__ void keep_reg(uint32_t& v) { asm volatile("" : "+r"(v)::"memory"); }

// Pooled column ox (this thread's, g < 7) of the open pooled row: the max over its window's three pixels' vertical
// maxima (vmax: this thread's pixels h = 0, 1 in wgmma's m64n64 accumulator layout, acc[4 j + 2 h + e] = channel
// column 8 j + 2 tig + e; the packed weights make n8 chunks 2k, 2k + 1 channels 16 k + 4 tig .. + 3), then the rule:
// words[k], channels 16 k + 4 tig .. + 3. left: the left neighbour pixel's maxima (thread g - 1's pixel 1), valid
// unless ox = 0 (the pool's padding); pixel 1 (2 ox + 1) is valid below Wc. Channels past Cout come out 0 (their a
// and b are).
template <bool SAT>
__device__ __forceinline__ void stem_pool_words(StemParams const& p, float const* sAB, int const (&vmax)[kStemN / 2],
                                                int const (&left)[kStemN / 4], bool left_ok, bool right_ok, int tig,
                                                uint32_t (&words)[kStemN / 16]) {
    std::integral_constant<bool, false> exact_int;
#pragma unroll
    for (int k = 0; k < kStemN / 16; ++k) {   // 16-channel groups: n8 chunks 2k, 2k + 1
        float4 const a = *reinterpret_cast<float4 const*>(sAB + 16 * k + 4 * tig);
        float4 const b = *reinterpret_cast<float4 const*>(sAB + kStemN + 16 * k + 4 * tig);
        float t[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int const i = 8 * k + 4 * (e >> 1) + (e & 1);   // pixel 0's accumulator; pixel 1's is i + 2
            int m = vmax[i];
            if (right_ok) m = max(m, vmax[i + 2]);
            if (left_ok) m = max(m, left[4 * k + 2 * (e >> 1) + (e & 1)]);
            t[e] = rule_t_plain<SAT>(acc_bits_to_float(m, exact_int), (&a.x)[e], (&b.x)[e]);
        }
        words[k] = q_quad_t<SAT>(t[0], t[1], t[2], t[3], p.rule.lo);
    }
}

template <class Band, bool NEXT>
__global__ void __launch_bounds__(kStemThreads, 2) stem_kernel_sm90(const __grid_constant__ StemParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int P = Band::P, R = Band::R, PLANE = Band::PLANE, BW = kStemBoxRow;
    extern __shared__ uint8_t smem_raw[];
    uint32_t const raw = smem_u32(smem_raw);
    int8_t* const base = reinterpret_cast<int8_t*>(smem_raw) + (((raw + 255) & ~255u) - raw);
    int8_t* const sW = base;
    int8_t* const sW2 = sW + kStemWBytes;                               // NEXT: the conv1's weights
    int8_t* const sX = sW2 + (NEXT ? kStemNextWBytes : 0);
    int8_t* const sBox = sX + 2 * p.copy_bytes;                         // the TMA box, the copies' source
    float* const sAB = reinterpret_cast<float*>(sBox + p.box_bytes);    // [a: 64][b: 64]
    uint2* const sRow = reinterpret_cast<uint2*>(sAB + 2 * kStemN);     // [thread]: its two A addresses
    uint32_t const bar = smem_u32(sRow + kStemThreads);

    int const tid = threadIdx.x;
    int const img = blockIdx.x / p.bands, py0 = (blockIdx.x - img * p.bands) * P, cy0 = 2 * py0 - 1;
    if (tid == 0) {
        mbar_init(bar, 1);
        fence_mbarrier_init();
        mbar_arrive_expect_tx(bar, kStemWBytes + (NEXT ? kStemNextWBytes : 0) + p.Cin * Band::BOX_PLANE);
        bulk_load(smem_u32(sW), p.w_img, kStemWBytes, bar);
        if (NEXT) bulk_load(smem_u32(sW2), p.next_w_img, kStemNextWBytes, bar);
        // the box: columns from -16 (a TMA box starts at a 16-byte aligned column), input rows from 2 cy0 - 3
        tma_load_4d(&p.in_map, smem_u32(sBox), bar, -16, 2 * cy0 - 3, 0, img);
    }
    for (int i = tid; i < 2 * kStemN; i += kStemThreads)
        sAB[i] = (i < kStemN ? (p.rule.sat ? p.rule.a8 : p.rule.a) : (p.rule.sat ? p.rule.b8 : p.rule.b))[i % kStemN];
    __syncthreads();   // the barrier's init and the rule constants
    mbar_wait(bar, 0);
    // The two copies: byte b of copy e is box byte b - (e ? 1 : 3), so box column c sits at c + 3 (c + 1). Each word
    // takes the box's word and the one before (across a row start that puts the previous row's last bytes at columns
    // 0..2, which no load reads: the first pixel's first byte is at 16).
    for (int c = 0; c < p.Cin; ++c) {   // 4 words a step (planes are 16-byte aligned)
        uint32_t const* box = reinterpret_cast<uint32_t const*>(sBox + c * Band::BOX_PLANE);
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
    __syncthreads();   // the copies are whole: the block's last barrier

    int const warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
    // this thread's k bytes: channel tig / 2 (registers 0, 1) and tig / 2 + 2 (registers 2, 3), taps 4 (tig & 1) ..;
    // a channel past Cin is zero padding of k, not read (its plane would lie past the copy)
    bool const lo = (tig >> 1) < p.Cin, hi = (tig >> 1) + 2 < p.Cin;
    uint64_t const descW = smem_desc(smem_u32(sW));
    // this thread's two pixels (GEMM rows g and g + 8 of its warp; see "Pool in registers" above) and the address of
    // their first conv row's first tap in their copy, byte 4 (x / 2) + 16 (kept in shared memory: in registers, at 80
    // a thread, the compiler recomputed them at every conv row, 14 % of the instructions). Pixel 0 of g = 7 is thrown
    // away; pixel 1 of g = 7 is its warp's left edge, 14 w - 1 (-1 for warp 0: read, at byte 12, and not pooled).
    int const ox = kStemPoolCols * warp + g;                 // this thread's pooled column (g < 7)
    int const px0 = 2 * ox, px1 = g == 7 ? 2 * kStemPoolCols * warp - 1 : 2 * ox + 1;
    {
        uint32_t const even = smem_u32(sX) + (tig >> 1) * PLANE + 4 * (tig & 1) + 16;
        uint32_t const odd = even + p.copy_bytes;
        sRow[tid] = make_uint2(even + 4 * (px0 >> 1), odd + 4 * (px1 >> 1));   // read back by this thread only
    }
    bool const pools = g < 7 && ox < p.Wp;                   // this thread stores pooled column ox
    bool const left_ok = ox > 0, right_ok = px1 < p.Wc;     // the window's pixels 2 ox - 1 and 2 ox + 1 exist
    int const left_lane = (lane + 28) & 31;                  // thread g - 1 (g = 0: thread 7), same tig

    // A pooled row's three conv rows are local rows 2pr .. 2pr + 2: row 2k closes pooled row k - 1 and opens k.
    // Rows outside the image are not computed (the top band's first, the bottom band's last ones).
    int const r_begin = cy0 < 0 ? 1 : 0, r_end = min(R, p.Hc - cy0);
    int vmax[kStemN / 2];   // the vertical max of the open pooled row
#pragma unroll
    for (int i = 0; i < kStemN / 2; ++i) vmax[i] = INT32_MIN;
    int open = 0;   // the pooled row vmax belongs to

    // The open pooled row pr: the left pixel's vertical maxima from thread g - 1, then this thread's pooled column,
    // stored; its words also go to the band tile (NEXT).
    auto pool = [&](int pr, uint32_t (&words)[kStemN / 16]) {
        int left[kStemN / 4];   // pixel 1's maxima of thread g - 1: vmax[4 j + 2 + e] -> left[2 j + e]
#pragma unroll
        for (int j = 0; j < kStemN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) left[2 * j + e] = __shfl_sync(0xffffffffu, vmax[4 * j + 2 + e], left_lane);
#pragma unroll
        for (int k = 0; k < kStemN / 16; ++k) words[k] = 0u;
        if (!pools) return;
        if (p.rule.sat) stem_pool_words<true>(p, sAB, vmax, left, left_ok, right_ok, tig, words);
        else stem_pool_words<false>(p, sAB, vmax, left, left_ok, right_ok, tig, words);
        // channel 16 k + 4 tig: slab k / 2, byte 16 (k % 2) + 4 tig of the pixel's 32
        int8_t* const out = p.out + (static_cast<int64_t>(img) * p.Nc * p.Hp + py0 + pr) * p.Wp * 32 + ox * 32;
#pragma unroll
        for (int k = 0; k < kStemN / 16; ++k)
            if (k / 2 < p.Nc)
                *reinterpret_cast<uint32_t*>(out + (k >> 1) * static_cast<int64_t>(p.Hp) * p.Wp * 32 + (k & 1) * 16 +
                                             tig * 4) = words[k];
    };
    // NEXT: the band tile, [kStemN / 32 chunks][P * Wp rows][32] (swz_offset), row pr * Wp + ox
    int const band_rows = P * p.Wp;
    auto keep_words = [&](int pr, uint32_t const (&words)[kStemN / 16]) {
        if (!pools) return;
#pragma unroll
        for (int k = 0; k < kStemN / 16; ++k)
            *reinterpret_cast<uint32_t*>(sBox + swz_offset(k >> 1, band_rows, pr * p.Wp + ox, (k & 1) * 16 + tig * 4)) =
                words[k];
    };
    // NEXT: the conv1 of the band's npr pooled rows, warpgroup wg taking m64 tiles wg, wg + 2, ...
    auto next_conv = [&](int npr) {
        fence_proxy_async_smem();   // the band tile was written through the generic proxy; wgmma reads it
        __syncthreads();
        int const rows = npr * p.Wp, wg = warp >> 2;
        int8_t* const out = p.next_out + (static_cast<int64_t>(img) * p.next_nc * p.Hp + py0) * p.Wp * 32;
        int64_t const slab = static_cast<int64_t>(p.Hp) * p.Wp * 32;
        int const init2 = p.next_rule.small_acc ? kMagicBits : 0;
        uint64_t const descW2 = smem_desc(smem_u32(sW2));
        for (int m0 = 64 * wg; m0 < rows; m0 += 128) {
            int acc2[1][32];
#pragma unroll
            for (int i = 0; i < 32; ++i) acc2[0][i] = init2;
            wgmma_fence();
            // Both k32 steps, with no branch between the wgmmas (a branch there makes ptxas fence them): past the
            // stem's channels the weights are zero (trtfuse_next_attach pads K), so the sums are unchanged.
#pragma unroll
            for (int ks = 0; ks < kStemN / 32; ++ks) {
                uint64_t const descA = smem_desc(smem_u32(sBox + swz_offset(ks, band_rows, m0, 0)));
                wgmma_m64n64k32_s8(acc2[0], descA, descW2 + ((ks * kStemN * 32) >> 4), 1);
            }
            wgmma_commit();
            wgmma_wait<0>();
            int const m = m0 + 16 * (warp & 3) + g;   // this thread's rows m and m + 8
            epilogue_fragment<16, 1, 8, false, false>(acc2, p.next_rule, nullptr, g, tig, 0,
                                                      [&](int j, int, int h, uint32_t word) {
                                                          int const ch = 16 * j + 4 * tig;
                                                          if (m + 8 * h < rows && (ch >> 5) < p.next_nc)
                                                              *reinterpret_cast<uint32_t*>(
                                                                  out + (ch >> 5) * slab +
                                                                  static_cast<int64_t>(m + 8 * h) * 32 + (ch & 31)) =
                                                                  word;
                                                      });
        }
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
            uint32_t words[kStemN / 16];
            pool(open, words);
            if constexpr (NEXT) keep_words(open, words);
            open = r / 2;
#pragma unroll
            for (int i = 0; i < kStemN / 2; ++i) vmax[i] = acc[i];
        }
    }
    if (open < P && py0 + open < p.Hp && r_end - 1 >= 2 * open) {   // cut short by the image's bottom
        uint32_t words[kStemN / 16];
        pool(open, words);
        if constexpr (NEXT) keep_words(open, words);
    }
    if constexpr (NEXT) next_conv(min(P, p.Hp - py0));
#else
    (void)p;   // not an sm_90a pass: never launched (the host checks kHasWgmma first)
#endif
}
#endif  // __CUDACC__

}  // namespace rconv
}  // namespace trtfuse
