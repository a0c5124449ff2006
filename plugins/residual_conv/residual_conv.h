// C ABI of the fused int8 1x1 conv + BN + residual Add (+ReLU) (see docs/residual_conv.md).
// Used by tests/benchmarks through ctypes (libtrtfuse_kernels.so) and by the TensorRT plugin.
//
// Return codes: 0 success; a cudaError_t value (> 0) for CUDA errors; negative for argument errors:
#pragma once
#include <stdint.h>

#define TRTFUSE_RCONV_ERR_NULL (-1)        /* a required pointer is NULL */
#define TRTFUSE_RCONV_ERR_SHAPE (-2)       /* a dimension is <= 0 or too large */
#define TRTFUSE_RCONV_ERR_SCALE (-3)       /* a scale is not finite and > 0 */
#define TRTFUSE_RCONV_ERR_WEIGHT (-4)      /* a weight outside [-127, 127] */
#define TRTFUSE_RCONV_ERR_CONFIG (-5)      /* unknown tile configuration */
#define TRTFUSE_RCONV_ERR_ALIGN (-6)       /* x, r or out not 16-byte aligned */
#define TRTFUSE_RCONV_ERR_CACHE (-7)       /* tuning cache unreadable or malformed */
#define TRTFUSE_RCONV_ERR_ARCH (-8)        /* sm90 (wgw_*) config without sm_90a code for this GPU */
#define TRTFUSE_RCONV_ERR_FIT (-9)         /* sm90 config cannot hold this layer's weight slice (K too large) */
#define TRTFUSE_RCONV_ERR_RESIDUAL (-10)   /* r given to a layer without a residual input, or missing for one with */
#define TRTFUSE_RCONV_ERR_STRIDE (-11)     /* a stride other than 1 or 2 */

#ifdef __cplusplus
extern "C" {
#endif

/* Validation only (no GPU): 0 if a layer with these fields is accepted. Any cin/cout >= 1 is accepted:
   kCHW32 pads channels to a multiple of 32; weights are zero padded and padded output channels are 0. */
int trtfuse_residual_conv_check(int cin, int cout, int8_t const* weights, float const* w_scale,
                                float const* bias, float x_scale, float r_scale, float out_scale);

/* Uploads weights [cout][cin] (row-major int8 in [-127,127]), w_scale[cout], bias[cout] and the scales in
   the packed layout the kernels read; relu: 1 = ReLU, 0 = identity. *handle receives an opaque handle. */
int trtfuse_residual_conv_create(int cin, int cout, int8_t const* weights, float const* w_scale,
                                 float const* bias, float x_scale, float r_scale, float out_scale, int relu,
                                 void** handle);
/* The general 1x1 conv: as trtfuse_residual_conv_create, plus
     r_scale = 0: no residual input (out = q(act(x_scale * w_scale[n] * acc + bias[n]) / out_scale)); forward's r
       must then be NULL. A projection (downsample) is relu 0 and r_scale 0; a bottleneck's conv1 is relu 1, r_scale 0;
     stride 1 or 2: output (oh, ow) reads input (stride*oh, stride*ow), no padding (output ceil(h/stride) x
       ceil(w/stride)).
   trtfuse_residual_conv_create(...) is trtfuse_conv1x1_create(..., stride 1) with r_scale > 0. */
int trtfuse_conv1x1_create(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                           float x_scale, float r_scale, float out_scale, int relu, int stride, void** handle);
/* Validation of the general form's fields (no GPU): 0 if trtfuse_conv1x1_create would accept them. */
int trtfuse_conv1x1_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                          float x_scale, float r_scale, float out_scale, int stride);
int trtfuse_residual_conv_destroy(void* handle);

/* out = q(act(...)) for x [n, cin, h, w] and r, out [n, cout, ho, wo] (ho = ceil(h/stride), wo = ceil(w/stride)), all
   int8 kCHW32 device pointers; r NULL for a layer without a residual input. config: index of a tile configuration,
   or -1 to pick (tuning cache, else heuristic). stream: cudaStream_t. */
int trtfuse_residual_conv_forward(void const* handle, void const* x, void const* r, void* out, int n, int h,
                                  int w, int config, void* stream);

int trtfuse_residual_conv_num_configs(void);
/* 1 if config can run on the current device (the sm90 "wgw_*" configs need the library built for sm_90a and a
   compute capability 9.0 GPU; forward() returns TRTFUSE_RCONV_ERR_ARCH otherwise), else 0. */
int trtfuse_residual_conv_config_supported(int config);
/* 1 if config can hold a layer of this shape (the sm90 "wgw_*" configs keep a 256 x Cin weight slice in shared
   memory; forward() returns TRTFUSE_RCONV_ERR_FIT otherwise), else 0. Needs no GPU. */
int trtfuse_residual_conv_config_fits(int config, int cin, int cout);
char const* trtfuse_residual_conv_config_name(int config);
/* The configuration forward(config=-1) would use on the current device for a layer with a residual input and
   stride 1 (hw: positions per image); -1 on error. */
int trtfuse_residual_conv_select_config(int cin, int cout, int n, int hw);
/* (Re)load the tuning cache: path, or NULL for $TRTFUSE_RESIDUAL_CONV_CACHE. Returns the number of entries
   for this GPU (>= 0) or a negative error. Without a call, the first forward(config=-1) loads it. */
int trtfuse_residual_conv_load_cache(char const* path);
char const* trtfuse_residual_conv_error_string(int status);
/* The wgw_* configs' tile schedule (schedule_sm90.h), for tests (needs no GPU): a layer of m_blocks x
   n_blocks tiles on `resident` block slots, balance = 1 for the PINGPONG configs. block = -1: returns the grid.
   Else: returns the number of tiles of that block and writes the first `cap` of them, in order, to m_out/n_out
   (M block, N block). Negative on bad arguments. */
int trtfuse_residual_conv_wgw_schedule(int m_blocks, int n_blocks, int resident, int balance, int block, int cap,
                                       int* m_out, int* n_out);

#ifdef __cplusplus
}
#endif
