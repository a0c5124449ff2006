// LayerNorm kernels (seed: OneFlow's layer_norm.cuh strategy), templated on small Load/Store functors
// so that data I/O (plain or residual input, affine output, dtypes) stays apart from the statistics.
//
// Paths, picked by dispatch() below:
//   warp_kernel            narrow rows (<= 768 bytes, fp32 <= 2048): a group of W = 1..32 lanes per row,
//                          the row held in registers, two rows per group when each lane holds one pack.
//   block_registers_kernel wider rows up to 32 values per thread x 1024 threads: one block per row,
//                          row in registers, block all-reduce through shared memory.
//   block_shared_kernel    the row cached in shared memory (each thread re-reads only what it wrote).
//   block_uncached_kernel  last resort: Welford pass over global memory, then a second read to normalize.
// All are persistent: the grid is what fits on the device at once and loops over rows.
//
// Statistics: where the row is on chip (registers or shared memory) the variance is the exact two-pass
// sum((v - mean)^2) / cols, more accurate than Welford and cheaper since nothing is re-read from memory.
// The uncached path, which must not read the row a third time, merges per-thread Welford states.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/vec.cuh"
#include "layernorm/layernorm.h"

namespace trtfuse {
namespace layernorm {

// ---------------------------------------------------------------------------------------------------
// Load / Store functors. load<N>(dst, row, col) fills N floats from columns [col, col + N) of `row`;
// store<N>(src, row, col) writes N normalized floats there. `col` is a multiple of N and every pointer
// is aligned for N-element vectors (dispatch checks), so copy_n emits the widest accesses.

template <typename T>
struct DirectLoad {
    T const* x;
    int64_t cols;
    template <int N>
    __device__ __forceinline__ void load(float* dst, int64_t row, int col) const {
        T v[N];
        copy_n<T, N>(v, x + row * cols + col);
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = to_float(v[i]);
    }
};

// BERT's skip LayerNorm: the normalized value is x + residual (+ bias), summed in fp32; the sum is
// optionally written back in x's dtype for the next residual connection.
template <typename T>
struct ResidualLoad {
    T const* x;
    T const* residual;
    float const* bias;  // may be null
    T* sum;             // may be null
    int64_t cols;
    template <int N>
    __device__ __forceinline__ void load(float* dst, int64_t row, int col) const {
        int64_t const off = row * cols + col;
        T a[N], b[N];
        copy_n<T, N>(a, x + off);
        copy_n<T, N>(b, residual + off);
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = to_float(a[i]) + to_float(b[i]);
        if (bias) {
            float c[N];
            copy_n<float, N>(c, bias + col);
#pragma unroll
            for (int i = 0; i < N; ++i) dst[i] += c[i];
        }
        if (sum) {
#pragma unroll
            for (int i = 0; i < N; ++i) a[i] = from_float<T>(dst[i]);
            copy_n<T, N>(sum + off, a);
        }
    }
};

template <typename T>
struct AffineStore {
    T* y;
    float const* gamma;  // may be null: 1
    float const* beta;   // may be null: 0
    int64_t cols;
    template <int N>
    __device__ __forceinline__ void store(float const* src, int64_t row, int col) const {
        float g[N], b[N];
        if (gamma) {
            copy_n<float, N>(g, gamma + col);
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) g[i] = 1.f;
        }
        if (beta) {
            copy_n<float, N>(b, beta + col);
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) b[i] = 0.f;
        }
        T out[N];
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = from_float<T>(src[i] * g[i] + b[i]);
        copy_n<T, N>(y + row * cols + col, out);
    }
};

struct StatsStore {
    float* mean;     // may be null
    float* inv_std;  // may be null
    __device__ __forceinline__ void store(int64_t row, float m, float r) const {
        if (mean) mean[row] = m;
        if (inv_std) inv_std[row] = r;
    }
};

// ---------------------------------------------------------------------------------------------------
// Reductions.

// Sum over aligned groups of W lanes (W a power of two <= 32); every lane of the warp must call it.
template <int W>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int m = W / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32), returned to every thread. One barrier: each warp
// reduces the per-warp partials itself instead of waiting for a broadcast. `partial` must not be
// written again before every thread has read it; callers alternate two buffers, and the barrier of
// the other buffer's reduction separates the reads of one use from the writes of the next.
__device__ __forceinline__ float block_sum(float v, float* partial) {
    v = group_sum<32>(v);
    int const lane = threadIdx.x % 32;
    if (lane == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.f;
    return group_sum<32>(v);
}

struct Welford {
    float n, mean, m2;
    __device__ __forceinline__ void add(float v) {
        n += 1.f;
        float const d = v - mean;
        mean += d / n;
        m2 += d * (v - mean);
    }
    // Chan et al.'s merge of two partial states.
    __device__ __forceinline__ void merge(float nb, float mb, float m2b) {
        float const total = n + nb;
        if (total == 0.f) return;
        float const d = mb - mean;
        float const wb = nb / total;
        mean += d * wb;
        m2 += m2b + d * d * n * wb;
        n = total;
    }
};

__device__ __forceinline__ Welford warp_welford(Welford w) {
#pragma unroll
    for (int m = 16; m > 0; m /= 2) {
        float const nb = __shfl_xor_sync(0xffffffffu, w.n, m);
        float const mb = __shfl_xor_sync(0xffffffffu, w.mean, m);
        float const m2b = __shfl_xor_sync(0xffffffffu, w.m2, m);
        w.merge(nb, mb, m2b);
    }
    return w;
}

// ---------------------------------------------------------------------------------------------------
// Kernels. Threads own packs of PACK consecutive columns; pack p of a thread at position t among the
// row's threads is column (p * threads + t) * PACK, so each load instruction is coalesced across lanes.

constexpr int kWarpKernelBlock = 128;
constexpr int kMaxValuesPerThread = 32;  // registers for the resident row; keeps 1024-thread blocks legal

// W lanes per row, PACKS packs per lane, ROWS rows per group per step.
template <class Load, class Store, int PACK, int PACKS, int W, int ROWS>
__global__ void __launch_bounds__(kWarpKernelBlock)
    warp_kernel(Load load, Store store, StatsStore stats, int64_t rows, int cols, float eps) {
    static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "W is a power of two <= 32");
    constexpr int kRowsPerWarp = (32 / W) * ROWS;
    constexpr int kValues = PACKS * PACK;
    int const lane = threadIdx.x % 32;
    int const sub = lane % W;    // lane within its group
    int const group = lane / W;  // group within the warp
    int64_t const warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    int64_t const num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
    float const inv_cols = 1.f / static_cast<float>(cols);
    // The loop bound is uniform per warp (not per group) so every lane reaches every shuffle.
    for (int64_t base = warp * kRowsPerWarp; base < rows; base += num_warps * kRowsPerWarp) {
        float v[ROWS][kValues];
        float mean[ROWS], rstd[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            int64_t const row = base + group * ROWS + r;
#pragma unroll
            for (int p = 0; p < PACKS; ++p) {
                int const col = (p * W + sub) * PACK;
                if (row < rows && col < cols) {
                    load.template load<PACK>(v[r] + p * PACK, row, col);
                } else {
#pragma unroll
                    for (int i = 0; i < PACK; ++i) v[r][p * PACK + i] = 0.f;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < kValues; ++i) s += v[r][i];
            mean[r] = group_sum<W>(s) * inv_cols;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            float q = 0.f;
#pragma unroll
            for (int p = 0; p < PACKS; ++p) {
                if ((p * W + sub) * PACK < cols) {  // padding lanes hold zeros, not data
#pragma unroll
                    for (int i = 0; i < PACK; ++i) {
                        float const d = v[r][p * PACK + i] - mean[r];
                        q += d * d;
                    }
                }
            }
            rstd[r] = rsqrtf(group_sum<W>(q) * inv_cols + eps);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            int64_t const row = base + group * ROWS + r;
            if (row >= rows) continue;
            if (sub == 0) stats.store(row, mean[r], rstd[r]);
#pragma unroll
            for (int p = 0; p < PACKS; ++p) {
                int const col = (p * W + sub) * PACK;
                if (col < cols) {
                    float o[PACK];
#pragma unroll
                    for (int i = 0; i < PACK; ++i) o[i] = (v[r][p * PACK + i] - mean[r]) * rstd[r];
                    store.template store<PACK>(o, row, col);
                }
            }
        }
    }
}

// One block (blockDim.x threads, a multiple of 32) per row, PACKS packs per thread in registers.
template <class Load, class Store, int PACK, int PACKS>
__global__ void __launch_bounds__(1024)
    block_registers_kernel(Load load, Store store, StatsStore stats, int64_t rows, int cols, float eps) {
    __shared__ float partial[2][32];
    constexpr int kValues = PACKS * PACK;
    int const threads = blockDim.x;
    float const inv_cols = 1.f / static_cast<float>(cols);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float v[kValues];
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            int const col = (p * threads + threadIdx.x) * PACK;
            if (col < cols) {
                load.template load<PACK>(v + p * PACK, row, col);
            } else {
#pragma unroll
                for (int i = 0; i < PACK; ++i) v[p * PACK + i] = 0.f;
            }
        }
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kValues; ++i) s += v[i];
        float const mean = block_sum(s, partial[0]) * inv_cols;
        float q = 0.f;
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            if ((p * threads + threadIdx.x) * PACK < cols) {
#pragma unroll
                for (int i = 0; i < PACK; ++i) {
                    float const d = v[p * PACK + i] - mean;
                    q += d * d;
                }
            }
        }
        float const rstd = rsqrtf(block_sum(q, partial[1]) * inv_cols + eps);
        if (threadIdx.x == 0) stats.store(row, mean, rstd);
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            int const col = (p * threads + threadIdx.x) * PACK;
            if (col < cols) {
                float o[PACK];
#pragma unroll
                for (int i = 0; i < PACK; ++i) o[i] = (v[p * PACK + i] - mean) * rstd;
                store.template store<PACK>(o, row, col);
            }
        }
    }
}

// One block per row, the row cached in dynamic shared memory as float. Each thread re-reads only the
// values it stored itself, so the cache needs no barrier; value i of the thread's k-th pack sits at
// (k * PACK + i) * blockDim.x + threadIdx.x, consecutive threads in consecutive banks.
template <class Load, class Store, int PACK>
__global__ void __launch_bounds__(1024)
    block_shared_kernel(Load load, Store store, StatsStore stats, int64_t rows, int cols, float eps) {
    extern __shared__ float cache[];
    __shared__ float partial[2][32];
    int const threads = blockDim.x;
    int const step = threads * PACK;
    float const inv_cols = 1.f / static_cast<float>(cols);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float s = 0.f;
        for (int col = threadIdx.x * PACK, k = 0; col < cols; col += step, ++k) {
            float v[PACK];
            load.template load<PACK>(v, row, col);
#pragma unroll
            for (int i = 0; i < PACK; ++i) {
                cache[(k * PACK + i) * threads + threadIdx.x] = v[i];
                s += v[i];
            }
        }
        float const mean = block_sum(s, partial[0]) * inv_cols;
        float q = 0.f;
        for (int col = threadIdx.x * PACK, k = 0; col < cols; col += step, ++k) {
#pragma unroll
            for (int i = 0; i < PACK; ++i) {
                float const d = cache[(k * PACK + i) * threads + threadIdx.x] - mean;
                q += d * d;
            }
        }
        float const rstd = rsqrtf(block_sum(q, partial[1]) * inv_cols + eps);
        if (threadIdx.x == 0) stats.store(row, mean, rstd);
        for (int col = threadIdx.x * PACK, k = 0; col < cols; col += step, ++k) {
            float o[PACK];
#pragma unroll
            for (int i = 0; i < PACK; ++i) o[i] = (cache[(k * PACK + i) * threads + threadIdx.x] - mean) * rstd;
            store.template store<PACK>(o, row, col);
        }
    }
}

// One block per row, nothing cached: a Welford pass, then a second read of the row to normalize.
template <class Load, class Store, int PACK>
__global__ void __launch_bounds__(1024)
    block_uncached_kernel(Load load, Store store, StatsStore stats, int64_t rows, int cols, float eps) {
    __shared__ float partial[2][3][32];  // two buffers (alternating rows) of per-warp (n, mean, m2)
    int const lane = threadIdx.x % 32;
    int const warps = blockDim.x / 32;
    int const step = blockDim.x * PACK;
    int parity = 0;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
        Welford w{0.f, 0.f, 0.f};
        for (int col = threadIdx.x * PACK; col < cols; col += step) {
            float v[PACK];
            load.template load<PACK>(v, row, col);
#pragma unroll
            for (int i = 0; i < PACK; ++i) w.add(v[i]);
        }
        w = warp_welford(w);
        float(*part)[32] = partial[parity];
        if (lane == 0) {
            part[0][threadIdx.x / 32] = w.n;
            part[1][threadIdx.x / 32] = w.mean;
            part[2][threadIdx.x / 32] = w.m2;
        }
        __syncthreads();
        w = lane < warps ? Welford{part[0][lane], part[1][lane], part[2][lane]} : Welford{0.f, 0.f, 0.f};
        w = warp_welford(w);
        float const mean = w.mean;
        float const rstd = rsqrtf(w.m2 / static_cast<float>(cols) + eps);
        if (threadIdx.x == 0) stats.store(row, mean, rstd);
        for (int col = threadIdx.x * PACK; col < cols; col += step) {
            float v[PACK];
            load.template load<PACK>(v, row, col);
#pragma unroll
            for (int i = 0; i < PACK; ++i) v[i] = (v[i] - mean) * rstd;
            store.template store<PACK>(v, row, col);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Launch helpers.

// Persistent grid: as many blocks as can be resident at once, but no more than there is work for.
template <typename Kernel>
inline int persistent_grid(Kernel kernel, int block, size_t smem, int64_t blocks_of_work, int* grid) {
    int device = 0, sms = 0, per_sm = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&device));
    TRTFUSE_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    TRTFUSE_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem));
    *grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks_of_work, int64_t{sms} * per_sm)));
    return per_sm > 0 ? kOk : kAlgoNotApplicable;
}

template <class Load, class Store, int PACK, int PACKS, int W, int ROWS>
int launch_warp(Load const& load, Store const& store, StatsStore stats, Args const& a, cudaStream_t stream) {
    auto kernel = warp_kernel<Load, Store, PACK, PACKS, W, ROWS>;
    constexpr int kRowsPerBlock = kWarpKernelBlock / 32 * (32 / W) * ROWS;
    int grid = 0;
    int st = persistent_grid(kernel, kWarpKernelBlock, 0, (a.rows + kRowsPerBlock - 1) / kRowsPerBlock, &grid);
    if (st != kOk) return st;
    kernel<<<grid, kWarpKernelBlock, 0, stream>>>(load, store, stats, a.rows, static_cast<int>(a.cols), a.epsilon);
    TRTFUSE_LAUNCH_CHECK();
    return kOk;
}

// Warp path: W lanes x PACKS packs per row. Among the (W, PACKS) that hold the row with at most
// kMaxValuesPerThread values a lane, take the one with the fewest idle pack slots, then the widest
// group. Two rows per group when a lane holds a single pack, so each lane has two loads in flight.
template <class Load, class Store, int PACK, int PACKS>
int dispatch_warp_w(int w, Load const& load, Store const& store, StatsStore stats, Args const& a,
                    cudaStream_t stream) {
    constexpr int R = PACKS == 1 ? 2 : 1;
    switch (w) {
        case 1: return launch_warp<Load, Store, PACK, PACKS, 1, R>(load, store, stats, a, stream);
        case 2: return launch_warp<Load, Store, PACK, PACKS, 2, R>(load, store, stats, a, stream);
        case 4: return launch_warp<Load, Store, PACK, PACKS, 4, R>(load, store, stats, a, stream);
        case 8: return launch_warp<Load, Store, PACK, PACKS, 8, R>(load, store, stats, a, stream);
        case 16: return launch_warp<Load, Store, PACK, PACKS, 16, R>(load, store, stats, a, stream);
        default: return launch_warp<Load, Store, PACK, PACKS, 32, R>(load, store, stats, a, stream);
    }
}

constexpr int kWarpMaxPacks = 4;  // packs per lane instantiated for the warp path

template <int PACK>
inline bool choose_warp(int64_t cols, int* w_out, int* packs_out) {
    int64_t const packs = cols / PACK;
    int best_w = 0, best_p = 0;
    int64_t best_waste = -1;
    for (int w = 32; w >= 1; w /= 2) {
        int64_t const p = (packs + w - 1) / w;
        if (p > kWarpMaxPacks || p * PACK > kMaxValuesPerThread) continue;
        int64_t const waste = p * w - packs;
        if (best_waste < 0 || waste < best_waste) {
            best_waste = waste;
            best_w = w;
            best_p = static_cast<int>(p);
        }
    }
    *w_out = best_w;
    *packs_out = best_p;
    return best_w > 0;
}

template <class Load, class Store, int PACK>
int dispatch_warp(Load const& load, Store const& store, StatsStore stats, Args const& a, cudaStream_t stream) {
    int w = 0, packs = 0;
    if (!choose_warp<PACK>(a.cols, &w, &packs)) return kAlgoNotApplicable;
    switch (packs) {
        case 1: return dispatch_warp_w<Load, Store, PACK, 1>(w, load, store, stats, a, stream);
        case 2: return dispatch_warp_w<Load, Store, PACK, 2>(w, load, store, stats, a, stream);
        case 3: return dispatch_warp_w<Load, Store, PACK, 3>(w, load, store, stats, a, stream);
        default:
            if constexpr (4 * PACK <= kMaxValuesPerThread)
                return dispatch_warp_w<Load, Store, PACK, 4>(w, load, store, stats, a, stream);
            return kAlgoNotApplicable;
    }
}

template <class Load, class Store, int PACK, int PACKS>
int launch_block_registers(int threads, Load const& load, Store const& store, StatsStore stats, Args const& a,
                           cudaStream_t stream) {
    auto kernel = block_registers_kernel<Load, Store, PACK, PACKS>;
    int grid = 0;
    int st = persistent_grid(kernel, threads, 0, a.rows, &grid);
    if (st != kOk) return st;
    kernel<<<grid, threads, 0, stream>>>(load, store, stats, a.rows, static_cast<int>(a.cols), a.epsilon);
    TRTFUSE_LAUNCH_CHECK();
    return kOk;
}

// Default target threads per row for the block-register path, from the H100 sweep (docs/layernorm.md):
// fewer packs per thread means fewer registers and more resident threads, which wins until the block
// gets so large that its two barriers per row dominate: 256 threads for 16-bit types, 512 for fp32.
template <int ELEMENT_BYTES>
constexpr int default_row_threads() {
    return ELEMENT_BYTES == 4 ? 512 : 256;
}

// Block-register path: the fewest packs per thread (1, 2, 4, 8) whose block stays within the target
// thread count, else the most packs that fit 1024 threads.
template <class Load, class Store, int PACK, int ELEMENT_BYTES>
int dispatch_block_registers(Load const& load, Store const& store, StatsStore stats, Args const& a,
                             cudaStream_t stream) {
    int const target = a.tune > 0 ? a.tune : default_row_threads<ELEMENT_BYTES>();
    int64_t const packs = a.cols / PACK;
    int chosen = 0, threads = 0;
    for (int p = 1; p * PACK <= kMaxValuesPerThread && p <= 8; p *= 2) {
        int64_t const t = ((packs + p - 1) / p + 31) / 32 * 32;
        if (t <= 1024) {
            chosen = p;
            threads = static_cast<int>(t);
            if (t <= target) break;
        }
    }
    switch (chosen) {
        case 1: return launch_block_registers<Load, Store, PACK, 1>(threads, load, store, stats, a, stream);
        case 2: return launch_block_registers<Load, Store, PACK, 2>(threads, load, store, stats, a, stream);
        case 4: return launch_block_registers<Load, Store, PACK, 4>(threads, load, store, stats, a, stream);
        case 8:
            if constexpr (8 * PACK <= kMaxValuesPerThread)
                return launch_block_registers<Load, Store, PACK, 8>(threads, load, store, stats, a, stream);
            return kAlgoNotApplicable;
        default: return kAlgoNotApplicable;
    }
}

// Shared-memory path: OneFlow's choice of block size, the one with the most resident threads per SM
// (larger on ties), given the dynamic shared memory each size needs; but no larger than one pack per
// thread (measured v1: 1024-thread blocks on a 2048-column fp16 row left 3/4 of the threads idle).
template <class Load, class Store, int PACK>
int dispatch_block_shared(Load const& load, Store const& store, StatsStore stats, Args const& a,
                          cudaStream_t stream) {
    auto kernel = block_shared_kernel<Load, Store, PACK>;
    int device = 0, max_smem = 0;
    TRTFUSE_CUDA_RETURN(cudaGetDevice(&device));
    TRTFUSE_CUDA_RETURN(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    max_smem -= static_cast<int>(sizeof(float) * 2 * 32);  // the static partial[] buffers
    int best_block = 0, best_threads = 0;
    size_t best_smem = 0;
    int64_t const max_block = std::min<int64_t>(1024, std::max<int64_t>(128, (a.cols / PACK + 31) / 32 * 32));
    for (int block = 128; block <= max_block; block *= 2) {
        int64_t const step = int64_t{block} * PACK;
        size_t const smem = static_cast<size_t>((a.cols + step - 1) / step * step) * sizeof(float);
        if (smem > static_cast<size_t>(max_smem)) continue;
        TRTFUSE_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem)));
        int per_sm = 0;
        TRTFUSE_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem));
        if (per_sm > 0 && per_sm * block >= best_threads) {
            best_threads = per_sm * block;
            best_block = block;
            best_smem = smem;
        }
    }
    if (best_block == 0) return kAlgoNotApplicable;
    TRTFUSE_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(best_smem)));
    int grid = 0;
    int st = persistent_grid(kernel, best_block, best_smem, a.rows, &grid);
    if (st != kOk) return st;
    kernel<<<grid, best_block, best_smem, stream>>>(load, store, stats, a.rows, static_cast<int>(a.cols),
                                                    a.epsilon);
    TRTFUSE_LAUNCH_CHECK();
    return kOk;
}

template <class Load, class Store, int PACK>
int dispatch_block_uncached(Load const& load, Store const& store, StatsStore stats, Args const& a,
                            cudaStream_t stream) {
    auto kernel = block_uncached_kernel<Load, Store, PACK>;
    constexpr int kBlock = 512;
    int grid = 0;
    int st = persistent_grid(kernel, kBlock, 0, a.rows, &grid);
    if (st != kOk) return st;
    kernel<<<grid, kBlock, 0, stream>>>(load, store, stats, a.rows, static_cast<int>(a.cols), a.epsilon);
    TRTFUSE_LAUNCH_CHECK();
    return kOk;
}

// Rows up to this many bytes go to the warp path under kAuto; wider ones to a block per row. Measured on
// the H100 (docs/layernorm.md): a warp per row wins up to 384 fp16 columns and 512 fp32 columns; past
// that the warp path needs two or more packs a lane, its registers cut occupancy, and 64-256 thread
// blocks holding one pack a thread move the row faster despite their barriers.
template <int ELEMENT_BYTES>
constexpr int64_t warp_max_row_bytes() {
    return ELEMENT_BYTES == 4 ? 2048 : 768;
}

template <class Load, class Store, int PACK, int ELEMENT_BYTES>
int dispatch_pack(Load const& load, Store const& store, StatsStore stats, Args const& a, cudaStream_t stream) {
    switch (a.algo) {
        case kWarp: return dispatch_warp<Load, Store, PACK>(load, store, stats, a, stream);
        case kBlockRegisters:
            return dispatch_block_registers<Load, Store, PACK, ELEMENT_BYTES>(load, store, stats, a, stream);
        case kBlockShared: return dispatch_block_shared<Load, Store, PACK>(load, store, stats, a, stream);
        case kBlockUncached: return dispatch_block_uncached<Load, Store, PACK>(load, store, stats, a, stream);
        default: break;
    }
    // kAuto: the first path that holds the row, fastest first.
    int st = kAlgoNotApplicable;
    if (a.cols * ELEMENT_BYTES <= warp_max_row_bytes<ELEMENT_BYTES>())
        st = dispatch_warp<Load, Store, PACK>(load, store, stats, a, stream);
    if (st != kAlgoNotApplicable) return st;
    st = dispatch_block_registers<Load, Store, PACK, ELEMENT_BYTES>(load, store, stats, a, stream);
    if (st != kAlgoNotApplicable) return st;
    st = dispatch_block_shared<Load, Store, PACK>(load, store, stats, a, stream);
    if (st != kAlgoNotApplicable) return st;
    return dispatch_block_uncached<Load, Store, PACK>(load, store, stats, a, stream);
}

// 16-byte packs when cols and every pointer allow them, else single elements (odd widths, offsets).
template <typename T, class Load, class Store>
int dispatch_aligned(Load const& load, Store const& store, StatsStore stats, Args const& a, cudaStream_t stream) {
    constexpr int kPack = 16 / sizeof(T);
    constexpr int kT = vec_alignment<T, kPack>();
    constexpr int kF = vec_alignment<float, kPack>();
    bool const vector_ok = a.cols % kPack == 0 && is_aligned(a.x, kT) && is_aligned(a.residual, kT) &&
                           is_aligned(a.y, kT) && is_aligned(a.sum, kT) && is_aligned(a.gamma, kF) &&
                           is_aligned(a.beta, kF) && is_aligned(a.bias, kF);
    constexpr int kBytes = sizeof(T);
    if (vector_ok) return dispatch_pack<Load, Store, kPack, kBytes>(load, store, stats, a, stream);
    return dispatch_pack<Load, Store, 1, kBytes>(load, store, stats, a, stream);
}

template <typename T>
int launch_typed(Args const& a, cudaStream_t stream) {
    AffineStore<T> const store{static_cast<T*>(a.y), a.gamma, a.beta, a.cols};
    StatsStore const stats{a.mean, a.inv_std};
    if (a.residual) {
        ResidualLoad<T> const load{static_cast<T const*>(a.x), static_cast<T const*>(a.residual), a.bias,
                                   static_cast<T*>(a.sum), a.cols};
        return dispatch_aligned<T>(load, store, stats, a, stream);
    }
    DirectLoad<T> const load{static_cast<T const*>(a.x), a.cols};
    return dispatch_aligned<T>(load, store, stats, a, stream);
}

// One translation unit per dtype (layernorm_<dtype>.cu) so the instantiations compile in parallel.
int launch_fp32(Args const& a, cudaStream_t stream);
int launch_fp16(Args const& a, cudaStream_t stream);
int launch_bf16(Args const& a, cudaStream_t stream);

}  // namespace layernorm
}  // namespace trtfuse
