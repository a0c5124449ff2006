// Launches of the 3x3 conv on halo tiles (kHaloConfigs, kernels/conv3x3_sm90.cuh).
#include "conv_int8/host/launch.h"

#include "common/cuda_check.h"
#include "conv_int8/c_api.h"
#include "conv_int8/core/out_map.h"
#include "conv_int8/host/config_table.h"

#include <algorithm>

namespace trtfuse {
namespace rconv {

// The 3x3 conv's input (h x w) and output tensor maps (Conv3Params, with p.H, p.W, p.Wp, p.R, p.stride set); 0 or a
// cudaError_t.
int encode_halo_maps(Conv3Params& p, void const* x, void* out, int n, int h, int w, int nc, int bn, bool padded_rows) {
    auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    cuuint32_t const ones[5] = {1, 1, 1, 1, 1};
    cuuint64_t const in_dims[4] = {32, static_cast<cuuint64_t>(w), static_cast<cuuint64_t>(h),
                                   static_cast<cuuint64_t>(n) * p.Kc};
    cuuint64_t const in_strides[3] = {32, static_cast<cuuint64_t>(w) * 32, static_cast<cuuint64_t>(h) * w * 32};
    // stride 2: a phase box takes every other column and row, Wp x (R + 1) of them
    cuuint32_t const s = static_cast<cuuint32_t>(p.stride);
    cuuint32_t const in_box[4] = {32, s * p.Wp, s == 1 ? p.R + 2u : 2u * (p.R + 1), 1};
    cuuint32_t const in_elem_strides[4] = {1, s, s, 1};
    CUresult st = encode(&p.in_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(x), in_dims, in_strides, in_box,
                         in_elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (st != CUDA_SUCCESS) return cudaErrorInvalidValue;
    cuuint64_t const H = p.H, W = p.W, HW32 = H * W * 32;
    cuuint64_t const out_dims[5] = {32, W, H, static_cast<cuuint64_t>(nc), static_cast<cuuint64_t>(n)};
    cuuint64_t const out_strides[4] = {32, W * 32, HW32, HW32 * nc};
    // padded_rows (WREG's staging tile): a box row of Wp, whose columns past W the store clips
    cuuint32_t const out_box[5] = {32, static_cast<cuuint32_t>(padded_rows ? p.Wp : p.W), static_cast<cuuint32_t>(p.R),
                                   static_cast<cuuint32_t>(bn / 32), 1};
    st = encode(&p.out_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 5, out, out_dims, out_strides, out_box, ones,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return st == CUDA_SUCCESS ? 0 : cudaErrorInvalidValue;
}

// One launch of 3x3 layer L on halo config `config` (-1 picks): x [n][kc][h][w][32] -> out [n][nc][ho][wo][32].
int launch_conv3x3(Layer const& L, void const* x, void* out, int n, int h, int w, int config, cudaStream_t stream) {
    if (!wgmma_available()) return TRTFUSE_RCONV_ERR_ARCH;
    if (config < 0) config = select_halo(L, n, h, w);
    if (config < 0) return TRTFUSE_RCONV_ERR_FIT;
    HaloInfo const& C = kHaloConfigs[config];
    HaloGeometry g;
    if (!halo_geometry(C, L, h, w, &g)) return TRTFUSE_RCONV_ERR_FIT;
    Conv3Params p{};
    p.rule = rule_of(L);
    p.w_img = L.w_img_halo[C.bn == 64 ? 0 : 1];
    p.Kpad = L.kpad;
    p.Kc = L.kc;
    p.stride = L.stride;
    p.H = g.ho;
    p.W = g.wo;
    p.Wp = g.wp;
    p.R = g.R;
    p.tiles_per_img = (g.ho + g.R - 1) / g.R;
    int64_t const m_tiles = static_cast<int64_t>(n) * p.tiles_per_img;
    if (m_tiles >= (int64_t(1) << 31)) return TRTFUSE_RCONV_ERR_SHAPE;
    p.m_tiles = static_cast<int>(m_tiles);
    p.n_blocks = (L.nc * 32 + C.bn - 1) / C.bn;
    p.slot_bytes = g.slot_bytes;
    p.phase_bytes = g.phase_bytes;
    p.stage_bytes = g.stage_bytes;
    if (int st = encode_halo_maps(p, x, out, n, h, w, L.nc, C.bn, C.wreg)) return st;
    int dev = 0, sms = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&dev));
    if (int st = sm_count(dev, &sms)) return st;
    // one block per SM (the weight slice fills most of shared memory); per N block as many as there are M tiles
    int64_t const per_n = std::max<int64_t>(1, std::min<int64_t>(sms / p.n_blocks, m_tiles));
    if (int st = allow_dynamic_smem(C.kernel, kMaxSmem)) return st;
    C.kernel<<<static_cast<unsigned>(per_n * p.n_blocks), C.threads, g.smem, stream>>>(p);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
}

}  // namespace rconv
}  // namespace trtfuse
