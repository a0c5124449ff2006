// A kernel that keeps a stream busy for a given time, for timing short kernels: queued first, it holds back the
// launches after it until the host has issued all of them, so that CUDA events around each time the GPU's work and
// not the host's launch (at batch 1 a launch costs the host more than the kernel costs the GPU).
#include <cstdint>
#include <cuda_runtime.h>

#include "common/cuda_check.h"

namespace {
__global__ void gpu_spin_kernel(long long ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (static_cast<long long>(t - t0) < ns);
}
}  // namespace

// 0, or the CUDA error of the launch
extern "C" int trtfuse_gpu_spin(long long ns, void* stream) {
    gpu_spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
}
