// The null engine: the native SUT's host path alone. Each sample's classes come from a hash of its
// bytes, so answers are deterministic per sample (TEST01 compares the two LoadGen modes) and cost a
// few nanoseconds. An optional run time per batch stands in for a device that runs one batch at a time:
// a batch finishes no sooner than that long after the previous one finished, on a schedule (not a
// sleep per batch), so the rate is the device's and not the host's as long as the host keeps up.
#include <chrono>
#include <cstring>
#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine.h"

namespace tf {
namespace {

class NullEngine final : public Engine {
 public:
  NullEngine(tf_engine_info info, int classes, double us_per_batch, double us_per_sample)
      : info_(info), classes_(classes), us_batch_(us_per_batch), us_sample_(us_per_sample),
        answers_(info.slots, std::vector<int32_t>(size_t(info.max_batch) * info.top_k)),
        devices_(size_t(info.lanes)) {}

  tf_engine_info info() const override { return info_; }

  bool reserve(int64_t rows, std::string*) override {
    if (rows > rows_) {
      store_.resize(size_t(rows) * info_.sample_bytes);
      rows_ = rows;
    }
    return true;
  }

  bool store(const int64_t* rows, size_t n, const void* host, std::string* err) override {
    const auto* src = static_cast<const uint8_t*>(host);
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] < 0 || rows[i] >= rows_) {
        *err = "store row out of range";
        return false;
      }
      std::memcpy(&store_[size_t(rows[i]) * info_.sample_bytes], src + i * info_.sample_bytes,
                  info_.sample_bytes);
    }
    return true;
  }

  const int32_t* run(int slot, const int32_t* rows, int n, std::string* err) override {
    if (n > info_.max_batch) {
      *err = "batch larger than the engine's max batch";
      return nullptr;
    }
    auto& out = answers_[slot];
    for (int i = 0; i < n; ++i) classify(&store_[size_t(rows[i]) * info_.sample_bytes], &out[size_t(i) * info_.top_k]);
    double us = us_batch_ + us_sample_ * n;
    if (us > 0) {
      Device& d = devices_[size_t(slot / (info_.slots / info_.lanes))];
      Clock::time_point finish;
      {
        std::lock_guard<std::mutex> lock(d.mu);
        finish = std::max(d.last_finish + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double, std::micro>(us)),
                          Clock::now());
        d.last_finish = finish;
        d.busy_us += us;
      }
      std::this_thread::sleep_until(finish);
    }
    return out.data();
  }

  double busy_ms() const override {
    double ms = 0;
    for (int l = 0; l < info_.lanes; ++l) ms += lane_busy_ms(l);
    return ms;
  }

  double lane_busy_ms(int lane) const override {
    if (lane < 0 || lane >= info_.lanes) return 0.0;
    const Device& d = devices_[size_t(lane)];
    std::lock_guard<std::mutex> lock(d.mu);
    return d.busy_us * 1e-3;
  }

 private:
  // FNV-1a over up to 64 words spread across the sample: its bytes decide the answer.
  void classify(const uint8_t* sample, int32_t* top) const {
    const size_t words = size_t(info_.sample_bytes) / 8;
    const size_t step = words > 64 ? words / 64 : 1;
    uint64_t h = 1469598103934665603ull;
    for (size_t w = 0; w < words; w += step) {
      uint64_t v;
      std::memcpy(&v, sample + w * 8, 8);
      h = (h ^ v) * 1099511628211ull;
    }
    for (size_t b = words * 8; b < size_t(info_.sample_bytes); ++b) h = (h ^ sample[b]) * 1099511628211ull;
    for (int k = 0; k < info_.top_k; ++k) top[k] = int32_t((h + uint64_t(k)) % uint64_t(classes_));
  }

  using Clock = std::chrono::steady_clock;
  struct Device {                    // a lane's emulated device: one batch at a time
    mutable std::mutex mu;
    Clock::time_point last_finish{};
    double busy_us = 0;
  };

  tf_engine_info info_;
  int classes_;
  double us_batch_, us_sample_;
  int64_t rows_ = 0;
  std::vector<uint8_t> store_;
  std::vector<std::vector<int32_t>> answers_;
  std::vector<Device> devices_;
};

}  // namespace
}  // namespace tf

extern "C" tf_engine* tf_engine_null(int64_t sample_bytes, int32_t c, int32_t h, int32_t w, int32_t dtype,
                                     int32_t top_k, int32_t classes, int32_t max_batch, int32_t lanes,
                                     int32_t slots_per_lane, double us_per_batch, double us_per_sample) {
  if (sample_bytes <= 0 || top_k <= 0 || classes < top_k || max_batch <= 0 || lanes <= 0 || slots_per_lane <= 0)
    return nullptr;
  tf_engine_info info{sample_bytes, dtype, {c, h, w}, top_k, max_batch, lanes, lanes * slots_per_lane};
  return new tf_engine{new tf::NullEngine(info, classes, us_per_batch, us_per_sample)};
}
