// LayerNorm: argument validation and the C ABI. validate() touches no device, so argument errors come
// back before any CUDA call (CI checks them on machines without a GPU).
#include <cmath>

#include "layernorm/layernorm.h"
#include "layernorm/layernorm_kernels.cuh"

namespace trtfuse {
namespace layernorm {

namespace {
int dtype_size(int dtype) { return dtype == kFloat32 ? 4 : 2; }
}  // namespace

int validate(Args const& a) {
    if (a.dtype != kFloat32 && a.dtype != kFloat16 && a.dtype != kBFloat16) return kBadDtype;
    // cols indexes columns as int inside the kernels, with headroom for the last pack's stride.
    if (a.rows < 0 || a.cols < 1 || a.cols > (int64_t{1} << 30)) return kBadShape;
    if (!a.residual && (a.bias || a.sum)) return kBadCombination;
    if (!(a.epsilon >= 0.f) || std::isinf(a.epsilon)) return kBadEpsilon;
    if (a.algo < kAuto || a.algo >= kNumAlgos || a.tune < 0 || a.tune > 1024 || a.tune % 32 != 0) return kBadAlgo;
    if (a.rows == 0) return kOk;  // nothing is read or written
    if (!a.x || !a.y) return kNullPointer;
    int const es = dtype_size(a.dtype);
    if (!is_aligned(a.x, es) || !is_aligned(a.residual, es) || !is_aligned(a.y, es) || !is_aligned(a.sum, es) ||
        !is_aligned(a.gamma, 4) || !is_aligned(a.beta, 4) || !is_aligned(a.bias, 4) || !is_aligned(a.mean, 4) ||
        !is_aligned(a.inv_std, 4))
        return kMisaligned;
    return kOk;
}

int forward(Args const& a, void* stream) {
    int const st = validate(a);
    if (st != kOk || a.rows == 0) return st;
    auto const s = static_cast<cudaStream_t>(stream);
    switch (a.dtype) {
        case kFloat32: return launch_fp32(a, s);
        case kFloat16: return launch_fp16(a, s);
        default: return launch_bf16(a, s);
    }
}

char const* status_string(int status) {
    switch (status) {
        case kOk: return "success";
        case kBadDtype: return "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)";
        case kBadShape: return "rows must be >= 0 and cols in [1, 2^30]";
        case kNullPointer: return "x and y must not be null when rows > 0";
        case kBadCombination: return "bias and sum need a residual input";
        case kBadEpsilon: return "epsilon must be finite and >= 0";
        case kBadAlgo: return "algo must be 0..4 and tune a multiple of 32 in [0, 1024]";
        case kAlgoNotApplicable: return "the requested kernel path cannot hold a row of this width";
        case kMisaligned: return "a pointer is not aligned to its element size";
        default: return status > 0 ? cudaGetErrorString(static_cast<cudaError_t>(status)) : "unknown status";
    }
}

}  // namespace layernorm
}  // namespace trtfuse

extern "C" int trtfuse_layernorm_forward(int dtype, int64_t rows, int64_t cols, void const* x, void const* residual,
                                         void const* bias, void const* gamma, void const* beta, float epsilon,
                                         void* y, void* sum, void* mean, void* inv_std, int algo, int tune,
                                         void* stream) {
    using namespace trtfuse::layernorm;
    Args a;
    a.dtype = dtype;
    a.rows = rows;
    a.cols = cols;
    a.x = x;
    a.residual = residual;
    a.bias = static_cast<float const*>(bias);
    a.gamma = static_cast<float const*>(gamma);
    a.beta = static_cast<float const*>(beta);
    a.epsilon = epsilon;
    a.y = y;
    a.sum = sum;
    a.mean = static_cast<float*>(mean);
    a.inv_std = static_cast<float*>(inv_std);
    a.algo = algo;
    a.tune = tune;
    return forward(a, stream);
}

extern "C" char const* trtfuse_layernorm_error_string(int status) {
    return trtfuse::layernorm::status_string(status);
}
