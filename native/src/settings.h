#pragma once
#include <string>
#include <vector>

#include "test_settings.h"

namespace tf {
// Assigns each "name=value" line to the TestSettings field of that name; false (and err) on an
// unknown name or a bad value.
bool apply_settings(mlperf::TestSettings& ts, const std::string& lines, std::string* err);
// The field names apply_settings takes ('\n'-free), for the Python side to send.
const std::vector<std::string>& settings_fields();
}  // namespace tf
