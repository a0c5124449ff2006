// LayerNorm and skip (residual) LayerNorm over the last dimension: the launch interface shared by the
// C ABI (layernorm_api.cu, for ctypes) and the TensorRT plugins (layernorm_plugin.cpp).
//
//   s = x (+ residual (+ bias))                 per row of `cols` elements, fp32 accumulation
//   y = (s - mean(s)) * rsqrt(var(s) + eps) * gamma + beta
//
// x, residual, y and sum share one dtype (fp32, fp16 or bf16); gamma, beta, bias, mean and inv_std are
// float32. gamma/beta may be null (1 and 0); mean/inv_std/sum are written only when given.
// This header needs no CUDA compiler and no TensorRT.
#pragma once
#include <cstdint>

namespace trtfuse {
namespace layernorm {

enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Which kernel runs. kAuto picks from cols, dtype and alignment; the others force one path (tests use
// them to cover every path at every width; benchmarks to compare) and fail with kAlgoNotApplicable
// where that path cannot hold the row.
enum Algo : int {
    kAuto = 0,
    kWarp = 1,            // a warp or sub-warp group per row, row in registers (narrow rows)
    kBlockRegisters = 2,  // a block per row, row in registers (up to 32 values a thread)
    kBlockShared = 3,     // a block per row, row cached in shared memory
    kBlockUncached = 4,   // a block per row, row read twice from memory (Welford pass, then output)
    kNumAlgos = 5,
};

// Return codes: 0 success, positive = cudaError_t, negative = argument errors below.
enum Status : int {
    kOk = 0,
    kBadDtype = -1,
    kBadShape = -2,
    kNullPointer = -3,
    kBadCombination = -4,
    kBadEpsilon = -5,
    kBadAlgo = -6,
    kAlgoNotApplicable = -7,
    kMisaligned = -8,
};

struct Args {
    int dtype = kFloat32;
    int64_t rows = 0;
    int64_t cols = 0;
    void const* x = nullptr;
    void const* residual = nullptr;  // null: plain LayerNorm
    float const* bias = nullptr;     // [cols], only with residual
    float const* gamma = nullptr;    // [cols] or null
    float const* beta = nullptr;     // [cols] or null
    float epsilon = 1e-5f;
    void* y = nullptr;
    void* sum = nullptr;             // x + residual (+ bias) in x's dtype, only with residual
    float* mean = nullptr;           // [rows] or null
    float* inv_std = nullptr;        // [rows] or null
    int algo = kAuto;
    int tune = 0;                    // block-register path: target threads per row (0 = default)
};

// Host-only argument check (touches no device): kOk or a negative Status.
int validate(Args const& args);

// validate, then launch on `stream` (a cudaStream_t). Returns kOk, a negative Status or a cudaError_t.
int forward(Args const& args, void* stream);

char const* status_string(int status);

}  // namespace layernorm
}  // namespace trtfuse

extern "C" {
// C ABI (ctypes). Pointers are device pointers; stream is a cudaStream_t (null: legacy default stream).
int trtfuse_layernorm_forward(int dtype, int64_t rows, int64_t cols, void const* x, void const* residual,
                              void const* bias, void const* gamma, void const* beta, float epsilon, void* y,
                              void* sum, void* mean, void* inv_std, int algo, int tune, void* stream);
char const* trtfuse_layernorm_error_string(int status);
}
