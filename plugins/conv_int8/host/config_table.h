// The configuration tables of every kernel family and the selection of a launch's configuration (defined in
// config_table.cu, the only translation unit that instantiates the kernels).
#pragma once
#include <string>

#include "conv_int8/core/params.h"
#include "conv_int8/host/layer.h"
#include "conv_int8/kernels/conv1x1_sm90.cuh"   // kNextMaxK, wgw_smem_bytes
#include "conv_int8/kernels/conv3x3_sm90.cuh"   // Conv3Params, kWregSlabs
#include "conv_int8/kernels/stem_sm90.cuh"      // StemParams, the stem's constants

namespace trtfuse {
namespace rconv {

// ---- 1x1 conv ----

struct ConfigInfo {
    char const* name;
    int bm, bn, threads, smem;   // smem: the fixed part (sm90: plus the weight slice, see config_smem)
    void (*kernels[kForms])(Params);   // [Form] (params.h); null: a form this configuration does not run
    bool sm90 = false;           // needs the sm_90a module (see wgmma_available); weight slice in shared memory
    int bk = 0;
    int (*smem_bytes)(int k_tiles) = nullptr;   // sm90: the launch's shared memory for a layer of k_tiles stages
    bool balance = false;   // sm90, one warpgroup per tile, in turns: extra blocks allowed (schedule_sm90.h)
    // sm90 with a chained next conv (conv1x1_sm90.cuh, NEXT_N): [NEXT_N 64, 128][Form]; null: not compiled for this
    // configuration (see kNextConfig)
    void (*next_kernels[2][kForms])(Params) = {};
    int wn = 0;   // sm90: the columns of a tile that one consumer warpgroup computes and stores (WgwConfig::WN)
};
constexpr int kWeightSliceRows = 256;  // the sm90 kernel's BN: Layer::w_img holds slices of this many rows
constexpr int kMaxSmem = 227 * 1024;   // dynamic shared memory per block (sm_90)

extern ConfigInfo const kConfigs[];
extern int const kNumConfigs;
// The configuration compiled with a chained next conv (four kernels: NEXT_N 64, 128 x tail, projection + tail): on
// the H100 the fastest chained one for each ResNet-50 layer1 pair at batch 256 and 2048, also where the layer alone
// prefers another (layer1.1 + layer1.2's conv1 at 2048: 1.569 ms, 1.587 with wgw_64x256x128_s2_r3_p2, 1.624 with
// the turn-taking wgw_64x256x128_s4_r2_p2_pp_sh; layer1.2 + layer2.0's conv1: 1.791, 1.968, 1.861;
// docs/residual_conv.md, Version 17).
inline constexpr char const* kNextConfig = "wgw_64x256x64_s4_r2";

// select_config's answer for a projection + tail layer whose tuned choice is to run the two as plain layers
constexpr int kSeparate = -2;

// Loads the tuning cache from path (null: $TRTFUSE_RESIDUAL_CONV_CACHE); its entry count or TRTFUSE_RCONV_ERR_CACHE.
int load_cache(char const* path);
bool config_supported(int config);
int config_smem(int config, int k_bytes);
bool layer_fits(int config, int k_bytes);
int layer_k_bytes(Layer const& L);
int config_by_name(std::string const& name);
int heuristic(int k_bytes, bool fused = false);
int select_config(int cin, int cout, int n, int hw, bool residual, int stride, int proj_cin = 0, int k_bytes = 0);
// The tuning cache's configuration name for `gpu` (tuning_cache.h: lookup; family "" is the 1x1 conv), "" if none.
std::string cache_lookup(std::string const& gpu, std::string const& family, int cin, int cout, int hw, int n,
                         bool residual, int stride, int proj_cin);

// ---- 3x3 conv on halo tiles ----

struct HaloInfo {
    char const* name;
    int bn, bm, stages, sbuf, threads;
    bool wreg;     // WREG: inputs of up to kWregSlabs slabs, and its staging tile has padded rows
    void (*kernel)(Conv3Params);
    int (*smem)(int kpad, int slot_bytes, int stage_bytes);
};
extern HaloInfo const kHaloConfigs[];
extern int const kNumHaloConfigs;
// A launch's tile geometry on config C for an h x w input at L's stride: the output size, a box row (Wp), output rows
// per tile, and the shared memory of its halo slot (stride 2: of each of its four phase boxes), staging tile and whole
// block. false: the image is too wide for the tile (Wp > BM, or a TMA box over 256), the input too deep for a WREG
// configuration's registers (over kWregSlabs slabs), or the block's shared memory.
struct HaloGeometry {
    int ho, wo, wp, R, slot_bytes, phase_bytes, stage_bytes, smem;
};
bool halo_geometry(HaloInfo const& C, Layer const& L, int h, int w, HaloGeometry* g);
int halo_heuristic(Layer const& L, int h, int w);
int select_halo(Layer const& L, int n, int h, int w);   // -1 if none holds the layer

// ---- the stem ----

// Pooled rows per block (P), the stem's configurations; named as a tuning cache would store them.
struct StemInfo {
    char const* name;
    int pool_rows, ir, plane, box_plane;   // StemBand's
    void (*kernel)(StemParams);
    void (*next_kernel)(StemParams);       // with the chained conv1 (NEXT), or nullptr: two launches
};
extern StemInfo const kStemConfigs[];
extern int const kNumStemConfigs;
constexpr int kStemTapsTotal = 49;   // Layer::taps of a stem layer

// A launch's geometry for an h x w input of cin channels on configuration C; false: the image is too wide (more
// pooled columns than the block's 8 warps pool: W > 224) or the block's shared memory too large.
struct StemGeometry {
    int hc, wc, hp, wp, copy, box, smem;
};
// a stride-2 extent (the conv's of the input, the pool's of the conv's): ceil(v / 2)
inline int halved(int v) { return (v - 1) / 2 + 1; }
bool stem_geometry(StemInfo const& C, int cin, int h, int w, bool next, StemGeometry* g);
int select_stem(Layer const& L, int n, int h, int w);

}  // namespace rconv
}  // namespace trtfuse
