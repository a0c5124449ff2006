// Error checking shared by every kernel and plugin in plugins/.
#pragma once
#include <cuda_runtime.h>
#include <cstdio>

// Return the CUDA error (as an int status) from the enclosing function instead of aborting:
// plugins must report failure to TensorRT through enqueue's return value, never exit.
#define TRTFUSE_CUDA_RETURN(call)                                                              \
    do {                                                                                       \
        cudaError_t trtfuse_err_ = (call);                                                     \
        if (trtfuse_err_ != cudaSuccess) {                                                     \
            std::fprintf(stderr, "trtfuse: %s failed at %s:%d: %s\n", #call, __FILE__,         \
                         __LINE__, cudaGetErrorString(trtfuse_err_));                          \
            return static_cast<int>(trtfuse_err_);                                             \
        }                                                                                      \
    } while (0)

// After a kernel launch: configuration errors surface through cudaGetLastError.
#define TRTFUSE_LAUNCH_CHECK() TRTFUSE_CUDA_RETURN(cudaGetLastError())
