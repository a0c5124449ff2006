// Tile configurations, dispatch and the C ABI of the fused int8 residual conv.
//
// The library: two kernels that share the parameters (params.h), the tile layout and weight packing
// (tile_layout.h) and the epilogue (epilogue.cuh):
//   conv_kernel_sm80 (kernel_sm80.cuh): mma.sync, cp.async multistage pipeline; any GPU from sm_80, any K;
//   conv_kernel_sm90 (kernel_sm90.cuh): wgmma, warp specialized (producers, two consumers), weight slice in shared
//     memory, TMA output stores; sm_90a only, K up to what the weight slice leaves of shared memory;
//   conv3x3_kernel_sm90 (kernel3x3_sm90.cuh): the 3x3 conv (padding 1, stride 1 or 2) on halo tiles, sm_90a only;
//     its configurations ("halo_*") are a table of their own (kHaloConfigs), indexed by trtfuse_conv3x3_forward;
//   stem_kernel_sm90 (stem_sm90.cuh): the ResNet stem (7x7/2 conv + BN + ReLU + 3x3/2 max pool) from the network's
//     linear int8 input, sm_90a only; its configurations ("stem_p*": pooled rows per block) indexed by
//     trtfuse_stem_forward.
// The configurations below are those the tuner picked for some ResNet-50 stage and batch on the H100 or the H200,
// with the sm80 kernel ranked on its own for GPUs without sm_90a (docs/residual_conv.md, Version 12, has the A/B
// numbers behind every configuration dropped).
#include "common/cuda_check.h"
#include "residual_conv/kernel_sm80.cuh"
#include "residual_conv/kernel3x3_sm90.cuh"
#include "residual_conv/kernel_sm90.cuh"
#include "residual_conv/out_map.h"
#include "residual_conv/residual_conv.h"
#include "residual_conv/schedule_sm90.h"
#include "residual_conv/stem_sm90.cuh"
#include "residual_conv/tile_layout.h"
#include "residual_conv/tuning_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace trtfuse {
namespace rconv {
namespace {

// Names are what the tuning cache stores (stable across reorderings of this list).
//                  BM   BN   BK  WM  WN STAGES MIN_BLOCKS
using M0 = Sm80Config<128, 128, 64, 64, 32, 2, 2>;    // res2 on the sm80 kernel
using M1 = Sm80Config<128, 128, 128, 64, 32, 2, 2>;   // res3-res5: BK 128 halves the barriers per k
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

struct ConfigInfo {
    char const* name;
    int bm, bn, threads, smem;   // smem: the fixed part (sm90: plus the weight slice, see config_smem)
    void (*kernels[kForms])(Params);   // [Form] (params.h); null: a form this configuration does not run
    bool sm90 = false;           // needs the sm_90a module (see wgmma_available); weight slice in shared memory
    int bk = 0;
    int (*smem_bytes)(int k_tiles) = nullptr;   // sm90: the launch's shared memory for a layer of k_tiles stages
    bool balance = false;   // sm90, one warpgroup per tile, in turns: extra blocks allowed (schedule_sm90.h)
    // sm90 with a chained next conv (kernel_sm90.cuh, NEXT_N): [NEXT_N 64, 128][Form]; null: not compiled for this
    // configuration (see kNextConfig)
    void (*next_kernels[2][kForms])(Params) = {};
    int wn = 0;   // sm90: the columns of a tile that one consumer warpgroup computes and stores (WgwConfig::WN)
};

template <class C>
constexpr ConfigInfo info_sm80(char const* name) {
    return {name, C::BM, C::BN, C::THREADS, C::SMEM, {conv_kernel_sm80<C, false>, conv_kernel_sm80<C, true>, nullptr}};
}
constexpr int kWeightSliceRows = 256;  // the sm90 kernel's BN: Layer::w_img holds slices of this many rows

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
constexpr int kMaxSmem = 227 * 1024;   // dynamic shared memory per block (sm_90)

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
};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);
// The configuration compiled with a chained next conv (four kernels: NEXT_N 64, 128 x tail, projection + tail): on
// the H100 the fastest chained one for each ResNet-50 layer1 pair at batch 256 and 2048, also where the layer alone
// prefers another (layer1.1 + layer1.2's conv1 at 2048: 1.569 ms, 1.587 with wgw_64x256x128_s2_r3_p2, 1.624 with
// the turn-taking wgw_64x256x128_s4_r2_p2_pp_sh; layer1.2 + layer2.0's conv1: 1.791, 1.968, 1.861;
// docs/residual_conv.md, Version 17).
char const* const kNextConfig = "wgw_64x256x64_s4_r2";

struct Layer {
    int cin, cout, kc, nc, kpad, npad;
    // A stage's first block (trtfuse_proj_tail_create): this layer is its tail, `proj` its projection (a layer of
    // its own: its constants, and the two-launch path where the fused kernel cannot run), w_img_fused the sm90
    // weight slices of rows [projection's kpad | tail's kpad].
    Layer* proj = nullptr;
    int8_t* w_img_fused = nullptr;
    bool residual;     // has a residual input (r_scale > 0)
    int stride;        // 1 or 2
    float lo;          // lower clamp: 0 with ReLU, -128 without
    int8_t* w = nullptr;       // [npad * kpad], rows permuted (tile_layout.h: packed_row_channel)
    int8_t* w_img = nullptr;   // w as the sm90 kernel's weight slices (tile_layout.h: pack_weight_slices)
    int taps = 1;              // 9: a 3x3 conv (trtfuse_conv3x3_create), K = 9 kc slabs, tap-major; 49: the stem
    int8_t* w_img_halo[2] = {};   // a 3x3 conv: w as slices of 64 and 128 rows (the halo kernel's BN)
    float* abs = nullptr;   // [6][npad]: a, b, s of the rounding rule, then the same times 2^-8
    bool sat = false;       // the epilogue may use its saturating form (see sat_exact)
    // A tail's chained next conv (trtfuse_next_attach): a layer of its own (its constants, and its launch where the
    // chained kernel cannot run), w_img_next its weights as one slice of next_n rows (the chained kernel's NEXT_N) x
    // kNextMaxK (K zero padded)
    Layer* next = nullptr;
    int8_t* w_img_next = nullptr;
    int next_n = 0;
};

int round_up(int v, int m) { return (v + m - 1) / m * m; }

// Whether the epilogue's saturating form of the rule (epilogue.cuh) is exact for a constant:
// zero, or a magnitude in [2^-90, 2^100]
bool sat_exact(float v) {
    float const m = std::fabs(v);
    return m == 0.f || (m >= std::ldexp(1.f, -90) && m <= std::ldexp(1.f, 100));
}
bool good_scale(float s) { return std::isfinite(s) && s > 0.f; }

// ---- tuning cache: process-wide, loaded once on first use ----
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

// Whether the module the driver loaded for the current device holds the real wgmma kernels: only an sm_90a
// cubin does (the library built with sm_90a, e.g. --archs 80,90a, on a compute capability 9.0 GPU); every other
// pass compiles them to empty bodies. Read once per device from the kHasWgmma device constant (a synchronous
// copy: create() calls this first, so forward() inside a stream capture finds it cached).
int wgmma_available() {
    static std::mutex mu;
    static signed char cache[64];   // 0 unknown, 1 yes, -1 no
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) { cudaGetLastError(); return 0; }
    std::lock_guard<std::mutex> lock(mu);
    if (dev < 64 && cache[dev]) return cache[dev] > 0;
    int flag = 0;
    if (cudaMemcpyFromSymbol(&flag, kHasWgmma, sizeof(int)) != cudaSuccess) { cudaGetLastError(); flag = 0; }
    if (dev < 64) cache[dev] = flag ? 1 : -1;
    return flag != 0;
}

bool config_supported(int config) { return !kConfigs[config].sm90 || wgmma_available(); }

// The current device's name, the tuning cache's key; false without a device. Read once per device: select_config
// runs at every forward (each plugin enqueue), and cudaGetDeviceProperties queries every attribute of the device.
bool device_name(std::string* name) {
    static std::mutex mu;
    static std::string names[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) { cudaGetLastError(); return false; }
    std::lock_guard<std::mutex> lock(mu);
    if (dev < 64 && !names[dev].empty()) { *name = names[dev]; return true; }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) { cudaGetLastError(); return false; }
    *name = prop.name;
    if (dev < 64) names[dev] = *name;
    return true;
}

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
int heuristic(int k_bytes, bool fused = false) {
    int const sm90 = config_by_name(fused ? "wgw_64x256x64_s4_r2" : "wgw_64x256x128_s4_r2_p2_pp_sh");
    if (config_supported(sm90) && layer_fits(sm90, k_bytes)) return sm90;
    return config_by_name("sm80_128x128x128_s2_b2");
}

// select_config's answer for a projection + tail layer whose tuned choice is to run the two as plain layers
constexpr int kSeparate = -2;

// The configuration for a layer of this form at batch n with hw output positions per image (proj_cin > 0: a tail
// with its projection of proj_cin channels fused, at `stride`; its weight rows are k_bytes long, see config_smem;
// the answer may then be kSeparate: the tuner found the two plain layers faster, "config": "separate").
int select_config(int cin, int cout, int n, int hw, bool residual, int stride, int proj_cin = 0, int k_bytes = 0) {
    if (k_bytes == 0) k_bytes = round_up(cin, 32);
    std::string gpu;
    if (!device_name(&gpu)) return heuristic(k_bytes, proj_cin > 0);
    {
        std::lock_guard<std::mutex> lock(g_cache_mu);
        if (!g_cache_loaded) load_cache_locked(nullptr);
        if (CacheEntry const* e = lookup(g_cache, gpu, cin, cout, hw, n, residual, stride, proj_cin)) {
            if (proj_cin > 0 && e->config == "separate") return kSeparate;
            int c = config_by_name(e->config);
            // an sm90 entry without sm_90a, or one that cannot hold this layer: the heuristic
            if (c >= 0 && config_supported(c) && layer_fits(c, k_bytes)) return c;
        }
    }
    return heuristic(k_bytes, proj_cin > 0);
}

// The SM count of device `dev`, read once per device (both launch paths ask at every forward)
int sm_count(int dev, int* out) {
    static std::mutex mu;
    static int cache[64] = {};
    std::lock_guard<std::mutex> lock(mu);
    if (dev < 64 && cache[dev]) { *out = cache[dev]; return 0; }
    TRTFUSE_CUDA_RETURN(cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, dev));
    if (dev < 64) cache[dev] = *out;
    return 0;
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` (more than the default 48 KB) on the current device, once
// per (device, kernel): the attribute is per device, and the launches ask at every forward.
template <class Kernel>
int allow_dynamic_smem(Kernel kernel, int bytes) {
    static std::mutex mu;
    static std::set<std::pair<int, void const*>> done;
    int dev = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&dev));
    auto const key = std::make_pair(dev, reinterpret_cast<void const*>(kernel));
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(key)) return 0;
    TRTFUSE_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    done.insert(key);
    return 0;
}

// Blocks of `kernel` (of `config`) that fit on the whole current GPU at once (SMs x blocks per SM) with `smem`
// bytes of dynamic shared memory, cached per (device, kernel, smem): the launches ask at every forward, and an sm90
// kernel's size depends on the layer (an occupancy query at every plugin enqueue was host time on each launch). Also
// raises the kernel's dynamic shared-memory limit (sm90: to the maximum).
int resident_blocks(int config, void (*kernel)(Params), int smem, int* out) {
    static std::mutex mu;
    static std::map<std::tuple<int, void const*, int>, int> cache;
    int dev = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&dev));
    auto const key = std::make_tuple(dev, reinterpret_cast<void const*>(kernel), smem);
    {
        std::lock_guard<std::mutex> lock(mu);
        auto const hit = cache.find(key);
        if (hit != cache.end()) { *out = hit->second; return 0; }
    }
    ConfigInfo const& C = kConfigs[config];
    if (int st = allow_dynamic_smem(kernel, C.sm90 ? kMaxSmem : C.smem)) return st;
    int per_sm = 0, sms = 0;
    TRTFUSE_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C.threads, smem));
    if (int st = sm_count(dev, &sms)) return st;
    if (per_sm <= 0) return static_cast<int>(cudaErrorInvalidConfiguration);
    *out = per_sm * sms;
    std::lock_guard<std::mutex> lock(mu);
    cache[key] = *out;
    return 0;
}

// ---- layers: packing, upload, launch ----

// The packed weights [npad][kpad] of weights [cout][cin], zero padded, rows in the epilogue's order (tile_layout.h)
std::vector<int8_t> pack_rows(int8_t const* weights, int cin, int cout, int npad, int kpad) {
    std::vector<int8_t> rows(static_cast<size_t>(npad) * kpad, 0);
    for (int row = 0; row < npad; ++row) {
        int const ch = packed_row_channel(row);
        if (ch < cout)
            std::copy_n(&weights[static_cast<size_t>(ch) * cin], cin, &rows[static_cast<size_t>(row) * kpad]);
    }
    return rows;
}

template <class T>
int upload(std::vector<T> const& v, T** dst) {
    cudaError_t e = cudaMalloc(dst, v.size() * sizeof(T));
    if (e == cudaSuccess) e = cudaMemcpy(*dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return static_cast<int>(e);
}

// Frees a layer, its buffers and its projection (null: nothing). The first CUDA error, or 0.
int free_layer(Layer* L) {
    if (!L) return 0;
    int e = free_layer(L->proj);
    if (int f = free_layer(L->next)) e = e ? e : f;
    for (void* ptr : {static_cast<void*>(L->w), static_cast<void*>(L->w_img), static_cast<void*>(L->abs),
                      static_cast<void*>(L->w_img_next),
                      static_cast<void*>(L->w_img_fused), static_cast<void*>(L->w_img_halo[0]),
                      static_cast<void*>(L->w_img_halo[1])})
        if (int f = static_cast<int>(cudaFree(ptr))) e = e ? e : f;
    delete L;
    return e;
}

// The rounding rule's constants of a layer, [6][npad]: a, b, s, then the same times 2^-8 (zero in the padding: padded
// channels come out 0), each an fp32 operation in this order (docs/residual_conv.md); *sat: whether the epilogue may
// use its saturating form (ReLU, and every constant sat_exact)
std::vector<float> rule_constants(int cout, int npad, float const* w_scale, float const* bias, float x_scale,
                                  float r_scale, float out_scale, int relu, bool* sat) {
    std::vector<float> abs(6 * static_cast<size_t>(npad), 0.f);
    float const inv_out = 1.0f / out_scale;
    for (int n = 0; n < cout; ++n) {
        float alpha = x_scale * w_scale[n];
        abs[n] = alpha * inv_out;
        abs[npad + n] = bias[n] * inv_out;
        abs[2 * npad + n] = r_scale * inv_out;
    }
    *sat = relu != 0;
    for (size_t i = 0; i < 3 * static_cast<size_t>(npad); ++i) {
        *sat = *sat && sat_exact(abs[i]);
        abs[3 * static_cast<size_t>(npad) + i] = std::ldexp(abs[i], -8);   // exact for these magnitudes
    }
    return abs;
}

// Fills L from checked fields and uploads its buffers; *rows: the packed weights (pack_rows). taps 9: a 3x3 conv,
// weights [cout][cin][3][3], whose GEMM k is tap * kc * 32 + channel.
int build_layer(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias, float x_scale,
                float r_scale, float out_scale, int relu, int stride, Layer* L, std::vector<int8_t>* rows,
                int taps = 1) {
    L->cin = cin;
    L->cout = cout;
    L->kc = (cin + 31) / 32;
    L->nc = (cout + 31) / 32;
    L->residual = r_scale != 0.f;
    L->stride = stride;
    L->taps = taps;
    L->kpad = round_up(taps * L->kc * 32, 128);   // every BK divides 128: the B loader needs no K predicate
    L->npad = round_up(L->nc * 32, 256);   // every BN divides 256: no N predicate
    L->lo = relu ? 0.f : -128.f;
    std::vector<float> const abs =
        rule_constants(cout, L->npad, w_scale, bias, x_scale, r_scale, out_scale, relu, &L->sat);
    if (taps == 1) {
        *rows = pack_rows(weights, cin, cout, L->npad, L->kpad);
    } else {   // [cout][cin][tap] -> [cout][tap][kc * 32 channels, zero padded]
        int const k = taps * L->kc * 32;
        std::vector<int8_t> by_tap(static_cast<size_t>(cout) * k, 0);
        for (int co = 0; co < cout; ++co)
            for (int ci = 0; ci < cin; ++ci)
                for (int tap = 0; tap < taps; ++tap)
                    by_tap[static_cast<size_t>(co) * k + tap * L->kc * 32 + ci] =
                        weights[(static_cast<size_t>(co) * cin + ci) * taps + tap];
        *rows = pack_rows(by_tap.data(), k, cout, L->npad, L->kpad);
    }
    // the packed rows (the sm80 kernel's, 1x1 only; a 3x3 layer runs on the halo kernel alone), then the sm90 weight
    // slices: of the 1x1 kernel's 256 rows, or of each of the halo kernel's N tiles
    int st = taps == 1 ? upload(*rows, &L->w) : 0;
    std::vector<int8_t> img(rows->size());
    for (int i = 0; i < (taps == 1 ? 1 : 2) && st == 0; ++i) {
        pack_weight_slices(rows->data(), L->npad, L->kpad, taps == 1 ? kWeightSliceRows : 64 << i, img.data());
        st = upload(img, taps == 1 ? &L->w_img : &L->w_img_halo[i]);
    }
    if (st == 0) st = upload(abs, &L->abs);
    return st;
}

// The argument checks every forward shares (x: the input of spatial size h x w read at `stride`)
int check_launch(void const* x, void const* r, void const* out, int n, int h, int w, int stride, int config) {
    if (n <= 0 || h <= 0 || w <= 0 || static_cast<int64_t>(h) * w > (1 << 24)) return TRTFUSE_RCONV_ERR_SHAPE;
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(r) | reinterpret_cast<uintptr_t>(out)) & 15)
        return TRTFUSE_RCONV_ERR_ALIGN;
    if (config < -1 || config >= kNumConfigs) return TRTFUSE_RCONV_ERR_CONFIG;
    int64_t const hw = static_cast<int64_t>((h - 1) / stride + 1) * ((w - 1) / stride + 1);
    if (n * hw >= (int64_t(1) << 31) - 256) return TRTFUSE_RCONV_ERR_SHAPE;
    return 0;
}

// Operand x of kc slabs, h x w, read at `stride` for an output wo wide
Operand operand(void const* x, int kc, int stride, int h, int w, int wo) {
    return Operand{static_cast<int8_t const*>(x), kc, stride, h * w, w - wo};
}

Rule rule_of(Layer const& L) {
    float const* f = L.abs;
    int const np = L.npad;
    // 128 * 127 * K bounds |acc|
    return Rule{f,    f + np, f + 2 * np, f + 3 * np, f + 4 * np, f + 5 * np, L.lo, 16256LL * L.taps * L.cin < (1LL << 22),
                L.sat};
}

// Whether the fused kernel runs a projection + tail layer on `config`: an sm90 configuration that holds its rows
bool fuses(Layer const& L, int config) {
    return config >= 0 && kConfigs[config].kernels[kProjResidual] && config_supported(config) &&
           layer_fits(config, layer_k_bytes(L));
}

// The shared memory of layer L's launch on `config` in `form`, with its chained next conv when `chained`
int launch_smem(Layer const& L, Form form, int config, bool chained) {
    int const k_bytes = form == kProjResidual ? layer_k_bytes(L) : L.kc * 32;
    return config_smem(config, k_bytes) + (chained ? L.next_n * kNextMaxK : 0);
}

// Whether the chained kernel runs layer L with its next conv on `config`: compiled for it, sm_90a, and it holds both
// weight slices; L's output is one N block (cout <= 256, the next conv's K) and the next conv fits NEXT_N 64 or 128.
bool chains(Layer const& L, int config) {
    if (!L.next || config < 0 || L.next_n == 0) return false;
    Form const form = L.proj ? kProjResidual : kResidual;
    return kConfigs[config].next_kernels[L.next_n == 128][form] && config_supported(config) &&
           launch_smem(L, form, config, true) <= kMaxSmem;
}

// One launch of layer L on `config` (>= 0) in `form`: x (and, kProjResidual, the projection's xp) in, an output of
// n x ho x wo positions; with next_out, L's chained next conv's output too (chains(L, config) holds).
int launch(Layer const& L, Form form, Operand x, Operand xp, void const* r, void* out, int n, int ho, int wo,
           int config, cudaStream_t stream, void* next_out = nullptr) {
    if (!config_supported(config)) return TRTFUSE_RCONV_ERR_ARCH;
    int const k_bytes = form == kProjResidual ? layer_k_bytes(L) : L.kc * 32;
    if (!layer_fits(config, k_bytes)) return TRTFUSE_RCONV_ERR_FIT;
    ConfigInfo const& C = kConfigs[config];
    bool const chained = next_out != nullptr;
    auto const kernel = chained ? C.next_kernels[L.next_n == 128][form] : C.kernels[form];
    if (!kernel || (chained && !chains(L, config))) return TRTFUSE_RCONV_ERR_ARCH;
    int const smem = launch_smem(L, form, config, chained), hw = ho * wo;
    int64_t const M = static_cast<int64_t>(n) * hw;

    Params p{};
    p.x = x;
    p.rule = rule_of(L);
    p.r = static_cast<int8_t const*>(r);
    p.out = static_cast<int8_t*>(out);
    p.w = L.w;
    p.w_img = L.w_img;
    p.Kpad = L.kpad;
    if (form == kProjResidual) {
        p.xp = xp;
        p.proj_rule = rule_of(*L.proj);
        p.proj_kpad = L.proj->kpad;
        p.w_img = L.w_img_fused;
        p.Kpad = k_bytes;
    }
    if (chained) {
        p.next_rule = rule_of(*L.next);
        p.next_out = static_cast<int8_t*>(next_out);
        p.next_w_img = L.w_img_next;
        p.next_nc = L.next->nc;
        p.next_kpad = kNextMaxK;
    }
    p.M = static_cast<int>(M);
    p.HW = hw;
    p.ow_div = trtfuse::FastDivmod(wo);
    p.Nc = L.nc;
    p.n_blocks = (L.nc * 32 + C.bn - 1) / C.bn;
    p.hw_div = trtfuse::FastDivmod(hw);
    p.nb_div = trtfuse::FastDivmod(p.n_blocks);
    int64_t tiles = (M + C.bm - 1) / C.bm * p.n_blocks;
    if (tiles >= (int64_t(1) << 31)) return TRTFUSE_RCONV_ERR_SHAPE;
    int resident = 0;
    if (int st = resident_blocks(config, kernel, smem, &resident)) return st;
    // sm80: a persistent grid, every resident block slot gets a block, each walks tiles with a grid stride.
    int64_t blocks = std::min<int64_t>(tiles, resident);
    if (C.sm90) {   // its own schedule (schedule_sm90.h), the packed weight slices, the output tensor map
        WgwSchedule const s = wgw_schedule(static_cast<int>((M + C.bm - 1) / C.bm), p.n_blocks, resident, C.balance);
        blocks = s.grid;
        p.wgw_regular = s.regular;
        p.wgw_quota = s.quota;
        p.wgw_rest = s.rest;
        if (int st = encode_out_map(p, n, C.wn)) return st;
    }
    kernel<<<static_cast<unsigned>(blocks), C.threads, smem, stream>>>(p);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
}

// A layer's own form (without its projection, if it has one) on input x of h x w, after check_launch; -1 picks.
int forward_plain(Layer const& L, void const* x, void const* r, void* out, int n, int h, int w, int config,
                  cudaStream_t stream) {
    int const ho = (h - 1) / L.stride + 1, wo = (w - 1) / L.stride + 1;
    if (config < 0) config = select_config(L.cin, L.cout, n, ho * wo, L.residual, L.stride);
    return launch(L, L.residual ? kResidual : kPlain, operand(x, L.kc, L.stride, h, w, wo), Operand{}, r, out, n, ho,
                  wo, config, stream);
}

// ---- the 3x3 conv on halo tiles (kernel3x3_sm90.cuh) ----

// Names are what a tuning cache would store. BN, MB (m64 blocks per consumer tile), STAGES, SBUF (params in
// kernel3x3_sm90.cuh).
// Without turns (PINGPONG false) each was 5-9 % slower, and rings of 3 or 5 slots, one staging tile, or (layer2) a
// ring of 2 with 2 staging tiles no faster (H100, batch 2048; docs/residual_conv.md, Version 15).
using H0 = HaloConfig<64, 4, 4, 2, true>;    // Cout 64 (layer1): 4 x 64 rows per tile, 4 image rows at W 56
using H1 = HaloConfig<128, 2, 3, 1, true>;   // Cout 128 (layer2): weights 147 KB
using H2 = HaloConfig<64, 2, 4, 2, true>;    // Cout > 64 on N tiles of 64, smaller tiles (layer3: weights 147 KB)
using H3 = HaloConfig<64, 2, 2, 2, true>;    // stride 2: a slot is four phase boxes (layer2.0: 20 KB), Cout 64
using H4 = HaloConfig<128, 1, 2, 2, true>;   // stride 2 on one N block (the input read once), 64-row tiles
// Cout 64 (layer1) with three consumer warpgroups (kernel3x3_sm90.cuh: NC) of 2 x 64-row tiles: 0.476 ms against
// H0's 0.493 (H100, batch 2048). Four consumers of 2 x 64 rows (0.498), and at layer2 three or four of 64 rows
// (0.397, 0.622 against H1's 0.364: shared-memory bound there) were measured and dropped (docs/residual_conv.md,
// Version 20).
using H5 = HaloConfig<64, 2, 4, 2, true, 3>;
// Cout 64 with Cin <= 64 (layer1), weights stationary in registers (kernel3x3_sm90.cuh: WREG): one m64n256k32 per tap.
// Without turns: 0.391 ms against 0.398 with them (H100, batch 2048; docs/residual_conv.md, Version 24).
using H6 = HaloConfig<64, 4, 4, 2, false, 2, true>;

struct HaloInfo {
    char const* name;
    int bn, bm, stages, sbuf, threads;
    bool wreg;     // WREG: inputs of up to kWregSlabs slabs, and its staging tile has padded rows
    void (*kernel)(Conv3Params);
    int (*smem)(int kpad, int slot_bytes, int stage_bytes);
};
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
constexpr int kNumHaloConfigs = sizeof(kHaloConfigs) / sizeof(kHaloConfigs[0]);

// A launch's tile geometry on config C for an h x w input at L's stride: the output size, a box row (Wp), output rows
// per tile, and the shared memory of its halo slot (stride 2: of each of its four phase boxes), staging tile and whole
// block. false: the image is too wide for the tile (Wp > BM, or a TMA box over 256), the input too deep for a WREG
// configuration's registers (over kWregSlabs slabs), or the block's shared memory.
struct HaloGeometry {
    int ho, wo, wp, R, slot_bytes, phase_bytes, stage_bytes, smem;
};
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

// The 3x3 conv's input (h x w) and output tensor maps (Conv3Params, with p.H, p.W, p.Wp, p.R, p.stride set); 0 or a
// cudaError_t.
int encode_halo_maps(Conv3Params& p, void const* x, void* out, int n, int h, int w, int nc, int bn, bool padded_rows) {
    auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    cuuint32_t const ones[5] = {1, 1, 1, 1, 1};
    cuuint64_t const in_dims[4] = {32, static_cast<cuuint64_t>(w), static_cast<cuuint64_t>(h),
                                   static_cast<cuuint64_t>(n) * p.Kc};
    cuuint64_t const in_strides[3] = {32, static_cast<cuuint64_t>(w) * 32, static_cast<cuuint64_t>(h) * w * 32};
    // stride 2: a phase box takes every other column and row, Wp x (R + 1) of them
    cuuint32_t const s = static_cast<cuuint32_t>(p.stride);
    cuuint32_t const in_box[4] = {32, s * p.Wp, s == 1 ? p.R + 2u : 2u * (p.R + 1), 1};
    cuuint32_t const in_elem_strides[4] = {1, s, s, 1};
    CUresult st = encode(&p.in_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(x), in_dims, in_strides, in_box,
                         in_elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (st != CUDA_SUCCESS) return cudaErrorInvalidValue;
    cuuint64_t const H = p.H, W = p.W, HW32 = H * W * 32;
    cuuint64_t const out_dims[5] = {32, W, H, static_cast<cuuint64_t>(nc), static_cast<cuuint64_t>(n)};
    cuuint64_t const out_strides[4] = {32, W * 32, HW32, HW32 * nc};
    // padded_rows (WREG's staging tile): a box row of Wp, whose columns past W the store clips
    cuuint32_t const out_box[5] = {32, static_cast<cuuint32_t>(padded_rows ? p.Wp : p.W), static_cast<cuuint32_t>(p.R),
                                   static_cast<cuuint32_t>(bn / 32), 1};
    st = encode(&p.out_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 5, out, out_dims, out_strides, out_box, ones,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return st == CUDA_SUCCESS ? 0 : cudaErrorInvalidValue;
}

// One launch of 3x3 layer L on halo config `config` (-1 picks): x [n][kc][h][w][32] -> out [n][nc][ho][wo][32].
int launch_conv3x3(Layer const& L, void const* x, void* out, int n, int h, int w, int config, cudaStream_t stream) {
    if (!wgmma_available()) return TRTFUSE_RCONV_ERR_ARCH;
    if (config < 0) config = halo_heuristic(L, h, w);
    if (config < 0) return TRTFUSE_RCONV_ERR_FIT;
    HaloInfo const& C = kHaloConfigs[config];
    HaloGeometry g;
    if (!halo_geometry(C, L, h, w, &g)) return TRTFUSE_RCONV_ERR_FIT;
    Conv3Params p{};
    p.rule = rule_of(L);
    p.w_img = L.w_img_halo[C.bn == 64 ? 0 : 1];
    p.Kpad = L.kpad;
    p.Kc = L.kc;
    p.stride = L.stride;
    p.H = g.ho;
    p.W = g.wo;
    p.Wp = g.wp;
    p.R = g.R;
    p.tiles_per_img = (g.ho + g.R - 1) / g.R;
    int64_t const m_tiles = static_cast<int64_t>(n) * p.tiles_per_img;
    if (m_tiles >= (int64_t(1) << 31)) return TRTFUSE_RCONV_ERR_SHAPE;
    p.m_tiles = static_cast<int>(m_tiles);
    p.n_blocks = (L.nc * 32 + C.bn - 1) / C.bn;
    p.slot_bytes = g.slot_bytes;
    p.phase_bytes = g.phase_bytes;
    p.stage_bytes = g.stage_bytes;
    if (int st = encode_halo_maps(p, x, out, n, h, w, L.nc, C.bn, C.wreg)) return st;
    int dev = 0, sms = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&dev));
    if (int st = sm_count(dev, &sms)) return st;
    // one block per SM (the weight slice fills most of shared memory); per N block as many as there are M tiles
    int64_t const per_n = std::max<int64_t>(1, std::min<int64_t>(sms / p.n_blocks, m_tiles));
    if (int st = allow_dynamic_smem(C.kernel, kMaxSmem)) return st;
    C.kernel<<<static_cast<unsigned>(per_n * p.n_blocks), C.threads, g.smem, stream>>>(p);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
}


// ---- the stem (stem_sm90.cuh) ----

// Pooled rows per block (P), the stem's configurations; named as a tuning cache would store them.
struct StemInfo {
    char const* name;
    int pool_rows, ir, plane, box_plane;   // StemBand's
    void (*kernel)(StemParams);
    void (*next_kernel)(StemParams);       // with the chained conv1 (NEXT), or nullptr: two launches
};
template <class B, bool NEXT = false>
constexpr StemInfo stem_info(char const* name) {
    void (*next_kernel)(StemParams) = nullptr;
    if constexpr (NEXT) next_kernel = stem_kernel_sm90<B, true>;   // instantiated for NEXT configurations only
    return {name, B::P, B::IR, B::PLANE, B::BOX_PLANE, stem_kernel_sm90<B, false>, next_kernel};
}
// H100, batch 2048 (random weights, ours only, one run; docs/residual_conv.md, Version 18): 8 pooled rows a block
// 1.025 ms, 6 rows 1.092 (more conv rows computed twice); Version 16 has the forms dropped.
StemInfo const kStemConfigs[] = {
    stem_info<StemBand<8>, true>("stem_p8"),   // the only one compiled with the chained conv1
    stem_info<StemBand<6>>("stem_p6"),
};
constexpr int kNumStemConfigs = sizeof(kStemConfigs) / sizeof(kStemConfigs[0]);
constexpr int kStemTapsTotal = 49;   // Layer::taps of a stem layer

// A launch's geometry for an h x w input of cin channels on configuration C; false: the image is too wide (more
// pooled columns than the block's 8 warps pool: W > 224) or the block's shared memory too large.
struct StemGeometry {
    int hc, wc, hp, wp, copy, box, smem;
};
// a stride-2 extent (the conv's of the input, the pool's of the conv's): ceil(v / 2)
int halved(int v) { return (v - 1) / 2 + 1; }
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

// p.in_map: x [n][cin][h][w] bytes as the tensor (w, h, cin, n), box (256, ir, cin, 1); 0 or a cudaError_t.
int encode_stem_map(StemParams& p, void const* x, int n, int h, int w, int cin, int ir) {
    auto encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    cuuint64_t const dims[4] = {static_cast<cuuint64_t>(w), static_cast<cuuint64_t>(h), static_cast<cuuint64_t>(cin),
                                static_cast<cuuint64_t>(n)};
    cuuint64_t const strides[3] = {static_cast<cuuint64_t>(w), static_cast<cuuint64_t>(h) * w,
                                   static_cast<cuuint64_t>(h) * w * cin};
    cuuint32_t const box[4] = {kStemBoxRow, static_cast<cuuint32_t>(ir), static_cast<cuuint32_t>(cin), 1};
    cuuint32_t const ones[4] = {1, 1, 1, 1};
    CUresult const st = encode(&p.in_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(x), dims, strides, box,
                               ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return st == CUDA_SUCCESS ? 0 : cudaErrorInvalidValue;
}

// Whether stem layer L runs its chained next conv in the same kernel on `config` (-1: the first).
bool stem_chains(Layer const& L, int config) {
    return L.next && L.next_n == kStemN && kStemConfigs[config < 0 ? 0 : config].next_kernel && wgmma_available();
}

// One launch of stem layer L: x [n][cin][h][w] (linear) -> out [n][nc][hp][wp][32]; config -1 picks. With next_out
// (stem_chains holds), L's chained next conv's output [n][next nc][hp][wp][32] too.
int launch_stem(Layer const& L, void const* x, void* out, int n, int h, int w, int config, cudaStream_t stream,
                void* next_out = nullptr) {
    if (!wgmma_available()) return TRTFUSE_RCONV_ERR_ARCH;
    if (w % 16) return TRTFUSE_RCONV_ERR_ROW;   // the TMA map's row pitch
    StemInfo const& C = kStemConfigs[config < 0 ? 0 : config];   // -1: the first
    bool const next = next_out != nullptr;
    StemGeometry g;
    if (!stem_geometry(C, L.cin, h, w, next, &g)) return TRTFUSE_RCONV_ERR_FIT;
    StemParams p{};
    p.rule = rule_of(L);
    p.w_img = L.w_img;
    p.out = static_cast<int8_t*>(out);
    p.Cin = L.cin;
    p.Nc = L.nc;
    p.Hc = g.hc;
    p.Wc = g.wc;
    p.Hp = g.hp;
    p.Wp = g.wp;
    p.bands = (g.hp + C.pool_rows - 1) / C.pool_rows;
    p.copy_bytes = g.copy;
    p.box_bytes = g.box;
    if (next) {
        p.next_rule = rule_of(*L.next);
        p.next_out = static_cast<int8_t*>(next_out);
        p.next_w_img = L.w_img_next;
        p.next_nc = L.next->nc;
    }
    int64_t const blocks = static_cast<int64_t>(n) * p.bands;
    if (blocks >= (int64_t(1) << 31)) return TRTFUSE_RCONV_ERR_SHAPE;
    if (int st = encode_stem_map(p, x, n, h, w, L.cin, C.ir)) return st;
    auto const kernel = next ? C.next_kernel : C.kernel;
    if (int st = allow_dynamic_smem(kernel, kMaxSmem)) return st;
    kernel<<<static_cast<unsigned>(blocks), kStemThreads, g.smem, stream>>>(p);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
}
}  // namespace
}  // namespace rconv
}  // namespace trtfuse

using namespace trtfuse::rconv;

extern "C" int trtfuse_residual_conv_check(int cin, int cout, int8_t const* weights, float const* w_scale,
                                           float const* bias, float x_scale, float r_scale, float out_scale) {
    if (cin <= 0 || cout <= 0 || cin > (1 << 16) || cout > (1 << 16)) return TRTFUSE_RCONV_ERR_SHAPE;
    if (!weights || !w_scale || !bias) return TRTFUSE_RCONV_ERR_NULL;
    if (!good_scale(x_scale) || !good_scale(r_scale) || !good_scale(out_scale)) return TRTFUSE_RCONV_ERR_SCALE;
    for (int i = 0; i < cout; ++i)
        if (!good_scale(w_scale[i]) || !std::isfinite(bias[i])) return TRTFUSE_RCONV_ERR_SCALE;
    for (int64_t i = 0; i < static_cast<int64_t>(cin) * cout; ++i)
        if (weights[i] < -127) return TRTFUSE_RCONV_ERR_WEIGHT;
    return 0;
}

extern "C" int trtfuse_residual_conv_create(int cin, int cout, int8_t const* weights, float const* w_scale,
                                            float const* bias, float x_scale, float r_scale, float out_scale,
                                            int relu, void** handle) {
    if (handle) *handle = nullptr;
    if (!good_scale(r_scale)) return TRTFUSE_RCONV_ERR_SCALE;   // this form always has a residual input
    return trtfuse_conv1x1_create(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale, relu, 1, handle);
}

extern "C" int trtfuse_conv1x1_check(int cin, int cout, int8_t const* weights, float const* w_scale,
                                     float const* bias, float x_scale, float r_scale, float out_scale, int stride) {
    if (stride != 1 && stride != 2) return TRTFUSE_RCONV_ERR_STRIDE;
    // the checks of the residual form; without a residual input (r_scale 0) r_scale takes no part
    return trtfuse_residual_conv_check(cin, cout, weights, w_scale, bias, x_scale, r_scale != 0.f ? r_scale : 1.f,
                                       out_scale);
}

extern "C" int trtfuse_conv1x1_create(int cin, int cout, int8_t const* weights, float const* w_scale,
                                      float const* bias, float x_scale, float r_scale, float out_scale, int relu,
                                      int stride, void** handle) {
    if (!handle) return TRTFUSE_RCONV_ERR_NULL;
    *handle = nullptr;
    if (int st = trtfuse_conv1x1_check(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale, stride))
        return st;
    wgmma_available();   // cache the sm_90a probe now, outside any stream capture of forward()
    cudaGetLastError();
    Layer* L = new Layer;
    std::vector<int8_t> rows;
    if (int st = build_layer(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale, relu, stride, L, &rows)) {
        free_layer(L);
        return st;
    }
    *handle = L;
    return 0;
}

extern "C" int trtfuse_proj_tail_check(int cin, int cout, int8_t const* weights, float const* w_scale,
                                       float const* bias, float x_scale, float r_scale, float out_scale,
                                       int proj_cin, int8_t const* proj_weights, float const* proj_w_scale,
                                       float const* proj_bias, float proj_x_scale, float proj_out_scale,
                                       int proj_stride) {
    if (!good_scale(r_scale)) return TRTFUSE_RCONV_ERR_SCALE;   // the tail has a residual: the projection's output
    if (int st = trtfuse_conv1x1_check(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale, 1)) return st;
    return trtfuse_conv1x1_check(proj_cin, cout, proj_weights, proj_w_scale, proj_bias, proj_x_scale, 0.f,
                                 proj_out_scale, proj_stride);
}

extern "C" int trtfuse_proj_tail_create(int cin, int cout, int8_t const* weights, float const* w_scale,
                                        float const* bias, float x_scale, float r_scale, float out_scale, int relu,
                                        int proj_cin, int8_t const* proj_weights, float const* proj_w_scale,
                                        float const* proj_bias, float proj_x_scale, float proj_out_scale,
                                        int proj_stride, void** handle) {
    if (!handle) return TRTFUSE_RCONV_ERR_NULL;
    *handle = nullptr;
    if (int st = trtfuse_proj_tail_check(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale, proj_cin,
                                         proj_weights, proj_w_scale, proj_bias, proj_x_scale, proj_out_scale,
                                         proj_stride))
        return st;
    wgmma_available();
    cudaGetLastError();
    Layer* L = new Layer;
    L->proj = new Layer;
    std::vector<int8_t> rows, proj_rows;
    int st = build_layer(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale, relu, 1, L, &rows);
    if (st == 0)
        st = build_layer(proj_cin, cout, proj_weights, proj_w_scale, proj_bias, proj_x_scale, 0.f, proj_out_scale, 0,
                         proj_stride, L->proj, &proj_rows);
    if (st == 0) {
        // the fused kernel's weight rows: [projection (its kpad) | tail (its kpad)], as sm90 weight slices
        int const pk = L->proj->kpad, k = pk + L->kpad;
        std::vector<int8_t> fused(static_cast<size_t>(L->npad) * k), img(fused.size());
        for (int row = 0; row < L->npad; ++row) {
            std::copy_n(&proj_rows[static_cast<size_t>(row) * pk], pk, &fused[static_cast<size_t>(row) * k]);
            std::copy_n(&rows[static_cast<size_t>(row) * L->kpad], L->kpad, &fused[static_cast<size_t>(row) * k + pk]);
        }
        pack_weight_slices(fused.data(), L->npad, k, kWeightSliceRows, img.data());
        st = upload(img, &L->w_img_fused);
    }
    if (st != 0) {
        free_layer(L);
        return st;
    }
    *handle = L;
    return 0;
}

extern "C" int trtfuse_conv3x3_check(int cin, int cout, int8_t const* weights, float const* w_scale,
                                     float const* bias, float x_scale, float out_scale, int stride) {
    if (stride != 1 && stride != 2) return TRTFUSE_RCONV_ERR_STRIDE;
    if (cin <= 0 || cout <= 0 || cin > (1 << 16) || cout > (1 << 16)) return TRTFUSE_RCONV_ERR_SHAPE;
    if (!weights) return TRTFUSE_RCONV_ERR_NULL;
    for (int64_t i = 0; i < 9LL * cin * cout; ++i)
        if (weights[i] < -127) return TRTFUSE_RCONV_ERR_WEIGHT;
    // the 1x1 checks of the other fields (its weights argument: the first cin * cout of these, checked above)
    return trtfuse_residual_conv_check(cin, cout, weights, w_scale, bias, x_scale, 1.f, out_scale);
}

extern "C" int trtfuse_conv3x3_create(int cin, int cout, int8_t const* weights, float const* w_scale,
                                      float const* bias, float x_scale, float out_scale, int relu, int stride,
                                      void** handle) {
    if (!handle) return TRTFUSE_RCONV_ERR_NULL;
    *handle = nullptr;
    if (int st = trtfuse_conv3x3_check(cin, cout, weights, w_scale, bias, x_scale, out_scale, stride)) return st;
    wgmma_available();   // cache the sm_90a probe now, outside any stream capture of forward()
    cudaGetLastError();
    Layer* L = new Layer;
    std::vector<int8_t> rows;
    if (int st = build_layer(cin, cout, weights, w_scale, bias, x_scale, 0.f, out_scale, relu, stride, L, &rows, 9)) {
        free_layer(L);
        return st;
    }
    *handle = L;
    return 0;
}

extern "C" int trtfuse_conv3x3_forward(void const* handle, void const* x, void* out, int n, int h, int w, int config,
                                       void* stream) {
    if (!handle || !x || !out) return TRTFUSE_RCONV_ERR_NULL;
    Layer const* L = static_cast<Layer const*>(handle);
    if (L->taps != 9) return TRTFUSE_RCONV_ERR_FUSED;
    if (config < -1 || config >= kNumHaloConfigs) return TRTFUSE_RCONV_ERR_CONFIG;
    if (int st = check_launch(x, nullptr, out, n, h, w, L->stride, -1)) return st;
    return launch_conv3x3(*L, x, out, n, h, w, config, static_cast<cudaStream_t>(stream));
}

extern "C" int trtfuse_conv3x3_select_config(void const* handle, int h, int w) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L || L->taps != 9 || h <= 0 || w <= 0) return TRTFUSE_RCONV_ERR_NULL;
    return halo_heuristic(*L, h, w);
}

extern "C" int trtfuse_conv3x3_num_configs(void) { return kNumHaloConfigs; }

extern "C" char const* trtfuse_conv3x3_config_name(int config) {
    return config >= 0 && config < kNumHaloConfigs ? kHaloConfigs[config].name : nullptr;
}

extern "C" int trtfuse_stem_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                                  float x_scale, float out_scale) {
    if (cin <= 0 || cout <= 0 || cin > kStemMaxCin || cout > kStemN) return TRTFUSE_RCONV_ERR_SHAPE;
    if (!weights) return TRTFUSE_RCONV_ERR_NULL;
    for (int64_t i = 0; i < static_cast<int64_t>(kStemTapsTotal) * cin * cout; ++i)
        if (weights[i] < -127) return TRTFUSE_RCONV_ERR_WEIGHT;
    return trtfuse_residual_conv_check(cin, cout, weights, w_scale, bias, x_scale, 1.f, out_scale);
}

extern "C" int trtfuse_stem_create(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                                   float x_scale, float out_scale, int relu, void** handle) {
    if (!handle) return TRTFUSE_RCONV_ERR_NULL;
    *handle = nullptr;
    if (int st = trtfuse_stem_check(cin, cout, weights, w_scale, bias, x_scale, out_scale)) return st;
    wgmma_available();   // cache the sm_90a probe now, outside any stream capture of forward()
    cudaGetLastError();
    Layer* L = new Layer;
    L->cin = cin;
    L->cout = cout;
    L->kc = 1;
    L->nc = (cout + 31) / 32;
    L->residual = false;
    L->stride = 2;
    L->taps = kStemTapsTotal;
    L->kpad = kStemTaps * 32;
    L->npad = kStemN;
    L->lo = relu ? 0.f : -128.f;
    std::vector<float> const abs =
        rule_constants(cout, L->npad, w_scale, bias, x_scale, 0.f, out_scale, relu, &L->sat);
    // [cout][cin][7][7] -> GEMM rows [cout][ky * 32 + c * 8 + kx] (tap 7 and channels >= cin zero), then the
    // epilogue's row order and the kernel's weight slice
    std::vector<int8_t> by_k(static_cast<size_t>(cout) * L->kpad, 0);
    for (int co = 0; co < cout; ++co)
        for (int c = 0; c < cin; ++c)
            for (int ky = 0; ky < kStemTaps; ++ky)
                for (int kx = 0; kx < kStemTaps; ++kx)
                    by_k[static_cast<size_t>(co) * L->kpad + ky * 32 + c * 8 + kx] =
                        weights[((static_cast<size_t>(co) * cin + c) * kStemTaps + ky) * kStemTaps + kx];
    std::vector<int8_t> const rows = pack_rows(by_k.data(), L->kpad, cout, L->npad, L->kpad);
    std::vector<int8_t> img(rows.size());
    pack_weight_slices(rows.data(), L->npad, L->kpad, kStemN, img.data());
    int st = upload(img, &L->w_img);
    if (st == 0) st = upload(abs, &L->abs);
    if (st != 0) {
        free_layer(L);
        return st;
    }
    *handle = L;
    return 0;
}

extern "C" int trtfuse_stem_forward(void const* handle, void const* x, void* out, int n, int h, int w, int config,
                                    void* stream) {
    if (!handle || !x || !out) return TRTFUSE_RCONV_ERR_NULL;
    Layer const* L = static_cast<Layer const*>(handle);
    if (L->taps != kStemTapsTotal) return TRTFUSE_RCONV_ERR_FUSED;
    if (config < -1 || config >= kNumStemConfigs) return TRTFUSE_RCONV_ERR_CONFIG;
    if (int st = check_launch(x, nullptr, out, n, h, w, 2, -1)) return st;
    return launch_stem(*L, x, out, n, h, w, config, static_cast<cudaStream_t>(stream));
}

extern "C" int trtfuse_stem_num_configs(void) { return kNumStemConfigs; }

extern "C" char const* trtfuse_stem_config_name(int config) {
    return config >= 0 && config < kNumStemConfigs ? kStemConfigs[config].name : nullptr;
}

extern "C" int trtfuse_residual_conv_destroy(void* handle) {
    return free_layer(static_cast<Layer*>(handle));
}

extern "C" int trtfuse_residual_conv_forward(void const* handle, void const* x, void const* r, void* out, int n,
                                             int h, int w, int config, void* stream) {
    if (!handle || !x || !out) return TRTFUSE_RCONV_ERR_NULL;
    Layer const* L = static_cast<Layer const*>(handle);
    if (L->proj || L->taps != 1) return TRTFUSE_RCONV_ERR_FUSED;
    if ((r != nullptr) != L->residual) return TRTFUSE_RCONV_ERR_RESIDUAL;
    if (int st = check_launch(x, r, out, n, h, w, L->stride, config)) return st;
    return forward_plain(*L, x, r, out, n, h, w, config, static_cast<cudaStream_t>(stream));
}

extern "C" int64_t trtfuse_proj_tail_workspace_size(void const* handle, int n, int h, int w) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L || !L->proj || n <= 0 || h <= 0 || w <= 0) return TRTFUSE_RCONV_ERR_NULL;
    int const s = L->proj->stride, ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    int const config = select_config(L->cin, L->cout, n, ho * wo, true, s, L->proj->cin, layer_k_bytes(*L));
    return fuses(*L, config) ? 0 : static_cast<int64_t>(n) * L->nc * ho * wo * 32;
}

extern "C" int trtfuse_proj_tail_select_config(void const* handle, int n, int h, int w) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L || !L->proj || n <= 0 || h <= 0 || w <= 0) return TRTFUSE_RCONV_ERR_NULL;
    int const s = L->proj->stride, ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    return select_config(L->cin, L->cout, n, ho * wo, true, s, L->proj->cin, layer_k_bytes(*L));
}

extern "C" int trtfuse_proj_tail_fuses(void const* handle, int config) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L || !L->proj || config < 0 || config >= kNumConfigs) return 0;
    return fuses(*L, config) ? 1 : 0;
}

extern "C" int trtfuse_proj_tail_forward(void const* handle, void const* x, void const* xp, void* out, int n, int h,
                                         int w, void* workspace, int config, void* stream) {
    if (!handle || !x || !xp || !out) return TRTFUSE_RCONV_ERR_NULL;
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L->proj) return TRTFUSE_RCONV_ERR_FUSED;
    int const s = L->proj->stride;
    if (int st = check_launch(xp, x, out, n, h, w, s, config)) return st;
    int const ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    bool const given = config >= 0;
    if (!given) {
        config = select_config(L->cin, L->cout, n, ho * wo, true, s, L->proj->cin, layer_k_bytes(*L));
        // no workspace (the caller sized it by workspace_size at another batch): the fused kernel where it can run
        if (!workspace && !fuses(*L, config) && fuses(*L, heuristic(layer_k_bytes(*L), true)))
            config = heuristic(layer_k_bytes(*L), true);
    }
    auto const st = static_cast<cudaStream_t>(stream);
    if (fuses(*L, config)) {
        return launch(*L, kProjResidual, operand(x, L->kc, 1, ho, wo, wo), operand(xp, L->proj->kc, s, h, w, wo),
                      nullptr, out, n, ho, wo, config, st);
    }
    // two launches (an sm80 configuration, one that cannot hold the fused weight rows, or the tuner's "separate"):
    // the projection into the workspace, then the tail with it as the residual; both on a given sm80 configuration,
    // else each on its own choice
    if (!workspace) return TRTFUSE_RCONV_ERR_WORKSPACE;
    if (reinterpret_cast<uintptr_t>(workspace) & 15) return TRTFUSE_RCONV_ERR_ALIGN;
    int const each = given && !kConfigs[config].sm90 ? config : -1;
    if (int e = forward_plain(*L->proj, xp, nullptr, workspace, n, h, w, each, st)) return e;
    return forward_plain(*L, x, workspace, out, n, ho, wo, each, st);   // L's own fields are the tail's
}

namespace {
// The configuration next_forward(-1) runs layer L with its next conv on, for a forward input of n x h x w: the
// chained one (kNextConfig) where it can, else the layer's own choice (two launches; kSeparate for a projection +
// tail the tuner runs as two plain layers).
int next_config(Layer const& L, int n, int h, int w) {
    static int const chained = config_by_name(kNextConfig);   // resolved once, not at every forward
    if (chains(L, chained)) return chained;
    int const s = L.proj ? L.proj->stride : 1, ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    return L.proj ? select_config(L.cin, L.cout, n, ho * wo, true, s, L.proj->cin, layer_k_bytes(L))
                  : select_config(L.cin, L.cout, n, ho * wo, true, 1);
}
}  // namespace

extern "C" int trtfuse_next_check(int cin, int cout, int8_t const* weights, float const* w_scale, float const* bias,
                                  float x_scale, float out_scale) {
    return trtfuse_conv1x1_check(cin, cout, weights, w_scale, bias, x_scale, 0.f, out_scale, 1);
}

extern "C" int trtfuse_next_attach(void* handle, int cout, int8_t const* weights, float const* w_scale,
                                   float const* bias, float x_scale, float out_scale, int relu) {
    if (!handle) return TRTFUSE_RCONV_ERR_NULL;
    Layer* L = static_cast<Layer*>(handle);
    // a tail, with or without its projection (stride 1, a residual read or computed), or a stem; not yet chained
    bool const stem = L->taps == kStemTapsTotal;
    if (L->next || (!stem && (L->taps != 1 || !L->residual || L->stride != 1))) return TRTFUSE_RCONV_ERR_NEXT;
    if (int st = trtfuse_next_check(L->cout, cout, weights, w_scale, bias, x_scale, out_scale)) return st;
    Layer* N = new Layer;
    std::vector<int8_t> rows;
    int st = build_layer(L->cout, cout, weights, w_scale, bias, x_scale, 0.f, out_scale, relu, 1, N, &rows);
    // the chained kernel's slice: the first next_n packed rows; none where it cannot chain (L's output wider than one
    // N block, or the next conv's than 128 channels; a stem's next conv wider than its kernel's N, 64): next_forward
    // then takes two launches
    int const next_n = N->nc * 32 <= 64 ? 64 : N->nc * 32 <= 128 && !stem ? 128 : 0;
    if (st == 0 && next_n > 0 && L->nc * 32 <= kWeightSliceRows && N->kpad <= kNextMaxK) {
        // K zero padded to kNextMaxK (k32 chunks are the outer dimension: the padding is the image's tail), so that
        // the chained kernel runs every k32 step with no branch on K between its register-A wgmmas (kernel_sm90.cuh)
        std::vector<int8_t> img(static_cast<size_t>(next_n) * kNextMaxK, 0);
        pack_weight_slices(rows.data(), next_n, N->kpad, next_n, img.data());
        st = upload(img, &L->w_img_next);
        L->next_n = st == 0 ? next_n : 0;
    }
    if (st) {
        free_layer(N);
        return st;
    }
    L->next = N;
    return 0;
}

extern "C" int trtfuse_next_fuses(void const* handle, int config, int n, int h, int w) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (L && L->next && L->taps == kStemTapsTotal)   // a stem: config indexes the stem configurations
        return config < -1 || config >= kNumStemConfigs ? TRTFUSE_RCONV_ERR_CONFIG : stem_chains(*L, config) ? 1 : 0;
    if (!L || !L->next || config < -1 || config >= kNumConfigs) return TRTFUSE_RCONV_ERR_NULL;
    if (config == -1) {
        if (n <= 0 || h <= 0 || w <= 0) return TRTFUSE_RCONV_ERR_SHAPE;
        config = next_config(*L, n, h, w);
    }
    return chains(*L, config) ? 1 : 0;
}

extern "C" int trtfuse_next_forward(void const* handle, void const* x, void const* second, void* out, void* next_out,
                                    int n, int h, int w, void* workspace, int config, void* stream) {
    if (!handle || !x || !out || !next_out) return TRTFUSE_RCONV_ERR_NULL;
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L->next) return TRTFUSE_RCONV_ERR_NEXT;
    if (reinterpret_cast<uintptr_t>(next_out) & 15) return TRTFUSE_RCONV_ERR_ALIGN;
    if (L->taps == kStemTapsTotal) {   // a stem: no second input, a stem configuration
        if (config < -1 || config >= kNumStemConfigs) return TRTFUSE_RCONV_ERR_CONFIG;
        if (int st = check_launch(x, nullptr, out, n, h, w, 2, -1)) return st;
        auto const st = static_cast<cudaStream_t>(stream);
        if (stem_chains(*L, config)) return launch_stem(*L, x, out, n, h, w, config, st, next_out);
        if (int e = launch_stem(*L, x, out, n, h, w, config, st)) return e;
        return forward_plain(*L->next, out, nullptr, next_out, n, halved(halved(h)), halved(halved(w)), -1, st);
    }
    if (!second) return TRTFUSE_RCONV_ERR_NULL;
    int const s = L->proj ? L->proj->stride : 1, ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    // the layer's own input order: a projection + tail reads the block input xp at stride s
    if (int st = L->proj ? check_launch(second, x, out, n, h, w, s, config) : check_launch(x, second, out, n, h, w, 1, config))
        return st;
    auto const st = static_cast<cudaStream_t>(stream);
    int const c = config >= 0 ? config : next_config(*L, n, h, w);
    if (chains(*L, c)) {
        Form const form = L->proj ? kProjResidual : kResidual;
        Operand const xp = L->proj ? operand(second, L->proj->kc, s, h, w, wo) : Operand{};
        return launch(*L, form, operand(x, L->kc, 1, ho, wo, wo), xp, L->proj ? nullptr : second, out, n, ho, wo, c, st,
                      next_out);
    }
    // two launches: the layer as its own forward would run it, then the next conv from its output
    int const e = L->proj ? trtfuse_proj_tail_forward(handle, x, second, out, n, h, w, workspace, config, stream)
                          : trtfuse_residual_conv_forward(handle, x, second, out, n, h, w, config, stream);
    if (e) return e;
    return forward_plain(*L->next, out, nullptr, next_out, n, ho, wo, -1, st);
}

extern "C" int trtfuse_residual_conv_num_configs(void) { return kNumConfigs; }

extern "C" char const* trtfuse_residual_conv_config_name(int config) {
    return config >= 0 && config < kNumConfigs ? kConfigs[config].name : nullptr;
}

extern "C" int trtfuse_residual_conv_config_supported(int config) {
    if (config < 0 || config >= kNumConfigs) return 0;
    return config_supported(config) ? 1 : 0;
}

extern "C" int trtfuse_residual_conv_config_fits(int config, int cin, int cout) {
    if (config < 0 || config >= kNumConfigs || cin <= 0 || cout <= 0) return 0;
    return layer_fits(config, round_up(cin, 32)) ? 1 : 0;
}

extern "C" int trtfuse_residual_conv_select_config(int cin, int cout, int n, int hw) {
    if (cin <= 0 || cout <= 0 || n <= 0 || hw <= 0) return -1;
    return select_config(cin, cout, n, hw, true, 1);
}

extern "C" int trtfuse_residual_conv_load_cache(char const* path) {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    int st = load_cache_locked(path);
    if (st < 0) return st;
    std::string gpu;
    if (!device_name(&gpu)) return static_cast<int>(g_cache.size());   // no GPU: count every entry
    int count = 0;
    for (auto const& e : g_cache) count += e.gpu == gpu;
    return count;
}

extern "C" int trtfuse_residual_conv_wgw_schedule(int m_blocks, int n_blocks, int resident, int balance, int block,
                                                  int cap, int* m_out, int* n_out) {
    if (m_blocks <= 0 || n_blocks <= 0 || resident <= 0 || cap < 0) return TRTFUSE_RCONV_ERR_SHAPE;
    WgwSchedule const s = wgw_schedule(m_blocks, n_blocks, resident, balance != 0);
    if (block == -1) return s.grid;
    if (block < 0 || block >= s.grid) return TRTFUSE_RCONV_ERR_SHAPE;
    if (cap > 0 && (!m_out || !n_out)) return TRTFUSE_RCONV_ERR_NULL;
    WgwTiles const tiles(block, s.grid, m_blocks, n_blocks, s.regular, s.quota, s.rest);
    for (int t = 0; t < tiles.count && t < cap; ++t) {
        m_out[t] = tiles.m_block(t);
        n_out[t] = tiles.n_block(t);
    }
    return tiles.count;
}

extern "C" char const* trtfuse_residual_conv_error_string(int status) {
    switch (status) {
        case 0: return "success";
        case TRTFUSE_RCONV_ERR_NULL: return "a required pointer is NULL";
        case TRTFUSE_RCONV_ERR_SHAPE: return "a dimension is <= 0 or too large";
        case TRTFUSE_RCONV_ERR_SCALE: return "a scale is not finite and > 0 (or a bias is not finite)";
        case TRTFUSE_RCONV_ERR_WEIGHT: return "a weight is outside [-127, 127]";
        case TRTFUSE_RCONV_ERR_CONFIG: return "unknown tile configuration";
        case TRTFUSE_RCONV_ERR_ALIGN: return "x, r or out is not 16-byte aligned";
        case TRTFUSE_RCONV_ERR_CACHE: return "the tuning cache is unreadable or malformed";
        case TRTFUSE_RCONV_ERR_RESIDUAL:
            return "r must be given exactly when the layer has a residual input (created with r_scale > 0); "
                   "a layer created with r_scale = 0 takes r = NULL";
        case TRTFUSE_RCONV_ERR_STRIDE: return "the stride must be 1 or 2";
        case TRTFUSE_RCONV_ERR_FUSED:
            return "a projection + tail layer (trtfuse_proj_tail_create) runs by trtfuse_proj_tail_forward, a 3x3 conv "
                   "(trtfuse_conv3x3_create) by trtfuse_conv3x3_forward, a stem (trtfuse_stem_create) by "
                   "trtfuse_stem_forward, any other layer by trtfuse_residual_conv_forward";
        case TRTFUSE_RCONV_ERR_WORKSPACE:
            return "this GPU or configuration runs the projection and the tail as two launches: pass a workspace of "
                   "trtfuse_proj_tail_workspace_size() bytes";
        case TRTFUSE_RCONV_ERR_FIT:
            return "this sm90 (wgw_*) tile configuration cannot hold this layer's weight slice in shared memory "
                   "(Cin too large): choose an sm80_* configuration, or -1 to pick; a 3x3 conv: this halo_* "
                   "configuration (or, with -1, every one) cannot hold its weight slice (9 Cin x 64 or 128 bytes) and "
                   "halo slots, or a box row of its image (W + 2 at stride 1, ceil(W / 2) + 1 at stride 2) is longer "
                   "than its tile; the stem: its input is wider than 224 (more than the 56 pooled columns its block pools)";
        case TRTFUSE_RCONV_ERR_NEXT:
            return "no next conv attached to this layer, one already attached, or the layer is not a stride-1 tail "
                   "(with or without its projection) or a stem: attach one next conv to a tail or a stem";
        case TRTFUSE_RCONV_ERR_ROW:
            return "the stem reads its input rows by TMA, whose row pitch must be a multiple of 16 bytes: W % 16 == 0 "
                   "(pad the image's width)";
        case TRTFUSE_RCONV_ERR_ARCH:
            return "this tile configuration (wgw_*) uses wgmma and needs the sm_90a build (plugin_build --archs 90a) "
                   "on a compute capability 9.0 GPU (H100/H200); the loaded library/GPU has no sm_90a code";
        default: return status > 0 ? cudaGetErrorString(static_cast<cudaError_t>(status)) : "unknown error";
    }
}
