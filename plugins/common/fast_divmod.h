// Division of a non-negative 31-bit integer by a run-time constant without the division sequence.
//
// nvcc turns `unsigned n / d` with a run-time d into ~12 instructions, two of them quarter-rate
// (I2F.U32.RP, MUFU.RCP, F2I...). When d is fixed for a whole kernel, the host computes a multiplier
// once and the device divides with one IMAD.HI and one SHF (Granlund & Montgomery, "Division by
// invariant integers using multiplication", 1994, with a 31-bit numerator):
//
//   l = ceil(log2 d),  m = ceil(2^(31+l) / d)  (< 2^32 for 2 <= d < 2^31),   n / d = (n * m) >> (31 + l)
//
// exact for every 0 <= n < 2^31: m*d - 2^(31+l) = e with 0 <= e < d <= 2^l, so n*m / 2^(31+l) exceeds
// n/d by n*e / (d*2^(31+l)) < 2^-l <= 1/d, never reaching the next integer. The device takes the high
// word (__umulhi) and shifts by l - 1 more. d == 1 has l = 0 and is special-cased (a uniform select).
#pragma once
#include <cstdint>

namespace trtfuse {

struct FastDivmod {
    int divisor = 1;
    uint32_t mul = 0;     // m (unused for divisor 1)
    uint32_t shift = 0;   // l - 1

    FastDivmod() = default;
    // Host side. divisor in [1, 2^31).
    explicit FastDivmod(int d) : divisor(d) {
        if (d <= 1) return;
        uint32_t l = 0;
        while ((uint64_t(1) << l) < static_cast<uint64_t>(d)) ++l;
        uint64_t num = uint64_t(1) << (31 + l);
        mul = static_cast<uint32_t>((num + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
        shift = l - 1;
    }

#if defined(__CUDACC__)
    __host__ __device__ __forceinline__
#else
    inline
#endif
    int div(int n) const {   // n in [0, 2^31)
#if defined(__CUDA_ARCH__)
        uint32_t hi = __umulhi(static_cast<uint32_t>(n), mul);
#else
        uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> 32);
#endif
        return divisor == 1 ? n : static_cast<int>(hi >> shift);
    }
};

}  // namespace trtfuse
