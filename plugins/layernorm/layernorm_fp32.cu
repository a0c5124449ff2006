// LayerNorm kernels instantiated for float (one dtype per translation unit: they compile in parallel).
#include "layernorm/layernorm_kernels.cuh"

namespace trtfuse {
namespace layernorm {

int launch_fp32(Args const& a, cudaStream_t stream) { return launch_typed<float>(a, stream); }

}  // namespace layernorm
}  // namespace trtfuse
