// The launches of each family (host/launch_*.cu): a layer, its operands and a configuration index in, one kernel
// launch (or a refusal: a TRTFUSE_RCONV_ERR_* code) out.
#pragma once
#include <cuda_runtime.h>

#include "conv_int8/host/layer.h"

namespace trtfuse {
namespace rconv {

// 1x1 (launch_conv1x1.cu)
int check_launch(void const* x, void const* r, void const* out, int n, int h, int w, int stride, int config);
bool fuses(Layer const& L, int config);
int launch_smem(Layer const& L, Form form, int config, bool chained);
bool chains(Layer const& L, int config);
int launch(Layer const& L, Form form, Operand x, Operand xp, void const* r, void* out, int n, int ho, int wo,
           int config, cudaStream_t stream, void* next_out = nullptr);
int forward_plain(Layer const& L, void const* x, void const* r, void* out, int n, int h, int w, int config,
                  cudaStream_t stream);
// 3x3 (launch_conv3x3.cu)
int launch_conv3x3(Layer const& L, void const* x, void* out, int n, int h, int w, int config, cudaStream_t stream);
// the stem (launch_stem.cu)
bool stem_chains(Layer const& L, int config);
int launch_stem(Layer const& L, void const* x, void* out, int n, int h, int w, int config, cudaStream_t stream,
                void* next_out = nullptr);

}  // namespace rconv
}  // namespace trtfuse
