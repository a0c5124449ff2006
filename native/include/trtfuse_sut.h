// The native run loop's C ABI: LoadGen's StartTest over a C++ SUT and QSL, the hot path without Python.
//
// Python (src/trtfuse/native_sut.py, ctypes) keeps configuration, engine builds, reports and plots; this
// library owns what runs per query: LoadGen (compiled from its source distribution), the queue, the
// batcher, the engine's lanes and the completions.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TF_API __attribute__((visibility("default")))

typedef struct tf_engine tf_engine;
typedef struct tf_session tf_session;

// What an engine takes and answers. dtype: 0 float32, 1 int8, 2 uint8.
typedef struct {
  int64_t sample_bytes;   // one sample in the engine's input type
  int32_t dtype;
  int32_t dims[3];        // C, H, W of one sample
  int32_t top_k;          // int32 class indices answered per sample
  int32_t max_batch;
  int32_t lanes;          // devices
  int32_t slots;          // batches in flight at once, all lanes together
} tf_engine_info;

// Fills dst (n * sample_bytes) with samples idx[0..n) in the engine's input type; returns 0, or
// nonzero when it failed (the session then fails the run).
typedef int (*tf_load_fn)(void* user, const int64_t* idx, size_t n, void* dst);

typedef struct {
  int64_t issued, completed;          // samples
  int64_t batches, batch_samples;     // what the slots ran
  int64_t qsl_load_calls, qsl_loaded_samples;
  int64_t failed;                     // nonzero once a sample was answered without a response
  double gpu_busy_ms;                 // engine runs on the device clock (null engine: emulated time)
  double last_progress_s;             // CLOCK_MONOTONIC seconds of the last completion, or of the first
                                      // issue after the SUT was idle (the stall clock's start)
} tf_stats;

// One lane's (one GPU's) share of the last tf_session_run: the batches its slots answered, their
// samples, and its device time during that run (TensorRT: its runs' events; the null engine: its
// emulated time, 0 without). Summed over lanes: the session's batches and batch_samples of that run.
typedef struct {
  int64_t batches, samples;
  double busy_ms;
} tf_lane_stats;

// A host-only engine: every sample's top-k classes from a hash of its bytes (deterministic, the same in
// both LoadGen modes). `us_per_batch` + n * `us_per_sample` of sleep emulate a device's run time: one
// device per lane, each running one batch at a time.
TF_API tf_engine* tf_engine_null(int64_t sample_bytes, int32_t c, int32_t h, int32_t w, int32_t dtype,
                                 int32_t top_k, int32_t classes, int32_t max_batch, int32_t lanes,
                                 int32_t slots_per_lane, double us_per_batch, double us_per_sample);
// A TensorRT plan on each of `devices` (one lane each), `streams` slots per lane, CUDA graphs per
// batch bucket (`graph_buckets` sizes, 0: none). Samples in page-locked host memory, copied per batch
// by the copy engines; `samples_on_device`: resident on each GPU and gathered by a kernel instead.
// On a host of several NUMA nodes, a lane's slot threads run on its GPU's node's CPUs and its
// page-locked memory comes from that node. Plugins the plan uses must be registered already. Returns NULL with the reason in err when the
// library was built without TensorRT or the plan fails.
TF_API tf_engine* tf_engine_tensorrt(const char* plan_path, const int32_t* devices, int32_t n_devices,
                                     int32_t max_batch, int32_t streams, int32_t graph_buckets,
                                     int32_t samples_on_device, const char* top_output, char* err,
                                     size_t err_len);
TF_API int tf_engine_get_info(const tf_engine* e, tf_engine_info* out);
TF_API void tf_engine_free(tf_engine* e);
TF_API int tf_has_tensorrt(void);

// A session: LoadGen's QSL over `total` samples (`perf_count` resident in performance mode), samples
// brought in by `load`, batches of up to `batch` samples. Server/SingleStream/MultiStream: a free
// slot waits up to `batch_timeout_us` after the oldest waiting sample for a fuller batch. Answers are
// the engine's class indices minus `label_offset` (1001-class models: 1), as ImageNet indices.
TF_API tf_session* tf_session_new(tf_engine* e, int64_t total, int64_t perf_count, tf_load_fn load,
                                  void* user, int32_t batch, double batch_timeout_us, int32_t label_offset);
// Runs `batches` batches of the first samples (loaded, then unloaded) before the test: LoadGen has no
// warm-up. Returns samples/s of all but the first batch (0 when fewer than 2), < 0 on error.
TF_API double tf_session_warmup(tf_session* s, int32_t batches, char* err, size_t err_len);
// LoadGen's test. `settings`: "name=value" lines of TestSettings fields (scenario and mode as
// LoadGen's enum numbers); built-in mlperf.conf for `model`/`scenario_name` applies first. Returns 0,
// or nonzero with the reason in err (a failed or stopped run: its logs are not a result).
TF_API int tf_session_run(tf_session* s, const char* model, const char* scenario_name, const char* settings,
                          const char* log_dir, const char* audit_config, char* err, size_t err_len);
TF_API void tf_session_stats(const tf_session* s, tf_stats* out);
// `lane` in [0, tf_engine_info.lanes): fills out and returns 0; nonzero for another lane.
TF_API int tf_session_lane_stats(const tf_session* s, int32_t lane, tf_lane_stats* out);
// Ends the run early (an interrupt, the watchdog): every waiting and later sample is answered at once
// without a response, so StartTest returns; the run fails with `reason`.
TF_API void tf_session_stop(tf_session* s, const char* reason);
// tf_session_stop, and completes (without responses) the batches the slots are running now: the
// watchdog's answer to a hung engine. Returns the samples it completed.
TF_API int64_t tf_session_abandon(tf_session* s, const char* reason);
TF_API void tf_session_free(tf_session* s);
TF_API const char* tf_loadgen_version(void);

#ifdef __cplusplus
}
#endif
