// The sm90 1x1 kernel's per-tile clock trace, for measuring programs only (benchmarks/experiments/
// residual_conv_wgw_phases.cu): included by conv1x1_sm90.cuh where TRTFUSE_WGW_TRACE is defined, never in the library.
// Included inside namespace trtfuse::rconv (the marks use the kernel's locals: t128, part, c, u, pipe).
//
// Thread 0 of each consumer (NH 2: of its first warpgroup) records clock64() at the phases of its first 64 tiles.
// The buffer's address is read once per thread (wgw_trace): reading the __device__ pointer at every record made
// the recording warp wait for a global load each time (~1k cycles under this kernel's memory traffic).
// TRTFUSE_WGW_TRACE_GLOBALTIMER records %globaltimer (ns, one clock for all SMs) instead, and WGW_SPAN the block's
// start (i = 0) and each consumer's end (1 + c) into g_wgw_span: where a short launch's time goes.
#pragma once
__device__ long long* g_wgw_trace;
__device__ long long* g_wgw_span;
__device__ __forceinline__ long long wgw_clock() {
#ifdef TRTFUSE_WGW_TRACE_GLOBALTIMER
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return clock64();
#endif
}
#define WGW_TRACE(i) \
    if (t128 == 0 && part == 0 && u < 64) wgw_trace[((blockIdx.x * 2 + c) * 64 + u) * 8 + (i)] = wgw_clock()
#define WGW_SPAN(i) g_wgw_span[blockIdx.x * 4 + (i)] = wgw_clock()
// the buffer's address, read once per consumer thread
#define WGW_TRACE_BEGIN() long long* const wgw_trace = g_wgw_trace
// whether stage 0 of tile t (consumer c's tile u) has already landed, in slot 7 of the tile's record
#define WGW_TRACE_STAGE0(t, c, u)                                                         \
    if (t128 == 0 && part == 0 && (u) < 64) {                                             \
        int slot0, fill0;                                                                 \
        pipe.x_pos((t), 0, slot0, fill0);                                                      \
        wgw_trace[((blockIdx.x * 2 + (c)) * 64 + (u)) * 8 + 7] = mbar_test(pipe.x_full(slot0), fill0 & 1); \
    }
