// Host side of the sm90 kernel's TMA output stores: Params::out_map, the output as a 4-d tensor map.
// Shared by the library (host/launch_conv1x1.cu) and the measuring program benchmarks/experiments/residual_conv_wgw_phases.cu.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include "conv_int8/core/params.h"

namespace trtfuse {
namespace rconv {

// cuTensorMapEncodeTiled, from the driver through the runtime (no link-time dependency on libcuda); null if the
// driver does not have it
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 const fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

// p.out_map for a launch with p.out, p.HW, p.Nc set: out [n][Nc][HW][32] as a uint8 tensor (32, HW, Nc, n), box
// (32 bytes, 16 rows, bn/32 slabs, 1 image): a consumer warp's block of the output tile in shared memory ([slab][16
// rows][32 bytes], the 32-byte swizzle of swz_offset).
// 0, or a cudaError_t.
inline int encode_out_map(Params& p, int n, int bn) {
    auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    cuuint64_t const dims[4] = {32, static_cast<cuuint64_t>(p.HW), static_cast<cuuint64_t>(p.Nc),
                                static_cast<cuuint64_t>(n)};
    cuuint64_t const strides[3] = {32, static_cast<cuuint64_t>(p.HW) * 32, static_cast<cuuint64_t>(p.HW) * 32 * p.Nc};
    cuuint32_t const box[4] = {32, 16, static_cast<cuuint32_t>(bn / 32), 1};
    cuuint32_t const elem_strides[4] = {1, 1, 1, 1};
    CUresult const st = encode(&p.out_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, p.out, dims, strides, box, elem_strides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B,
                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return st == CUDA_SUCCESS ? 0 : cudaErrorInvalidValue;
}

}  // namespace rconv
}  // namespace trtfuse
