// TestSettings from "name=value" lines: the Python side decides every value (its settings, LoadGen's
// built-in mlperf.conf through the Python binding) and hands them over by name, so both LoadGens of the
// process run one test the same way.
#include "settings.h"

#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

namespace tf {
namespace {

using Setter = std::function<void(mlperf::TestSettings&, const std::string&)>;

template <typename T>
Setter field(T mlperf::TestSettings::*member) {
  return [member](mlperf::TestSettings& ts, const std::string& v) {
    if constexpr (std::is_same_v<T, bool>) {
      ts.*member = (v == "1" || v == "true" || v == "True");
    } else if constexpr (std::is_floating_point_v<T>) {
      ts.*member = std::stod(v);
    } else {
      ts.*member = static_cast<T>(std::stoull(v));
    }
  };
}

const std::map<std::string, Setter>& setters() {
  using TS = mlperf::TestSettings;
  static const std::map<std::string, Setter> table = {
      {"scenario", [](TS& ts, const std::string& v) { ts.scenario = mlperf::TestScenario(std::stoi(v)); }},
      {"mode", [](TS& ts, const std::string& v) { ts.mode = mlperf::TestMode(std::stoi(v)); }},
      {"single_stream_expected_latency_ns", field(&TS::single_stream_expected_latency_ns)},
      {"single_stream_target_latency_percentile", field(&TS::single_stream_target_latency_percentile)},
      {"multi_stream_expected_latency_ns", field(&TS::multi_stream_expected_latency_ns)},
      {"multi_stream_target_latency_percentile", field(&TS::multi_stream_target_latency_percentile)},
      {"multi_stream_samples_per_query", field(&TS::multi_stream_samples_per_query)},
      {"server_target_qps", field(&TS::server_target_qps)},
      {"server_target_latency_ns", field(&TS::server_target_latency_ns)},
      {"server_target_latency_percentile", field(&TS::server_target_latency_percentile)},
      {"server_coalesce_queries", field(&TS::server_coalesce_queries)},
      {"server_max_async_queries", field(&TS::server_max_async_queries)},
      {"server_num_issue_query_threads", field(&TS::server_num_issue_query_threads)},
      {"offline_expected_qps", field(&TS::offline_expected_qps)},
      {"sample_concatenate_permutation", field(&TS::sample_concatenate_permutation)},
      {"min_duration_ms", field(&TS::min_duration_ms)},
      {"max_duration_ms", field(&TS::max_duration_ms)},
      {"min_query_count", field(&TS::min_query_count)},
      {"max_query_count", field(&TS::max_query_count)},
      {"qsl_rng_seed", field(&TS::qsl_rng_seed)},
      {"sample_index_rng_seed", field(&TS::sample_index_rng_seed)},
      {"schedule_rng_seed", field(&TS::schedule_rng_seed)},
      {"accuracy_log_rng_seed", field(&TS::accuracy_log_rng_seed)},
      {"accuracy_log_probability", field(&TS::accuracy_log_probability)},
      {"accuracy_log_sampling_target", field(&TS::accuracy_log_sampling_target)},
      {"performance_issue_unique", field(&TS::performance_issue_unique)},
      {"performance_issue_same", field(&TS::performance_issue_same)},
      {"performance_issue_same_index", field(&TS::performance_issue_same_index)},
      {"performance_sample_count_override", field(&TS::performance_sample_count_override)},
      {"accuracy_sample_count_override", field(&TS::accuracy_sample_count_override)},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& settings_fields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& kv : setters()) out.push_back(kv.first);
    return out;
  }();
  return names;
}

bool apply_settings(mlperf::TestSettings& ts, const std::string& lines, std::string* err) {
  std::istringstream in(lines);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) {
      *err = "settings line without '=': " + line;
      return false;
    }
    std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    auto it = setters().find(name);
    if (it == setters().end()) {
      *err = "unknown LoadGen setting " + name;
      return false;
    }
    try {
      it->second(ts, value);
    } catch (const std::exception&) {
      *err = "bad value for LoadGen setting " + name + ": " + value;
      return false;
    }
  }
  return true;
}

}  // namespace tf
