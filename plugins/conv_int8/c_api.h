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
#define TRTFUSE_RCONV_ERR_FUSED (-12)      /* a projection + tail layer given to the plain forward, or the reverse */
#define TRTFUSE_RCONV_ERR_WORKSPACE (-13)  /* the two-launch path of a projection + tail layer needs a workspace */
#define TRTFUSE_RCONV_ERR_ROW (-14)        /* the stem's input width is not a multiple of 16 */
#define TRTFUSE_RCONV_ERR_NEXT (-15)       /* next conv missing, already attached, or not fitting the layer */

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
/* A stage's first block in one kernel: its tail (the fields of trtfuse_residual_conv_create, stride 1, r_scale > 0)
   whose residual is its projection (proj_cin input channels, proj_weights [cout][proj_cin], no ReLU, no residual,
   proj_stride 1 or 2, output quantized by proj_out_scale). Output: exactly the tail's output when the projection's
   int8 output is its residual (the two layers' composition), without that tensor going to memory on the sm90
   kernel. */
int trtfuse_proj_tail_create(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                             float x_scale, float r_scale, float out_scale, int relu, int proj_cin,
                             int8_t const* proj_weights, float const* proj_w_scale, float const* proj_bias,
                             float proj_x_scale, float proj_out_scale, int proj_stride, void** handle);
/* Validation of its fields (no GPU): 0 if trtfuse_proj_tail_create would accept them. */
int trtfuse_proj_tail_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                            float x_scale, float r_scale, float out_scale, int proj_cin, int8_t const* proj_weights,
                            float const* proj_w_scale, float const* proj_bias, float proj_x_scale,
                            float proj_out_scale, int proj_stride);
/* out [n, cout, ho, wo] of the tail input x [n, cin, ho, wo] and the block input xp [n, proj_cin, h, w]
   (ho = ceil(h / proj_stride), wo likewise). The fused kernel needs an sm90 configuration that holds both layers'
   weight rows (config -1 picks); otherwise the projection goes to `workspace` (16-byte aligned, of
   trtfuse_proj_tail_workspace_size bytes) and the tail reads it. */
int trtfuse_proj_tail_forward(void const* handle, void const* x, void const* xp, void* out, int n, int h, int w,
                              void* workspace, int config, void* stream);
/* 1 if forward on `config` (>= 0) runs the fused kernel on the current device (an sm90 configuration that holds both
   layers' weight rows), 0 if it takes the two launches. */
int trtfuse_proj_tail_fuses(void const* handle, int config);
/* The configuration forward(config -1) picks on the current device for a block input of n x h x w (tuning cache,
   else the heuristic), or -2: the tuner's choice "separate" (the two layers as plain launches, each on its own
   choice); TRTFUSE_RCONV_ERR_NULL (-1) on bad arguments. */
int trtfuse_proj_tail_select_config(void const* handle, int n, int h, int w);
/* The workspace forward(config -1) needs on the current device for a block input of n x h x w: 0 where the fused
   kernel runs, else the projection's output bytes; negative on bad arguments. */
int64_t trtfuse_proj_tail_workspace_size(void const* handle, int n, int h, int w);
/* A 3x3 conv (padding 1, stride 1 or 2) + BN (+ReLU), no residual: weights [cout][cin][3][3] (row-major int8 in
   [-127, 127]), the other fields as trtfuse_conv1x1_create's. Runs on the sm_90a halo kernel only (forward returns
   TRTFUSE_RCONV_ERR_ARCH elsewhere), where a configuration holds its weight slice (9 Cin x 64 or 128 bytes: ResNet-50's
   layer1-layer3 3x3 convs), its halo slots and a row of its image (W <= 254 at stride 1, 252 at stride 2; else
   TRTFUSE_RCONV_ERR_FIT). */
int trtfuse_conv3x3_create(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                           float x_scale, float out_scale, int relu, int stride, void** handle);
/* Validation of its fields (no GPU): 0 if trtfuse_conv3x3_create would accept them. */
int trtfuse_conv3x3_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                          float x_scale, float out_scale, int stride);
/* out [n, cout, ceil(h / stride), ceil(w / stride)] of x [n, cin, h, w], both int8 kCHW32 device pointers (16-byte
   aligned); config: an index into the halo configurations (trtfuse_conv3x3_config_name), -1 picks. */
int trtfuse_conv3x3_forward(void const* handle, void const* x, void* out, int n, int h, int w, int config,
                            void* stream);
/* The halo configuration forward(config -1) picks for an n x h x w input on the current device (the tuning cache's
   "conv3x3" entry, else the heuristic), -1 if none holds the layer. */
int trtfuse_conv3x3_select_config(void const* handle, int n, int h, int w);
int trtfuse_conv3x3_num_configs(void);
char const* trtfuse_conv3x3_config_name(int config);
/* The ResNet stem: 7x7 conv (stride 2, padding 3) + BN (+ReLU) + 3x3 max pool (stride 2, padding 1), weights
   [cout][cin][7][7] (row-major int8 in [-127, 127]), cin <= 4, cout <= 64 (else TRTFUSE_RCONV_ERR_SHAPE), the other
   fields as trtfuse_conv3x3_create's. The conv is rounded by the library's rule, the pool takes the max of the
   rounded bytes. Runs on the sm_90a kernel only (forward returns TRTFUSE_RCONV_ERR_ARCH elsewhere). */
int trtfuse_stem_create(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                        float x_scale, float out_scale, int relu, void** handle);
/* Validation of its fields (no GPU): 0 if trtfuse_stem_create would accept them. */
int trtfuse_stem_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                       float x_scale, float out_scale);
/* out [n, cout, hp, wp] (kCHW32; hc = ceil(h / 2), hp = ceil(hc / 2), likewise w) of x [n, cin, h, w] (int8, LINEAR
   NCHW: the network's input), 16-byte aligned device pointers; w % 16 == 0 (TRTFUSE_RCONV_ERR_ROW) and w <= 224
   (TRTFUSE_RCONV_ERR_FIT). config: an index of trtfuse_stem_config_name (pooled rows per block), -1 picks. */
int trtfuse_stem_forward(void const* handle, void const* x, void* out, int n, int h, int w, int config, void* stream);
/* The stem configuration forward(config -1) picks for an n x h x w input on the current device: the tuning cache's
   "stem" entry where it holds the image, else the first (stem_p8). */
int trtfuse_stem_select_config(void const* handle, int n, int h, int w);
int trtfuse_stem_num_configs(void);
char const* trtfuse_stem_config_name(int config);
/* A tail's next 1x1 conv (the next bottleneck's conv1: stride 1, no residual input), chained onto a layer made by
   trtfuse_residual_conv_create or trtfuse_proj_tail_create, so that one kernel also writes the next conv's output
   from the tail's output tile, which then is not read back from memory for it. Fields as trtfuse_conv1x1_create's:
   cin is the layer's cout, weights [cout][cin]; x_scale is the scale the next conv reads the layer's int8 output
   with (the layer's out_scale in a Q/DQ graph). Validation only (no GPU): */
int trtfuse_next_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                       float x_scale, float out_scale);
/* Attaches it to `handle` (TRTFUSE_RCONV_ERR_NEXT: the layer is not a stride-1 tail, projection + tail or stem, or
   already has one); its cin is the layer's cout. A stem (trtfuse_stem_create) chains it on stem_p8, stem_p4 and
   stem_p2 where its cout is <= 64 (the stem and ResNet-50's layer1.0 conv1 in one kernel). */
int trtfuse_next_attach(void* handle, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                        float x_scale, float out_scale, int relu);
/* out (the layer's output, as its own forward writes it) and next_out [n, next cout, ho, wo] (the next conv of out),
   int8 kCHW32. second: r for a tail, xp for a projection + tail layer; workspace as trtfuse_proj_tail_forward's (a
   projection + tail layer only; trtfuse_proj_tail_workspace_size). One kernel where an sm90 configuration chains the
   next conv (trtfuse_next_fuses: the layer's cout <= 256, the next's <= 128), else the layer's own forward and then
   the next conv's launch. config: as the layer's forward (-1 picks). A stem: x, h and w as trtfuse_stem_forward's,
   second and workspace unused (may be NULL), config a stem configuration (trtfuse_stem_config_name). */
int trtfuse_next_forward(void const* handle, void const* x, void const* second, void* out, void* next_out, int n, int h,
                         int w, void* workspace, int config, void* stream);
/* 1 if next_forward on `config` (>= 0) runs one kernel on the current device, 0 if it takes two launches; config -1:
   whether the configuration next_forward(-1) picks for an n x h x w input (as next_forward's) does. Negative on bad
   arguments. */
int trtfuse_next_fuses(void const* handle, int config, int n, int h, int w);
/* Frees any layer (every form). */
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
/* The loaded tuning cache's configuration name for a GPU named `gpu` (as the driver names it), a family ("" the 1x1
   conv, "conv3x3", "stem") and a layer (hw: output positions per image) at batch n: the entry of the nearest batch
   within a factor of 16 of n, copied into name[cap]. Returns its length, 0 if there is none, negative on bad
   arguments. Needs no GPU. */
int trtfuse_residual_conv_cache_lookup(char const* gpu, char const* family, int cin, int cout, int hw, int n,
                                       int residual, int stride, int proj_cin, char* name, int cap);
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
