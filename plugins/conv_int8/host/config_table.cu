// Every kernel configuration of the library, all families in one place, and how a launch picks one.
//
// Families (each row of a table names a compiled kernel; the names are what the tuning cache stores):
//   kConfigs       1x1 conv: conv_kernel_sm80 (kernels/conv1x1_sm80.cuh: mma.sync, cp.async multistage; any GPU
//                  from sm_80, any K) and conv_kernel_sm90 (kernels/conv1x1_sm90.cuh: wgmma, warp specialized, weight
//                  slice in shared memory; sm_90a only), each with its forms (plain, residual, projection + tail)
//                  and, for kNextConfig, the chained next conv (NEXT_N 64, 128);
//   kHaloConfigs   3x3 conv on halo tiles (kernels/conv3x3_sm90.cuh), sm_90a only;
//   kStemConfigs   the ResNet stem (kernels/stem_sm90.cuh), sm_90a only, stem_p8, stem_p4 and stem_p2 also with
//                  the chained conv1.
// One way to pick, per launch: an explicit index (the C ABI's config >= 0) wins; else the tuning cache's entry for the
// family, the GPU, the shape and the batch (select_config, select_halo, select_stem), then the family's default (1x1:
// the heuristic, 3x3: halo_heuristic, stem: the first row), each refusing a configuration that does not hold the
// layer (layer_fits, halo_geometry, stem_geometry).
// The configurations below are those the tuner picked for some ResNet-50 stage and batch on the H100 or the H200,
// with the sm80 kernel ranked on its own for GPUs without sm_90a (docs/residual_conv.md has the A/B numbers behind
// every configuration dropped).
//
// This is the only translation unit that names the kernel templates: each kernel is compiled once, here.
#include "conv_int8/host/config_table.h"

#include "common/cuda_check.h"
#include "conv_int8/c_api.h"
#include "conv_int8/host/tuning_cache.h"
#include "conv_int8/kernels/conv1x1_sm80.cuh"
#include "conv_int8/kernels/conv1x1_sm90.cuh"
#include "conv_int8/kernels/conv3x3_sm90.cuh"
#include "conv_int8/kernels/stem_sm90.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

namespace trtfuse {
namespace rconv {

// ---- 1x1 conv (conv1x1_sm80.cuh, conv1x1_sm90.cuh) ----

// Names are what the tuning cache stores (stable across reorderings of this list).
//                  BM   BN   BK  WM  WN STAGES MIN_BLOCKS
using M0 = Sm80Config<128, 128, 64, 64, 32, 2, 2>;    // res2 on the sm80 kernel
using M1 = Sm80Config<128, 128, 128, 64, 32, 2, 2>;   // res3-res5: BK 128 halves the barriers per k
// Small tiles for batch 1 and 8 (SingleStream, MultiStream). There the sm90 kernel's 64 x 256 tiles give each of a
// few dozen blocks one tile, which it starts only once the whole 256 x K weight slice has arrived: a plugin node took
// 9-11 us where TensorRT's layer took 6 (H200, batch 1, TensorRT's per-layer profile: benchmarks/results/
// submission_h200/latency_profile/). These stream both operands in small tiles, so that many blocks each do a
// little; the tuner picks among them per shape at those batches.
using M2 = Sm80Config<64, 64, 64, 32, 32, 3, 4>;
using M3 = Sm80Config<32, 64, 128, 16, 32, 2, 4>;
using M4 = Sm80Config<64, 32, 128, 16, 32, 2, 4>;
//                BK STAGES RBUF SPLIT PINGPONG NH
using W0 = WgwConfig<128, 2, 2, false, false>;   // res3 2048, res4 2048
using W1 = WgwConfig<128, 2, 3, true, false>;    // res2 256: a third residual buffer keeps the producers ahead
using W2 = WgwConfig<128, 4, 2, true, true>;     // res2 2048, res4 256, res5: consumers take turns
using W3 = WgwConfig<64, 4, 2, false, false>;    // H200 res2 2048: BK 64, 4 x stages per consumer
using W4 = WgwConfig<64, 4, 2, true, false>;     // H200 res2 256
// two consumer warpgroups per tile (NH 2, Version 21): more warps per scheduler for the epilogue
using W5 = WgwConfig<64, 4, 2, false, false, 2>;    // res3 256, res3 2048
using W6 = WgwConfig<128, 2, 2, false, false, 2>;   // res4 256
using W7 = WgwConfig<128, 2, 3, true, false, 2>;    // layer2.0's projection + tail, 256 and 2048
using W8 = WgwConfig<64, 4, 2, true, false, 2>;     // layer1.0's projection + tail (unchained), 256 and 2048

template <class C>
constexpr ConfigInfo info_sm80(char const* name) {
    return {name, C::BM, C::BN, C::THREADS, C::SMEM, {conv_kernel_sm80<C, false>, conv_kernel_sm80<C, true>, nullptr}};
}

template <class C>
int sm90_smem(int k_tiles) { return wgw_smem_bytes<C>(k_tiles); }
template <class C, bool NEXT = false>
constexpr ConfigInfo info_sm90(char const* name) {
    static_assert(C::BN == kWeightSliceRows, "Layer::w_img is packed in slices of kWeightSliceRows rows");
    ConfigInfo i{name,
                 C::BM,
                 C::BN,
                 C::THREADS,
                 C::SMEM,
                 {conv_kernel_sm90<C, kPlain>, conv_kernel_sm90<C, kResidual>, conv_kernel_sm90<C, kProjResidual>},
                 true,
                 C::BK,
                 sm90_smem<C>,
                 C::BALANCE};
    i.wn = C::WN;
    if constexpr (NEXT) {   // a chained next conv follows a tail (with or without its projection)
        i.next_kernels[0][kResidual] = conv_kernel_sm90<C, kResidual, 64>;
        i.next_kernels[0][kProjResidual] = conv_kernel_sm90<C, kProjResidual, 64>;
        i.next_kernels[1][kResidual] = conv_kernel_sm90<C, kResidual, 128>;
        i.next_kernels[1][kProjResidual] = conv_kernel_sm90<C, kProjResidual, 128>;
    }
    return i;
}

ConfigInfo const kConfigs[] = {
    info_sm80<M0>("sm80_128x128x64_s2"),   // config 0: the tuner's exactness gate (runs everywhere)
    info_sm80<M1>("sm80_128x128x128_s2_b2"),
    info_sm90<W0>("wgw_64x256x128_s2_r2"),
    info_sm90<W1>("wgw_64x256x128_s2_r3_p2"),
    info_sm90<W2>("wgw_64x256x128_s4_r2_p2_pp_sh"),
    info_sm90<W3, true>("wgw_64x256x64_s4_r2"),
    info_sm90<W4>("wgw_64x256x64_s4_r2_p2"),
    info_sm90<W5>("wgw_64x256x64_s4_r2_h2"),
    info_sm90<W6>("wgw_64x256x128_s2_r2_h2"),
    info_sm90<W7>("wgw_64x256x128_s2_r3_p2_h2"),
    info_sm90<W8>("wgw_64x256x64_s4_r2_p2_h2"),
    info_sm80<M2>("sm80_64x64x64_s3"),
    info_sm80<M3>("sm80_32x64x128_s2"),
    info_sm80<M4>("sm80_64x32x128_s2"),
};
int const kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

// ---- tuning cache: process-wide, loaded once on first use ----
namespace {
std::mutex g_cache_mu;
bool g_cache_loaded = false;
std::vector<CacheEntry> g_cache;

int load_cache_locked(char const* path) {
    g_cache_loaded = true;
    g_cache.clear();
    std::string p = path ? path : "";
    if (p.empty()) {
        char const* env = std::getenv("TRTFUSE_RESIDUAL_CONV_CACHE");
        if (!env || !*env) return 0;   // no cache: the heuristic decides
        p = env;
    }
    std::string error;
    if (!read_tuning_cache(p, &g_cache, &error)) {
        std::fprintf(stderr, "trtfuse: residual_conv tuning cache ignored: %s\n", error.c_str());
        g_cache.clear();
        return TRTFUSE_RCONV_ERR_CACHE;
    }
    return static_cast<int>(g_cache.size());
}
}  // namespace

int load_cache(char const* path) {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    int st = load_cache_locked(path);
    if (st < 0) return st;
    std::string gpu;
    if (!device_name(&gpu)) return static_cast<int>(g_cache.size());   // no GPU: count every entry
    int count = 0;
    for (auto const& e : g_cache) count += e.gpu == gpu;
    return count;
}

bool config_supported(int config) { return !kConfigs[config].sm90 || wgmma_available(); }

// Shared memory of `config` for a layer whose weight rows are k_bytes long (sm90: the weight slice grows with K).
// A layer of kc input slabs: kc * 32; a fused projection and tail: the projection's K padded to 128, plus the tail's.
int config_smem(int config, int k_bytes) {
    ConfigInfo const& C = kConfigs[config];
    if (!C.sm90) return C.smem;
    return C.smem_bytes((k_bytes + C.bk - 1) / C.bk);
}
// Whether `config` can run a layer with k_bytes weight rows: the sm90 kernel needs the weight slice in shared memory.
bool layer_fits(int config, int k_bytes) { return config_smem(config, k_bytes) <= kMaxSmem; }
// The weight row bytes of a layer as the kernels see it (see config_smem)
int layer_k_bytes(Layer const& L) { return (L.proj ? L.proj->kpad : 0) + L.kc * 32; }

int config_by_name(std::string const& name) {
    for (int i = 0; i < kNumConfigs; ++i)
        if (name == kConfigs[i].name) return i;
    return -1;
}

// Without a cache entry: the configuration with the smallest worst case over the ResNet-50 stages and batches on the
// H100 (at most 1.17x the tuner's best, res3 at batch 2048; docs/residual_conv.md, Version 12), on the sm90 kernel
// where it can run and hold the layer, else the sm80 one. A fused projection + tail (`fused`) takes the consumers
// that do not take turns: the turn-taking one is its slowest sm90 choice (a consumer holds its turn through the
// projection's epilogue; H100 layer1.0 at batch 2048: 2.91 ms, 1.87 with wgw_64x256x64_s4_r2, the tuner's pick at
// both layer1.0 batches and within 5 % of it at layer2.0; docs/residual_conv.md, Version 14).
int heuristic(int k_bytes, bool fused) {
    int const sm90 = config_by_name(fused ? "wgw_64x256x64_s4_r2" : "wgw_64x256x128_s4_r2_p2_pp_sh");
    if (config_supported(sm90) && layer_fits(sm90, k_bytes)) return sm90;
    return config_by_name("sm80_128x128x128_s2_b2");
}

std::string cache_lookup(std::string const& gpu, std::string const& family, int cin, int cout, int hw, int n,
                         bool residual, int stride, int proj_cin) {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    if (!g_cache_loaded) load_cache_locked(nullptr);
    CacheEntry const* e = lookup(g_cache, gpu, cin, cout, hw, n, residual, stride, proj_cin, family);
    return e ? e->config : std::string();
}

namespace {
// cache_lookup for the current GPU; "" without one
std::string cached_config(char const* family, int cin, int cout, int hw, int n, bool residual, int stride,
                          int proj_cin = 0) {
    std::string gpu;
    if (!device_name(&gpu)) return std::string();
    return cache_lookup(gpu, family, cin, cout, hw, n, residual, stride, proj_cin);
}
}  // namespace

// The configuration for a layer of this form at batch n with hw output positions per image (proj_cin > 0: a tail
// with its projection of proj_cin channels fused, at `stride`; its weight rows are k_bytes long, see config_smem;
// the answer may then be kSeparate: the tuner found the two plain layers faster, "config": "separate").
int select_config(int cin, int cout, int n, int hw, bool residual, int stride, int proj_cin, int k_bytes) {
    if (k_bytes == 0) k_bytes = round_up(cin, 32);
    std::string const name = cached_config("", cin, cout, hw, n, residual, stride, proj_cin);
    if (proj_cin > 0 && name == "separate") return kSeparate;
    int const c = name.empty() ? -1 : config_by_name(name);
    // an sm90 entry without sm_90a, or one that cannot hold this layer: the heuristic
    if (c >= 0 && config_supported(c) && layer_fits(c, k_bytes)) return c;
    return heuristic(k_bytes, proj_cin > 0);
}

// ---- 3x3 conv on halo tiles (conv3x3_sm90.cuh) ----

// Names are what a tuning cache would store. BN, MB (m64 blocks per consumer tile), STAGES, SBUF (params in
// conv3x3_sm90.cuh).
// Without turns (PINGPONG false) each was 5-9 % slower, and rings of 3 or 5 slots, one staging tile, or (layer2) a
// ring of 2 with 2 staging tiles no faster (H100, batch 2048; docs/residual_conv.md, Version 15).
using H0 = HaloConfig<64, 4, 4, 2, true>;    // Cout 64 (layer1): 4 x 64 rows per tile, 4 image rows at W 56
using H1 = HaloConfig<128, 2, 3, 1, true>;   // Cout 128 (layer2): weights 147 KB
using H2 = HaloConfig<64, 2, 4, 2, true>;    // Cout > 64 on N tiles of 64, smaller tiles (layer3: weights 147 KB)
using H3 = HaloConfig<64, 2, 2, 2, true>;    // stride 2: a slot is four phase boxes (layer2.0: 20 KB), Cout 64
using H4 = HaloConfig<128, 1, 2, 2, true>;   // stride 2 on one N block (the input read once), 64-row tiles
// Cout 64 (layer1) with three consumer warpgroups (conv3x3_sm90.cuh: NC) of 2 x 64-row tiles: 0.476 ms against
// H0's 0.493 (H100, batch 2048). Four consumers of 2 x 64 rows (0.498), and at layer2 three or four of 64 rows
// (0.397, 0.622 against H1's 0.364: shared-memory bound there) were measured and dropped (docs/residual_conv.md,
// Version 20).
using H5 = HaloConfig<64, 2, 4, 2, true, 3>;
// Cout 64 with Cin <= 64 (layer1), weights stationary in registers (conv3x3_sm90.cuh: WREG): one m64n256k32 per tap.
// Without turns: 0.391 ms against 0.398 with them (H100, batch 2048; docs/residual_conv.md, Version 24).
using H6 = HaloConfig<64, 4, 4, 2, false, 2, true>;

template <class C>
constexpr HaloInfo halo_info(char const* name) {
    return {name, C::BN, C::BM, C::STAGES, C::SBUF, C::THREADS, C::WREG, conv3x3_kernel_sm90<C>, halo_smem_bytes<C>};
}
HaloInfo const kHaloConfigs[] = {
    halo_info<H0>("halo_64x256_s4_b2_pp"),
    halo_info<H1>("halo_128x128_s3_b1_pp"),
    halo_info<H2>("halo_64x128_s4_b2_pp"),
    halo_info<H3>("halo_64x128_s2_b2_pp"),
    halo_info<H4>("halo_128x64_s2_b2_pp"),
    halo_info<H5>("halo_64x128_s4_b2_pp_c3"),
    halo_info<H6>("halo_64x256_s4_b2_wr"),
};
int const kNumHaloConfigs = sizeof(kHaloConfigs) / sizeof(kHaloConfigs[0]);

bool halo_geometry(HaloInfo const& C, Layer const& L, int h, int w, HaloGeometry* g) {
    g->ho = (h - 1) / L.stride + 1;
    g->wo = (w - 1) / L.stride + 1;
    g->wp = L.stride == 1 ? w + 2 : g->wo + 1;
    if (g->wp > C.bm || L.stride * g->wp > 256 || (C.wreg && L.kc > kWregSlabs)) return false;
    g->R = std::min(g->ho, C.bm / g->wp);
    if (L.stride == 1) {   // the farthest row a tap reads, +1
        g->phase_bytes = 0;
        g->slot_bytes = round_up((C.bm + 2 * g->wp + 2) * 32, 1024);
    } else {
        g->phase_bytes = round_up((C.bm + g->wp + 1) * 32, 1024);
        g->slot_bytes = 4 * g->phase_bytes;
    }
    g->stage_bytes = round_up(C.bn * g->R * (C.wreg ? g->wp : g->wo), 1024);
    g->smem = C.smem(L.kpad, g->slot_bytes, g->stage_bytes);
    return g->smem <= kMaxSmem;
}

std::vector<int> halo_configs_by_name(std::initializer_list<char const*> names) {
    std::vector<int> out;
    for (char const* name : names)
        for (int i = 0; i < kNumHaloConfigs; ++i)
            if (std::string(name) == kHaloConfigs[i].name) out.push_back(i);
    return out;
}

// The halo configuration for a 3x3 layer on an h x w input, -1 if none holds it: at Cout 64 (layer1) N tiles of 64,
// at stride 1 with the weights in registers where Cin <= 64 (H6: 0.39 ms against H5's 0.48 at layer1, H100 batch
// 2048), else by three consumers of 2 x 64-row tiles (H5), else two of 4 x 64 rows; wider, N tiles of 128 where that
// weight slice fits, else of 64. At stride 2 (four phase boxes a slot) only the rings of 2 slots fit; there one N
// tile of 128 with 64-row tiles reads the input once (layer2.0: 0.66 ms, against 0.80 with two N tiles of 64, H100
// batch 2048).
int halo_heuristic(Layer const& L, int h, int w) {
    // the preference orders as indices, looked up once (this runs at every forward that picks)
    static std::vector<int> const narrow_s1 = halo_configs_by_name(
        {"halo_64x256_s4_b2_wr", "halo_64x128_s4_b2_pp_c3", "halo_64x256_s4_b2_pp", "halo_64x128_s4_b2_pp",
         "halo_64x128_s2_b2_pp"});
    static std::vector<int> const narrow = halo_configs_by_name(
        {"halo_64x256_s4_b2_pp", "halo_64x128_s4_b2_pp", "halo_64x128_s2_b2_pp"});
    static std::vector<int> const wide = halo_configs_by_name(
        {"halo_128x128_s3_b1_pp", "halo_64x128_s4_b2_pp", "halo_128x64_s2_b2_pp", "halo_64x128_s2_b2_pp"});
    for (int i : L.cout > 64 ? wide : L.stride == 1 ? narrow_s1 : narrow) {
        HaloGeometry g;
        if (halo_geometry(kHaloConfigs[i], L, h, w, &g)) return i;
    }
    return -1;
}

// A 3x3 launch's configuration at batch n: the tuning cache's ("family": "conv3x3"; the heuristic above was set at
// batch 2048, and at batch 1 its tall tiles leave most SMs idle) where it holds the image, else the heuristic.
int select_halo(Layer const& L, int n, int h, int w) {
    int const hw = ((h - 1) / L.stride + 1) * ((w - 1) / L.stride + 1);
    std::string const name = cached_config("conv3x3", L.cin, L.cout, hw, n, false, L.stride);
    for (int i = 0; i < kNumHaloConfigs && !name.empty(); ++i) {
        HaloGeometry g;
        if (name == kHaloConfigs[i].name && halo_geometry(kHaloConfigs[i], L, h, w, &g)) return i;
    }
    return halo_heuristic(L, h, w);
}

// ---- the stem (stem_sm90.cuh) ----

template <class B, bool NEXT = false>
constexpr StemInfo stem_info(char const* name) {
    void (*next_kernel)(StemParams) = nullptr;
    if constexpr (NEXT) next_kernel = stem_kernel_sm90<B, true>;   // instantiated for NEXT configurations only
    return {name, B::P, B::IR, B::PLANE, B::BOX_PLANE, stem_kernel_sm90<B, false>, next_kernel};
}
// H100, batch 2048 (random weights, ours only, one run; docs/residual_conv.md, Version 18): 8 pooled rows a block
// 1.025 ms, 6 rows 1.092 (more conv rows computed twice); Version 16 has the forms dropped.
// Batch 1 and 8: a block per band of pooled rows, so stem_p8 gives a 224 x 224 image 7 blocks (H200, batch 1: 25 us
// against TensorRT's 18, TensorRT's per-layer profile). Shorter bands give more blocks, each computing more conv rows
// twice; the tuner times every band per batch, and its "stem" entries pick (select_stem).
StemInfo const kStemConfigs[] = {
    stem_info<StemBand<8>, true>("stem_p8"),
    stem_info<StemBand<6>>("stem_p6"),
    stem_info<StemBand<4>, true>("stem_p4"),
    stem_info<StemBand<2>, true>("stem_p2"),
};
int const kNumStemConfigs = sizeof(kStemConfigs) / sizeof(kStemConfigs[0]);

bool stem_geometry(StemInfo const& C, int cin, int h, int w, bool next, StemGeometry* g) {
    g->hc = halved(h);
    g->wc = halved(w);
    g->hp = halved(g->hc);
    g->wp = halved(g->wc);
    // 8 warps x kStemPoolCols pooled columns; their pixels' last byte read, box column 2 Wc + 19 - 16, is then
    // inside a box row (256 bytes from column -16)
    if (g->wp > kStemThreads / 32 * kStemPoolCols) return false;
    g->copy = round_up(cin * C.plane, 256);   // the box after both copies: 256-byte aligned
    // the box, and after the copies (NEXT) the band tile: [2 chunks][P x Wp rows][32], and the 63 rows past it
    // that a last partial m64 tile reads (their outputs are not written)
    g->box = round_up(std::max(cin * C.box_plane, next ? kStemN * C.pool_rows * g->wp + 63 * 32 : 0), 256);
    g->smem = stem_smem_bytes(g->copy, g->box, next);
    return g->smem <= kMaxSmem;
}

// A stem launch's configuration at batch n: the tuning cache's ("family": "stem") where it holds the image (with L's
// chained conv1 where that configuration chains it), else the first.
int select_stem(Layer const& L, int n, int h, int w) {
    int const hw = halved(halved(h)) * halved(halved(w));
    std::string const name = cached_config("stem", L.cin, L.cout, hw, n, false, 2);
    for (int i = 0; i < kNumStemConfigs && !name.empty(); ++i) {
        StemGeometry g;
        bool const next = L.next && L.next_n == kStemN && kStemConfigs[i].next_kernel;
        if (name == kStemConfigs[i].name && stem_geometry(kStemConfigs[i], L.cin, h, w, next, &g)) return i;
    }
    return 0;
}

}  // namespace rconv
}  // namespace trtfuse
