// A layer's host side: its fields, packed weights and rounding-rule constants on the device, and the device queries
// every launch path shares (cached per device: the launches ask at every forward).
#include "conv_int8/host/layer.h"

#include "common/cuda_check.h"
#include "conv_int8/core/ptx_sm90.cuh"   // kHasWgmma
#include "conv_int8/core/tile_layout.h"
#include "conv_int8/host/config_table.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace trtfuse {
namespace rconv {

// Whether the epilogue's saturating form of the rule (epilogue.cuh) is exact for a constant:
// zero, or a magnitude in [2^-90, 2^100]
bool sat_exact(float v) {
    float const m = std::fabs(v);
    return m == 0.f || (m >= std::ldexp(1.f, -90) && m <= std::ldexp(1.f, 100));
}
bool good_scale(float s) { return std::isfinite(s) && s > 0.f; }

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
                int taps) {
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

}  // namespace rconv
}  // namespace trtfuse
