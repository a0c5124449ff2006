// The TensorRT engine behind the native SUT: one lane per GPU, `streams` slots per lane.
//
// The sample store: page-locked host memory (default), each batch's rows copied to the slot's input by the
// copy engines in one batched copy, off the SMs; or (samples_on_device) one device array per lane and a
// gather kernel per batch, which takes SM time and DRAM bandwidth from the engine run it overlaps
// (H100, ResNet-50 Offline at the power cap: 98.7 % of the engine alone against 99.x % from the host).
// A lane's engine runs go one at a time in launch order (each waits on the previous run's event), the
// gathers and the k int32 per sample coming back overlap them: measured faster than overlapping runs in
// the Python backend (tensorrt.serial_compute). Each slot replays a CUDA graph of its context per batch
// bucket, captured at load, so a Server run's ragged batches pay no per-layer launches.
//
// On a host of several NUMA nodes, each lane belongs to its GPU's node (sysfs: the PCI device's numa_node
// and local_cpulist): its slot threads run on that node's CPUs, its page-locked memory (the slots' and a
// copy of the sample store per node) is allocated from a thread there, so a batch's samples cross no
// inter-socket link on their way to the GPU. One node, or a node sysfs does not tell: no pinning.
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "NvInfer.h"
#include "engine.h"

namespace tf {
namespace {

#define TF_CUDA(call, what)                                                                 \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      if (err) *err = std::string(what) + ": " + cudaGetErrorString(e_);                    \
      return false;                                                                         \
    }                                                                                       \
  } while (0)

class Logger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* msg) noexcept override {
    if (severity <= Severity::kWARNING) std::fprintf(stderr, "tensorrt: %s\n", msg);
  }
};

Logger& logger() {
  static Logger l;
  return l;
}

// Copies rows[i] of `store` (each `bytes` long, a multiple of 16) to row i of `out`.
__global__ void gather_rows(const uint4* __restrict__ store, const int32_t* __restrict__ rows,
                            int64_t words, uint4* __restrict__ out) {
  const uint4* src = store + int64_t(rows[blockIdx.y]) * words;
  uint4* dst = out + int64_t(blockIdx.y) * words;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// A sysfs list ("0-15,32-47") as a CPU set; false when empty or unreadable.
bool parse_cpu_list(const std::string& text, cpu_set_t* set) {
  CPU_ZERO(set);
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int a = -1, b = -1;
    int got = std::sscanf(part.c_str(), "%d-%d", &a, &b);
    if (got < 1 || a < 0) continue;
    if (got == 1) b = a;
    for (int c = a; c <= b && c < CPU_SETSIZE; ++c) CPU_SET(c, set);
  }
  return CPU_COUNT(set) > 0;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// The NUMA nodes online (1 where sysfs does not say).
int numa_nodes() {
  cpu_set_t nodes;
  return parse_cpu_list(read_line("/sys/devices/system/node/online"), &nodes) ? CPU_COUNT(&nodes) : 1;
}

// Where a lane's host work belongs: its GPU's NUMA node and that node's CPUs (pinned: known, and used).
struct Place {
  int node = -1;
  bool pinned = false;
  cpu_set_t cpus;
};

// Runs fn on a thread bound to place's CPUs (where pinned), else on this thread: memory it allocates is
// placed on that node by the kernel's first-touch policy.
bool run_at(const Place& place, const std::function<bool()>& fn) {
  if (!place.pinned) return fn();
  bool ok = false;
  std::thread t([&] {
    int rc = pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &place.cpus);
    if (rc != 0) std::fprintf(stderr, "note: could not bind a thread to NUMA node %d's CPUs (%s)\n", place.node, std::strerror(rc));
    ok = fn();
  });
  t.join();
  return ok;
}

struct HostStore {  // page-locked samples, one copy per NUMA node the lanes sit on
  Place place;
  uint8_t* data = nullptr;
};

struct Slot {
  int profile = 0;
  std::vector<void*> copy_dst;        // the batched host -> device copy's operands
  std::vector<const void*> copy_src;
  std::vector<size_t> copy_size;
  cudaStream_t stream = nullptr;
  cudaEvent_t started = nullptr, computed = nullptr;
  nvinfer1::IExecutionContext* context = nullptr;
  void *dev_in = nullptr, *dev_scores = nullptr;
  int32_t *dev_top = nullptr, *dev_rows = nullptr, *host_top = nullptr, *host_rows = nullptr;
  std::vector<std::pair<int, cudaGraphExec_t>> graphs;  // batch bucket -> graph
  int shape_n = -1;
};

struct Lane {
  int device = 0;
  Place place;
  size_t store_index = 0;            // its node's copy of the page-locked sample store
  nvinfer1::IRuntime* runtime = nullptr;
  nvinfer1::ICudaEngine* engine = nullptr;
  uint8_t* store = nullptr;  // samples_on_device: this lane's device copy of the store
  int64_t capacity = 0;
  std::vector<Slot> slots;
  mutable std::mutex order;          // launch order = run order (and busy_ms)
  cudaEvent_t last_run = nullptr;    // the event recorded after the last launched run
  double busy_ms = 0;
};

class TensorRTEngine final : public Engine {
 public:
  ~TensorRTEngine() override { release(); }

  bool open(const std::string& plan_path, const std::vector<int>& devices, int max_batch, int streams,
            int graph_buckets, const std::string& top_name, bool samples_on_device, std::string* err) {
    on_device_ = samples_on_device;
    std::ifstream f(plan_path, std::ios::binary);
    if (!f) {
      *err = "cannot read the engine file " + plan_path;
      return false;
    }
    std::vector<char> plan((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    top_name_ = top_name;
    const bool numa = numa_nodes() > 1;
    for (int device : devices) {
      lanes_.emplace_back(new Lane());
      Lane& lane = *lanes_.back();
      if (numa && !place_lane(lane, device, err)) return false;
      // the slots' page-locked buffers come from the lane's node: open it from a thread there
      if (!run_at(lane.place, [&] { return open_lane(lane, device, plan, max_batch, streams, graph_buckets, err); }))
        return false;
      size_t k = 0;
      while (k < stores_.size() && stores_[k].place.node != lane.place.node) ++k;
      if (k == stores_.size()) stores_.push_back(HostStore{lane.place, nullptr});
      lane.store_index = k;
    }
    info_.lanes = int(lanes_.size());
    info_.slots = int(lanes_.size() * lanes_[0]->slots.size());
    return true;
  }

  tf_engine_info info() const override { return info_; }

  bool reserve(int64_t rows, std::string* err) override {
    if (!on_device_) {
      if (rows <= host_capacity_) return true;
      for (auto& store : stores_) {
        bool ok = run_at(store.place, [&] {
          uint8_t* bigger = nullptr;
          TF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&bigger), size_t(rows) * info_.sample_bytes,
                                cudaHostAllocPortable),
                  "allocating the page-locked sample store");
          if (store.data) {
            std::memcpy(bigger, store.data, size_t(host_capacity_) * info_.sample_bytes);
            cudaError_t freed = cudaFreeHost(store.data);
            store.data = bigger;
            TF_CUDA(freed, "freeing the smaller sample store");
          }
          store.data = bigger;
          return true;
        });
        if (!ok) return false;
      }
      host_capacity_ = rows;
      return true;
    }
    for (auto& lane : lanes_) {
      if (rows <= lane->capacity) continue;
      TF_CUDA(cudaSetDevice(lane->device), "cudaSetDevice");
      uint8_t* bigger = nullptr;
      TF_CUDA(cudaMalloc(&bigger, size_t(rows) * info_.sample_bytes), "allocating the sample store");
      if (lane->store) {
        TF_CUDA(cudaMemcpy(bigger, lane->store, size_t(lane->capacity) * info_.sample_bytes, cudaMemcpyDeviceToDevice),
                "growing the sample store");
        cudaFree(lane->store);
      }
      lane->store = bigger;
      lane->capacity = rows;
    }
    return true;
  }

  bool store(const int64_t* rows, size_t n, const void* host, std::string* err) override {
    const auto* src = static_cast<const uint8_t*>(host);
    const size_t bytes = size_t(info_.sample_bytes);
    if (!on_device_) {
      for (size_t i = 0; i < n; ++i) {
        if (rows[i] < 0 || rows[i] >= host_capacity_) {
          *err = "store row out of range";
          return false;
        }
        for (auto& store : stores_) std::memcpy(store.data + size_t(rows[i]) * bytes, src + i * bytes, bytes);
      }
      return true;
    }
    for (auto& lane : lanes_) {
      TF_CUDA(cudaSetDevice(lane->device), "cudaSetDevice");
      for (size_t i = 0; i < n; ++i) {
        if (rows[i] < 0 || rows[i] >= lane->capacity) {
          *err = "store row out of range";
          return false;
        }
        TF_CUDA(cudaMemcpy(lane->store + size_t(rows[i]) * bytes, src + i * bytes, bytes, cudaMemcpyHostToDevice),
                "copying samples to the device");
      }
    }
    return true;
  }

  const int32_t* run(int slot_index, const int32_t* rows, int n, std::string* err) override {
    const int per_lane = int(lanes_[0]->slots.size());
    Lane& lane = *lanes_[size_t(slot_index / per_lane)];
    Slot& s = lane.slots[size_t(slot_index % per_lane)];
    if (n <= 0 || n > info_.max_batch) {
      *err = "batch of " + std::to_string(n) + " samples (the engine takes 1.." + std::to_string(info_.max_batch) + ")";
      return nullptr;
    }
    return enqueue_and_wait(lane, s, rows, n, err) ? s.host_top : nullptr;
  }

  double busy_ms() const override {
    double ms = 0;
    for (int l = 0; l < int(lanes_.size()); ++l) ms += lane_busy_ms(l);
    return ms;
  }

  double lane_busy_ms(int l) const override {
    if (l < 0 || l >= int(lanes_.size())) return 0.0;
    Lane& lane = *lanes_[size_t(l)];
    std::lock_guard<std::mutex> lock(lane.order);
    return lane.busy_ms;
  }

  void on_slot_thread(int slot) override {
    const Lane& lane = *lanes_[size_t(slot / int(lanes_[0]->slots.size()))];
    if (!lane.place.pinned) return;
    int rc = pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &lane.place.cpus);
    if (rc != 0)
      std::fprintf(stderr, "note: could not bind slot %d's thread to NUMA node %d (%s)\n", slot, lane.place.node,
                   std::strerror(rc));
  }

 private:
  // The lane's GPU's NUMA node and CPUs from sysfs; a node sysfs does not tell (-1, unreadable) leaves the
  // lane unpinned.
  bool place_lane(Lane& lane, int device, std::string* err) {
    char bus[64] = {0};
    TF_CUDA(cudaDeviceGetPCIBusId(bus, int(sizeof(bus)), device), "cudaDeviceGetPCIBusId");
    // sysfs names the device domain:bus:device.function in lower-case hex, a 4-digit domain
    unsigned domain = 0, bus_n = 0, dev = 0, fn = 0;
    if (std::sscanf(bus, "%x:%x:%x.%x", &domain, &bus_n, &dev, &fn) != 4) return true;
    char name[32];
    std::snprintf(name, sizeof(name), "%04x:%02x:%02x.%x", domain, bus_n, dev, fn);
    const std::string id(name);
    const std::string dir = "/sys/bus/pci/devices/" + id + "/";
    int node = -1;
    if (std::sscanf(read_line(dir + "numa_node").c_str(), "%d", &node) != 1 || node < 0) return true;
    lane.place.node = node;
    lane.place.pinned = parse_cpu_list(read_line(dir + "local_cpulist"), &lane.place.cpus);
    if (lane.place.pinned)
      std::fprintf(stderr, "note: GPU %d (%s) on NUMA node %d: its lane's threads and page-locked memory there\n",
                   device, id.c_str(), node);
    return true;
  }

  bool open_lane(Lane& lane, int device, const std::vector<char>& plan, int max_batch, int streams,
                 int graph_buckets, std::string* err) {
    lane.device = device;
    TF_CUDA(cudaSetDevice(device), "cudaSetDevice");
    lane.runtime = nvinfer1::createInferRuntime(logger());
    if (!lane.runtime) {
      *err = "TensorRT could not create a runtime";
      return false;
    }
    lane.engine = lane.runtime->deserializeCudaEngine(plan.data(), plan.size());
    if (!lane.engine) {
      *err = "TensorRT could not deserialize the engine (built by another TensorRT version, or a plugin "
             "it uses is not registered)";
      return false;
    }
    nvinfer1::ICudaEngine& e = *lane.engine;
    std::string in_name, scores_name;
    bool has_top = false;
    for (int i = 0; i < e.getNbIOTensors(); ++i) {
      const char* name = e.getIOTensorName(i);
      if (e.getTensorIOMode(name) == nvinfer1::TensorIOMode::kINPUT) {
        if (in_name.empty()) in_name = name;
      } else if (top_name_ == name) {
        has_top = true;
      } else if (scores_name.empty()) {
        scores_name = name;
      }
    }
    if (!has_top) {
      *err = "the engine has no '" + top_name_ + "' output (the TopK that ranks each sample's classes on the "
             "GPU): build it with `trtfuse build`";
      return false;
    }
    nvinfer1::Dims max_in = e.getProfileShape(in_name.c_str(), 0, nvinfer1::OptProfileSelector::kMAX);
    if (max_in.nbDims != 4) {
      *err = "the engine's input is not NCHW";
      return false;
    }
    int profile_max = int(max_in.d[0]);
    nvinfer1::DataType dt = e.getTensorDataType(in_name.c_str());
    int elem = dt == nvinfer1::DataType::kFLOAT ? 4 : dt == nvinfer1::DataType::kINT8 ? 1 : 0;
    if (!elem) {
      *err = "the engine's input is neither float32 nor int8";
      return false;
    }
    nvinfer1::Dims top_dims = e.getTensorShape(top_name_.c_str());
    int top_k = int(top_dims.d[top_dims.nbDims - 1]);
    int64_t sample_bytes = int64_t(elem) * max_in.d[1] * max_in.d[2] * max_in.d[3];
    if (sample_bytes % 16) {
      *err = "the engine's sample size is not a multiple of 16 bytes";
      return false;
    }
    int mb = max_batch > 0 ? std::min(max_batch, profile_max) : profile_max;
    tf_engine_info mine{sample_bytes, dt == nvinfer1::DataType::kFLOAT ? 0 : 1,
                        {int32_t(max_in.d[1]), int32_t(max_in.d[2]), int32_t(max_in.d[3])}, top_k, mb, 0, 0};
    if (lanes_.size() == 1) {
      info_ = mine;
    } else if (mine.sample_bytes != info_.sample_bytes || mine.max_batch != info_.max_batch) {
      *err = "the lanes' engines differ";
      return false;
    }
    nvinfer1::Dims scores_dims = e.getTensorShape(scores_name.c_str());
    int64_t scores_per_sample = 1;
    for (int d = 1; d < scores_dims.nbDims; ++d) scores_per_sample *= std::max<int64_t>(1, scores_dims.d[d]);
    size_t scores_elem = e.getTensorDataType(scores_name.c_str()) == nvinfer1::DataType::kHALF ? 2 : 4;

    std::vector<int> buckets;
    if (graph_buckets > 0) {
      int step = std::max(1, mb / graph_buckets);
      for (int b = step; b < mb; b += step) buckets.push_back(b);
      buckets.push_back(mb);
    }
    int n_slots = std::min(streams, e.getNbOptimizationProfiles());
    if (n_slots < streams)
      std::fprintf(stderr, "note: the engine has %d optimization profile(s); using %d stream(s)\n", n_slots, n_slots);
    TF_CUDA(cudaEventCreateWithFlags(&lane.last_run, cudaEventDisableTiming), "cudaEventCreate");
    lane.slots.resize(size_t(n_slots));
    for (int i = 0; i < n_slots; ++i) {
      Slot& s = lane.slots[size_t(i)];
      s.profile = i;
      TF_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      TF_CUDA(cudaEventCreate(&s.started), "cudaEventCreate");
      TF_CUDA(cudaEventCreate(&s.computed), "cudaEventCreate");
      s.context = e.createExecutionContext();
      if (!s.context) {
        *err = "TensorRT could not create an execution context (out of device memory?)";
        return false;
      }
      if (e.getNbOptimizationProfiles() > 1 && !s.context->setOptimizationProfileAsync(i, s.stream)) {
        *err = "TensorRT refused optimization profile " + std::to_string(i);
        return false;
      }
      TF_CUDA(cudaMalloc(&s.dev_in, size_t(mb) * sample_bytes), "cudaMalloc input");
      TF_CUDA(cudaMemset(s.dev_in, 0, size_t(mb) * sample_bytes), "cudaMemset input");
      TF_CUDA(cudaMalloc(&s.dev_scores, size_t(mb) * scores_per_sample * scores_elem), "cudaMalloc scores");
      TF_CUDA(cudaMalloc(&s.dev_top, size_t(mb) * top_k * sizeof(int32_t)), "cudaMalloc top");
      TF_CUDA(cudaMalloc(&s.dev_rows, size_t(mb) * sizeof(int32_t)), "cudaMalloc rows");
      TF_CUDA(cudaMallocHost(&s.host_top, size_t(mb) * top_k * sizeof(int32_t)), "cudaMallocHost top");
      TF_CUDA(cudaMallocHost(&s.host_rows, size_t(mb) * sizeof(int32_t)), "cudaMallocHost rows");
      bool bound = s.context->setTensorAddress(in_name.c_str(), s.dev_in) &&
                   s.context->setTensorAddress(scores_name.c_str(), s.dev_scores) &&
                   s.context->setTensorAddress(top_name_.c_str(), s.dev_top);
      if (!bound) {
        *err = "TensorRT refused the slot's tensor addresses";
        return false;
      }
      in_name_ = in_name;
      for (int b : buckets) {
        if (!set_shape(s, b, err)) return false;
        if (!s.context->enqueueV3(s.stream)) {
          *err = "TensorRT enqueueV3 failed";
          return false;
        }
        TF_CUDA(cudaStreamSynchronize(s.stream), "the first run of a batch bucket");
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        TF_CUDA(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), "graph capture");
        bool ok = s.context->enqueueV3(s.stream);
        cudaError_t end = cudaStreamEndCapture(s.stream, &graph);
        if (ok && end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
          s.graphs.emplace_back(b, exec);
        } else {
          std::fprintf(stderr, "note: CUDA graph capture failed for batch %d; running it without\n", b);
          cudaGetLastError();
        }
        if (graph) cudaGraphDestroy(graph);
      }
    }
    return true;
  }

  bool set_shape(Slot& s, int n, std::string* err) {
    if (s.shape_n == n) return true;
    nvinfer1::Dims d{};
    d.nbDims = 4;
    d.d[0] = n;
    for (int i = 0; i < 3; ++i) d.d[i + 1] = info_.dims[i];
    if (!s.context->setInputShape(in_name_.c_str(), d)) {
      *err = "TensorRT refused batch " + std::to_string(n);
      return false;
    }
    s.shape_n = n;
    return true;
  }

  bool enqueue_and_wait(Lane& lane, Slot& s, const int32_t* rows, int n, std::string* err) {
    TF_CUDA(cudaSetDevice(lane.device), "cudaSetDevice");
    if (on_device_) {
      std::memcpy(s.host_rows, rows, size_t(n) * sizeof(int32_t));
      TF_CUDA(cudaMemcpyAsync(s.dev_rows, s.host_rows, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, s.stream),
              "copying the batch's rows");
      const int64_t words = info_.sample_bytes / 16;
      dim3 grid(unsigned(std::min<int64_t>((words + 255) / 256, 16)), unsigned(n));
      gather_rows<<<grid, 256, 0, s.stream>>>(reinterpret_cast<const uint4*>(lane.store), s.dev_rows, words,
                                                reinterpret_cast<uint4*>(s.dev_in));
      TF_CUDA(cudaGetLastError(), "the gather kernel");
    } else {
      const size_t bytes = size_t(info_.sample_bytes);
      s.copy_dst.resize(size_t(n));
      s.copy_src.resize(size_t(n));
      s.copy_size.assign(size_t(n), bytes);
      for (int i = 0; i < n; ++i) {
        s.copy_dst[size_t(i)] = static_cast<uint8_t*>(s.dev_in) + size_t(i) * bytes;
        s.copy_src[size_t(i)] = stores_[lane.store_index].data + size_t(rows[i]) * bytes;
      }
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
      TF_CUDA(cudaMemcpyBatchAsync(s.copy_dst.data(), s.copy_src.data(), s.copy_size.data(), size_t(n), &attr,
                                   &attr_index, 1, s.stream),
              "copying the batch's samples to the device");
    }
    cudaGraphExec_t graph = nullptr;
    for (auto& g : s.graphs)
      if (g.first >= n) {
        graph = g.second;
        break;
      }
    {
      std::lock_guard<std::mutex> lock(lane.order);
      TF_CUDA(cudaStreamWaitEvent(s.stream, lane.last_run, 0), "ordering the engine runs");
      TF_CUDA(cudaEventRecord(s.started, s.stream), "cudaEventRecord");
      if (graph) {
        TF_CUDA(cudaGraphLaunch(graph, s.stream), "launching the engine's graph");
      } else {
        if (!set_shape(s, n, err)) return false;
        if (!s.context->enqueueV3(s.stream)) {
          *err = "TensorRT enqueueV3 failed";
          return false;
        }
      }
      TF_CUDA(cudaEventRecord(s.computed, s.stream), "cudaEventRecord");
      TF_CUDA(cudaEventRecord(lane.last_run, s.stream), "cudaEventRecord");
    }
    TF_CUDA(cudaMemcpyAsync(s.host_top, s.dev_top, size_t(n) * info_.top_k * sizeof(int32_t), cudaMemcpyDeviceToHost,
                            s.stream),
            "copying the answers back");
    TF_CUDA(cudaStreamSynchronize(s.stream), "the engine run");
    float ms = 0;
    if (cudaEventElapsedTime(&ms, s.started, s.computed) == cudaSuccess) {
      std::lock_guard<std::mutex> lock(lane.order);
      lane.busy_ms += ms;
    }
    return true;
  }

  void release() {
    for (auto& lane : lanes_) {
      cudaSetDevice(lane->device);
      for (auto& s : lane->slots) {
        if (s.stream) cudaStreamSynchronize(s.stream);
        for (auto& g : s.graphs) cudaGraphExecDestroy(g.second);
        delete s.context;
        cudaFree(s.dev_in);
        cudaFree(s.dev_scores);
        cudaFree(s.dev_top);
        cudaFree(s.dev_rows);
        cudaFreeHost(s.host_top);
        cudaFreeHost(s.host_rows);
        if (s.started) cudaEventDestroy(s.started);
        if (s.computed) cudaEventDestroy(s.computed);
        if (s.stream) cudaStreamDestroy(s.stream);
      }
      if (lane->last_run) cudaEventDestroy(lane->last_run);
      cudaFree(lane->store);
      delete lane->engine;
      delete lane->runtime;
    }
    lanes_.clear();
    for (auto& store : stores_)
      if (store.data) cudaFreeHost(store.data);
    stores_.clear();
  }

  std::vector<std::unique_ptr<Lane>> lanes_;
  bool on_device_ = false;
  std::vector<HostStore> stores_;  // page-locked (portable): one per NUMA node of the lanes
  int64_t host_capacity_ = 0;
  tf_engine_info info_{};
  std::string top_name_, in_name_;
};

}  // namespace
}  // namespace tf

extern "C" tf_engine* tf_engine_tensorrt(const char* plan_path, const int32_t* devices, int32_t n_devices,
                                         int32_t max_batch, int32_t streams, int32_t graph_buckets,
                                         int32_t samples_on_device, const char* top_output, char* err,
                                         size_t err_len) {
  std::string e;
  auto* engine = new tf::TensorRTEngine();
  std::vector<int> devs(devices, devices + std::max(0, n_devices));
  if (devs.empty()) devs.push_back(0);
  if (!engine->open(plan_path, devs, max_batch, std::max(1, streams), graph_buckets,
                    top_output ? top_output : "top_classes", samples_on_device != 0, &e)) {
    delete engine;
    if (err && err_len) {
      std::strncpy(err, e.c_str(), err_len - 1);
      err[err_len - 1] = '\0';
    }
    return nullptr;
  }
  return new tf_engine{engine};
}

extern "C" int tf_has_tensorrt(void) { return 1; }
