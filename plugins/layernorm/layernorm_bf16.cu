// LayerNorm kernels instantiated for __nv_bfloat16 (one dtype per translation unit: they compile in parallel).
#include "layernorm/layernorm_kernels.cuh"

namespace trtfuse {
namespace layernorm {

int launch_bf16(Args const& a, cudaStream_t stream) { return launch_typed<__nv_bfloat16>(a, stream); }

}  // namespace layernorm
}  // namespace trtfuse
