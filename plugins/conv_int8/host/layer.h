// A layer of the int8 conv library on the host: its fields and device buffers (the C ABI's opaque handle), and the
// helpers every launch path shares.
#pragma once
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "conv_int8/core/params.h"

namespace trtfuse {
namespace rconv {

struct Layer {
    int cin, cout, kc, nc, kpad, npad;
    // A stage's first block (trtfuse_proj_tail_create): this layer is its tail, `proj` its projection (a layer of
    // its own: its constants, and the two-launch path where the fused kernel cannot run), w_img_fused the sm90
    // weight slices of rows [projection's kpad | tail's kpad].
    Layer* proj = nullptr;
    int8_t* w_img_fused = nullptr;
    bool residual;     // has a residual input (r_scale > 0)
    int stride;        // 1 or 2
    float lo;          // lower clamp: 0 with ReLU, -128 without
    int8_t* w = nullptr;       // [npad * kpad], rows permuted (tile_layout.h: packed_row_channel)
    int8_t* w_img = nullptr;   // w as the sm90 kernel's weight slices (tile_layout.h: pack_weight_slices)
    int taps = 1;              // 9: a 3x3 conv (trtfuse_conv3x3_create), K = 9 kc slabs, tap-major; 49: the stem
    int8_t* w_img_halo[2] = {};   // a 3x3 conv: w as slices of 64 and 128 rows (the halo kernel's BN)
    float* abs = nullptr;   // [6][npad]: a, b, s of the rounding rule, then the same times 2^-8
    bool sat = false;       // the epilogue may use its saturating form (see sat_exact)
    // A tail's chained next conv (trtfuse_next_attach): a layer of its own (its constants, and its launch where the
    // chained kernel cannot run), w_img_next its weights as one slice of next_n rows (the chained kernel's NEXT_N) x
    // kNextMaxK (K zero padded)
    Layer* next = nullptr;
    int8_t* w_img_next = nullptr;
    int next_n = 0;
};

inline int round_up(int v, int m) { return (v + m - 1) / m * m; }

bool sat_exact(float v);
bool good_scale(float s);
int wgmma_available();
bool device_name(std::string* name);
int sm_count(int dev, int* out);
int resident_blocks(int config, void (*kernel)(Params), int smem, int* out);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` (more than the default 48 KB) on the current device, once
// per (device, kernel): the attribute is per device, and the launches ask at every forward.
template <class Kernel>
int allow_dynamic_smem(Kernel kernel, int bytes) {
    static std::mutex mu;
    static std::set<std::pair<int, void const*>> done;
    int dev = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&dev));
    auto const key = std::make_pair(dev, reinterpret_cast<void const*>(kernel));
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(key)) return 0;
    TRTFUSE_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    done.insert(key);
    return 0;
}

template <class T>
int upload(std::vector<T> const& v, T** dst) {
    cudaError_t e = cudaMalloc(dst, v.size() * sizeof(T));
    if (e == cudaSuccess) e = cudaMemcpy(*dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return static_cast<int>(e);
}

std::vector<int8_t> pack_rows(int8_t const* weights, int cin, int cout, int npad, int kpad);
int free_layer(Layer* L);
std::vector<float> rule_constants(int cout, int npad, float const* w_scale, float const* bias, float x_scale,
                                  float r_scale, float out_scale, int relu, bool* sat);
int build_layer(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias, float x_scale,
                float r_scale, float out_scale, int relu, int stride, Layer* L, std::vector<int8_t>* rows,
                int taps = 1);
Operand operand(void const* x, int kc, int stride, int h, int w, int wo);
Rule rule_of(Layer const& L);

}  // namespace rconv
}  // namespace trtfuse
