/* The global average pool of an int8 kCHW32 tensor into two int8 outputs, hi and lo, that together carry the mean to
   1/256 of the input's LSB: ResNet-50's head (DequantizeLinear + GlobalAveragePool, which TensorRT 8.5 runs as two
   layers, 0.27 + 0.16 ms per batch of 2048 on the H100) in one pass over the int8 bytes. No CUDA or TensorRT needed
   to include this header.

   Why int8 out: in an explicitly quantized (Q/DQ) network TensorRT 8.5 takes a plugin with int8 input as a quantized
   layer, Q -> plugin -> DQ, and wants a DequantizeLinear after its output (NVIDIA/TensorRT issue #3055); a plugin
   writing fp32 straight into ResNet-50's Flatten -> Gemm made its Q/DQ optimizer refuse the network ("Node /fc/Gemm
   cannot be quantized by ...QuantizeLinear. You might want to add a DQ node before /fc/Gemm").

   Why two outputs: one int8 output on the input's scale s (version 2) rounds the pooled mean to s's grid, up to s / 2
   off; on random-weight ResNet-50 (H100, TensorRT 8.5.3.1) the centered top-1 agreement with the stock engine fell
   from 0.836 to 0.648 and the largest logit difference rose from 9.0 to 17.6 (of 888.5). So the mean is carried as
   m = the nearest integer to 256 S / hw (ties to even), split into hi (on scale s) and lo (on scale s / 256):

       t (int8, s) -> TrtfuseAvgPool -> hi -> DequantizeLinear(s)       -> a
                                     -> lo -> DequantizeLinear(s / 256) -> b ;  Add(a, b) -> Flatten -> Gemm

   a + b = s hi + (s / 256) lo = s m / 256, within s / 512 of the exact mean s S / hw. */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRTFUSE_AVGPOOL_ERR_NULL (-1)   /* a null pointer */
#define TRTFUSE_AVGPOOL_ERR_SHAPE (-2)  /* n, c or hw not positive, or too large */
/* (-3 was TRTFUSE_AVGPOOL_ERR_SCALE, version 1's fp32 output's x_scale: retired, not reused) */
#define TRTFUSE_AVGPOOL_ERR_ALIGN (-6)  /* x not 16-byte aligned */

/* For each image i and channel ch, with S the sum of x[i][ch] over its hw positions (exact, int32: |S| <= 128 hw):
     m = the nearest integer to 256 S / hw, ties to even, computed exactly in 64-bit integers (256 S reaches 2^31):
         q = floor(256 S / hw), r = 256 S - q hw in [0, hw) (floor division, so negative sums round the same way),
         then m = q + 1 where 2 r > hw, or 2 r == hw and q is odd. -128 <= S / hw <= 127, so m is in
         [-32768, 32512] (clamped all the same). Ties need hw divisible by 512 (none at ResNet-50's hw = 49).
     hi[i][ch] = floor((m + 128) / 256), lo[i][ch] = m - 256 hi: both in [-128, 127], m = 256 hi + lo.
   hi and lo int8 [n][c], row-major (channel fastest), any alignment. x int8 kCHW32 [n][ceil(c / 32)][hw][32], 16-byte
   aligned (channels past c are not read). Dequantized, s hi + (s / 256) lo = s m / 256 is within s / 512 of the mean
   s S / hw.
   0, a TRTFUSE_AVGPOOL_ERR_*, or a cudaError_t (> 0). */
int trtfuse_avgpool_int8_forward(void const* x, int8_t* hi, int8_t* lo, int n, int c, int hw, void* stream);
/* The kernel's rounding and split of one sum on the host (the same __host__ __device__ function the kernel calls):
   returns m for sum and hw as above and writes hi and lo where the pointers are not null; hw in [1, 65536] and
   |sum| <= 128 hw (m is clamped to [-32768, 32512] for other sums; hw out of range: 0, hi = lo = 0). For tests
   without a GPU. */
int trtfuse_avgpool_round_mean256(int sum, int hw, int8_t* hi, int8_t* lo);
char const* trtfuse_avgpool_error_string(int status);

#ifdef __cplusplus
}
#endif
