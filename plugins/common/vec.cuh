// Vector memory access shared by memory-bound kernels: N contiguous elements moved in the widest
// accesses (up to 16 bytes) their alignment allows, and float conversions for fp32/fp16/bf16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace trtfuse {

// N elements of T as one aligned unit, so a load/store of it is a single LDG/STG of sizeof(T)*N bytes.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

// Elements per access when moving N contiguous T: all N if they fit in 16 bytes, else 16-byte pieces.
template <typename T, int N>
struct VecWidth {
    static constexpr int value = (N * sizeof(T) <= 16) ? N : static_cast<int>(16 / sizeof(T));
};

// Alignment (bytes) a pointer needs for copy_n<T, N> at every multiple of N elements from it.
template <typename T, int N>
constexpr int vec_alignment() {
    return VecWidth<T, N>::value * static_cast<int>(sizeof(T));
}

// dst[0..N) = src[0..N); src and dst aligned to vec_alignment<T, N>(). Either side may be a
// register array: the casts are resolved at compile time since every index is a constant.
template <typename T, int N>
__device__ __forceinline__ void copy_n(T* dst, T const* src) {
    constexpr int kV = VecWidth<T, N>::value;
    static_assert(N % kV == 0, "N must be a multiple of the access width");
#pragma unroll
    for (int i = 0; i < N; i += kV)
        *reinterpret_cast<Vec<T, kV>*>(dst + i) = *reinterpret_cast<Vec<T, kV> const*>(src + i);
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

inline bool is_aligned(void const* p, int bytes) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace trtfuse
