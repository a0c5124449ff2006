// An engine behind the native SUT: a sample store (rows the session assigns) and batches run on slots.
//
// The session owns which sample sits in which row; an engine only keeps rows (on each of its lanes'
// devices) and runs a batch of rows on one slot, answering each row's top-k class indices. A slot runs
// one batch at a time and is driven by one session thread; different slots run concurrently.
#pragma once
#include <cstdint>
#include <string>

#include "trtfuse_sut.h"

namespace tf {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual tf_engine_info info() const = 0;
  // Room for `rows` samples; rows already stored keep their contents.
  virtual bool reserve(int64_t rows, std::string* err) = 0;
  // Copies n samples (n * sample_bytes, contiguous, host memory) into `rows` on every lane.
  virtual bool store(const int64_t* rows, size_t n, const void* host, std::string* err) = 0;
  // Runs rows[0..n) on `slot`: returns n * top_k int32 (valid until the slot's next run), or nullptr
  // with the reason in err.
  virtual const int32_t* run(int slot, const int32_t* rows, int n, std::string* err) = 0;
  // Device time of the engine runs so far (ms), where the engine has a device clock (the null engine:
  // its emulated time).
  virtual double busy_ms() const { return 0.0; }
  // The same for one lane (slots lane * slots_per_lane ..): per-GPU figures.
  virtual double lane_busy_ms(int lane) const { return lane == 0 ? busy_ms() : 0.0; }
  // Called on each thread that will drive `slot` before its first run: where the engine wants that
  // thread (the TensorRT engine: on the CPUs of its GPU's NUMA node).
  virtual void on_slot_thread(int slot) { (void)slot; }
};

}  // namespace tf

struct tf_engine {
  tf::Engine* impl;
};
