// The C ABI of the int8 conv library (c_api.h): argument checks, layer creation, the forwards of every family.
// The configurations and their selection: host/config_table.cu; the layers: host/layer.cu; the launches:
// host/launch_conv1x1.cu, host/launch_conv3x3.cu, host/launch_stem.cu.
#include "conv_int8/c_api.h"

#include "common/cuda_check.h"
#include "conv_int8/host/config_table.h"
#include "conv_int8/host/launch.h"
#include "conv_int8/host/layer.h"
#include "conv_int8/host/tuning_cache.h"
#include "conv_int8/core/schedule_sm90.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

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

extern "C" int trtfuse_conv3x3_select_config(void const* handle, int n, int h, int w) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L || L->taps != 9 || n <= 0 || h <= 0 || w <= 0) return TRTFUSE_RCONV_ERR_NULL;
    return select_halo(*L, n, h, w);
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

extern "C" int trtfuse_stem_select_config(void const* handle, int n, int h, int w) {
    Layer const* L = static_cast<Layer const*>(handle);
    if (!L || L->taps != kStemTapsTotal || n <= 0 || h <= 0 || w <= 0) return TRTFUSE_RCONV_ERR_NULL;
    return select_stem(*L, n, h, w);
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
        // the chained kernel runs every k32 step with no branch on K between its register-A wgmmas (conv1x1_sm90.cuh)
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
    if (L && L->next && L->taps == kStemTapsTotal) {   // a stem: config indexes the stem configurations
        if (config < -1 || config >= kNumStemConfigs) return TRTFUSE_RCONV_ERR_CONFIG;
        if (config == -1 && (n <= 0 || h <= 0 || w <= 0)) return TRTFUSE_RCONV_ERR_SHAPE;
        return stem_chains(*L, config >= 0 ? config : select_stem(*L, n, h, w)) ? 1 : 0;
    }
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
        int const c = config >= 0 ? config : select_stem(*L, n, h, w);
        if (stem_chains(*L, c)) return launch_stem(*L, x, out, n, h, w, c, st, next_out);
        if (int e = launch_stem(*L, x, out, n, h, w, c, st)) return e;
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

extern "C" int trtfuse_residual_conv_load_cache(char const* path) { return load_cache(path); }

extern "C" int trtfuse_residual_conv_cache_lookup(char const* gpu, char const* family, int cin, int cout, int hw, int n,
                                                  int residual, int stride, int proj_cin, char* name, int cap) {
    if (!gpu || !family || !name || cap <= 0) return TRTFUSE_RCONV_ERR_NULL;
    std::string const config = cache_lookup(gpu, family, cin, cout, hw, n, residual != 0, stride, proj_cin);
    if (static_cast<int>(config.size()) >= cap) return TRTFUSE_RCONV_ERR_SHAPE;
    std::memcpy(name, config.c_str(), config.size() + 1);
    return static_cast<int>(config.size());
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
