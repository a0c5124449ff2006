// PTX wrappers of the Hopper (sm_90a) instructions the sm90 kernel uses: wgmma, shared-memory matrix descriptors,
// mbarriers, bulk and tensor (TMA) copies, setmaxnreg.
//
// They exist only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL, nvcc 12+/13): in every other pass (sm_80, sm_90)
// they compile to nothing and kHasWgmma (a __device__ constant the host reads) is 0, so the host refuses the sm90
// configurations (TRTFUSE_RCONV_ERR_ARCH) instead of launching a kernel that does nothing.
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "conv_int8/core/ptx_sm80.cuh"   // smem_u32, cp.async (the producers copy x and residual with it)

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

// Shared-memory matrix descriptor (PTX ISA "matrix descriptor format") of an operand tile at shared address saddr:
// start address >> 4 (bits 0-13), leading byte offset >> 4 (bits 16-29), stride byte offset >> 4 (bits 32-45), base
// offset (bits 49-51) 0, layout type (bits 62-63) 3 = 32-byte swizzle. The kernels' [slab][row][2 x 16 B] tile
// (tile_layout.h: swz_offset, address bit 4 ^= bit 7) IS the canonical K-major 32B-swizzle layout: 32-byte rows,
// 8-row groups 256 B apart (SBO = 256); one k32 step spans the whole swizzle width, so LBO is unused (1 by
// convention). Tile bases are multiples of 256 B from the 1 KB-aligned dynamic shared memory start, so the swizzle
// pattern's phase (base offset) is 0. Shared addresses are < 228 KB, so adding (bytes >> 4) to a descriptor moves
// its start address without carrying out of the 14-bit field. (Measured and dropped: the no-swizzle layout, 1.45x
// slower at res5, docs/residual_conv.md Version 7.)
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr) {
    return static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (uint64_t(1) << 16) | (static_cast<uint64_t>(256 >> 4) << 32) |
           (uint64_t(3) << 62);
}

// The 128 accumulator operands of an m64n256 wgmma (both forms below): their places in the asm string and their
// "+r" constraints, d[0] .. d[127] in order
#define TRTFUSE_WGMMA_D128_PLACES \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63," \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95," \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TRTFUSE_WGMMA_D128_OPERANDS(d) \
    "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
    "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), \
    "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), \
    "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), \
    "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), \
    "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), \
    "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), \
    "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), \
    "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]), \
    "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]), \
    "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), \
    "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]), \
    "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]), \
    "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]), \
    "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), \
    "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])

// wgmma.mma_async m64nNk32 s32 += s8 x s8, A and B from shared memory (scale-d = 1: D = A*B + D), N = 256, 128, 64
// (N/2 accumulator registers per thread; 128 and 64: the 3x3 kernel, conv3x3_sm90.cuh).
__device__ __forceinline__ void wgmma_m64n256k32_s8(int (&d)[128], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
        TRTFUSE_WGMMA_D128_PLACES
        "}, %128, %129, p;\n}\n"
        : TRTFUSE_WGMMA_D128_OPERANDS(d)
        : "l"(da), "l"(db), "n"(1));
#else
    (void)d; (void)da; (void)db;
#endif
}

// (n128, n64: scale_d 0 makes D = A*B, the accumulators' start)
__device__ __forceinline__ void wgmma_m64n128k32_s8(int (&d)[64], uint64_t da, uint64_t db, int scale_d) {
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
        : "l"(da), "l"(db), "r"(scale_d));
#else
    (void)d; (void)da; (void)db;
#endif
}

__device__ __forceinline__ void wgmma_m64n64k32_s8(int (&d)[32], uint64_t da, uint64_t db, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
#else
    (void)d; (void)da; (void)db;
#endif
}

// wgmma.mma_async m64n64k32 s32 += s8 x s8 with A from registers (the stem, stem_sm90.cuh): a[0..3] is this thread's
// A fragment in mma.sync m16n8k32's layout per warp (rows 16 warp + g and + 8, k bytes 4 tig .. and 16 + 4 tig ..);
// the registers are read asynchronously, until a wgmma_wait retires the wgmma. scale_d 0: D = A*B (the start).
__device__ __forceinline__ void wgmma_m64n64k32_s8_rs(int (&d)[32], uint32_t const (&a)[4], uint64_t db,
                                                      int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
#else
    (void)d; (void)a; (void)db; (void)scale_d;
#endif
}

// m64n256k32 with A from registers (the 3x3 kernel's weights-stationary form, conv3x3_sm90.cuh: WREG): as
// wgmma_m64n64k32_s8_rs, 128 accumulator registers per thread.
__device__ __forceinline__ void wgmma_m64n256k32_s8_rs(int (&d)[128], uint32_t const (&a)[4], uint64_t db,
                                                       int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
        TRTFUSE_WGMMA_D128_PLACES
        "}, {%128, %129, %130, %131}, %132, p;\n}\n"
        : TRTFUSE_WGMMA_D128_OPERANDS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
#else
    (void)d; (void)a; (void)db; (void)scale_d;
#endif
}

// wgmma m64nBNk32 for the 3x3 kernel's N tiles (64, 128)
template <int BN>
__device__ __forceinline__ void wgmma_m64k32_s8(int (&d)[BN / 2], uint64_t da, uint64_t db, int scale_d) {
    static_assert(BN == 128 || BN == 64, "the 3x3 kernel's N tiles");
    if constexpr (BN == 128) wgmma_m64n128k32_s8(d, da, db, scale_d);
    else wgmma_m64n64k32_s8(d, da, db, scale_d);
}

// The wgmmas of one k stage: KCH k32 steps over A [KCH][BM][32] at da and N rows of B [KCH][B_ROWS][32] at db
// (shared-memory descriptors, whose addresses count 16-byte units); N 256, or 128 (half of a 256-row slice)
template <int BM, int KCH, int N = 256, int B_ROWS = 256>
__device__ __forceinline__ void wgmma_stage(int (&acc)[N / 2], uint64_t da, uint64_t db) {
    static_assert(N == 256 || N == 128, "the 1x1 kernel's wgmma N");
#pragma unroll
    for (int c = 0; c < KCH; ++c) {
        if constexpr (N == 256) wgmma_m64n256k32_s8(acc, da + ((c * BM * 32) >> 4), db + ((c * B_ROWS * 32) >> 4));
        else wgmma_m64n128k32_s8(acc, da + ((c * BM * 32) >> 4), db + ((c * B_ROWS * 32) >> 4), 1);
    }
}

// Registers per thread of a warp-specialized block of `threads` threads, one producer warpgroup and the rest
// consumers: the launch bound's allocation (a multiple of 8), and what setmaxnreg can give each consumer once the
// producers have dropped to `producer_regs` (the block's allocation is moved between its warps, not grown)
constexpr int launch_regs(int threads) { return 65536 / threads / 8 * 8; }
constexpr int consumer_regs(int threads, int producer_regs) {
    return (threads * launch_regs(threads) - 128 * producer_regs) / (threads - 128) / 8 * 8;
}

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
// Arrives on `bar` and adds `bytes` to the transaction count its phase waits for (the TMA loads' complete_tx)
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Makes this thread's mbarrier.inits visible to the async proxy (the TMA unit's complete_tx)
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Bulk copy (TMA, one contiguous run of `bytes`, a multiple of 16) from global src to shared dst; the bytes count
// against `bar`'s transaction count
__device__ __forceinline__ void bulk_load(uint32_t dst, void const* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}
// TMA (bulk tensor) store of a shared-memory box to the 4-d tensor `map` describes, at coordinates (c0..c3);
// out-of-bounds parts of the box are not written. Completion is tracked per thread by bulk async-groups.
__device__ __forceinline__ void tma_store_4d(CUtensorMap const* map, uint32_t src, int c0, int c1, int c2, int c3) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
#endif
}
// TMA (bulk tensor) load of a box of the 4-d tensor `map` describes, at coordinates (c0..c3), into shared dst; parts
// of the box outside the tensor are filled with zeros (the map's OOB fill); its bytes count against `bar`.
__device__ __forceinline__ void tma_load_4d(CUtensorMap const* map, uint32_t dst, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];\n" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
#endif
}
// TMA store of a shared-memory box to the 5-d tensor `map` describes (see tma_store_4d)
__device__ __forceinline__ void tma_store_5d(CUtensorMap const* map, uint32_t src, int c0, int c1, int c2, int c3,
                                             int c4) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
                 : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// waits until this thread's bulk groups but the newest N have finished reading shared memory (READ) or completed
template <int N, bool READ>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (READ) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
    else asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Whether the phase of `bar` with this parity has completed (does not wait)
__device__ __forceinline__ uint32_t mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
    return done;
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

}  // namespace rconv
}  // namespace trtfuse
