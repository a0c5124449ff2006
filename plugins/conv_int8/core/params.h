// Kernel arguments of the fused int8 1x1 conv + folded BN + residual Add (+ReLU), one struct for every kernel.
//
//   out[m, n] = q( act( x_scale * w_scale[n] * acc[m, n] + bias[n] + r_scale * r[m, n] ) / out_scale )
//   acc[m, n] = sum_k x[m, k] * w[n, k]   (int32),  m = (image, h*W + w),  k = Cin,  n = Cout
//
// kCHW32 addressing: element (img, c, hw) of a C-channel tensor is at ((img*ceil(C/32) + c/32)*HW + hw)*32 + c%32,
// so one GEMM row m owns a 32-byte run in every 32-channel slab, and consecutive rows of one image are
// consecutive 32-byte runs. Tiles of M may straddle images (res5: HW = 49): every row computes its own
// (image, hw) and the address math never assumes a tile lies inside one image.
#pragma once
#include <cstdint>
#include <cuda.h>   // CUtensorMap (the sm90 kernel's TMA output stores; the host encodes the map: out_map.h)

#include "common/fast_divmod.h"

namespace trtfuse {
namespace rconv {

// What a launch's residual is (the kernels' FORM template argument): none, an int8 input r, or the projection of a
// second input computed in the kernel (sm90 only, conv1x1_sm90.cuh).
enum Form : int { kPlain = 0, kResidual = 1, kProjResidual = 2 };
constexpr int kForms = 3;

// The rounding rule's constants of one GEMM (epilogue.cuh), per output channel and per launch.
struct Rule {
    float const* a;        // [Npad] (x_scale * w_scale[n]) * inv_out, 0 in the padding
    float const* b;        // [Npad] bias[n] * inv_out, 0 in the padding
    float const* s;        // [Npad] r_scale * inv_out, 0 in the padding (padded channels come out 0)
    float const* a8;       // a, b, s times 2^-8 (exact), for the epilogue's saturating form (sat)
    float const* b8;
    float const* s8;
    float lo;              // 0 with ReLU, else -128: the lower clamp
    int small_acc;         // |acc| < 2^22 is guaranteed (K <= 258): exact int->float without I2F
    int sat;               // ReLU and a, b, s in the range where the saturating form is exact (epilogue.cuh)
};

// The A operand of one 1x1 conv: an int8 kCHW32 tensor read at stride 1 or 2 (see x_row_offset).
struct Operand {
    int8_t const* data;    // [N][Kc][in_hw][32]
    int Kc;                // ceil(Cin / 32): slabs
    int stride;            // 1, or 2: the GEMM row of output (oh, ow) reads input (stride oh, stride ow)
    int in_hw;             // input positions per image (H * W): the slab pitch is in_hw * 32 bytes
    int w_gap;             // input width - output width (0 at stride 1)
};

struct Params {
    Operand x;
    Rule rule;
    int8_t const* r;       // [N][Nc][HW][32], or null: no residual input (then s = 0: the epilogue adds exactly 0)
    int8_t* out;           // [N][Nc][HW][32]
    int8_t const* w;       // packed [Npad][Kpad], rows permuted in 16-channel groups (tile_layout.h), zero padded
                           // (Npad % 256 == 0, Kpad % 128 == 0)
    int8_t const* w_img;   // sm90: w as the kernel's shared-memory weight slices, per N block (tile_layout.h)
    // sm90, fused projection (conv1x1_sm90.cuh, Form::kProjResidual): the residual is not read but computed, the
    // projection of xp by the first proj_kpad bytes of each weight row (w_img rows: [projection | x's weights]),
    // rounded by proj_rule, exactly the int8 tensor the projection alone would write
    Operand xp;
    Rule proj_rule;
    int proj_kpad;         // 0, or the projection's K padded to 128: where x's weights start in a row
    // sm90, a chained next conv (conv1x1_sm90.cuh, NEXT_N > 0): a 1x1 conv + BN (+ReLU) of this layer's output, from its
    // output tile, into next_out ([N][next_nc][HW][32]); its weights as one slice of NEXT_N rows x kNextMaxK
    // (tile_layout.h: pack_weight_slices; zero past K = this layer's channels; n_blocks 1)
    Rule next_rule;
    int8_t* next_out;
    int8_t const* next_w_img;
    int next_nc;           // ceil(next cout / 32): slabs of next_out
    int next_kpad;         // bytes of a row of next_w_img: kNextMaxK (the K the chained kernel runs, zero padded).
                           // (Dropping this field moved the fields below and, through ptxas' spills, cost the NH 2
                           // kernels up to 7 % on res3: docs/residual_conv.md, Version 22.)
    int M;                 // N * HW (< 2^31)
    int HW;                // output positions per image (H_out * W_out)
    FastDivmod ow_div;     // hw / output width
    int Kpad;              // row pitch of the packed weights
    int Nc;                // ceil(Cout / 32): slabs of r and out
    int n_blocks;          // ceil(Nc*32 / BN): blocks along N
    FastDivmod hw_div;     // m / HW
    FastDivmod nb_div;     // tile / n_blocks (sm80 tile order)
    int wgw_regular;       // sm90: the schedule's regular blocks and their tile quota (schedule_sm90.h)
    int wgw_quota;
    FastDivmod wgw_rest;   // by the M tiles per N block left to the extra blocks (WgwSchedule::rest)
    CUtensorMap out_map;   // sm90: out as a 4-d tensor (32 bytes, HW, Nc, N), box (32, 16, BN/32, 1), 32-byte
                           // swizzle (out_map.h); 64-byte aligned
};

#if defined(__CUDACC__)
// Byte offset of GEMM row m's 32-byte run in slab 0 of operand x: output position hw = (oh, ow) of image img reads input
// position (stride oh, stride ow) = stride (oh in_w + ow) = stride (hw + oh (in_w - out_w)): at stride 1 that is hw
// (w_gap = 0), with no branch (a branch here made the sm80 kernel spill at its 128-register cap).
__device__ __forceinline__ int64_t x_row_offset(Params const& p, Operand const& x, int m) {
    int const img = p.hw_div.div(m), hw = m - img * p.HW;
    int const hw_in = x.stride * (hw + p.ow_div.div(hw) * x.w_gap);
    return (static_cast<int64_t>(img) * x.Kc * x.in_hw + hw_in) * 32;
}
// Byte offset of GEMM row m's 32-byte run in slab 0 of the residual and the output ([N][Nc][HW][32]).
__device__ __forceinline__ int64_t out_row_offset(Params const& p, int m) {
    int const img = p.hw_div.div(m), hw = m - img * p.HW;
    return (static_cast<int64_t>(img) * p.Nc * p.HW + hw) * 32;
}
#endif

}  // namespace rconv
}  // namespace trtfuse
