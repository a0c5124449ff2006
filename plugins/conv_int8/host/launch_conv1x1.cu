// Launches of the 1x1 conv (kConfigs): the plain and residual forms, the projection + tail in one kernel, and the
// chained next conv (kernels/conv1x1_sm80.cuh, kernels/conv1x1_sm90.cuh).
#include "conv_int8/host/launch.h"

#include "common/cuda_check.h"
#include "conv_int8/c_api.h"
#include "conv_int8/core/out_map.h"
#include "conv_int8/core/schedule_sm90.h"
#include "conv_int8/host/config_table.h"

#include <algorithm>

namespace trtfuse {
namespace rconv {

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
           int config, cudaStream_t stream, void* next_out) {
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

}  // namespace rconv
}  // namespace trtfuse
