// Tile configurations, dispatch and the C ABI of the fused int8 residual conv.
#include "common/cuda_check.h"
#include "residual_conv/residual_conv.h"
#include "residual_conv/residual_conv_kernel.cuh"
#include "residual_conv/residual_conv_out_map.h"
#include "residual_conv/residual_conv_wgmma.cuh"
#include "residual_conv/residual_conv_wgmma_ws.cuh"
#include "residual_conv/residual_conv_wgw_tiles.h"
#include "residual_conv/tuning_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace trtfuse {
namespace rconv {
namespace {

// Candidates the tuner times. Names are what the cache stores (stable across reorderings of this list).
//                 BM   BN  BK  WM  WN  STAGES MIN_BLOCKS
using C0 = TileConfig<64, 128, 64, 32, 32, 3, 2>;   // the reference design: 8 warps, 2 x 4
using C1 = TileConfig<64, 64, 64, 32, 32, 3, 4>;    // 4 warps, 2 x 2: many small blocks, many bytes in flight
using C2 = TileConfig<64, 64, 64, 32, 32, 4, 4>;    // ... one stage deeper
using C3 = TileConfig<128, 128, 64, 64, 32, 3, 1>;  // 8 warps, 2 x 4: B fragments reused twice as often
using C4 = TileConfig<128, 64, 64, 32, 32, 3, 2>;   // 8 warps, 4 x 2
using C5 = TileConfig<64, 256, 64, 32, 64, 3, 1>;   // 8 warps, 2 x 4: x read once for Cout <= 256
using C6 = TileConfig<64, 64, 32, 32, 32, 4, 4>;    // 4 warps, thin k stages
using C7 = TileConfig<128, 128, 64, 64, 32, 2, 2>;  // 8 warps, double buffered, register capped
using C8 = TileConfig<64, 64, 64, 32, 32, 3, 6>;    // C1 capped at 85 registers: 6 blocks per SM
using C9 = TileConfig<64, 128, 64, 32, 32, 3, 3>;   // C0 capped at 85 registers: 3 blocks per SM
using C10 = TileConfig<128, 128, 64, 64, 32, 3, 2>; // C7 one stage deeper: a tile's residual 2 tiles ahead
using C11 = TileConfig<128, 128, 32, 64, 32, 4, 2>; // thin stages, 3 stages of lead time
using C12 = TileConfig<128, 64, 64, 64, 32, 3, 3>;  // 4 warps with 64 x 32 warp tiles, 3 blocks per SM
// v6 kernels (residual_conv_kernel_v6: one (image, hw) per thread per tile, no MUFU divisions, magic-start
// accumulators). Opt-in: only the tuning cache selects them; the heuristic still picks v5 configs.
//                 BM   BN  BK  WM  WN  STAGES MIN_BLOCKS V6
using V0 = TileConfig<128, 128, 64, 64, 32, 2, 2, true>;   // twin of C7 (the default)
using V1 = TileConfig<128, 128, 64, 64, 32, 3, 2, true>;   // twin of C10
using V2 = TileConfig<64, 128, 64, 32, 32, 3, 2, true>;    // twin of C0
using V3 = TileConfig<64, 64, 64, 32, 32, 3, 4, true>;     // twin of C1 (Cout <= 64)
using V4 = TileConfig<64, 64, 64, 32, 32, 3, 6, true>;     // twin of C8
using V5 = TileConfig<64, 256, 64, 32, 64, 3, 1, true>;    // twin of C5: x read once for Cout <= 256
using V6c = TileConfig<128, 128, 128, 64, 32, 3, 1, true>; // res4/res5: BK 128 halves the barriers per k
using V7 = TileConfig<128, 128, 128, 64, 32, 2, 2, true>;  // ... double buffered, 2 blocks per SM
using V8 = TileConfig<128, 256, 64, 64, 64, 2, 1, true>;   // res5: 64 x 64 warp tiles, fewer ldmatrix per mma
using V9 = TileConfig<64, 128, 64, 32, 32, 3, 3, true>;    // twin of C9: 3 blocks per SM (85 registers)
// v6 + PERM: 4 consecutive channels per thread in the epilogue (weights permuted in 16-channel groups)
using P0 = TileConfig<128, 128, 64, 64, 32, 2, 2, true, true>;
using P1 = TileConfig<64, 128, 64, 32, 32, 3, 2, true, true>;
using P2 = TileConfig<64, 64, 64, 32, 32, 3, 4, true, true>;
using P3 = TileConfig<64, 256, 64, 32, 64, 3, 1, true, true>;
using P4 = TileConfig<128, 128, 128, 64, 32, 3, 1, true, true>;
// wgmma (sm_90a, residual_conv_wgmma.cuh): warpgroup MMAs from shared memory, v6 loaders/epilogue (PERM).
// Opt-in like v6 (only the tuning cache selects them) and refused where the loaded module is not sm_90a.
// Streamed (weights per k stage like x; v6 tile order):
//                   BM   BN  BK STAGES MIN_BLOCKS
using W0 = WgTileConfig<128, 256, 64, 3, 1>;          // 2 warpgroups x m64n256
using W1 = WgTileConfig<128, 128, 64, 3, 2>;          // 2 warpgroups x m64n128, 2 blocks per SM
// Weight stationary (the block's BN x K weight slice stays in shared memory; refused where it does not fit):
//                   BM   BN  BK STAGES MIN_BLOCKS WSTAT RBUF
using S0 = WgTileConfig<128, 256, 64, 4, 1, true, 2>;   // res5: 128 KB weights + 32 KB x + 64 KB residual
using S1 = WgTileConfig<128, 256, 64, 3, 1, true, 2>;
using S2 = WgTileConfig<128, 128, 64, 4, 2, true, 3>;   // res3/res4: 2 blocks per SM
using S3 = WgTileConfig<128, 128, 64, 3, 2, true, 2>;
using S4 = WgTileConfig<128, 256, 64, 4, 1, true, 3>;   // res3/res4: residual 3 tiles deep
// Independent warpgroups (residual_conv_kernel_wgmma_wgi): weight stationary, each warpgroup its own 64-row tiles
//                    BN  BK STAGES RBUF
using I0 = WgiTileConfig<256, 64, 4, 2>;   // res5: 128 KB weights + 2 x (16 KB x + 32 KB residual)
using I1 = WgiTileConfig<256, 64, 3, 3>;   // res3/res4
using I2 = WgiTileConfig<128, 64, 4, 3>;
// Warp specialized (residual_conv_kernel_wgmma_ws): weight stationary, 2 consumer warpgroups (64-row tiles each)
// fed by a producer warpgroup; x slots and residual buffers per consumer. res5: 128 KB weights + 2 x (x + residual)
//                       BN  BK STAGES RBUF
using Q0 = WgwTileConfig<256, 64, 4, 2>;    // 2 x (16 KB x + 32 KB residual)
using Q1 = WgwTileConfig<256, 128, 2, 2>;   // 4 wgmmas per stage
using Q2 = WgwTileConfig<256, 64, 4, 2, true>;    // SPLIT: 2 producer warps per consumer, each x and residual
using Q3 = WgwTileConfig<256, 128, 2, 2, true>;
using Q4 = WgwTileConfig<256, 64, 4, 2, true, true>;   // + PINGPONG: the consumers take turns on the tensor cores
// 3 residual buffers per consumer (res2-res4; res5's weight slice leaves no room): a TMA-stored tile's buffer is
// released one tile late (after the next tile's wgmmas); a third buffer keeps the producers a tile further ahead
using Q5 = WgwTileConfig<256, 128, 2, 3, true>;
// PINGPONG with one x ring for both consumers (SHARED): the same 32 KB, but the consumer on the tensor cores may
// have all of it in flight (per-consumer rings left it 4 stages: at res5 its wgmmas waited for x)
using Q6 = WgwTileConfig<256, 64, 8, 2, true, true, true, true>;
using Q7 = WgwTileConfig<256, 128, 4, 2, true, true, true, true>;
struct ConfigInfo {
    char const* name;
    int bm, bn, threads, smem;
    void (*kernel)(Params);
    bool wgmma = false;   // needs the sm_90a module (see wgmma_available)
    bool wstat = false;   // weight stationary: per-layer shared memory and fit rule (see layer_fits)
    int bk = 0, load_ahead = 0, rbuf = 0;
    int (*smem_bytes)(int k_tiles) = nullptr;
    bool wgw = false;       // the wgw kernel: TMA output stores (Params::out_map), the packed weight slices
                            // (Params::w_img), the wgw tile schedule
    bool balance = false;   // wgw with PINGPONG: the schedule may add extra blocks (residual_conv_wgw_tiles.h)
};

template <class C>
constexpr ConfigInfo info(char const* name) {
    if constexpr (C::V6) return {name, C::BM, C::BN, C::THREADS, C::SMEM, residual_conv_kernel_v6<C>};
    else return {name, C::BM, C::BN, C::THREADS, C::SMEM, residual_conv_kernel<C>};
}
template <class C>
int wgmma_smem(int k_tiles) { return wgmma_smem_bytes<C>(k_tiles); }
template <class C>
constexpr ConfigInfo info_wgi(char const* name) {
    return {name, C::BM, C::BN, C::THREADS, C::SMEM, residual_conv_kernel_wgmma_wgi<C>, true, true, C::BK,
            C::LOAD_AHEAD, C::RBUF, wgmma_smem<C>};
}
template <class C>
int wgw_smem(int k_tiles) { return wgw_smem_bytes<C>(k_tiles); }
template <class C>
constexpr ConfigInfo info_wgw(char const* name) {   // load_ahead 0: residual buffers independent of K
    static_assert(C::BN == 256, "a layer packs its wgw weight image (Layer::w_img) for BN 256 only");
    return {name, C::BM, C::BN, C::THREADS, C::SMEM, residual_conv_kernel_wgmma_ws<C>, true, true, C::BK, 0, C::RBUF,
            wgw_smem<C>, true, C::PINGPONG};
}
template <class C>
constexpr ConfigInfo info_wgmma(char const* name) {
    return {name, C::BM, C::BN, C::THREADS, C::SMEM, residual_conv_kernel_wgmma<C>, true, C::WSTAT, C::BK,
            C::LOAD_AHEAD, C::RBUF, wgmma_smem<C>};
}
constexpr int kMaxSmem = 227 * 1024;   // dynamic shared memory per block (sm_90)

ConfigInfo const kConfigs[] = {
    info<C0>("64x128x64_w32x32_s3"), info<C1>("64x64x64_w32x32_s3"),   info<C2>("64x64x64_w32x32_s4"),
    info<C3>("128x128x64_w64x32_s3"), info<C4>("128x64x64_w32x32_s3"), info<C5>("64x256x64_w32x64_s3"),
    info<C6>("64x64x32_w32x32_s4"),  info<C7>("128x128x64_w64x32_s2"),
    info<C8>("64x64x64_w32x32_s3_b6"), info<C9>("64x128x64_w32x32_s3_b3"),
    info<C10>("128x128x64_w64x32_s3_b2"), info<C11>("128x128x32_w64x32_s4_b2"), info<C12>("128x64x64_w64x32_s3_b3"),
    info<V0>("v6_128x128x64_w64x32_s2"), info<V1>("v6_128x128x64_w64x32_s3_b2"), info<V2>("v6_64x128x64_w32x32_s3"),
    info<V3>("v6_64x64x64_w32x32_s3"), info<V4>("v6_64x64x64_w32x32_s3_b6"), info<V5>("v6_64x256x64_w32x64_s3"),
    info<V6c>("v6_128x128x128_w64x32_s3"), info<V7>("v6_128x128x128_w64x32_s2_b2"),
    info<V8>("v6_128x256x64_w64x64_s2"), info<V9>("v6_64x128x64_w32x32_s3_b3"),
    // (128x128 at 3 blocks per SM spills 188 bytes at the 85-register cap: not offered)
    info<P0>("v6p_128x128x64_w64x32_s2"), info<P1>("v6p_64x128x64_w32x32_s3"), info<P2>("v6p_64x64x64_w32x32_s3"),
    info<P3>("v6p_64x256x64_w32x64_s3"), info<P4>("v6p_128x128x128_w64x32_s3"),
    info_wgmma<W0>("wg_128x256x64_s3"), info_wgmma<W1>("wg_128x128x64_s3_b2"),
    info_wgmma<S0>("wgs_128x256x64_s4_r2"), info_wgmma<S1>("wgs_128x256x64_s3_r2"), info_wgmma<S2>("wgs_128x128x64_s4_r3_b2"),
    info_wgmma<S3>("wgs_128x128x64_s3_r2_b2"), info_wgmma<S4>("wgs_128x256x64_s4_r3"),
    info_wgi<I0>("wgi_64x256x64_s4_r2"), info_wgi<I1>("wgi_64x256x64_s3_r3"), info_wgi<I2>("wgi_64x128x64_s4_r3"),
    info_wgw<Q0>("wgw_64x256x64_s4_r2"), info_wgw<Q1>("wgw_64x256x128_s2_r2"),
    info_wgw<Q2>("wgw_64x256x64_s4_r2_p2"), info_wgw<Q3>("wgw_64x256x128_s2_r2_p2"),
    info_wgw<Q4>("wgw_64x256x64_s4_r2_p2_pp"), info_wgw<Q5>("wgw_64x256x128_s2_r3_p2"),
    info_wgw<Q6>("wgw_64x256x64_s8_r2_p2_pp_sh"), info_wgw<Q7>("wgw_64x256x128_s4_r2_p2_pp_sh"),
};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

struct Layer {
    int cin, cout, kc, nc, kpad, npad;
    float lo;          // lower clamp: 0 with ReLU, -128 without
    int8_t* w = nullptr;
    int8_t* w_perm = nullptr;   // w with rows permuted in 16-channel groups (v6 PERM configs)
    float* abs = nullptr;   // [6][npad]: a, b, s of the rounding rule, then the same times 2^-8
    bool sat = false;       // the wgmma epilogue may use its saturating form (see sat_exact)
    int8_t* w_img = nullptr;   // [npad * kpad]: w_perm packed for the wgw kernels (BN 256)
};

int round_up(int v, int m) { return (v + m - 1) / m * m; }

// Whether the wgmma epilogue's saturating form of the rule (residual_conv_wgmma.cuh) is exact for a constant:
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

bool config_supported(int config) { return !kConfigs[config].wgmma || wgmma_available(); }

// Shared memory of `config` for a layer with kc input slabs (weight stationary: the weight slice grows with K).
int config_smem(int config, int kc) {
    ConfigInfo const& C = kConfigs[config];
    if (!C.wstat) return C.smem;
    return C.smem_bytes((kc * 32 + C.bk - 1) / C.bk);
}
// Whether `config` can run a layer with kc input slabs: weight-stationary configs need the weight slice in shared
// memory and enough residual buffers for the tile's k stages ((RBUF - 1) * k_tiles >= LOAD_AHEAD: a tile's
// residual is fetched LOAD_AHEAD stages before it is computed, into the buffer of the tile RBUF earlier).
bool layer_fits(int config, int kc) {
    ConfigInfo const& C = kConfigs[config];
    if (!C.wstat) return true;
    int k_tiles = (kc * 32 + C.bk - 1) / C.bk;
    return config_smem(config, kc) <= kMaxSmem && (C.rbuf - 1) * k_tiles >= C.load_ahead;
}

int config_by_name(std::string const& name) {
    for (int i = 0; i < kNumConfigs; ++i)
        if (name == kConfigs[i].name) return i;
    return -1;
}

// Without a cache entry (docs/residual_conv.md has the measurements behind it).
int heuristic(int cout, int64_t m, int sms) {
    int coutp = round_up(cout, 32);
    (void)m; (void)sms;
    // 128 x 128 double buffered was the fastest at every ResNet-50 shape and batch in the H100 runs
    return config_by_name(coutp <= 64 ? "64x64x64_w32x32_s3" : "128x128x64_w64x32_s2");
}

int select_config(int cin, int cout, int n, int hw) {
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        cudaGetLastError();
        return heuristic(cout, static_cast<int64_t>(n) * hw, 132);
    }
    {
        std::lock_guard<std::mutex> lock(g_cache_mu);
        if (!g_cache_loaded) load_cache_locked(nullptr);
        if (CacheEntry const* e = lookup(g_cache, prop.name, cin, cout, hw, n)) {
            int c = config_by_name(e->config);
            // a wgmma entry without sm_90a, or one that cannot hold this layer: the heuristic
            if (c >= 0 && config_supported(c) && layer_fits(c, (cin + 31) / 32)) return c;
        }
    }
    return heuristic(cout, static_cast<int64_t>(n) * hw, prop.multiProcessorCount);
}

// Blocks of `config` that fit on the whole current GPU at once (SMs x blocks per SM) with `smem` bytes of dynamic
// shared memory. Also raises the kernel's dynamic shared-memory limit (weight-stationary configs: to the maximum,
// their size depends on the layer); both are cached per (device, config) where the size is fixed.
int resident_blocks(int config, int smem, int* out) {
    static std::mutex mu;
    static int cache[64][kNumConfigs] = {};
    static bool attr_set[64][kNumConfigs] = {};
    int dev = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&dev));
    ConfigInfo const& C = kConfigs[config];
    bool const fixed = !C.wstat;
    bool need_attr = true;
    if (dev < 64) {
        std::lock_guard<std::mutex> lock(mu);
        if (fixed && cache[dev][config] > 0) { *out = cache[dev][config]; return 0; }
        need_attr = !attr_set[dev][config];
    }
    if (need_attr) {
        TRTFUSE_CUDA_RETURN(cudaFuncSetAttribute(C.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 fixed ? C.smem : kMaxSmem));
        if (dev < 64) {
            std::lock_guard<std::mutex> lock(mu);
            attr_set[dev][config] = true;
        }
    }
    int per_sm = 0, sms = 0;
    TRTFUSE_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, C.kernel, C.threads, smem));
    TRTFUSE_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (per_sm <= 0) return static_cast<int>(cudaErrorInvalidConfiguration);
    *out = per_sm * sms;
    if (dev < 64 && fixed) {
        std::lock_guard<std::mutex> lock(mu);
        cache[dev][config] = *out;
    }
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
    if (!handle) return TRTFUSE_RCONV_ERR_NULL;
    *handle = nullptr;
    if (int st = trtfuse_residual_conv_check(cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale))
        return st;
    wgmma_available();   // cache the sm_90a probe now, outside any stream capture of forward()
    cudaGetLastError();
    Layer L;
    L.cin = cin;
    L.cout = cout;
    L.kc = (cin + 31) / 32;
    L.nc = (cout + 31) / 32;
    L.kpad = round_up(L.kc * 32, 128);   // every BK divides 128: the B loader needs no K predicate
    L.npad = round_up(L.nc * 32, 256);   // every BN divides 256: no N predicate
    L.lo = relu ? 0.f : -128.f;
    std::vector<int8_t> w(static_cast<size_t>(L.npad) * L.kpad, 0);
    std::vector<float> abs(6 * static_cast<size_t>(L.npad), 0.f);   // zero in the padding: padded channels -> 0
    // The rounding rule's constants, each an fp32 operation in this order (docs/residual_conv.md).
    float const inv_out = 1.0f / out_scale;
    for (int n = 0; n < cout; ++n) {
        for (int k = 0; k < cin; ++k) w[static_cast<size_t>(n) * L.kpad + k] = weights[static_cast<size_t>(n) * cin + k];
        float alpha = x_scale * w_scale[n];
        abs[n] = alpha * inv_out;
        abs[L.npad + n] = bias[n] * inv_out;
        abs[2 * L.npad + n] = r_scale * inv_out;
    }
    L.sat = relu != 0;
    for (size_t i = 0; i < 3 * static_cast<size_t>(L.npad); ++i) {
        L.sat = L.sat && sat_exact(abs[i]);
        abs[3 * static_cast<size_t>(L.npad) + i] = std::ldexp(abs[i], -8);   // exact for these magnitudes
    }
    // PERM copy: packed row 16*grp + t*8 + 2*tig + e holds channel 16*grp + 4*tig + 2*t + e (t, e in {0,1},
    // tig in 0..3), so that an mma.sync lane's C columns of n8 tiles 2k, 2k+1 are 4 consecutive channels.
    std::vector<int8_t> w_perm(w.size(), 0);
    for (int row = 0; row < L.npad; ++row) {
        int p = row & 15, t = p >> 3, tig = (p & 7) >> 1, e = p & 1;
        int ch = (row & ~15) + 4 * tig + 2 * t + e;
        std::copy_n(&w[static_cast<size_t>(ch) * L.kpad], L.kpad, &w_perm[static_cast<size_t>(row) * L.kpad]);
    }
    std::vector<int8_t> w_img(w.size());
    wgw_pack_weights(w_perm.data(), L.npad, L.kpad, 256, w_img.data());
    cudaError_t e = cudaMalloc(&L.w, w.size());
    if (e == cudaSuccess) e = cudaMalloc(&L.w_perm, w_perm.size());
    if (e == cudaSuccess) e = cudaMalloc(&L.w_img, w_img.size());
    if (e == cudaSuccess) e = cudaMalloc(&L.abs, abs.size() * sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(L.w, w.data(), w.size(), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(L.w_perm, w_perm.data(), w_perm.size(), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(L.w_img, w_img.data(), w_img.size(), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(L.abs, abs.data(), abs.size() * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(L.w);
        cudaFree(L.w_perm);
        cudaFree(L.w_img);
        cudaFree(L.abs);
        return static_cast<int>(e);
    }
    *handle = new Layer(L);
    return 0;
}

extern "C" int trtfuse_residual_conv_destroy(void* handle) {
    if (!handle) return 0;
    Layer* L = static_cast<Layer*>(handle);
    cudaError_t e1 = cudaFree(L->w), e2 = cudaFree(L->abs), e3 = cudaFree(L->w_perm), e4 = cudaFree(L->w_img);
    delete L;
    return e1 ? e1 : e2 ? e2 : e3 ? e3 : e4;
}

extern "C" int trtfuse_residual_conv_forward(void const* handle, void const* x, void const* r, void* out, int n,
                                             int h, int w, int config, void* stream) {
    if (!handle || !x || !r || !out) return TRTFUSE_RCONV_ERR_NULL;
    if (n <= 0 || h <= 0 || w <= 0 || static_cast<int64_t>(h) * w > (1 << 24)) return TRTFUSE_RCONV_ERR_SHAPE;
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(r) | reinterpret_cast<uintptr_t>(out)) & 15)
        return TRTFUSE_RCONV_ERR_ALIGN;
    if (config < -1 || config >= kNumConfigs) return TRTFUSE_RCONV_ERR_CONFIG;
    Layer const* L = static_cast<Layer const*>(handle);
    int const hw = h * w;
    int64_t const M = static_cast<int64_t>(n) * hw;
    if (M >= (int64_t(1) << 31) - 256) return TRTFUSE_RCONV_ERR_SHAPE;
    if (config < 0) config = select_config(L->cin, L->cout, n, hw);
    if (!config_supported(config)) return TRTFUSE_RCONV_ERR_ARCH;
    if (!layer_fits(config, L->kc)) return TRTFUSE_RCONV_ERR_FIT;
    ConfigInfo const& C = kConfigs[config];
    int const smem = config_smem(config, L->kc);

    Params p;
    p.x = static_cast<int8_t const*>(x);
    p.r = static_cast<int8_t const*>(r);
    p.out = static_cast<int8_t*>(out);
    p.w = L->w;
    p.w_perm = L->w_perm;
    p.a = L->abs;
    p.b = L->abs + L->npad;
    p.s = L->abs + 2 * L->npad;
    p.a8 = L->abs + 3 * L->npad;
    p.b8 = L->abs + 4 * L->npad;
    p.s8 = L->abs + 5 * L->npad;
    p.lo = L->lo;
    p.small_acc = 16256LL * L->cin < (1LL << 22);   // 128 * 127 * Cin bounds |acc|
    p.sat = L->sat;
    p.M = static_cast<int>(M);
    p.HW = hw;
    p.Kc = L->kc;
    p.Kpad = L->kpad;
    p.Nc = L->nc;
    p.n_blocks = (L->nc * 32 + C.bn - 1) / C.bn;
    p.hw_div = trtfuse::FastDivmod(hw);
    p.nb_div = trtfuse::FastDivmod(p.n_blocks);
    int64_t tiles = (M + C.bm - 1) / C.bm * p.n_blocks;
    if (tiles >= (int64_t(1) << 31)) return TRTFUSE_RCONV_ERR_SHAPE;
    int resident = 0;
    if (int st = resident_blocks(config, smem, &resident)) return st;
    // Persistent grid: every resident block slot gets a block, each walks tiles with a grid stride.
    int64_t blocks = std::min<int64_t>(tiles, resident);
    if (C.wgw) {   // its own schedule (residual_conv_wgw_tiles.h), the packed weight slices, the output tensor map
        WgwSchedule const s = wgw_schedule(static_cast<int>((M + C.bm - 1) / C.bm), p.n_blocks, resident, C.balance);
        blocks = s.grid;
        p.wgw_regular = s.regular;
        p.wgw_quota = s.quota;
        p.wgw_rest = s.rest;
        p.w_img = L->w_img;
        if (int st = encode_out_map(p, n, C.bn)) return st;
    } else if (C.wstat) {   // a multiple of n_blocks: each block keeps one N block (at least one block per N block)
        blocks = std::max<int64_t>(1, resident / p.n_blocks) * p.n_blocks;
        blocks = std::min<int64_t>(blocks, tiles);
    }
    C.kernel<<<static_cast<unsigned>(blocks), C.threads, smem, static_cast<cudaStream_t>(stream)>>>(p);
    TRTFUSE_LAUNCH_CHECK();
    return 0;
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
    return layer_fits(config, (cin + 31) / 32) ? 1 : 0;
}

extern "C" int trtfuse_residual_conv_select_config(int cin, int cout, int n, int hw) {
    if (cin <= 0 || cout <= 0 || n <= 0 || hw <= 0) return -1;
    return select_config(cin, cout, n, hw);
}

extern "C" int trtfuse_residual_conv_load_cache(char const* path) {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    int st = load_cache_locked(path);
    if (st < 0) return st;
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        cudaGetLastError();
        return static_cast<int>(g_cache.size());   // no GPU: count every entry
    }
    int count = 0;
    for (auto const& e : g_cache) count += e.gpu == prop.name;
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
        case TRTFUSE_RCONV_ERR_FIT:
            return "this weight-stationary tile configuration cannot hold this layer (weight slice or residual "
                   "buffers vs. K): choose another configuration";
        case TRTFUSE_RCONV_ERR_ARCH:
            return "this tile configuration uses wgmma and needs the sm_90a build (plugin_build --archs 90a) "
                   "on a compute capability 9.0 GPU (H100/H200); the loaded library/GPU has no sm_90a code";
        default: return status > 0 ? cudaGetErrorString(static_cast<cudaError_t>(status)) : "unknown error";
    }
}
