// Reader of the tuner's JSON cache (written by `python -m trtfuse.tuning`), no CUDA, no TensorRT.
// Format: {"version": 1, "entries": [{"gpu": str, "cin": int, "cout": int, "hw": int, "batch": int,
//          "config": str, "residual": 0|1, "stride": 1|2, "proj_cin": int, "family": str, ...}, ...]}  (hw: output
//          positions per image; residual and stride optional, 1 and 1 by default: the caches before them hold tails
//          only; proj_cin > 0: a tail with its projection fused (trtfuse_proj_tail_create), of proj_cin input channels
//          at `stride`, default 0; family: the kernel family, absent for the 1x1 conv, "conv3x3" or "stem" (config
//          then names a halo or a stem configuration); extra keys ignored; entry objects must not nest).
#pragma once
#include <string>
#include <vector>

namespace trtfuse {
namespace rconv {

struct CacheEntry {
    std::string gpu, config, family;   // family "": the 1x1 conv
    int cin = 0, cout = 0, hw = 0, batch = 0, residual = 1, stride = 1, proj_cin = 0;
};

// false (and *error set) if the file cannot be read or parsed.
bool parse_tuning_cache(std::string const& text, std::vector<CacheEntry>* entries, std::string* error);
bool read_tuning_cache(std::string const& path, std::vector<CacheEntry>* entries, std::string* error);

// An entry speaks for batches within this factor of its own: a pick at batch 1 or 8 (small tiles that fill the SMs)
// says nothing about batch 2048 on the same GPU, where the heuristic is the better guess.
constexpr int kMaxBatchRatio = 16;

// The entry of `family` for (gpu, cin, cout, hw, residual, stride, proj_cin) whose batch is closest to `batch` (in log
// scale), within kMaxBatchRatio of it; nullptr if none.
CacheEntry const* lookup(std::vector<CacheEntry> const& entries, std::string const& gpu, int cin, int cout, int hw,
                         int batch, bool residual, int stride, int proj_cin = 0, std::string const& family = "");

}  // namespace rconv
}  // namespace trtfuse
