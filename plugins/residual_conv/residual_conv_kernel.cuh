// Fused int8 1x1 conv + folded BN + residual Add (+ReLU), kCHW32 in and out.
//
//   out[m, n] = q( act( x_scale * w_scale[n] * acc[m, n] + bias[n] + r_scale * r[m, n] ) / out_scale )
//   acc[m, n] = sum_k x[m, k] * w[n, k]   (int32),  m = (image, h*W + w),  k = Cin,  n = Cout
//
// The levels are kept apart as in CUTLASS:
//   TileConfig        threadblock tile (BM x BN x BK), warp tile (WM x WN), pipeline depth: template parameters
//   warp level        WarpMma: ldmatrix fragments from shared memory, mma.sync m16n8k32 s8 -> s32
//   threadblock level the cp.async loaders (A = x, B = weights, R = residual), the multistage mainloop,
//                     and the epilogue that stages the int8 output in shared memory for 16-byte stores.
//
// kCHW32 addressing: element (img, c, hw) of a C-channel tensor is at ((img*ceil(C/32) + c/32)*HW + hw)*32 + c%32,
// so one GEMM row m owns a 32-byte run in every 32-channel slab, and consecutive rows of one image are
// consecutive 32-byte runs. Tiles of M may straddle images (res5: HW = 49): every row computes its own
// (image, hw) and the address math never assumes a tile lies inside one image.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda.h>   // CUtensorMap (the wgw kernels' TMA output stores; the map is encoded by the host)
#include <cuda_runtime.h>

#include "common/fast_divmod.h"

namespace trtfuse {
namespace rconv {

// ------------------------------------------------------------------------------------------------
// Kernel parameters (one struct so every tile configuration takes the same arguments)
// ------------------------------------------------------------------------------------------------
struct Params {
    int8_t const* x;       // [N][Kc][HW][32]
    int8_t const* r;       // [N][Nc][HW][32]
    int8_t* out;           // [N][Nc][HW][32]
    int8_t const* w;       // packed [Npad][Kpad] row-major, zero padded (Npad % 256 == 0, Kpad % 128 == 0)
    int8_t const* w_perm;  // the same rows permuted within each 16-channel group (PERM configs, see v6 below)
    int8_t const* w_img;   // wgw_*: w_perm in the kernel's shared-memory layout, per N block (wgw_pack_weights)
    float const* a;        // [Npad] (x_scale * w_scale[n]) * inv_out, 0 in the padding
    float const* b;        // [Npad] bias[n] * inv_out, 0 in the padding
    float const* s;        // [Npad] r_scale * inv_out, 0 in the padding (padded channels come out 0)
    float const* a8;       // a, b, s times 2^-8 (exact), for the wgmma epilogue's saturating form (sat)
    float const* b8;
    float const* s8;
    float lo;              // 0 with ReLU, else -128: the lower clamp
    int small_acc;         // |acc| < 2^22 is guaranteed (Cin <= 258): exact int->float without I2F
    int sat;               // ReLU and a, b, s in the range where the saturating form is exact (see wgmma)
    int M;                 // N * HW (< 2^31)
    int HW;
    int Kc;                // ceil(Cin / 32): slabs of x
    int Kpad;              // row pitch of the packed weights
    int Nc;                // ceil(Cout / 32): slabs of r and out
    int n_blocks;          // ceil(Nc*32 / BN): blocks along N
    FastDivmod hw_div;     // m / HW        (v6 kernels; set for every launch)
    FastDivmod nb_div;     // tile / n_blocks (v6 kernels)
    int wgw_regular;       // wgw_*: the schedule's regular blocks and their tile quota (residual_conv_wgw_tiles.h)
    int wgw_quota;
    FastDivmod wgw_rest;   // by the M tiles per N block left to the extra blocks (WgwSchedule::rest)
    CUtensorMap out_map;   // out as a 4-d tensor (32 bytes, HW, Nc, N), box (32, 16, BN/32, 1), 32-byte swizzle:
                           // set only for the configs that store with TMA (wgw_*); 64-byte aligned
};

// ------------------------------------------------------------------------------------------------
// PTX wrappers
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(void const* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy that bypasses L1 (.cg); src_bytes = 0 zero-fills (rows past M, K tail).
__device__ __forceinline__ void cp_async_16(uint32_t dst, void const* src, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
}

__device__ __forceinline__ void mma_s8_16832(int (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Streaming store: the output is never re-read by this kernel, keep it from evicting x/weights in L2.
__device__ __forceinline__ void st_global_cs_16(void* p, int4 v) {
    asm volatile("st.global.cs.v4.s32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

// ------------------------------------------------------------------------------------------------
// Shared-memory layout shared by A, B and R tiles: [slab][row][2 halves of 16 bytes].
// A row's two 16-byte halves are swapped on rows 4..7 mod 8: ldmatrix reads 8 rows x 16 bytes and a
// 32-byte row pitch would put rows i and i+4 on the same banks; the swap makes each 8-row read
// conflict-free (and the epilogue's 2-byte accesses, 8 rows x 4 lanes, too).
// ------------------------------------------------------------------------------------------------
__host__ __device__ __forceinline__ int swz_offset(int slab, int rows, int row, int byte_in_slab) {
    int half = (byte_in_slab >> 4) ^ ((row >> 2) & 1);
    return ((slab * rows + row) << 5) + (half << 4) + (byte_in_slab & 15);
}

// ------------------------------------------------------------------------------------------------
// Tile configuration
// ------------------------------------------------------------------------------------------------
// MIN_BLOCKS caps registers (__launch_bounds__) so that enough blocks share an SM: the op is memory
// bound, and the bytes in flight per SM, not the math, set its speed.
// V6 selects residual_conv_kernel_v6 (lean address math and epilogue, see there) over the v5 kernel;
// PERM (v6 only) its 4-channels-per-thread epilogue over the permuted weights.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, int MIN_BLOCKS_, bool V6_ = false,
          bool PERM_ = false>
struct TileConfig {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
    static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr bool V6 = V6_, PERM = PERM_;
    static_assert(!PERM_ || V6_, "PERM is a v6 epilogue");
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int KCH = BK / 32;                 // 32-byte k chunks per stage
    static constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK, R_TILE = BM * BN;
    // STAGES residual tiles: a tile's residual is fetched with its first k stage, up to STAGES-1 tiles
    // ahead of its epilogue when K fits one stage (res2), so that many can be alive at once.
    static constexpr int SMEM = STAGES * (A_STAGE + B_STAGE + R_TILE);
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "warp tiling");
    static_assert(BK % 32 == 0 && BN % 32 == 0 && 256 % BN == 0 && 128 % BK == 0, "packing pads N to 256, K to 128");
    static_assert((BM * BK / 16) % THREADS == 0 && (BN * BK / 16) % THREADS == 0 && (BM * BN / 16) % THREADS == 0,
                  "every thread moves the same number of 16-byte pieces");
    static_assert(STAGES >= 2, "multistage pipeline");
};

// ------------------------------------------------------------------------------------------------
// Warp level: one k32 step of a WM x WN warp tile
// ------------------------------------------------------------------------------------------------
template <int WM, int WN>
struct WarpMma {
    static constexpr int MI = WM / 16, NI = WN / 8;
    int acc[MI][NI][4];

    __device__ __forceinline__ void clear() {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;
    }
    // Start every accumulator at v (the v6 epilogue starts them at the magic bits, see acc_bits_to_float).
    __device__ __forceinline__ void fill(int v) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = v;
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
            for (int n = 0; n < NI; ++n) mma_s8_16832(acc[i][n], a[i], b[n][0], b[n][1]);
    }
};

// ------------------------------------------------------------------------------------------------
// Threadblock level
// ------------------------------------------------------------------------------------------------
// Byte offset of GEMM row m's run in slab 0 of a kCHW32 tensor with `slabs` slabs; slab s adds s*HW*32.
// m < 2^31 (checked by the launcher): 32-bit division, 64-bit offset.
__device__ __forceinline__ int64_t row_offset(int m, int HW, int slabs) {
    int img = static_cast<int>(static_cast<unsigned>(m) / static_cast<unsigned>(HW));
    int hw = m - img * HW;
    return (static_cast<int64_t>(img) * slabs * HW + hw) * 32;
}

// ---- the epilogue, written for few issue slots per element (the op's arithmetic is all here: at res2,
// ~10 instructions per output element already cost half the memory floor). Rounding rule (exact; the
// reference emulates it): t = fma(float(acc), a[n], fma(float(r), s[n], b[n])), clamped to [lo, 127],
// rounded half to even. Conversions avoid the quarter-rate I2F/F2I where an exact trick exists:
//   1.5 * 2^23 = 12582912 is a float whose last mantissa bit weighs 1, so for |i| < 2^22 the bits of
//   (12582912 + i) are 0x4B400000 + i, and adding it to a float in [-128, 127] rounds half to even.
constexpr float kMagic = 12582912.0f;
constexpr int kMagicBits = 0x4B400000;

template <bool SMALL>
__device__ __forceinline__ float acc_to_float(int acc, std::integral_constant<bool, SMALL>) {
    return SMALL ? __fsub_rn(__int_as_float(acc + kMagicBits), kMagic) : __int2float_rn(acc);
}
// Two int8 residual values (bytes 0 and 1 of `pair`) as floats: bias by 128 so the byte is unsigned,
// splice it under the magic exponent (one PRMT), subtract (exact: small integers).
__device__ __forceinline__ float2 r_pair_to_float(uint32_t pair) {
    uint32_t u = pair ^ 0x8080u;
    return make_float2(__fsub_rn(__int_as_float(__byte_perm(u, kMagicBits, 0x7650)), kMagic + 128.0f),
                       __fsub_rn(__int_as_float(__byte_perm(u, kMagicBits, 0x7651)), kMagic + 128.0f));
}
// Clamp, round half to even (via the magic add), and pack the two low bytes.
__device__ __forceinline__ uint32_t q_pair(float v0, float v1, float lo) {
    int b0 = __float_as_int(__fadd_rn(fminf(fmaxf(v0, lo), 127.f), kMagic));
    int b1 = __float_as_int(__fadd_rn(fminf(fmaxf(v1, lo), 127.f), kMagic));
    return __byte_perm(b0, b1, 0x0040);
}

// Persistent kernel: a block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (tile = (M block, N block),
// N fastest so the blocks sharing an x tile run together and hit L2). The cp.async pipeline runs over the
// flattened (tile, k stage) sequence, so the next tile's x, weights and residual stream in while this
// tile's MMAs, epilogue and stores run: a block never waits for a full load latency between tiles.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
residual_conv_kernel(Params p) {
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, WM = Cfg::WM, WN = Cfg::WN, STAGES = Cfg::STAGES;
    constexpr int THREADS = Cfg::THREADS, KCH = Cfg::KCH;
    using Warp = WarpMma<WM, WN>;
    constexpr int NI = Warp::NI, MI = Warp::MI;
    constexpr int A_PIECES = BM * BK / 16 / THREADS, B_PIECES = BN * BK / 16 / THREADS;
    constexpr int R_PIECES = BM * BN / 16 / THREADS;

    extern __shared__ __align__(128) int8_t smem[];
    int8_t* sA = smem;                                   // STAGES x [KCH][BM][32]
    int8_t* sB = sA + STAGES * Cfg::A_STAGE;             // STAGES x [KCH][BN][32]
    int8_t* sR = sB + STAGES * Cfg::B_STAGE;             // STAGES x [BN/32][BM][32]: residual in, output out

    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
    int const g = lane >> 2, tig = lane & 3;
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;   // between consecutive slabs
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    int const tiles = m_blocks * p.n_blocks;
    int const my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    int const k_tiles = (p.Kc * 32 + BK - 1) / BK;
    int const iters = my_tiles * k_tiles;

    auto tile_mn = [&](int j, int& m0, int& n0) {   // j-th tile of this block
        int t = blockIdx.x + j * gridDim.x;
        n0 = (t % p.n_blocks) * BN;
        m0 = (t / p.n_blocks) * BM;
    };

    // Issue the cp.asyncs of flattened iteration `it` into pipeline slot it % STAGES; the first k stage of
    // a tile also brings the tile's residual into R buffer (tile % STAGES).
    auto load_iter = [&](int it) {
        int j = it / k_tiles, kt = it - j * k_tiles, slot = it % STAGES;
        int m0, n0;
        tile_mn(j, m0, n0);
        if (kt == 0) {
            int8_t* r_dst = sR + (j % STAGES) * Cfg::R_TILE;
#pragma unroll
            for (int i = 0; i < R_PIECES; ++i) {
                int piece = tid + i * THREADS;
                int half = piece & 1, row = (piece >> 1) % BM, slab = (piece >> 1) / BM;
                int m = m0 + row, gslab = n0 / 32 + slab;
                bool ok = m < p.M && gslab < p.Nc;
                int64_t off = ok ? row_offset(m, p.HW, p.Nc) + gslab * slab_bytes + half * 16 : 0;
                cp_async_16(smem_u32(r_dst + swz_offset(slab, BM, row, half * 16)), p.r + off, ok);
            }
        }
        int8_t* a_dst = sA + slot * Cfg::A_STAGE;
#pragma unroll
        for (int i = 0; i < A_PIECES; ++i) {
            int piece = tid + i * THREADS;
            int half = piece & 1, row = (piece >> 1) % BM, chunk = (piece >> 1) / BM;
            int m = m0 + row, kc = kt * KCH + chunk;
            bool ok = m < p.M && kc < p.Kc;
            int64_t off = ok ? row_offset(m, p.HW, p.Kc) + kc * slab_bytes + half * 16 : 0;
            cp_async_16(smem_u32(a_dst + swz_offset(chunk, BM, row, half * 16)), p.x + off, ok);
        }
        int8_t* b_dst = sB + slot * Cfg::B_STAGE;
#pragma unroll
        for (int i = 0; i < B_PIECES; ++i) {
            int piece = tid + i * THREADS;
            // consecutive threads walk along one weight row: BK/16 pieces per row
            int row = piece / (BK / 16), kb = (piece % (BK / 16)) * 16;
            cp_async_16(smem_u32(b_dst + swz_offset(kb >> 5, BN, row, kb & 31)),
                        p.w + static_cast<int64_t>(n0 + row) * p.Kpad + kt * BK + kb, true);
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < iters) load_iter(s);
        cp_async_commit();   // empty groups keep the wait counts uniform
    }

    Warp mma;
    mma.clear();
    for (int it = 0; it < iters; ++it) {
        cp_async_wait<STAGES - 2>();   // iteration it's stage (and, at kt == 0, its residual) has landed
        __syncthreads();               // ... for every thread; slot (it-1) % STAGES and old R buffers are free
        if (it + STAGES - 1 < iters) load_iter(it + STAGES - 1);
        cp_async_commit();
        int slot = it % STAGES;
#pragma unroll
        for (int c = 0; c < KCH; ++c)
            mma.step(sA + slot * Cfg::A_STAGE + c * BM * 32, BM, warp_m * WM,
                     sB + slot * Cfg::B_STAGE + c * BN * 32, BN, warp_n * WN, lane);

        int j = it / k_tiles;
        if (it - j * k_tiles != k_tiles - 1) continue;

        // ---- epilogue of tile j in registers: BN scale/shift, + scaled residual, act, requantize; the int8
        //      result overwrites the residual in shared memory (each element has exactly one owner) ----
        int m0, n0;
        tile_mn(j, m0, n0);
        int8_t* r_tile = sR + (j % STAGES) * Cfg::R_TILE;
        // The int->float path is chosen once per tile (a uniform branch), not per element. Per 8-column
        // group, all residual pairs are read first, then computed, then written, at one base address plus
        // compile-time offsets (rows i*16 + h*8 keep the swizzle bit of row g): with run-time addresses the
        // in-place read-modify-write serialized every pair behind the previous one's shared-memory round trip
        // (measured: ~5.5 cycles per issued instruction, fixed-latency stalls on top).
        auto epilogue = [&](auto small) {
#pragma unroll
            for (int n = 0; n < NI; ++n) {
                int col = warp_n * WN + n * 8 + tig * 2;
                float2 a = __ldg(reinterpret_cast<float2 const*>(p.a + n0 + col));
                float2 b = __ldg(reinterpret_cast<float2 const*>(p.b + n0 + col));
                float2 s = __ldg(reinterpret_cast<float2 const*>(p.s + n0 + col));
                uint16_t* base = reinterpret_cast<uint16_t*>(r_tile + swz_offset(col >> 5, BM, warp_m * WM + g, col & 31));
                uint32_t rv[MI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) rv[i][h] = base[(i * 16 + h * 8) * 16];   // 32-byte rows, 2-byte units
                uint32_t q[MI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float2 rf = r_pair_to_float(rv[i][h]);
                        float v0 = __fmaf_rn(acc_to_float(mma.acc[i][n][2 * h], small), a.x, __fmaf_rn(rf.x, s.x, b.x));
                        float v1 = __fmaf_rn(acc_to_float(mma.acc[i][n][2 * h + 1], small), a.y, __fmaf_rn(rf.y, s.y, b.y));
                        q[i][h] = q_pair(v0, v1, p.lo);
                    }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) base[(i * 16 + h * 8) * 16] = static_cast<uint16_t>(q[i][h]);
            }
        };
        if (p.small_acc) epilogue(std::true_type{});
        else epilogue(std::false_type{});
        mma.clear();
        __syncthreads();
        // ---- coalesced 16-byte stores (evict-first: the output is not re-read here) ----
#pragma unroll
        for (int i = 0; i < R_PIECES; ++i) {
            int piece = tid + i * THREADS;
            int half = piece & 1, row = (piece >> 1) % BM, slab = (piece >> 1) / BM;
            int m = m0 + row, gslab = n0 / 32 + slab;
            if (m < p.M && gslab < p.Nc)
                st_global_cs_16(p.out + row_offset(m, p.HW, p.Nc) + gslab * slab_bytes + half * 16,
                                *reinterpret_cast<int4 const*>(r_tile + swz_offset(slab, BM, row, half * 16)));
        }
    }
    cp_async_wait<0>();   // nothing is left in flight at exit (the trailing groups are empty)
}

// ------------------------------------------------------------------------------------------------
// v6: the v5 structure (persistent, cp.async multistage over the flattened (tile, k stage) sequence,
// residual prefetched with a tile's first k stage, in-place epilogue, 16-byte evict-first stores) with
// the per-tile overhead instructions taken out. Counted in the v5 SASS of 128x128x64_s2 (res2: one k stage
// per tile), per thread per tile: 10 run-time 32-bit divisions for (image, hw) -- one per 16-byte piece,
// ~12 instructions each incl. the quarter-rate I2F.RP/MUFU.RCP/F2I -- plus divisions for (tile / n_blocks)
// and (it / k_tiles), and one IADD per output element to turn the accumulator into magic-float bits.
//   * every 16-byte piece a thread moves (x, residual, output) lies on ONE tile row when (THREADS/2) % BM == 0
//     (piece = tid + i*THREADS: row = (tid/2) % BM for every i, slab = (tid/2)/BM + i*THREADS/(2*BM)), so
//     (image, hw) is computed once per tile and per thread, with FastDivmod (IMAD.HI + SHF, no MUFU);
//   * the flattened iteration is tracked by counters (tile, k stage, pipeline slot), not divisions;
//   * with |acc| < 2^22 the accumulators start at the magic bits 0x4B400000: IMMA adds exactly in int32, so
//     the accumulator already IS the magic float of 1.5*2^23 + acc and one FADD gives float(acc) (exact).
//   * PERM configs: the B loader reads weights whose rows are permuted within each 16-channel group so that
//     packed row t*8 + 2*tig + e holds channel 4*tig + 2*t + e. The m16n8k32 C fragment gives lane (g, tig)
//     columns 2*tig + e of n8 tiles t = 0, 1, so the thread then owns 4 CONSECUTIVE channels 4*tig .. 4*tig+3
//     of each 16-channel group: one 32-bit LDS/XOR/STS per 4 outputs instead of two 16-bit ones (and float4
//     constants). Same arithmetic per element, ~0.5 fewer instructions per element.
// The rounding rule and every value are the v5 ones; only the instruction count changes.
// ------------------------------------------------------------------------------------------------
template <bool SMALL>
__device__ __forceinline__ float acc_bits_to_float(int acc, std::integral_constant<bool, SMALL>) {
    return SMALL ? __fsub_rn(__int_as_float(acc), kMagic) : __int2float_rn(acc);
}

// Four int8 residual values (the bytes of `quad`) as floats: r_pair_to_float with one XOR for four.
__device__ __forceinline__ float4 r_quad_to_float(uint32_t quad) {
    uint32_t u = quad ^ 0x80808080u;
    return make_float4(__fsub_rn(__int_as_float(__byte_perm(u, kMagicBits, 0x7650)), kMagic + 128.0f),
                       __fsub_rn(__int_as_float(__byte_perm(u, kMagicBits, 0x7651)), kMagic + 128.0f),
                       __fsub_rn(__int_as_float(__byte_perm(u, kMagicBits, 0x7652)), kMagic + 128.0f),
                       __fsub_rn(__int_as_float(__byte_perm(u, kMagicBits, 0x7653)), kMagic + 128.0f));
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
residual_conv_kernel_v6(Params p) {
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, WM = Cfg::WM, WN = Cfg::WN, STAGES = Cfg::STAGES;
    constexpr int THREADS = Cfg::THREADS, KCH = Cfg::KCH;
    using Warp = WarpMma<WM, WN>;
    constexpr int NI = Warp::NI, MI = Warp::MI;
    constexpr int A_PIECES = BM * BK / 16 / THREADS, B_PIECES = BN * BK / 16 / THREADS;
    constexpr int R_PIECES = BM * BN / 16 / THREADS;
    static_assert((THREADS / 2) % BM == 0, "v6: all 16-byte pieces of a thread lie on one tile row");
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
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;   // between consecutive slabs
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    int const tiles = m_blocks * p.n_blocks;
    int const my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    int const k_tiles = (p.Kc * 32 + BK - 1) / BK;
    int const iters = my_tiles * k_tiles;
    int const init = p.small_acc ? kMagicBits : 0;   // accumulator start (see above)

    auto tile_mn = [&](int j, int& m0, int& n0) {   // j-th tile of this block, N fastest
        int t = blockIdx.x + j * gridDim.x;
        int mb = p.nb_div.div(t);
        n0 = (t - mb * p.n_blocks) * BN;
        m0 = mb * BM;
    };
    // Byte offset of this thread's row (m0 + my_row) in slab 0 of a tensor with `slabs` slabs, its 16-byte
    // half included; ok = the row exists (m < M; m < 2^31 since M < 2^31 - 256 and BM <= 256).
    auto my_row_offset = [&](int m0, int slabs, bool& ok) -> int64_t {
        int m = m0 + my_row;
        ok = m < p.M;
        int img = p.hw_div.div(m);
        int hw = m - img * p.HW;
        return (static_cast<int64_t>(img) * slabs * p.HW + hw) * 32 + my_half * 16;
    };

    // cp.asyncs of k stage kt of tile j into pipeline slot `slot`; kt == 0 also brings the tile's residual
    // into R buffer (j % STAGES).
    auto load_iter = [&](int j, int kt, int slot) {
        int m0, n0;
        tile_mn(j, m0, n0);
        if (kt == 0) {
            bool row_ok;
            int64_t const base = my_row_offset(m0, p.Nc, row_ok);
            int8_t* r_dst = sR + (j % STAGES) * Cfg::R_TILE;
#pragma unroll
            for (int i = 0; i < R_PIECES; ++i) {
                int slab = my_slab0 + i * SLAB_STEP, gslab = n0 / 32 + slab;
                bool ok = row_ok && gslab < p.Nc;
                cp_async_16(smem_u32(r_dst + swz_offset(slab, BM, my_row, my_half * 16)),
                            p.r + (ok ? base + gslab * slab_bytes : 0), ok);
            }
        }
        {
            bool row_ok;
            int64_t const base = my_row_offset(m0, p.Kc, row_ok);
            int8_t* a_dst = sA + slot * Cfg::A_STAGE;
#pragma unroll
            for (int i = 0; i < A_PIECES; ++i) {
                int chunk = my_slab0 + i * SLAB_STEP, kc = kt * KCH + chunk;
                bool ok = row_ok && kc < p.Kc;
                cp_async_16(smem_u32(a_dst + swz_offset(chunk, BM, my_row, my_half * 16)),
                            p.x + (ok ? base + kc * slab_bytes : 0), ok);
            }
        }
        int8_t* b_dst = sB + slot * Cfg::B_STAGE;
#pragma unroll
        for (int i = 0; i < B_PIECES; ++i) {
            int piece = tid + i * THREADS;
            // consecutive threads walk along one weight row: BK/16 pieces per row
            int row = piece / (BK / 16), kb = (piece % (BK / 16)) * 16;
            cp_async_16(smem_u32(b_dst + swz_offset(kb >> 5, BN, row, kb & 31)),
                        (Cfg::PERM ? p.w_perm : p.w) + static_cast<int64_t>(n0 + row) * p.Kpad + kt * BK + kb, true);
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
        load_next();                   // iteration it + STAGES - 1 (same order as v5: load_n == it + STAGES - 1)
#pragma unroll
        for (int c = 0; c < KCH; ++c)
            mma.step(sA + slot * Cfg::A_STAGE + c * BM * 32, BM, warp_m * WM,
                     sB + slot * Cfg::B_STAGE + c * BN * 32, BN, warp_n * WN, lane);
        if (++slot == STAGES) slot = 0;
        if (++kt != k_tiles) continue;
        kt = 0;

        // ---- epilogue of tile j (as v5: registers, in place over the residual, then 16-byte stores) ----
        int m0, n0;
        tile_mn(j, m0, n0);
        int8_t* r_tile = sR + (j % STAGES) * Cfg::R_TILE;
        auto epilogue = [&](auto small) {
#pragma unroll
            for (int n = 0; n < NI; ++n) {
                int col = warp_n * WN + n * 8 + tig * 2;
                float2 a = __ldg(reinterpret_cast<float2 const*>(p.a + n0 + col));
                float2 b = __ldg(reinterpret_cast<float2 const*>(p.b + n0 + col));
                float2 s = __ldg(reinterpret_cast<float2 const*>(p.s + n0 + col));
                uint16_t* base = reinterpret_cast<uint16_t*>(r_tile + swz_offset(col >> 5, BM, warp_m * WM + g, col & 31));
                uint32_t rv[MI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) rv[i][h] = base[(i * 16 + h * 8) * 16];   // 32-byte rows, 2-byte units
                uint32_t q[MI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float2 rf = r_pair_to_float(rv[i][h]);
                        float v0 = __fmaf_rn(acc_bits_to_float(mma.acc[i][n][2 * h], small), a.x, __fmaf_rn(rf.x, s.x, b.x));
                        float v1 = __fmaf_rn(acc_bits_to_float(mma.acc[i][n][2 * h + 1], small), a.y, __fmaf_rn(rf.y, s.y, b.y));
                        q[i][h] = q_pair(v0, v1, p.lo);
                    }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) base[(i * 16 + h * 8) * 16] = static_cast<uint16_t>(q[i][h]);
            }
        };
        // PERM: the pair of n8 tiles (n, n+1) holds channels col .. col+3 (col = 16-group + 4*tig) of rows
        // g + 8h (+16i): 32-bit words of the [slab][row][2 x 16 B] tile, 4-byte aligned inside one half.
        auto epilogue_perm = [&](auto small) {
            static_assert(NI % 2 == 0, "n8 tiles come in pairs (16-channel groups)");
#pragma unroll
            for (int n = 0; n < NI; n += 2) {
                int col = warp_n * WN + n * 8 + tig * 4;
                float4 a = __ldg(reinterpret_cast<float4 const*>(p.a + n0 + col));
                float4 b = __ldg(reinterpret_cast<float4 const*>(p.b + n0 + col));
                float4 s = __ldg(reinterpret_cast<float4 const*>(p.s + n0 + col));
                uint32_t* base = reinterpret_cast<uint32_t*>(r_tile + swz_offset(col >> 5, BM, warp_m * WM + g, col & 31));
                uint32_t rv[MI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) rv[i][h] = base[(i * 16 + h * 8) * 8];   // 32-byte rows, 4-byte units
                uint32_t q[MI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float4 rf = r_quad_to_float(rv[i][h]);
                        float v0 = __fmaf_rn(acc_bits_to_float(mma.acc[i][n][2 * h], small), a.x, __fmaf_rn(rf.x, s.x, b.x));
                        float v1 = __fmaf_rn(acc_bits_to_float(mma.acc[i][n][2 * h + 1], small), a.y, __fmaf_rn(rf.y, s.y, b.y));
                        float v2 = __fmaf_rn(acc_bits_to_float(mma.acc[i][n + 1][2 * h], small), a.z, __fmaf_rn(rf.z, s.z, b.z));
                        float v3 = __fmaf_rn(acc_bits_to_float(mma.acc[i][n + 1][2 * h + 1], small), a.w, __fmaf_rn(rf.w, s.w, b.w));
                        q[i][h] = __byte_perm(q_pair(v0, v1, p.lo), q_pair(v2, v3, p.lo), 0x5410);
                    }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) base[(i * 16 + h * 8) * 8] = q[i][h];
            }
        };
        if constexpr (Cfg::PERM) {
            if (p.small_acc) epilogue_perm(std::true_type{});
            else epilogue_perm(std::false_type{});
        } else {
            if (p.small_acc) epilogue(std::true_type{});
            else epilogue(std::false_type{});
        }
        mma.fill(init);
        __syncthreads();
        // ---- coalesced 16-byte stores of this thread's row (evict-first: the output is not re-read here) ----
        bool row_ok;
        int64_t const obase = my_row_offset(m0, p.Nc, row_ok);
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
