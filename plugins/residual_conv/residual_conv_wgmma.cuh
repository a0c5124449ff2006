// Hopper (sm_90a) variants of the fused int8 1x1 conv + BN + residual Add (+ReLU): the MMAs are
// wgmma.mma_async m64nNk32 s8 x s8 -> s32 with both operands in shared memory (matrix descriptors), issued by
// warpgroups of 4 warps. Everything around them is the v6 kernel's (residual_conv_kernel.cuh): persistent
// blocks, a cp.async multistage pipeline over the flattened (tile, k stage) sequence, the tile's residual
// prefetched with its first k stage, the epilogue in registers then in place over the residual tile, 16-byte
// evict-first stores, one (image, hw) per thread per tile, FastDivmod, magic-start accumulators, the PERM weight
// copy. The rounding rule and every output bit are the v5/v6 ones. Three kernels (configs in residual_conv.cu):
//   residual_conv_kernel_wgmma, WSTAT = false ("wg_*"): v6's tile order, weights streamed per k stage like x;
//   residual_conv_kernel_wgmma, WSTAT = true ("wgs_*"): weight stationary, the block keeps its BN x K weight slice
//     in shared memory and walks M tiles of one N block (the streamed one is bound by L2->SM traffic, weights
//     being 4/7 of it at res5);
//   residual_conv_kernel_wgmma_wgi ("wgi_*"): weight stationary with the 2 warpgroups independent (own 64-row
//     tiles, x pipeline, residual buffers, named barriers), so one's epilogue overlaps the other's wgmmas.
//
// Shared-memory operand layout. One k32 step of kCHW32 is one 32-channel slab: each GEMM row has 32 K bytes. A (x,
// [m][k]) and B (packed weights, [n][k]) are both K-major, the only layout wgmma accepts for 8-bit types.
//   Used: the 32-byte-swizzle canonical K-major layout, which is exactly the kernels' [slab][row][2 x 16 B] tile
//   with the halves swapped on rows 4..7 mod 8 (swz_offset); descriptor type 3, SBO 256 (see smem_desc).
//   Measured and not offered: the no-swizzle ("interleave") layout, core matrices of 8 rows x 16 bytes as 128
//   contiguous bytes, [row / 8][k half][row % 8][16 B], LBO 128 (along K), SBO 256: 1.45x slower at res5 batch
//   2048 (0.69 vs 0.48 ms, same tile config; not profiled: likely bank conflicts, the two 16-byte k halves of a
//   row being 128 bytes apart, i.e. on the same banks).
//
// Accumulators: for m64nN the warpgroup's warp w owns rows 16w..16w+15 of the 64; per n8 chunk j the thread has
// d[4j + 2h + e] = row 16w + lane/4 + 8h, column 8j + 2*(lane%4) + e: the m16n8 C fragment of mma.sync, so the
// v6 epilogue (and its PERM form) applies per chunk unchanged.
//
// Ordering: cp.async writes shared memory through the generic proxy and wgmma reads it through the async proxy:
// every thread runs fence.proxy.async.shared::cta after its cp.async group has landed and before the barrier
// that precedes the wgmmas. wgmma.fence precedes the first wgmma of each k stage (the accumulators were written
// by ordinary instructions at the tile start); wgmma.commit_group / wait_group bracket them.
//
// Compiled only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL, nvcc 12+/13): in every other pass (sm_80, sm_90)
// the kernels compile to an empty body and kHasWgmma (a __device__ constant the host reads) is 0, so the host
// refuses these configurations (TRTFUSE_RCONV_ERR_ARCH) instead of launching a kernel that does nothing.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "residual_conv/residual_conv_kernel.cuh"

namespace trtfuse {
namespace rconv {

// 1 in the module the driver loaded when that module was compiled for sm_90a (the wgmma kernels are real).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int const kHasWgmma = 1;
#else
__device__ int const kHasWgmma = 0;
#endif

__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Shared-memory matrix descriptor (PTX ISA "matrix descriptor format"): start address >> 4 (bits 0-13), leading
// byte offset >> 4 (bits 16-29), stride byte offset >> 4 (bits 32-45), base offset (bits 49-51) 0, layout type
// (bits 62-63). Shared addresses are < 228 KB, so adding (bytes >> 4) to a descriptor moves its start address
// without carrying out of the 14-bit field.
//   SW32 = false, no swizzle ("interleave"): LBO = 128 (core matrices adjacent along K), SBO = 256 (8-row groups).
//   SW32 = true, 32-byte swizzle (type 3): the kernel's usual [slab][row][2 x 16 B] tile with the two 16-byte
//   halves swapped on rows 4..7 mod 8 (swz_offset: address bit 4 ^= bit 7) IS the canonical K-major 32B-swizzle
//   layout: 32-byte rows, 8-row groups 256 B apart (SBO = 256); one k32 step spans the whole swizzle width, so
//   LBO is unused (1 by convention). Tile bases are multiples of 256 B from the 1 KB-aligned dynamic shared
//   memory start, so the swizzle pattern's phase (base offset) is 0.
template <bool SW32>
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr) {
    uint64_t d = static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (static_cast<uint64_t>(256 >> 4) << 32);
    return SW32 ? d | (uint64_t(1) << 16) | (uint64_t(3) << 62) : d | (static_cast<uint64_t>(128 >> 4) << 16);
}

// Byte offset of (k chunk, row, 16-byte half) in a [chunk][rows] operand tile of the no-swizzle layout above.
__device__ __forceinline__ int core_offset(int chunk, int rows, int row, int half) {
    return chunk * rows * 32 + ((row >> 3) << 8) + (half << 7) + ((row & 7) << 4);
}
template <bool SW32>
__device__ __forceinline__ int operand_offset(int chunk, int rows, int row, int half) {
    return SW32 ? swz_offset(chunk, rows, row, half * 16) : core_offset(chunk, rows, row, half);
}

// wgmma.mma_async m64nNk32 s32 += s8 x s8, A and B from shared memory (scale-d = 1: D = A*B + D).
__device__ __forceinline__ void wgmma_m64n128k32_s8(int (&d)[64], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(da), "l"(db), "n"(1));
#else
    (void)d; (void)da; (void)db;
#endif
}

__device__ __forceinline__ void wgmma_m64n256k32_s8(int (&d)[128], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
          "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
          "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
          "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
          "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
          "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
          "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
          "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
          "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
        : "l"(da), "l"(db), "n"(1));
#else
    (void)d; (void)da; (void)db;
#endif
}

template <int BN>
__device__ __forceinline__ void wgmma_m64k32_s8(int (&d)[BN / 2], uint64_t da, uint64_t db) {
    if constexpr (BN == 256) wgmma_m64n256k32_s8(d, da, db);
    else wgmma_m64n128k32_s8(d, da, db);
}

// The wgmmas of one k stage: KCH k32 steps over A [KCH][BM][32] at da and B [KCH][BN][32] at db (shared-memory
// descriptors, whose addresses count 16-byte units)
template <int BM, int BN, int KCH>
__device__ __forceinline__ void wgmma_stage(int (&acc)[BN / 2], uint64_t da, uint64_t db) {
#pragma unroll
    for (int c = 0; c < KCH; ++c) wgmma_m64k32_s8<BN>(acc, da + ((c * BM * 32) >> 4), db + ((c * BN * 32) >> 4));
}

// Tile configuration of the wgmma kernel:
//   BM = 64 x (consumer warpgroups), BN = the wgmma N (128 or 256), BK = k bytes per pipeline stage, STAGES,
//   MIN_BLOCKS (register cap, __launch_bounds__),
//   WSTAT ("weight stationary"): the block keeps its BN x K weight slice in shared memory for all its tiles (it
//     walks M tiles of one N block), so the k loop streams only x; else the v6 order (N fastest) with weights
//     streamed per k stage like x. Measured (H100, res5 batch 2048): without WSTAT the kernel is bound by the
//     L2->SM traffic, ~224 KB per 128x256 tile of which 128 KB are weights (0.44 ms with the MMAs removed);
//   RBUF: residual/output tile buffers (WSTAT; the streamed variant uses STAGES). A tile's residual is fetched
//     with its first k stage, LOAD_AHEAD stages early; RBUF buffers suffice when (RBUF - 1) * k_tiles >= LOAD_AHEAD
//     (host check, see wgmma_fits), else the config refuses that layer;
//   SW32: the operand layout (32-byte swizzle; false = no swizzle, measured 1.45x slower at res5, kept for reference);
//   PERM: the v6 PERM epilogue over the permuted weight copy.
template <int BM_, int BN_, int BK_, int STAGES_, int MIN_BLOCKS_, bool WSTAT_ = false, int RBUF_ = 0,
          bool SW32_ = true, bool PERM_ = true>
struct WgTileConfig {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr bool WSTAT = WSTAT_, SW32 = SW32_, PERM = PERM_;
    static constexpr int RBUF = WSTAT_ ? RBUF_ : STAGES_;
    static constexpr bool V6 = true, WGMMA = true;
    static constexpr int WARPGROUPS = BM / 64;
    static constexpr int THREADS = WARPGROUPS * 128;
    static constexpr int KCH = BK / 32;
    static constexpr int A_STAGE = BM * BK, B_STAGE = WSTAT ? 0 : BN * BK, R_TILE = BM * BN;
    // WSTAT adds BN * (k_tiles * BK) bytes of weights at the front (run-time K; see smem_bytes)
    static constexpr int SMEM = STAGES * (A_STAGE + B_STAGE) + RBUF * R_TILE;
    static constexpr int LOAD_AHEAD = STAGES - 1;   // k stages loaded ahead of the one computed
    static_assert(BM % 64 == 0 && (BN == 128 || BN == 256), "m64 per warpgroup; n128 or n256 per wgmma");
    static_assert(BK % 32 == 0 && 128 % BK == 0 && 256 % BN == 0, "packing pads N to 256, K to 128");
    static_assert((BM * BK / 16) % THREADS == 0 && (BN * BK / 16) % THREADS == 0 && (BM * BN / 16) % THREADS == 0,
                  "every thread moves the same number of 16-byte pieces");
    static_assert((THREADS / 2) % BM == 0, "all 16-byte pieces of a thread lie on one tile row");
    static_assert(STAGES >= 2 && RBUF >= 2, "pipelines");
    static_assert(SMEM <= 227 * 1024, "shared memory per block");
};

// Dynamic shared memory of a launch (WSTAT: the weight slice depends on K).
template <class Cfg>
constexpr int wgmma_smem_bytes(int k_tiles) {
    return Cfg::SMEM + (Cfg::WSTAT ? Cfg::BN * k_tiles * Cfg::BK : 0);
}

// ---- the epilogue, shared by every wgmma kernel: the v6 one (rounding rule, magic-float accumulators, PERM's four
// channels per thread) applied per n8 chunk of the m64nN accumulator, whose register layout is mma.sync's m16n8 C
// fragment. This thread owns rows `row` and `row + 8` of its warp's 16 and, per chunk, 2 (PERM: 4) columns; it reads
// their residual bytes from the tile in shared memory and overwrites them in place with the int8 output.
//
// SAT, the saturating form of the rule with ReLU (p.sat), which takes work off the ALU pipe (the epilogue's clamps,
// byte permutes and packs all ran there, measured as math-pipe stalls, while the FMA pipes had room): with a, b, s
// scaled by 2^-8 (exact),
//   t8 = fma.sat(float(acc), a8, fma(float(r), s8, b8)) = clamp(t, 0, 256) * 2^-8,
// then min(t8, 127/256) * 2^-141 = clamp(t, 0, 127) * 2^-149 rounds, half to even, to a subnormal whose bits are the
// output byte. Subnormals add as integers, so bytes 0-2 of a word pack by fp32 multiply-adds (q0 + q1 2^8 + q2 2^16
// < 2^23 stays subnormal, exact); byte 3 by one integer op. Exact: scaling by a power of two commutes with each fp32
// rounding unless a result is subnormal. The host allows SAT only when every nonzero a, b, s lies in [2^-90, 2^100]:
// fma(r, s, b) is then 0 or a multiple of 2^-113 (normal after scaling, no overflow); a subnormal t8 means
// t < 2^-118, which rounds to 0 either way; an overflowing t (inf in the rule) saturates to 127 either way. The PTX
// below has no .ftz, so subnormals are kept whatever the compiler flags.
__device__ __forceinline__ float fma_sat(float x, float y, float z) {
    float d;
    asm("fma.rn.sat.f32 %0, %1, %2, %3;\n" : "=f"(d) : "f"(x), "f"(y), "f"(z));
    return d;
}
// the output byte of a SAT value t8 in [0, 1], as the subnormal float whose bits are that byte
__device__ __forceinline__ float sat_byte(float t8) {
    float d;
    asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(d) : "f"(fminf(t8, 127.f / 256.f)), "f"(0x1p-141f));
    return d;
}
// lo + hi * 2^shift for subnormal byte floats (exact while the sum stays below 2^-126)
template <int SHIFT>
__device__ __forceinline__ float sub_pack(float hi, float lo) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;\n" : "=f"(d) : "f"(hi), "f"(static_cast<float>(1 << SHIFT)), "f"(lo));
    return d;
}
// r_quad_to_float with half of its byte permutes moved to the FMA pipe: two bytes at a time are spliced under the
// fp16 exponent of 1024 (one PRMT), 1024 + 128 subtracted in f16x2 (exact: integers below 2048), then widened.
__device__ __forceinline__ float4 r_quad_to_float_h(uint32_t quad) {
    uint32_t const u = quad ^ 0x80808080u;
    __half2 const bias = __float2half2_rn(1152.f);
    uint32_t const w01 = __byte_perm(u, 0x6464u, 0x4140), w23 = __byte_perm(u, 0x6464u, 0x4342);
    float2 const f01 = __half22float2(__hsub2(*reinterpret_cast<__half2 const*>(&w01), bias));
    float2 const f23 = __half22float2(__hsub2(*reinterpret_cast<__half2 const*>(&w23), bias));
    return make_float4(f01.x, f01.y, f23.x, f23.y);
}

template <bool SAT>
__device__ __forceinline__ float rule_t(float accf, float rf, float a, float b, float s) {
    return SAT ? fma_sat(accf, a, __fmaf_rn(rf, s, b)) : __fmaf_rn(accf, a, __fmaf_rn(rf, s, b));
}
// two (four) rule_t values as int8 bytes, packed in the low half (all) of a word
template <bool SAT>
__device__ __forceinline__ uint32_t q_pair_t(float t0, float t1, float lo) {
    if constexpr (SAT) return __float_as_uint(sub_pack<8>(sat_byte(t1), sat_byte(t0)));
    else return q_pair(t0, t1, lo);
}
template <bool SAT>
__device__ __forceinline__ uint32_t q_quad_t(float t0, float t1, float t2, float t3, float lo) {
    if constexpr (SAT) {
        uint32_t const low3 = __float_as_uint(sub_pack<16>(sat_byte(t2), sub_pack<8>(sat_byte(t1), sat_byte(t0))));
        return __byte_perm(low3, __float_as_uint(sat_byte(t3)), 0x4210);
    } else {
        return __byte_perm(q_pair(t0, t1, lo), q_pair(t2, t3, lo), 0x5410);
    }
}

template <int BM, int NI, bool PERM, bool SMALL, bool SAT>
__device__ __forceinline__ void wgmma_epilogue_chunks(int const (&acc)[NI * 4], Params const& p, int8_t* r_tile,
                                                      int row, int tig, int n0,
                                                      std::integral_constant<bool, SMALL> small,
                                                      std::integral_constant<bool, SAT>) {
    // this thread's first channel of the per-channel constants: each chunk's loads are then an immediate offset from
    // it (indexing with n0 + col per chunk cost two 64-bit adds per load, ~7 % of the epilogue's instructions)
    int const c0 = n0 + tig * (PERM ? 4 : 2);
    float const *pa = (SAT ? p.a8 : p.a) + c0, *pb = (SAT ? p.b8 : p.b) + c0, *ps = (SAT ? p.s8 : p.s) + c0;
    if constexpr (!PERM) {
#pragma unroll
        for (int n = 0; n < NI; ++n) {
            int col = n * 8 + tig * 2;
            float2 a = __ldg(reinterpret_cast<float2 const*>(pa + n * 8));
            float2 b = __ldg(reinterpret_cast<float2 const*>(pb + n * 8));
            float2 s = __ldg(reinterpret_cast<float2 const*>(ps + n * 8));
            uint16_t* base = reinterpret_cast<uint16_t*>(r_tile + swz_offset(col >> 5, BM, row, col & 31));
            uint32_t rv[2], q[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) rv[h] = base[h * 8 * 16];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float2 rf = r_pair_to_float(rv[h]);
                float v0 = rule_t<SAT>(acc_bits_to_float(acc[4 * n + 2 * h], small), rf.x, a.x, b.x, s.x);
                float v1 = rule_t<SAT>(acc_bits_to_float(acc[4 * n + 2 * h + 1], small), rf.y, a.y, b.y, s.y);
                q[h] = q_pair_t<SAT>(v0, v1, p.lo);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) base[h * 8 * 16] = static_cast<uint16_t>(q[h]);
        }
    } else {
#pragma unroll
        for (int n = 0; n < NI; n += 2) {
            int col = n * 8 + tig * 4;
            float4 a = __ldg(reinterpret_cast<float4 const*>(pa + n * 8));
            float4 b = __ldg(reinterpret_cast<float4 const*>(pb + n * 8));
            float4 s = __ldg(reinterpret_cast<float4 const*>(ps + n * 8));
            uint32_t* base = reinterpret_cast<uint32_t*>(r_tile + swz_offset(col >> 5, BM, row, col & 31));
            uint32_t rv[2], q[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) rv[h] = base[h * 8 * 8];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float4 rf = r_quad_to_float_h(rv[h]);
                float v0 = rule_t<SAT>(acc_bits_to_float(acc[4 * n + 2 * h], small), rf.x, a.x, b.x, s.x);
                float v1 = rule_t<SAT>(acc_bits_to_float(acc[4 * n + 2 * h + 1], small), rf.y, a.y, b.y, s.y);
                float v2 = rule_t<SAT>(acc_bits_to_float(acc[4 * (n + 1) + 2 * h], small), rf.z, a.z, b.z, s.z);
                float v3 = rule_t<SAT>(acc_bits_to_float(acc[4 * (n + 1) + 2 * h + 1], small), rf.w, a.w, b.w, s.w);
                q[h] = q_quad_t<SAT>(v0, v1, v2, v3, p.lo);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) base[h * 8 * 8] = q[h];
        }
    }
}

template <int BM, int NI, bool PERM>
__device__ __forceinline__ void wgmma_epilogue(int const (&acc)[NI * 4], Params const& p, int8_t* r_tile, int row, int tig,
                                               int n0) {
    using T = std::true_type;
    using F = std::false_type;
    if (p.sat) {
        if (p.small_acc) wgmma_epilogue_chunks<BM, NI, PERM>(acc, p, r_tile, row, tig, n0, T{}, T{});
        else wgmma_epilogue_chunks<BM, NI, PERM>(acc, p, r_tile, row, tig, n0, F{}, T{});
    } else {
        if (p.small_acc) wgmma_epilogue_chunks<BM, NI, PERM>(acc, p, r_tile, row, tig, n0, T{}, F{});
        else wgmma_epilogue_chunks<BM, NI, PERM>(acc, p, r_tile, row, tig, n0, F{}, F{});
    }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
residual_conv_kernel_wgmma(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, RBUF = Cfg::RBUF;
    constexpr int THREADS = Cfg::THREADS, KCH = Cfg::KCH, LA = Cfg::LOAD_AHEAD;
    constexpr bool WSTAT = Cfg::WSTAT;
    constexpr int NI = BN / 8;   // n8 chunks of the accumulator
    constexpr int A_PIECES = BM * BK / 16 / THREADS, B_PIECES = BN * BK / 16 / THREADS;
    constexpr int R_PIECES = BM * BN / 16 / THREADS;
    constexpr int SLAB_STEP = THREADS / 2 / BM;

    int const k_tiles = (p.Kc * 32 + BK - 1) / BK;
    // [WSTAT: weights, k_tiles*KCH chunks x BN rows] [STAGES x A] [STAGES x B unless WSTAT] [RBUF x R]
    extern __shared__ __align__(1024) int8_t wg_smem[];   // (own name: the other kernels' smem is align 128)
    int8_t* sW = wg_smem;
    int8_t* sA = sW + (WSTAT ? BN * k_tiles * BK : 0);    // STAGES x [KCH][BM] operand layout
    int8_t* sB = sA + STAGES * Cfg::A_STAGE;               // STAGES x [KCH][BN] operand layout (not WSTAT)
    int8_t* sR = sB + STAGES * Cfg::B_STAGE;               // RBUF x [BN/32][BM][32] (swz_offset): residual, output

    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const wg = warp >> 2;                            // consumer warpgroup: rows 64*wg .. 64*wg+63
    int const warp_row0 = wg * 64 + (warp & 3) * 16;     // this warp's 16 accumulator rows
    int const g = lane >> 2, tig = lane & 3;
    int const my_row = (tid >> 1) % BM, my_slab0 = (tid >> 1) / BM, my_half = tid & 1;
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    // Tile order. Streamed: tile t = blockIdx.x + j*gridDim.x, N fastest (v6). WSTAT: the grid is a multiple of
    // n_blocks (host); block b keeps N block b % n_blocks and walks M blocks b / n_blocks + j * (grid / n_blocks),
    // so the n_blocks blocks sharing an x tile run it at about the same time (L2 hits).
    int my_tiles, wn0 = 0, wmb0 = 0, wmstep = 0;
    if constexpr (WSTAT) {
        wn0 = (static_cast<int>(blockIdx.x) % p.n_blocks) * BN;
        wmb0 = static_cast<int>(blockIdx.x) / p.n_blocks;
        wmstep = static_cast<int>(gridDim.x) / p.n_blocks;
        my_tiles = wmb0 < m_blocks ? (m_blocks - 1 - wmb0) / wmstep + 1 : 0;
    } else {
        int const tiles = m_blocks * p.n_blocks;
        my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    }
    int const iters = my_tiles * k_tiles;
    int const init = p.small_acc ? kMagicBits : 0;

    // Descriptors of stage 0, k chunk 0 (A: this warpgroup's 64 rows); slot s, chunk c add bytes >> 4.
    uint64_t const descA0 = smem_desc<Cfg::SW32>(smem_u32(sA) + wg * 64 * 32);
    uint64_t const descB0 = smem_desc<Cfg::SW32>(smem_u32(WSTAT ? sW : sB));

    auto tile_mn = [&](int j, int& m0, int& n0) {
        if constexpr (WSTAT) {
            n0 = wn0;
            m0 = (wmb0 + j * wmstep) * BM;
        } else {
            int t = blockIdx.x + j * gridDim.x;
            int mb = p.nb_div.div(t);
            n0 = (t - mb * p.n_blocks) * BN;
            m0 = mb * BM;
        }
    };
    auto my_row_offset = [&](int m0, int slabs, bool& ok) -> int64_t {
        int m = m0 + my_row;
        ok = m < p.M;
        int img = p.hw_div.div(m);
        int hw = m - img * p.HW;
        return (static_cast<int64_t>(img) * slabs * p.HW + hw) * 32 + my_half * 16;
    };
    int8_t const* wsrc = Cfg::PERM ? p.w_perm : p.w;

    auto load_iter = [&](int j, int kt, int slot) {
        int m0, n0;
        tile_mn(j, m0, n0);
        if (kt == 0) {
            bool row_ok;
            int64_t const base = my_row_offset(m0, p.Nc, row_ok);
            int8_t* r_dst = sR + (j % RBUF) * Cfg::R_TILE;
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
                cp_async_16(smem_u32(a_dst + operand_offset<Cfg::SW32>(chunk, BM, my_row, my_half)),
                            p.x + (ok ? base + kc * slab_bytes : 0), ok);
            }
        }
        if constexpr (!WSTAT) {
            int8_t* b_dst = sB + slot * Cfg::B_STAGE;
#pragma unroll
            for (int i = 0; i < B_PIECES; ++i) {
                int piece = tid + i * THREADS;
                int row = piece / (BK / 16), kb = (piece % (BK / 16)) * 16;   // consecutive threads along a row
                cp_async_16(smem_u32(b_dst + operand_offset<Cfg::SW32>(kb >> 5, BN, row, (kb >> 4) & 1)),
                            wsrc + static_cast<int64_t>(n0 + row) * p.Kpad + kt * BK + kb, true);
            }
        }
    };

    if constexpr (WSTAT) {
        // The block's weight slice, once: rows wn0 .. wn0+BN-1, k bytes 0 .. k_tiles*BK-1 (zero padded in the
        // packed copy), as k_tiles*KCH chunks of [BN][32]. Part of the first cp.async group.
        if (my_tiles > 0) {
            int const row_pieces = k_tiles * BK / 16;
            for (int piece = tid; piece < BN * row_pieces; piece += THREADS) {
                int row = piece / row_pieces, kb = (piece - row * row_pieces) * 16;
                cp_async_16(smem_u32(sW + operand_offset<Cfg::SW32>(kb >> 5, BN, row, (kb >> 4) & 1)),
                            wsrc + static_cast<int64_t>(wn0 + row) * p.Kpad + kb, true);
            }
        }
    }

    int load_j = 0, load_kt = 0, load_slot = 0, load_n = 0;
    auto load_next = [&]() {
        if (load_n < iters) {
            load_iter(load_j, load_kt, load_slot);
            ++load_n;
            if (++load_kt == k_tiles) { load_kt = 0; ++load_j; }
            if (++load_slot == STAGES) load_slot = 0;
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < LA; ++s) load_next();

    int acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = init;

    int j = 0, kt = 0, slot = 0;
    for (int it = 0; it < iters; ++it) {
        cp_async_wait<LA - 1>();   // this thread's pieces of stage it (and at kt == 0 the residual) have landed
        fence_proxy_async_smem();  // ... and are visible to the async proxy (wgmma)
        __syncthreads();           // ... for every thread; the wgmmas of stage it - 1 are done (waited below)
        load_next();               // stage it + LA into slot (it + LA) % STAGES
        wgmma_fence();
        {
            uint64_t const da = descA0 + ((slot * Cfg::A_STAGE) >> 4);
            uint64_t const db = WSTAT ? descB0 + ((kt * KCH * BN * 32) >> 4) : descB0 + ((slot * Cfg::B_STAGE) >> 4);
            wgmma_stage<BM, BN, KCH>(acc, da, db);
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (++slot == STAGES) slot = 0;
        if (++kt != k_tiles) continue;
        kt = 0;

        // ---- epilogue of tile j: the v6 one, per n8 chunk of the wgmma accumulator ----
        int m0, n0;
        tile_mn(j, m0, n0);
        int8_t* r_tile = sR + (j % RBUF) * Cfg::R_TILE;
        wgmma_epilogue<BM, NI, Cfg::PERM>(acc, p, r_tile, warp_row0 + g, tig, n0);
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = init;
        __syncthreads();
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
    cp_async_wait<0>();
#else
    (void)p;   // not an sm_90a pass: never launched (the host checks kHasWgmma first)
#endif
}

// ------------------------------------------------------------------------------------------------
// Independent warpgroups ("wgi_*" configs): weight stationary as above, but each of the block's 2 warpgroups owns
// its own 64-row M tiles, x pipeline and residual buffers, and synchronizes only its own 128 threads (named
// barrier 1 + wg); the weight slice in shared memory is shared. The warpgroups drift out of phase, so one's
// epilogue (issue bound) overlaps the other's wgmmas (tensor cores) and loads, which the block-wide version
// serializes (measured there: epilogue ~1/4 of the time at res5).
// ------------------------------------------------------------------------------------------------
template <int BN_, int BK_, int STAGES_, int RBUF_, bool PERM_ = true>
struct WgiTileConfig {
    static constexpr int BM = 64, BN = BN_, BK = BK_, STAGES = STAGES_, RBUF = RBUF_, MIN_BLOCKS = 1;
    static constexpr bool WSTAT = true, SW32 = true, PERM = PERM_, V6 = true, WGMMA = true;
    static constexpr int WARPGROUPS = 2, THREADS = 256, WG_THREADS = 128;
    static constexpr int KCH = BK / 32;
    static constexpr int A_STAGE = BM * BK, R_TILE = BM * BN;
    static constexpr int WG_SMEM = STAGES * A_STAGE + RBUF * R_TILE;   // per warpgroup
    static constexpr int SMEM = WARPGROUPS * WG_SMEM;                  // + BN * k_tiles * BK of weights
    static constexpr int LOAD_AHEAD = STAGES - 1;
    static_assert(BN == 128 || BN == 256, "n128 or n256 per wgmma");
    static_assert(BK % 32 == 0 && 128 % BK == 0, "packing pads K to 128");
    static_assert((BM * BK / 16) % WG_THREADS == 0 && (BM * BN / 16) % WG_THREADS == 0, "equal pieces");
    static_assert((WG_THREADS / 2) % BM == 0, "all 16-byte pieces of a thread lie on one tile row");
    static_assert(STAGES >= 2 && RBUF >= 2 && SMEM <= 227 * 1024, "pipelines, shared memory");
};

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
residual_conv_kernel_wgmma_wgi(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, RBUF = Cfg::RBUF;
    constexpr int WT = Cfg::WG_THREADS, KCH = Cfg::KCH, LA = Cfg::LOAD_AHEAD;
    constexpr int NI = BN / 8;
    constexpr int A_PIECES = BM * BK / 16 / WT, R_PIECES = BM * BN / 16 / WT;
    constexpr int SLAB_STEP = WT / 2 / BM;

    int const k_tiles = (p.Kc * 32 + BK - 1) / BK;
    extern __shared__ __align__(1024) int8_t wg_smem[];
    int const tid = threadIdx.x, wg = tid >> 7, t = tid & (WT - 1), lane = tid & 31, warp_in_wg = t >> 5;
    int8_t* sW = wg_smem;                                                     // [k chunk][BN] weights (shared)
    int8_t* sA = sW + BN * k_tiles * BK + wg * Cfg::WG_SMEM;                  // this warpgroup's STAGES x [KCH][64]
    int8_t* sR = sA + STAGES * Cfg::A_STAGE;                                  // ... and RBUF x [BN/32][64][32]

    int const warp_row0 = warp_in_wg * 16;
    int const g = lane >> 2, tig = lane & 3;
    int const my_row = (t >> 1) % BM, my_slab0 = (t >> 1) / BM, my_half = t & 1;
    int64_t const slab_bytes = static_cast<int64_t>(p.HW) * 32;
    int const m_blocks = static_cast<int>((p.M + BM - 1) / BM);
    // block b keeps N block b % n_blocks; its warpgroups walk 64-row M tiles u, u + ustep, ... with
    // u = 2 * (b / n_blocks) + wg, ustep = 2 * (grid / n_blocks)
    int const wn0 = (static_cast<int>(blockIdx.x) % p.n_blocks) * BN;
    int const u0 = 2 * (static_cast<int>(blockIdx.x) / p.n_blocks) + wg;
    int const ustep = 2 * (static_cast<int>(gridDim.x) / p.n_blocks);
    int const my_tiles = u0 < m_blocks ? (m_blocks - 1 - u0) / ustep + 1 : 0;
    int const iters = my_tiles * k_tiles;
    int const init = p.small_acc ? kMagicBits : 0;
    int8_t const* wsrc = Cfg::PERM ? p.w_perm : p.w;

    // The weight slice, by all 256 threads, before anything else (its own cp.async group, waited for below).
    {
        bool const any = 2 * (static_cast<int>(blockIdx.x) / p.n_blocks) < m_blocks;
        int const row_pieces = k_tiles * BK / 16;
        if (any)
            for (int piece = tid; piece < BN * row_pieces; piece += Cfg::THREADS) {
                int row = piece / row_pieces, kb = (piece - row * row_pieces) * 16;
                cp_async_16(smem_u32(sW + swz_offset(kb >> 5, BN, row, kb & 31)),
                            wsrc + static_cast<int64_t>(wn0 + row) * p.Kpad + kb, true);
            }
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();   // the only block-wide barrier: from here on each warpgroup runs on its own
    }

    uint64_t const descA0 = smem_desc<true>(smem_u32(sA));
    uint64_t const descB0 = smem_desc<true>(smem_u32(sW));
    auto tile_m0 = [&](int j) { return (u0 + j * ustep) * BM; };
    auto my_row_offset = [&](int m0, int slabs, bool& ok) -> int64_t {
        int m = m0 + my_row;
        ok = m < p.M;
        int img = p.hw_div.div(m);
        int hw = m - img * p.HW;
        return (static_cast<int64_t>(img) * slabs * p.HW + hw) * 32 + my_half * 16;
    };
    auto load_iter = [&](int j, int kt, int slot) {
        int const m0 = tile_m0(j);
        if (kt == 0) {
            bool row_ok;
            int64_t const base = my_row_offset(m0, p.Nc, row_ok);
            int8_t* r_dst = sR + (j % RBUF) * Cfg::R_TILE;
#pragma unroll
            for (int i = 0; i < R_PIECES; ++i) {
                int slab = my_slab0 + i * SLAB_STEP, gslab = wn0 / 32 + slab;
                bool ok = row_ok && gslab < p.Nc;
                cp_async_16(smem_u32(r_dst + swz_offset(slab, BM, my_row, my_half * 16)),
                            p.r + (ok ? base + gslab * slab_bytes : 0), ok);
            }
        }
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
    };
    int load_j = 0, load_kt = 0, load_slot = 0, load_n = 0;
    auto load_next = [&]() {
        if (load_n < iters) {
            load_iter(load_j, load_kt, load_slot);
            ++load_n;
            if (++load_kt == k_tiles) { load_kt = 0; ++load_j; }
            if (++load_slot == STAGES) load_slot = 0;
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < LA; ++s) load_next();

    int acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = init;

    int j = 0, kt = 0, slot = 0;
    for (int it = 0; it < iters; ++it) {
        cp_async_wait<LA - 1>();
        fence_proxy_async_smem();
        named_barrier_sync(1 + wg, WT);   // this warpgroup's stage it has landed; its stage it - 1 wgmmas are done
        load_next();
        wgmma_fence();
        {
            uint64_t const da = descA0 + ((slot * Cfg::A_STAGE) >> 4);
            uint64_t const db = descB0 + ((kt * KCH * BN * 32) >> 4);
            wgmma_stage<BM, BN, KCH>(acc, da, db);
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (++slot == STAGES) slot = 0;
        if (++kt != k_tiles) continue;
        kt = 0;

        int const m0 = tile_m0(j), n0 = wn0;
        int8_t* r_tile = sR + (j % RBUF) * Cfg::R_TILE;
        wgmma_epilogue<BM, NI, Cfg::PERM>(acc, p, r_tile, warp_row0 + g, tig, n0);
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = init;
        named_barrier_sync(1 + wg, WT);
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
    cp_async_wait<0>();
#else
    (void)p;
#endif
}

}  // namespace rconv
}  // namespace trtfuse
