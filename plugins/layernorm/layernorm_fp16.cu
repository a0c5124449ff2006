// LayerNorm kernels instantiated for __half (one dtype per translation unit: they compile in parallel).
#include "layernorm/layernorm_kernels.cuh"

namespace trtfuse {
namespace layernorm {

int launch_fp16(Args const& a, cudaStream_t stream) { return launch_typed<__half>(a, stream); }

}  // namespace layernorm
}  // namespace trtfuse
