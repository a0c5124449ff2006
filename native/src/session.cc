// The native SUT and QSL: LoadGen's StartTest with the hot path in C++.
//
// Queries go into one queue (a chunk per IssueQuery call: an Offline query of millions of samples is
// one chunk, taken a batch at a time). One thread per engine slot takes up to `batch` samples, waiting
// at most `batch_timeout_us` after the oldest for a fuller batch, runs them and completes them straight
// to LoadGen. Nothing on this path takes Python's GIL. Every issued sample is completed exactly once:
// with its response, or without one when the run has failed or was stopped (the run is then an error).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "loadgen.h"
#include "query_sample_library.h"
#include "settings.h"
#include "system_under_test.h"
#include "test_settings.h"
#include "version.h"

namespace tf {
namespace {

using Clock = std::chrono::steady_clock;

void set_err(char* err, size_t len, const std::string& msg) {
  if (err && len) {
    std::strncpy(err, msg.c_str(), len - 1);
    err[len - 1] = '\0';
  }
}

struct Chunk {
  std::vector<mlperf::QuerySample> samples;
  size_t next = 0;
  Clock::time_point arrived;
};

class Session final : public mlperf::QuerySampleLibrary, public mlperf::SystemUnderTest {
 public:
  Session(Engine* engine, int64_t total, int64_t perf_count, tf_load_fn load, void* user, int batch,
          double timeout_us, int label_offset)
      : engine_(engine), info_(engine->info()), total_(total), perf_count_(perf_count), load_(load),
        user_(user), batch_(std::max(1, std::min(batch, info_.max_batch))), label_offset_(label_offset),
        timeout_(std::chrono::nanoseconds(int64_t(timeout_us * 1e3))), row_of_(size_t(total), -1),
        per_lane_(std::max(1, info_.slots / std::max(1, info_.lanes))), lanes_(size_t(std::max(1, info_.lanes))),
        busy_base_ms_(lanes_.size(), 0.0) {}

  ~Session() override { stop_workers(); }

  // -- QSL ----------------------------------------------------------------------------------------
  const std::string& Name() override { return name_; }
  size_t TotalSampleCount() override { return size_t(total_); }
  size_t PerformanceSampleCount() override { return size_t(perf_count_); }

  void LoadSamplesToRam(const std::vector<mlperf::QuerySampleIndex>& samples) override {
    stats_.qsl_load_calls++;
    std::string err;
    if (!load(samples, &err)) fail("loading samples: " + err);
    stats_.qsl_loaded_samples += int64_t(samples.size());
  }

  void UnloadSamplesFromRam(const std::vector<mlperf::QuerySampleIndex>& samples) override { unload(samples); }

  // -- SUT ----------------------------------------------------------------------------------------
  void IssueQuery(const std::vector<mlperf::QuerySample>& samples) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stats_.issued == stats_.completed) touch();  // the stall clock starts when there is work
      stats_.issued += int64_t(samples.size());
      if (!abandoned_) {
        Chunk c;
        c.samples = samples;
        c.arrived = Clock::now();
        waiting_ += samples.size();
        queue_.push_back(std::move(c));
      }
    }
    if (abandoned_) {
      complete(samples, nullptr);  // no slot may ever come back: answered here, on LoadGen's thread
      return;
    }
    cv_.notify_one();
  }

  void FlushQueries() override {}

  // -- the session's own steps -------------------------------------------------------------------
  bool load(const std::vector<mlperf::QuerySampleIndex>& samples, std::string* err) {
    std::vector<int64_t> idx, rows;
    for (auto s : samples) {
      if (s >= size_t(total_)) {
        *err = "sample index out of range";
        return false;
      }
      if (row_of_[s] < 0) idx.push_back(int64_t(s));
    }
    if (idx.empty()) return true;
    if (free_rows_.size() < idx.size()) {
      int64_t want = std::max<int64_t>(perf_count_, capacity_ + int64_t(idx.size() - free_rows_.size()));
      if (!engine_->reserve(want, err)) return false;
      for (int64_t r = want - 1; r >= capacity_; --r) free_rows_.push_back(r);
      capacity_ = want;
    }
    const size_t chunk = 256;
    std::vector<uint8_t> staging;
    for (size_t at = 0; at < idx.size(); at += chunk) {
      size_t n = std::min(chunk, idx.size() - at);
      staging.resize(n * size_t(info_.sample_bytes));
      if (load_(user_, idx.data() + at, n, staging.data()) != 0) {
        *err = "the sample loader failed";
        return false;
      }
      rows.clear();
      for (size_t i = 0; i < n; ++i) {
        rows.push_back(free_rows_.back());
        free_rows_.pop_back();
      }
      if (!engine_->store(rows.data(), n, staging.data(), err)) return false;
      for (size_t i = 0; i < n; ++i) row_of_[size_t(idx[at + i])] = int32_t(rows[i]);
    }
    return true;
  }

  void unload(const std::vector<mlperf::QuerySampleIndex>& samples) {
    for (auto s : samples) {
      if (s < size_t(total_) && row_of_[s] >= 0) {
        free_rows_.push_back(row_of_[s]);
        row_of_[s] = -1;
      }
    }
  }

  double warmup(int batches, std::string* err) {
    if (batches <= 0) return 0.0;
    std::vector<mlperf::QuerySampleIndex> first;
    for (int64_t i = 0; i < std::min<int64_t>(batch_, total_); ++i) first.push_back(size_t(i));
    if (!load(first, err)) return -1.0;
    std::vector<int32_t> rows;
    for (auto s : first) rows.push_back(row_of_[s]);
    double rate = 0.0;
    if (!engine_->run(0, rows.data(), int(rows.size()), err)) {
      unload(first);
      return -1.0;
    }
    if (batches > 1) {
      int slots = info_.slots;
      int timed = std::max(batches - 1, slots);
      std::atomic<int> next{0};
      std::atomic<bool> ok{true};
      std::string first_err;
      std::mutex err_mu;
      auto t0 = Clock::now();
      std::vector<std::thread> threads;
      for (int s = 0; s < slots; ++s) {
        threads.emplace_back([&, s] {
          engine_->on_slot_thread(s);
          std::string e;
          while (next.fetch_add(1) < timed) {
            if (!engine_->run(s, rows.data(), int(rows.size()), &e)) {
              std::lock_guard<std::mutex> lock(err_mu);
              if (ok.exchange(false)) first_err = e;
              return;
            }
          }
        });
      }
      for (auto& t : threads) t.join();
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!ok) {
        *err = first_err;
        unload(first);
        return -1.0;
      }
      rate = double(rows.size()) * timed / s;
    }
    unload(first);
    return rate;
  }

  int run(const std::string& model, const std::string& scenario, const std::string& settings,
          const std::string& log_dir, const std::string& audit, std::string* err) {
    mlperf::TestSettings ts;
    if (ts.FromConfig("", model, scenario, 0) != 0) {
      *err = "LoadGen has no built-in mlperf.conf entry for " + model + "/" + scenario;
      return 1;
    }
    if (!apply_settings(ts, settings, err)) return 1;
    mlperf::LogSettings log;
    log.log_output.outdir = log_dir;
    log.log_output.copy_summary_to_stdout = false;
    log.enable_trace = false;
    for (size_t l = 0; l < lanes_.size(); ++l) {  // this run's lane figures: not the warm-up's, nor an earlier run's
      lanes_[l].batches = 0;
      lanes_[l].samples = 0;
      busy_base_ms_[l] = engine_->lane_busy_ms(int(l));
    }
    start_workers();
    mlperf::StartTest(this, this, ts, log, audit);
    stop_workers();
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) {
      *err = error_;
      return 1;
    }
    return 0;
  }

  void stop(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty()) error_ = reason;
      stopped_ = true;
    }
    cv_.notify_all();
  }

  // stop(), and completes (without responses) the batches that slots are running now: a hung engine
  // never returns them, and LoadGen would wait forever. A slot that returns later finds its batch
  // answered and drops it. Returns the samples completed here.
  int64_t abandon(const std::string& reason) {
    stop(reason);
    std::vector<std::vector<mlperf::QuerySample>> taken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      abandoned_ = true;
      for (auto& f : inflight_)
        if (f.owned) {
          f.owned = false;
          taken.push_back(f.samples);
        }
      // and what waits in the queue: the slots that would answer it may never return
      std::vector<mlperf::QuerySample> queued;
      while (waiting_ > 0) {
        take(&queued);
        taken.push_back(queued);
      }
    }
    int64_t n = 0;
    for (auto& batch : taken) {
      complete(batch, nullptr);
      n += int64_t(batch.size());
    }
    return n;
  }

  bool abandoned() const { return abandoned_; }

  bool lane_stats(int lane, tf_lane_stats* out) const {
    if (lane < 0 || size_t(lane) >= lanes_.size() || lane >= info_.lanes) return false;
    out->batches = lanes_[size_t(lane)].batches;
    out->samples = lanes_[size_t(lane)].samples;
    out->busy_ms = engine_->lane_busy_ms(lane) - busy_base_ms_[size_t(lane)];
    return true;
  }

  tf_stats stats() const {
    tf_stats out{};
    out.issued = stats_.issued;
    out.completed = stats_.completed;
    out.batches = stats_.batches;
    out.batch_samples = stats_.batch_samples;
    out.qsl_load_calls = stats_.qsl_load_calls;
    out.qsl_loaded_samples = stats_.qsl_loaded_samples;
    out.failed = stats_.failed;
    out.gpu_busy_ms = engine_->busy_ms();
    out.last_progress_s = double(last_progress_ns_.load()) * 1e-9;
    return out;
  }

 private:
  void fail(const std::string& reason) { stop(reason); }

  void touch() {
    last_progress_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  void start_workers() {
    quit_ = false;
    inflight_.assign(size_t(info_.slots), InFlight{});
    for (int s = 0; s < info_.slots; ++s) workers_.emplace_back([this, s] { work(s); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    // A slot stuck in a hung engine never returns: leave it (its batch was abandoned, answered).
    for (auto& t : workers_) abandoned_ ? t.detach() : t.join();
    workers_.clear();
  }

  // Takes up to batch_ samples into `out` (caller holds the lock).
  void take(std::vector<mlperf::QuerySample>* out) {
    out->clear();
    while (!queue_.empty() && out->size() < size_t(batch_)) {
      Chunk& c = queue_.front();
      size_t n = std::min(c.samples.size() - c.next, size_t(batch_) - out->size());
      out->insert(out->end(), c.samples.begin() + long(c.next), c.samples.begin() + long(c.next + n));
      c.next += n;
      if (c.next == c.samples.size()) queue_.pop_front();
    }
    waiting_ -= out->size();
  }

  void work(int slot) {
    engine_->on_slot_thread(slot);
    std::vector<mlperf::QuerySample> batch;
    std::vector<int32_t> rows;
    std::vector<int32_t> shifted;
    std::string err;
    for (;;) {
      bool answer = true, more = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return quit_ || waiting_ > 0; });
        if (waiting_ == 0) return;  // quit_: the test is over
        if (!stopped_ && timeout_.count() > 0 && waiting_ < size_t(batch_)) {
          auto deadline = queue_.front().arrived + timeout_;
          cv_.wait_until(lock, deadline, [&] { return quit_ || stopped_ || waiting_ >= size_t(batch_); });
          if (waiting_ == 0) continue;
        }
        take(&batch);
        answer = !stopped_;
        more = waiting_ > 0;
        inflight_[size_t(slot)].samples = batch;
        inflight_[size_t(slot)].owned = true;
      }
      if (more) cv_.notify_one();  // the rest for another slot
      const int32_t* top = nullptr;
      if (answer) {
        rows.resize(batch.size());
        bool loaded = true;
        for (size_t i = 0; i < batch.size(); ++i) {
          int32_t r = batch[i].index < size_t(total_) ? row_of_[batch[i].index] : -1;
          loaded &= r >= 0;
          rows[i] = r;
        }
        if (!loaded) {
          fail("LoadGen issued a sample that is not loaded");
        } else {
          top = engine_->run(slot, rows.data(), int(rows.size()), &err);
          if (!top) fail("the engine failed: " + err);
          if (top && label_offset_) {
            shifted.assign(top, top + batch.size() * size_t(info_.top_k));
            for (auto& c : shifted) c -= label_offset_;
            top = shifted.data();
          }
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!inflight_[size_t(slot)].owned) continue;  // abandoned while it ran: answered already
        inflight_[size_t(slot)].owned = false;
      }
      complete(batch, top, slot / per_lane_);
    }
  }

  // Completes `batch` to LoadGen: with each sample's top-k answer, or (top == nullptr) without one.
  void complete(const std::vector<mlperf::QuerySample>& batch, const int32_t* top, int lane = -1) {
    std::vector<mlperf::QuerySampleResponse> responses(batch.size());
    const size_t k = size_t(info_.top_k);
    for (size_t i = 0; i < batch.size(); ++i) {
      responses[i].id = batch[i].id;
      responses[i].data = top ? reinterpret_cast<uintptr_t>(top + i * k) : 0;
      responses[i].size = top ? k * sizeof(int32_t) : 0;
      responses[i].n_tokens = 0;
    }
    mlperf::QuerySamplesComplete(responses.data(), responses.size());
    touch();
    stats_.completed += int64_t(batch.size());
    if (top) {
      stats_.batches++;
      stats_.batch_samples += int64_t(batch.size());
      if (lane >= 0 && size_t(lane) < lanes_.size()) {
        lanes_[size_t(lane)].batches++;
        lanes_[size_t(lane)].samples += int64_t(batch.size());
      }
    } else {
      stats_.failed++;
    }
  }

  struct Counters {
    std::atomic<int64_t> issued{0}, completed{0}, batches{0}, batch_samples{0};
    std::atomic<int64_t> qsl_load_calls{0}, qsl_loaded_samples{0}, failed{0};
  };

  Engine* engine_;
  tf_engine_info info_;
  int64_t total_, perf_count_;
  tf_load_fn load_;
  void* user_;
  int batch_;
  int label_offset_;
  std::chrono::nanoseconds timeout_;
  std::atomic<int64_t> last_progress_ns_{0};
  std::string name_ = "trtfuse-native";

  std::vector<int32_t> row_of_;  // sample index -> store row (-1: not loaded); written only by LoadGen's
                                 // load/unload, which never overlap a batch over the same samples
  std::vector<int64_t> free_rows_;
  int64_t capacity_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  size_t waiting_ = 0;
  bool quit_ = false, stopped_ = false;
  std::atomic<bool> abandoned_{false};
  std::string error_;
  std::vector<std::thread> workers_;
  struct InFlight {
    std::vector<mlperf::QuerySample> samples;
    bool owned = false;  // the slot's batch is not completed yet (whoever clears it completes it)
  };
  std::vector<InFlight> inflight_;
  Counters stats_;
  struct LaneCounters {
    std::atomic<int64_t> batches{0}, samples{0};
  };
  int per_lane_;                        // slots per lane: slot s runs on lane s / per_lane_
  std::vector<LaneCounters> lanes_;
  std::vector<double> busy_base_ms_;    // each lane's engine busy time when the run started
};

}  // namespace
}  // namespace tf

struct tf_session {
  tf::Session* impl;
};

extern "C" {

int tf_engine_get_info(const tf_engine* e, tf_engine_info* out) {
  if (!e || !out) return 1;
  *out = e->impl->info();
  return 0;
}

void tf_engine_free(tf_engine* e) {
  if (!e) return;
  delete e->impl;
  delete e;
}

tf_session* tf_session_new(tf_engine* e, int64_t total, int64_t perf_count, tf_load_fn load, void* user,
                           int32_t batch, double batch_timeout_us, int32_t label_offset) {
  if (!e || total <= 0 || perf_count <= 0 || !load) return nullptr;
  return new tf_session{
      new tf::Session(e->impl, total, perf_count, load, user, batch, batch_timeout_us, label_offset)};
}

double tf_session_warmup(tf_session* s, int32_t batches, char* err, size_t err_len) {
  std::string e;
  double rate = s->impl->warmup(batches, &e);
  if (rate < 0) tf::set_err(err, err_len, e);
  return rate;
}

int tf_session_run(tf_session* s, const char* model, const char* scenario_name, const char* settings,
                   const char* log_dir, const char* audit_config, char* err, size_t err_len) {
  std::string e;
  int rc = s->impl->run(model, scenario_name, settings, log_dir, audit_config ? audit_config : "", &e);
  if (rc) tf::set_err(err, err_len, e);
  return rc;
}

void tf_session_stats(const tf_session* s, tf_stats* out) { *out = s->impl->stats(); }

int tf_session_lane_stats(const tf_session* s, int32_t lane, tf_lane_stats* out) {
  if (!s || !out) return 1;
  return s->impl->lane_stats(lane, out) ? 0 : 1;
}

void tf_session_stop(tf_session* s, const char* reason) { s->impl->stop(reason ? reason : "stopped"); }

int64_t tf_session_abandon(tf_session* s, const char* reason) {
  return s->impl->abandon(reason ? reason : "abandoned");
}

void tf_session_free(tf_session* s) {
  if (!s) return;
  // A slot may still be inside a hung engine with this session's state: leave it to the process's end.
  if (!s->impl->abandoned()) delete s->impl;
  delete s;
}

const char* tf_loadgen_version(void) { return mlperf::LoadgenVersion().c_str(); }

}  // extern "C"
