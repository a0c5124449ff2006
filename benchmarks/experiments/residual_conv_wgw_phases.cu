// Where a wgw consumer tile's time goes: clock64() at the phases of each consumer's first 64 tiles (the kernel's
// WGW_TRACE hook, compiled in only here), averaged over tiles 1.. of every block, for the offered wgw configs at
// the four ResNet-50 conv3 shapes, batch 2048. Timing only: constant inputs, zero epilogue constants; the
// outputs are not checked (tests/test_residual_conv.py does that).
//   nvcc -std=c++17 -O3 -arch=sm_90a -Iplugins -o /tmp/wgw_phases benchmarks/experiments/residual_conv_wgw_phases.cu
//   /tmp/wgw_phases            (on an H100; one line per config and shape)
#define TRTFUSE_WGW_TRACE
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "conv_int8/kernels/conv1x1_sm90.cuh"
#include "conv_int8/core/out_map.h"
#include "conv_int8/core/schedule_sm90.h"

using namespace trtfuse;
using namespace trtfuse::rconv;

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e = (x);                                                           \
        if (e != cudaSuccess) {                                                        \
            std::printf("%s: %s\n", #x, cudaGetErrorString(e));                        \
            std::exit(1);                                                              \
        }                                                                              \
    } while (0)

// Where a launch's time goes, on one clock for all SMs (built with TRTFUSE_WGW_TRACE_GLOBALTIMER: the trace is
// %globaltimer, ns): the launch as the events see it, the span from the first block's start to the last consumer's
// end, how late the blocks start, a consumer's first tile (from its block's start: x stage 0 landed, wgmmas done,
// stored), the steady period (tiles 1..), the tiles per consumer (most) and the last tile (start to consumer end).
void timeline(char const* name, int cin, int cout, int hw, int batch, float ms, int grid,
              std::vector<long long> const& h, long long const* d_span) {
    std::vector<long long> sp(size_t(grid) * 4);
    CK(cudaMemcpy(sp.data(), d_span, sp.size() * 8, cudaMemcpyDeviceToHost));
    long long t0 = sp[0], t_end = 0, start_max = 0;
    for (int b = 0; b < grid; ++b) t0 = std::min(t0, sp[b * 4]);
    double x0 = 0, mma0 = 0, st0 = 0, period = 0, last = 0;
    int n_first = 0, n_period = 0, most = 0, n_last = 0;
    for (int b = 0; b < grid; ++b) {
        start_max = std::max(start_max, sp[b * 4] - t0);
        for (int c = 0; c < 2; ++c) {
            long long const* t = &h[size_t((b * 2 + c) * 64) * 8];
            long long const end = sp[b * 4 + 1 + c];
            t_end = std::max(t_end, end - t0);
            int tiles = 0;
            while (tiles < 64 && t[tiles * 8] != 0) ++tiles;
            most = std::max(most, tiles);
            if (tiles == 0) continue;
            x0 += double(t[1] - sp[b * 4]);
            mma0 += double(t[3] - sp[b * 4]);
            st0 += double(t[6] - sp[b * 4]);
            ++n_first;
            for (int u = 1; u + 1 < tiles; ++u, ++n_period) period += double(t[(u + 1) * 8] - t[u * 8]);
            if (tiles < 64) {
                last += double(end - t[(tiles - 1) * 8]);
                ++n_last;
            }
        }
    }
    auto us = [](double ns, int n) { return n ? ns / n / 1e3 : 0.0; };
    std::printf("%-26s %4d->%-4d HW %-4d batch %-4d: events %.1f us | span %.1f us, blocks start within %.1f us | "
                "first tile from block start: x ready %.2f, wgmmas done %.2f, stored %.2f us | period %.2f us x %d "
                "tiles (most) | last tile %.2f us\n",
                name, cin, cout, hw, batch, ms * 1e3, t_end / 1e3, start_max / 1e3, us(x0, n_first),
                us(mma0, n_first), us(st0, n_first), us(period, n_period), most, us(last, n_last));
}

template <class Cfg>
void run(char const* name, int cin, int cout, int hw, int batch) {
    int const Kc = cin / 32, Nc = cout / 32, Kpad = (cin + 127) / 128 * 128, Npad = (cout + 255) / 256 * 256;
    size_t const xb = size_t(batch) * Kc * hw * 32, rb = size_t(batch) * Nc * hw * 32, wb = size_t(Npad) * Kpad;
    int8_t *x, *r, *o, *w;
    float* f;
    long long* trace;
    CK(cudaMalloc(&x, xb));
    CK(cudaMalloc(&r, rb));
    CK(cudaMalloc(&o, rb));
    CK(cudaMalloc(&w, wb));
    CK(cudaMalloc(&f, Npad * 24));
    CK(cudaMemset(x, 3, xb));
    CK(cudaMemset(r, 5, rb));
    CK(cudaMemset(w, 1, wb));
    CK(cudaMemset(f, 0, Npad * 24));
    Params p{};
    p.x = Operand{x, Kc, 1, hw, 0};
    p.r = r; p.out = o; p.w = w;
    p.rule = Rule{f, f + Npad, f + 2 * Npad, f + 3 * Npad, f + 4 * Npad, f + 5 * Npad,
                  0.f, cin <= 258, 1};   // ReLU: the saturating epilogue
    p.M = batch * hw; p.HW = hw; p.Kpad = Kpad; p.Nc = Nc;
    p.ow_div = FastDivmod(hw);
    p.n_blocks = (Nc * 32 + Cfg::BN - 1) / Cfg::BN;
    p.hw_div = FastDivmod(hw);
    p.nb_div = FastDivmod(p.n_blocks);
    if (int st = encode_out_map(p, batch, Cfg::BN)) {
        std::printf("encode_out_map: %d\n", st);
        std::exit(1);
    }
    p.w_img = w;   // the image of constant weights is the same constant
    int const k_tiles = (Kc * 32 + Cfg::BK - 1) / Cfg::BK, smem = wgw_smem_bytes<Cfg>(k_tiles);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // as the library launches it (one block per SM)
    WgwSchedule const sched = wgw_schedule((p.M + 63) / 64, p.n_blocks, sms, Cfg::PINGPONG);
    int const grid = sched.grid;
    p.wgw_regular = sched.regular;
    p.wgw_quota = sched.quota;
    p.wgw_rest = sched.rest;
    size_t const n_trace = size_t(grid) * 2 * 64 * 8;
    CK(cudaMalloc(&trace, n_trace * 8));
    CK(cudaMemset(trace, 0, n_trace * 8));
    CK(cudaMemcpyToSymbol(g_wgw_trace, &trace, sizeof(trace)));
    long long* span;
    CK(cudaMalloc(&span, size_t(grid) * 4 * 8));
    CK(cudaMemset(span, 0, size_t(grid) * 4 * 8));
    CK(cudaMemcpyToSymbol(g_wgw_span, &span, sizeof(span)));
    auto kernel = conv_kernel_sm90<Cfg, kResidual>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) kernel<<<grid, Cfg::THREADS, smem>>>(p);
    CK(cudaEventRecord(e0));
    kernel<<<grid, Cfg::THREADS, smem>>>(p);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<long long> h(n_trace);
    CK(cudaMemcpy(h.data(), trace, n_trace * 8, cudaMemcpyDeviceToHost));
#ifdef TRTFUSE_WGW_TRACE_GLOBALTIMER
    timeline(name, cin, cout, hw, batch, ms, grid, h, span);
    CK(cudaFree(x)); CK(cudaFree(r)); CK(cudaFree(o)); CK(cudaFree(w)); CK(cudaFree(f)); CK(cudaFree(trace));
    CK(cudaFree(span));
    return;
#endif
    // per tile: 0 start, 1 first x stage ready, 2 wgmmas issued, 3 wgmmas done, 4 residual ready, 5 epilogue
    // done, 6 stored; the period runs to the next tile's start
    double sum[8] = {};
    int n = 0;
    for (int b = 0; b < grid; ++b)
        for (int c = 0; c < 2; ++c) {
            long long const* t = &h[size_t((b * 2 + c) * 64) * 8];
            for (int u = 1; u < 63 && t[(u + 1) * 8] != 0; ++u, ++n) {
                long long const* q = t + u * 8;
                for (int i = 1; i <= 6; ++i) sum[i] += double(q[i] - q[i - 1]);
                sum[0] += double(q[7]);
                sum[7] += double(q[8] - q[0]);
            }
        }
    if (n == 0) n = 1;
    std::printf("%-26s %4d->%-4d HW %-4d batch %d: %.4f ms | cycles per tile: wait x %.0f, issue wgmmas %.0f, "
                "drain %.0f, wait residual %.0f, epilogue %.0f, store %.0f | period %.0f | x stage 0 ready at start %.0f %%\n",
                name, cin, cout, hw, batch, ms, sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, sum[5] / n,
                sum[6] / n, sum[7] / n, 100.0 * sum[0] / n);
    CK(cudaFree(x)); CK(cudaFree(r)); CK(cudaFree(o)); CK(cudaFree(w)); CK(cudaFree(f)); CK(cudaFree(trace));
    CK(cudaFree(span));
}

int main() {
    // the offered wgw configs (residual_conv.cu: W0 .. W4)
    using W0 = WgwConfig<128, 2, 2, false, false>;
    using W1 = WgwConfig<128, 2, 3, true, false>;
    using W2 = WgwConfig<128, 4, 2, true, true>;
    using W3 = WgwConfig<64, 4, 2, false, false>;
    using W4 = WgwConfig<64, 4, 2, true, false>;
    int const shapes[4][3] = {{512, 2048, 49}, {256, 1024, 196}, {128, 512, 784}, {64, 256, 3136}};
#ifdef TRTFUSE_WGW_TRACE_GLOBALTIMER
    for (int batch : {256, 2048})
#else
    for (int batch : {2048})
#endif
        for (auto const& s : shapes) {
            run<W0>("wgw_64x256x128_s2_r2", s[0], s[1], s[2], batch);
            if (s[0] < 512)   // res5's weight slice leaves no room for a third residual buffer
                run<W1>("wgw_64x256x128_s2_r3_p2", s[0], s[1], s[2], batch);
            run<W2>("wgw_64x256x128_s4_r2_p2_pp_sh", s[0], s[1], s[2], batch);
            run<W3>("wgw_64x256x64_s4_r2", s[0], s[1], s[2], batch);
            run<W4>("wgw_64x256x64_s4_r2_p2", s[0], s[1], s[2], batch);
        }
    return 0;
}
