/* The global average pool of an int8 kCHW32 tensor into fp32: ResNet-50's head (DequantizeLinear + GlobalAveragePool,
   which TensorRT 8.5 runs as two layers, 0.27 + 0.16 ms per batch of 2048 on the H100) in one pass over the int8
   bytes. No CUDA or TensorRT needed to include this header. */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRTFUSE_AVGPOOL_ERR_NULL (-1)   /* a null pointer */
#define TRTFUSE_AVGPOOL_ERR_SHAPE (-2)  /* n, c or hw not positive, or too large */
#define TRTFUSE_AVGPOOL_ERR_SCALE (-3)  /* x_scale not finite and > 0 */
#define TRTFUSE_AVGPOOL_ERR_ALIGN (-6)  /* x not 16-byte or out not 4-byte aligned */

/* out[i][ch] = x_scale * (the sum of x[i][ch] over its hw positions) / hw, fp32 [n][c]; x int8 kCHW32
   [n][ceil(c / 32)][hw][32] (channels past c are not read). The sum is exact (int32); the two fp32 roundings after
   it (times x_scale, then / hw) put out within 1 ulp of the exact mean (DequantizeLinear then GlobalAveragePool in
   fp32 rounds each product and the running sum instead). 0, a TRTFUSE_AVGPOOL_ERR_*, or a cudaError_t (> 0). */
int trtfuse_avgpool_int8_forward(void const* x, float* out, int n, int c, int hw, float x_scale, void* stream);
char const* trtfuse_avgpool_error_string(int status);

#ifdef __cplusplus
}
#endif
