// Launches of the stem (kStemConfigs, kernels/stem_sm90.cuh), with or without its chained conv1.
#include "conv_int8/host/launch.h"

#include "common/cuda_check.h"
#include "conv_int8/c_api.h"
#include "conv_int8/core/out_map.h"
#include "conv_int8/host/config_table.h"

#include <algorithm>

namespace trtfuse {
namespace rconv {

// p.in_map: x [n][cin][h][w] bytes as the tensor (w, h, cin, n), box (256, ir, cin, 1); 0 or a cudaError_t.
int encode_stem_map(StemParams& p, void const* x, int n, int h, int w, int cin, int ir) {
    auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    cuuint64_t const dims[4] = {static_cast<cuuint64_t>(w), static_cast<cuuint64_t>(h), static_cast<cuuint64_t>(cin),
                                static_cast<cuuint64_t>(n)};
    cuuint64_t const strides[3] = {static_cast<cuuint64_t>(w), static_cast<cuuint64_t>(h) * w,
                                   static_cast<cuuint64_t>(h) * w * cin};
    cuuint32_t const box[4] = {kStemBoxRow, static_cast<cuuint32_t>(ir), static_cast<cuuint32_t>(cin), 1};
    cuuint32_t const ones[4] = {1, 1, 1, 1};
    CUresult const st = encode(&p.in_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(x), dims, strides, box,
                               ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return st == CUDA_SUCCESS ? 0 : cudaErrorInvalidValue;
}

// Whether stem layer L runs its chained next conv in the same kernel on `config` (>= 0).
bool stem_chains(Layer const& L, int config) {
    return L.next && L.next_n == kStemN && kStemConfigs[config].next_kernel && wgmma_available();
}

// One launch of stem layer L: x [n][cin][h][w] (linear) -> out [n][nc][hp][wp][32]; config -1 picks. With next_out
// (stem_chains holds), L's chained next conv's output [n][next nc][hp][wp][32] too.
int launch_stem(Layer const& L, void const* x, void* out, int n, int h, int w, int config, cudaStream_t stream,
                void* next_out) {
    if (!wgmma_available()) return TRTFUSE_RCONV_ERR_ARCH;
    if (w % 16) return TRTFUSE_RCONV_ERR_ROW;   // the TMA map's row pitch
    StemInfo const& C = kStemConfigs[config < 0 ? select_stem(L, n, h, w) : config];
    bool const next = next_out != nullptr;
    StemGeometry g;
    if (!stem_geometry(C, L.cin, h, w, next, &g)) return TRTFUSE_RCONV_ERR_FIT;
    StemParams p{};
    p.rule = rule_of(L);
    p.w_img = L.w_img;
    p.out = static_cast<int8_t*>(out);
    p.Cin = L.cin;
    p.Nc = L.nc;
    p.Hc = g.hc;
    p.Wc = g.wc;
    p.Hp = g.hp;
    p.Wp = g.wp;
    p.bands = (g.hp + C.pool_rows - 1) / C.pool_rows;
    p.copy_bytes = g.copy;
    p.box_bytes = g.box;
    if (next) {
        p.next_rule = rule_of(*L.next);
        p.next_out = static_cast<int8_t*>(next_out);
        p.next_w_img = L.w_img_next;
        p.next_nc = L.next->nc;
    }
    int64_t const blocks = static_cast<int64_t>(n) * p.bands;
    if (blocks >= (int64_t(1) << 31)) return TRTFUSE_RCONV_ERR_SHAPE;
    if (int st = encode_stem_map(p, x, n, h, w, L.cin, C.ir)) return st;
    auto const kernel = next ? C.next_kernel : C.kernel;
    if (int st = allow_dynamic_smem(kernel, kMaxSmem)) return st;
    kernel<<<static_cast<unsigned>(blocks), kStemThreads, g.smem, stream>>>(p);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
}

}  // namespace rconv
}  // namespace trtfuse
