// The epilogue of every kernel: the rounding rule applied to an accumulator fragment, in place over the residual
// tile in shared memory (each output byte overwrites the residual byte it was computed from). Without a residual
// input (RESIDUAL = false) the tile is only written: t = fma(float(acc), a, b), which is the rule's value exactly
// (its inner fma(float(r), s, b) is b when the residual term is 0).
//
// The rule (exact; the reference emulates it): t = fma(float(acc), a[n], fma(float(r), s[n], b[n])), clamped to
// [lo, 127], rounded half to even. The op's arithmetic is all here (at res2, ~10 instructions per output element
// already cost half the memory floor), so it is written for few issue slots per element. Conversions avoid the
// quarter-rate I2F/F2I where an exact trick exists:
//   1.5 * 2^23 = 12582912 is a float whose last mantissa bit weighs 1, so for |i| < 2^22 the bits of
//   (12582912 + i) are 0x4B400000 + i, and adding it to a float in [-128, 127] rounds half to even. With
//   |acc| < 2^22 (Rule::small_acc) the kernels start their accumulators at the magic bits 0x4B400000: the tensor cores
//   add exactly in int32, so the accumulator already IS the magic float of 1.5*2^23 + acc and one FADD gives
//   float(acc).
//
// SAT, the saturating form of the rule with ReLU (Rule::sat), which takes work off the ALU pipe (the epilogue's clamps,
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
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "conv_int8/core/params.h"
#include "conv_int8/core/tile_layout.h"

namespace trtfuse {
namespace rconv {

constexpr float kMagic = 12582912.0f;
constexpr int kMagicBits = 0x4B400000;

template <bool SMALL>
__device__ __forceinline__ float acc_bits_to_float(int acc, std::integral_constant<bool, SMALL>) {
    return SMALL ? __fsub_rn(__int_as_float(acc), kMagic) : __int2float_rn(acc);
}
// Clamp, round half to even (via the magic add), and pack the two low bytes.
__device__ __forceinline__ uint32_t q_pair(float v0, float v1, float lo) {
    int b0 = __float_as_int(__fadd_rn(fminf(fmaxf(v0, lo), 127.f), kMagic));
    int b1 = __float_as_int(__fadd_rn(fminf(fmaxf(v1, lo), 127.f), kMagic));
    return __byte_perm(b0, b1, 0x0040);
}
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
// rule_t without a residual term: the inner fma(0, s, b) is b (up to the sign of a zero b, which no output byte
// shows: t = fma(acc, a, +-0) rounds to the same byte)
template <bool SAT>
__device__ __forceinline__ float rule_t_plain(float accf, float a, float b) {
    return SAT ? fma_sat(accf, a, b) : __fmaf_rn(accf, a, b);
}
// two (four) rule_t values as int8 bytes, packed in the low half (all) of a word
template <bool SAT>
__device__ __forceinline__ uint32_t q_quad_t(float t0, float t1, float t2, float t3, float lo) {
    if constexpr (SAT) {
        uint32_t const low3 = __float_as_uint(sub_pack<16>(sat_byte(t2), sub_pack<8>(sat_byte(t1), sat_byte(t0))));
        return __byte_perm(low3, __float_as_uint(sat_byte(t3)), 0x4210);
    } else {
        return __byte_perm(q_pair(t0, t1, lo), q_pair(t2, t3, lo), 0x5410);
    }
}

// The epilogue of an accumulator fragment: MI groups of 16 rows x NI n8 chunks in mma.sync's m16n8 C layout (per
// chunk j the thread has acc[i][4j + 2h + e] = row `row` + 16i + 8h, column 8j + 2*tig + e; wgmma's m64nN
// accumulator has this layout per warp). With the permuted weights (tile_layout.h: packed_row_channel) chunks 2k and
// 2k+1 hold channels 16k + 4*tig .. 16k + 4*tig + 3 for this thread: one 32-bit word per row of the tile.
// tile: [slab][ROWS][32] (swz_offset) starting at the fragment's first column; n0: that column's channel.
// keep(group, i, h, word): each output word (16-channel group `group` of the fragment, rows row + 16i + 8h) is also
// handed to it (the sm90 kernel keeps a tail's words as the A fragments of the next conv's GEMM); STORE = false: the
// words are not written to the tile (nor is a residual read from it).
struct KeepNone {
    __device__ __forceinline__ void operator()(int, int, int, uint32_t) const {}
};
template <int ROWS, int MI, int NI, bool RESIDUAL, bool SMALL, bool SAT, bool STORE = true, class Keep = KeepNone>
__device__ __forceinline__ void epilogue_fragment_form(int const (&acc)[MI][NI * 4], Rule const& rule, int8_t* tile,
                                                       int row, int tig, int n0, Keep&& keep = Keep{}) {
    static_assert(NI % 2 == 0, "n8 chunks come in pairs (16-channel groups)");
    std::integral_constant<bool, SMALL> small;
    // this thread's first channel of the per-channel constants: each chunk's loads are then an immediate offset from
    // it (indexing with n0 + col per chunk cost two 64-bit adds per load, ~7 % of the epilogue's instructions)
    int const c0 = n0 + tig * 4;
    float const *pa = (SAT ? rule.a8 : rule.a) + c0, *pb = (SAT ? rule.b8 : rule.b) + c0;
    float const* ps = (SAT ? rule.s8 : rule.s) + c0;
#pragma unroll
    for (int n = 0; n < NI; n += 2) {
        int const col = n * 8 + tig * 4;
        float4 const a = __ldg(reinterpret_cast<float4 const*>(pa + n * 8));
        float4 const b = __ldg(reinterpret_cast<float4 const*>(pb + n * 8));
        float4 const s = RESIDUAL ? __ldg(reinterpret_cast<float4 const*>(ps + n * 8)) : float4{};
        // rows row + 16i + 8h: 32-byte rows, 4-byte units (the swizzle depends on the row mod 8 only)
        uint32_t* base = STORE ? reinterpret_cast<uint32_t*>(tile + swz_offset(col >> 5, ROWS, row, col & 31)) : nullptr;
        uint32_t rv[MI][2], q[MI][2];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) rv[i][h] = RESIDUAL ? base[(i * 16 + h * 8) * 8] : 0u;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float const c[4] = {acc_bits_to_float(acc[i][4 * n + 2 * h], small),
                                    acc_bits_to_float(acc[i][4 * n + 2 * h + 1], small),
                                    acc_bits_to_float(acc[i][4 * n + 4 + 2 * h], small),
                                    acc_bits_to_float(acc[i][4 * n + 4 + 2 * h + 1], small)};
                float v[4];
                if constexpr (RESIDUAL) {
                    float4 const rf = r_quad_to_float_h(rv[i][h]);
                    v[0] = rule_t<SAT>(c[0], rf.x, a.x, b.x, s.x);
                    v[1] = rule_t<SAT>(c[1], rf.y, a.y, b.y, s.y);
                    v[2] = rule_t<SAT>(c[2], rf.z, a.z, b.z, s.z);
                    v[3] = rule_t<SAT>(c[3], rf.w, a.w, b.w, s.w);
                } else {
                    v[0] = rule_t_plain<SAT>(c[0], a.x, b.x);
                    v[1] = rule_t_plain<SAT>(c[1], a.y, b.y);
                    v[2] = rule_t_plain<SAT>(c[2], a.z, b.z);
                    v[3] = rule_t_plain<SAT>(c[3], a.w, b.w);
                }
                q[i][h] = q_quad_t<SAT>(v[0], v[1], v[2], v[3], rule.lo);
            }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (STORE) base[(i * 16 + h * 8) * 8] = q[i][h];
                keep(n >> 1, i, h, q[i][h]);
            }
    }
}

// f(sat, small) with the launch's rule form (rule.sat, rule.small_acc) as compile-time constants: the same for every
// thread, so no divergence.
template <class F>
__device__ __forceinline__ void with_rule_form(bool sat, bool small, F&& f) {
    using T = std::true_type;
    using N = std::false_type;
    if (sat) {
        if (small) f(T{}, T{});
        else f(T{}, N{});
    } else {
        if (small) f(N{}, T{});
        else f(N{}, N{});
    }
}

template <int ROWS, int MI, int NI, bool RESIDUAL, bool STORE = true, class Keep = KeepNone>
__device__ __forceinline__ void epilogue_fragment(int const (&acc)[MI][NI * 4], Rule const& rule, int8_t* tile, int row,
                                                  int tig, int n0, Keep&& keep = Keep{}) {
    with_rule_form(rule.sat, rule.small_acc, [&](auto sat, auto small) {
        epilogue_fragment_form<ROWS, MI, NI, RESIDUAL, decltype(small)::value, decltype(sat)::value, STORE>(
            acc, rule, tile, row, tig, n0, keep);
    });
}

}  // namespace rconv
}  // namespace trtfuse
